//! Controller scale benchmark: N simulated GPU nodes and M TrainingJobs applied
//! at once against a real local kube-apiserver + etcd, with the release
//! `vramfit controller` binary placing them.
//!
//! ```sh
//! cargo bench --bench controller_scale -- --nodes 200 --gpus 8 --jobs 2000
//! ```
//!
//! Prints one JSON object (see `Report`). The control plane is started with
//! `hack/controlplane.sh up --dir <tmp>` and stopped at the end, unless
//! `--kubeconfig` names one that already runs (then the benchmark's namespace,
//! nodes and GpuNodes are deleted at the end instead).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PartialObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vramfit::api::{GpuNode, GpuNodeStatus, TrainingJob};
use vramfit::place::bench::parse_vm_hwm_bytes;
use vramfit_agent::daemon::api::GpuNodeWriter;
use vramfit_agent::sim::cluster::{NodeResources, register_node};
use vramfit_agent::sim::simulated_device;

#[path = "../tests/integration/follow.rs"]
mod follow;
use follow::follow;

const GIB: u64 = 1 << 30;
const POOL_LABEL: &str = "vramfit.dev/pool";

/// Arguments (`cargo bench` appends `--bench`, which is accepted and ignored).
#[derive(Parser, Debug)]
#[command(about = "vramfit controller scale benchmark")]
struct Args {
    /// Simulated GPU nodes.
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// TrainingJobs applied at once.
    #[arg(long, default_value_t = 2000)]
    jobs: usize,
    /// GPU model of every GPU.
    #[arg(long, default_value = "H100-80GB")]
    gpu_model: String,
    /// Memory of every GPU, GiB.
    #[arg(long, default_value_t = 80)]
    gpu_gib: u64,
    /// Smallest `memory.request` per GPU, GiB.
    #[arg(long, default_value_t = 8)]
    min_request_gib: u64,
    /// Largest `memory.request` per GPU, GiB.
    #[arg(long, default_value_t = 40)]
    max_request_gib: u64,
    /// Share of jobs that ask for 2 or 4 GPUs (the rest ask for one).
    #[arg(long, default_value_t = 0.1)]
    multi_gpu_share: f64,
    /// Seed of the job mix.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Concurrent create requests of the benchmark driver.
    #[arg(long, default_value_t = 64)]
    create_concurrency: usize,
    /// Seconds between the simulated agents' heartbeats.
    #[arg(long, default_value_t = 30)]
    heartbeat_seconds: u64,
    /// `--cycle-seconds` of the controller.
    #[arg(long, default_value_t = 5)]
    cycle_seconds: u64,
    /// `--status-writers` of the controller (0: each placed status written
    /// in its job's reconcile, right after the pod).
    #[arg(long, default_value_t = vramfit::controller::status_writer::DEFAULT_WRITERS)]
    status_writers: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout_seconds: u64,
    /// The `vramfit` binary (default: the one cargo built for this benchmark).
    #[arg(long)]
    controller: Option<PathBuf>,
    /// Use this running control plane instead of starting one.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Where the controller's log goes (default: discarded).
    #[arg(long)]
    controller_log: Option<PathBuf>,
    /// `RUST_LOG` of the controller.
    #[arg(long, default_value = "warn")]
    controller_rust_log: String,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The benchmark's result. Field names are fixed; new fields may be added.
#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct Report {
    nodes: usize,
    gpus: usize,
    jobs: usize,
    /// Jobs asking for more than one GPU.
    multi_gpu_jobs: usize,
    /// Sum of the jobs' budgets over the cluster's GPU memory.
    demand_over_capacity: f64,
    placed: usize,
    /// Jobs told to wait (no room, or fits no node).
    waiting: usize,
    /// True when every job was placed or told why it waits before the timeout.
    settled: bool,
    /// Wall time of creating all jobs (the driver's concurrent POSTs).
    api_create_seconds: f64,
    /// From the first create to the last job placed (or told to wait).
    seconds_to_all_placed: f64,
    /// `placed / secondsToAllPlaced`.
    placements_per_second: f64,
    /// Time from the first create at which half / 99% of the placements were seen.
    placed_p50_seconds: f64,
    placed_p99_seconds: f64,
    /// From the first create to every placed job having its pod.
    seconds_to_all_pods: Option<f64>,
    pods: usize,
    controller_peak_rss_bytes: u64,
    /// CPU seconds (user + system) the controller used, start to end.
    controller_cpu_seconds: f64,
    placement_latency_seconds_mean: f64,
    placement_latency_seconds_p50: f64,
    placement_latency_seconds_p99: f64,
    scheduling_cycles: u64,
    scheduling_cycle_seconds_mean: f64,
    scheduling_cycle_seconds_p99: f64,
    /// GPUs whose placed budgets add up to more than their memory (must be 0).
    overcommitted_gpus: usize,
    /// Highest committed / capacity over all GPUs.
    max_gpu_commit_ratio: f64,
    /// Committed over total GPU memory after placement.
    gpu_memory_committed_ratio: f64,
    /// API requests the server served during the run (controller and driver), by `VERB resource[/subresource]`.
    api_requests: BTreeMap<String, u64>,
    apiserver_peak_rss_bytes: Option<u64>,
    etcd_peak_rss_bytes: Option<u64>,
    /// `jobs / secondsToAllPods`: jobs per second from apply to pod created.
    jobs_per_second: Option<f64>,
    /// Requests on TrainingJobs, their status, pods and events (the driver's
    /// create included) per job.
    api_requests_per_job: f64,
    /// All requests the API server served during the run, per job.
    all_api_requests_per_job: f64,
    /// CPU seconds (user + system) over the run, when this benchmark
    /// started the control plane.
    apiserver_cpu_seconds: Option<f64>,
    etcd_cpu_seconds: Option<f64>,
    /// CPU seconds of this driver (its watches, creates and simulated agents).
    driver_cpu_seconds: f64,
    /// Reconciles the controller ran, and their mean duration.
    reconcile_runs: u64,
    reconcile_seconds_mean: f64,
    /// Load average (1 minute) when the jobs were created, and at the end.
    load_average_at_start: Option<f64>,
    load_average_at_end: Option<f64>,
    /// The controller's `--status-writers`.
    status_writers: usize,
    /// Seconds after the last pod until the controller's event creates
    /// stopped (the request counts and CPU figures are taken after them).
    events_settle_seconds: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

/// Stops the control plane this benchmark started.
struct ControlPlane {
    dir: Option<PathBuf>,
    kubeconfig: PathBuf,
}

impl ControlPlane {
    fn start(args: &Args) -> Result<Self> {
        if let Some(path) = &args.kubeconfig {
            return Ok(Self {
                dir: None,
                kubeconfig: path.clone(),
            });
        }
        let dir = std::env::temp_dir().join(format!("vramfit-bench-cp-{}", std::process::id()));
        let output = Command::new("bash")
            .arg(repo_root().join("hack/controlplane.sh"))
            .args(["up", "--dir"])
            .arg(&dir)
            .stderr(Stdio::inherit())
            .output()
            .context("running hack/controlplane.sh up")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let Some(line) = stdout.lines().last().filter(|l| l.ends_with("kubeconfig")) else {
            bail!("control plane did not start: {stdout}");
        };
        Ok(Self {
            kubeconfig: PathBuf::from(line),
            dir: Some(dir),
        })
    }

