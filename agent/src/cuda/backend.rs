//! The allocator core's device backend on a real GPU.

use std::sync::Arc;

use cudarc::driver::sys::cudaError_enum;
use cudarc::driver::{CudaContext, result};
use vramfit::alloc::{DeviceError, DeviceMemory, DevicePtr, MemInfo};
use vramfit_vmm::Pages;

/// [`DeviceMemory`] over the CUDA driver: `cuMemAlloc`/`cuMemFree` for
/// segments, and the expandable policy's ranges and pages through
/// [`Pages`] (shared with `libvramfit_alloc.so`). The backend's context is
/// bound to the creating thread; nothing here launches kernels, so pages
/// are unmapped without waiting for the device.
pub struct CudaDeviceMemory {
    ctx: Arc<CudaContext>,
    pages: Pages,
}

fn from_driver(e: result::DriverError, bytes: u64) -> DeviceError {
    if e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        DeviceError::OutOfMemory { bytes }
    } else {
        DeviceError::Driver(e.to_string())
    }
}

impl CudaDeviceMemory {
    /// A backend on device `ordinal`, with its primary context bound to this thread.
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self, DeviceError> {
        ctx.bind_to_thread().map_err(|e| from_driver(e, 0))?;
        let pages = Pages::new(ctx.ordinal() as i32);
        Ok(Self { ctx, pages })
    }

    /// The context, for kernels that run on what this backend hands out.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl DeviceMemory for CudaDeviceMemory {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        // SAFETY: the context is current on this thread (bound in `new`); the
        // returned memory is owned by the caller until `free`.
        unsafe { result::malloc_sync(bytes as usize) }.map_err(|e| from_driver(e, bytes))
    }

    fn free(&mut self, ptr: DevicePtr, _bytes: u64) -> Result<(), DeviceError> {
        // SAFETY: `ptr` came from `malloc` and the allocator frees it once.
        unsafe { result::free_sync(ptr) }.map_err(|e| from_driver(e, 0))
    }

    fn mem_info(&self) -> MemInfo {
        let (free, total) = result::mem_get_info().unwrap_or((0, 0));
        MemInfo {
            free: free as u64,
            total: total as u64,
        }
    }

    fn page_bytes(&self) -> u64 {
        self.pages.page_bytes()
    }

    fn reserve_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.pages.reserve(bytes)
    }

    fn map_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.pages.map(at, bytes)
    }

    fn unmap_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.pages.unmap(at, bytes, false)
    }

    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.pages.unmap(at, bytes, true)
    }

    fn release_parked(&mut self) -> Result<(), DeviceError> {
        self.pages.release_parked()
    }

    fn release_range(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.pages.free_range(at, bytes)
    }
}
