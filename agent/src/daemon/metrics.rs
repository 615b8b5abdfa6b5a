//! The agent's Prometheus metrics, served on `/metrics` beside `/healthz`
//! (`--metrics-addr`; docs/agent.md, "Metrics").
//!
//! The loop owns an [`AgentMetrics`]. After each pass it turns what the pass
//! computed (the status, each pod's use per GPU, the stop orders) into a
//! [`Snapshot`] of plain values and swaps it in. A scrape takes the latest
//! snapshot (a pointer copied under a lock held for nothing longer) and
//! encodes it on the server's own thread and runtime: the loop never waits on
//! a scrape, and the series of a pod or GPU gone from a pass are gone from
//! the next scrape.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use vramfit::api::{GpuHealth, GpuNodeStatus};

use crate::node::watchdog::{PodGpuUsage, StopOrder};

/// Every series is named `vramfit_agent_…`.
pub const PREFIX: &str = "vramfit_agent";

/// What `/metrics` answers: the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the watchdog stopped a pod: its use went over its budget plus the
/// tolerance on a GPU it was given, or it used a GPU its placement did not
/// give it. Both series exist from the start, at 0.
pub const KILL_REASONS: [&str; 2] = ["over_budget", "gpu_not_given"];

/// How a status write ended (the API server's answer; standalone, the
/// status printed or written to its file).
pub const WRITE_RESULTS: [&str; 2] = ["ok", "error"];

/// `/healthz` fails once no pass has completed for this long (and at least
/// [`STALL_PASSES`] intervals): the watchdog is not running.
pub const STALL_MIN: Duration = Duration::from_secs(120);

/// Intervals without a pass before `/healthz` fails, when longer than
/// [`STALL_MIN`].
pub const STALL_PASSES: u32 = 30;

/// Time the start-up measurements (the CUDA context overhead, the probe) may
/// take before the first pass; `/healthz` answers ok until then.
pub const STARTUP_BOUND: Duration = Duration::from_secs(600);

/// `--metrics-addr`: `HOST:PORT`, or empty for no server.
pub fn parse_addr(text: &str) -> Result<Option<SocketAddr>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|e| {
        format!("--metrics-addr {text:?}: expected HOST:PORT (0.0.0.0:9465, [::]:9465), or empty for none: {e}")
    })
}

/// The last probe of a GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeSeries {
    /// The probe passed.
    pub ok: bool,
    /// Measured copy bandwidth, GB/s.
    pub bandwidth_gbps: f64,
    /// Mismatched words read back.
    pub errors: u64,
    /// Bytes it tested.
    pub tested_bytes: u64,
}

/// One GPU as the last pass saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSeries {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Predictor profile name.
    pub model: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Memory in use (NVML: every process, of a pod or not), bytes.
    pub used_bytes: u64,
    /// Budgets of the pods with processes on it, summed, bytes.
    pub budget_bytes: u64,
    /// What a bare CUDA context takes on it, bytes.
    pub context_overhead_bytes: u64,
    /// Its compute processes.
    pub processes: u64,
    /// Healthy, Degraded or Faulty.
    pub health: GpuHealth,
    /// The last probe, when one ran.
    pub probe: Option<ProbeSeries>,
}

/// One pod on one GPU as the last pass saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSeries {
    /// The pod's namespace (empty for a watched local process).
    pub namespace: String,
    /// The pod (`pid-<pid>` for a watched local process).
    pub pod: String,
    /// The GPU's UUID.
    pub gpu: String,
    /// Bytes its processes use on the GPU together.
    pub used_bytes: u64,
    /// Its budget on the GPU (0 on a GPU its placement did not give it);
    /// none when it has none.
    pub budget_bytes: Option<u64>,
    /// Most bytes seen in use: the larger of its processes' peaks on the GPU
    /// (kept across a restart of the agent) and the most they used together
    /// in a pass since the agent saw the pod there.
    pub peak_bytes: u64,
    /// OOMs its processes' allocators reported in their stats files.
    pub allocator_ooms: Option<u64>,
}

