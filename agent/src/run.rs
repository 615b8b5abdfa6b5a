//! `vramfit-agent run`: flags to options, then the daemon's loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};
use vramfit::cli::logging::{self, LogFormat, LogStream};
use vramfit_agent::AgentError;
use vramfit_agent::daemon::local::{parse_duration, parse_local_budget};
use vramfit_agent::daemon::{RunOptions, metrics, run_real};
use vramfit_agent::node::publish::PublishPolicy;
use vramfit_agent::node::watchdog::WatchdogConfig;
#[cfg(feature = "sim")]
use vramfit_agent::sim::{SimSpec, cluster::NodeResources, parse_sim_spec, run_simulated};

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
    /// Shortest time between two writes when only byte figures moved (a
    /// process that appears or ends, health, probes and OOM reports are
    /// written at once).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    min_write_gap: Duration,
    /// The kubelet's root folder (its `--root-dir`), where the agent reads
    /// each training pod's stats `emptyDir`
    /// (`<root>/pods/<uid>/volumes/kubernetes.io~empty-dir/vramfit-stats`).
    #[arg(long, default_value = vramfit::job::keys::DEFAULT_KUBELET_ROOT)]
    kubelet_root: PathBuf,
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
    /// Log lines (on standard error) as text, coloured only when standard
    /// error is a terminal, or as JSON objects, one a line.
    #[arg(long, value_enum, env = "VRAMFIT_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Watch a plain local process and its descendants with a budget per GPU
    /// instead of pods (PID=BYTES, repeatable; BYTES may end in Ki, Mi, Gi).
    /// Runs without an API server.
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
    /// Skip the CUDA context overhead measurement at start (it holds a bare
    /// context on every GPU for a moment; `vramfit run --local` starts the
    /// agent beside a training process with this).
    #[arg(long)]
    no_context_overhead: bool,
    /// Most GiB the probe writes per GPU (it runs beside training jobs).
    #[arg(long, default_value_t = 2.0)]
    probe_gib: f64,
    #[command(flatten)]
    sim: SimArgs,
    /// Take one reading, print the status and exit (without an API server
    /// unless --write is given).
    #[arg(long)]
    once: bool,
    /// With --once, also write the status to the API server.
    #[arg(long, requires = "once")]
    write: bool,
    /// Print each status written (JSON, one per line).
    #[arg(short, long, value_enum)]
    output: Option<RunOutput>,
    /// Serve Prometheus metrics (/metrics) and /healthz on HOST:PORT, for
    /// example 0.0.0.0:9465; empty: no server (docs/agent.md, "Metrics").
    #[arg(long, value_name = "HOST:PORT", default_value = "")]
    metrics_addr: String,
}

/// The simulated node's flags of `vramfit-agent run` (the `sim` feature).
#[cfg(feature = "sim")]
#[derive(Args, Debug)]
struct SimArgs {
    /// Simulate the node instead of reading NVML: COUNTxMODEL with a GPU
    /// model the predictor knows (8xH200, 2xA100-80GB). With an API server the
    /// agent also registers the Node and plays the kubelet for its pods.
    #[arg(long, value_name = "COUNTxMODEL", value_parser = parse_sim_spec)]
    simulate: Option<SimSpec>,
    /// Simulated mode: how long a pod runs unless its annotation
    /// vramfit.dev/simulated-run says otherwise.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    sim_run: Duration,
    /// Simulated mode: the Node's allocatable CPU.
    #[arg(long, default_value = "64")]
    sim_cpu: String,
    /// Simulated mode: the Node's allocatable memory.
    #[arg(long, default_value = "512Gi")]
    sim_memory: String,
}

