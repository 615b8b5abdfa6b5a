//! Reading a TrainingJob (YAML or JSON text) into what the predictor needs.

use serde::Deserialize;

use crate::api::ModelSpec;
use crate::api::validate::{as_document, validate_training_job};

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
}

/// `spec.batch`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchInput {
    /// Samples per optimizer step over all GPUs.
    pub global: u32,
    /// Micro-batch per GPU.
    pub micro: u32,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
struct Document {
    spec: Option<JobInput>,
}

impl JobInput {
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
    if job.model.profile.is_some() {
        let text = profile_text.ok_or_else(|| {
            let r = &job.model.profile.as_ref().map(|p| p.config_map_ref.clone());
            PredictError::Missing(format!(
                "the profile text of model.profile (ConfigMap {:?} key {:?})",
                r.as_ref().map(|r| r.name.as_str()).unwrap_or(""),
                r.as_ref().map(|r| r.key.as_str()).unwrap_or("")
            ))
        })?;
        return predict_from_profile(text, &shape, gpu);
    }
    predict_model(&job.model, &shape, gpu)
}
