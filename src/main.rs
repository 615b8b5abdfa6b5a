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
    /// Write the CRD manifests.
    Crdgen {
        /// Output folder.
        #[arg(long, default_value = "crds")]
        out: PathBuf,
    },
    /// Caching-allocator tools.
    #[command(subcommand)]
    Alloc(cli::alloc::AllocCommand),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crdgen { out } => vramfit::crdgen::write_crds(&out)?,
        Command::Alloc(command) => print!("{}", with_newline(cli::alloc::run(&command)?)),
    }
    Ok(())
}

fn with_newline(mut text: String) -> String {
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}
