//! The memory budget of an attempt: an explicit request, a measurement of the
//! same model, or the predictor's estimate, plus headroom.

use crate::api::{MemoryBreakdown, TrainingJob};
use crate::predict::{JobShape, default_gpu, predict_from_profile, predict_model};

use super::quantity::parse_quantity;

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

/// Computes the budget for `micro`. `profile_text` is the ConfigMap content for
/// profile-based jobs; `measured` the highest peak measured for a job with the
/// same signature.
pub fn attempt_budget(
    job: &TrainingJob,
    micro: u32,
    profile_text: Option<&str>,
    measured: Option<u64>,
) -> Result<Budget, String> {
    let spec = &job.spec;
    let shape = JobShape {
        gpus: spec.gpus,
        global_batch: spec.batch.global,
        micro_batch: micro,
    };
    let predicted = if spec.model.profile.is_some() {
        let text = profile_text.ok_or("spec.model.profile: the profile was not loaded")?;
        predict_from_profile(text, &shape, default_gpu())
    } else {
        predict_model(&spec.model, &shape, default_gpu())
    };
    let request = spec.memory.as_ref().and_then(|m| m.request.as_deref());
    if let Some(request) = request {
        let bytes = parse_quantity(request, 1.0)
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
        source: if spec.model.profile.is_some() {
            "profile"
        } else {
            "model"
        },
    })
}
