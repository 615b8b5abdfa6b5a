use super::*;
use crate::{DeviceError, DeviceMemory, DevicePtr, PAGE_BYTES, SimulatedDevice};

const MIB: u64 = 1 << 20;

fn allocator(capacity: u64) -> ExpandableAllocator<SimulatedDevice> {
    ExpandableAllocator::new(SimulatedDevice::new(capacity), AllocatorConfig::default())
}

#[test]
fn reserved_memory_grows_in_two_mib_pages() {
    for (request, reserved) in [
        (512, PAGE_BYTES),
        (3 * MIB, 4 * MIB),
        (11 * MIB + 1, 12 * MIB),
    ] {
        let mut a = allocator(1 << 40);
        a.allocate(request, 0).unwrap();
        assert_eq!(
            a.stats().reserved_bytes.current,
            reserved,
            "request {request}"
        );
    }
}

#[test]
fn consecutive_blocks_share_pages() {
    let mut a = allocator(1 << 40);
    let first = a.allocate(3 * MIB, 0).unwrap();
    let second = a.allocate(3 * MIB, 0).unwrap();
    assert_eq!(second, first + 3 * MIB);
    assert_eq!(a.stats().reserved_bytes.current, 6 * MIB);
}

#[test]
fn a_free_tail_grows_instead_of_leaving_a_hole() {
    let mut a = allocator(1 << 40);
    let first = a.allocate(8 * MIB, 0).unwrap();
    a.free(first).unwrap();
    let bigger = a.allocate(12 * MIB, 0).unwrap();
    assert_eq!(bigger, first);
    assert_eq!(a.stats().reserved_bytes.peak, 12 * MIB);
}

#[test]
fn whole_free_pages_are_reclaimed_instead_of_raising_the_peak() {
    let mut a = allocator(1 << 40);
    let low = a.allocate(10 * MIB, 0).unwrap();
    let pin = a.allocate(2 * MIB, 0).unwrap();
    a.free(low).unwrap();
    // 16 MiB does not fit in the 10 MiB hole: it goes past `pin`, and the
    // hole's pages are unmapped so the footprint stays at 2 + 16 MiB.
    a.allocate(16 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 18 * MIB);
    assert_eq!(a.stats().reserved_bytes.peak, 18 * MIB);
    let _ = pin;
}

#[test]
fn pages_stay_mapped_below_the_high_water_mark() {
    let mut a = allocator(1 << 40);
    let block = a.allocate(64 * MIB, 0).unwrap();
    a.free(block).unwrap();
    let again = a.allocate(32 * MIB, 0).unwrap();
    assert_eq!(again, block);
    assert_eq!(a.stats().reserved_bytes.current, 64 * MIB);
    assert_eq!(a.device().unmap_calls, 0);
}

#[test]
fn streams_and_size_classes_get_their_own_ranges() {
    let mut a = allocator(1 << 40);
    a.allocate(4096, 0).unwrap();
    a.allocate(4 * MIB, 0).unwrap();
    a.allocate(4 * MIB, 3).unwrap();
    assert_eq!(a.stats().segments.current, 3);
}

#[test]
fn device_limit_reclaims_then_reports_out_of_memory() {
    let mut a = allocator(32 * MIB);
    let first = a.allocate(20 * MIB, 0).unwrap();
    let pin = a.allocate(2 * MIB, 0).unwrap();
    a.free(first).unwrap();
    a.allocate(24 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 26 * MIB);
    let err = a.allocate(12 * MIB, 0).unwrap_err().to_string();
    assert!(err.contains("Tried to allocate 12.00 MiB"), "{err}");
    assert_eq!(a.stats().num_ooms, 1);
    a.free(pin).unwrap();
}

#[test]
fn empty_cache_unmaps_every_free_page() {
    let mut a = allocator(1 << 40);
    let kept = a.allocate(3 * MIB, 0).unwrap();
    let freed = a.allocate(40 * MIB, 0).unwrap();
    a.free(freed).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 4 * MIB);
    a.free(kept).unwrap();
}

