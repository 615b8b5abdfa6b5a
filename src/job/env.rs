//! The variables every attempt's process gets (docs/node-protocol.md), built
//! in one place for the controller's pods and `vramfit run --local`.

use super::backoff::BatchShape;
use super::budget::outside_allocator_bytes;
use super::exit::OOM_EXIT_CODE;
use crate::api::TrainingJobSpec;

/// The GPUs a container may see, by UUID (containerd's CDI injection and the
/// NVIDIA runtime read it).
pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Budget over the GPU's total memory, six decimals.
pub const MEMORY_FRACTION: &str = "VRAMFIT_MEMORY_FRACTION";
/// The hard budget per GPU in bytes: the whole process, as NVML measures it.
pub const BUDGET_BYTES: &str = "VRAMFIT_BUDGET_BYTES";
/// The part of the budget kept for memory outside the caching allocator.
pub const CONTEXT_BYTES: &str = "VRAMFIT_CONTEXT_BYTES";
/// The attempt's micro-batch.
pub const MICRO_BATCH: &str = "VRAMFIT_MICRO_BATCH";
/// The attempt's gradient accumulation.
pub const GRAD_ACCUM: &str = "VRAMFIT_GRAD_ACCUM";
/// The job's global batch (kept through every back-off).
pub const GLOBAL_BATCH: &str = "VRAMFIT_GLOBAL_BATCH";
/// The floor of the in-process back-off.
pub const MIN_MICRO_BATCH: &str = "VRAMFIT_MIN_MICRO_BATCH";
/// Attempt number, from 1.
pub const ATTEMPT: &str = "VRAMFIT_ATTEMPT";
/// The exit code that means "out of memory".
pub const OOM_EXIT_CODE_VAR: &str = "VRAMFIT_OOM_EXIT_CODE";
/// Where the process publishes its counters.
pub const STATS_DIR_VAR: &str = "VRAMFIT_STATS_DIR";
/// The pod's name (downward API in a pod; made up by `run --local`).
pub const POD_NAME: &str = "VRAMFIT_POD_NAME";
/// The pod's namespace (downward API).
pub const POD_NAMESPACE: &str = "VRAMFIT_POD_NAMESPACE";
/// The pod's UID (downward API).
pub const POD_UID: &str = "VRAMFIT_POD_UID";
/// Where the helper writes its OOM message (`run --local` only; a pod uses
/// `/dev/termination-log`).
pub const TERMINATION_LOG: &str = "VRAMFIT_TERMINATION_LOG";

/// `profile` in the pod that captures a job's allocation profile on a CPU
/// (`model.auto`): the helper captures the first steps and exits.
pub const PHASE: &str = "VRAMFIT_PHASE";
/// The value of [`PHASE`] in a profiling pod.
pub const PHASE_PROFILE: &str = "profile";

/// What an attempt's variables are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt<'a> {
    /// The attempt's batch shape.
    pub shape: BatchShape,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// Budget per GPU, bytes.
    pub budget_bytes: u64,
    /// The placed GPUs' model, when known: it sets the context reserve.
    pub gpu_model: Option<&'a str>,
    /// Budget over the GPU's memory; `None` without a GPU.
    pub memory_fraction: Option<f64>,
    /// UUIDs of the placed GPUs (empty without one).
    pub gpu_uuids: Vec<&'a str>,
    /// The stats folder as the process sees it.
    pub stats_dir: &'a str,
}

/// The variables of an attempt of `spec`, in a fixed order. The downward
/// API's and the run's own (pod name, termination log) are the caller's.
pub fn attempt_env(spec: &TrainingJobSpec, attempt: &Attempt) -> Vec<(&'static str, String)> {
    let mut env = Vec::with_capacity(12);
    if !attempt.gpu_uuids.is_empty() {
        env.push((VISIBLE_DEVICES, attempt.gpu_uuids.join(",")));
    }
    if let Some(fraction) = attempt.memory_fraction {
        env.push((MEMORY_FRACTION, format!("{fraction:.6}")));
    }
    env.extend([
        (BUDGET_BYTES, attempt.budget_bytes.to_string()),
        (
            CONTEXT_BYTES,
            outside_allocator_bytes(attempt.gpu_model, spec.gpus).to_string(),
        ),
        (MICRO_BATCH, attempt.shape.micro.to_string()),
        (GRAD_ACCUM, attempt.shape.accum.to_string()),
        (GLOBAL_BATCH, spec.batch.global.to_string()),
        (MIN_MICRO_BATCH, spec.batch.min_micro.to_string()),
        (ATTEMPT, attempt.attempt.to_string()),
        (OOM_EXIT_CODE_VAR, OOM_EXIT_CODE.to_string()),
        (STATS_DIR_VAR, attempt.stats_dir.to_string()),
    ]);
    env
}

/// Every variable vramfit sets on an attempt's process.
pub const SET_BY_VRAMFIT: [&str; 15] = [
    VISIBLE_DEVICES,
    PHASE,
    MEMORY_FRACTION,
    BUDGET_BYTES,
    CONTEXT_BYTES,
    MICRO_BATCH,
    GRAD_ACCUM,
    GLOBAL_BATCH,
    MIN_MICRO_BATCH,
    ATTEMPT,
    OOM_EXIT_CODE_VAR,
    STATS_DIR_VAR,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
];

/// True for a variable vramfit sets: a template's own value is dropped,
/// never trusted. The user's settings (`VRAMFIT_ALLOCATOR`) stay.
pub fn is_reserved(name: &str) -> bool {
    SET_BY_VRAMFIT.contains(&name)
}

#[cfg(test)]
#[path = "env_tests.rs"]
mod tests;
