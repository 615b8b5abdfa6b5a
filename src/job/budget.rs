//! The memory budget of an attempt: an explicit request, a measurement of the
//! same model, or the predictor's estimate, plus headroom.

use crate::api::{GpuModelBudget, MemoryBreakdown, TrainingJob, TrainingJobSpec};
use crate::predict::job::{BatchInput, JobInput, auto_micro_batch};
use crate::predict::{
    GpuProfile, JobShape, context_bytes, default_gpu, gpu_profile, predict_from_profile,
    predict_model,
};

use crate::quantity::parse_quantity;

/// The part of a per-GPU budget kept for memory the process holds outside
/// the caching allocator (CUDA context, kernels, libraries; NCCL with more
/// than one GPU), as the predictor counts it for `gpu_model` (the default
/// profile when unnamed or unknown). The budget covers the whole process, as
/// the agent's NVML watchdog measures it; the allocator may reserve the rest
/// (`VRAMFIT_CONTEXT_BYTES`, docs/node-protocol.md).
pub fn outside_allocator_bytes(gpu_model: Option<&str>, gpus: u32) -> u64 {
    let gpu = gpu_model.and_then(gpu_profile).unwrap_or_else(default_gpu);
    context_bytes(gpu, gpus)
}

/// The least a budget grows for each OOM the job had (with a headroom
/// below 5%, or none, a retry would otherwise get the ratio that just failed).
pub const MIN_OOM_GROWTH: f64 = 1.05;

/// The factor by which a retry's predicted or measured budget is raised after
/// `ooms` OOMs of the job: each OOM proved the budget of its attempt, the
/// prediction plus `headroom`, too small for that attempt, so the prediction
/// was low by at least that ratio and the next one is scaled by it, compounded
/// per OOM (at least [`MIN_OOM_GROWTH`] each). Budgets the user requested are
/// not scaled (see [`Budget::after_ooms`]).
pub fn oom_correction(ooms: u32, headroom: f64) -> f64 {
    (1.0 + headroom)
        .max(MIN_OOM_GROWTH)
        .powi(ooms.min(64) as i32)
}

/// What the budget is based on.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// Predicted peak per GPU, bytes (whole process).
    pub predicted: u64,
    /// Breakdown of the prediction, when the predictor made one.
    pub breakdown: Option<MemoryBreakdown>,
    /// Budget per GPU, bytes.
    pub budget: u64,
    /// `request`, `measured`, `model` or `profile`.
    pub source: &'static str,
}

impl Budget {
    /// This budget after `ooms` OOMs of the job ([`oom_correction`]), capped
    /// at `capacity` (the largest GPU it could run on) when one is given. A
    /// requested budget stays as the user set it.
    pub fn after_ooms(mut self, ooms: u32, headroom: f64, capacity: Option<u64>) -> Self {
        let factor = oom_correction(ooms, headroom);
        if self.source == "request" || factor <= 1.0 {
            return self;
        }
        let scale = |bytes: u64| {
            let scaled = (bytes as f64 * factor).ceil() as u64;
            capacity.map_or(scaled, |c| scaled.min(c.max(bytes)))
        };
        self.predicted = scale(self.predicted);
        self.budget = scale(self.budget);
        self
    }
}

/// Whether the job is predicted from a profile the controller captures from
/// its own pod (a `Profiling` phase): `model.auto`, or a Hugging Face model
/// whose `model_type` the analytic path does not know and that names no
/// `memory.request` to run with instead.
pub fn profiled_automatically(spec: &TrainingJobSpec) -> bool {
    if spec.model.auto.is_some() {
        return true;
    }
    let requested = spec.memory.as_ref().is_some_and(|m| m.request.is_some());
    !requested
        && spec.model.hugging_face.as_ref().is_some_and(|hf| {
            matches!(
                crate::predict::hf::arch_from_hugging_face(hf),
                Err(crate::predict::PredictError::Unsupported(_))
            )
        })
}

/// Computes the budget for `micro`. `profile_text` is the ConfigMap content for
/// profile-based jobs; `measured` the highest peak measured for a job with the
/// same signature.
pub fn attempt_budget(
    job: &TrainingJob,
    micro: u32,
    profile_text: Option<&str>,
    measured: Option<u64>,
) -> Result<Budget, String> {
    attempt_budget_on(job, micro, profile_text, measured, default_gpu())
}

