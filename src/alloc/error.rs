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
}

impl OomFacts {
    /// Counts the out-of-memory event in `stats` and gathers what the message
    /// reports about the device, the limit and the allocator.
    pub(crate) fn record<D: DeviceMemory>(
        stats: &mut MemoryStats,
        device: &D,
        config: &AllocatorConfig,
        requested: u64,
    ) -> Self {
        stats.num_ooms += 1;
        let info = device.mem_info();
        Self {
            device_index: config.device_index,
            requested,
            device_total: info.total,
            device_free: info.free,
            allowed: config.allowed_bytes(info.total),
            allocated: stats.allocated_bytes.current,
            reserved: stats.reserved_bytes.current,
        }
    }

    /// The error, worded as PyTorch words it so that people and tools that
    /// know PyTorch's message read ours without surprise.
    pub(crate) fn into_error(self) -> AllocError {
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_format_like_pytorch() {
        for (bytes, text) in [
            (512, "512 bytes"),
            (1024, "1024 bytes"),
            (1536, "1.50 KiB"),
            (20 << 20, "20.00 MiB"),
            (3 << 29, "1.50 GiB"),
        ] {
            assert_eq!(format_size(bytes), text);
        }
    }

    #[test]
    fn out_of_memory_message_names_every_number() {
        let err = OomFacts {
            device_index: 0,
            requested: 20 << 20,
            device_total: 80 << 30,
            device_free: 12 << 20,
            allowed: Some(40 << 30),
            allocated: 39 << 30,
            reserved: 40 << 30,
        }
        .into_error();
        let text = err.to_string();
        for part in [
            "Tried to allocate 20.00 MiB",
            "GPU 0 has a total capacity of 80.00 GiB of which 12.00 MiB is free",
            "40.00 GiB allowed;",
            "39.00 GiB is allocated by PyTorch",
            "1024.00 MiB is reserved by PyTorch but unallocated",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text}");
        }
    }
}
