//! The device backend the allocators call, and a simulated one.

use std::collections::HashMap;

use thiserror::Error;

/// A device address (what `cudaMalloc` returns), as a plain integer.
pub type DevicePtr = u64;

/// A CUDA stream, as the integer value of its handle (0 is the default stream).
pub type StreamId = u64;

/// Free and total bytes of the device, as `cudaMemGetInfo` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    /// Bytes nobody holds on the device.
    pub free: u64,
    /// Bytes of the device.
    pub total: u64,
}

/// What a backend reports when the device refuses.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// The device has no room for the request (`cudaErrorMemoryAllocation`).
    #[error("device out of memory asking for {bytes} bytes")]
    OutOfMemory {
        /// The bytes asked for.
        bytes: u64,
    },
    /// The backend cannot do this (e.g. no virtual memory management).
    #[error("operation not supported by this device backend: {0}")]
    Unsupported(&'static str),
    /// Any other driver failure, with the driver's words.
    #[error("device error: {0}")]
    Driver(String),
}

/// The few driver operations a caching allocator needs.
///
/// `malloc`/`free` are whole segments (`cuMemAlloc`/`cuMemFree`). The
/// `*_range`/`*_pages` calls are CUDA's virtual memory management
/// (`cuMemAddressReserve`, `cuMemCreate` + `cuMemMap`, `cuMemUnmap` +
/// `cuMemRelease`), used by the expandable policy; a backend without them
/// keeps the defaults, which refuse.
pub trait DeviceMemory {
    /// Allocates a segment of exactly `bytes` bytes.
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError>;
    /// Frees a segment returned by [`DeviceMemory::malloc`].
    fn free(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError>;
    /// Free and total device memory.
    fn mem_info(&self) -> MemInfo;
    /// Granularity of physical pages for [`DeviceMemory::map_pages`].
    fn page_bytes(&self) -> u64 {
        crate::PAGE_BYTES
    }
    /// Reserves `bytes` of virtual address space, backed by nothing yet.
    fn reserve_range(&mut self, _bytes: u64) -> Result<DevicePtr, DeviceError> {
        Err(DeviceError::Unsupported("reserve_range"))
    }
    /// Backs `[at, at + bytes)` (page-aligned) with new physical pages.
    fn map_pages(&mut self, _at: DevicePtr, _bytes: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported("map_pages"))
    }
    /// Gives the physical pages behind `[at, at + bytes)` back to the device.
    fn unmap_pages(&mut self, _at: DevicePtr, _bytes: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported("unmap_pages"))
    }
    /// Unmaps `[at, at + bytes)` like [`DeviceMemory::unmap_pages`] but may
    /// keep the physical pages for the next [`DeviceMemory::map_pages`]
    /// (moving a page costs an unmap and a map instead of a release and a
    /// create). The allocator parks only pages it maps again at once, and
    /// calls [`DeviceMemory::release_parked`] after.
    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.unmap_pages(at, bytes)
    }
    /// Gives back parked pages that were not mapped again.
    fn release_parked(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Gives a reserved range back (all its pages must be unmapped).
    fn release_range(&mut self, _at: DevicePtr, _bytes: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported("release_range"))
    }
    /// The allocator numbers frees in order (1, 2, ...) and says here that
    /// free `seq` was of a block of `stream`. On a GPU, kernels queued on
    /// that stream before the free may still use the block, so its pages
    /// must not be unmapped until the device has passed that point; a
    /// backend with a queue notes it (e.g. records an event now and then).
    fn note_free(&mut self, _stream: StreamId, _seq: u64) {}
    /// The highest free number up to which every free of `stream` is known
    /// to be behind the device (its pages may be unmapped without waiting).
    /// A backend without a queue: all of them.
    fn frees_done(&mut self, _stream: StreamId) -> u64 {
        u64::MAX
    }
    /// Waits until the device has passed every free noted so far, on every
    /// stream (`cuCtxSynchronize`).
    fn wait_frees(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Waits until the device has passed free `seq` of `stream` (an event
    /// recorded after it), not for the work queued since.
    fn wait_free(&mut self, _stream: StreamId, _seq: u64) -> Result<(), DeviceError> {
        self.wait_frees()
    }
}

/// A device that exists only as bookkeeping: it hands out increasing,
/// 2 MiB-aligned addresses and refuses once `capacity` bytes are in use.
///
/// Addresses can be suggested ahead of time ([`SimulatedDevice::expect_segment`]):
/// replaying a PyTorch trace feeds it the addresses PyTorch's `cudaMalloc`
/// returned, so that ties between equal-size cached blocks, which PyTorch
/// breaks by address, break the same way.
#[derive(Debug, Clone)]
pub struct SimulatedDevice {
    capacity: u64,
    used: u64,
    next_addr: u64,
    /// Fresh addresses go down from the top instead of up (see
    /// [`SimulatedDevice::top_down`]).
    descending: bool,
    segments: HashMap<DevicePtr, u64>,
    ranges: HashMap<DevicePtr, u64>,
    expected: std::collections::VecDeque<(u64, DevicePtr)>,
    /// Number of `malloc` calls that succeeded.
    pub malloc_calls: u64,
    /// Number of `free` calls.
    pub free_calls: u64,
    /// Number of page-mapping calls.
    pub map_calls: u64,
    /// Number of page-unmapping calls.
    pub unmap_calls: u64,
    /// How many of the latest frees the device is still behind
    /// ([`DeviceMemory::frees_done`]); 0: none (no queue).
    pub free_lag: u64,
    /// The last free noted, and the free [`DeviceMemory::wait_frees`] last waited for.
    noted_free: u64,
    waited_free: u64,
    /// Number of [`DeviceMemory::wait_frees`] calls.
    pub wait_calls: u64,
    /// Number of [`DeviceMemory::wait_free`] calls.
    pub wait_free_calls: u64,
}

/// Where simulated addresses start when no address was suggested: far above
/// the addresses real devices hand out, so both never meet.
const SYNTHETIC_BASE: u64 = 1 << 52;

/// Where a [`SimulatedDevice::top_down`] device's addresses start (going
/// down): above [`SYNTHETIC_BASE`], with room below for any replay.
const SYNTHETIC_TOP: u64 = 1 << 60;

impl SimulatedDevice {
    /// A device of `capacity` bytes with nothing allocated.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used: 0,
            next_addr: SYNTHETIC_BASE,
            descending: false,
            segments: HashMap::new(),
            ranges: HashMap::new(),
            expected: Default::default(),
            malloc_calls: 0,
            free_calls: 0,
            map_calls: 0,
            unmap_calls: 0,
            free_lag: 0,
            noted_free: 0,
            waited_free: 0,
            wait_calls: 0,
            wait_free_calls: 0,
        }
    }

    /// A device whose fresh addresses decrease, as the CUDA driver's
    /// `cudaMalloc` hands them out on the H200 (752 of 768 segments of a
    /// recorded Llama-3 8B run each below the one before). PyTorch breaks
    /// ties between equal-size cached blocks by address, so the direction
    /// decides which of them a request takes.
    pub fn top_down(capacity: u64) -> Self {
        Self {
            next_addr: SYNTHETIC_TOP,
            descending: true,
            ..Self::new(capacity)
        }
    }

    /// Suggests that the next `malloc` of `bytes` returns `addr` (used in
    /// order; a suggestion that does not match the next request is dropped).
    pub fn expect_segment(&mut self, bytes: u64, addr: DevicePtr) {
        self.expected.push_back((bytes, addr));
    }

    /// Bytes currently held (segments and mapped pages).
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    fn fresh_address(&mut self, bytes: u64) -> DevicePtr {
        let span = bytes.div_ceil(crate::PAGE_BYTES).max(1) * crate::PAGE_BYTES;
        if self.descending {
            self.next_addr -= span;
            return self.next_addr;
        }
        let addr = self.next_addr;
        self.next_addr += span;
        addr
    }

    fn charge(&mut self, bytes: u64) -> Result<(), DeviceError> {
        if self.used + bytes > self.capacity {
            return Err(DeviceError::OutOfMemory { bytes });
        }
        self.used += bytes;
        Ok(())
    }
}

