//! The allocator's one error type and PyTorch's size formatting.

use thiserror::Error;

use super::config::AllocatorConfig;
use super::device::{DeviceError, DeviceMemory, DevicePtr};
use super::stats::MemoryStats;

/// Why an allocation, a free or a replay failed.
#[derive(Debug, Error)]
pub enum AllocError {
    /// No cached block fits and the device (or the memory fraction) has no
    /// room even after releasing the cache. The message reads like PyTorch's.
    #[error("{message}")]
    OutOfMemory {
        /// PyTorch-style explanation, with every number in it.
        message: String,
        /// The rounded request in bytes.
        requested: u64,
        /// Bytes held by live blocks at the time.
        allocated: u64,
        /// Bytes reserved from the device at the time.
        reserved: u64,
        /// The largest free (cached) block at the time.
        largest_free: u64,
        /// The process's budget ([`AllocatorConfig::budget_bytes`]) refused
        /// the request, not the device.
        budget_exceeded: bool,
    },
    /// `free` of a pointer this allocator did not hand out (or freed twice).
    #[error("free of {0:#x}, which is not an allocated block")]
    UnknownPointer(DevicePtr),
    /// The device backend failed in a way that is not lack of memory.
    #[error("device backend failed")]
    Device(#[from] DeviceError),
    /// The snapshot could not be read.
    #[error("cannot read the memory snapshot: {0}")]
    Snapshot(String),
    /// The snapshot file could not be opened.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Formats a byte count the way PyTorch's messages do: `512 bytes`,
/// `1.50 KiB`, `20.00 MiB`, `79.15 GiB`.
pub fn format_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= 1 << 20 {
        format!("{:.2} KiB", b / KIB)
    } else if bytes <= 1 << 30 {
        format!("{:.2} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

/// The facts an out-of-memory message is made of.
pub(crate) struct OomFacts {
    pub device_index: u32,
    pub requested: u64,
    pub device_total: u64,
    pub device_free: u64,
    pub allowed: Option<u64>,
    pub allocated: u64,
    pub reserved: u64,
    pub budget: Option<u64>,
    pub largest_free: u64,
    pub budget_exceeded: bool,
}

impl OomFacts {
    /// Counts the out-of-memory event in `stats` and gathers what the message
    /// reports about the device, the limit and the allocator.
    ///
    /// `largest_free` is the policy's largest free block; `needed` the bytes
    /// the policy had to take from the device for the request (a segment or
    /// pages), which tells whether the budget refused it.
    pub(crate) fn record<D: DeviceMemory>(
        stats: &mut MemoryStats,
        device: &D,
        config: &AllocatorConfig,
        requested: u64,
        needed: u64,
        largest_free: u64,
    ) -> Self {
        stats.num_ooms += 1;
        let info = device.mem_info();
        let reserved = stats.reserved_bytes.current;
        let budget_exceeded = config.budget_binds(info.total)
            && config
                .budget_bytes
                .is_some_and(|budget| reserved + needed > budget);
        Self {
            device_index: config.device_index,
            requested,
            device_total: info.total,
            device_free: info.free,
            allowed: config.allowed_bytes(info.total),
            allocated: stats.allocated_bytes.current,
            reserved,
            budget: config.budget_bytes,
            largest_free,
            budget_exceeded,
        }
    }

    /// The error, worded as PyTorch words it so that people and tools that
    /// know PyTorch's message read ours without surprise.
    pub(crate) fn into_error(self) -> AllocError {
        if self.budget_exceeded {
            return self.into_budget_error();
        }
        let in_use = self.device_total.saturating_sub(self.device_free);
        let allowed = self
            .allowed
            .map(|a| format!("{} allowed; ", format_size(a)))
            .unwrap_or_default();
        let message = format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. \
             Including non-PyTorch memory, this process has {} memory in use. {}Of the allocated memory {} is \
             allocated by PyTorch, and {} is reserved by PyTorch but unallocated. If reserved but unallocated \
             memory is large try the vramfit policy (expandable pages) to avoid fragmentation.",
            format_size(self.requested),
            self.device_index,
            format_size(self.device_total),
            format_size(self.device_free),
            format_size(in_use),
            allowed,
            format_size(self.allocated),
            format_size(self.reserved.saturating_sub(self.allocated)),
        );
        AllocError::OutOfMemory {
            message,
            requested: self.requested,
            allocated: self.allocated,
            reserved: self.reserved,
            largest_free: self.largest_free,
            budget_exceeded: false,
        }
    }

    /// The budget's own message: what was asked, what the budget is, where
    /// the bytes went, and what would help. It starts like PyTorch's, so
    /// tools that look for "CUDA out of memory" recognise it.
    fn into_budget_error(self) -> AllocError {
        let budget = self.budget.unwrap_or_default();
        let message = format!(
            "CUDA out of memory: vramfit budget exceeded on GPU {}. Tried to allocate {} with a budget of {}: \
             {} is allocated by PyTorch and {} is reserved (after releasing every cached block that could be \
             released), and the largest free block is {}. GPU {} has a total capacity of {} of which {} is free. \
             [budget={} allocated={} reserved={} requested={} largest_free={}] Lower the micro-batch or raise \
             the job's memory budget; when reserved is much larger than allocated, the vramfit policy \
             (VRAMFIT_ALLOC_POLICY=vramfit) fragments less.",
            self.device_index,
            format_size(self.requested),
            format_size(budget),
            format_size(self.allocated),
            format_size(self.reserved),
            format_size(self.largest_free),
            self.device_index,
            format_size(self.device_total),
            format_size(self.device_free),
            budget,
            self.allocated,
            self.reserved,
            self.requested,
            self.largest_free,
        );
        AllocError::OutOfMemory {
            message,
            requested: self.requested,
            allocated: self.allocated,
            reserved: self.reserved,
            largest_free: self.largest_free,
            budget_exceeded: true,
        }
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