/// What `/metrics` shows: the agent's state after its last pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The node.
    pub node: String,
    /// The agent's version.
    pub version: String,
    /// `nvml` or `simulated`.
    pub mode: String,
    /// The agent's health (none before the first pass).
    pub health: Option<GpuHealth>,
    /// GPUs in index order.
    pub gpus: Vec<GpuSeries>,
    /// Pods per GPU.
    pub pods: Vec<PodSeries>,
    /// OOM reports in the status (the most recent, at most 50).
    pub oom_reports: u64,
    /// Pods stopped by the watchdog since the agent started, by reason.
    pub kills: BTreeMap<String, u64>,
    /// Status writes since the agent started, by result.
    pub status_writes: BTreeMap<String, u64>,
    /// Passes completed.
    pub passes: u64,
    /// Unix time of the last pass, seconds.
    pub last_pass_unix: Option<f64>,
    /// Unix time of the last status written, seconds.
    pub last_write_unix: Option<f64>,
    /// When the last pass completed (for `/healthz`; not a series).
    pub last_pass_at: Option<Instant>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    index: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuModelLabels {
    gpu: String,
    index: u32,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodLabels {
    namespace: String,
    pod: String,
    gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// 0 Healthy, 1 Degraded, 2 Faulty.
pub fn health_value(health: GpuHealth) -> i64 {
    match health {
        GpuHealth::Healthy => 0,
        GpuHealth::Degraded => 1,
        GpuHealth::Faulty => 2,
    }
}

fn gauges<L>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (L, i64)>,
) where
    L: Clone + Debug + Hash + Eq + EncodeLabelSet + Send + Sync + 'static,
{
    let family = Family::<L, Gauge>::default();
    for (labels, value) in values {
        family.get_or_create(&labels).set(value);
    }
    registry.register(name, help, family);
}

fn float_gauges<L>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (L, f64)>,
) where
    L: Clone + Debug + Hash + Eq + EncodeLabelSet + Send + Sync + 'static,
{
    let family = Family::<L, Gauge<f64, AtomicU64>>::default();
    for (labels, value) in values {
        family.get_or_create(&labels).set(value);
    }
    registry.register(name, help, family);
}

fn counters<L>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (L, u64)>,
) where
    L: Clone + Debug + Hash + Eq + EncodeLabelSet + Send + Sync + 'static,
{
    let family = Family::<L, Counter>::default();
    for (labels, value) in values {
        family.get_or_create(&labels).inc_by(value);
    }
    registry.register(name, help, family);
}

/// A series without labels (but the node's), when there is a value.
fn single(registry: &mut Registry, name: &str, help: &str, value: Option<f64>) {
    let gauge = Gauge::<f64, AtomicU64>::default();
    if let Some(value) = value {
        gauge.set(value);
        registry.register(name, help, gauge);
    }
}

