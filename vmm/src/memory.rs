//! The allocator core's device backend over the CUDA driver, shared by
//! `libvramfit_alloc.so` and the agent: segments by `cuMemAlloc`, ranges and
//! pages by [`Pages`], every call inside the device's context ([`Context`]).

use cudarc::driver::sys::{self, CUresult, cudaError_enum};
use vramfit_alloc_core::{DeviceError, DeviceMemory, DevicePtr, MemInfo};

use crate::{Pages, check};

fn code(result: CUresult, call: &str) -> Result<(), String> {
    if result == cudaError_enum::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {result:?}"))
    }
}

/// A device's context: every driver call of [`VmmMemory`] runs with it
/// current, pushed when another one (or none) is current on the calling
/// thread and popped after. PyTorch calls its allocator on whatever thread
/// allocates or frees, with whatever context is current there.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    ctx: sys::CUcontext,
    ordinal: i32,
}

// SAFETY: a CUcontext is a handle the driver lets any thread use.
unsafe impl Send for Context {}

impl Context {
    /// Retains the primary context of device `ordinal` (initialising the
    /// driver if need be) for the rest of the process: it is never released.
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

    /// A context someone else holds (cudarc's `CudaContext::cu_ctx`).
    ///
    /// # Safety
    ///
    /// `ctx` is a live context of device `ordinal` and stays alive as long
    /// as this value and every copy of it are used.
    pub unsafe fn from_raw(ctx: sys::CUcontext, ordinal: i32) -> Self {
        Self { ctx, ordinal }
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes the context current for the guard's lifetime.
    pub fn enter(&self) -> Result<CtxGuard, String> {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-parameter.
        code(
            unsafe { sys::cuCtxGetCurrent(&mut current) },
            "cuCtxGetCurrent",
        )?;
        if current == self.ctx {
            return Ok(CtxGuard { pushed: false });
        }
        // SAFETY: the context is alive (`primary` retains it for the
        // process; `from_raw`'s caller keeps it alive).
        code(
            unsafe { sys::cuCtxPushCurrent_v2(self.ctx) },
            "cuCtxPushCurrent",
        )?;
        Ok(CtxGuard { pushed: true })
    }
}

/// The context [`Context::enter`] made current, until dropped.
pub struct CtxGuard {
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

/// [`DeviceMemory`] over the driver: segments by `cuMemAlloc`/`cuMemFree`,
/// the expandable policy's ranges and pages by [`Pages`], every call inside
/// the device's [`Context`].
///
/// It never waits for the device: unmapping a page a queued kernel may
/// still use is the caller's business. A backend whose memory kernels use
/// (libvramfit_alloc.so) wraps it with fences that tell when a free is
/// behind the device and answers the trait's `note_free`, `frees_done`,
/// `wait_frees` and `wait_free` (waiting with [`VmmMemory::synchronize`]);
/// here they keep the trait's defaults (nothing queued).
pub struct VmmMemory {
    ctx: Context,
    pages: Pages,
}

// SAFETY: the context and the page handles are plain driver handles; the
// owner serialises access (`&mut self`).
unsafe impl Send for VmmMemory {}

impl VmmMemory {
    /// The backend of the device behind `ctx`.
    pub fn new(ctx: Context) -> Self {
        let pages = {
            let _ctx = ctx.enter();
            Pages::new(ctx.ordinal)
        };
        Self { ctx, pages }
    }

    /// The device's context.
    pub fn context(&self) -> Context {
        self.ctx
    }

    /// Waits for all work queued on the device's context
    /// (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        // SAFETY: synchronizes the context just made current.
        check(unsafe { sys::cuCtxSynchronize() }, 0, "cuCtxSynchronize")
    }
}

impl DeviceMemory for VmmMemory {
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

    fn unmap_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        self.pages.unmap(at, bytes, false)
    }

    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        self.pages.unmap(at, bytes, true)
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

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