/// Without the `sim` feature `--simulate` is still parsed, hidden, so that
/// it is refused with a message that says which build has it rather than
/// as an unknown flag.
#[cfg(not(feature = "sim"))]
#[derive(Args, Debug)]
struct SimArgs {
    #[arg(long, value_name = "COUNTxMODEL", hide = true)]
    simulate: Option<String>,
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
            min_gap: self.min_write_gap,
            heartbeat: self.heartbeat,
        };
        options.watchdog = WatchdogConfig {
            tolerance: self.tolerance,
            grace: self.grace,
        };
        options.kubelet_root = self.kubelet_root.clone();
        options.proc_root = self.proc_root.clone();
        options.labels = parse_labels(&self.labels)?;
        options.local_budgets = self
            .local_budgets
            .iter()
            .map(|b| parse_local_budget(b))
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?;
        options.probe_at_start = !self.no_probe;
        options.measure_context_overhead = !self.no_context_overhead;
        options.probe_bytes = (self.probe_gib.max(0.0) * (1u64 << 30) as f64) as u64;
        options.print = self.output.is_some();
        options.status_file = self.status_file.clone();
        options.once = self.once;
        options.metrics_addr =
            metrics::parse_addr(&self.metrics_addr).map_err(anyhow::Error::msg)?;
        Ok(options)
    }

    fn standalone(&self) -> bool {
        self.standalone || !self.local_budgets.is_empty() || (self.once && !self.write)
    }

    fn check(&self) -> Result<()> {
        if self.sim.simulate.is_some() {
            if !cfg!(feature = "sim") {
                return Err(AgentError::NoSim { what: "--simulate" }.into());
            }
            if !self.local_budgets.is_empty() {
                bail!("--simulate and --local-budget do not go together");
            }
        }
        Ok(())
    }
}

/// Runs the agent.
pub fn run(args: RunArgs) -> Result<()> {
    logging::init_on(args.log_format, logging::DEFAULT_FILTER, LogStream::Stderr)?;
    args.check()?;
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
        let standalone = client.is_none();
        #[cfg(feature = "sim")]
        if let Some(spec) = args.sim.simulate {
            tracing::info!(node = %options.node, gpus = spec.count, model = spec.profile.name, standalone, "simulated agent starts");
            let resources = NodeResources {
                cpu: args.sim.sim_cpu.clone(),
                memory: args.sim.sim_memory.clone(),
                ..NodeResources::default()
            };
            return run_simulated(options, spec, args.sim.sim_run, resources, client, shutdown_signal()).await;
        }
        tracing::info!(node = %options.node, mode = "nvml", standalone, "agent starts");
        run_real(options, client, shutdown_signal()).await
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

/// Arguments of `vramfit-agent bench agents`.
#[cfg(feature = "sim")]
#[derive(Args, Debug)]
pub struct FleetArgs {
    /// Kubeconfig of the API server (with the CRDs installed).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Simulated agents, one node each.
    #[arg(long, default_value_t = 200)]
    agents: usize,
    /// GPUs of each node.
    #[arg(long, default_value = "8xH200")]
    simulate: String,
    /// Pods started on each node when the window opens.
    #[arg(long, default_value_t = 4)]
    pods_per_node: usize,
    /// How long each pod runs.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pod_run: Duration,
    /// The measured window.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    window: Duration,
    /// Time the agents get to start before the window opens.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    warm_up: Duration,
    /// The agents' reading interval.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    interval: Duration,
    /// The agents' heartbeat.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    heartbeat: Duration,
    /// The agents' shortest gap between writes of byte figures alone.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    min_write_gap: Duration,
    /// Seed of the pods' simulated peaks.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// Runs `vramfit-agent bench agents` and prints its JSON report.
#[cfg(feature = "sim")]
pub fn bench_agents(args: FleetArgs) -> Result<()> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use vramfit_agent::sim::fleet::{FleetOptions, bench_agents};
    logging::init_on(LogFormat::Text, "warn,kube=error", LogStream::Stderr)?;
    parse_sim_spec(&args.simulate).map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
            .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        let client = kube::Client::try_from(config)?;
        bench_agents(
            client,
            FleetOptions {
                agents: args.agents,
                simulate: args.simulate.clone(),
                pods_per_node: args.pods_per_node,
                pod_run: args.pod_run,
                window: args.window,
                warm_up: args.warm_up,
                interval: args.interval,
                heartbeat: args.heartbeat,
                min_write_gap: args.min_write_gap,
                seed: args.seed,
            },
        )
        .await
    })?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
