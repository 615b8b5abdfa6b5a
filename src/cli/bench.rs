//! `vramfit bench`: the benchmarks whose output shapes DESIGN.md fixes.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{OutputFormat, read_text};
use crate::place::PolicyKind;
use crate::place::bench::{
    PackBenchOptions, ScaleOptions, parse_vm_hwm_bytes, run_pack_bench, run_pack_bench_seeds,
    run_scale_bench,
};
use crate::predict::{bench as predict_bench, gpu_profile};

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Pack an openb trace (or a synthetic cluster) with a placement policy.
    Pack(PackArgs),
    /// Compare predictions with measured peaks.
    Predict(PredictBenchArgs),
}

/// Arguments of `vramfit bench pack`.
#[derive(Args, Debug)]
pub struct PackArgs {
    /// Node list (openb `sn,cpu_milli,memory_mib,gpu,model`).
    #[arg(long, required_unless_present = "synthetic")]
    pub nodes: Option<PathBuf>,
    /// Pod list (openb format).
    #[arg(long, required_unless_present = "synthetic")]
    pub pods: Option<PathBuf>,
    /// Submitted GPU requests as a multiple of capacity.
    #[arg(long, default_value_t = 1.3)]
    pub tune: f64,
    /// Seed of inflation, shuffle and random choices.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Run seeds FIRST..LAST (inclusive) and report the mean, e.g. `42..51`.
    #[arg(long, value_parser = parse_seed_range)]
    pub seeds: Option<(u64, u64)>,
    /// random, best-fit, fgd or vramfit.
    #[arg(long, default_value = "vramfit")]
    pub policy: PolicyKind,
    /// Synthetic cluster `NODESxGPUS` (e.g. `5000x8`) instead of a trace.
    #[arg(long, conflicts_with_all = ["nodes", "pods"])]
    pub synthetic: Option<String>,
    /// Jobs of the synthetic run.
    #[arg(long, default_value_t = 50_000)]
    pub jobs: usize,
    /// Output format (json only).
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// Arguments of `vramfit bench predict`.
#[derive(Args, Debug)]
pub struct PredictBenchArgs {
    /// Measured peaks (JSON lines, as scripts/gpu/calibrate_predictor.py writes).
    #[arg(long)]
    pub measured: PathBuf,
    /// GPU profile to predict for (default: each line's own GPU, else H200).
    #[arg(long)]
    pub gpu: Option<String>,
    /// Folder of captured profiles, `NAME.profile.json` per measured line
    /// (`python -m vramfit.profile`), for the lines without an analytic model.
    #[arg(long)]
    pub profiles: Option<PathBuf>,
    /// Predict every line that has a profile in `--profiles` from it, not
    /// only the lines without an analytic model.
    #[arg(long, requires = "profiles")]
    pub prefer_profiles: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: OutputFormat,
}

fn parse_seed_range(text: &str) -> Result<(u64, u64), String> {
    let (first, last) = text
        .split_once("..")
        .ok_or("expected FIRST..LAST, e.g. 42..51")?;
    let first: u64 = first.trim().parse().map_err(|e| format!("{first}: {e}"))?;
    let last: u64 = last.trim().parse().map_err(|e| format!("{last}: {e}"))?;
    if last < first {
        return Err(format!("empty seed range {text}"));
    }
    Ok((first, last))
}

fn parse_synthetic(text: &str) -> anyhow::Result<(usize, usize)> {
    let (nodes, gpus) = text
        .split_once(['x', 'X'])
        .ok_or_else(|| anyhow::anyhow!("--synthetic expects NODESxGPUS, e.g. 5000x8"))?;
    Ok((nodes.trim().parse()?, gpus.trim().parse()?))
}

/// Runs a benchmark and returns what it prints.
pub fn run(command: &BenchCommand) -> anyhow::Result<String> {
    match command {
        BenchCommand::Pack(args) => {
            if let Some(shape) = &args.synthetic {
                let (nodes, gpus_per_node) = parse_synthetic(shape)?;
                let mut report = run_scale_bench(&ScaleOptions {
                    nodes,
                    gpus_per_node,
                    jobs: args.jobs,
                    seed: args.seed,
                    policy: args.policy,
                })?;
                // The engine is pure; the process's peak memory is read here.
                report.peak_rss_bytes = std::fs::read_to_string("/proc/self/status")
                    .ok()
                    .and_then(|status| parse_vm_hwm_bytes(&status));
                return Ok(serde_json::to_string_pretty(&report)?);
            }
            let (Some(nodes), Some(pods)) = (&args.nodes, &args.pods) else {
                anyhow::bail!("--nodes and --pods are required without --synthetic");
            };
            let nodes = read_text(nodes)?;
            let pods = read_text(pods)?;
            let opts = PackBenchOptions {
                tune: args.tune,
                seed: args.seed,
                policy: args.policy,
            };
            Ok(match args.seeds {
                Some((first, last)) => serde_json::to_string_pretty(&run_pack_bench_seeds(
                    &nodes,
                    &pods,
                    &opts,
                    first..=last,
                )?)?,
                None => serde_json::to_string_pretty(&run_pack_bench(&nodes, &pods, &opts)?)?,
            })
        }
        BenchCommand::Predict(args) => {
            let gpu = match args.gpu.as_deref() {
                None => None,
                Some(name) => {
                    Some(gpu_profile(name).ok_or_else(|| anyhow::anyhow!("unknown GPU {name:?}"))?)
                }
            };
            let dir = args.profiles.clone();
            let profile_for = move |name: &str| -> Option<String> {
                let path = dir.as_ref()?.join(format!("{name}.profile.json"));
                std::fs::read_to_string(path).ok()
            };
            let report = predict_bench::bench_predict_with_profiles(
                &read_text(&args.measured)?,
                gpu,
                &profile_for,
                args.prefer_profiles,
            )?;
            Ok(match args.output {
                OutputFormat::Json => {
                    serde_json::to_string_pretty(&predict_bench::bench_json(&report))?
                }
                OutputFormat::Table => predict_bench::bench_table(&report),
            })
        }
    }
}
