//! `vramfit-agent run`: the node agent's loop. Each interval it reads the
//! GPUs, maps their processes to owners, builds the `GpuNode` status, lets
//! the watchdog decide, and writes the status when it changed or the
//! heartbeat is due.
//!
//! Where the readings come from is a [`NodeBackend`]: NVML and `/proc` on a
//! real node ([`RealNode`]), or the simulated node of `crate::sim`. Where the
//! status goes is the API server or, standalone, stdout and a file. What
//! each pass computed also goes to the Prometheus metrics of [`metrics`],
//! served apart from the loop.

pub mod api;
pub mod local;
pub mod metrics;
pub mod pods;
mod setup;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use vramfit::api::{GpuNodeStatus, ProbeStatus};

use crate::gpu::nvml::SystemNvml;
use crate::gpu::{Backoff, GpuMonitor, Reading};
use crate::node::procfs::ProcFs;
use crate::node::publish::{PublishPolicy, publish_reason};
use crate::node::report::{OwnerLookup, ProcessOwner, StatusBuilder};
use crate::node::watchdog::{StopOrder, Watchdog, WatchdogConfig};
use api::{GpuNodeWriter, probe_requested};
use local::{LocalOwners, PidFds, kill_processes};
use metrics::AgentMetrics;
use pods::PodOwners;

/// How long the OOM report may take before the kill it announces goes ahead
/// without it (the report follows with the next status write).
pub const REPORT_BEFORE_KILL: std::time::Duration = std::time::Duration::from_secs(2);

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The node (and `GpuNode`) name.
    pub node: String,
    /// Time between readings.
    pub interval: Duration,
    /// When to write the status.
    pub publish: PublishPolicy,
    /// The watchdog's tolerance and grace period.
    pub watchdog: WatchdogConfig,
    /// Where pods' stats folders are (`<root>/<namespace>_<pod>`).
    pub kubelet_root: PathBuf,
    /// The `/proc` to read (the host's, through hostPID).
    pub proc_root: PathBuf,
    /// Labels of the `GpuNode`.
    pub labels: BTreeMap<String, String>,
    /// Plain local processes to watch (PID -> budget bytes).
    pub local_budgets: BTreeMap<u32, u64>,
    /// Probe at start.
    pub probe_at_start: bool,
    /// Measure the CUDA context overhead at start (a bare context on every
    /// GPU for a moment).
    pub measure_context_overhead: bool,
    /// Most bytes a probe writes per GPU (it must leave training jobs room).
    pub probe_bytes: u64,
    /// Print the status (JSON, one line per write) on stdout.
    pub print: bool,
    /// Also write each status to this file (replaced atomically).
    pub status_file: Option<PathBuf>,
    /// One reading, printed, then exit.
    pub once: bool,
    /// Serve `/metrics` and `/healthz` here (not with `once`).
    pub metrics_addr: Option<SocketAddr>,
}

impl RunOptions {
    /// Defaults for `node`.
    pub fn new(node: &str) -> Self {
        Self {
            node: node.into(),
            interval: Duration::from_secs(1),
            publish: PublishPolicy::default(),
            watchdog: WatchdogConfig::default(),
            kubelet_root: PathBuf::from(vramfit::job::keys::DEFAULT_KUBELET_ROOT),
            proc_root: PathBuf::from("/proc"),
            labels: BTreeMap::new(),
            local_budgets: BTreeMap::new(),
            probe_at_start: true,
            measure_context_overhead: true,
            probe_bytes: 2 << 30,
            print: false,
            status_file: None,
            once: false,
            metrics_addr: None,
        }
    }
}

/// Where the agent's readings come from and how it stops a pod.
pub trait NodeBackend: Send {
    /// `nvml` or `simulated` (goes to `status.agent.mode`).
    fn mode(&self) -> &'static str;
    /// One pass over the GPUs.
    fn read(&mut self, now: Instant) -> Reading;
    /// Who the processes of the last reading belong to.
    fn owners(&self) -> Box<dyn OwnerLookup + '_>;
    /// Carries out a stop order.
    fn stop(&mut self, order: &StopOrder);
    /// Bytes a bare CUDA context takes per GPU UUID, measured once at start.
    fn context_overhead(&mut self, reading: &Reading) -> HashMap<String, u64>;
    /// Probes the GPUs; results per GPU UUID.
    fn probe(&mut self, reading: &Reading) -> HashMap<String, ProbeStatus>;
    /// What kept the start-up measurements or the last probe from running
    /// (CUDA missing); it makes the agent's health Degraded.
    fn problem(&self) -> Option<String> {
        None
    }
}

/// A real node: NVML for the GPUs, `/proc` and the pod watch for owners.
pub struct RealNode {
    monitor: GpuMonitor,
    proc: ProcFs,
    kubelet_root: PathBuf,
    pods: Option<Store<Pod>>,
    local: BTreeMap<u32, u64>,
    probe_bytes: u64,
    overhead_problem: Option<String>,
    probe_problem: Option<String>,
    /// Descriptors of the GPU processes of the last reading, for the kills.
    pidfds: PidFds,
}

