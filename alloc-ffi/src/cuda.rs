//! The CUDA driver under the allocator: segments (`cuMemAlloc`), virtual
//! ranges and pages (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`), and
//! events for blocks used on several streams.
//!
//! PyTorch calls the allocator on whatever thread allocates or frees, with
//! whatever context is current there (a free may come for another device
//! than the current one), so every driver call runs with the device's
//! primary context pushed when it is not already current, and popped after.

use std::collections::HashMap;

use cudarc::driver::sys::{self, CUresult, cudaError_enum};
use vramfit::alloc::{DeviceError, DeviceMemory, DevicePtr, MemInfo, PAGE_BYTES, StreamId};

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

fn device_err(result: CUresult, bytes: u64, call: &str) -> Result<(), DeviceError> {
    match result {
        cudaError_enum::CUDA_SUCCESS => Ok(()),
        cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory { bytes }),
        other => Err(DeviceError::Driver(format!("{call}: {other:?}"))),
    }
}

fn enter(ctx: &Context) -> Result<CtxGuard, DeviceError> {
    ctx.enter().map_err(DeviceError::Driver)
}

/// Waits for all work queued on the device's context. A page freed by
/// PyTorch may still be read or written by kernels queued before the free
/// (PyTorch frees when the host drops the tensor, reuse is stream-ordered),
/// and `cuMemUnmap` is not: pages are unmapped only once the device is idle.
fn wait_idle() -> Result<(), DeviceError> {
    // SAFETY: synchronizes the current context (entered by the caller).
    device_err(unsafe { sys::cuCtxSynchronize() }, 0, "cuCtxSynchronize")
}

/// [`DeviceMemory`] over the driver, one physical handle per page so that
/// any page can be given back on its own.
pub struct CudaMemory {
    ctx: Context,
    page: u64,
    handles: HashMap<DevicePtr, sys::CUmemGenericAllocationHandle>,
    /// Physical pages unmapped by `park_pages`, for the next map.
    parked: Vec<sys::CUmemGenericAllocationHandle>,
}

// SAFETY: handles and the context are plain driver handles; the allocator
// state that owns this is behind a mutex.
unsafe impl Send for CudaMemory {}

impl CudaMemory {
    /// The backend of the device behind `ctx`.
    pub fn new(ctx: Context) -> Self {
        let mut backend = Self {
            ctx,
            page: PAGE_BYTES,
            handles: HashMap::new(),
            parked: Vec::new(),
        };
        let mut granularity = 0usize;
        let prop = backend.prop();
        // SAFETY: valid pointers for the call's duration.
        let result = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        if result == cudaError_enum::CUDA_SUCCESS && granularity > 0 {
            backend.page = PAGE_BYTES.div_ceil(granularity as u64) * granularity as u64;
        }
        backend
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ctx.ordinal,
        }
    }

    fn prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: all-zero is the documented "no options" value of the
        // fields not set here.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = self.location();
        prop
    }
}

impl DeviceMemory for CudaMemory {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let _ctx = enter(&self.ctx)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-parameter; the context is current.
        device_err(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) },
            bytes,
            "cuMemAlloc",
        )?;
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr, _bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        // SAFETY: `ptr` came from `malloc` and is freed once.
        device_err(unsafe { sys::cuMemFree_v2(ptr) }, 0, "cuMemFree")
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
        self.page
    }

    fn reserve_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let _ctx = enter(&self.ctx)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: reserving addresses touches no memory.
        device_err(
            unsafe { sys::cuMemAddressReserve(&mut ptr, bytes as usize, self.page as usize, 0, 0) },
            bytes,
            "cuMemAddressReserve",
        )?;
        Ok(ptr)
    }

    fn map_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        let prop = self.prop();
        let mut mapped = 0;
        while mapped < bytes {
            let addr = at + mapped;
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            let created = match self.parked.pop() {
                Some(parked) => {
                    handle = parked;
                    cudaError_enum::CUDA_SUCCESS
                }
                // SAFETY: valid out-parameter and properties.
                None => unsafe { sys::cuMemCreate(&mut handle, self.page as usize, &prop, 0) },
            };
            let result = device_err(created, self.page, "cuMemCreate").and_then(|()| {
                // SAFETY: `addr` is a page of a reserved range that is not mapped.
                let code = unsafe { sys::cuMemMap(addr, self.page as usize, 0, handle, 0) };
                device_err(code, self.page, "cuMemMap").inspect_err(|_| {
                    // SAFETY: the handle is ours and mapped nowhere.
                    unsafe { sys::cuMemRelease(handle) };
                })
            });
            if let Err(e) = result {
                // Leave no half-mapped run behind: the allocator counts the
                // run as not mapped.
                if mapped > 0 {
                    let _ = self.unmap_pages(at, mapped);
                }
                return Err(e);
            }
            self.handles.insert(addr, handle);
            mapped += self.page;
        }
        let access = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `[at, at + bytes)` was just mapped.
        device_err(
            unsafe { sys::cuMemSetAccess(at, bytes as usize, &access, 1) },
            bytes,
            "cuMemSetAccess",
        )
    }

    fn unmap_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        wait_idle()?;
        let mut done = 0;
        while done < bytes {
            let addr = at + done;
            // SAFETY: the page was mapped by `map_pages`; no live block uses it.
            device_err(
                unsafe { sys::cuMemUnmap(addr, self.page as usize) },
                0,
                "cuMemUnmap",
            )?;
            if let Some(handle) = self.handles.remove(&addr) {
                // SAFETY: the handle is mapped nowhere now.
                device_err(unsafe { sys::cuMemRelease(handle) }, 0, "cuMemRelease")?;
            }
            done += self.page;
        }
        Ok(())
    }

    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        wait_idle()?;
        let mut done = 0;
        while done < bytes {
            let addr = at + done;
            // SAFETY: the page was mapped by `map_pages`; no live block uses it.
            device_err(
                unsafe { sys::cuMemUnmap(addr, self.page as usize) },
                0,
                "cuMemUnmap",
            )?;
            if let Some(handle) = self.handles.remove(&addr) {
                self.parked.push(handle);
            }
            done += self.page;
        }
        Ok(())
    }

    fn release_parked(&mut self) -> Result<(), DeviceError> {
        if self.parked.is_empty() {
            return Ok(());
        }
        let _ctx = enter(&self.ctx)?;
        for handle in std::mem::take(&mut self.parked) {
            // SAFETY: a parked handle is mapped nowhere.
            device_err(unsafe { sys::cuMemRelease(handle) }, 0, "cuMemRelease")?;
        }
        Ok(())
    }

    fn release_range(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ctx = enter(&self.ctx)?;
        // SAFETY: the range was reserved here and holds no mappings.
        device_err(
            unsafe { sys::cuMemAddressFree(at, bytes as usize) },
            0,
            "cuMemAddressFree",
        )
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
