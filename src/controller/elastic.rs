//! Memory-elastic placement in the controller (`spec.batch.elastic`): which
//! jobs are elastic, the smaller shapes their prediction adds to the status
//! for the scheduling cycle, the micro-batch a new attempt starts from, and
//! the words of the `ElasticShape` event. The choice itself is
//! [`crate::place::elastic`]; the cycle asks it in `scheduler`.

use crate::api::{GpuModelBudget, ShapeBudget, TrainingJob, TrainingJobSpec, TrainingJobStatus};
use crate::job::backoff::BatchShape;
use crate::job::budget::{attempt_budget, attempt_budget_on, job_input};
use crate::job::signature::job_signature;
use crate::predict::shapes::micro_batches;
use crate::quantity::human_bytes;

/// True when the job is placed elastically: its own `spec.batch.elastic`,
/// else the controller's default.
pub fn is_elastic(spec: &TrainingJobSpec, cluster_default: bool) -> bool {
    spec.batch.elastic.unwrap_or(cluster_default)
}

/// The micro-batch a new attempt `attempt` starts from instead of
/// `status.microBatch`: the one the previous attempt preferred, when elastic
/// placement ran that attempt smaller and it did not end out of memory (after
/// an OOM the back-off halves the shape that ran, which `microBatch` holds).
pub fn restart_micro(status: &TrainingJobStatus, attempt: u32, oom_outcome: &str) -> Option<u32> {
    let preferred = status.preferred_micro_batch?;
    let previous = status.history.last()?;
    (previous.attempt + 1 == attempt && previous.outcome != oom_outcome).then_some(preferred)
}

/// What the smaller shapes of an attempt are predicted from.
pub struct ShapeFacts<'a> {
    /// The attempt's micro-batch on the default GPU profile.
    pub micro: u32,
    /// The attempt's budget there.
    pub budget: u64,
    /// Its budgets per GPU model (each with its own micro-batch).
    pub per_model: &'a [GpuModelBudget],
    /// The job's OOMs so far: each raises a predicted budget, as it raised
    /// the attempt's own.
    pub ooms: u32,
    /// The cluster's GPU models with the largest capacity of each.
    pub gpu_models: &'a [(String, u64)],
    /// The profile ConfigMap's content for profile-based jobs.
    pub profile: Option<&'a str>,
    /// The highest peak measured for a model signature.
    pub measured: &'a dyn Fn(&str) -> Option<u64>,
}

/// Every valid micro-batch below the attempt's (divisors of the per-GPU
/// batch from `batch.minMicro` up) with its budget, predicted as the
/// attempt's budget is (each GPU model of `per_model` below that model's
/// micro-batch; without any, the default GPU profile), and its step time relative to
/// the attempt's micro-batch. Shapes whose budget is not below the
/// attempt's (a `memory.request`) or that the predictor cannot answer are
/// left out.
pub fn smaller_shapes(job: &TrainingJob, facts: &ShapeFacts) -> Vec<ShapeBudget> {
    let spec = &job.spec;
    let micros = micro_batches(&job_input(job));
    let mut out = Vec::new();
    let mut add = |model: Option<&str>, preferred: u32, preferred_budget: u64| {
        let (curve, _) = crate::sim::kinds::curve_for(&spec.model, preferred);
        for &micro in micros.iter().filter(|&&m| m < preferred) {
            let Some(shape) = BatchShape::for_micro(spec.batch.global, micro, spec.gpus) else {
                continue;
            };
            let measured = (facts.measured)(&job_signature(job, micro));
            let predicted = match model.and_then(crate::predict::gpu_profile) {
                Some(gpu) => attempt_budget_on(job, micro, facts.profile, measured, gpu),
                None if model.is_some() => continue,
                None => attempt_budget(job, micro, facts.profile, measured),
            };
            let capacity = match model {
                Some(model) => facts
                    .gpu_models
                    .iter()
                    .find(|(m, _)| m == model)
                    .map(|(_, c)| *c),
                None => facts.gpu_models.iter().map(|(_, c)| *c).max(),
            };
            let Ok(budget) = predicted.map(|b| b.after_ooms(facts.ooms, spec.headroom(), capacity))
            else {
                continue;
            };
            if budget.budget >= preferred_budget {
                continue;
            }
            out.push(ShapeBudget {
                gpu_model: model.map(str::to_string),
                micro_batch: shape.micro,
                grad_accum: shape.accum,
                predicted_bytes: budget.predicted,
                budget_bytes: budget.budget,
                relative_step_time: curve.relative(micro, preferred),
            });
        }
    };
    // The cycle places on the default profile's budget only when there are
    // no budgets per GPU model.
    if facts.per_model.is_empty() {
        add(None, facts.micro, facts.budget);
    }
    for b in facts.per_model {
        add(Some(&b.gpu_model), b.micro_batch, b.budget_bytes);
    }
    out
}

/// The expected wait, in words: `expected wait 9 min`, or `no expected
/// end` when no running job's expected end would make room.
pub fn wait_words(seconds: Option<f64>) -> String {
    match seconds {
        None => "no expected end".into(),
        Some(s) if s < 60.0 => format!("expected wait {:.0} s", s.max(0.0)),
        Some(s) => format!("expected wait {:.0} min", s / 60.0),
    }
}

/// The `ElasticShape` event's note: `preferred 16x4 needs 22.0 GiB per GPU,
/// placed 8x8 in 13.0 GiB, predicted 1.18x step time, expected wait 9 min`.
pub fn event_note(
    preferred: BatchShape,
    preferred_budget: u64,
    placed: BatchShape,
    placed_budget: u64,
    relative_step_time: f64,
    expected_wait: Option<f64>,
) -> String {
    format!(
        "preferred {} needs {} per GPU, placed {} in {}, predicted {:.2}x step time, {}",
        preferred.display(),
        human_bytes(preferred_budget),
        placed.display(),
        human_bytes(placed_budget),
        relative_step_time,
        wait_words(expected_wait)
    )
}

#[cfg(test)]
#[path = "elastic_tests.rs"]
mod tests;
