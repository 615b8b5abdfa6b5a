//! Replaying allocation sequences and PyTorch traces through a policy.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::config::{AllocatorConfig, Policy};
use super::device::{DevicePtr, SimulatedDevice, StreamId};
use super::error::AllocError;
use super::snapshot::{Snapshot, TraceAction, TraceEntry, parse_snapshot};
use super::stats::MemoryStats;
use super::{GpuAllocator, new_allocator};

/// Capacity of the simulated device in replays: large enough that a trace
/// recorded on any real GPU never runs out, so the replay's peaks are the
/// policy's and not the simulated device's.
const REPLAY_CAPACITY: u64 = 1 << 50;

/// One step of an allocation sequence (what a training step asks of the
/// allocator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum AllocEvent {
    /// Allocate `bytes` on `stream`; later events name the block by `id`.
    Alloc {
        /// Caller's name for the block, unique among live blocks.
        id: u64,
        /// Bytes requested (unrounded).
        bytes: u64,
        /// Stream of the allocation (0: default stream).
        stream: StreamId,
    },
    /// Free the live block called `id`.
    Free {
        /// The block.
        id: u64,
    },
    /// The program released a cached segment (`torch.cuda.empty_cache()`);
    /// `addr` is PyTorch's segment address, if known.
    ReleaseSegment {
        /// Segment address in the trace.
        addr: DevicePtr,
    },
}

/// What a replay measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    /// Policy replayed.
    pub policy: Policy,
    /// Highest reserved bytes during the replay.
    pub peak_reserved_bytes: u64,
    /// Highest allocated bytes (rounded block sizes) during the replay.
    pub peak_allocated_bytes: u64,
    /// `1 - peak_allocated / peak_reserved`.
    pub fragmentation: f64,
    /// Reserved peak PyTorch itself reached, from the trace's segment events.
    pub pytorch_peak_reserved_bytes: Option<u64>,
    /// `(peak_reserved - pytorch_peak_reserved) / pytorch_peak_reserved`.
    pub reserved_diff: Option<f64>,
    /// Fragmentation PyTorch reached on the recorded run (its reserved peak
    /// against its allocated peak, as the pytorch-policy replay computes it).
    pub pytorch_fragmentation: Option<f64>,
    /// Device whose trace was replayed.
    pub device: usize,
    /// Allocations replayed.
    pub allocs: u64,
    /// Frees replayed.
    pub frees: u64,
    /// Blocks already live when the trace began, allocated before replaying
    /// (0 when the trace covers the whole run).
    pub preexisting_blocks: u64,
    /// Share of allocations that landed at the address PyTorch gave them
    /// (pytorch policy only: 1.0 means the replay made PyTorch's choices).
    pub address_agreement: Option<f64>,
    /// The allocator's counters at the end of the replay.
    pub stats: MemoryStats,
}

/// Replays an allocation sequence through `policy` on an unlimited simulated
/// device. This is the allocator model the predictor uses: give it the
/// tensor sizes a step allocates and frees, read `peak_reserved_bytes`.
pub fn replay_events(events: &[AllocEvent], policy: Policy) -> Result<ReplayReport, AllocError> {
    replay_events_observed(events, policy, |_, _| {})
}

/// [`replay_events`], calling `observe(i, stats)` after `events[i]` has been
/// applied, with the allocator's counters at that moment (the predictor reads
/// what is alive when the reserved peak is reached).
pub fn replay_events_observed(
    events: &[AllocEvent],
    policy: Policy,
    observe: impl FnMut(usize, &MemoryStats),
) -> Result<ReplayReport, AllocError> {
    replay_events_ordered(events, policy, AddressOrder::Descending, observe)
}

/// The order in which the simulated driver hands out fresh segment
/// addresses. PyTorch breaks ties between equal-size cached blocks by
/// address, so the order can decide which block a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressOrder {
    /// Each new segment below the one before, as `cudaMalloc` mostly does on
    /// the H200 ([`SimulatedDevice::top_down`]).
    Descending,
    /// Each new segment above the one before ([`SimulatedDevice::new`]).
    Ascending,
}

/// [`replay_events_observed`] on a device that hands out addresses in
/// `order`.
pub fn replay_events_ordered(
    events: &[AllocEvent],
    policy: Policy,
    order: AddressOrder,
    mut observe: impl FnMut(usize, &MemoryStats),
) -> Result<ReplayReport, AllocError> {
    let device = match order {
        AddressOrder::Descending => SimulatedDevice::top_down(REPLAY_CAPACITY),
        AddressOrder::Ascending => SimulatedDevice::new(REPLAY_CAPACITY),
    };
    let outcome = run_events(events, policy, device, None, &mut observe)?;
    Ok(outcome.into_report(policy, 0, None, 0))
}

