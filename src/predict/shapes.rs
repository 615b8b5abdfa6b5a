//! Every batch shape a job may run at (`vramfit predict --shapes`): each
//! micro-batch the back-off or elastic placement could choose, with its
//! predicted peak, its budget and its step time relative to the job's own
//! micro-batch. The global batch, and so the training maths, is the same in
//! every row: a smaller micro-batch takes more accumulation steps.

use serde::Serialize;

use super::job::{JobInput, predict_job_at};
use super::step_time::StepTimeCurve;
use super::{GpuProfile, PredictError};

/// One shape.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShapeRow {
    /// Micro-batch per GPU.
    pub micro_batch: u32,
    /// Accumulation steps that keep the global batch.
    pub grad_accum: u32,
    /// Predicted peak of one process.
    pub predicted_bytes: u64,
    /// The predicted peak plus the job's headroom: what the job reserves.
    pub budget_bytes: u64,
    /// Whether the budget fits the GPU's memory.
    pub fits_gpu: bool,
    /// Seconds per optimizer step over those at the job's micro-batch
    /// (1.0 there; above 1 is slower).
    pub relative_step_time: f64,
}

/// The micro-batches of `job`: divisors of the per-GPU batch from
/// `batch.minMicro` up, ascending.
pub fn micro_batches(job: &JobInput) -> Vec<u32> {
    let gpus = job.gpus.max(1);
    if !job.batch.global.is_multiple_of(gpus) {
        return Vec::new();
    }
    let per_gpu = job.batch.global / gpus;
    (job.batch.min_micro.max(1)..=per_gpu)
        .filter(|m| per_gpu.is_multiple_of(*m))
        .collect()
}

/// Every shape of `job` on `gpu`, step times from `curve` relative to the
/// job's `batch.micro`. A shape the predictor cannot answer fails the
/// whole table (the error names it).
pub fn shapes(
    job: &JobInput,
    gpu: &'static GpuProfile,
    profile_text: Option<&str>,
    curve: &StepTimeCurve,
) -> Result<Vec<ShapeRow>, PredictError> {
    let micros = micro_batches(job);
    if micros.is_empty() {
        return Err(PredictError::Invalid(format!(
            "batch.global {} is not divisible by gpus {}",
            job.batch.global, job.gpus
        )));
    }
    let per_gpu = job.batch.global / job.gpus.max(1);
    micros
        .into_iter()
        .map(|micro| {
            let p = predict_job_at(job, micro, gpu, profile_text)?;
            let budget = (p.peak_bytes as f64 * (1.0 + job.headroom())).ceil() as u64;
            Ok(ShapeRow {
                micro_batch: micro,
                grad_accum: per_gpu / micro,
                predicted_bytes: p.peak_bytes,
                budget_bytes: budget,
                fits_gpu: budget <= gpu.capacity_bytes,
                relative_step_time: curve.relative(micro, job.batch.micro),
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "shapes_tests.rs"]
mod tests;
