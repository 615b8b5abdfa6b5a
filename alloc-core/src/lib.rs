//! A CUDA caching allocator, as a pure core over a device backend.
//!
//! Two policies share one interface ([`GpuAllocator`]):
//!
//! * [`Policy::Pytorch`]: the policy of PyTorch's `CUDACachingAllocator`
//!   (512-byte rounding, a small pool carved from 2 MiB segments, a large pool
//!   with 20 MiB segments for 1-10 MiB requests, best fit by
//!   `(stream, size, address)`, splitting, coalescing, `max_split_size`,
//!   release-and-retry before an out-of-memory error). Replaying a real
//!   PyTorch trace through it reproduces PyTorch's reserved peak.
//! * [`Policy::Vramfit`]: our own policy, one growing virtual range per stream
//!   and pool mapped in 2 MiB physical pages, which never raises its physical
//!   high-water mark while a whole free page exists anywhere. See
//!   `docs/allocator.md`.
//!
//! The allocators never touch CUDA themselves: they call a [`DeviceMemory`]
//! backend. [`SimulatedDevice`] hands out addresses and enforces a capacity,
//! so the policies are testable and benchmarkable without a GPU; the agent
//! and `libvramfit_alloc.so` provide cudarc-backed backends over the page
//! mapping of the `vramfit-vmm` crate.

mod config;
mod device;
mod error;
mod expandable;
mod plan;
mod pytorch;
mod replay;
mod snapshot;
mod stats;
pub mod stats_file;

pub use config::{
    AllocatorConfig, LARGE_SEGMENT_BYTES, MIN_BLOCK_BYTES, MIN_LARGE_ALLOC_BYTES, PAGE_BYTES,
    Policy, ROUND_LARGE_BYTES, SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES, round_request,
    segment_bytes_for,
};
pub use device::{DeviceError, DeviceMemory, DevicePtr, MemInfo, SimulatedDevice, StreamId};
pub use error::{AllocError, format_size};
pub use expandable::{
    DEFERRED_MOVE_PAGES, ExpandableAllocator, HEADROOM_CAP_DIVISOR, SLACK_PER_MOVE_PAGES, Tuning,
};
pub use plan::{
    MAX_STEP_EVENTS, PlanFigures, RepeatedStep, StepBlock, StepDetector, StepEvent, StepLayout,
    live_bytes_by_phase, plan_layout, quietest_phase,
};
pub use pytorch::PytorchAllocator;
pub use replay::{
    AddressOrder, AllocEvent, ReplayReport, replay_events, replay_events_observed,
    replay_events_ordered, replay_snapshot, replay_snapshot_file,
};
pub use snapshot::{Snapshot, TraceAction, TraceEntry, parse_snapshot};
pub use stats::{MemoryStats, Stat};

/// What every caching allocator offers its callers, whatever its policy.
pub trait GpuAllocator {
    /// Hands out at least `bytes` bytes usable on `stream`.
    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, AllocError>;
    /// Returns a block handed out by [`GpuAllocator::allocate`] to the cache.
    fn free(&mut self, ptr: DevicePtr) -> Result<(), AllocError>;
    /// Gives every cached, unused segment (or page) back to the device.
    fn empty_cache(&mut self) -> Result<(), AllocError>;
    /// Counters in the spirit of `torch.cuda.memory_stats()`.
    fn stats(&self) -> &MemoryStats;
    /// Clears the peaks so that a new phase can be measured on its own.
    fn reset_peak_stats(&mut self);
    /// The knobs, for callers that change them while running (a memory
    /// fraction set by `torch.cuda.set_per_process_memory_fraction`).
    fn config_mut(&mut self) -> &mut AllocatorConfig;
    /// The knobs in force.
    fn config(&self) -> &AllocatorConfig;
    /// Releases the cached segment starting at `ptr` if it is whole and
    /// unused; a policy without such segments empties its whole cache.
    /// Replays use it to mirror `torch.cuda.empty_cache()` calls.
    fn release_cached_segment(&mut self, _ptr: DevicePtr) -> Result<bool, AllocError> {
        self.empty_cache().map(|()| true)
    }
    /// For a policy that maps pages: `(live-page high-water mark, headroom)`
    /// in bytes (see `ExpandableAllocator`); `None` for segment policies.
    fn page_figures(&self) -> Option<(u64, u64)> {
        None
    }
    /// For a policy that plans repeating steps: what its planner did.
    fn plan_figures(&self) -> Option<PlanFigures> {
        None
    }
}

/// Builds an allocator of the given policy over `device`.
pub fn new_allocator<'a, D: DeviceMemory + 'a>(
    policy: Policy,
    device: D,
    config: AllocatorConfig,
) -> Box<dyn GpuAllocator + 'a> {
    match policy {
        Policy::Pytorch => Box::new(PytorchAllocator::new(device, config)),
        Policy::Vramfit => Box::new(ExpandableAllocator::new(device, config)),
    }
}
