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

/// Fails with [`AgentError::MissingLibrary`] unless NVRTC (`libnvrtc.so`,
/// which compiles the probe kernels) can be loaded.
pub fn require_nvrtc() -> Result<(), AgentError> {
    // SAFETY: as in `require_driver`.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(AgentError::MissingLibrary {
            library: "NVRTC (libnvrtc.so), which compiles the probe kernels",
            hint: "the CUDA toolkit or the nvidia-cuda-nvrtc wheel provides it; add its folder to LD_LIBRARY_PATH",
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
mod tests {
    use cudarc::driver::CudaContext;
    use vramfit::alloc::{AllocatorConfig, Policy, new_allocator};

    use super::*;

    #[test]
    #[ignore = "needs GPU"]
    fn both_policies_allocate_and_free_real_device_memory() {
        let ctx = CudaContext::new(0).unwrap();
        for policy in [Policy::Pytorch, Policy::Vramfit] {
            let backend = CudaDeviceMemory::new(ctx.clone()).unwrap();
            let mut allocator = new_allocator(policy, backend, AllocatorConfig::default());
            let ptrs: Vec<_> = [512u64, 3 << 20, 64 << 20]
                .into_iter()
                .map(|bytes| allocator.allocate(bytes, 0).unwrap())
                .collect();
            for &ptr in &ptrs {
                // SAFETY: `ptr` is a live block of at least 512 bytes.
                unsafe { cudarc::driver::result::memset_d8_sync(ptr, 0xab, 512) }.unwrap();
            }
            for ptr in ptrs {
                allocator.free(ptr).unwrap();
            }
            allocator.empty_cache().unwrap();
            assert_eq!(allocator.stats().allocated_bytes.current, 0, "{policy}");
        }
    }

    #[test]
    #[ignore = "needs GPU"]
    fn probe_finds_a_healthy_gpu() {
        let result = run_probe(ProbeOptions {
            max_test_bytes: Some(4 << 30),
            copy_repeats: 5,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(result.errors, 0);
        assert!(result.bandwidth_gbps > 0.0);
        assert!(result.tested_bytes >= 1 << 30);
    }

    /// The agent's start-up probe tests at most a few GiB, so its copy
    /// buffers are smaller than the 1 GiB chunks the probe allocates in:
    /// the bandwidth must still be measured.
    #[test]
    #[ignore = "needs GPU"]
    fn probe_measures_bandwidth_with_small_copy_buffers() {
        let result = run_probe(ProbeOptions {
            max_test_bytes: Some(2 << 30),
            copy_bytes: 512 << 20,
            copy_repeats: 5,
            ..Default::default()
        })
        .unwrap();
        assert!(result.bandwidth_gbps > 0.0, "{}", result.message);
        assert!(result.ok, "{}", result.message);
    }
}
