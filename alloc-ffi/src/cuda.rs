//! The CUDA driver under the allocator: segments (`cuMemAlloc`), virtual
//! ranges and pages (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`), and
//! events for blocks used on several streams and for unmapping pages in
//! stream order ([`crate::fences`]).
//!
//! PyTorch calls the allocator on whatever thread allocates or frees, with
//! whatever context is current there (a free may come for another device
//! than the current one), so every driver call runs with the device's
//! primary context pushed when it is not already current, and popped after.

use cudarc::driver::sys::{self, CUresult, cudaError_enum};
use std::time::Instant;

use vramfit_alloc_core::{DeviceError, DeviceMemory, DevicePtr, MemInfo, StreamId};
use vramfit_vmm::{Pages, check};

use crate::fences::{FENCE_INTERVAL, FreeFences, QUIET_AFTER};
use crate::state::StreamEvents;

/// A device's primary context, retained once for the process.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    ctx: sys::CUcontext,
    ordinal: i32,
}

// SAFETY: a CUcontext is a handle the driver lets any thread use.
unsafe impl Send for Context {}

fn code(result: CUresult, call: &str) -> Result<(), String> {
    if result == cudaError_enum::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {result:?}"))
    }
}

impl Context {
    /// Retains the primary context of device `ordinal` (initialising the
    /// driver if PyTorch has not yet).
    pub fn primary(ordinal: i32) -> Result<Self, String> {
        // SAFETY: plain driver calls with valid out-parameters.
        unsafe {
            if !sys::is_culib_present() {
                return Err("the CUDA driver library (libcuda.so) cannot be loaded".into());
            }
            code(sys::cuInit(0), "cuInit")?;
            let mut dev: sys::CUdevice = 0;
            code(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            code(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            Ok(Self { ctx, ordinal })
        }
    }

    /// Makes the context current for the guard's lifetime.
    fn enter(&self) -> Result<CtxGuard, String> {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-parameter.
        code(
            unsafe { sys::cuCtxGetCurrent(&mut current) },
            "cuCtxGetCurrent",
        )?;
        if current == self.ctx {
            return Ok(CtxGuard { pushed: false });
        }
        // SAFETY: the context is retained for the process's lifetime.
        code(
            unsafe { sys::cuCtxPushCurrent_v2(self.ctx) },
            "cuCtxPushCurrent",
        )?;
        Ok(CtxGuard { pushed: true })
    }
}

struct CtxGuard {
    pushed: bool,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops exactly the context `enter` pushed.
            unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

fn enter(ctx: &Context) -> Result<CtxGuard, DeviceError> {
    ctx.enter().map_err(DeviceError::Driver)
}

/// Waits for all work queued on the device's context.
fn wait_idle() -> Result<(), DeviceError> {
    // SAFETY: synchronizes the current context (entered by the caller).
    check(unsafe { sys::cuCtxSynchronize() }, 0, "cuCtxSynchronize")
}

/// [`DeviceMemory`] over the driver: segments by `cuMemAlloc`, pages by
/// [`Pages`] (shared with the agent), every call inside the device's
/// primary context.
///
/// A page freed by PyTorch may still be read or written by kernels queued
/// before the free (PyTorch frees when the host drops the tensor; reuse is
/// stream-ordered, `cuMemUnmap` is not). The policy unmaps only pages whose
/// last free the device has passed, which [`FreeFences`] tells from events
/// recorded on the freeing streams, or waits for the device first
/// (`wait_frees`: `cuCtxSynchronize`) when a limit needs the others.
pub struct CudaMemory {
    ctx: Context,
    pages: Pages,
    fences: FreeFences<CudaEvents>,
}

// SAFETY: the context is a plain driver handle; the allocator state that
// owns this is behind a mutex.
unsafe impl Send for CudaMemory {}

impl CudaMemory {
    /// The backend of the device behind `ctx`.
    pub fn new(ctx: Context) -> Self {
        let pages = {
            let _ctx = ctx.enter();
            Pages::new(ctx.ordinal)
        };
        let fences = FreeFences::new(
            CudaEvents::new(ctx),
            FENCE_INTERVAL,
            QUIET_AFTER,
            Instant::now(),
        );
        Self { ctx, pages, fences }
    }
}

impl DeviceMemory for CudaMemory {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let _ctx = enter(&self.ctx)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-parameter; the context is current.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) },
            bytes,
            "cuMemAlloc",
        )?;
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr, _bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        // SAFETY: `ptr` came from `malloc` and is freed once.
        check(unsafe { sys::cuMemFree_v2(ptr) }, 0, "cuMemFree")
    }

    fn mem_info(&self) -> MemInfo {
        let Ok(_ctx) = enter(&self.ctx) else {
            return MemInfo::default();
        };
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-parameters; the context is current.
        let result = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        if result != cudaError_enum::CUDA_SUCCESS {
            return MemInfo::default();
        }
        MemInfo {
            free: free as u64,
            total: total as u64,
        }
    }

    fn page_bytes(&self) -> u64 {
        self.pages.page_bytes()
    }

    fn reserve_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let _ctx = enter(&self.ctx)?;
        self.pages.reserve(bytes)
    }

    fn map_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        self.pages.map(at, bytes)
    }

    // The policy unmaps only pages the device has passed (`frees_done`) or
    // waits first (`wait_frees`).
    fn unmap_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        self.pages.unmap(at, bytes, false)
    }

    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        self.pages.unmap(at, bytes, true)
    }

    fn note_free(&mut self, stream: StreamId, seq: u64) {
        self.fences.note(stream, seq, Instant::now());
    }

    fn frees_done(&mut self, stream: StreamId) -> u64 {
        self.fences.done(stream, Instant::now())
    }

    fn wait_frees(&mut self) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        wait_idle()?;
        self.fences.all_done();
        Ok(())
    }

    fn wait_free(&mut self, stream: StreamId, seq: u64) -> Result<(), DeviceError> {
        if self.fences.wait_until(stream, seq, Instant::now()).is_err() {
            // No event to wait for (e.g. the stream is gone): the device.
            return self.wait_frees();
        }
        Ok(())
    }

    fn release_parked(&mut self) -> Result<(), DeviceError> {
        if !self.pages.has_parked() {
            return Ok(());
        }
        let _ctx = enter(&self.ctx)?;
        self.pages.release_parked()
    }

    fn release_range(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        self.pages.free_range(at, bytes)
    }
}

