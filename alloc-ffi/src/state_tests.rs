use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use vramfit_alloc_core::{AllocatorConfig, SimulatedDevice};

use super::*;
use crate::build_allocator;

const MIB: u64 = 1 << 20;

/// Events that complete when the test says so.
#[derive(Clone, Default)]
struct FakeEvents {
    next: u64,
    completed: Rc<RefCell<HashSet<u64>>>,
    recorded: Rc<RefCell<Vec<(u64, StreamId)>>>,
    waited: Rc<RefCell<u64>>,
}

impl StreamEvents for FakeEvents {
    type Event = u64;

    fn record(&mut self, stream: StreamId) -> Result<u64, String> {
        self.next += 1;
        self.recorded.borrow_mut().push((self.next, stream));
        Ok(self.next)
    }

    fn done(&mut self, event: &u64) -> Result<bool, String> {
        Ok(self.completed.borrow().contains(event))
    }

    fn wait(&mut self, event: &u64) -> Result<(), String> {
        *self.waited.borrow_mut() += 1;
        self.completed.borrow_mut().insert(*event);
        Ok(())
    }

    fn recycle(&mut self, _event: u64) {}
}

fn state(
    policy: Policy,
    capacity: u64,
    budget: Option<u64>,
) -> (DeviceState<FakeEvents>, FakeEvents) {
    let events = FakeEvents::default();
    let config = AllocatorConfig {
        budget_bytes: budget,
        ..Default::default()
    };
    let alloc = build_allocator(policy, SimulatedDevice::new(capacity), config);
    (DeviceState::new(alloc, events.clone(), policy, 0), events)
}

const BOTH: [Policy; 2] = [Policy::Pytorch, Policy::Vramfit];

#[test]
fn a_block_used_on_another_stream_is_not_reused_before_that_stream_is_done() {
    for policy in BOTH {
        let (mut s, events) = state(policy, 1 << 40, None);
        let a = s.allocate(4 * MIB, 0).unwrap();
        assert!(s.record_stream(a, 7));
        s.free(a).unwrap();
        assert_eq!(s.pending_frees(), 1, "{policy}");
        assert_eq!(s.stream_counters(), (1, 1), "{policy}");
        assert_eq!(
            s.page_figures().is_some(),
            policy == Policy::Vramfit,
            "{policy}"
        );
        assert_eq!(
            s.plan_figures().is_some(),
            policy == Policy::Vramfit,
            "{policy}"
        );
        assert_eq!(*events.recorded.borrow(), vec![(1, 7)]);
        // Stream 7 still works on it: the same request gets other memory.
        let b = s.allocate(4 * MIB, 0).unwrap();
        assert_ne!(a, b, "{policy}: reused before the other stream finished");
        s.free(b).unwrap();
        events.completed.borrow_mut().insert(1);
        let c = s.allocate(4 * MIB, 0).unwrap();
        assert_eq!(s.pending_frees(), 0, "{policy}");
        assert!(c == a || c == b, "{policy}: cached blocks serve again");
        s.free(c).unwrap();
    }
}

#[test]
fn a_block_used_only_on_its_own_stream_is_reused_at_once() {
    for policy in BOTH {
        let (mut s, events) = state(policy, 1 << 40, None);
        let a = s.allocate(4 * MIB, 0).unwrap();
        assert!(s.record_stream(a, 0));
        assert!(!s.record_stream(a + 4096, 3), "not a block's start");
        s.free(a).unwrap();
        assert_eq!(s.pending_frees(), 0);
        assert_eq!(s.stream_counters(), (0, 0), "{policy}");
        assert!(events.recorded.borrow().is_empty());
        assert_eq!(s.allocate(4 * MIB, 0).unwrap(), a, "{policy}");
    }
}

#[test]
fn running_out_waits_for_held_back_blocks_and_retries() {
    for policy in BOTH {
        let (mut s, events) = state(policy, 1 << 40, Some(40 * MIB));
        let a = s.allocate(30 * MIB, 0).unwrap();
        s.record_stream(a, 3);
        s.free(a).unwrap();
        // Another 30 MiB does not fit next to the held-back block: the
        // allocator waits for stream 3, gets the block back and succeeds.
        let b = s.allocate(30 * MIB, 0).unwrap();
        assert_eq!(*events.waited.borrow(), 1, "{policy}");
        assert_eq!(s.pending_frees(), 0);
        assert_eq!(s.torch_stats()["num_sync_all_streams"], 1);
        s.free(b).unwrap();
    }
}

