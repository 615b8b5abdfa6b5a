//! `vramfit bench`: the benchmarks whose output shapes DESIGN.md fixes.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{OutputFormat, read_text};
use crate::place::PolicyKind;
use crate::place::bench::{
    PackBenchOptions, PackReport, ScaleOptions, ScaleReport, SeedSweepReport, parse_vm_hwm_bytes,
    run_pack_bench, run_pack_bench_seeds, run_scale_bench,
};
use crate::predict::{bench as predict_bench, gpu_profile};

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Pack an openb trace (or a synthetic cluster) with a placement policy.
    Pack(PackArgs),
    /// Compare predictions with measured peaks.
    Predict(PredictBenchArgs),
    /// Simulate a cluster over an openb trace under each policy: exclusive
    /// GPUs, user-guessed limits, vramfit, vramfit with elastic shapes.
    Cluster(ClusterArgs),
}

/// Arguments of `vramfit bench cluster` (the model of the run: src/sim/).
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// Node list (openb `sn,cpu_milli,memory_mib,gpu,model`); every GPU is simulated as an H200.
    #[arg(long)]
    pub nodes: PathBuf,
    /// Pod list (openb format): which jobs, their GPUs and GPU shares.
    #[arg(long)]
    pub pods: PathBuf,
    /// Seed of every draw.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Policies, comma-separated: exclusive, guessed, vramfit, vramfit-elastic (default all).
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<crate::sim::ClusterPolicy>,
    /// Pods submitted as a multiple of the cluster's GPU capacity (the openb
    /// protocol's inflation; 5 gives a run long enough to reach steady state).
    #[arg(long, default_value_t = 5.0)]
    pub tune: f64,
    /// Offered load: the jobs' GPUs x durations per unit of time, over the GPUs
    /// (1.0: one job per GPU keeps every GPU busy on average).
    #[arg(long, default_value_t = 1.5)]
    pub load: f64,
    /// Median work of a job at its preferred shape, hours (log-normal).
    #[arg(long, default_value_t = 2.0)]
    pub median_hours: f64,
    /// Sigma of the log-normal durations.
    #[arg(long, default_value_t = 1.0)]
    pub duration_sigma: f64,
    /// Median of the users' over-request factor (log-normal), guessed policy.
    #[arg(long, default_value_t = 1.5)]
    pub guess_median: f64,
    /// Sigma of the over-request factor.
    #[arg(long, default_value_t = 0.5)]
    pub guess_sigma: f64,
    /// Waiting jobs tried at each event, from the front of the queue.
    #[arg(long, default_value_t = 64)]
    pub window: usize,
    /// Jobs sharing a GPU run as fast as alone (the figures before sharing's
    /// slowdown was measured); by default each runs slower by the sum of the
    /// GPU shares on it, at least 1, times 1.1.
    #[arg(long)]
    pub no_contention: bool,
    /// Jobs share GPUs by memory alone (the figures before compute shares
    /// were counted); by default the jobs on one GPU never ask for more than
    /// its whole compute (each asks for its pod's GPU share).
    #[arg(long)]
    pub no_compute_shares: bool,
    /// The placement policy of the vramfit policies: vramfit (the
    /// controller's), fgd, best-fit or random.
    #[arg(long, default_value = "vramfit")]
    pub packer: PolicyKind,
    /// Step times and peaks per model kind and micro-batch (JSON lines of
    /// scripts/gpu/step_time.py); default: the H200 measurements built in.
    #[arg(long)]
    pub step_times: Option<PathBuf>,
    /// Write plots (SVG) of memory over time and of completion times here.
    #[arg(long)]
    pub plots: Option<PathBuf>,
    /// Output format: json (the shape DESIGN.md fixes) or a table.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: OutputFormat,
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
    /// Output format: json (the shape DESIGN.md fixes) or a table.
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
    /// Folder of captured profiles, `NAME.profile.json` (or gzipped,
    /// `NAME.profile.json.gz`) per measured line (`python -m vramfit.profile`),
    /// for the lines without an analytic model.
    #[arg(long)]
    pub profiles: Option<PathBuf>,
    /// Predict every line that has a profile in `--profiles` from it, not
    /// only the lines without an analytic model.
    #[arg(long, requires = "profiles")]
    pub prefer_profiles: bool,
    /// Score each prediction without its layout margin: the replay of the
    /// sequence alone (docs/predictor.md).
    #[arg(long)]
    pub without_margin: bool,
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
                return Ok(match args.output {
                    OutputFormat::Json => serde_json::to_string_pretty(&report)?,
                    OutputFormat::Table => scale_table(&report),
                });
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
            Ok(match (args.seeds, args.output) {
                (Some((first, last)), output) => {
                    let report = run_pack_bench_seeds(&nodes, &pods, &opts, first..=last)?;
                    match output {
                        OutputFormat::Json => serde_json::to_string_pretty(&report)?,
                        OutputFormat::Table => seeds_table(&report),
                    }
                }
                (None, OutputFormat::Json) => {
                    serde_json::to_string_pretty(&run_pack_bench(&nodes, &pods, &opts)?)?
                }
                (None, OutputFormat::Table) => pack_table(&run_pack_bench(&nodes, &pods, &opts)?),
            })
        }
        BenchCommand::Cluster(args) => cluster(args),
        BenchCommand::Predict(args) => {
            let gpu = match args.gpu.as_deref() {
                None => None,
                Some(name) => {
                    Some(gpu_profile(name).ok_or_else(|| anyhow::anyhow!("unknown GPU {name:?}"))?)
                }
            };
            let dir = args.profiles.clone();
            let profile_for = move |name: &str| captured_profile(dir.as_ref()?, name);
            let mut report = predict_bench::bench_predict_with_profiles(
                &read_text(&args.measured)?,
                gpu,
                &profile_for,
                args.prefer_profiles,
            )?;
            if args.without_margin {
                report.rows = report.rows.iter().map(|r| r.without_margin()).collect();
            }
            Ok(match args.output {
                OutputFormat::Json => {
                    serde_json::to_string_pretty(&predict_bench::bench_json(&report))?
                }
                OutputFormat::Table => predict_bench::bench_table(&report),
            })
        }
    }
}