/// CUDA events without timing, recycled.
pub struct CudaEvents {
    ctx: Context,
    spare: Vec<usize>,
}

// SAFETY: events are driver handles usable from any thread.
unsafe impl Send for CudaEvents {}

impl CudaEvents {
    /// Events of the device behind `ctx`.
    pub fn new(ctx: Context) -> Self {
        Self {
            ctx,
            spare: Vec::new(),
        }
    }
}

impl StreamEvents for CudaEvents {
    type Event = usize;

    fn record(&mut self, stream: StreamId) -> Result<usize, String> {
        let _ctx = self.ctx.enter()?;
        let event = match self.spare.pop() {
            Some(event) => event,
            None => {
                let mut event: sys::CUevent = std::ptr::null_mut();
                // SAFETY: valid out-parameter.
                code(
                    unsafe {
                        sys::cuEventCreate(
                            &mut event,
                            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                        )
                    },
                    "cuEventCreate",
                )?;
                event as usize
            }
        };
        // SAFETY: `stream` is a live stream handle PyTorch passed to
        // record_stream; the event is ours.
        code(
            unsafe { sys::cuEventRecord(event as sys::CUevent, stream as sys::CUstream) },
            "cuEventRecord",
        )?;
        Ok(event)
    }

    fn done(&mut self, event: &usize) -> Result<bool, String> {
        // SAFETY: the event is ours and recorded.
        match unsafe { sys::cuEventQuery(*event as sys::CUevent) } {
            cudaError_enum::CUDA_SUCCESS => Ok(true),
            cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(format!("cuEventQuery failed: {other:?}")),
        }
    }

    fn wait(&mut self, event: &usize) -> Result<(), String> {
        // SAFETY: the event is ours and recorded.
        code(
            unsafe { sys::cuEventSynchronize(*event as sys::CUevent) },
            "cuEventSynchronize",
        )
    }

    fn recycle(&mut self, event: usize) {
        self.spare.push(event);
    }
}
