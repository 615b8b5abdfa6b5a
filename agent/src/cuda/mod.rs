//! Everything that talks to the GPU through cudarc (feature `cuda`).

mod backend;
mod probe;
mod raw;

pub use backend::CudaDeviceMemory;
pub use probe::{ProbeOptions, run_probe};
pub use raw::RawCudaMalloc;

use cudarc::driver::DriverError;

use crate::AgentError;

/// Fails with [`AgentError::MissingLibrary`] unless the CUDA driver library
/// (`libcuda.so`) can be loaded. cudarc loads it on its first call and panics
/// when it cannot, so every path into cudarc checks this first.
pub fn require_driver() -> Result<(), AgentError> {
    // SAFETY: this only tries to dlopen the library cudarc itself would load.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(AgentError::MissingLibrary {
            library: "the CUDA driver library libcuda.so",
            hint: "the NVIDIA driver provides it (in a pod: the NVIDIA runtime with NVIDIA_DRIVER_CAPABILITIES=compute)",
        })
    }
}

/// Wraps a driver error with the call that produced it.
pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> AgentError {
    move |e| AgentError::Cuda {
        call,
        detail: e.to_string(),
    }
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
