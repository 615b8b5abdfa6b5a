//! Size classes, rounding rules and knobs shared by the policies.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Every request is rounded up to a multiple of this (PyTorch's `kMinBlockSize`).
pub const MIN_BLOCK_BYTES: u64 = 512;
/// Requests up to this size go to the small pool (`kSmallSize`).
pub const SMALL_REQUEST_BYTES: u64 = 1 << 20;
/// The small pool is carved from segments of this size (`kSmallBuffer`).
pub const SMALL_SEGMENT_BYTES: u64 = 2 << 20;
/// Large requests under [`MIN_LARGE_ALLOC_BYTES`] get a segment of this size (`kLargeBuffer`).
pub const LARGE_SEGMENT_BYTES: u64 = 20 << 20;
/// From this size on, a large request gets a segment of its own size (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// Segments of large requests are rounded up to this (`kRoundLarge`).
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;
/// Physical page of the expandable (virtual-memory) policy: CUDA's VMM granularity.
pub const PAGE_BYTES: u64 = 2 << 20;

/// Rounds a request the way PyTorch does before searching a pool.
pub fn round_request(bytes: u64) -> u64 {
    if bytes < MIN_BLOCK_BYTES {
        MIN_BLOCK_BYTES
    } else {
        bytes.div_ceil(MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
    }
}

/// Size of the segment PyTorch asks the device for when no cached block fits
/// a (rounded) request.
pub fn segment_bytes_for(rounded: u64) -> u64 {
    if rounded <= SMALL_REQUEST_BYTES {
        SMALL_SEGMENT_BYTES
    } else if rounded < MIN_LARGE_ALLOC_BYTES {
        LARGE_SEGMENT_BYTES
    } else {
        rounded.div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
    }
}

/// Which allocation policy to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// PyTorch's `CUDACachingAllocator` (native backend, default settings).
    #[default]
    Pytorch,
    /// Our expandable-page policy: lower reserved peak.
    Vramfit,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Pytorch => "pytorch",
            Policy::Vramfit => "vramfit",
        })
    }
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "pytorch" => Ok(Policy::Pytorch),
            "vramfit" => Ok(Policy::Vramfit),
            other => Err(format!(
                "unknown allocator policy {other:?}: expected pytorch or vramfit"
            )),
        }
    }
}

/// The knobs of `PYTORCH_CUDA_ALLOC_CONF` that matter to the policies, plus
/// the per-process memory fraction.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorConfig {
    /// `max_split_size_mb` in bytes: cached blocks this large are never split
    /// and only serve requests within 20 MiB of their size. `None`: unlimited.
    pub max_split_size: Option<u64>,
    /// `garbage_collection_threshold` (0..1): with a memory fraction set, old
    /// unused segments are freed once reserved memory passes this share of
    /// the allowed maximum.
    pub garbage_collection_threshold: Option<f64>,
    /// `torch.cuda.set_per_process_memory_fraction`: the share (0..1] of the
    /// device's total memory this process may reserve.
    pub memory_fraction: Option<f64>,
    /// A hard ceiling on reserved bytes (vramfit's per-job budget): like the
    /// memory fraction, but in bytes and named as a budget in the
    /// out-of-memory message. The lower of both limits applies.
    pub budget_bytes: Option<u64>,
    /// Index of the device, used in messages only.
    pub device_index: u32,
    /// vramfit policy: never serve a repeating step from a planned layout
    /// (see `docs/allocator.md`, "Planned steps").
    #[serde(default)]
    pub disable_step_plan: bool,
}

impl AllocatorConfig {
    /// The reserve ceiling in bytes for a device of `total` bytes.
    pub fn allowed_bytes(&self, total: u64) -> Option<u64> {
        let by_fraction = self
            .memory_fraction
            .map(|fraction| (fraction.clamp(0.0, 1.0) * total as f64) as u64);
        match (by_fraction, self.budget_bytes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the budget (not the memory fraction) is the binding limit on
    /// a device of `total` bytes.
    pub fn budget_binds(&self, total: u64) -> bool {
        match self.budget_bytes {
            Some(budget) => self.allowed_bytes(total) == Some(budget),
            None => false,
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
