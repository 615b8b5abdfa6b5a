//! `vramfit bench predict --measured FILE`: the predictor against measured peaks.
//!
//! FILE is JSON lines as written by scripts/gpu/calibrate_predictor.py: each
//! line has `name`, `split` (`fit` or `holdout`), `spec` (TrainingJob spec
//! form) and `measured.nvmlPeakBytes` (the process's peak as NVML reports it).
//! Lines whose model has no analytic description (`model.torchvision`, from
//! scripts/gpu/calibrate_libraries.py) are predicted from a captured profile
//! when one is given for the line's name, else skipped; so are lines of a
//! Hugging Face family the analytic path does not describe (with the reason).
//!
//! A line's `library` names the library that built the model
//! (calibrate_libraries.py writes `transformers` or `torchvision`). A
//! `huggingFace` line without it comes from calibrate_predictor.py or
//! calibrate_zero.py, which build the repository's own reference modules from
//! the config's shapes: it is predicted as that reference implementation
//! ([`super::predict_reference_model`]), not as the library's code.

use serde::Deserialize;
use serde_json::{Value, json};

use super::job::JobInput;
use super::{GpuProfile, PredictError, gpu_profile, predict_from_profile, predict_model};

/// One configuration's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    /// Configuration name.
    pub name: String,
    /// `fit` or `holdout`.
    pub split: String,
    /// Measured NVML per-process peak.
    pub measured_bytes: u64,
    /// Predicted peak.
    pub predicted_bytes: u64,
    /// (predicted - measured) / measured; negative is an under-prediction.
    pub relative_error: f64,
    /// `model` (analytic) or `profile`.
    pub source: &'static str,
    /// Predicted peak of the caching allocator's allocated bytes.
    pub predicted_allocated_bytes: u64,
    /// Measured `torch.cuda.max_memory_allocated()`, when the line has it.
    pub measured_allocated_bytes: Option<u64>,
    /// The prediction's layout margin (part of `predicted_bytes`).
    pub margin_bytes: u64,
}

impl BenchRow {
    /// The row as the replay alone predicts it: the layout margin taken off.
    pub fn without_margin(&self) -> BenchRow {
        let predicted = self.predicted_bytes - self.margin_bytes;
        let measured = self.measured_bytes as f64;
        BenchRow {
            predicted_bytes: predicted,
            relative_error: (predicted as f64 - measured) / measured,
            margin_bytes: 0,
            ..self.clone()
        }
    }
}

/// Error statistics over a set of rows.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorStats {
    /// Rows counted.
    pub count: usize,
    /// Median |relative error|.
    pub median: f64,
    /// 90th percentile |relative error| (nearest rank).
    pub p90: f64,
    /// Largest |relative error|.
    pub max: f64,
    /// Names of rows predicted more than 5% under the measurement.
    pub under_predictions: Vec<String>,
}

/// Predictions against every measured line.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    /// Per configuration.
    pub rows: Vec<BenchRow>,
    /// Lines skipped (no measurement, no profile for a model that needs
    /// one), with the reason.
    pub skipped: Vec<String>,
}

#[derive(Deserialize)]
struct Line {
    name: String,
    #[serde(default = "fit")]
    split: String,
    spec: Value,
    measured: Option<Measured>,
    gpu: Option<String>,
    library: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Measured {
    nvml_peak_bytes: u64,
    max_allocated_bytes: Option<u64>,
}

fn fit() -> String {
    "fit".into()
}

/// Predicts every measured line of `text` on `gpu` (or, when `None`, the GPU
/// named in the line, falling back to the default profile).
pub fn bench_predict(
    text: &str,
    gpu: Option<&'static GpuProfile>,
) -> Result<BenchReport, PredictError> {
    bench_predict_with_profiles(text, gpu, &|_| None, false)
}

/// [`bench_predict`], predicting the lines without an analytic model from the
/// profile `profile_for(name)` returns (its text); with `prefer_profiles`,
/// every line that has a profile is predicted from it.
pub fn bench_predict_with_profiles(
    text: &str,
    gpu: Option<&'static GpuProfile>,
    profile_for: &dyn Fn(&str) -> Option<String>,
    prefer_profiles: bool,
) -> Result<BenchReport, PredictError> {
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(raw)
            .map_err(|e| PredictError::Parse(format!("line {}: {e}", i + 1)))?;
        let Some(m) = line.measured else {
            skipped.push(format!("{}: no measurement", line.name));
            continue;
        };
        let library_model = line.spec["model"].get("torchvision").is_some();
        let reference = line.library.is_none();
        let job: JobInput = serde_json::from_value(line.spec).map_err(|e| {
            PredictError::Parse(format!("line {} ({}): spec: {e}", i + 1, line.name))
        })?;
        let profile = gpu
            .or_else(|| line.gpu.as_deref().and_then(gpu_profile))
            .unwrap_or_else(super::default_gpu);
        let profile_text = if library_model || prefer_profiles {
            profile_for(&line.name)
        } else {
            None
        };
        let (p, source) = if library_model || profile_text.is_some() {
            let Some(text) = profile_text else {
                skipped.push(format!("{}: no profile given for this model", line.name));
                continue;
            };
            let p = predict_from_profile(&text, &job.shape(), profile)
                .map_err(|e| PredictError::Invalid(format!("{}: profile: {e}", line.name)))?;
            (p, "profile")
        } else {
            let p = if reference {
                super::predict_reference_model(&job.model, &job.shape(), profile)
            } else {
                predict_model(&job.model, &job.shape(), profile)
            };
            let p = match p {
                Ok(p) => p,
                // a model the analytic path does not describe has no
                // prediction without its capture: reported, not fatal
                Err(PredictError::Unsupported(why)) => {
                    skipped.push(format!("{}: {why}", line.name));
                    continue;
                }
                Err(e) => return Err(PredictError::Invalid(format!("{}: {e}", line.name))),
            };
            (p, "model")
        };
        let measured = m.nvml_peak_bytes.max(1);
        rows.push(BenchRow {
            name: line.name,
            split: line.split,
            measured_bytes: measured,
            predicted_bytes: p.peak_bytes,
            relative_error: (p.peak_bytes as f64 - measured as f64) / measured as f64,
            source,
            predicted_allocated_bytes: p.allocated_bytes,
            measured_allocated_bytes: m.max_allocated_bytes,
            margin_bytes: p.breakdown.margin,
        });
    }
    Ok(BenchReport { rows, skipped })
}

