use super::*;
use crate::alloc::snapshot::{BlockState, SegmentState};

const MIB: u64 = 1 << 20;

/// Snapshots captured on an H200 (scripts/gpu/capture_snapshots.py) with
/// what PyTorch itself reported for each run.
fn committed_snapshots() -> Vec<(String, Vec<u8>, serde_json::Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/snapshots");
    let reported: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("pytorch_reported.json")).unwrap()).unwrap();
    let reported = reported.as_object().unwrap();
    assert!(reported.len() >= 5, "expected at least five snapshots");
    reported
        .iter()
        .map(|(name, facts)| {
            let bytes = std::fs::read(dir.join(format!("{name}.pickle.gz"))).unwrap();
            (name.clone(), bytes, facts.clone())
        })
        .collect()
}

#[test]
fn pytorch_policy_replays_each_snapshot_within_two_percent_of_pytorch() {
    for (name, bytes, facts) in committed_snapshots() {
        let report = replay_snapshot(&bytes, Policy::Pytorch).unwrap();
        let recorded = facts["maxMemoryReserved"].as_u64().unwrap() as f64;
        let diff = (report.peak_reserved_bytes as f64 - recorded).abs() / recorded;
        assert!(
            diff <= 0.02,
            "{name}: replay {} vs PyTorch {recorded}",
            report.peak_reserved_bytes
        );
        assert_eq!(
            report.pytorch_peak_reserved_bytes,
            Some(recorded as u64),
            "{name}: trace peak"
        );
        assert_eq!(
            report.peak_allocated_bytes,
            facts["maxMemoryAllocated"].as_u64().unwrap(),
            "{name}: allocated peak"
        );
    }
}

#[test]
fn vramfit_policy_fragments_less_than_pytorch_on_most_snapshots() {
    let snapshots = committed_snapshots();
    let better = snapshots
        .iter()
        .filter(|(_, bytes, _)| {
            let ours = replay_snapshot(bytes, Policy::Vramfit).unwrap();
            ours.fragmentation < ours.pytorch_fragmentation.unwrap()
        })
        .count();
    assert!(
        better * 2 > snapshots.len(),
        "{better} of {}",
        snapshots.len()
    );
}

#[test]
fn replayed_events_report_peaks_and_fragmentation() {
    let events = [
        AllocEvent::Alloc {
            id: 0,
            bytes: 3 * MIB,
            stream: 0,
        },
        AllocEvent::Alloc {
            id: 1,
            bytes: 100,
            stream: 0,
        },
        AllocEvent::Free { id: 0 },
        AllocEvent::Alloc {
            id: 2,
            bytes: 12 * MIB,
            stream: 0,
        },
    ];
    for (policy, reserved) in [(Policy::Pytorch, 22 * MIB), (Policy::Vramfit, 14 * MIB)] {
        let report = replay_events(&events, policy).unwrap();
        assert_eq!(report.peak_reserved_bytes, reserved, "{policy}");
        assert!((0.0..1.0).contains(&report.fragmentation));
    }
}

#[test]
fn a_truncated_trace_allocates_blocks_that_predate_it_first() {
    let entry = |action, addr, size| TraceEntry {
        action,
        addr,
        size,
        stream: 0,
    };
    let snapshot = Snapshot {
        segments: vec![SegmentState {
            device: 0,
            address: 0x1000_0000,
            total_size: 20 * MIB,
            stream: 0,
            blocks: vec![BlockState {
                address: 0x1000_0000,
                size: 4 * MIB,
                requested_size: 4 * MIB,
                state: "active_allocated".into(),
            }],
        }],
        device_traces: vec![vec![
            // A block from before the trace is freed...
            entry(TraceAction::FreeCompleted, 0x1040_0000, 6 * MIB),
            entry(TraceAction::Alloc, 0x1040_0000, 2 * MIB),
        ]],
    };
    let report = replay_parsed(&snapshot, Policy::Pytorch).unwrap();
    // ...and it, plus the block still live at dump time, were allocated first.
    assert_eq!(report.preexisting_blocks, 2);
    assert_eq!(report.allocs, 3);
    assert_eq!(report.frees, 1);
    assert_eq!(report.pytorch_peak_reserved_bytes, Some(20 * MIB));
    assert_eq!(report.peak_reserved_bytes, 20 * MIB);
}

#[test]
fn garbage_is_not_a_snapshot() {
    assert!(matches!(
        replay_snapshot(b"not a pickle", Policy::Pytorch),
        Err(AllocError::Snapshot(_))
    ));
}

/// Driver calls (page maps and unmaps) the vramfit policy makes in the last
/// third of each committed trace, which is its third training step.
fn last_step_device_calls(bytes: &[u8]) -> u64 {
    use crate::alloc::{AllocatorConfig, ExpandableAllocator, GpuAllocator, SimulatedDevice};
    let snapshot = parse_snapshot(bytes).unwrap();
    let (device, trace) = snapshot
        .device_traces
        .iter()
        .enumerate()
        .max_by_key(|(_, t)| t.len())
        .unwrap();
    let (events, _, _) = super::events_from_trace(&snapshot, device, trace);
    let mut a = ExpandableAllocator::new(SimulatedDevice::new(1 << 44), AllocatorConfig::default());
    let mut ptrs = std::collections::HashMap::new();
    let mut at_two_thirds = 0;
    for (i, event) in events.iter().enumerate() {
        if i == events.len() * 2 / 3 {
            at_two_thirds = a.device().map_calls + a.device().unmap_calls;
        }
        match *event {
            AllocEvent::Alloc { id, bytes, stream } => {
                ptrs.insert(id, a.allocate(bytes, stream).unwrap());
            }
            AllocEvent::Free { id } => {
                if let Some(ptr) = ptrs.remove(&id) {
                    a.free(ptr).unwrap();
                }
            }
            AllocEvent::ReleaseSegment { .. } => {}
        }
    }
    a.device().map_calls + a.device().unmap_calls - at_two_thirds
}

#[test]
fn vramfit_policy_settles_to_few_driver_calls_per_training_step() {
    // Before blocks were placed on mapped pages first, the third step of
    // these traces cost 26 to 121 driver calls (docs/benchmarks.md).
    for (name, bytes, _) in committed_snapshots() {
        let calls = last_step_device_calls(&bytes);
        assert!(
            calls <= 25,
            "{name}: {calls} driver calls in the third step"
        );
    }
}
