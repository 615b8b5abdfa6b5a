//! `torch.cuda.memory_stats()`-style counters.

use serde::{Deserialize, Serialize};

/// One gauge with its high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stat {
    /// Value now.
    pub current: u64,
    /// Highest value since creation or the last peak reset.
    pub peak: u64,
}

impl Stat {
    pub(crate) fn increase(&mut self, by: u64) {
        self.current += by;
        self.peak = self.peak.max(self.current);
    }

    pub(crate) fn decrease(&mut self, by: u64) {
        debug_assert!(self.current >= by, "stat underflow");
        self.current = self.current.saturating_sub(by);
    }

    pub(crate) fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// The counters both policies keep (names follow PyTorch's `memory_stats`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// Bytes in blocks handed to callers (rounded sizes, as PyTorch counts).
    pub allocated_bytes: Stat,
    /// Bytes callers asked for (unrounded).
    pub requested_bytes: Stat,
    /// Bytes held from the device (segments, or mapped pages).
    pub reserved_bytes: Stat,
    /// Live blocks.
    pub allocations: Stat,
    /// Device segments (or virtual ranges) held.
    pub segments: Stat,
    /// Device allocations retried after releasing the whole cache.
    pub num_alloc_retries: u64,
    /// Requests that ended in an out-of-memory error.
    pub num_ooms: u64,
    /// `cudaMalloc` (or page-map) calls that succeeded.
    pub num_device_allocs: u64,
    /// `cudaFree` (or page-unmap) calls.
    pub num_device_frees: u64,
    /// Times the allocator waited for the device before unmapping pages it
    /// might still use (vramfit policy, [`super::DeviceMemory::wait_frees`]).
    #[serde(default)]
    pub num_device_waits: u64,
    /// Bytes of pages unmapped to back other blocks or to stay under a
    /// limit (vramfit policy; `empty_cache` not counted).
    #[serde(default)]
    pub moved_bytes: u64,
}

impl MemoryStats {
    pub(crate) fn reset_peaks(&mut self) {
        for stat in [
            &mut self.allocated_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.allocations,
            &mut self.segments,
        ] {
            stat.reset_peak();
        }
    }
}