impl RealNode {
    /// NVML of the system, owners from `pods` or `options.local_budgets`.
    pub fn new(options: &RunOptions, pods: Option<Store<Pod>>) -> Self {
        Self {
            monitor: GpuMonitor::new(Box::new(SystemNvml)),
            proc: ProcFs::new(&options.proc_root),
            kubelet_root: options.kubelet_root.clone(),
            pods,
            local: options.local_budgets.clone(),
            probe_bytes: options.probe_bytes,
            overhead_problem: None,
            probe_problem: None,
            pidfds: PidFds::default(),
        }
    }
}

/// Owners when nothing is watched: every process belongs to no one.
struct NoOwners(ProcFs);

impl OwnerLookup for NoOwners {
    fn owner_of(&self, _: u32) -> Option<ProcessOwner> {
        None
    }
    fn is_running(&self, pid: u32) -> bool {
        self.0.is_running(pid)
    }
}

impl NodeBackend for RealNode {
    fn mode(&self) -> &'static str {
        "nvml"
    }

    fn read(&mut self, now: Instant) -> Reading {
        let mut reading = self.monitor.read(now);
        // The agent's own context (while it measures the overhead or probes)
        // is not a workload.
        let me = std::process::id();
        for gpu in &mut reading.gpus {
            gpu.processes.retain(|p| p.pid != me);
        }
        self.pidfds.track(
            &reading
                .gpus
                .iter()
                .flat_map(|g| g.processes.iter().map(|p| p.pid))
                .collect(),
        );
        reading
    }

    fn owners(&self) -> Box<dyn OwnerLookup + '_> {
        if !self.local.is_empty() {
            Box::new(LocalOwners::new(self.proc.clone(), self.local.clone()))
        } else if let Some(pods) = &self.pods {
            Box::new(PodOwners::snapshot(&self.proc, &self.kubelet_root, pods))
        } else {
            Box::new(NoOwners(self.proc.clone()))
        }
    }

    fn stop(&mut self, order: &StopOrder) {
        for (pid, result) in kill_processes(order, &self.pidfds) {
            match result {
                Ok(()) => {
                    tracing::warn!(pid, pod = %order.owner.name, "sent SIGKILL: {}", order.reason)
                }
                Err(e) => {
                    tracing::error!(pid, pod = %order.owner.name, "cannot stop the process: {e}")
                }
            }
        }
    }

    fn context_overhead(&mut self, reading: &Reading) -> HashMap<String, u64> {
        let (overhead, problem) = setup::context_overhead(&self.monitor, reading);
        self.overhead_problem = problem;
        overhead
    }

    fn probe(&mut self, reading: &Reading) -> HashMap<String, ProbeStatus> {
        let (probes, problem) = setup::probe(reading, self.probe_bytes);
        self.probe_problem = problem;
        probes
    }

    fn problem(&self) -> Option<String> {
        let problems: Vec<&str> = [&self.overhead_problem, &self.probe_problem]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        (!problems.is_empty()).then(|| problems.join("; "))
    }
}

/// Starts a watch of the pods bound to `node`; the returned store fills as
/// events arrive (the watch retries with back-off while the API server is
/// away). The watch runs until its task is aborted.
pub fn watch_node_pods(client: Client, node: &str) -> (Store<Pod>, tokio::task::JoinHandle<()>) {
    let (reader, writer) = reflector::store::<Pod>();
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let stream = watcher(Api::<Pod>::all(client), config)
        .default_backoff()
        .modify(|pod| pod.metadata.managed_fields = None)
        .reflect(writer)
        .applied_objects();
    let node = node.to_string();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = futures::StreamExt::next(&mut stream).await {
            if let Err(error) = event {
                tracing::warn!(%node, "pod watch: {error}; retrying");
            }
        }
    });
    (reader, task)
}

/// Runs the agent on a real node: NVML, `/proc` and, with a client, the pod
/// watch.
pub async fn run_real(
    options: RunOptions,
    client: Option<Client>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let watch = client.clone().map(|c| watch_node_pods(c, &options.node));
    let backend = Box::new(RealNode::new(&options, watch.as_ref().map(|w| w.0.clone())));
    let result = run_loop(options, backend, client, shutdown).await;
    if let Some((_, task)) = watch {
        task.abort();
    }
    result
}

fn now_ms() -> i64 {
    Timestamp::now().as_millisecond()
}

