//! Probe kernels: fill the free memory with a pattern, read it back, and time
//! device-to-device copies.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg, result};
use cudarc::nvrtc::Ptx;

use super::{driver, require_driver};
use crate::Result;
use crate::probe::{ProbeResult, expected_bandwidth_gbps, judge};

/// The probe kernels as PTX, compiled ahead of time from
/// `probe_kernels.cu` by `hack/gpu-tests.sh ptx` (nvcc, compute_75): the
/// driver compiles it for the GPU it runs on, so the agent needs no NVRTC
/// (which its image does not carry). The pattern is a hash of the word's
/// index and a seed, so a stuck bit, an address-line fault or a stale page
/// all show up as mismatches.
pub const PTX: &str = include_str!("probe_kernels.ptx");

/// How hard to probe.
#[derive(Debug, Clone, Copy)]
pub struct ProbeOptions {
    /// Device ordinal.
    pub device: usize,
    /// Bytes left free for other processes and the driver.
    pub safety_margin_bytes: u64,
    /// Upper bound on the bytes tested (`None`: all free memory but the margin).
    pub max_test_bytes: Option<u64>,
    /// Bytes of each buffer of the copy test.
    pub copy_bytes: u64,
    /// Timed copies (the median is reported).
    pub copy_repeats: usize,
    /// Expected copy bandwidth; `None`: from the model name.
    pub expected_gbps: Option<f64>,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            device: 0,
            safety_margin_bytes: 2 << 30,
            max_test_bytes: None,
            copy_bytes: 1 << 30,
            copy_repeats: 20,
            expected_gbps: None,
        }
    }
}

/// Chunks of device memory owned by the probe, freed on drop.
struct Chunks(Vec<(u64, u64)>);

impl Drop for Chunks {
    fn drop(&mut self) {
        for &(ptr, _) in &self.0 {
            // SAFETY: each chunk came from `malloc_sync` and is freed once;
            // all work on it was synchronized before the probe returned.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }
}

/// Takes up to `want` bytes in chunks of at most 1 GiB, stopping at the
/// first refusal, so that fragmentation of the free memory does not fail
/// the probe.
fn grab(want: u64) -> Chunks {
    const CHUNK: u64 = 1 << 30;
    let mut chunks = Vec::new();
    let mut got = 0;
    while got < want {
        let bytes = (want - got).min(CHUNK) & !3;
        if bytes == 0 {
            break;
        }
        // SAFETY: a context is current; the chunk is freed by `Chunks::drop`.
        match unsafe { result::malloc_sync(bytes as usize) } {
            Ok(ptr) => {
                chunks.push((ptr, bytes));
                got += bytes;
            }
            Err(_) => break,
        }
    }
    Chunks(chunks)
}

fn launch_over(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    ptr: u64,
    words: u64,
    seed: u32,
    errors: Option<&cudarc::driver::CudaSlice<u64>>,
) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: (132 * 8, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut builder = stream.launch_builder(f);
    builder.arg(&ptr).arg(&words).arg(&seed);
    if let Some(errors) = errors {
        builder.arg(errors);
    }
    // SAFETY: the arguments match the kernel's signature (pointer, count,
    // seed[, error counter]) and `ptr` holds `words` 32-bit words.
    unsafe { builder.launch(cfg) }.map_err(driver("cuLaunchKernel"))?;
    Ok(())
}

/// Runs the probe on one GPU.
pub fn run_probe(options: ProbeOptions) -> Result<ProbeResult> {
    require_driver()?;
    let started = Instant::now();
    let ctx = CudaContext::new(options.device).map_err(driver("cuCtxCreate"))?;
    let stream = ctx.default_stream();
    let gpu_name = ctx.name().map_err(driver("cuDeviceGetName"))?;
    let (free, total) = result::mem_get_info().map_err(driver("cuMemGetInfo"))?;
    let (free, total) = (free as u64, total as u64);

    let module = ctx
        .load_module(Ptx::from_src(PTX))
        .map_err(driver("cuModuleLoadData"))?;
    let fill = module
        .load_function("fill_pattern")
        .map_err(driver("cuModuleGetFunction"))?;
    let check = module
        .load_function("check_pattern")
        .map_err(driver("cuModuleGetFunction"))?;

    // Copy bandwidth first, on two buffers, before the fill takes the rest.
    // Each buffer is taken on its own: one `grab` of twice the size may come
    // back as a single chunk, which leaves nothing to copy into.
    let bandwidth_gbps = {
        let (src, dst) = (grab(options.copy_bytes), grab(options.copy_bytes));
        let buffers: Vec<(u64, u64)> = src
            .0
            .first()
            .into_iter()
            .chain(dst.0.first())
            .copied()
            .collect();
        measure_copy(&ctx, &stream, &buffers, options.copy_repeats)?
    };

    let want = free
        .saturating_sub(options.safety_margin_bytes)
        .min(options.max_test_bytes.unwrap_or(u64::MAX));
    let chunks = grab(want);
    let errors_dev = stream.alloc_zeros::<u64>(1).map_err(driver("cuMemAlloc"))?;
    let seed = 0x5eed_1234u32;
    for &(ptr, bytes) in &chunks.0 {
        launch_over(&stream, &fill, ptr, bytes / 4, seed, None)?;
    }
    for &(ptr, bytes) in &chunks.0 {
        launch_over(&stream, &check, ptr, bytes / 4, seed, Some(&errors_dev))?;
    }
    let errors = stream
        .clone_dtoh(&errors_dev)
        .map_err(driver("cuMemcpyDtoH"))?[0];
    let tested_bytes = chunks.0.iter().map(|c| c.1).sum();
    drop(chunks);

    let expected = options
        .expected_gbps
        .or_else(|| expected_bandwidth_gbps(&gpu_name))
        .unwrap_or(0.0);
    Ok(judge(ProbeResult {
        ok: false,
        gpu_name,
        bandwidth_gbps,
        expected_bandwidth_gbps: expected,
        tested_bytes,
        free_bytes_before: free,
        total_bytes: total,
        errors,
        duration_ms: started.elapsed().as_secs_f64() * 1e3,
        message: String::new(),
    }))
}

/// Median device-to-device copy rate between the first two buffers,
/// counting bytes read plus bytes written.
fn measure_copy(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    buffers: &[(u64, u64)],
    repeats: usize,
) -> Result<f64> {
    let [(src, a), (dst, b), ..] = buffers else {
        return Ok(0.0);
    };
    let bytes = (*a).min(*b);
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx.new_event(flags).map_err(driver("cuEventCreate"))?;
    let end = ctx.new_event(flags).map_err(driver("cuEventCreate"))?;
    let mut rates = Vec::new();
    for round in 0..repeats + 2 {
        start.record(stream).map_err(driver("cuEventRecord"))?;
        // SAFETY: both buffers are live device allocations of at least `bytes`.
        unsafe { result::memcpy_dtod_async(*dst, *src, bytes as usize, stream.cu_stream()) }
            .map_err(driver("cuMemcpyDtoDAsync"))?;
        end.record(stream).map_err(driver("cuEventRecord"))?;
        end.synchronize().map_err(driver("cuEventSynchronize"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(driver("cuEventElapsedTime"))? as f64;
        // The first two copies warm up clocks and TLBs.
        if round >= 2 && ms > 0.0 {
            rates.push(2.0 * bytes as f64 / (ms * 1e-3) / 1e9);
        }
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates.get(rates.len() / 2).copied().unwrap_or(0.0))
}
