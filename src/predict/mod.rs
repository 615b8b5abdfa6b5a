//! The VRAM predictor: a training job's peak GPU memory, with a breakdown.
//!
//! Pure: a model description (or a captured allocation profile), the batch
//! shape and a GPU profile in; bytes out. The analytic path generates the
//! tensor allocations of building the model and three optimizer steps
//! ([`sequence`]) and replays them through the PyTorch-policy caching allocator
//! of [`crate::alloc`] ([`allocator`]); the profile path replays a recorded
//! sequence ([`profile`]) the same way.
//! The process's peak is the allocator's reserved peak plus the GPU's context.
//! See docs/predictor.md.

pub mod allocator;
pub mod arch;
pub mod bench;
pub mod conv;
pub mod fit;
pub mod gpu;
pub mod hf;
pub mod job;
pub mod output;
pub mod profile;
pub mod reduce;
pub mod sequence;
pub mod shapes;
pub mod step_time;

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;

use crate::alloc::ROUND_LARGE_BYTES;
use crate::api::{MemoryBreakdown, ModelSpec};

use allocator::{AllocatorModel, CachingAllocatorModel, ReplayOutcome};
use arch::{Arch, TransformerArch};
pub use gpu::{GPU_PROFILES, GpuProfile, default_gpu, gpu_profile};
use sequence::{RunShape, training_events};

/// Why a prediction could not be made. Messages name the field at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PredictError {
    /// A required field is absent.
    #[error("{0} is missing")]
    Missing(String),
    /// A value the predictor does not handle.
    #[error("{0}")]
    Unsupported(String),
    /// A value that is out of range or inconsistent.
    #[error("{0}")]
    Invalid(String),
    /// A profile or job file that does not parse.
    #[error("{0}")]
    Parse(String),
}

/// A prediction for one GPU of the job.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Whole process on the GPU, as NVML reports it (context included).
    pub peak_bytes: u64,
    /// Caching allocator's reserved peak.
    pub reserved_bytes: u64,
    /// Peak of requested (allocated) bytes.
    pub allocated_bytes: u64,
    /// Where the peak comes from; sums to `peak_bytes`.
    pub breakdown: MemoryBreakdown,
    /// Micro-batch per GPU the prediction is for.
    pub micro_batch: u32,
    /// Gradient-accumulation steps.
    pub grad_accum: u32,
    /// Parameter count of the model (0 for profiles).
    pub parameters: u64,
    /// GPU profile used.
    pub gpu: &'static str,
}

/// The inputs of a prediction besides the model: the parts of a TrainingJob
/// spec that matter.
#[derive(Clone, Debug, PartialEq)]
pub struct JobShape {
    /// GPUs of the job (ZeRO shards over them).
    pub gpus: u32,
    /// Samples per optimizer step over all GPUs.
    pub global_batch: u32,
    /// Micro-batch per GPU.
    pub micro_batch: u32,
}

impl JobShape {
    /// Gradient accumulation, `global / (micro * gpus)`, which must be whole.
    pub fn grad_accum(&self) -> Result<u32, PredictError> {
        let per_step = u64::from(self.micro_batch) * u64::from(self.gpus);
        if self.micro_batch == 0 || self.gpus == 0 {
            return Err(PredictError::Invalid(
                "batch.micro and gpus must be at least 1".into(),
            ));
        }
        if u64::from(self.global_batch) % per_step != 0 {
            return Err(PredictError::Invalid(format!(
                "batch.global ({}) must be divisible by batch.micro * gpus ({per_step})",
                self.global_batch
            )));
        }
        Ok((u64::from(self.global_batch) / per_step) as u32)
    }
}

/// Resolves the model description of an analytic spec.
pub fn resolve_arch(model: &ModelSpec) -> Result<Arch, PredictError> {
    let set = [
        model.transformer.is_some(),
        model.hugging_face.is_some(),
        model.mlp.is_some(),
        model.profile.is_some(),
        model.auto.is_some(),
    ];
    match set.iter().filter(|x| **x).count() {
        0 => {
            return Err(PredictError::Missing(
                "model.transformer, model.huggingFace, model.mlp, model.profile or model.auto"
                    .into(),
            ));
        }
        1 => {}
        _ => {
            return Err(PredictError::Invalid(
                "exactly one of model.transformer, model.huggingFace, model.mlp, model.profile or model.auto must be set".into(),
            ));
        }
    }
    if let Some(t) = &model.transformer {
        return Ok(Arch::Transformer(TransformerArch::from_spec(t)?));
    }
    if let Some(h) = &model.hugging_face {
        return Ok(Arch::Transformer(hf::arch_from_hugging_face(h)?));
    }
    if let Some(m) = &model.mlp {
        if m.layers == 0 || m.hidden == 0 {
            return Err(PredictError::Invalid(
                "mlp.layers and mlp.hidden must be at least 1".into(),
            ));
        }
        return Ok(Arch::Mlp {
            layers: u64::from(m.layers),
            hidden: u64::from(m.hidden),
        });
    }
    Err(PredictError::Unsupported(
        "model.profile and model.auto are predicted from a captured profile: call predict_from_profile with its text".into(),
    ))
}