/// [`attempt_budget`] for one GPU model.
pub fn attempt_budget_on(
    job: &TrainingJob,
    micro: u32,
    profile_text: Option<&str>,
    measured: Option<u64>,
    gpu: &'static GpuProfile,
) -> Result<Budget, String> {
    let spec = &job.spec;
    let shape = JobShape {
        gpus: spec.gpus,
        global_batch: spec.batch.global,
        micro_batch: micro,
    };
    let predicted = match profile_text {
        Some(text) if spec.model.profile.is_some() || profiled_automatically(spec) => {
            predict_from_profile(text, &shape, gpu)
        }
        None if spec.model.profile.is_some() => {
            return Err("spec.model.profile: the profile was not loaded".into());
        }
        _ => predict_model(&spec.model, &shape, gpu),
    };
    let request = spec.memory.as_ref().and_then(|m| m.request.as_deref());
    if let Some(request) = request {
        let bytes = parse_quantity(request, 1)
            .filter(|b| *b > 0)
            .ok_or_else(|| format!("spec.memory.request {request:?} is not a positive quantity"))?;
        // The prediction is informative only; a request overrides it.
        let (predicted, breakdown) = match predicted {
            Ok(p) => (p.peak_bytes, Some(p.breakdown)),
            Err(_) => (bytes, None),
        };
        return Ok(Budget {
            predicted,
            breakdown,
            budget: bytes,
            source: "request",
        });
    }
    let with_headroom = |bytes: u64| (bytes as f64 * (1.0 + spec.headroom())).ceil() as u64;
    if let Some(measured) = measured {
        let breakdown = predicted.ok().map(|p| p.breakdown);
        return Ok(Budget {
            predicted: measured,
            breakdown,
            budget: with_headroom(measured),
            source: "measured",
        });
    }
    let prediction = predicted.map_err(|e| e.to_string())?;
    Ok(Budget {
        predicted: prediction.peak_bytes,
        breakdown: Some(prediction.breakdown),
        budget: with_headroom(prediction.peak_bytes),
        source: if spec.model.profile.is_some() || profiled_automatically(spec) {
            "profile"
        } else {
            "model"
        },
    })
}

/// The budget of the current attempt on each GPU model of the cluster
/// (`models`: model name and the largest capacity of that model), for the
/// models the job may use and the predictor knows. `micro` is the attempt's
/// micro-batch; with `batch.autoMicro` on the first attempt (`auto`) each
/// model gets the largest micro-batch that fits it instead, and a model that
/// no micro-batch fits is left out. `measured` gives the measured peak of a
/// micro-batch, if a finished job of the same model had one.
pub fn gpu_model_budgets(
    job: &TrainingJob,
    micro: u32,
    auto: bool,
    models: &[(String, u64)],
    profile_text: Option<&str>,
    measured: &dyn Fn(u32) -> Option<u64>,
) -> Vec<GpuModelBudget> {
    let allowed = job.spec.gpu_models.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for (model, capacity) in models {
        if !allowed.is_empty() && !allowed.contains(model) {
            continue;
        }
        let Some(gpu) = gpu_profile(model) else {
            continue;
        };
        let micro = if auto {
            match auto_micro_batch(
                &job_input(job),
                gpu,
                *capacity,
                job.spec.headroom(),
                profile_text,
            ) {
                Ok(p) => p.micro_batch,
                Err(_) => continue,
            }
        } else {
            micro
        };
        if let Ok(b) = attempt_budget_on(job, micro, profile_text, measured(micro), gpu) {
            out.push(GpuModelBudget {
                gpu_model: model.clone(),
                micro_batch: micro,
                predicted_bytes: b.predicted,
                budget_bytes: b.budget,
            });
        }
    }
    out
}

/// The predictor's view of a TrainingJob spec.
pub fn job_input(job: &TrainingJob) -> JobInput {
    let spec = &job.spec;
    JobInput {
        gpus: spec.gpus,
        batch: BatchInput {
            global: spec.batch.global,
            micro: spec.batch.micro,
            min_micro: spec.batch.min_micro,
            auto_micro: spec.batch.auto_micro,
        },
        model: spec.model.clone(),
        memory: spec.memory.clone(),
    }
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
