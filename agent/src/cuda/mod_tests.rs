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

/// The backend (vmm's, as libvramfit_alloc.so's) makes its context current
/// for each call on a thread where it is not, and pages mapped there are
/// usable: the expandable policy's path, from a second thread.
#[test]
#[ignore = "needs GPU"]
fn the_backend_works_from_a_thread_where_its_context_is_not_current() {
    let ctx = CudaContext::new(0).unwrap();
    let backend = CudaDeviceMemory::new(ctx.clone()).unwrap();
    std::thread::spawn(move || {
        let mut allocator = new_allocator(Policy::Vramfit, backend, AllocatorConfig::default());
        let ptr = allocator.allocate(64 << 20, 0).unwrap();
        ctx.bind_to_thread().unwrap();
        // SAFETY: `ptr` is a live block of at least 512 bytes.
        unsafe { cudarc::driver::result::memset_d8_sync(ptr, 0xab, 512) }.unwrap();
        allocator.free(ptr).unwrap();
        allocator.empty_cache().unwrap();
        assert_eq!(allocator.stats().allocated_bytes.current, 0);
    })
    .join()
    .unwrap();
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
