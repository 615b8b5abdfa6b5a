//! The staging buffer of PyTorch's CUDA reduction kernel.
//!
//! A gradient summed over the tokens to a vector (a Linear's bias, the
//! weight of a norm written in Python such as Hugging Face's RMSNorm) is a
//! column sum: `outputs` contiguous columns, `inputs` rows. ATen's reduction
//! kernel (`Reduce.cuh`, `setReduceConfig`) splits the rows across thread
//! blocks when each output has many of them and there are too few outputs to
//! fill the GPU; the blocks then write their partial sums to a buffer it
//! takes from the caching allocator for the kernel and gives back right
//! after, with a small one of semaphores. The buffer is large: 32 MiB for a
//! 1024-wide norm weight over 4096 tokens on an H200, 132 MiB for a 2048-wide
//! bias over 12,608 tokens (both measured, data/calibration/h200-origins).
//!
//! The launch configuration depends on the GPU's multiprocessor count and
//! threads per multiprocessor, so the size does too.

/// Threads per block of the reduction kernel (all but complex double).
const MAX_THREADS: u64 = 512;
/// Threads of a warp.
const WARP: u64 = 32;
/// Values each thread keeps at least when the rows go across blocks.
const MIN_VALUES_PER_THREAD: u64 = 16;
/// From this many values per thread the rows go across blocks.
const MAX_VALUES_PER_THREAD: u64 = 256;

/// The device figures the launch configuration reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceDevice {
    /// Multiprocessors.
    pub sms: u64,
    /// Resident threads per multiprocessor.
    pub threads_per_sm: u64,
}

/// The buffers one column sum takes from the caching allocator, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staging {
    /// The partial sums of the blocks.
    pub buffer: u64,
    /// One counter per block column.
    pub semaphores: u64,
}

/// floor(log2(n)) as a power of two, at least 1.
fn last_pow2(n: u64) -> u64 {
    if n <= 1 {
        1
    } else {
        1 << (63 - n.leading_zeros())
    }
}

/// The staging of summing `inputs` rows of `outputs` contiguous columns,
/// accumulating in `acc_bytes`-wide values (4: float, for fp32, bf16 and
/// fp16 alike); `None` when the kernel needs no buffer (few rows per output,
/// or enough outputs to fill the GPU).
pub fn column_sum_staging(
    outputs: u64,
    inputs: u64,
    acc_bytes: u64,
    device: ReduceDevice,
) -> Option<Staging> {
    if outputs == 0 {
        return None;
    }
    // Each thread loads a vector of up to 4 neighbouring outputs.
    let mut vec = 4;
    while !outputs.is_multiple_of(vec) {
        vec /= 2;
    }
    let max_threads = MAX_THREADS / vec;
    let dim0 = outputs / vec;
    // The largest power of two up to the size, at most the threads.
    let pow2 = |d: u64| last_pow2(d).min(max_threads);
    let (dim0_pow2, dim1_pow2) = (pow2(dim0), pow2(inputs));
    let mut width = dim0_pow2.min(WARP);
    let height = dim1_pow2.min(max_threads / width);
    width = dim0_pow2.min(max_threads / height);
    // Lanes take different outputs and the warps split the rows. (ATen
    // gives fewer than 256 rows to the warps as outputs instead; a thread
    // then sums fewer than 256 values either way, and no buffer is needed.)
    let values_per_thread = inputs.div_ceil(height);
    let target_grid = device.sms * (device.threads_per_sm / (width * height));
    let grid = dim0.div_ceil(width);
    if values_per_thread < MAX_VALUES_PER_THREAD || grid > target_grid {
        return None;
    }
    let ctas = target_grid
        .div_ceil(grid)
        .min(values_per_thread.div_ceil(MIN_VALUES_PER_THREAD))
        .max(values_per_thread.div_ceil(MAX_VALUES_PER_THREAD));
    (ctas > 1).then(|| Staging {
        buffer: acc_bytes * outputs * ctas * width * vec,
        semaphores: 4 * grid,
    })
}

#[cfg(test)]
#[path = "reduce_tests.rs"]
mod tests;