#[test]
fn budget_unmaps_free_pages_then_refuses_with_its_own_message() {
    let config = AllocatorConfig {
        budget_bytes: Some(64 * MIB),
        ..Default::default()
    };
    let mut a = ExpandableAllocator::new(SimulatedDevice::new(1 << 40), config);
    let live = a.allocate(20 * MIB, 0).unwrap();
    let freed = a.allocate(30 * MIB, 0).unwrap();
    a.free(freed).unwrap();
    // A 40 MiB block of another stream needs 40 MiB of new pages: 50 + 40 >
    // 64, so free pages go back first and the block fits.
    let big = a.allocate(40 * MIB, 1).unwrap();
    assert!(a.stats().reserved_bytes.current <= 64 * MIB);
    let err = a.allocate(10 * MIB, 2).unwrap_err();
    let AllocError::OutOfMemory {
        budget_exceeded,
        largest_free,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert!(*budget_exceeded, "{err}");
    assert!(*largest_free > 0, "the freed block's range is still free");
    assert!(err.to_string().contains("with a budget of 64.00 MiB"));
    a.free(big).unwrap();
    a.free(live).unwrap();
}

#[test]
fn a_mapped_free_piece_wins_over_a_tighter_unmapped_one() {
    let mut a = allocator(1 << 40);
    let small = a.allocate(4 * MIB, 0).unwrap();
    let _pin1 = a.allocate(2 * MIB, 0).unwrap();
    let large = a.allocate(8 * MIB, 0).unwrap();
    let _pin2 = a.allocate(2 * MIB, 0).unwrap();
    a.free(small).unwrap();
    a.free(large).unwrap();
    a.empty_cache().unwrap();
    // Map the 8 MiB piece again, leave the 4 MiB one unmapped.
    let again = a.allocate(8 * MIB, 0).unwrap();
    assert_eq!(again, large);
    a.free(again).unwrap();
    let maps = a.device().map_calls;
    // Best fit alone would take the unmapped 4 MiB piece and map pages.
    let placed = a.allocate(4 * MIB, 0).unwrap();
    assert_eq!(placed, large);
    assert_eq!(
        a.device().map_calls,
        maps,
        "no driver call for mapped pages"
    );
}

/// Counts parked and released pages around a simulated device.
struct Recording {
    inner: SimulatedDevice,
    parked: u64,
    unmapped: u64,
    releases: u64,
}

impl DeviceMemory for Recording {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.inner.malloc(bytes)
    }
    fn free(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.inner.free(ptr, bytes)
    }
    fn mem_info(&self) -> crate::MemInfo {
        self.inner.mem_info()
    }
    fn reserve_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.inner.reserve_range(bytes)
    }
    fn map_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.inner.map_pages(at, bytes)
    }
    fn unmap_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.unmapped += bytes;
        self.inner.unmap_pages(at, bytes)
    }
    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.parked += bytes;
        self.inner.unmap_pages(at, bytes)
    }
    fn release_parked(&mut self) -> Result<(), DeviceError> {
        self.releases += 1;
        Ok(())
    }
}

#[test]
fn pages_moved_to_a_new_block_are_parked_and_empty_cache_really_unmaps() {
    let device = Recording {
        inner: SimulatedDevice::new(1 << 40),
        parked: 0,
        unmapped: 0,
        releases: 0,
    };
    let mut a = ExpandableAllocator::new(device, AllocatorConfig::default());
    let first = a.allocate(30 * MIB, 0).unwrap();
    a.free(first).unwrap();
    // Another stream's block would lift the high-water mark: the free
    // pages move to it, kept by the backend between unmap and map.
    let second = a.allocate(30 * MIB, 1).unwrap();
    assert_eq!(a.device().parked, 30 * MIB);
    assert_eq!(a.device().unmapped, 0);
    assert!(
        a.device().releases >= 1,
        "leftover parked pages are released"
    );
    assert_eq!(a.stats().reserved_bytes.peak, 30 * MIB);
    a.free(second).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.device().unmapped, 30 * MIB);
    assert_eq!(a.device().parked, 30 * MIB);
}

/// Driver calls (maps plus unmaps) so far.
fn calls(a: &ExpandableAllocator<SimulatedDevice>) -> u64 {
    a.device().map_calls + a.device().unmap_calls
}

/// One "step": a block on stream 0, then one on stream 1, each freed
/// before the next. Moving pages at every growth moves the pages from one
/// range to the other twice a step.
fn two_stream_step(a: &mut ExpandableAllocator<SimulatedDevice>) {
    let first = a.allocate(8 * MIB, 0).unwrap();
    a.free(first).unwrap();
    let second = a.allocate(8 * MIB, 1).unwrap();
    a.free(second).unwrap();
}

