//! OOMs a training process absorbed itself (`vramfit.Step` halved its
//! micro-batch inside the process): the controller records the new shape in the
//! job's status and starts the next job of the same model at it.

use crate::api::{AbsorbedOom, ObservedShape, TrainingJob, TrainingJobSpec, TrainingJobStatus};

use crate::job::backoff::BatchShape;
use crate::job::signature::{job_signature, model_signature};

/// What a process's reported shape changes in its job's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbsorbedUpdate {
    /// The shape the process runs with now.
    pub shape: BatchShape,
    /// The OOMs not recorded in status yet, oldest first.
    pub new: Vec<AbsorbedOom>,
}

/// Compares the shape a job's process reports with the job's status. `None`
/// when nothing new was absorbed, or when the report cannot be the job's (a
/// shape that does not make up the global batch, or a larger micro-batch).
pub fn newly_absorbed(
    spec: &TrainingJobSpec,
    status: &TrainingJobStatus,
    observed: &ObservedShape,
) -> Option<AbsorbedUpdate> {
    let new: Vec<AbsorbedOom> = observed
        .absorbed_ooms
        .iter()
        .filter(|oom| !status.absorbed_ooms.contains(oom))
        .cloned()
        .collect();
    if new.is_empty() {
        return None;
    }
    let shape = BatchShape::for_micro(spec.batch.global, observed.micro_batch, spec.gpus)?;
    let current = status.micro_batch.unwrap_or(spec.batch.micro);
    (shape.accum == observed.grad_accum && shape.micro < current)
        .then_some(AbsorbedUpdate { shape, new })
}

/// The event text of one absorbed OOM.
pub fn absorbed_message(oom: &AbsorbedOom) -> String {
    format!(
        "OOM absorbed in-process: micro {} -> {}, accumulation {} -> {}",
        oom.from_micro, oom.to_micro, oom.from_accum, oom.to_accum
    )
}

/// What other jobs of the same model learn from a job whose process absorbed
/// OOMs: its signature at its starting micro-batch, the smallest micro-batch it
/// backed off to, and its name. `None` for a job that absorbed none.
pub fn absorbed_lesson(job: &TrainingJob) -> Option<(String, u32, String)> {
    // Jobs without absorbed OOMs are passed over before their signature is
    // computed: the signature costs a serialisation.
    let smallest = job
        .status
        .as_ref()?
        .absorbed_ooms
        .iter()
        .map(|o| o.to_micro)
        .min()?;
    Some((
        job_signature(job, job.spec.batch.micro),
        smallest,
        job.metadata.name.clone().unwrap_or_default(),
    ))
}

/// The micro-batch a new job should start at, learned from other jobs of the
/// same model (the same signature at their starting micro-batch) whose
/// processes absorbed OOMs: the smallest micro-batch they backed off to, when
/// it is valid for this job's global batch and floor. Returns it with the name
/// of the job it was learned from.
pub fn learned_start_micro<'a>(
    namespace: &str,
    spec: &TrainingJobSpec,
    jobs: impl IntoIterator<Item = &'a TrainingJob>,
) -> Option<(u32, String)> {
    let signature = model_signature(namespace, spec, spec.batch.micro);
    let learned = jobs
        .into_iter()
        .filter_map(absorbed_lesson)
        .filter(|(s, _, _)| *s == signature)
        .map(|(_, micro, from)| (micro, from))
        .min()?;
    start_micro_below(spec, learned)
}

/// The largest micro-batch valid for `spec` (its global batch, GPUs and floor)
/// that is not above the `learned` one and below the spec's own, with the job
/// it was learned from.
pub fn start_micro_below(spec: &TrainingJobSpec, learned: (u32, String)) -> Option<(u32, String)> {
    let (micro, from) = learned;
    (spec.batch.min_micro.max(1)..=micro.min(spec.batch.micro.saturating_sub(1)))
        .rev()
        .find(|m| BatchShape::for_micro(spec.batch.global, *m, spec.gpus).is_some())
        .map(|m| (m, from))
}

#[cfg(test)]
#[path = "absorbed_tests.rs"]
mod tests;
