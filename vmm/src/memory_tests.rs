use super::*;

/// CI and the development machine have no CUDA driver: the context is an
/// error that says so, not a panic inside cudarc's loader.
#[test]
fn without_the_driver_library_the_primary_context_is_an_error() {
    // SAFETY: this only tries to dlopen the library cudarc would load.
    if unsafe { sys::is_culib_present() } {
        eprintln!("skipped: this machine has the CUDA driver library");
        return;
    }
    let error = Context::primary(0).unwrap_err();
    assert!(error.contains("libcuda.so"), "{error}");
}

#[test]
fn driver_codes_name_the_call() {
    assert_eq!(code(cudaError_enum::CUDA_SUCCESS, "cuInit"), Ok(()));
    let error = code(cudaError_enum::CUDA_ERROR_NO_DEVICE, "cuDeviceGet").unwrap_err();
    assert!(error.starts_with("cuDeviceGet failed: "), "{error}");
}
