//! The model kinds a simulated cluster trains: the demo's five kinds, each
//! with its memory and step time measured on the H200 at every micro-batch
//! (`scripts/gpu/step_time.py`, raw output committed under
//! docs/results/step-time/), and, for the three language models, the
//! TrainingJob spec the predictor reads.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::predict::job::{JobInput, parse_job, predict_job_at};
use crate::predict::step_time::StepTimeCurve;
use crate::predict::{GpuProfile, context_bytes};

/// The measured curves the simulation uses by default (H200, 2026-12-03).
pub const H200_STEP_TIMES: &str =
    include_str!("../../docs/results/step-time/h200-2026-12-03.jsonl");

/// One model kind: what it needs and how fast it trains at each micro-batch.
#[derive(Debug, Clone)]
pub struct ModelKind {
    /// Name as in the measurements (`gpt2`, `llama-1b`, ...).
    pub name: String,
    /// Global batch of the measurements (samples per optimizer step).
    pub global: u32,
    /// Seconds per optimizer step by micro-batch.
    pub curve: StepTimeCurve,
    /// The whole process's peak on one GPU at each measured micro-batch
    /// (PyTorch's peak reserved plus the CUDA context), ascending by micro.
    pub peak: Vec<(u32, u64)>,
    /// The job the predictor reads, for the kinds it describes analytically.
    pub spec: Option<JobInput>,
}

impl ModelKind {
    /// The measured micro-batches, ascending.
    pub fn micros(&self) -> impl Iterator<Item = u32> + '_ {
        self.peak.iter().map(|p| p.0)
    }

    /// The true peak at a measured micro-batch.
    pub fn peak_at(&self, micro: u32) -> Option<u64> {
        self.peak.iter().find(|p| p.0 == micro).map(|p| p.1)
    }

    /// The largest measured micro-batch whose true peak is at most `bytes`.
    pub fn largest_micro_within(&self, bytes: u64) -> Option<u32> {
        self.peak.iter().rev().find(|p| p.1 <= bytes).map(|p| p.0)
    }

    /// What vramfit predicts for the whole process at `micro` on `gpu`: the
    /// predictor's figure for the kinds with a spec; for the others (the
    /// vision models, which vramfit serves through captured profiles) the
    /// measured peak, i.e. a profile taken as exact.
    pub fn predicted_peak(&self, micro: u32, gpu: &'static GpuProfile) -> Result<u64, String> {
        match &self.spec {
            Some(spec) => predict_job_at(spec, micro, gpu, None)
                .map(|p| p.peak_bytes)
                .map_err(|e| format!("{}: {e}", self.name)),
            None => self
                .peak_at(micro)
                .ok_or_else(|| format!("{}: micro-batch {micro} was not measured", self.name)),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    model: String,
    micro: u32,
    global: u32,
    median_step_seconds: Option<f64>,
    peak_reserved_bytes: Option<u64>,
    error: Option<String>,
}

/// The TrainingJob spec of each language kind, as `scripts/gpu/step_time.py`
/// builds it (bf16 autocast, AdamW, sdpa).
/// The measured kind whose step-time curve stands for `model`'s: the same
/// family (GPT-2; the LLaMA-style decoders; the BERT-style encoders), else
/// none.
pub fn kind_for(model: &crate::api::ModelSpec) -> Option<&'static str> {
    use crate::api::TransformerKind;
    if let Some(hf) = &model.hugging_face {
        return match hf.config.get("model_type").and_then(|t| t.as_str())? {
            "gpt2" => Some("gpt2"),
            "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" => Some("llama-1b"),
            "bert" | "roberta" => Some("bert"),
            _ => None,
        };
    }
    match &model.transformer {
        Some(t) if t.kind == TransformerKind::Encoder => Some("bert"),
        Some(_) => Some("gpt2"),
        None => None,
    }
}

