//! The allocator core's device backend on a real GPU: vmm's [`VmmMemory`]
//! (the one `libvramfit_alloc.so` uses) on a cudarc context.

use std::sync::Arc;

use cudarc::driver::CudaContext;
use vramfit::alloc::{DeviceError, DeviceMemory, DevicePtr, MemInfo};
use vramfit_vmm::{Context, VmmMemory};

/// [`DeviceMemory`] over the CUDA driver: [`VmmMemory`] (`cuMemAlloc`
/// segments, the expandable policy's ranges and pages) inside the context
/// of a cudarc [`CudaContext`], which it keeps alive. Nothing here launches
/// kernels, so pages are unmapped without waiting for the device.
pub struct CudaDeviceMemory {
    ctx: Arc<CudaContext>,
    memory: VmmMemory,
}

impl CudaDeviceMemory {
    /// A backend on `ctx`'s device, with the context bound to this thread
    /// (calls from another thread make it current for their duration).
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self, DeviceError> {
        ctx.bind_to_thread()
            .map_err(|e| DeviceError::Driver(e.to_string()))?;
        // SAFETY: `ctx` is kept alive in `self` as long as `memory` is used.
        let raw = unsafe { Context::from_raw(ctx.cu_ctx(), ctx.ordinal() as i32) };
        Ok(Self {
            ctx,
            memory: VmmMemory::new(raw),
        })
    }

    /// The context, for kernels that run on what this backend hands out.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl DeviceMemory for CudaDeviceMemory {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.memory.malloc(bytes)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.memory.free(ptr, bytes)
    }

    fn mem_info(&self) -> MemInfo {
        self.memory.mem_info()
    }

    fn page_bytes(&self) -> u64 {
        self.memory.page_bytes()
    }

    fn reserve_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.memory.reserve_range(bytes)
    }

    fn map_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.memory.map_pages(at, bytes)
    }

    fn unmap_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.memory.unmap_pages(at, bytes)
    }

    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.memory.park_pages(at, bytes)
    }

    fn release_parked(&mut self) -> Result<(), DeviceError> {
        self.memory.release_parked()
    }

    fn release_range(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.memory.release_range(at, bytes)
    }
}
