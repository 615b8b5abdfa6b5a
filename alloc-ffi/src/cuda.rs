//! The CUDA driver under the allocator: segments, virtual ranges and pages
//! through [`VmmMemory`] (shared with the agent; every call inside the
//! device's primary context, pushed when it is not already current, since
//! PyTorch calls the allocator on whatever thread allocates or frees, with
//! whatever context is current there), and events for blocks used on several
//! streams and for unmapping pages in stream order ([`crate::fences`]).

use cudarc::driver::sys::{self, CUresult, cudaError_enum};
use std::time::Instant;

use vramfit_alloc_core::{DeviceError, DeviceMemory, DevicePtr, MemInfo, StreamId};
pub use vramfit_vmm::Context;
use vramfit_vmm::VmmMemory;

use crate::fences::{FENCE_INTERVAL, FreeFences, QUIET_AFTER};
use crate::state::StreamEvents;

fn code(result: CUresult, call: &str) -> Result<(), String> {
    if result == cudaError_enum::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {result:?}"))
    }
}

/// [`VmmMemory`] with the fences a page needs before it is unmapped.
///
/// A page freed by PyTorch may still be read or written by kernels queued
/// before the free (PyTorch frees when the host drops the tensor; reuse is
/// stream-ordered, `cuMemUnmap` is not). The policy unmaps only pages whose
/// last free the device has passed, which [`FreeFences`] tells from events
/// recorded on the freeing streams, or waits for the device first
/// (`wait_frees`: `cuCtxSynchronize`) when a limit needs the others.
pub struct CudaMemory {
    memory: VmmMemory,
    fences: FreeFences<CudaEvents>,
}

// SAFETY: the context is a plain driver handle; the allocator state that
// owns this is behind a mutex.
unsafe impl Send for CudaMemory {}

impl CudaMemory {
    /// The backend of the device behind `ctx`.
    pub fn new(ctx: Context) -> Self {
        let fences = FreeFences::new(
            CudaEvents::new(ctx),
            FENCE_INTERVAL,
            QUIET_AFTER,
            Instant::now(),
        );
        Self {
            memory: VmmMemory::new(ctx),
            fences,
        }
    }
}

impl DeviceMemory for CudaMemory {
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

    // The policy unmaps only pages the device has passed (`frees_done`) or
    // waits first (`wait_frees`).
    fn unmap_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.memory.unmap_pages(at, bytes)
    }

    fn park_pages(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.memory.park_pages(at, bytes)
    }

    fn note_free(&mut self, stream: StreamId, seq: u64) {
        self.fences.note(stream, seq, Instant::now());
    }

    fn frees_done(&mut self, stream: StreamId) -> u64 {
        self.fences.done(stream, Instant::now())
    }

    fn wait_frees(&mut self) -> Result<(), DeviceError> {
        self.memory.synchronize()?;
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
        self.memory.release_parked()
    }

    fn release_range(&mut self, at: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.memory.release_range(at, bytes)
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
