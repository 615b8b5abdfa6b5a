//! What would make a job fit a GPU when its prediction does not: the
//! changes of its spec that lower the need per GPU (activation
//! checkpointing, a micro-batch of 1, ZeRO-3 over more GPUs), each
//! predicted by the same model, so a job that can never run says how it could.

use crate::api::ModelSpec;
use crate::quantity::human_bytes;

use super::{GpuProfile, JobShape, predict_model};

/// GPU counts tried for ZeRO-3 sharding, smallest first.
const ZERO_GPUS: [u32; 6] = [2, 4, 8, 16, 32, 64];

/// One change of the spec and the peak per GPU it leads to.
#[derive(Debug, Clone, PartialEq)]
pub struct FitOption {
    /// The change, as the spec's fields say it.
    pub change: String,
    /// Predicted peak per GPU with the change.
    pub peak_bytes: u64,
}

/// The largest micro-batch at most `micro` that divides `per_gpu`.
fn micro_dividing(per_gpu: u32, micro: u32) -> u32 {
    (1..=micro.min(per_gpu).max(1))
        .rev()
        .find(|m| per_gpu.is_multiple_of(*m))
        .unwrap_or(1)
}

/// The changes tried, in order of how little they change the job: each alone,
/// then all of them over the fewest GPUs that fit, with the predicted peak of
/// each. A change the model cannot predict is left out.
pub fn fit_options(
    model: &ModelSpec,
    shape: &JobShape,
    gpu: &'static GpuProfile,
    capacity: u64,
    headroom: f64,
) -> Vec<FitOption> {
    let fits = |peak: u64| (peak as f64 * (1.0 + headroom)).ceil() <= capacity as f64;
    let predict = |m: &ModelSpec, s: &JobShape| predict_model(m, s, gpu).ok().map(|p| p.peak_bytes);
    let mut out = Vec::new();
    let checkpointed = ModelSpec {
        gradient_checkpointing: true,
        ..model.clone()
    };
    if !model.gradient_checkpointing
        && let Some(peak) = predict(&checkpointed, shape)
    {
        out.push(FitOption {
            change: "model.gradientCheckpointing: true".into(),
            peak_bytes: peak,
        });
    }
    if shape.micro_batch > 1 {
        let one = JobShape {
            micro_batch: 1,
            ..*shape
        };
        if let Some(peak) = predict(model, &one) {
            out.push(FitOption {
                change: "batch.micro: 1".into(),
                peak_bytes: peak,
            });
        }
    }
    let sharded = ModelSpec {
        zero_stage: 3,
        ..model.clone()
    };
    let all = ModelSpec {
        zero_stage: 3,
        gradient_checkpointing: true,
        ..model.clone()
    };
    for (spec, with_all) in [(&sharded, false), (&all, true)] {
        let mut last = None;
        for gpus in ZERO_GPUS.into_iter().filter(|g| *g > shape.gpus) {
            if !shape.global_batch.is_multiple_of(gpus) {
                continue;
            }
            let per_gpu = shape.global_batch / gpus;
            let micro = if with_all {
                1
            } else {
                micro_dividing(per_gpu, shape.micro_batch)
            };
            let s = JobShape {
                gpus,
                global_batch: shape.global_batch,
                micro_batch: micro,
            };
            let Some(peak) = predict(spec, &s) else {
                continue;
            };
            let mut change = format!("model.zeroStage: 3 with gpus: {gpus}");
            if with_all {
                change.push_str(", gradientCheckpointing: true and batch.micro: 1");
            }
            last = Some(FitOption {
                change,
                peak_bytes: peak,
            });
            if fits(peak) {
                break;
            }
        }
        out.extend(last);
    }
    out
}

/// A sentence for a job whose need per GPU exceeds `capacity` (`gpu_name`'s):
/// the changes that would make it fit, or the smallest need any of them reaches.
pub fn fit_advice(options: &[FitOption], capacity: u64, headroom: f64, gpu_name: &str) -> String {
    let need = |o: &FitOption| (o.peak_bytes as f64 * (1.0 + headroom)).ceil() as u64;
    let fitting: Vec<String> = options
        .iter()
        .filter(|o| need(o) <= capacity)
        .map(|o| format!("{} ({} per GPU)", o.change, human_bytes(need(o))))
        .collect();
    if !fitting.is_empty() {
        return format!(
            "it would fit a {gpu_name} ({}) with {}",
            human_bytes(capacity),
            fitting.join("; or ")
        );
    }
    match options.iter().min_by_key(|o| o.peak_bytes) {
        Some(best) => format!(
            "no single change makes it fit a {gpu_name} ({}): the least, {}, still needs {} per GPU",
            human_bytes(capacity),
            best.change,
            human_bytes(need(best))
        ),
        None => format!("no change of the spec could be predicted to fit a {gpu_name}"),
    }
}

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;