#[test]
fn over_the_budget_is_a_budget_out_of_memory_refusal() {
    for policy in BOTH {
        let (mut s, _) = state(policy, 1 << 40, Some(64 * MIB));
        let _a = s.allocate(40 * MIB, 0).unwrap();
        let refusal = s.allocate(40 * MIB, 0).unwrap_err();
        assert!(
            refusal.out_of_memory && refusal.budget,
            "{policy}: {refusal:?}"
        );
        assert!(
            refusal.message.contains("budget of 64.00 MiB"),
            "{}",
            refusal.message
        );
        assert_eq!(s.published().num_ooms, 1);
        assert_eq!(s.published().budget_bytes, 64 * MIB);
    }
}

#[test]
fn empty_cache_waits_for_held_back_blocks_then_releases() {
    for policy in BOTH {
        let (mut s, events) = state(policy, 1 << 40, None);
        let a = s.allocate(30 * MIB, 0).unwrap();
        s.record_stream(a, 5);
        s.free(a).unwrap();
        s.empty_cache().unwrap();
        assert_eq!(*events.waited.borrow(), 1);
        assert_eq!(s.core_stats().reserved_bytes.current, 0, "{policy}");
        assert_eq!(s.torch_stats()["reserved_bytes"]["all"]["freed"], 30 * MIB);
    }
}

#[test]
fn torch_stats_have_every_key_memory_summary_reads() {
    let (mut s, _) = state(Policy::Pytorch, 1 << 40, None);
    let small = s.allocate(1000, 0).unwrap();
    let large = s.allocate(3 * MIB, 0).unwrap();
    let stats = s.torch_stats();
    for metric in [
        "allocated_bytes",
        "active_bytes",
        "requested_bytes",
        "reserved_bytes",
        "inactive_split_bytes",
        "allocation",
        "active",
        "segment",
        "inactive_split",
    ] {
        for pool in ["all", "large_pool", "small_pool"] {
            for figure in ["current", "peak", "allocated", "freed"] {
                assert!(
                    stats[metric][pool][figure].is_u64(),
                    "{metric}.{pool}.{figure} missing"
                );
            }
        }
    }
    for key in ["oversize_allocations", "oversize_segments"] {
        assert!(stats[key]["current"].is_u64());
    }
    for key in ["num_ooms", "num_alloc_retries"] {
        assert!(stats[key].is_u64());
    }
    assert_eq!(stats["allocated_bytes"]["all"]["current"], 1024 + 3 * MIB);
    assert_eq!(stats["allocated_bytes"]["small_pool"]["current"], 1024);
    assert_eq!(stats["allocated_bytes"]["large_pool"]["current"], 3 * MIB);
    assert_eq!(stats["requested_bytes"]["all"]["current"], 1000 + 3 * MIB);
    assert_eq!(stats["allocation"]["all"]["current"], 2);
    assert_eq!(stats["reserved_bytes"]["all"]["current"], 22 * MIB);
    assert_eq!(stats["segment"]["all"]["current"], 2);
    s.free(large).unwrap();
    s.free(small).unwrap();
    let stats = s.torch_stats();
    assert_eq!(stats["allocated_bytes"]["all"]["current"], 0);
    assert_eq!(stats["allocated_bytes"]["all"]["peak"], 1024 + 3 * MIB);
    assert_eq!(stats["allocated_bytes"]["all"]["freed"], 1024 + 3 * MIB);
    assert_eq!(stats["allocation"]["all"]["freed"], 2);
}

#[test]
fn peak_reset_clears_torch_peaks_but_not_the_published_lifetime_peaks() {
    for policy in BOTH {
        let (mut s, _) = state(policy, 1 << 40, None);
        let a = s.allocate(100 * MIB, 0).unwrap();
        s.free(a).unwrap();
        s.empty_cache().unwrap();
        s.reset_peaks();
        let b = s.allocate(10 * MIB, 0).unwrap();
        let stats = s.torch_stats();
        assert_eq!(
            stats["allocated_bytes"]["all"]["peak"],
            10 * MIB,
            "{policy}"
        );
        assert!(stats["reserved_bytes"]["all"]["peak"].as_u64().unwrap() < 100 * MIB);
        let published = s.published();
        assert_eq!(published.peak_allocated_bytes, 100 * MIB, "{policy}");
        assert_eq!(published.peak_reserved_bytes, 100 * MIB, "{policy}");
        assert_eq!(published.allocated_bytes, 10 * MIB);
        s.reset_accumulated();
        assert_eq!(s.torch_stats()["allocated_bytes"]["all"]["allocated"], 0);
        s.free(b).unwrap();
    }
}

#[test]
fn freeing_what_was_not_handed_out_is_refused() {
    let (mut s, _) = state(Policy::Vramfit, 1 << 40, None);
    let err = s.free(0x1234).unwrap_err();
    assert!(err.message.contains("0x1234"));
    assert!(!err.out_of_memory);
}