/// The hysteresis, without the planned layout (which takes such a step
/// over within a few repetitions, see `expandable_plan_tests.rs`).
fn unplanned_allocator() -> ExpandableAllocator<SimulatedDevice> {
    let config = AllocatorConfig {
        disable_step_plan: true,
        ..Default::default()
    };
    ExpandableAllocator::new(SimulatedDevice::new(1 << 40), config)
}

#[test]
fn a_repeating_step_stops_moving_pages() {
    let mut a = unplanned_allocator();
    // What stays live across steps (parameters), so that the headroom's cap
    // (a tenth of the live high-water mark) leaves room for 8 MiB.
    let _parameters = a.allocate(200 * MIB, 0).unwrap();
    two_stream_step(&mut a);
    assert!(a.device().unmap_calls > 0, "the first step moves pages");
    two_stream_step(&mut a);
    let settled = calls(&a);
    for _ in 0..10 {
        two_stream_step(&mut a);
    }
    assert_eq!(calls(&a), settled, "no driver calls once settled");
    // Never more than not moving at all would reserve.
    assert!(a.stats().reserved_bytes.peak <= 216 * MIB);
}

#[test]
fn a_budget_keeps_moving_pages_rather_than_pass_it() {
    let config = AllocatorConfig {
        budget_bytes: Some(12 * MIB),
        ..Default::default()
    };
    let mut a = ExpandableAllocator::new(SimulatedDevice::new(1 << 40), config);
    for _ in 0..4 {
        two_stream_step(&mut a);
    }
    let before = calls(&a);
    two_stream_step(&mut a);
    assert!(calls(&a) > before, "under the budget, pages still move");
    assert!(a.stats().reserved_bytes.peak <= 12 * MIB);
}