    fn pid(&self, name: &str) -> Option<u32> {
        let dir = self.dir.as_ref()?;
        std::fs::read_to_string(dir.join(format!("{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = Command::new("bash")
                .arg(repo_root().join("hack/controlplane.sh"))
                .args(["down", "--dir"])
                .arg(dir)
                .status();
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The controller subprocess; killed when dropped.
struct ControllerProcess(Child);

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The checkout whose `hack/` and `crds/` the benchmark uses: `VRAMFIT_REPO_ROOT`
/// when set (a binary built here and run on another machine), else the one it was
/// built from.
fn repo_root() -> PathBuf {
    std::env::var_os("VRAMFIT_REPO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

async fn run(args: Args) -> Result<()> {
    let plane = ControlPlane::start(&args)?;
    install_crds(&plane.kubeconfig)?;
    let kubeconfig = Kubeconfig::read_from(&plane.kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;

    let tag = format!("bench-{}", Timestamp::now().as_second());
    let namespace = tag.clone();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}}))?,
        )
        .await?;

    let node_names: Vec<String> = (0..args.nodes).map(|i| format!("{tag}-n{i:04}")).collect();
    futures::stream::iter(
        node_names
            .iter()
            .map(|name| add_node(&client, &args, &tag, name)),
    )
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await?;
    let heartbeats = tokio::spawn(heartbeat_loop(
        client.clone(),
        tag.clone(),
        node_names.clone(),
        args.gpus,
        args.gpu_model.clone(),
        args.gpu_gib * GIB,
        Duration::from_secs(args.heartbeat_seconds.max(1)),
    ));

    let metrics_port = free_port()?;
    let controller = start_controller(&args, &plane.kubeconfig, &namespace, &tag, metrics_port)?;
    let pid = controller.0.id();
    // Wait until the controller's caches are complete (its first cycle ran).
    let ready_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = scrape(metrics_port).await
            && histogram(&text, "vramfit_scheduling_cycle_seconds").count >= 1.0
        {
            break;
        }
        if Instant::now() > ready_deadline {
            bail!("the controller did not start a scheduling cycle within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Follow the jobs through one watch, as a user's `kubectl get -w` would.
    let jobs_api: Api<TrainingJob> = Api::namespaced(client.clone(), &namespace);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watch = {
        let seen = seen.clone();
        follow(jobs_api.clone(), move |job| {
            seen.lock().expect("seen lock").observe(job)
        })
    };

    let pod_watch = {
        let seen = seen.clone();
        let pods_api: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), &namespace);
        follow(pods_api, move |pod| {
            seen.lock().expect("seen lock").observe_pod(&pod.name_any())
        })
    };

    let api_before = api_request_counts(&plane.kubeconfig).unwrap_or_default();
    let cpu_before = cpu_seconds(pid).unwrap_or(0.0);
    let plane_cpu = |name: &str| plane.pid(name).and_then(cpu_seconds);
    let (apiserver_cpu_before, etcd_cpu_before) = (plane_cpu("apiserver"), plane_cpu("etcd"));
    let driver_cpu_before = cpu_seconds(std::process::id()).unwrap_or(0.0);
    let load_average_at_start = load_average();
    let specs = job_specs(&args);
    let demand: u64 = specs
        .iter()
        .map(|(_, gpus, request)| u64::from(*gpus) * request * GIB)
        .sum();
    let capacity = (args.nodes * args.gpus) as u64 * args.gpu_gib * GIB;

    let started = Instant::now();
    {
        let mut s = seen.lock().expect("seen lock");
        s.started = Some(started);
    }
    futures::stream::iter(specs.iter().map(|(name, gpus, request)| {
        let api = jobs_api.clone();
        let job = job_json(name, *gpus, *request);
        async move {
            let job: TrainingJob = serde_json::from_value(job)?;
            api.create(&PostParams::default(), &job)
                .await
                .with_context(|| format!("creating {name}"))?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(args.create_concurrency.max(1))
    .try_collect::<Vec<_>>()
    .await?;
    let api_create_seconds = started.elapsed().as_secs_f64();

    let deadline = started + Duration::from_secs(args.timeout_seconds);
    let settled = loop {
        {
            let s = seen.lock().expect("seen lock");
            if s.placed.len() + s.waiting.len() >= args.jobs {
                break true;
            }
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (placed_times, waiting, last_verdict) = {
        let s = seen.lock().expect("seen lock");
        let mut times: Vec<f64> = s.placed.values().copied().collect();
        times.sort_by(f64::total_cmp);
        let last = times
            .last()
            .copied()
            .unwrap_or(0.0)
            .max(s.waiting.values().copied().fold(0.0, f64::max));
        (times, s.waiting.len(), last)
    };
    let placed = placed_times.len();

    // Pods follow the placements (seen through the driver's pod watch).
    let pods_deadline = Instant::now() + Duration::from_secs(120);
    let mut pods = 0;
    let mut seconds_to_all_pods = None;
    while settled && Instant::now() < pods_deadline {
        let (count, last) = {
            let s = seen.lock().expect("seen lock");
            (s.pods.len(), s.pods.values().copied().fold(0.0, f64::max))
        };
        pods = count;
        if pods >= placed {
            seconds_to_all_pods = Some(last);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Events go out from the controller's queue after the decisions they
    // tell of: count the requests once the event creates have stopped.
    let settle_started = Instant::now();
    let mut api_after = api_request_counts(&plane.kubeconfig).unwrap_or_default();
    let events_of = |counts: &BTreeMap<String, u64>| {
        counts.get("POST events").copied().unwrap_or(0)
            + counts.get("PATCH events").copied().unwrap_or(0)
    };
    let mut quiet = 0;
    while quiet < 2 && settle_started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = api_request_counts(&plane.kubeconfig).unwrap_or_default();
        quiet = if events_of(&now) == events_of(&api_after) {
            quiet + 1
        } else {
            0
        };
        api_after = now;
    }
    let events_settle_seconds = settle_started.elapsed().as_secs_f64();
    let metrics_text = scrape(metrics_port).await.unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let controller_peak_rss_bytes = parse_vm_hwm_bytes(&status).unwrap_or(0);
    let controller_cpu_seconds = cpu_seconds(pid).unwrap_or(0.0) - cpu_before;
    let apiserver_cpu_seconds = plane_cpu("apiserver")
        .zip(apiserver_cpu_before)
        .map(|(a, b)| round(a - b, 2));
    let etcd_cpu_seconds = plane_cpu("etcd")
        .zip(etcd_cpu_before)
        .map(|(a, b)| round(a - b, 2));
    let driver_cpu_seconds = cpu_seconds(std::process::id()).unwrap_or(0.0) - driver_cpu_before;
    let load_average_at_end = load_average();
    drop(controller);
    watch.abort();
    pod_watch.abort();
    heartbeats.abort();

    let (overcommitted_gpus, max_gpu_commit_ratio, committed) =
        check_commitments(&jobs_api, args.gpu_gib * GIB).await?;
    let latency = histogram(&metrics_text, "vramfit_placement_latency_seconds");
    let cycles = histogram(&metrics_text, "vramfit_scheduling_cycle_seconds");
    let mut api_requests = BTreeMap::new();
    for (key, after) in api_after {
        let delta = after.saturating_sub(api_before.get(&key).copied().unwrap_or(0));
        if delta > 0 {
            api_requests.insert(key, delta);
        }
    }
    let job_requests: u64 = api_requests
        .iter()
        .filter(|(key, _)| {
            let resource = key.split_once(' ').map_or("", |(_, r)| r);
            resource.starts_with("trainingjobs") || resource == "pods" || resource == "events"
        })
        .filter(|(key, _)| !key.starts_with("WATCH") && !key.starts_with("LIST"))
        .map(|(_, n)| n)
        .sum();
    let all_requests: u64 = api_requests.values().sum();
    let per_job = |n: u64| round(n as f64 / args.jobs.max(1) as f64, 2);
    let reconcile_seconds = histogram(&metrics_text, "vramfit_reconcile_duration_seconds");
    let report = Report {
        nodes: args.nodes,
        gpus: args.nodes * args.gpus,
        jobs: args.jobs,
        multi_gpu_jobs: specs.iter().filter(|(_, g, _)| *g > 1).count(),
        demand_over_capacity: round(demand as f64 / capacity as f64, 4),
        placed,
        waiting,
        settled,
        api_create_seconds: round(api_create_seconds, 3),
        seconds_to_all_placed: round(last_verdict, 3),
        placements_per_second: round(
            if last_verdict > 0.0 {
                placed as f64 / last_verdict
            } else {
                0.0
            },
            1,
        ),
        placed_p50_seconds: round(quantile(&placed_times, 0.5), 3),
        placed_p99_seconds: round(quantile(&placed_times, 0.99), 3),
        seconds_to_all_pods: seconds_to_all_pods.map(|s| round(s, 3)),
        status_writers: args.status_writers,
        pods,
        controller_peak_rss_bytes,
        controller_cpu_seconds: round(controller_cpu_seconds, 2),
        placement_latency_seconds_mean: round(latency.mean(), 3),
        placement_latency_seconds_p50: latency.quantile(0.5),
        placement_latency_seconds_p99: latency.quantile(0.99),
        scheduling_cycles: cycles.count as u64,
        scheduling_cycle_seconds_mean: round(cycles.mean(), 5),
        scheduling_cycle_seconds_p99: cycles.quantile(0.99),
        overcommitted_gpus,
        max_gpu_commit_ratio: round(max_gpu_commit_ratio, 4),
        gpu_memory_committed_ratio: round(committed as f64 / capacity as f64, 4),
        api_requests,
        apiserver_peak_rss_bytes: plane.pid("apiserver").and_then(peak_rss),
        etcd_peak_rss_bytes: plane.pid("etcd").and_then(peak_rss),
        jobs_per_second: seconds_to_all_pods
            .filter(|s| *s > 0.0)
            .map(|s| round(args.jobs as f64 / s, 1)),
        api_requests_per_job: per_job(job_requests),
        all_api_requests_per_job: per_job(all_requests),
        apiserver_cpu_seconds,
        etcd_cpu_seconds,
        driver_cpu_seconds: round(driver_cpu_seconds, 2),
        reconcile_runs: reconcile_seconds.count as u64,
        reconcile_seconds_mean: round(reconcile_seconds.mean(), 5),
        load_average_at_start,
        load_average_at_end,
        events_settle_seconds: round(events_settle_seconds, 1),
    };
    if plane.dir.is_none() {
        cleanup(&client, &namespace, &tag).await;
    }
    println!("{}", serde_json::to_string(&report)?);
    drop(plane);
    if !settled {
        bail!(
            "timed out: {placed} placed, {waiting} waiting of {}",
            args.jobs
        );
    }
    if overcommitted_gpus > 0 {
        bail!("{overcommitted_gpus} GPU(s) overcommitted");
    }
    Ok(())
}

/// What the driver's watch has seen: seconds from the first create to each
/// job's first placement, or to its first "waiting" verdict.
#[derive(Default)]
struct Seen {
    started: Option<Instant>,
    placed: HashMap<String, f64>,
    waiting: HashMap<String, f64>,
    /// Seconds from the first create to each pod's first sighting.
    pods: HashMap<String, f64>,
}

impl Seen {
    fn observe_pod(&mut self, name: &str) {
        let Some(started) = self.started else {
            return;
        };
        let now = started.elapsed().as_secs_f64();
        self.pods.entry(name.to_string()).or_insert(now);
    }

    fn observe(&mut self, job: &TrainingJob) {
        let Some(started) = self.started else {
            return;
        };
        let Some(status) = job.status.as_ref() else {
            return;
        };
        let name = job.name_any();
        let now = started.elapsed().as_secs_f64();
        if status.placement.is_some() {
            self.waiting.remove(&name);
            self.placed.entry(name).or_insert(now);
        } else if status.conditions.iter().any(|c| {
            c.type_ == "Placed"
                && c.status == "False"
                && (c.reason == "WaitingForRoom" || c.reason == "FitsNoNode")
        }) {
            self.waiting.entry(name).or_insert(now);
        }
    }
}

fn install_crds(kubeconfig: &Path) -> Result<()> {
    let status = Command::new("bash")
        .arg(repo_root().join("hack/controlplane.sh"))
        .args(["crds", "--kubeconfig"])
        .arg(kubeconfig)
        .status()
        .context("running hack/controlplane.sh")?;
    if !status.success() {
        bail!("installing crds/ failed");
    }
    Ok(())
}

fn pool_labels(pool: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(POOL_LABEL.to_string(), pool.to_string())])
}

/// A Node (untainted, with allocatable CPU and memory) and its GpuNode, as
/// the simulated node of `vramfit-agent` registers and reports them.
async fn add_node(client: &Client, args: &Args, pool: &str, name: &str) -> Result<()> {
    let resources = NodeResources {
        cpu: "224".into(),
        memory: "2Ti".into(),
        pods: "250".into(),
    };
    register_node(client, name, &pool_labels(pool), &resources).await?;
    let writer = GpuNodeWriter::new(client.clone(), name, pool_labels(pool));
    report_gpus(
        &writer,
        name,
        args.gpus,
        &args.gpu_model,
        args.gpu_gib * GIB,
    )
    .await
}

/// GpuNode status as the node agent writes it, with a fresh heartbeat.
async fn report_gpus(
    writer: &GpuNodeWriter,
    name: &str,
    gpus: usize,
    model: &str,
    bytes: u64,
) -> Result<()> {
    let status = GpuNodeStatus {
        gpus: (0..gpus as u32)
            .map(|index| simulated_device(name, index, model, bytes))
            .collect(),
        gpu_count: gpus as u32,
        model: Some(model.into()),
        heartbeat: Some(Timestamp::now().to_string()),
        ..GpuNodeStatus::default()
    };
    writer.write(&status).await?;
    Ok(())
}

async fn heartbeat_loop(
    client: Client,
    pool: String,
    names: Vec<String>,
    gpus: usize,
    model: String,
    bytes: u64,
    every: Duration,
) {
    let writers: Vec<(String, GpuNodeWriter)> = names
        .into_iter()
        .map(|name| {
            let writer = GpuNodeWriter::new(client.clone(), &name, pool_labels(&pool));
            (name, writer)
        })
        .collect();
    loop {
        tokio::time::sleep(every).await;
        let reports = writers.iter().cloned().map(|(name, writer)| {
            let model = model.clone();
            async move { report_gpus(&writer, &name, gpus, &model, bytes).await }
        });
        let _ = futures::stream::iter(reports)
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
    }
}

fn start_controller(
    args: &Args,
    kubeconfig: &Path,
    namespace: &str,
    pool: &str,
    metrics_port: u16,
) -> Result<ControllerProcess> {
    let binary = args
        .controller
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vramfit")));
    // The controller logs to standard output; both streams go to the log.
    let (stdout, stderr) = match &args.controller_log {
        Some(path) => {
            let file = std::fs::File::create(path)?;
            (Stdio::from(file.try_clone()?), Stdio::from(file))
        }
        None => (Stdio::null(), Stdio::null()),
    };
    let child = Command::new(&binary)
        .args(["controller", "--no-leader-election"])
        .args(["--namespace", namespace])
        .args(["--node-selector", &format!("{POOL_LABEL}={pool}")])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .args(["--ui-addr", &format!("127.0.0.1:{metrics_port}")])
        .args(["--cycle-seconds", &args.cycle_seconds.to_string()])
        .args(["--status-writers", &args.status_writers.to_string()])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", &args.controller_rust_log)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    Ok(ControllerProcess(child))
}

/// (name, GPUs, `memory.request` GiB per GPU) of every job, from the seed.
fn job_specs(args: &Args) -> Vec<(String, u32, u64)> {
    let mut rng = vramfit::place::rng::SeededRng::new(args.seed);
    let span = args.max_request_gib.saturating_sub(args.min_request_gib) + 1;
    (0..args.jobs)
        .map(|i| {
            let gpus = if rng.unit() < args.multi_gpu_share {
                if rng.unit() < 0.7 { 2 } else { 4 }
            } else {
                1
            };
            let request = args.min_request_gib + rng.next_u64() % span;
            (format!("job-{i:05}"), gpus, request)
        })
        .collect()
}

fn job_json(name: &str, gpus: u32, request_gib: u64) -> Value {
    TrainingJob::test(name)
        .gpus(gpus)
        .batch(64, 8)
        .model(json!({"mlp": {"layers": 8, "hidden": 4096}, "precision": "fp32", "optimizer": "adamw"}))
        .request(&format!("{request_gib}Gi"))
        .template_spec(json!({"containers": [{"name": "train", "image": "trainer",
            "resources": {"requests": {"cpu": "4", "memory": "32Gi"}}}]}))
        .manifest()
}

/// Sums the placed budgets per GPU: (GPUs over capacity, highest ratio,
/// committed bytes).
async fn check_commitments(api: &Api<TrainingJob>, capacity: u64) -> Result<(usize, f64, u64)> {
    let mut per_gpu: HashMap<(String, u32), u64> = HashMap::new();
    for job in api.list(&ListParams::default()).await?.items {
        let Some(placement) = job.status.and_then(|s| s.placement) else {
            continue;
        };
        for gpu in &placement.gpus {
            *per_gpu
                .entry((placement.node.clone(), gpu.index))
                .or_default() += placement.budget_bytes;
        }
    }
    let over = per_gpu.values().filter(|b| **b > capacity).count();
    let max = per_gpu.values().copied().max().unwrap_or(0) as f64 / capacity as f64;
    Ok((over, max, per_gpu.values().sum()))
}

async fn cleanup(client: &Client, namespace: &str, pool: &str) {
    let selector = ListParams::default().labels(&format!("{POOL_LABEL}={pool}"));
    let _ = Api::<Namespace>::all(client.clone())
        .delete(namespace, &DeleteParams::default())
        .await;
    let _ = Api::<Node>::all(client.clone())
        .delete_collection(&DeleteParams::default(), &selector)
        .await;
    let _ = Api::<GpuNode>::all(client.clone())
        .delete_collection(&DeleteParams::default(), &selector)
        .await;
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// GET /metrics of the controller (plain HTTP/1.0 on loopback).
async fn scrape(port: u16) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

/// A Prometheus histogram read from the text format.
#[derive(Default)]
struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    fn mean(&self) -> f64 {
        if self.count > 0.0 {
            self.sum / self.count
        } else {
            0.0
        }
    }

    /// Upper bound of the bucket holding the quantile.
    fn quantile(&self, q: f64) -> f64 {
        let want = q * self.count;
        self.buckets
            .iter()
            .find(|(_, cumulative)| *cumulative >= want && self.count > 0.0)
            .map_or(0.0, |(le, _)| *le)
    }
}

fn histogram(text: &str, name: &str) -> Histogram {
    let mut h = Histogram::default();
    for line in text.lines() {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if key == format!("{name}_sum") {
            h.sum = value;
        } else if key == format!("{name}_count") {
            h.count = value;
        } else if let Some(rest) = key.strip_prefix(&format!("{name}_bucket{{le=\"")) {
            let le = rest.trim_end_matches("\"}");
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            h.buckets.push((le, value));
        }
    }
    h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    h
}

/// `apiserver_request_total` summed by `VERB resource[/subresource]`.
fn api_request_counts(kubeconfig: &Path) -> Result<BTreeMap<String, u64>> {
    let output = Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(["get", "--raw", "/metrics"])
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let counts = vramfit_agent::sim::fleet::request_totals(&text)
        .into_iter()
        .filter(|((_, resource, _), _)| !resource.is_empty())
        .map(|((verb, resource, subresource), value)| {
            let key = if subresource.is_empty() {
                format!("{verb} {resource}")
            } else {
                format!("{verb} {resource}/{subresource}")
            };
            (key, value as u64)
        })
        .collect();
    Ok(counts)
}

/// The 1-minute load average.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn peak_rss(pid: u32) -> Option<u64> {
    parse_vm_hwm_bytes(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}
