//! What the agent measures with CUDA itself (feature `cuda`): the memory a
//! bare CUDA context takes on each GPU, and the probe kernels. Without the
//! feature both report nothing and say so once.

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;
use vramfit::api::ProbeStatus;

use crate::gpu::{GpuMonitor, Reading};

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML spells a UUID.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

#[cfg(feature = "cuda")]
fn cuda_uuid(ctx: &cudarc::driver::CudaContext) -> Option<String> {
    let uuid = ctx.uuid().ok()?;
    Some(format_uuid(&uuid.bytes.map(|b| b as u8)))
}

/// What keeps the agent from using CUDA, in words for its log and its
/// status: `None` when the driver library loads. Checked before every path
/// into cudarc, which panics without it. (The probe kernels are PTX built
/// ahead of time: no NVRTC is needed.)
#[cfg(feature = "cuda")]
pub fn cuda_unavailable(what: &str) -> Option<String> {
    let error = crate::cuda::require_driver().err()?;
    let problem = format!("{what}: {error}");
    tracing::error!("{problem}; the agent reports Degraded");
    Some(problem)
}

/// Creates a bare context on each GPU and reads NVML's figure for this
/// process on it. The second value says why nothing was measured, when
/// CUDA cannot be loaded.
#[cfg(feature = "cuda")]
pub fn context_overhead(
    monitor: &GpuMonitor,
    reading: &Reading,
) -> (HashMap<String, u64>, Option<String>) {
    use cudarc::driver::CudaContext;
    let mut overhead = HashMap::new();
    if let Some(problem) = cuda_unavailable("CUDA context overhead not measured") {
        return (overhead, Some(problem));
    }
    let (Some(api), Ok(count)) = (monitor.api(), CudaContext::device_count()) else {
        tracing::warn!("no GPU through CUDA or no NVML: context overhead not measured");
        return (overhead, None);
    };
    let me = std::process::id();
    for ordinal in 0..count.max(0) as usize {
        let ctx = match CudaContext::new(ordinal) {
            Ok(ctx) => ctx,
            Err(e) => {
                tracing::warn!(ordinal, "cannot create a CUDA context: {e}");
                continue;
            }
        };
        let Some(uuid) = cuda_uuid(&ctx) else {
            continue;
        };
        let Some(gpu) = reading.gpus.iter().find(|g| g.uuid == uuid) else {
            continue;
        };
        // NVML lists a new context within a few hundred milliseconds.
        for _ in 0..30 {
            let used = api
                .sample(gpu.index)
                .ok()
                .and_then(|s| s.processes.into_iter().find(|p| p.pid == me))
                .map(|p| p.used_bytes)
                .unwrap_or(0);
            if used > 0 {
                tracing::info!(
                    gpu = gpu.index,
                    bytes = used,
                    "CUDA context overhead measured"
                );
                overhead.insert(uuid.clone(), used);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        drop(ctx);
    }
    (overhead, None)
}

/// Without CUDA the overhead is not measured.
#[cfg(not(feature = "cuda"))]
pub fn context_overhead(_: &GpuMonitor, _: &Reading) -> (HashMap<String, u64>, Option<String>) {
    tracing::warn!("built without the `cuda` feature: context overhead not measured");
    (HashMap::new(), None)
}

/// Runs the probe kernels on each GPU, writing at most `max_bytes`. The
/// second value says why no GPU was probed, when CUDA or NVRTC cannot be
/// loaded.
#[cfg(feature = "cuda")]
pub fn probe(reading: &Reading, max_bytes: u64) -> (HashMap<String, ProbeStatus>, Option<String>) {
    use crate::cuda::{ProbeOptions, run_probe};
    use cudarc::driver::CudaContext;
    let mut results = HashMap::new();
    if let Some(problem) = cuda_unavailable("GPUs not probed") {
        return (results, Some(problem));
    }
    let Ok(count) = CudaContext::device_count() else {
        tracing::warn!("no GPU through CUDA: GPUs not probed");
        return (results, None);
    };
    for ordinal in 0..count.max(0) as usize {
        let Some(uuid) = CudaContext::new(ordinal).ok().and_then(|c| cuda_uuid(&c)) else {
            continue;
        };
        if !reading.gpus.iter().any(|g| g.uuid == uuid) {
            continue;
        }
        let time = Timestamp::now().to_string();
        let status = match run_probe(ProbeOptions {
            device: ordinal,
            max_test_bytes: Some(max_bytes),
            copy_bytes: (max_bytes / 4).clamp(1 << 20, 1 << 30),
            ..Default::default()
        }) {
            Ok(result) => {
                tracing::info!(ordinal, ok = result.ok, "probe: {}", result.message);
                result.to_status(time)
            }
            Err(e) => {
                tracing::error!(ordinal, "probe failed: {e}");
                ProbeStatus {
                    ok: false,
                    time: Some(time),
                    message: Some(format!("probe failed: {e}")),
                    ..Default::default()
                }
            }
        };
        results.insert(uuid, status);
    }
    (results, None)
}

/// Without CUDA no probe runs.
#[cfg(not(feature = "cuda"))]
pub fn probe(_: &Reading, _: u64) -> (HashMap<String, ProbeStatus>, Option<String>) {
    tracing::warn!("built without the `cuda` feature: GPUs not probed");
    let _ = Timestamp::now();
    (HashMap::new(), None)
}

#[cfg(test)]
#[path = "setup_tests.rs"]
mod tests;