#[test]
fn resetting_peak_statistics_does_not_change_what_the_allocator_does() {
    let run = |reset: bool| {
        let mut a = allocator(1 << 40);
        let big = a.allocate(40 * MIB, 0).unwrap();
        a.free(big).unwrap();
        a.empty_cache().unwrap();
        if reset {
            a.reset_peak_stats();
        }
        for _ in 0..3 {
            let x = a.allocate(10 * MIB, 0).unwrap();
            a.free(x).unwrap();
            let y = a.allocate(10 * MIB, 1).unwrap();
            a.free(y).unwrap();
        }
        (a.device().map_calls, a.device().unmap_calls)
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn the_headroom_stops_at_a_tenth_of_the_live_high_water_mark() {
    // A layout that never repeats: blocks of growing sizes on alternating
    // streams, each freed before the next, so every block needs pages moved
    // (it repeats every 15 blocks: without the planned layout).
    let mut a = unplanned_allocator();
    for i in 0..200u64 {
        let block = a.allocate((8 + i % 5) * MIB, i % 3).unwrap();
        a.free(block).unwrap();
    }
    let high = a.live_page_high_water_bytes();
    assert!(a.headroom_bytes() > 0);
    assert!(a.headroom_bytes() <= high / HEADROOM_CAP_DIVISOR);
    assert!(a.stats().reserved_bytes.peak <= high + high / HEADROOM_CAP_DIVISOR);
}

/// A device whose queue is `lag` frees behind the host.
fn lagging(
    capacity: u64,
    lag: u64,
    config: AllocatorConfig,
) -> ExpandableAllocator<SimulatedDevice> {
    let mut device = SimulatedDevice::new(capacity);
    device.free_lag = lag;
    ExpandableAllocator::new(device, config)
}

#[test]
fn pages_the_device_may_still_use_are_not_moved_for_the_ceiling() {
    // Without the planned layout: before one takes over, nothing is
    // deferred (see the next test).
    let unplanned = AllocatorConfig {
        disable_step_plan: true,
        ..Default::default()
    };
    let mut a = lagging(1 << 40, 1, unplanned);
    let low = a.allocate(10 * MIB, 0).unwrap();
    let pin = a.allocate(2 * MIB, 0).unwrap();
    a.free(low).unwrap();
    // The device has not passed the free of `low` yet: its pages stay
    // mapped (no unmap, no waiting) and the new block gets new pages, 10
    // MiB past the ceiling for now.
    let big = a.allocate(16 * MIB, 0).unwrap();
    assert_eq!(a.device().unmap_calls, 0);
    assert_eq!(a.device().wait_calls, 0);
    assert_eq!(a.stats().reserved_bytes.current, 28 * MIB);
    // Once the device is past it (one more free), the next growth moves
    // those pages instead of mapping new ones: 28 MiB live at once now, the
    // ceiling 29 MiB (a tenth of 18 MiB of headroom), 28 + 12 MiB wanted;
    // `low`'s 10 MiB move, `pin`'s page (freed last) is left for later.
    a.free(pin).unwrap();
    a.allocate(12 * MIB, 7).unwrap();
    assert_eq!(a.device().unmap_calls, 1);
    assert_eq!(a.device().wait_calls, 0);
    assert_eq!(a.stats().reserved_bytes.current, 30 * MIB);
    assert_eq!(a.stats().moved_bytes, 10 * MIB);
    assert_eq!(a.stats().num_device_waits, 0);
    a.free(big).unwrap();
}

#[test]
fn before_a_planned_layout_takes_over_moves_wait_instead_of_deferring() {
    let mut a = lagging(1 << 40, 1, AllocatorConfig::default());
    let low = a.allocate(10 * MIB, 0).unwrap();
    let _pin = a.allocate(2 * MIB, 0).unwrap();
    a.free(low).unwrap();
    // As above, but the pages of `low` are waited for and moved: the
    // reserved level stays at the live-page high-water mark.
    let _big = a.allocate(16 * MIB, 0).unwrap();
    assert!(a.device().wait_free_calls >= 1);
    assert_eq!(a.stats().reserved_bytes.current, 18 * MIB);
    assert_eq!(a.stats().reserved_bytes.peak, 18 * MIB);
}

#[test]
fn a_large_move_waits_for_the_oldest_frees_only() {
    let mut a = lagging(1 << 40, 1000, AllocatorConfig::default());
    let old = a.allocate(100 * MIB, 0).unwrap();
    let young = a.allocate(100 * MIB, 1).unwrap();
    a.free(old).unwrap();
    a.free(young).unwrap();
    // 60 MiB of another stream: 60 MiB of free pages must move, more than
    // may be deferred. The device is behind both frees; it is waited for
    // up to the first (whose pages are enough), not to the second, and
    // not for the whole queue.
    a.allocate(60 * MIB, 2).unwrap();
    assert_eq!(a.device().wait_free_calls, 1);
    assert_eq!(a.device().wait_calls, 0);
    assert_eq!(a.stats().num_device_waits, 1);
    assert_eq!(a.device_mut().frees_done(0), 1);
    assert_eq!(a.stats().moved_bytes, 60 * MIB);
    // 200 MiB live at most: the level stays at the ceiling.
    assert_eq!(a.stats().reserved_bytes.peak, 200 * MIB);
}

#[test]
fn a_limit_waits_for_the_device_before_moving_pages_it_may_still_use() {
    let config = AllocatorConfig {
        budget_bytes: Some(40 * MIB),
        ..Default::default()
    };
    let mut a = lagging(1 << 40, 1000, config);
    let low = a.allocate(20 * MIB, 0).unwrap();
    let _pin = a.allocate(2 * MIB, 0).unwrap();
    a.free(low).unwrap();
    a.allocate(24 * MIB, 0).unwrap();
    assert_eq!(a.device().wait_free_calls, 1);
    assert!(a.stats().reserved_bytes.current <= 40 * MIB);
    // Within the budget nothing waits.
    a.allocate(2 * MIB, 0).unwrap();
    assert_eq!(a.device().wait_free_calls, 1);
    assert_eq!(a.device().wait_calls, 0);
}

#[test]
fn empty_cache_waits_for_the_device_before_unmapping() {
    let mut a = lagging(1 << 40, 1000, AllocatorConfig::default());
    let block = a.allocate(40 * MIB, 0).unwrap();
    a.free(block).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.device().wait_calls, 1);
    assert_eq!(a.stats().reserved_bytes.current, 0);
}

#[test]
fn releasing_one_cached_segment_gives_back_every_free_page() {
    // The policy has no segments: a replayed `torch.cuda.empty_cache()`
    // segment release empties the whole cache, as `empty_cache` does.
    let mut a = allocator(1 << 40);
    let kept = a.allocate(3 * MIB, 0).unwrap();
    let freed = a.allocate(40 * MIB, 0).unwrap();
    a.free(freed).unwrap();
    assert!(a.release_cached_segment(freed).unwrap());
    assert_eq!(a.stats().reserved_bytes.current, 4 * MIB);
    a.free(kept).unwrap();
}