/// Statistics over the rows whose split matches (`None`: all rows).
pub fn error_stats(rows: &[BenchRow], split: Option<&str>) -> ErrorStats {
    let sel: Vec<&BenchRow> = rows
        .iter()
        .filter(|r| split.is_none_or(|s| r.split == s))
        .collect();
    let mut abs: Vec<f64> = sel.iter().map(|r| r.relative_error.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let pick = |q: f64| -> f64 {
        if abs.is_empty() {
            return 0.0;
        }
        let rank = ((q * abs.len() as f64).ceil() as usize).clamp(1, abs.len());
        abs[rank - 1]
    };
    let median = if abs.is_empty() {
        0.0
    } else if abs.len() % 2 == 1 {
        abs[abs.len() / 2]
    } else {
        (abs[abs.len() / 2 - 1] + abs[abs.len() / 2]) / 2.0
    };
    ErrorStats {
        count: abs.len(),
        median,
        p90: pick(0.9),
        max: abs.last().copied().unwrap_or(0.0),
        under_predictions: sel
            .iter()
            .filter(|r| r.relative_error < -0.05)
            .map(|r| r.name.clone())
            .collect(),
    }
}

fn stats_json(s: &ErrorStats) -> Value {
    json!({
        "count": s.count,
        "medianAbsError": s.median,
        "p90AbsError": s.p90,
        "maxAbsError": s.max,
        "underPredictionsBeyond5pct": s.under_predictions.len(),
        "underPredicted": s.under_predictions,
    })
}

/// The report as JSON: statistics over all rows, `fit` and `holdout`, and the rows.
pub fn bench_json(r: &BenchReport) -> Value {
    json!({
        "all": stats_json(&error_stats(&r.rows, None)),
        "fit": stats_json(&error_stats(&r.rows, Some("fit"))),
        "holdout": stats_json(&error_stats(&r.rows, Some("holdout"))),
        "rows": r.rows.iter().map(|x| json!({
            "name": x.name, "split": x.split, "measuredBytes": x.measured_bytes,
            "predictedBytes": x.predicted_bytes, "relativeError": x.relative_error,
            "source": x.source,
            "predictedAllocatedBytes": x.predicted_allocated_bytes,
            "measuredAllocatedBytes": x.measured_allocated_bytes,
            "marginBytes": x.margin_bytes,
        })).collect::<Vec<_>>(),
        "skipped": r.skipped,
    })
}

/// The report as a table: one row per configuration, then the statistics.
pub fn bench_table(r: &BenchReport) -> String {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let mut s = format!(
        "{:<46} {:<8} {:<8} {:>10} {:>10} {:>8}\n",
        "CONFIG", "SPLIT", "SOURCE", "MEASURED", "PREDICTED", "ERROR"
    );
    for x in &r.rows {
        s += &format!(
            "{:<46} {:<8} {:<8} {:>10.3} {:>10.3} {:>+7.1}%\n",
            x.name,
            x.split,
            x.source,
            gib(x.measured_bytes),
            gib(x.predicted_bytes),
            100.0 * x.relative_error
        );
    }
    for (label, split) in [
        ("all", None),
        ("fit", Some("fit")),
        ("holdout", Some("holdout")),
    ] {
        let st = error_stats(&r.rows, split);
        s += &format!(
            "{label}: n={} median {:.1}% p90 {:.1}% max {:.1}% under-predicted >5%: {} {:?}\n",
            st.count,
            100.0 * st.median,
            100.0 * st.p90,
            100.0 * st.max,
            st.under_predictions.len(),
            st.under_predictions
        );
    }
    s
}
