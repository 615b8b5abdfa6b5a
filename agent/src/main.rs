//! `vramfit-agent`: the node agent daemon, probe a GPU, benchmark the allocator.

mod run;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use vramfit_agent::bench::{BenchRow, run_mix_after, size_mix};

#[derive(Parser)]
#[command(name = "vramfit-agent", version, about = "vramfit node agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Json,
    Text,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node agent: report the node's GPUs in its GpuNode status and
    /// stop pods over their budget (docs/agent.md).
    Run(Box<run::RunArgs>),
    /// Fill the free GPU memory with a pattern, read it back and time copies.
    Probe {
        /// Device ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// GiB left untouched for the driver and other processes.
        #[arg(long, default_value_t = 2.0)]
        margin_gib: f64,
        /// Test at most this many GiB (default: all free memory but the margin).
        #[arg(long)]
        max_test_gib: Option<f64>,
        /// Expected copy bandwidth in GB/s (default: from the model name).
        #[arg(long)]
        expected_gbps: Option<f64>,
        #[arg(short, long, value_enum, default_value_t = Output::Json)]
        output: Output,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Many simulated agents against one API server: the requests they send
    /// per node per minute, from the API server's own counters
    /// (docs/benchmarks/agent-fleet.md).
    #[cfg(feature = "sim")]
    Agents(run::FleetArgs),
    /// Without the `sim` feature: refused, saying which build has it.
    #[cfg(not(feature = "sim"))]
    #[command(hide = true, disable_help_flag = true)]
    Agents {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// Allocation/free latency and throughput of the caching allocator
    /// (both policies) against raw cuMemAlloc/cuMemFree on one size mix.
    Alloc {
        /// Events in the mix.
        #[arg(long, default_value_t = 20_000)]
        ops: usize,
        /// Seed of the mix.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Passes over the mix (the first is a warm-up).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Passes for raw cuMemAlloc (slow), same meaning.
        #[arg(long, default_value_t = 2)]
        raw_rounds: usize,
        #[arg(short, long, value_enum, default_value_t = Output::Json)]
        output: Output,
    },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BenchReport {
    ops: usize,
    seed: u64,
    backend: &'static str,
    rows: Vec<BenchRow>,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run::run(*args)?,
        Command::Probe {
            device,
            margin_gib,
            max_test_gib,
            expected_gbps,
            output,
        } => {
            let result = probe(device, margin_gib, max_test_gib, expected_gbps)?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&result)?),
                Output::Text => println!(
                    "{}: {}",
                    if result.ok { "ok" } else { "FAIL" },
                    result.message
                ),
            }
            if !result.ok {
                std::process::exit(2);
            }
        }
        #[cfg(feature = "sim")]
        Command::Bench {
            what: BenchCommand::Agents(args),
        } => run::bench_agents(args)?,
        #[cfg(not(feature = "sim"))]
        Command::Bench {
            what: BenchCommand::Agents { .. },
        } => Err(vramfit_agent::AgentError::NoSim {
            what: "bench agents",
        })?,
        Command::Bench {
            what:
                BenchCommand::Alloc {
                    ops,
                    seed,
                    rounds,
                    raw_rounds,
                    output,
                },
        } => {
            let mix = size_mix(ops, seed);
            let (backend, rows) = bench_alloc(&mix, rounds, raw_rounds)?;
            let report = BenchReport {
                ops,
                seed,
                backend,
                rows,
            };
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                Output::Text => {
                    for row in &report.rows {
                        println!(
                            "{:<28} alloc p50 {:>8.2} us p99 {:>8.2} us | free p50 {:>8.2} us p99 {:>8.2} us | {:>10.0} ops/s",
                            row.name,
                            row.alloc_p50_us,
                            row.alloc_p99_us,
                            row.free_p50_us,
                            row.free_p99_us,
                            row.ops_per_second
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn probe(
    device: usize,
    margin_gib: f64,
    max_test_gib: Option<f64>,
    expected_gbps: Option<f64>,
) -> Result<vramfit_agent::probe::ProbeResult> {
    use vramfit_agent::cuda::{ProbeOptions, run_probe};
    let gib = |g: f64| (g * (1u64 << 30) as f64) as u64;
    Ok(run_probe(ProbeOptions {
        device,
        safety_margin_bytes: gib(margin_gib),
        max_test_bytes: max_test_gib.map(gib),
        expected_gbps,
        ..Default::default()
    })?)
}

#[cfg(not(feature = "cuda"))]
fn probe(
    _: usize,
    _: f64,
    _: Option<f64>,
    _: Option<f64>,
) -> Result<vramfit_agent::probe::ProbeResult> {
    Err(vramfit_agent::AgentError::NoCuda.into())
}

/// The caching allocators the benchmark runs: the pytorch policy, the
/// vramfit policy on a sequence taken as one that does not repeat (its
/// step plan off), the vramfit policy with the plan, which finds that the
/// passes repeat and serves the later ones from a planned layout (three
/// more passes; the timing includes laying it out and mapping it once), and
/// the same timed only over the passes served from the plan (its steady
/// state). Each row: policy, name, configuration, passes, untimed passes.
fn policy_rows(
    rounds: usize,
) -> Vec<(
    vramfit::alloc::Policy,
    &'static str,
    vramfit::alloc::AllocatorConfig,
    usize,
    usize,
)> {
    use vramfit::alloc::{AllocatorConfig, Policy};
    let unplanned = AllocatorConfig {
        disable_step_plan: true,
        ..Default::default()
    };
    vec![
        (
            Policy::Pytorch,
            "caching (pytorch policy)",
            AllocatorConfig::default(),
            rounds,
            1,
        ),
        (
            Policy::Vramfit,
            "caching (vramfit policy)",
            unplanned,
            rounds,
            1,
        ),
        (
            Policy::Vramfit,
            "caching (vramfit policy, step plan)",
            AllocatorConfig::default(),
            rounds + 3,
            1,
        ),
        (
            Policy::Vramfit,
            "caching (vramfit policy, planned passes only)",
            AllocatorConfig::default(),
            rounds + 3,
            3,
        ),
    ]
}

#[cfg(feature = "cuda")]
fn bench_alloc(
    mix: &[vramfit::alloc::AllocEvent],
    rounds: usize,
    raw_rounds: usize,
) -> Result<(&'static str, Vec<BenchRow>)> {
    use cudarc::driver::CudaContext;
    use vramfit::alloc::new_allocator;
    use vramfit_agent::cuda::{CudaDeviceMemory, RawCudaMalloc, require_driver};

    require_driver()?;
    let ctx = CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    let mut rows = Vec::new();
    let mut raw = RawCudaMalloc::new();
    rows.push(run_mix_after(
        "raw cuMemAlloc/cuMemFree",
        &mut raw,
        mix,
        raw_rounds,
        1,
    )?);
    for (policy, name, config, rounds, untimed) in policy_rows(rounds) {
        let backend = CudaDeviceMemory::new(ctx.clone())?;
        let mut allocator = new_allocator(policy, backend, config);
        rows.push(run_mix_after(name, &mut allocator, mix, rounds, untimed)?);
        allocator.empty_cache()?;
    }
    Ok(("cuda", rows))
}

#[cfg(not(feature = "cuda"))]
fn bench_alloc(
    mix: &[vramfit::alloc::AllocEvent],
    rounds: usize,
    _: usize,
) -> Result<(&'static str, Vec<BenchRow>)> {
    use vramfit::alloc::{SimulatedDevice, new_allocator};
    let mut rows = Vec::new();
    for (policy, name, config, rounds, untimed) in policy_rows(rounds) {
        let mut allocator = new_allocator(policy, SimulatedDevice::new(1 << 40), config);
        rows.push(run_mix_after(
            &format!("{name}, simulated"),
            &mut allocator,
            mix,
            rounds,
            untimed,
        )?);
    }
    Ok(("simulated", rows))
}