/// Predicts the peak of an analytic model (`transformer`, `huggingFace` or
/// `mlp`) at the job's micro-batch on `gpu`.
pub fn predict_model(
    model: &ModelSpec,
    job: &JobShape,
    gpu: &'static GpuProfile,
) -> Result<Prediction, PredictError> {
    predict_model_with(model, job, gpu, &CachingAllocatorModel::PYTORCH)
}

/// [`predict_model`] with a chosen allocator model.
pub fn predict_model_with(
    model: &ModelSpec,
    job: &JobShape,
    gpu: &'static GpuProfile,
    alloc: &dyn AllocatorModel,
) -> Result<Prediction, PredictError> {
    guarded(|| predict_arch(resolve_arch(model)?, model, job, gpu, alloc))
}

/// Runs a prediction, turning an arithmetic overflow (sizes whose products
/// pass 2^64 bytes; the vramfit crate is built with overflow checks in every
/// profile) into an `Invalid` error instead of a panic or a wrapped size.
fn guarded(
    predict: impl FnOnce() -> Result<Prediction, PredictError>,
) -> Result<Prediction, PredictError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(predict)).unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(PredictError::Invalid(format!(
            "the model's sizes are too large to predict ({detail}): check the layer, width, vocabulary, sequence and batch sizes"
        )))
    })
}

/// [`predict_model`] for a `huggingFace` description of the repository's own
/// reference transformer (scripts/gpu/calibrate_predictor.py builds its
/// modules from the config's shapes, not from `transformers`): the library's
/// implementation details (sequence/hf.rs) are left out.
pub fn predict_reference_model(
    model: &ModelSpec,
    job: &JobShape,
    gpu: &'static GpuProfile,
) -> Result<Prediction, PredictError> {
    let mut arch = resolve_arch(model)?;
    if let Arch::Transformer(t) = &mut arch {
        t.library = None;
    }
    predict_arch(arch, model, job, gpu, &CachingAllocatorModel::PYTORCH)
}

fn run_shape(
    model: &ModelSpec,
    job: &JobShape,
    gpu: &'static GpuProfile,
) -> Result<RunShape, PredictError> {
    let grad_accum = job.grad_accum()?;
    if model.zero_stage > 3 {
        return Err(PredictError::Invalid(format!(
            "model.zeroStage {} is out of range 0..3",
            model.zero_stage
        )));
    }
    Ok(RunShape {
        micro_batch: u64::from(job.micro_batch),
        grad_accum: u64::from(grad_accum),
        precision: model.precision,
        optimizer: model.optimizer,
        checkpointing: model.gradient_checkpointing,
        attention: model.attention,
        zero_stage: model.zero_stage,
        gpus: u64::from(job.gpus),
        cublas_workspace: gpu.cublas_workspace_bytes,
        reduce: Some(gpu.reduce),
    })
}

/// The allocation sequence the analytic model generates for `model` and
/// `job` on `gpu`, as a `vramfit.profile/v1` document (docs/profile-format.md):
/// to inspect it or compare it with a captured profile. FSDP (ZeRO stage 2
/// and 3 on several GPUs) puts buffers on streams the format cannot express
/// and is refused.
pub fn generated_profile(
    model: &ModelSpec,
    job: &JobShape,
    gpu: &'static GpuProfile,
) -> Result<serde_json::Value, PredictError> {
    let arch = resolve_arch(model)?;
    let run = run_shape(model, job, gpu)?;
    if run.zero_stage >= 2 && run.gpus > 1 {
        return Err(PredictError::Unsupported(
            "--events-out: FSDP's stream buffers cannot be written as a profile".into(),
        ));
    }
    let events = training_events(&arch, &run);
    Ok(profile_document(
        &events,
        job.micro_batch,
        run.grad_accum,
        "vramfit predict --events-out (the analytic model's sequence)",
    ))
}

