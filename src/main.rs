//! The `vramfit` command: the controller, the predictor, the benchmarks and the
//! allocator tools in one binary.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use vramfit::cli;

/// vramfit: GPU-memory-aware placement of training jobs on shared GPUs.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the TrainingJob controller.
    Controller(cli::controller::ControllerArgs),
    /// Predict a TrainingJob's peak GPU memory.
    Predict(cli::predict::PredictArgs),
    /// Benchmarks (placement, prediction).
    #[command(subcommand)]
    Bench(cli::bench::BenchCommand),
    /// Run a TrainingJob on this machine (`run --local JOB.yaml -- python train.py`),
    /// with the controller's OOM back-off.
    Run(cli::run::RunArgs),
    /// Caching-allocator tools.
    #[command(subcommand)]
    Alloc(cli::alloc::AllocCommand),
    /// The cluster at a glance: GPUs, budgets, measured memory, waiting jobs, OOM retries.
    Status(cli::status::StatusArgs),
    /// Write the CRD manifests.
    Crdgen {
        /// Output folder.
        #[arg(long, default_value = "crds")]
        out: PathBuf,
        /// The Helm chart's copy, written too when the chart folder exists.
        #[arg(long, default_value = "charts/vramfit/crds")]
        chart_out: PathBuf,
    },
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    let output = match cli.command {
        Command::Controller(args) => return run_controller(args).map(|()| Default::default()),
        Command::Run(args) => return cli::run::main(&args),
        Command::Status(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            return runtime
                .block_on(cli::status::run(&args))
                .map(|()| Default::default());
        }
        Command::Predict(args) => cli::predict::run(&args)?,
        Command::Bench(command) => cli::bench::run(&command)?,
        Command::Alloc(command) => cli::alloc::run(&command)?,
        Command::Crdgen { out, chart_out } => {
            vramfit::crdgen::write_crds(&out)?;
            if chart_out.parent().is_some_and(|chart| chart.is_dir()) {
                vramfit::crdgen::write_crds(&chart_out)?;
            }
            return Ok(Default::default());
        }
    };
    println!("{}", output.trim_end());
    Ok(Default::default())
}

fn run_controller(args: cli::controller::ControllerArgs) -> anyhow::Result<()> {
    cli::logging::init(args.log_format)?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let client = args.kube.client().await?;
        vramfit::controller::run(client, args.options()).await?;
        Ok(())
    })
}