/// Replays the trace of a `torch.cuda.memory._dump_snapshot()` pickle
/// (optionally gzip-compressed) through `policy`.
///
/// The device with the longest trace is replayed. Allocations are `alloc`
/// entries, frees are `free_completed` entries (when the block really went
/// back to the cache), and `segment_free` entries, which a run without
/// out-of-memory errors only has through `empty_cache()`, release the same
/// cached segment. A trace that starts mid-run (its ring buffer was
/// truncated) has blocks that are freed without having been allocated in
/// it: those, and blocks still live at dump time that the trace never
/// allocated, are allocated before the first entry, in address order.
pub fn replay_snapshot(bytes: &[u8], policy: Policy) -> Result<ReplayReport, AllocError> {
    let snapshot = parse_snapshot(bytes)?;
    replay_parsed(&snapshot, policy)
}

/// [`replay_snapshot`] on a file (`.pickle` or `.pickle.gz`).
pub fn replay_snapshot_file(
    path: &std::path::Path,
    policy: Policy,
) -> Result<ReplayReport, AllocError> {
    let bytes = std::fs::read(path).map_err(|source| AllocError::Io {
        path: path.display().to_string(),
        source,
    })?;
    replay_snapshot(&bytes, policy)
}

fn replay_parsed(snapshot: &Snapshot, policy: Policy) -> Result<ReplayReport, AllocError> {
    let (device, trace) = snapshot
        .device_traces
        .iter()
        .enumerate()
        .max_by_key(|(_, t)| t.len())
        .ok_or_else(|| AllocError::Snapshot("the snapshot holds no device trace".into()))?;

    let mut sim = SimulatedDevice::new(REPLAY_CAPACITY);
    if policy == Policy::Pytorch {
        for entry in trace
            .iter()
            .filter(|e| e.action == TraceAction::SegmentAlloc)
        {
            sim.expect_segment(entry.size, entry.addr);
        }
    }
    let (events, expected_addrs, preexisting) = events_from_trace(snapshot, device, trace);
    let outcome = run_events(&events, policy, sim, Some(&expected_addrs), &mut |_, _| {})?;
    let pytorch_peak = pytorch_reserved_peak(snapshot, device, trace);
    let mut report = outcome.into_report(policy, device, Some(pytorch_peak), preexisting);
    // PyTorch's fragmentation needs PyTorch's allocated peak (its block
    // sizes, which the trace does not record): the pytorch-policy replay
    // reproduces them.
    if policy != Policy::Pytorch {
        let pytorch = replay_parsed(snapshot, Policy::Pytorch)?;
        report.pytorch_fragmentation = pytorch.pytorch_fragmentation;
    }
    Ok(report)
}

/// Turns a trace into events, naming blocks by order of allocation.
/// Returns the events, the address PyTorch gave each `Alloc` (same order),
/// and how many blocks predate the trace.
fn events_from_trace(
    snapshot: &Snapshot,
    device: usize,
    trace: &[TraceEntry],
) -> (Vec<AllocEvent>, Vec<DevicePtr>, u64) {
    let mut live: HashMap<DevicePtr, u64> = HashMap::new();
    let mut events = Vec::with_capacity(trace.len());
    let mut addrs = Vec::new();
    // Blocks freed before being allocated, and blocks alive at the end that
    // the trace never allocated, existed when recording began.
    let mut early: Vec<(DevicePtr, u64, StreamId, u64)> = Vec::new();
    let mut allocated_in_trace = std::collections::HashSet::new();
    let mut next_id = 0u64;
    for entry in trace {
        match entry.action {
            TraceAction::Alloc => {
                live.insert(entry.addr, next_id);
                allocated_in_trace.insert(entry.addr);
                events.push(AllocEvent::Alloc {
                    id: next_id,
                    bytes: entry.size,
                    stream: entry.stream,
                });
                addrs.push(entry.addr);
                next_id += 1;
            }
            TraceAction::FreeCompleted => match live.remove(&entry.addr) {
                Some(id) => events.push(AllocEvent::Free { id }),
                None => {
                    early.push((entry.addr, entry.size, entry.stream, next_id));
                    events.push(AllocEvent::Free { id: next_id });
                    next_id += 1;
                }
            },
            TraceAction::SegmentFree => {
                events.push(AllocEvent::ReleaseSegment { addr: entry.addr })
            }
            _ => {}
        }
    }
    // Rebuild: early blocks first (in address order), then the trace.
    let still_live: Vec<(DevicePtr, u64, StreamId)> = snapshot
        .segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| s.blocks.iter().map(move |b| (s.stream, b)))
        .filter(|(_, b)| b.state.starts_with("active") && !allocated_in_trace.contains(&b.address))
        .map(|(stream, b)| (b.address, b.requested_size.max(1), stream))
        .collect();
    if early.is_empty() && still_live.is_empty() {
        return (events, addrs, 0);
    }
    let mut prefix = early;
    for (addr, size, stream) in still_live {
        prefix.push((addr, size, stream, next_id));
        next_id += 1;
    }
    prefix.sort_by_key(|p| p.0);
    let mut rebuilt = Vec::with_capacity(events.len() + prefix.len());
    let mut rebuilt_addrs = Vec::with_capacity(addrs.len() + prefix.len());
    for &(addr, size, stream, id) in &prefix {
        rebuilt.push(AllocEvent::Alloc {
            id,
            bytes: size,
            stream,
        });
        rebuilt_addrs.push(addr);
    }
    rebuilt.extend(events);
    rebuilt_addrs.extend(addrs);
    (rebuilt, rebuilt_addrs, prefix.len() as u64)
}