/// The text exposition of `snapshot`, with the loop's duration histogram when
/// given. Every series carries the node's name (`node`).
pub fn encode_snapshot(snapshot: &Snapshot, loop_seconds: Option<&Histogram>) -> String {
    let s = snapshot;
    let mut r = Registry::with_prefix_and_labels(
        PREFIX,
        [(Cow::Borrowed("node"), Cow::Owned(s.node.clone()))].into_iter(),
    );
    r.register(
        "build",
        "The agent's version and mode (nvml, simulated)",
        Info::new(BuildLabels {
            version: s.version.clone(),
            mode: s.mode.clone(),
        }),
    );
    if let Some(health) = s.health {
        single(
            &mut r,
            "health",
            "The agent's health: 0 Healthy, 1 Degraded (NVML or CUDA missing, a GPU degraded), 2 Faulty",
            Some(health_value(health) as f64),
        );
        single(
            &mut r,
            "gpus",
            "GPUs the agent reports",
            Some(s.gpus.len() as f64),
        );
    }
    let passes = Counter::<u64>::default();
    passes.inc_by(s.passes);
    r.register(
        "passes",
        "Passes of the agent's loop (reading, status, watchdog)",
        passes,
    );
    single(
        &mut r,
        "last_pass_timestamp_seconds",
        "Unix time the loop last completed a pass",
        s.last_pass_unix,
    );
    single(
        &mut r,
        "last_status_write_timestamp_seconds",
        "Unix time the GpuNode status was last written",
        s.last_write_unix,
    );
    counters(
        &mut r,
        "status_writes",
        "GpuNode status writes, by result",
        s.status_writes.iter().map(|(result, n)| {
            (
                ResultLabel {
                    result: result.clone(),
                },
                *n,
            )
        }),
    );
    counters(
        &mut r,
        "kills",
        "Pods the watchdog stopped (SIGKILL to their processes), by reason",
        s.kills.iter().map(|(reason, n)| {
            (
                ReasonLabel {
                    reason: reason.clone(),
                },
                *n,
            )
        }),
    );
    single(
        &mut r,
        "oom_reports",
        "OOM reports in the GpuNode status (the most recent, at most 50)",
        s.health.map(|_| s.oom_reports as f64),
    );
    if let Some(h) = loop_seconds {
        r.register(
            "loop_duration_seconds",
            "Seconds one pass of the loop takes, reading to stop orders carried out",
            h.clone(),
        );
    }

    let gpu = |g: &GpuSeries| GpuLabels {
        gpu: g.uuid.clone(),
        index: g.index,
    };
    gauges(
        &mut r,
        "gpu_memory_total_bytes",
        "Total memory of the GPU",
        s.gpus.iter().map(|g| {
            (
                GpuModelLabels {
                    gpu: g.uuid.clone(),
                    index: g.index,
                    model: g.model.clone(),
                },
                int(g.total_bytes),
            )
        }),
    );
    gauges(
        &mut r,
        "gpu_memory_used_bytes",
        "Memory in use on the GPU as NVML measures it (every process, of a pod or not)",
        s.gpus.iter().map(|g| (gpu(g), int(g.used_bytes))),
    );
    gauges(
        &mut r,
        "gpu_budget_bytes",
        "Budgets of the pods with processes on the GPU, summed",
        s.gpus.iter().map(|g| (gpu(g), int(g.budget_bytes))),
    );
    gauges(
        &mut r,
        "gpu_context_overhead_bytes",
        "Memory a bare CUDA context takes on the GPU (measured at start)",
        s.gpus
            .iter()
            .map(|g| (gpu(g), int(g.context_overhead_bytes))),
    );
    gauges(
        &mut r,
        "gpu_processes",
        "Compute processes on the GPU",
        s.gpus.iter().map(|g| (gpu(g), int(g.processes))),
    );
    gauges(
        &mut r,
        "gpu_health",
        "The GPU's health: 0 Healthy, 1 Degraded, 2 Faulty (NVML and the last probe)",
        s.gpus.iter().map(|g| (gpu(g), health_value(g.health))),
    );
    let probed = || {
        s.gpus
            .iter()
            .filter_map(|g| Some((gpu(g), g.probe.as_ref()?)))
    };
    gauges(
        &mut r,
        "gpu_probe_ok",
        "1 when the GPU's last probe passed",
        probed().map(|(l, p)| (l, i64::from(p.ok))),
    );
    float_gauges(
        &mut r,
        "gpu_probe_bandwidth_gbps",
        "Copy bandwidth the GPU's last probe measured, GB/s",
        probed().map(|(l, p)| (l, p.bandwidth_gbps)),
    );
    gauges(
        &mut r,
        "gpu_probe_errors",
        "Mismatched words the GPU's last probe read back",
        probed().map(|(l, p)| (l, int(p.errors))),
    );
    gauges(
        &mut r,
        "gpu_probe_tested_bytes",
        "Bytes the GPU's last probe tested",
        probed().map(|(l, p)| (l, int(p.tested_bytes))),
    );

    let pod = |p: &PodSeries| PodLabels {
        namespace: p.namespace.clone(),
        pod: p.pod.clone(),
        gpu: p.gpu.clone(),
    };
    gauges(
        &mut r,
        "pod_memory_used_bytes",
        "Memory the pod's processes use on the GPU together",
        s.pods.iter().map(|p| (pod(p), int(p.used_bytes))),
    );
    gauges(
        &mut r,
        "pod_budget_bytes",
        "The pod's budget on the GPU (0 on a GPU its placement did not give it)",
        s.pods
            .iter()
            .filter_map(|p| Some((pod(p), int(p.budget_bytes?)))),
    );
    gauges(
        &mut r,
        "pod_peak_bytes",
        "Most memory the pod was seen using on the GPU",
        s.pods.iter().map(|p| (pod(p), int(p.peak_bytes))),
    );
    counters(
        &mut r,
        "pod_allocator_ooms",
        "OOMs the allocators of the pod's processes on the GPU reported (stats files)",
        s.pods
            .iter()
            .filter_map(|p| Some((pod(p), p.allocator_ooms?))),
    );

    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &r);
    text
}

/// What the loop and the server share.
#[derive(Debug)]
pub struct Shared {
    snapshot: Mutex<Arc<Snapshot>>,
    loop_seconds: Histogram,
    started: Instant,
    stall_after: Duration,
}