impl DeviceMemory for SimulatedDevice {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.charge(bytes)?;
        self.malloc_calls += 1;
        let suggested = match self.expected.front() {
            Some(&(size, addr)) if size == bytes => {
                self.expected.pop_front();
                Some(addr).filter(|a| !self.segments.contains_key(a))
            }
            _ => None,
        };
        let addr = match suggested {
            Some(addr) => addr,
            None => self.fresh_address(bytes),
        };
        self.segments.insert(addr, bytes);
        Ok(addr)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        match self.segments.remove(&ptr) {
            Some(size) if size == bytes => {
                self.used -= size;
                self.free_calls += 1;
                Ok(())
            }
            Some(size) => {
                self.segments.insert(ptr, size);
                Err(DeviceError::Driver(format!(
                    "free of {bytes} bytes at {ptr:#x}, a segment of {size} bytes"
                )))
            }
            None => Err(DeviceError::Driver(format!(
                "free of unknown segment {ptr:#x}"
            ))),
        }
    }

    fn mem_info(&self) -> MemInfo {
        MemInfo {
            free: self.capacity - self.used,
            total: self.capacity,
        }
    }

    fn reserve_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let addr = self.fresh_address(bytes);
        self.ranges.insert(addr, bytes);
        Ok(addr)
    }

    fn map_pages(&mut self, _at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.charge(bytes)?;
        self.map_calls += 1;
        Ok(())
    }

    fn unmap_pages(&mut self, _at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.used -= bytes.min(self.used);
        self.unmap_calls += 1;
        Ok(())
    }

    fn release_range(&mut self, at: DevicePtr, _bytes: u64) -> Result<(), DeviceError> {
        self.ranges
            .remove(&at)
            .map(|_| ())
            .ok_or_else(|| DeviceError::Driver(format!("release of unknown range {at:#x}")))
    }

    fn note_free(&mut self, _stream: StreamId, seq: u64) {
        self.noted_free = self.noted_free.max(seq);
    }

    fn frees_done(&mut self, _stream: StreamId) -> u64 {
        if self.free_lag == 0 {
            return u64::MAX;
        }
        self.noted_free
            .saturating_sub(self.free_lag)
            .max(self.waited_free)
    }

    fn wait_frees(&mut self) -> Result<(), DeviceError> {
        self.waited_free = self.noted_free;
        self.wait_calls += 1;
        Ok(())
    }

    fn wait_free(&mut self, _stream: StreamId, seq: u64) -> Result<(), DeviceError> {
        self.waited_free = self.waited_free.max(seq.min(self.noted_free));
        self.wait_free_calls += 1;
        Ok(())
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
