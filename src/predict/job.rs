//! Reading a TrainingJob (YAML or JSON text) into what the predictor needs.

use serde::Deserialize;

use crate::api::validate::{as_document, validate_training_job};
use crate::api::{DEFAULT_HEADROOM, MemorySpec, ModelSpec};

use super::{GpuProfile, JobShape, PredictError, Prediction, predict_from_profile, predict_model};

/// The parts of a TrainingJob spec the predictor reads.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobInput {
    /// GPUs of the job.
    #[serde(default = "one")]
    pub gpus: u32,
    /// Batch sizes.
    pub batch: BatchInput,
    /// The model and how it is trained.
    pub model: ModelSpec,
    /// The memory budget settings (headroom).
    #[serde(default)]
    pub memory: Option<MemorySpec>,
}

/// `spec.batch`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchInput {
    /// Samples per optimizer step over all GPUs.
    pub global: u32,
    /// Micro-batch per GPU (with `autoMicro`, the largest one tried).
    pub micro: u32,
    /// Floor of the OOM back-off and of the automatic choice.
    #[serde(default = "one")]
    pub min_micro: u32,
    /// Whether the controller chooses the micro-batch per GPU model.
    #[serde(default)]
    pub auto_micro: bool,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
struct Document {
    spec: Option<JobInput>,
}

impl JobInput {
    /// `memory.headroom`, with the documented default.
    pub fn headroom(&self) -> f64 {
        self.memory
            .as_ref()
            .map_or(DEFAULT_HEADROOM, |m| m.headroom)
    }

    /// The batch shape at the job's own micro-batch.
    pub fn shape(&self) -> JobShape {
        JobShape {
            gpus: self.gpus,
            global_batch: self.batch.global,
            micro_batch: self.batch.micro,
        }
    }
}

/// Parses a TrainingJob document (YAML or JSON; a bare spec is accepted too).
pub fn parse_job(text: &str) -> Result<JobInput, PredictError> {
    let doc: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| PredictError::Parse(format!("job: {e}")))?;
    let has_spec = doc.get("spec").is_some();
    // Refuse what the API server refuses, naming the fields.
    let checked = match (&doc, has_spec) {
        (_, true) => validate_training_job(&doc),
        (serde_json::Value::Object(spec), false) => {
            validate_training_job(&as_document(spec.clone()))
        }
        _ => Err(vec!["job: expected a TrainingJob or its spec".to_string()]),
    };
    if let Err(problems) = checked {
        return Err(PredictError::Parse(format!(
            "the job is not valid:\n  {}",
            problems.join("\n  ")
        )));
    }
    let parsed = if has_spec {
        serde_json::from_value::<Document>(doc).map(|d| d.spec)
    } else {
        serde_json::from_value::<JobInput>(doc).map(Some)
    };
    parsed
        .map_err(|e| PredictError::Parse(format!("job spec: {e}")))?
        .ok_or_else(|| PredictError::Missing("spec".into()))
}

/// Predicts a parsed job at its own micro-batch. Profile-mode jobs need the
/// profile text (`profile_text`), which the caller fetched from the ConfigMap.
pub fn predict_job(
    job: &JobInput,
    gpu: &'static GpuProfile,
    profile_text: Option<&str>,
) -> Result<Prediction, PredictError> {
    predict_job_at(job, job.batch.micro, gpu, profile_text)
}

/// Predicts a parsed job at another micro-batch (the OOM back-off halves it and
/// doubles accumulation, keeping the global batch).
pub fn predict_job_at(
    job: &JobInput,
    micro_batch: u32,
    gpu: &'static GpuProfile,
    profile_text: Option<&str>,
) -> Result<Prediction, PredictError> {
    let shape = JobShape {
        micro_batch,
        ..job.shape()
    };
    // A profile given (model.profile's, or the one captured for a job
    // profiled automatically) is what the job is predicted from.
    if let Some(text) = profile_text {
        return predict_from_profile(text, &shape, gpu);
    }
    if let Some(profile) = &job.model.profile {
        let r = &profile.config_map_ref;
        return Err(PredictError::Missing(format!(
            "the profile text of model.profile (ConfigMap {:?} key {:?})",
            r.name, r.key
        )));
    }
    predict_model(&job.model, &shape, gpu)
}

/// The largest micro-batch for `job` on `gpu` whose predicted peak plus
/// `headroom` fits in `capacity_bytes`: among the divisors of
/// `global / gpus` between `batch.minMicro` and `batch.micro`, largest first.
/// Returns the prediction at that micro-batch; an error says what the
/// smallest candidate needs when none fits.
pub fn auto_micro_batch(
    job: &JobInput,
    gpu: &'static GpuProfile,
    capacity_bytes: u64,
    headroom: f64,
    profile_text: Option<&str>,
) -> Result<Prediction, PredictError> {
    let gpus = job.gpus.max(1);
    if !job.batch.global.is_multiple_of(gpus) {
        return Err(PredictError::Invalid(format!(
            "batch.global ({}) must be divisible by gpus ({gpus})",
            job.batch.global
        )));
    }
    let per_gpu = job.batch.global / gpus;
    let low = job.batch.min_micro.max(1);
    let high = job.batch.micro.min(per_gpu);
    let candidates: Vec<u32> = (low..=high)
        .rev()
        .filter(|m| per_gpu.is_multiple_of(*m))
        .collect();
    let Some(&smallest) = candidates.last() else {
        return Err(PredictError::Invalid(format!(
            "no micro-batch between batch.minMicro ({low}) and batch.micro ({}) divides batch.global / gpus ({per_gpu})",
            job.batch.micro
        )));
    };
    let fits =
        |p: &Prediction| (p.peak_bytes as f64 * (1.0 + headroom)).ceil() <= capacity_bytes as f64;
    let mut last = None;
    for micro in candidates {
        let p = match predict_job_at(job, micro, gpu, profile_text) {
            Ok(p) => p,
            // A profile cannot predict above the micro-batch it was recorded at.
            Err(PredictError::Unsupported(_)) if job.model.profile.is_some() => continue,
            Err(e) => return Err(e),
        };
        if fits(&p) {
            return Ok(p);
        }
        last = Some(p);
    }
    let needs = last.map_or_else(
        || "an unknown amount".to_string(),
        |p| {
            format!(
                "{} bytes with headroom",
                (p.peak_bytes as f64 * (1.0 + headroom)).ceil()
            )
        },
    );
    Err(PredictError::Invalid(format!(
        "no micro-batch fits {capacity_bytes} bytes on {}: the smallest, {smallest}, needs {needs}",
        gpu.name
    )))
}
