//! Uncached `cuMemAlloc`/`cuMemFree`, the benchmark's baseline.

use vramfit::alloc::DevicePtr;

use cudarc::driver::result;

use super::driver;
use crate::bench::TimedAllocator;

/// Every allocation goes to the driver; nothing is cached.
pub struct RawCudaMalloc {
    peak: u64,
    current: u64,
}

impl RawCudaMalloc {
    /// Uses the context current on this thread.
    pub fn new() -> Self {
        Self {
            peak: 0,
            current: 0,
        }
    }
}

impl Default for RawCudaMalloc {
    fn default() -> Self {
        Self::new()
    }
}

impl TimedAllocator for RawCudaMalloc {
    fn alloc(&mut self, bytes: u64) -> crate::Result<DevicePtr> {
        // SAFETY: a context is current (the caller bound one); the memory is
        // freed by `release`.
        let ptr = unsafe { result::malloc_sync(bytes as usize) }.map_err(driver("cuMemAlloc"))?;
        self.current += bytes;
        self.peak = self.peak.max(self.current);
        Ok(ptr)
    }

    fn release(&mut self, ptr: DevicePtr, bytes: u64) -> crate::Result<()> {
        self.current -= bytes;
        // SAFETY: `ptr` came from `alloc` and is freed once.
        unsafe { result::free_sync(ptr) }.map_err(driver("cuMemFree"))
    }

    fn peak_reserved(&self) -> u64 {
        self.peak
    }
}