/// Runs the agent's loop until `shutdown` resolves (or after one reading
/// with `options.once`). `client` is `None` standalone: the status then goes
/// only to stdout and the status file.
pub async fn run_loop(
    options: RunOptions,
    mut backend: Box<dyn NodeBackend>,
    client: Option<Client>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut metrics = AgentMetrics::new(&options.node, backend.mode(), options.interval);
    // Up before the start-up measurements, so that /healthz answers during
    // them; it reads snapshots the loop hands over and never holds the loop.
    let _server = match options.metrics_addr {
        Some(addr) if !options.once => Some(metrics::serve(addr, metrics.shared())?),
        _ => None,
    };
    let mut builder = StatusBuilder::new(backend.mode());
    let mut watchdog = Watchdog::new(options.watchdog);
    let writer = client
        .clone()
        .map(|c| GpuNodeWriter::new(c, &options.node, options.labels.clone()));

    let first = backend.read(Instant::now());
    if options.measure_context_overhead {
        builder.context_overhead = backend.context_overhead(&first);
    }
    if options.probe_at_start {
        builder.probes = backend.probe(&first);
    }
    builder.problem = backend.problem();
    if let Some(writer) = &writer {
        match writer.previous_status().await {
            Ok(Some(previous)) => builder.resume(&previous),
            Ok(None) => {}
            Err(e) => tracing::warn!("cannot read the earlier status (OOM reports, peaks): {e}"),
        }
    }

    let mut last: Option<(GpuNodeStatus, Instant)> = None;
    let mut write_backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let mut write_retry_at: Option<Instant> = None;
    let mut probe_pending = false;
    let mut ticker = tokio::time::interval(options.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reading = Some(first);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = &mut shutdown => return Ok(()),
        }
        let now = Instant::now();
        let current = match reading.take() {
            Some(r) => r,
            None => backend.read(now),
        };
        if probe_pending {
            tracing::info!("probe requested through the GpuNode annotation");
            builder.probes = tokio::task::block_in_place(|| backend.probe(&current));
            builder.problem = backend.problem();
            if let Some(w) = &writer
                && let Err(e) = w.clear_probe_request().await
            {
                tracing::warn!("cannot clear the probe request: {e}");
            }
            probe_pending = false;
        }
        let (mut status, usage) = {
            let owners = backend.owners();
            builder.build(
                &current,
                owners.as_ref(),
                now_ms(),
                Timestamp::now().to_string(),
            )
        };
        for bad in std::mem::take(&mut builder.bad_files) {
            tracing::warn!(pod = %bad.owner.name, namespace = %bad.owner.namespace, file = %bad.file, "skipping a stats file: {}", bad.error);
            if let Some(client) = &client
                && !bad.owner.namespace.is_empty()
            {
                // Off the loop: a slow API server must not delay the watchdog.
                tokio::spawn(api::publish_bad_file(
                    client.clone(),
                    options.node.clone(),
                    bad,
                ));
            }
        }
        let orders = watchdog.observe(now, &usage);
        for order in &orders {
            builder.record_stop(order, Timestamp::now().to_string());
        }
        if !orders.is_empty() {
            status.oom_reports = builder.oom_reports.clone();
            // The report goes out before the kill, so the controller (or
            // `vramfit run --local`, reading the status file) knows the exit
            // that follows is an OOM (docs/agent.md).
            if let Some(path) = &options.status_file
                && let Err(e) = write_status_file(path, &status)
            {
                tracing::error!("cannot write the status file before stopping: {e}");
            }
            // Bounded: a slow or hung API server must not hold the kill back.
            // The kill goes through the descriptor opened when the process
            // was seen (`PidFds`), so a PID reused meanwhile is not hit.
            if let Some(w) = &writer {
                let written = tokio::time::timeout(REPORT_BEFORE_KILL, w.write(&status)).await;
                metrics.write_done(matches!(written, Ok(Ok(_))));
                match written {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::error!("cannot write the OOM report before stopping: {e}")
                    }
                    Err(_) => tracing::error!(
                        "the OOM report took over {REPORT_BEFORE_KILL:?}: stopping first, it is written after"
                    ),
                }
            }
        }
        for order in &orders {
            backend.stop(order);
        }
        metrics.pass_done(&status, &usage, &orders, now);
        if options.once {
            emit(&options, &status)?;
            if let Some(w) = &writer {
                w.write(&status).await?;
            }
            return Ok(());
        }
        let due = publish_reason(
            &options.publish,
            last.as_ref().map(|(s, at)| (s, *at)),
            &status,
            now,
        )
        .is_some()
            || !orders.is_empty();
        if !due || write_retry_at.is_some_and(|at| now < at) {
            continue;
        }
        emit(&options, &status)?;
        match &writer {
            None => {
                metrics.write_done(true);
                last = Some((status, now));
            }
            Some(w) => match w.write(&status).await {
                Ok(node) => {
                    metrics.write_done(true);
                    if write_retry_at.take().is_some() {
                        tracing::info!("GpuNode status written again");
                    }
                    write_backoff.reset();
                    probe_pending = probe_requested(&node);
                    last = Some((status, now));
                }
                Err(e) => {
                    metrics.write_done(false);
                    let delay = write_backoff.next_delay();
                    write_retry_at = Some(now + delay);
                    tracing::warn!(
                        retry_in_s = delay.as_secs_f64(),
                        "cannot write the GpuNode status: {e}"
                    );
                }
            },
        }
    }
}

fn emit(options: &RunOptions, status: &GpuNodeStatus) -> anyhow::Result<()> {
    if options.print {
        println!("{}", serde_json::to_string(status)?);
    }
    if let Some(path) = &options.status_file {
        write_status_file(path, status)?;
    }
    Ok(())
}

/// Replaces the status file atomically (a reader never sees half of it).
fn write_status_file(path: &std::path::Path, status: &GpuNodeStatus) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(status)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
