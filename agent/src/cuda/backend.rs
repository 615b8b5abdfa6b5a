//! The allocator core's device backend on a real GPU.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult, cudaError_enum};
use cudarc::driver::{CudaContext, result};
use vramfit::alloc::{DeviceError, DeviceMemory, DevicePtr, MemInfo};

/// [`DeviceMemory`] over the CUDA driver: `cuMemAlloc`/`cuMemFree` for
/// segments, and `cuMemAddressReserve`/`cuMemCreate`/`cuMemMap` for the
/// expandable policy's ranges and pages (one physical handle per page, so
/// that any page can be given back on its own).
pub struct CudaDeviceMemory {
    ctx: Arc<CudaContext>,
    ordinal: i32,
    page: u64,
    handles: HashMap<DevicePtr, sys::CUmemGenericAllocationHandle>,
    /// Physical pages unmapped by `park_pages`, for the next map.
    parked: Vec<sys::CUmemGenericAllocationHandle>,
}

fn check(code: CUresult, bytes: u64) -> Result<(), DeviceError> {
    match code {
        cudaError_enum::CUDA_SUCCESS => Ok(()),
        cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory { bytes }),
        other => Err(DeviceError::Driver(format!("{other:?}"))),
    }
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
        let ordinal = ctx.ordinal() as i32;
        let mut backend = Self {
            ctx,
            ordinal,
            page: vramfit::alloc::PAGE_BYTES,
            handles: HashMap::new(),
            parked: Vec::new(),
        };
        let mut granularity = 0usize;
        let prop = backend.page_prop();
        // SAFETY: `granularity` and `prop` are valid for the call's duration.
        let code = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        if code == cudaError_enum::CUDA_SUCCESS && granularity > 0 {
            backend.page = backend.page.div_ceil(granularity as u64) * granularity as u64;
        }
        Ok(backend)
    }

    /// The context, for kernels that run on what this backend hands out.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal,
        }
    }

    fn page_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: the struct is plain data for which all-zero is the
        // documented "no options" value of every field we do not set.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = self.location();
        prop
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
        self.page
    }

    fn reserve_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: reserving virtual addresses touches no memory; `ptr` is a
        // valid out-parameter.
        let code =
            unsafe { sys::cuMemAddressReserve(&mut ptr, bytes as usize, self.page as usize, 0, 0) };
        check(code, bytes)?;
        Ok(ptr)
    }

    fn map_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let prop = self.page_prop();
        let mut mapped = 0;
        while mapped < bytes {
            let addr = at + mapped;
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            match self.parked.pop() {
                Some(parked) => handle = parked,
                // SAFETY: `handle` and `prop` are valid for the call.
                None => check(
                    unsafe { sys::cuMemCreate(&mut handle, self.page as usize, &prop, 0) },
                    self.page,
                )?,
            }
            // SAFETY: `addr` lies in a range we reserved and is not mapped
            // (the allocator maps each page once); `handle` is a page.
            let code = unsafe { sys::cuMemMap(addr, self.page as usize, 0, handle, 0) };
            if let Err(e) = check(code, self.page) {
                // SAFETY: the handle is ours and mapped nowhere.
                unsafe { sys::cuMemRelease(handle) };
                return Err(e);
            }
            self.handles.insert(addr, handle);
            mapped += self.page;
        }
        let access = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `[at, at + bytes)` was just mapped; `access` outlives the call.
        check(
            unsafe { sys::cuMemSetAccess(at, bytes as usize, &access, 1) },
            bytes,
        )
    }

    fn unmap_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let mut done = 0;
        while done < bytes {
            let addr = at + done;
            // SAFETY: the page at `addr` was mapped by `map_pages` and no
            // live block uses it (the allocator unmaps only free pages).
            check(unsafe { sys::cuMemUnmap(addr, self.page as usize) }, 0)?;
            if let Some(handle) = self.handles.remove(&addr) {
                // SAFETY: the handle is no longer mapped anywhere.
                check(unsafe { sys::cuMemRelease(handle) }, 0)?;
            }
            done += self.page;
        }
        Ok(())
    }

    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let mut done = 0;
        while done < bytes {
            let addr = at + done;
            // SAFETY: the page was mapped by `map_pages`; no live block uses it.
            check(unsafe { sys::cuMemUnmap(addr, self.page as usize) }, 0)?;
            if let Some(handle) = self.handles.remove(&addr) {
                self.parked.push(handle);
            }
            done += self.page;
        }
        Ok(())
    }

    fn release_parked(&mut self) -> Result<(), DeviceError> {
        for handle in std::mem::take(&mut self.parked) {
            // SAFETY: a parked handle is mapped nowhere.
            check(unsafe { sys::cuMemRelease(handle) }, 0)?;
        }
        Ok(())
    }

    fn release_range(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        // SAFETY: the range was reserved by `reserve_range` and holds no mappings.
        check(unsafe { sys::cuMemAddressFree(at, bytes as usize) }, 0)
    }
}
