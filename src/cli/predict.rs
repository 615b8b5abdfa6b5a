//! `vramfit predict`: a job's peak GPU memory with its breakdown.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use super::{OutputFormat, read_text};
use crate::predict::{GPU_PROFILES, default_gpu, gpu_profile, job, output};
use crate::quantity::{human_bytes, parse_quantity};

/// Arguments of `vramfit predict`.
#[derive(Args, Debug)]
pub struct PredictArgs {
    /// The TrainingJob manifest (YAML or JSON; `-` reads standard input).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// GPU profile (H200, H100-80GB, A100-80GB, A100-40GB, L40S, L4, T4).
    #[arg(long)]
    pub gpu: Option<String>,
    /// The allocation profile of a profile-based job (the ConfigMap's value).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Predict for this micro-batch instead of `spec.batch.micro`.
    #[arg(long, conflicts_with = "fit")]
    pub micro: Option<u32>,
    /// Choose the largest micro-batch whose prediction plus the job's
    /// headroom fits this much memory (for example `40Gi`), as the controller
    /// does for `batch.autoMicro`, and print it with its prediction.
    #[arg(long)]
    pub fit: Option<String>,
    /// Also write the allocation sequence the prediction replays as a
    /// `vramfit.profile/v1` file (to inspect it or compare it with a capture
    /// or a recorded run): the analytic model's, or for a profile-based job
    /// the profile's with the GPU's workspaces and staging in place.
    #[arg(long, conflicts_with = "fit")]
    pub events_out: Option<PathBuf>,
    /// List every micro-batch the job may run at (the global batch kept)
    /// with its prediction, budget and step time relative to
    /// `spec.batch.micro` (measured on the H200 for the model's family).
    #[arg(long, conflicts_with_all = ["fit", "micro", "events_out"])]
    pub shapes: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// Runs `vramfit predict` and returns what it prints.
pub fn run(args: &PredictArgs) -> anyhow::Result<String> {
    let gpu = match args.gpu.as_deref() {
        None => default_gpu(),
        Some(name) => gpu_profile(name).with_context(|| {
            let known: Vec<&str> = GPU_PROFILES.iter().map(|g| g.name).collect();
            format!("unknown GPU {name:?} (known: {})", known.join(", "))
        })?,
    };
    let text = read_text(&args.file)?;
    let job = job::parse_job(&text)?;
    match predicted(args, &job, gpu) {
        Ok(out) => Ok(out),
        // The controller runs a job with a request without a prediction:
        // say what it will use, and why there is no prediction beside it.
        Err(e) if args.fit.is_none() && args.events_out.is_none() => {
            match job.memory.as_ref().and_then(|m| m.request.as_deref()) {
                Some(request) => request_only(args.output, request, &format!("{e:#}")),
                None => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// What `predict` prints for a job that states `memory.request` and whose
/// model cannot be predicted: the budget the controller uses, with the reason.
fn request_only(output: OutputFormat, request: &str, why: &str) -> anyhow::Result<String> {
    let bytes = parse_quantity(request, 1)
        .filter(|b| *b > 0)
        .with_context(|| format!("spec.memory.request {request:?} is not a positive quantity"))?;
    Ok(match output {
        OutputFormat::Json => serde_json::to_string_pretty(&serde_json::json!({
            "budgetBytes": bytes,
            "budget": human_bytes(bytes),
            "source": "request",
            "predicted": false,
            "reason": why,
        }))?,
        OutputFormat::Table => format!(
            "budget {} per GPU from spec.memory.request (no prediction: {why})",
            human_bytes(bytes)
        ),
    })
}

fn predicted(
    args: &PredictArgs,
    job: &job::JobInput,
    gpu: &'static crate::predict::GpuProfile,
) -> anyhow::Result<String> {
    let job = job.clone();
    let profile = args.profile.as_deref().map(read_text).transpose()?;
    if job.model.profile.is_some() && profile.is_none() {
        anyhow::bail!(
            "spec.model.profile: pass the profile file with --profile (the CLI does not read ConfigMaps)"
        );
    }
    if job.model.auto.is_some() && profile.is_none() {
        anyhow::bail!(
            "spec.model.auto: the controller captures this job's profile from its own pod on a CPU \
             (phase Profiling); to predict here, capture it yourself (your script with \
             VRAMFIT_PHASE=profile and VRAMFIT_PROFILE_OUT=FILE, or python -m vramfit.profile) and \
             pass --profile FILE (docs/profile-format.md)"
        );
    }
    if args.shapes {
        return shapes(args, &job, gpu, profile.as_deref());
    }
    let prediction = if let Some(fit) = &args.fit {
        let capacity = parse_quantity(fit, 1)
            .filter(|b| *b > 0)
            .with_context(|| format!("--fit {fit:?} is not a positive quantity (e.g. 40Gi)"))?;
        let p = job::auto_micro_batch(&job, gpu, capacity, job.headroom(), profile.as_deref())?;
        if args.output == OutputFormat::Table {
            // The choice first, then the usual table.
            let budget = (p.peak_bytes as f64 * (1.0 + job.headroom())).ceil() as u64;
            return Ok(format!(
                "micro-batch {} (grad accum {}) fits {fit}: predicted {}, with {:.0}% headroom {}\n{}",
                p.micro_batch,
                p.grad_accum,
                human_bytes(p.peak_bytes),
                100.0 * job.headroom(),
                human_bytes(budget),
                output::prediction_table(&p)
            ));
        }
        p
    } else {
        let micro = args.micro.unwrap_or(job.batch.micro);
        if let Some(path) = &args.events_out {
            let shape = crate::predict::JobShape {
                micro_batch: micro,
                ..job.shape()
            };
            // A profile-based job writes its profile as replayed on the GPU.
            let doc = match profile.as_deref() {
                Some(text) => crate::predict::replayed_profile(text, &shape, gpu)?,
                None => crate::predict::generated_profile(&job.model, &shape, gpu)?,
            };
            std::fs::write(path, serde_json::to_string(&doc)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        job::predict_job_at(&job, micro, gpu, profile.as_deref())?
    };
    // A need larger than the GPU says so, with what would make it fit.
    let need = (prediction.peak_bytes as f64 * (1.0 + job.headroom())).ceil() as u64;
    let advice = (need > gpu.capacity_bytes && job.model.profile.is_none()).then(|| {
        let shape = crate::predict::JobShape {
            micro_batch: prediction.micro_batch,
            ..job.shape()
        };
        let options = crate::predict::fit::fit_options(
            &job.model,
            &shape,
            gpu,
            gpu.capacity_bytes,
            job.headroom(),
        );
        format!(
            "needs {} per GPU with {:.0}% headroom, more than a {} has ({}); {}",
            human_bytes(need),
            100.0 * job.headroom(),
            gpu.name,
            human_bytes(gpu.capacity_bytes),
            crate::predict::fit::fit_advice(&options, gpu.capacity_bytes, job.headroom(), gpu.name)
        )
    });
    Ok(match args.output {
        OutputFormat::Json => {
            let mut doc = output::prediction_json(&prediction);
            if let serde_json::Value::Object(map) = &mut doc {
                map.insert("fitsGpu".into(), (advice.is_none()).into());
                if let Some(advice) = &advice {
                    map.insert("advice".into(), advice.clone().into());
                }
            }
            serde_json::to_string_pretty(&doc)?
        }
        OutputFormat::Table => match &advice {
            Some(advice) => format!(
                "{}
warning: {advice}",
                output::prediction_table(&prediction)
            ),
            None => output::prediction_table(&prediction),
        },
    })
}

#[cfg(test)]
#[path = "predict_tests.rs"]
mod tests;

/// `--shapes`: every shape of the job, with the step-time curve it used.
fn shapes(
    args: &PredictArgs,
    job: &job::JobInput,
    gpu: &'static crate::predict::GpuProfile,
    profile: Option<&str>,
) -> anyhow::Result<String> {
    let (curve, source) = crate::sim::kinds::curve_for(&job.model, job.batch.micro);
    let rows = crate::predict::shapes::shapes(job, gpu, profile, &curve)?;
    Ok(match args.output {
        OutputFormat::Json => serde_json::to_string_pretty(&serde_json::json!({
            "gpu": gpu.name,
            "globalBatch": job.batch.global,
            "preferredMicroBatch": job.batch.micro,
            "stepTimes": source,
            "shapes": rows,
        }))?,
        OutputFormat::Table => {
            let mut out = format!(
                "global batch {} on {}; step time relative to micro-batch {} ({source})\n",
                job.batch.global, gpu.name, job.batch.micro
            );
            out.push_str(&format!(
                "{:>6} {:>6} {:>12} {:>12} {:>5} {:>10}\n",
                "MICRO", "ACCUM", "PREDICTED", "BUDGET", "FITS", "STEP TIME"
            ));
            for r in &rows {
                out.push_str(&format!(
                    "{:>6} {:>6} {:>12} {:>12} {:>5} {:>9.2}x\n",
                    r.micro_batch,
                    r.grad_accum,
                    human_bytes(r.predicted_bytes),
                    human_bytes(r.budget_bytes),
                    if r.fits_gpu { "yes" } else { "no" },
                    r.relative_step_time
                ));
            }
            out
        }
    })
}
