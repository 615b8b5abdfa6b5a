//! `vramfit status`: the cluster at a glance (per node and GPU the capacity,
//! committed budgets and measured memory, the jobs on each GPU, the waiting
//! jobs and the recent OOM retries).

use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::status::{cluster_status, fetch, text};

/// How `vramfit status` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    /// Bars and tables for people.
    #[default]
    Text,
    /// The view model as one JSON object (one per line with `--watch`).
    Json,
}

/// When to colour the text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless NO_COLOR is set.
    #[default]
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Arguments of `vramfit status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// TrainingJobs of this namespace only (default: all namespaces).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// GpuNodes with these labels only (the controller's `--node-selector`).
    #[arg(short = 'l', long = "selector")]
    pub node_selector: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: StatusFormat,
    /// Redraw every `--interval` seconds until interrupted.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Seconds between redraws with `--watch`.
    #[arg(long, default_value_t = 2)]
    pub interval: u64,
    /// A GpuNode heartbeat older than this many seconds is shown as stale
    /// (the controller's `--heartbeat-ttl-seconds`).
    #[arg(long, default_value_t = 120)]
    pub heartbeat_ttl_seconds: u64,
    /// Colour.
    #[arg(long, value_enum, default_value_t)]
    pub color: ColorChoice,
    /// The cluster.
    #[command(flatten)]
    pub kube: super::kube_args::KubeArgs,
}

/// Runs `vramfit status` against the cluster of `--kubeconfig`/`--context`
/// (default: the current kubeconfig).
pub async fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let client = args.kube.client().await?;
    let tty = std::io::stdout().is_terminal();
    let color = match args.color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => tty && std::env::var_os("NO_COLOR").is_none(),
    };
    let ttl = SignedDuration::from_secs(i64::try_from(args.heartbeat_ttl_seconds).unwrap_or(120));
    loop {
        let (jobs, gpu_nodes) = fetch(
            &client,
            args.namespace.as_deref(),
            args.node_selector.as_deref(),
        )
        .await
        .context("listing TrainingJobs and GpuNodes")?;
        let view = cluster_status(&jobs, &gpu_nodes, Timestamp::now(), ttl);
        let out = match args.output {
            StatusFormat::Json if args.watch => serde_json::to_string(&view)? + "\n",
            StatusFormat::Json => serde_json::to_string_pretty(&view)? + "\n",
            StatusFormat::Text => text::render(&view, color),
        };
        let mut stdout = std::io::stdout().lock();
        if args.watch && tty && args.output == StatusFormat::Text {
            // Home and clear, so the view redraws in place.
            write!(stdout, "\x1b[H\x1b[2J")?;
        }
        stdout.write_all(out.as_bytes())?;
        stdout.flush()?;
        drop(stdout);
        if !args.watch {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(args.interval.max(1))).await;
    }
}