/// The step-time curve for a job of `model` whose preferred micro-batch is
/// `micro`, and where it comes from: the measured curve of its family on the
/// H200 ([`kind_for`], [`H200_STEP_TIMES`]), else a bound through `micro`
/// alone (a smaller micro-batch costs `micro / smaller` as much, a larger one
/// gains nothing; see [`StepTimeCurve`]).
pub fn curve_for(model: &crate::api::ModelSpec, micro: u32) -> (StepTimeCurve, String) {
    static MEASURED: std::sync::OnceLock<Vec<ModelKind>> = std::sync::OnceLock::new();
    let kinds = MEASURED.get_or_init(|| {
        crate::predict::gpu_profile("H200")
            .and_then(|gpu| parse_kinds(H200_STEP_TIMES, gpu).ok())
            .unwrap_or_default()
    });
    if let Some(kind) = kind_for(model).and_then(|name| kinds.iter().find(|k| k.name == name)) {
        return (
            kind.curve.clone(),
            format!(
                "measured: {} on the H200 (docs/results/step-time/h200-2026-12-03.jsonl)",
                kind.name
            ),
        );
    }
    let bound = StepTimeCurve::new(vec![(micro.max(1), 1.0)])
        .expect("one point at a positive micro-batch with a positive time");
    (
        bound,
        "bound: no measured curve for this model; a smaller micro-batch is taken to cost \
         micro/smaller as much, a larger one to gain nothing"
            .to_string(),
    )
}

fn spec_yaml(name: &str) -> Option<&'static str> {
    Some(match name {
        "gpt2" => {
            "{gpus: 1, batch: {global: 64, micro: 1}, model: {huggingFace: {seqLen: 1024, config: {model_type: gpt2}}, precision: amp-bf16, optimizer: adamw}}"
        }
        "llama-1b" => {
            "{gpus: 1, batch: {global: 32, micro: 1}, model: {huggingFace: {seqLen: 2048, config: {model_type: llama, hidden_size: 2048, intermediate_size: 5632, num_hidden_layers: 22, num_attention_heads: 32, num_key_value_heads: 4, vocab_size: 32000}}, precision: amp-bf16, optimizer: adamw}}"
        }
        "bert" => {
            "{gpus: 1, batch: {global: 64, micro: 1}, model: {huggingFace: {seqLen: 512, config: {model_type: bert, architectures: [BertForMaskedLM]}}, precision: amp-bf16, optimizer: adamw}}"
        }
        _ => return None,
    })
}

/// Parses step-time measurements (JSON lines of `scripts/gpu/step_time.py`)
/// into kinds, sorted by name. Rows that ran out of memory are skipped;
/// `gpu` gives the CUDA context added to each peak.
pub fn parse_kinds(text: &str, gpu: &'static GpuProfile) -> Result<Vec<ModelKind>, String> {
    let context = context_bytes(gpu, 1);
    // Per kind: global batch, (micro, seconds), (micro, peak bytes).
    type Measured = (u32, Vec<(u32, f64)>, Vec<(u32, u64)>);
    let mut rows: BTreeMap<String, Measured> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: Row =
            serde_json::from_str(line).map_err(|e| format!("step times line {}: {e}", i + 1))?;
        if row.error.is_some() {
            continue;
        }
        let (Some(seconds), Some(reserved)) = (row.median_step_seconds, row.peak_reserved_bytes)
        else {
            return Err(format!(
                "step times line {}: no medianStepSeconds or peakReservedBytes",
                i + 1
            ));
        };
        let entry = rows
            .entry(row.model.clone())
            .or_insert((row.global, Vec::new(), Vec::new()));
        if entry.0 != row.global {
            return Err(format!(
                "step times line {}: {} was measured at global batches {} and {}",
                i + 1,
                row.model,
                entry.0,
                row.global
            ));
        }
        entry.1.push((row.micro, seconds));
        entry.2.push((row.micro, reserved + context));
    }
    if rows.is_empty() {
        return Err("no step-time measurements".into());
    }
    rows.into_iter()
        .map(|(name, (global, times, mut peak))| {
            let curve = StepTimeCurve::new(times).map_err(|e| format!("{name}: {e}"))?;
            peak.sort_by_key(|p| p.0);
            let spec = spec_yaml(&name)
                .map(|yaml| parse_job(yaml).map_err(|e| format!("{name}: {e}")))
                .transpose()?;
            Ok(ModelKind {
                name,
                global,
                curve,
                peak,
                spec,
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "kinds_tests.rs"]
mod tests;
