//! CUDA virtual memory management under vramfit's allocator: reserved
//! address ranges (`cuMemAddressReserve`) backed by physical pages
//! (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`), one handle per page so
//! that any page can be given back on its own, and pages parked between an
//! unmap and the next map (`cuMemUnmap` without `cuMemRelease`).
//!
//! [`VmmMemory`] is the one `vramfit_alloc_core::DeviceMemory` backend over
//! them (with `cuMemAlloc` segments), every call inside the device's
//! [`Context`]; both users, `libvramfit_alloc.so` inside PyTorch and the
//! agent's allocator benchmark, wrap it (the first adds the fences that tell
//! when a freed page is behind the device). [`Pages`] makes no context
//! current and neither waits for the device: whether queued kernels may
//! still use a page being unmapped is the caller's business.

mod memory;

pub use memory::{Context, CtxGuard, VmmMemory};

use std::collections::HashMap;

use cudarc::driver::sys::{self, CUresult, cudaError_enum};
use vramfit_alloc_core::{DeviceError, DevicePtr, PAGE_BYTES};

/// A driver result as the allocator's error: out of memory (for `bytes`)
/// or a driver failure naming `call`.
pub fn check(result: CUresult, bytes: u64, call: &str) -> Result<(), DeviceError> {
    match result {
        cudaError_enum::CUDA_SUCCESS => Ok(()),
        cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory { bytes }),
        other => Err(DeviceError::Driver(format!("{call}: {other:?}"))),
    }
}

/// The physical pages of one device.
pub struct Pages {
    ordinal: i32,
    page: u64,
    handles: HashMap<DevicePtr, sys::CUmemGenericAllocationHandle>,
    parked: Vec<sys::CUmemGenericAllocationHandle>,
}

// SAFETY: the handles are plain driver handles, usable from any thread; the
// owner serialises access (`&mut self`).
unsafe impl Send for Pages {}

impl Pages {
    /// Pages of device `ordinal`: [`PAGE_BYTES`] rounded up to the device's
    /// allocation granularity. The device's context must be current.
    pub fn new(ordinal: i32) -> Self {
        let mut pages = Self {
            ordinal,
            page: PAGE_BYTES,
            handles: HashMap::new(),
            parked: Vec::new(),
        };
        let mut granularity = 0usize;
        let prop = pages.prop();
        // SAFETY: valid pointers for the call's duration.
        let result = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        if result == cudaError_enum::CUDA_SUCCESS && granularity > 0 {
            pages.page = PAGE_BYTES.div_ceil(granularity as u64) * granularity as u64;
        }
        pages
    }

    /// Bytes of one page.
    pub fn page_bytes(&self) -> u64 {
        self.page
    }

    /// Pages mapped now (parked ones excluded).
    pub fn mapped(&self) -> usize {
        self.handles.len()
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal,
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

    /// Reserves `bytes` of virtual addresses, aligned to a page.
    pub fn reserve(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: reserving addresses touches no memory; valid out-parameter.
        check(
            unsafe { sys::cuMemAddressReserve(&mut ptr, bytes as usize, self.page as usize, 0, 0) },
            bytes,
            "cuMemAddressReserve",
        )?;
        Ok(ptr)
    }

    /// Gives a reserved range back (its pages must be unmapped).
    pub fn free_range(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        // SAFETY: the range was reserved by `reserve` and holds no mappings.
        check(
            unsafe { sys::cuMemAddressFree(at, bytes as usize) },
            0,
            "cuMemAddressFree",
        )
    }

    /// Backs `[at, at + bytes)` (page-aligned, in a reserved range, not
    /// mapped) with pages, parked ones first, and makes it readable and
    /// writable by the device. On failure nothing of the run stays mapped.
    pub fn map(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let prop = self.prop();
        let mut mapped = 0;
        while mapped < bytes {
            let addr = at + mapped;
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            let created = match self.parked.pop() {
                Some(parked) => {
                    handle = parked;
                    Ok(())
                }
                // SAFETY: valid out-parameter and properties.
                None => check(
                    unsafe { sys::cuMemCreate(&mut handle, self.page as usize, &prop, 0) },
                    self.page,
                    "cuMemCreate",
                ),
            };
            let result = created.and_then(|()| {
                // SAFETY: `addr` is a page of a reserved range that is not mapped.
                let code = unsafe { sys::cuMemMap(addr, self.page as usize, 0, handle, 0) };
                check(code, self.page, "cuMemMap").inspect_err(|_| {
                    // SAFETY: the handle is ours and mapped nowhere.
                    unsafe { sys::cuMemRelease(handle) };
                })
            });
            if let Err(e) = result {
                if mapped > 0 {
                    let _ = self.unmap(at, mapped, false);
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
        // SAFETY: `[at, at + bytes)` was just mapped; `access` outlives the call.
        let result = check(
            unsafe { sys::cuMemSetAccess(at, bytes as usize, &access, 1) },
            bytes,
            "cuMemSetAccess",
        );
        if result.is_err() {
            let _ = self.unmap(at, bytes, false);
        }
        result
    }

    /// Unmaps `[at, at + bytes)`; with `park`, keeps the physical pages for
    /// the next [`Pages::map`], else gives them back to the device. No
    /// kernel may use the range any more (the caller waits if need be).
    pub fn unmap(&mut self, at: DevicePtr, bytes: u64, park: bool) -> Result<(), DeviceError> {
        let mut done = 0;
        while done < bytes {
            let addr = at + done;
            // SAFETY: the page was mapped by `map`; nothing uses it.
            check(
                unsafe { sys::cuMemUnmap(addr, self.page as usize) },
                0,
                "cuMemUnmap",
            )?;
            if let Some(handle) = self.handles.remove(&addr) {
                if park {
                    self.parked.push(handle);
                } else {
                    // SAFETY: the handle is mapped nowhere now.
                    check(unsafe { sys::cuMemRelease(handle) }, 0, "cuMemRelease")?;
                }
            }
            done += self.page;
        }
        Ok(())
    }

    /// Whether parked pages wait for [`Pages::release_parked`].
    pub fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// Gives back the parked pages the last map did not use.
    pub fn release_parked(&mut self) -> Result<(), DeviceError> {
        for handle in std::mem::take(&mut self.parked) {
            // SAFETY: a parked handle is mapped nowhere.
            check(unsafe { sys::cuMemRelease(handle) }, 0, "cuMemRelease")?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