fn cluster(args: &ClusterArgs) -> anyhow::Result<String> {
    use crate::sim::{
        ClusterOptions, ClusterPolicy, run_cluster_bench, table, workload::WorkloadOptions,
    };
    let kinds = match &args.step_times {
        Some(path) => read_text(path)?,
        None => crate::sim::kinds::H200_STEP_TIMES.to_string(),
    };
    let opts = ClusterOptions {
        workload: WorkloadOptions {
            seed: args.seed,
            tune: args.tune,
            load: args.load,
            median_hours: args.median_hours,
            duration_sigma: args.duration_sigma,
            guess_median: args.guess_median,
            guess_sigma: args.guess_sigma,
        },
        window: args.window,
        contention: !args.no_contention,
        compute_shares: !args.no_compute_shares,
        packer: args.packer,
        policies: if args.policy.is_empty() {
            ClusterPolicy::ALL.to_vec()
        } else {
            args.policy.clone()
        },
        ..ClusterOptions::default()
    };
    let report = run_cluster_bench(
        &read_text(&args.nodes)?,
        &read_text(&args.pods)?,
        &kinds,
        &opts,
        &mut |line| eprintln!("bench cluster: {line}"),
    )
    .map_err(anyhow::Error::msg)?;
    if let Some(dir) = &args.plots {
        let written = crate::sim::plots::write(&report, dir)?;
        for path in written {
            eprintln!("bench cluster: wrote {}", path.display());
        }
    }
    Ok(match args.output {
        OutputFormat::Json => serde_json::to_string_pretty(&report)?,
        OutputFormat::Table => table(&report),
    })
}

/// One `vramfit bench pack` run as a table.
pub fn pack_table(report: &PackReport) -> String {
    let mut out = format!(
        "policy {}, seed {}: {} pods on {} GPUs\n\n",
        report.policy, report.seed, report.pods, report.total_gpus
    );
    out.push_str(&allocation_rows(&report.allocation_percent_at));
    out.push_str(&format!(
        "\nfailed pods          {}\nunallocated GPUs     {}\nplacements/second    {:.0}\n",
        report.failed_pods, report.unallocated_gpus, report.placements_per_second
    ));
    out
}

/// A seed sweep as a table: the means, then one row per seed.
pub fn seeds_table(report: &SeedSweepReport) -> String {
    let (first, last) = (
        report.seeds.first().copied().unwrap_or_default(),
        report.seeds.last().copied().unwrap_or_default(),
    );
    let mut out = format!(
        "policy {}, mean over seeds {first}..{last} ({} runs)\n\n",
        report.policy,
        report.seeds.len()
    );
    out.push_str(&allocation_rows(&report.allocation_percent_at));
    out.push_str(&format!(
        "\nfailed pods          {:.1}\nunallocated GPUs     {:.1}\nplacements/second    {:.0}\n",
        report.failed_pods, report.unallocated_gpus, report.placements_per_second
    ));
    let points: Vec<&String> = report.allocation_percent_at.keys().collect();
    out.push_str("\nSEED");
    for point in &points {
        out.push_str(&format!("  ALLOC@{point:<4}"));
    }
    out.push_str("  FAILED  UNALLOCATED\n");
    for run in &report.per_seed {
        out.push_str(&format!("{:<4}", run.seed));
        for point in &points {
            let value = run
                .allocation_percent_at
                .get(*point)
                .copied()
                .unwrap_or(f64::NAN);
            out.push_str(&format!("  {value:>9.2}%"));
        }
        out.push_str(&format!(
            "  {:>6}  {:>11}\n",
            run.failed_pods, run.unallocated_gpus
        ));
    }
    out
}

/// A synthetic scale run as a table.
pub fn scale_table(report: &ScaleReport) -> String {
    let rss = report.peak_rss_bytes.map_or_else(
        || "-".into(),
        |b| format!("{:.1} MiB", b as f64 / 1048576.0),
    );
    format!(
        "policy {}: {} jobs on {} nodes ({} GPUs)\n\n\
         allocation           {:.2}%\n\
         failed jobs          {}\n\
         seconds              {:.3}\n\
         placements/second    {:.0}\n\
         peak RSS             {rss}\n",
        report.policy,
        report.jobs,
        report.nodes,
        report.gpus,
        report.allocation_percent,
        report.failed_jobs,
        report.seconds,
        report.placements_per_second,
    )
}

fn allocation_rows(points: &std::collections::BTreeMap<String, f64>) -> String {
    let mut out = String::from("ARRIVED  ALLOCATED\n");
    for (arrived, allocated) in points {
        out.push_str(&format!("{:>6}%  {allocated:>8.2}%\n", arrived));
    }
    out
}

#[cfg(test)]
#[path = "bench_tests.rs"]
mod tests;

/// The capture named `name` in `dir`: `NAME.profile.json`, else its gzipped
/// `NAME.profile.json.gz`; `None` when neither is there or readable.
pub(crate) fn captured_profile(dir: &std::path::Path, name: &str) -> Option<String> {
    let plain = dir.join(format!("{name}.profile.json"));
    if let Ok(text) = std::fs::read_to_string(&plain) {
        return Some(text);
    }
    let file = std::fs::File::open(dir.join(format!("{name}.profile.json.gz"))).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text).ok()?;
    Some(text)
}