impl Shared {
    /// The latest snapshot.
    pub fn latest(&self) -> Arc<Snapshot> {
        self.snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `/metrics`.
    pub fn encode(&self) -> String {
        encode_snapshot(&self.latest(), Some(&self.loop_seconds))
    }

    /// `/healthz` at `now`: ok, or why the loop looks stuck.
    pub fn health(&self, now: Instant) -> Result<String, String> {
        liveness(
            self.latest().last_pass_at,
            self.started,
            now,
            self.stall_after,
        )
    }
}

/// Whether the loop runs: a pass within `stall_after`, or before the first
/// pass, start-up measurements for at most [`STARTUP_BOUND`].
pub fn liveness(
    last_pass: Option<Instant>,
    started: Instant,
    now: Instant,
    stall_after: Duration,
) -> Result<String, String> {
    match last_pass {
        Some(at) => {
            let age = now.saturating_duration_since(at);
            if age <= stall_after {
                Ok(format!("ok: last pass {:.1} s ago\n", age.as_secs_f64()))
            } else {
                Err(format!(
                    "no pass of the loop for {:.0} s (bound {:.0} s): the watchdog is not running\n",
                    age.as_secs_f64(),
                    stall_after.as_secs_f64()
                ))
            }
        }
        None => {
            let age = now.saturating_duration_since(started);
            if age <= STARTUP_BOUND {
                Ok("ok: starting (start-up measurements before the first pass)\n".into())
            } else {
                Err(format!(
                    "no first pass {:.0} s after start (bound {:.0} s)\n",
                    age.as_secs_f64(),
                    STARTUP_BOUND.as_secs_f64()
                ))
            }
        }
    }
}

/// How long the loop may go without a pass at `interval`.
pub fn stall_bound(interval: Duration) -> Duration {
    (interval * STALL_PASSES).max(STALL_MIN)
}

/// The loop's side: counters across passes, peaks per pod, the snapshot it
/// hands over after each pass.
#[derive(Debug)]
pub struct AgentMetrics {
    shared: Arc<Shared>,
    current: Snapshot,
    peaks: HashMap<(String, String), u64>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl AgentMetrics {
    /// Metrics of the agent of `node` in `mode`, reading every `interval`.
    pub fn new(node: &str, mode: &str, interval: Duration) -> Self {
        let current = Snapshot {
            node: node.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            mode: mode.into(),
            kills: KILL_REASONS.iter().map(|r| (r.to_string(), 0)).collect(),
            status_writes: WRITE_RESULTS.iter().map(|r| (r.to_string(), 0)).collect(),
            ..Snapshot::default()
        };
        let shared = Arc::new(Shared {
            snapshot: Mutex::new(Arc::new(current.clone())),
            // 1 ms to about 65 s.
            loop_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            started: Instant::now(),
            stall_after: stall_bound(interval),
        });
        Self {
            shared,
            current,
            peaks: HashMap::new(),
        }
    }

    /// What the server reads.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The snapshot as of the last call.
    pub fn snapshot(&self) -> &Snapshot {
        &self.current
    }

    fn publish(&self) {
        let next = Arc::new(self.current.clone());
        *self
            .shared
            .snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = next;
    }

    /// Takes one pass: its `status`, each pod's `usage` per GPU, the stop
    /// `orders` carried out, how long it `took`, when it ended (`at`, and as
    /// Unix seconds).
    pub fn observe_pass(
        &mut self,
        status: &GpuNodeStatus,
        usage: &[PodGpuUsage],
        orders: &[StopOrder],
        took: Duration,
        at: Instant,
        unix: f64,
    ) {
        let s = &mut self.current;
        s.health = Some(status.agent.as_ref().map(|a| a.health).unwrap_or_default());
        s.gpus = status
            .gpus
            .iter()
            .map(|d| GpuSeries {
                index: d.index,
                uuid: d.uuid.clone(),
                model: d.model.clone(),
                total_bytes: d.total_bytes,
                used_bytes: d.used_bytes,
                budget_bytes: usage
                    .iter()
                    .filter(|u| u.gpu == d.uuid && u.given)
                    .filter_map(|u| u.budget_bytes)
                    .sum(),
                context_overhead_bytes: d.context_overhead_bytes,
                processes: d.processes.len() as u64,
                health: d.health,
                probe: d.probe.as_ref().map(|p| ProbeSeries {
                    ok: p.ok,
                    bandwidth_gbps: p.bandwidth_gbps,
                    errors: p.errors,
                    tested_bytes: p.tested_bytes,
                }),
            })
            .collect();
        let mut live = HashSet::new();
        s.pods = usage
            .iter()
            .map(|u| {
                let processes: Vec<_> = status
                    .gpus
                    .iter()
                    .filter(|d| d.uuid == u.gpu)
                    .flat_map(|d| &d.processes)
                    .filter(|p| u.pids.contains(&p.pid))
                    .collect();
                let key = (u.owner.uid.clone(), u.gpu.clone());
                let peak = self.peaks.entry(key.clone()).or_insert(0);
                *peak = processes
                    .iter()
                    .map(|p| p.peak_bytes)
                    .fold((*peak).max(u.used_bytes), u64::max);
                let ooms: Vec<u64> = processes
                    .iter()
                    .filter_map(|p| Some(p.allocator.as_ref()?.num_ooms))
                    .collect();
                let series = PodSeries {
                    namespace: u.owner.namespace.clone(),
                    pod: u.owner.name.clone(),
                    gpu: u.gpu.clone(),
                    used_bytes: u.used_bytes,
                    budget_bytes: if u.given { u.budget_bytes } else { Some(0) },
                    peak_bytes: *peak,
                    allocator_ooms: (!ooms.is_empty()).then(|| ooms.iter().sum()),
                };
                live.insert(key);
                series
            })
            .collect();
        // A pod gone (or gone from a GPU) takes its peak along.
        self.peaks.retain(|key, _| live.contains(key));
        for order in orders {
            let given = usage
                .iter()
                .find(|u| u.owner == order.owner && u.gpu == order.gpu)
                .is_none_or(|u| u.given);
            let reason = KILL_REASONS[usize::from(!given)];
            *s.kills.entry(reason.into()).or_default() += 1;
        }
        s.oom_reports = status.oom_reports.len() as u64;
        s.passes += 1;
        s.last_pass_unix = Some(unix);
        s.last_pass_at = Some(at);
        self.shared.loop_seconds.observe(took.as_secs_f64());
        self.publish();
    }

    /// [`Self::observe_pass`] now.
    pub fn pass_done(
        &mut self,
        status: &GpuNodeStatus,
        usage: &[PodGpuUsage],
        orders: &[StopOrder],
        started: Instant,
    ) {
        let now = Instant::now();
        self.observe_pass(
            status,
            usage,
            orders,
            now.saturating_duration_since(started),
            now,
            unix_now(),
        );
    }

    /// Takes a status write and how it ended, at Unix seconds `unix`.
    pub fn observe_write(&mut self, ok: bool, unix: f64) {
        let result = WRITE_RESULTS[usize::from(!ok)];
        *self.current.status_writes.entry(result.into()).or_default() += 1;
        if ok {
            self.current.last_write_unix = Some(unix);
        }
        self.publish();
    }

    /// [`Self::observe_write`] now.
    pub fn write_done(&mut self, ok: bool) {
        self.observe_write(ok, unix_now());
    }
}

/// The running server; dropping it stops it.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl MetricsServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The routes: `/metrics` and `/healthz`.
pub fn router(shared: Arc<Shared>) -> axum::Router {
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    let metrics = shared.clone();
    axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let shared = metrics.clone();
                async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], shared.encode()) }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let shared = shared.clone();
                async move {
                    match shared.health(Instant::now()) {
                        Ok(m) => (StatusCode::OK, m),
                        Err(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
                    }
                }
            }),
        )
}

/// Listens on `addr` (bound before it returns, so a port in use is an error
/// here) and serves [`router`] on a thread and runtime of its own, apart
/// from the loop's.
pub fn serve(addr: SocketAddr, shared: Arc<Shared>) -> anyhow::Result<MetricsServer> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| {
        format!("cannot listen on --metrics-addr {addr} (the chart's agent.metricsPort)")
    })?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("metrics server: {e}");
                        return;
                    }
                };
                // The sender dropped (the loop ended) stops it too.
                let shutdown = async {
                    let _ = stopped.await;
                };
                if let Err(e) = axum::serve(listener, router(shared))
                    .with_graceful_shutdown(shutdown)
                    .await
                {
                    tracing::error!("metrics server: {e}");
                }
            });
        })?;
    tracing::info!(addr = %local, "serving /metrics and /healthz");
    Ok(MetricsServer {
        addr: local,
        _stop: stop,
    })
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