/// The sequence a captured profile replays on `gpu` at the job's micro-batch
/// (its events with the GPU's cuBLAS and cuDNN workspaces and the reduction
/// kernel's staging in place), as a `vramfit.profile/v1` document whose
/// replay alone gives the same prediction.
pub fn replayed_profile(
    profile_text: &str,
    job: &JobShape,
    gpu: &'static GpuProfile,
) -> Result<serde_json::Value, PredictError> {
    let prof = profile::parse_profile(profile_text)?;
    let events = profile::profile_events(&prof, job.micro_batch, gpu)?;
    Ok(profile_document(
        &events,
        job.micro_batch,
        u64::from(job.grad_accum()?),
        "vramfit predict --events-out (a captured profile as replayed)",
    ))
}

/// Writes `events` as a `vramfit.profile/v1` document: allocations numbered
/// in the order they happen, as the format counts them.
fn profile_document(
    events: &[sequence::TensorEvent],
    micro_batch: u32,
    grad_accum: u64,
    source: &str,
) -> serde_json::Value {
    let mut sizes: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            sequence::TensorEvent::Alloc { bytes, .. } => Some(*bytes),
            sequence::TensorEvent::Free { .. } => None,
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    // an id's position among the allocations (a freed id may be reused)
    let mut order = std::collections::HashMap::new();
    let mut allocs = 0i64;
    let coded: Vec<i64> = events
        .iter()
        .map(|e| match e {
            sequence::TensorEvent::Alloc { id, bytes, .. } => {
                order.insert(*id, allocs);
                allocs += 1;
                sizes.binary_search(bytes).expect("a listed size") as i64
            }
            sequence::TensorEvent::Free { id } => -order[id] - 1,
        })
        .collect();
    serde_json::json!({
        "format": "vramfit.profile/v1",
        "microBatch": micro_batch,
        "gradAccum": grad_accum,
        "sizes": sizes,
        "events": coded,
        "source": source,
    })
}

fn predict_arch(
    arch: Arch,
    model: &ModelSpec,
    job: &JobShape,
    gpu: &'static GpuProfile,
    alloc: &dyn AllocatorModel,
) -> Result<Prediction, PredictError> {
    let grad_accum = job.grad_accum()?;
    let run = run_shape(model, job, gpu)?;
    let events = training_events(&arch, &run);
    let mut outcome = alloc.replay(&events)?;
    // The loss's blocks are the largest requests of a step; whether the
    // second step's loss finds them in the cache again is the replay's
    // answer for a library model, and one more block for the generic
    // descriptions ([`loss_block_margin`]).
    // That block is in the default stream's pool; blocks cached then for
    // other streams (FSDP's all-gather and reduce-scatter buffers) cannot
    // hold it, so they come on top.
    let slack = loss_block_margin(&arch, job.micro_batch, job.gpus)
        + outcome.idle_other_streams_at_allocated_peak;
    if outcome.allocated_peak + slack > outcome.reserved_peak {
        outcome.reserved_peak = round_segment(outcome.allocated_peak + slack);
    }
    let margin = layout_margin(&arch, outcome.reserved_peak);
    let mut p = assemble(outcome, gpu, job, grad_accum, margin);
    p.parameters = model.parameters.unwrap_or_else(|| arch.parameter_count());
    if let Some(declared) = model.parameters {
        // An override scales the parameter-proportional parts.
        let derived = arch.parameter_count().max(1);
        if declared != derived {
            let scale = |v: u64| (v as f64 * declared as f64 / derived as f64) as u64;
            let b = &mut p.breakdown;
            let before = b.parameters + b.gradients + b.optimizer;
            b.parameters = scale(b.parameters);
            b.gradients = scale(b.gradients);
            b.optimizer = scale(b.optimizer);
            let after = b.parameters + b.gradients + b.optimizer;
            p.reserved_bytes = (p.reserved_bytes + after).saturating_sub(before);
            p.peak_bytes = p.reserved_bytes + b.context;
        }
    }
    Ok(p)
}

/// The loss block kept reserved beyond the replay's peak. A model built by
/// a library gets none: its replayed sequence is the library's own, and
/// whether the second step's loss reuses the first step's loss segments is
/// the replay's answer (the second fresh set of 2026-12-05, predicted before
/// it ran with the block, had p90 8.2 %; 1.8 % without it). The generic
/// `transformer` description on one GPU gets none either: its sequence
/// replays to the H200's 40 single-GPU rows (data/calibration/h200.jsonl)
/// at median 0.1 %, p90 1.8 %, max -2.5 % without the block, where the block
/// made them median 0.6 %, p90 5.2 %, max +15.9 %. On several GPUs, whose
/// sequences are coarser (data/calibration/h200x2-zero.jsonl: two rows 7 %
/// under without it), it keeps one block of the loss's largest tensor:
/// tokens x vocab of fp32 logits (the repository's reference transformer
/// upcasts them). The `mlp` description keeps batch x width of fp32.
fn loss_block_margin(arch: &Arch, micro_batch: u32, gpus: u32) -> u64 {
    let b = u64::from(micro_batch);
    match arch {
        Arch::Transformer(t) if t.library.is_some() || gpus <= 1 => 0,
        Arch::Transformer(t) => b * t.seq_len * t.vocab * 4,
        Arch::Mlp { hidden, .. } => b * hidden * 4,
    }
}