/// PyTorch's own reserved peak, from the segment events of the trace and the
/// segments still held at dump time (which fixes the level at trace start).
fn pytorch_reserved_peak(snapshot: &Snapshot, device: usize, trace: &[TraceEntry]) -> u64 {
    let at_end: u64 = snapshot
        .segments
        .iter()
        .filter(|s| s.device == device)
        .map(|s| s.total_size)
        .sum();
    let (mut grown, mut shrunk) = (0u64, 0u64);
    for entry in trace {
        match entry.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => grown += entry.size,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => shrunk += entry.size,
            _ => {}
        }
    }
    let mut level = (at_end + shrunk).saturating_sub(grown);
    let mut peak = level;
    for entry in trace {
        match entry.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                level += entry.size;
                peak = peak.max(level);
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                level = level.saturating_sub(entry.size)
            }
            _ => {}
        }
    }
    peak
}

struct Outcome {
    stats: MemoryStats,
    allocs: u64,
    frees: u64,
    address_matches: Option<(u64, u64)>,
}

fn run_events(
    events: &[AllocEvent],
    policy: Policy,
    device: SimulatedDevice,
    expected_addrs: Option<&[DevicePtr]>,
    observe: &mut dyn FnMut(usize, &MemoryStats),
) -> Result<Outcome, AllocError> {
    let mut allocator: Box<dyn GpuAllocator> =
        new_allocator(policy, device, AllocatorConfig::default());
    let mut ptrs: HashMap<u64, DevicePtr> = HashMap::new();
    let (mut allocs, mut frees, mut matches) = (0u64, 0u64, 0u64);
    for (index, event) in events.iter().enumerate() {
        match *event {
            AllocEvent::Alloc { id, bytes, stream } => {
                let ptr = allocator.allocate(bytes, stream)?;
                if let Some(expected) = expected_addrs
                    && expected.get(allocs as usize) == Some(&ptr)
                {
                    matches += 1;
                }
                allocs += 1;
                ptrs.insert(id, ptr);
            }
            AllocEvent::Free { id } => {
                if let Some(ptr) = ptrs.remove(&id) {
                    allocator.free(ptr)?;
                    frees += 1;
                }
            }
            AllocEvent::ReleaseSegment { addr } => {
                allocator.release_cached_segment(addr)?;
            }
        }
        observe(index, allocator.stats());
    }
    Ok(Outcome {
        stats: allocator.stats().clone(),
        allocs,
        frees,
        address_matches: expected_addrs
            .filter(|_| policy == Policy::Pytorch)
            .map(|_| (matches, allocs)),
    })
}

impl Outcome {
    fn into_report(
        self,
        policy: Policy,
        device: usize,
        pytorch_peak: Option<u64>,
        preexisting_blocks: u64,
    ) -> ReplayReport {
        let reserved = self.stats.reserved_bytes.peak;
        let allocated = self.stats.allocated_bytes.peak;
        let fragmentation_of = |reserved: u64| {
            if reserved == 0 {
                0.0
            } else {
                1.0 - allocated as f64 / reserved as f64
            }
        };
        ReplayReport {
            policy,
            peak_reserved_bytes: reserved,
            peak_allocated_bytes: allocated,
            fragmentation: fragmentation_of(reserved),
            pytorch_peak_reserved_bytes: pytorch_peak,
            reserved_diff: pytorch_peak
                .filter(|&p| p > 0)
                .map(|p| (reserved as f64 - p as f64) / p as f64),
            pytorch_fragmentation: pytorch_peak.map(fragmentation_of),
            device,
            allocs: self.allocs,
            frees: self.frees,
            preexisting_blocks,
            address_agreement: self
                .address_matches
                .map(|(m, n)| if n == 0 { 1.0 } else { m as f64 / n as f64 }),
            stats: self.stats,
        }
    }
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
