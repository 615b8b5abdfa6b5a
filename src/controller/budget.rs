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
        source: if spec.model.profile.is_some() {
            "profile"
        } else {
            "model"
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GIB: u64 = 1 << 30;

    fn job(memory: serde_json::Value) -> TrainingJob {
        let mut spec = json!({
            "batch": {"global": 64, "micro": 8},
            "model": {"mlp": {"layers": 4, "hidden": 1024}},
            "template": {}
        });
        if !memory.is_null() {
            spec["memory"] = memory;
        }
        serde_json::from_value(json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "j", "namespace": "ml"}, "spec": spec
        }))
        .unwrap()
    }

    fn model_peak(job: &TrainingJob, micro: u32) -> u64 {
        let shape = JobShape {
            gpus: job.spec.gpus,
            global_batch: job.spec.batch.global,
            micro_batch: micro,
        };
        predict_model(&job.spec.model, &shape, default_gpu())
            .unwrap()
            .peak_bytes
    }

    #[test]
    fn a_prediction_gets_the_headroom_on_top() {
        for (memory, headroom) in [
            (serde_json::Value::Null, 0.05),
            (json!({"headroom": 0.5}), 0.5),
            (json!({"headroom": 0.0}), 0.0),
        ] {
            let job = job(memory);
            let peak = model_peak(&job, 8);
            let budget = attempt_budget(&job, 8, None, None).unwrap();
            assert_eq!(budget.source, "model");
            assert_eq!(budget.predicted, peak);
            assert_eq!(
                budget.budget,
                (peak as f64 * (1.0 + headroom)).ceil() as u64,
                "headroom {headroom}"
            );
            assert!(budget.breakdown.is_some());
        }
    }

    #[test]
    fn the_micro_batch_of_the_attempt_is_predicted() {
        let mut job = job(serde_json::Value::Null);
        job.spec.model = serde_json::from_value(json!({"transformer": {
            "layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "seqLen": 1024}}))
        .unwrap();
        let eight = attempt_budget(&job, 8, None, None).unwrap();
        let four = attempt_budget(&job, 4, None, None).unwrap();
        assert_eq!(four.predicted, model_peak(&job, 4));
        assert!(four.predicted < eight.predicted);
    }

    #[test]
    fn a_measurement_replaces_the_prediction_and_gets_the_headroom() {
        let job = job(json!({"headroom": 0.1}));
        let budget = attempt_budget(&job, 8, None, Some(10 * GIB)).unwrap();
        assert_eq!(budget.source, "measured");
        assert_eq!(budget.predicted, 10 * GIB);
        assert_eq!(budget.budget, (10.0 * GIB as f64 * 1.1).ceil() as u64);
    }

    #[test]
    fn a_request_is_the_budget_without_headroom_and_beats_a_measurement() {
        let job = job(json!({"request": "20Gi", "headroom": 0.5}));
        let budget = attempt_budget(&job, 8, None, Some(10 * GIB)).unwrap();
        assert_eq!(budget.source, "request");
        assert_eq!(budget.budget, 20 * GIB);
        assert_eq!(budget.predicted, model_peak(&job, 8), "informative");
        for bad in ["0", "lots"] {
            let job = self::job(json!({"request": bad}));
            let error = attempt_budget(&job, 8, None, None).unwrap_err();
            assert!(error.contains("spec.memory.request"), "{error}");
        }
    }

    #[test]
    fn a_profile_job_needs_its_profile_text() {
        let mut job = job(serde_json::Value::Null);
        job.spec.model =
            serde_json::from_value(json!({"profile": {"configMapRef": {"name": "p", "key": "k"}}}))
                .unwrap();
        let error = attempt_budget(&job, 8, None, None).unwrap_err();
        assert!(error.contains("spec.model.profile"), "{error}");
    }
}