/// The share of the replayed reserve that an analytic prediction keeps on
/// top of it ([`layout_margin`]), in parts per thousand.
pub const LAYOUT_MARGIN_PERMILLE: u64 = 20;

/// Memory kept beyond the replayed reserved peak of a model a library
/// builds (`huggingFace`): 2 % of it, rounded up to the large segments'
/// rounding.
///
/// The generated sequence has every tensor of the library's step, so the
/// allocated peak is exact to a fraction of a percent, but where a later
/// step's tensors land among the free blocks the earlier steps left is a
/// matter of a few MiB: on the GPU the optimizer's state, a micro-step's
/// checkpointed inputs or a decoder's hidden states sometimes land in a
/// freed loss segment that the replay leaves free, and that step's loss
/// then takes one more segment (docs/benchmarks/library-models.md, the
/// tenth set's section). Over the fourteen measured sets' 265 single-GPU
/// Hugging Face rows the replay alone was under the GPU by more than 3 % on
/// 13 rows and by more than 5 % on 5 (each one loss segment apart, their
/// allocated peaks exact); with 2 % kept, 5 and 1, at a median of 2 % over.
/// A budget below the peak ends in an out-of-memory restart, one above it in
/// memory the packer cannot give to another job: the margin trades the
/// second for the first. A captured profile's replay records the library's
/// own order of allocations and keeps none (351 rows, none under by 5 %);
/// the generic descriptions keep none either (the reference modules' 40
/// runs: median 0.6 %, none under by 5 %; on several GPUs they keep a loss
/// block, [`loss_block_margin`]).
fn layout_margin(arch: &Arch, reserved: u64) -> u64 {
    match arch {
        Arch::Transformer(t) if t.library.is_some() => {
            round_segment(reserved * LAYOUT_MARGIN_PERMILLE / 1000)
        }
        _ => 0,
    }
}

/// Reserved memory grows in steps of the large-segment rounding (2 MiB).
fn round_segment(bytes: u64) -> u64 {
    bytes.div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
}

/// Memory of the process outside the caching allocator: the CUDA context and
/// libraries, plus NCCL's when the job spans more than one GPU.
pub fn context_bytes(gpu: &GpuProfile, gpus: u32) -> u64 {
    gpu.context_bytes + if gpus > 1 { gpu.nccl_bytes } else { 0 }
}

/// Turns a replay into a prediction: context and `margin` on top, rounding
/// and fragmentation as the allocator overhead.
fn assemble(
    o: ReplayOutcome,
    gpu: &'static GpuProfile,
    job: &JobShape,
    grad_accum: u32,
    margin: u64,
) -> Prediction {
    let micro_batch = job.micro_batch;
    let context = context_bytes(gpu, job.gpus);
    let live = o.live_at_peak;
    let breakdown = MemoryBreakdown {
        parameters: live.parameters,
        gradients: live.gradients,
        optimizer: live.optimizer,
        activations: live.activations,
        workspace: live.workspace,
        context,
        allocator_overhead: o.reserved_peak.saturating_sub(live.total()),
        persistent: live.persistent,
        margin,
    };
    Prediction {
        peak_bytes: o.reserved_peak + margin + context,
        reserved_bytes: o.reserved_peak + margin,
        allocated_bytes: o.allocated_peak,
        breakdown,
        micro_batch,
        grad_accum,
        parameters: 0,
        gpu: gpu.name,
    }
}

/// Predicts from a captured allocation profile (the ConfigMap's text) at the
/// job's micro-batch on `gpu`.
pub fn predict_from_profile(
    profile_text: &str,
    job: &JobShape,
    gpu: &'static GpuProfile,
) -> Result<Prediction, PredictError> {
    guarded(|| {
        let grad_accum = job.grad_accum()?;
        let prof = profile::parse_profile(profile_text)?;
        let events = profile::profile_events(&prof, job.micro_batch, gpu)?;
        let outcome = CachingAllocatorModel::PYTORCH.replay(&events)?;
        Ok(assemble(outcome, gpu, job, grad_accum, 0))
    })
}
