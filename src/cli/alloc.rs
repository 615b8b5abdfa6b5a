//! `vramfit alloc replay`: replay a PyTorch memory snapshot through the allocator
//! model.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::OutputFormat;
use crate::alloc::{Policy, ReplayReport, format_size, replay_snapshot_file};

/// Allocator commands.
#[derive(Subcommand, Debug)]
pub enum AllocCommand {
    /// Replay `torch.cuda.memory._dump_snapshot()` output (.pickle or .pickle.gz).
    Replay(ReplayArgs),
}

/// Arguments of `vramfit alloc replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The snapshot file.
    pub snapshot: PathBuf,
    /// Allocator policy: `pytorch` (PyTorch's caching allocator) or `vramfit`.
    #[arg(long, default_value_t = Policy::Pytorch)]
    pub policy: Policy,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// Runs an allocator command and returns what it prints.
pub fn run(command: &AllocCommand) -> anyhow::Result<String> {
    match command {
        AllocCommand::Replay(args) => {
            let report = replay_snapshot_file(&args.snapshot, args.policy)?;
            Ok(match args.output {
                OutputFormat::Json => serde_json::to_string_pretty(&report)?,
                OutputFormat::Table => replay_table(&report),
            })
        }
    }
}

fn replay_table(report: &ReplayReport) -> String {
    format!(
        "peak reserved   {}\npeak allocated  {}\nfragmentation   {:.2}%\n",
        format_size(report.peak_reserved_bytes),
        format_size(report.peak_allocated_bytes),
        report.fragmentation * 100.0
    )
}
