//! `vramfit-agent run`: flags to options, then the daemon's loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};
use vramfit_agent::daemon::local::{parse_duration, parse_local_budget};
use vramfit_agent::daemon::{RealNode, RunOptions, run_loop, watch_node_pods};
use vramfit_agent::node::publish::PublishPolicy;
use vramfit_agent::node::watchdog::WatchdogConfig;

/// What `--once` prints.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RunOutput {
    /// The GpuNode status as JSON.
    Json,
}

/// Arguments of `vramfit-agent run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Name of this node (the Node and its GpuNode).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// Time between GPU readings (100ms, 1s, ...).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    interval: Duration,
    /// Longest time between two status writes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    heartbeat: Duration,
    /// A byte figure must move by more than this many MiB to be written
    /// before the heartbeat.
    #[arg(long, default_value_t = 64)]
    change_threshold_mib: u64,
    /// Folder of the pods' stats folders (`<root>/<namespace>_<pod>`); must
    /// match the controller's `--stats-root`.
    #[arg(long, default_value = "/var/run/vramfit/pods")]
    stats_root: PathBuf,
    /// The /proc to read (the host's: the agent runs with hostPID).
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// Share of its budget a pod may exceed it by before the watchdog acts.
    #[arg(long, default_value_t = 0.05)]
    tolerance: f64,
    /// How long a pod must stay over budget plus tolerance to be stopped.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    grace: Duration,
    /// Label of the GpuNode (KEY=VALUE, repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Watch a plain local process with a budget instead of pods
    /// (PID=BYTES, repeatable; BYTES may end in Ki, Mi, Gi). Runs without an
    /// API server.
    #[arg(long = "local-budget", value_name = "PID=BYTES")]
    local_budgets: Vec<String>,
    /// Run without an API server: the status goes to stdout (-o json) and
    /// --status-file only.
    #[arg(long)]
    standalone: bool,
    /// Also write each status to this file (replaced atomically).
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// Skip the probe at start.
    #[arg(long)]
    no_probe: bool,
    /// Most GiB the probe writes per GPU (it runs beside training jobs).
    #[arg(long, default_value_t = 2.0)]
    probe_gib: f64,
    /// Take one reading, print the status and exit (standalone unless
    /// KUBECONFIG or in-cluster config is meant: add --write).
    #[arg(long)]
    once: bool,
    /// With --once, also write the status to the API server.
    #[arg(long, requires = "once")]
    write: bool,
    /// Print each status written (JSON, one per line).
    #[arg(short, long, value_enum)]
    output: Option<RunOutput>,
}

fn parse_labels(labels: &[String]) -> Result<BTreeMap<String, String>> {
    labels
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--label {l:?}: expected KEY=VALUE"))
        })
        .collect()
}

impl RunArgs {
    fn options(&self) -> Result<RunOptions> {
        if self.interval.is_zero() {
            bail!("--interval must be longer than 0");
        }
        let mut options = RunOptions::new(&self.node);
        options.interval = self.interval;
        options.publish = PublishPolicy {
            threshold_bytes: self.change_threshold_mib << 20,
            heartbeat: self.heartbeat,
        };
        options.watchdog = WatchdogConfig {
            tolerance: self.tolerance,
            grace: self.grace,
        };
        options.stats_root = self.stats_root.clone();
        options.proc_root = self.proc_root.clone();
        options.labels = parse_labels(&self.labels)?;
        options.local_budgets = self
            .local_budgets
            .iter()
            .map(|b| parse_local_budget(b))
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?;
        options.probe_at_start = !self.no_probe;
        options.probe_bytes = (self.probe_gib.max(0.0) * (1u64 << 30) as f64) as u64;
        options.print = self.output.is_some();
        options.status_file = self.status_file.clone();
        options.once = self.once;
        Ok(options)
    }

    fn standalone(&self) -> bool {
        self.standalone || !self.local_budgets.is_empty() || (self.once && !self.write)
    }
}

/// Runs the agent.
pub fn run(args: RunArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let options = args.options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let client = if args.standalone() {
            None
        } else {
            Some(
                kube::Client::try_default()
                    .await
                    .context("no API server configuration (KUBECONFIG or in-cluster); use --standalone to run without one")?,
            )
        };
        let pods = client.clone().map(|c| watch_node_pods(c, &options.node));
        let backend = Box::new(RealNode::new(&options, pods));
        tracing::info!(node = %options.node, mode = "nvml", standalone = client.is_none(), "agent starts");
        run_loop(options, backend, client, shutdown_signal()).await
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("agent stops");
}
