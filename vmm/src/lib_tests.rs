use super::*;

#[test]
fn driver_results_become_allocator_errors() {
    assert_eq!(check(cudaError_enum::CUDA_SUCCESS, 7, "x"), Ok(()));
    assert_eq!(
        check(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY, 7, "cuMemCreate"),
        Err(DeviceError::OutOfMemory { bytes: 7 })
    );
    let Err(DeviceError::Driver(text)) =
        check(cudaError_enum::CUDA_ERROR_INVALID_VALUE, 7, "cuMemMap")
    else {
        panic!("a driver error")
    };
    assert!(text.starts_with("cuMemMap: "), "{text}");
}
