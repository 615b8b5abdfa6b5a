//! The TrainingJob controller: predict -> place -> pod -> status -> OOM back-off.
//!
//! Pure decisions live in [`transition`] (the reconcile's status
//! transitions), [`backoff`], [`exit`], [`pod`], [`inventory`] and
//! [`scheduler::plan_cycle`]; this module wires them to the API server. See
//! docs/controller.md.

pub mod absorbed;
pub mod allocation;
pub mod events;
pub mod fence;
pub mod held;
pub mod inventory;
pub mod job_index;
pub mod metrics;
pub mod model_cache;
pub mod pod;
pub mod pod_ledger;
pub mod pods_first;
mod reconcile;
pub mod retry;
pub mod scheduler;
pub mod status;
pub mod status_writer;
pub mod supervise;
pub mod transition;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;

use crate::api::{GpuNode, Phase, TrainingJob};
use crate::place::{Policy, PolicyKind};
use crate::{Error, Result};
use inventory::{ClusterView, cluster_view};
use metrics::{Metrics, PhaseLabel};
use scheduler::{
    Assignments, Verdict, current_attempt, is_waiting, plan_cycle, recorded, recorded_placements,
};

/// Finalizer that releases a job's placement and pod.
pub const FINALIZER: &str = "vramfit.dev/release-placement";

/// Reconciles that run at once. Each one talks to the API server; without a
/// bound, a burst of new jobs opens one connection and one request per job.
const RECONCILE_CONCURRENCY: u16 = 32;

/// Pause after a wake-up before the scheduling cycle runs.
const CYCLE_BATCH_WINDOW: Duration = Duration::from_millis(100);

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Watch TrainingJobs of this namespace only (all when `None`).
    pub namespace: Option<String>,
    /// Label selector for the `Node`s and `GpuNode`s vramfit may use.
    pub node_selector: Option<String>,
    /// A `GpuNode` is trusted while its heartbeat is younger than this.
    pub heartbeat_ttl: Duration,
    /// Placement policy.
    pub policy: PolicyKind,
    /// Seconds between scheduling cycles when nothing wakes the scheduler.
    pub cycle_interval: Duration,
    /// Where `/metrics` is served (none when `None`).
    pub metrics_addr: Option<SocketAddr>,
    /// Lease used for leader election (none: run without election).
    pub lease: Option<LeaseOptions>,
    /// Node folder of the pods' stats folders (docs/node-protocol.md).
    pub stats_root: String,
    /// Placed statuses written at once after their pods (`status_writer`);
    /// 0 writes each in its job's reconcile.
    pub status_writers: usize,
}

/// The Lease two replicas compete for.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            node_selector: None,
            heartbeat_ttl: Duration::from_secs(120),
            policy: PolicyKind::Vramfit,
            cycle_interval: Duration::from_secs(5),
            metrics_addr: None,
            lease: None,
            stats_root: crate::job::keys::DEFAULT_STATS_ROOT.into(),
            status_writers: status_writer::DEFAULT_WRITERS,
        }
    }
}

/// Shared state of the reconcilers and the scheduling cycle.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Where the reconciles queue their events.
    pub events: events::EventQueue,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Decisions of the scheduling cycle not yet written to status.
    pub assignments: Assignments,
    /// Predictions not yet written, held until the cycle's verdict.
    pub held: Arc<held::HeldPredictions>,
    /// The versions this process's own status writes produced.
    pub own_writes: Arc<held::OwnWrites>,
    /// What predictions read across all jobs, kept from the job watch.
    index: Arc<job_index::JobIndex>,
    gpu_nodes: Store<GpuNode>,
    /// The GPU models of `gpu_nodes`, kept until their GPUs change.
    gpu_models_cache: model_cache::GpuModelCache,
    pods: Store<Pod>,
    wake: Arc<Notify>,
    /// Node folder of the pods' stats folders.
    pub stats_root: String,
    /// Closed once this replica may no longer act as the leader.
    pub fence: Arc<fence::Fence>,
    /// Where placed statuses wait for the status writer.
    pub status_queue: status_writer::StatusQueue,
    /// True when the status writer writes placed statuses.
    pub defer_placed_status: bool,
    /// The pod creates in flight, which the status writer and the event
    /// sender give way to.
    pub pods_first: Arc<pods_first::PodsFirst>,
}

impl Context {
    /// The training pod `name` in `namespace`, as the pod watch last saw it.
    pub fn cached_pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// Asks for a scheduling cycle soon.
    pub fn wake_scheduler(&self) {
        self.wake.notify_one();
    }

    /// Highest peak measured for a job with this model signature.
    pub fn measured_peak_for(&self, signature: &str) -> Option<u64> {
        self.index.measured_peak_for(signature)
    }

    /// The micro-batch a new job of this spec should start at, learned from
    /// jobs of the same model whose processes absorbed OOMs, with the name of
    /// the job it was learned from.
    pub fn learned_start_micro(&self, spec: &crate::api::TrainingJobSpec) -> Option<(u32, String)> {
        let signature = crate::job::signature::model_signature(spec, spec.batch.micro);
        absorbed::start_micro_below(spec, self.index.smallest_backoff(&signature)?)
    }

    /// The batch shape a pod's process reports (through the node agent), when
    /// it reports one; the one with the most absorbed OOMs when there are several.
    pub fn observed_shape_for_pod(
        &self,
        node: &str,
        namespace: &str,
        pod: &str,
    ) -> Option<crate::api::ObservedShape> {
        let gpu_node = self.gpu_nodes.get(&ObjectRef::new(node))?;
        let status = gpu_node.status.as_ref()?;
        status
            .gpus
            .iter()
            .flat_map(|g| g.processes.iter())
            .filter(|p| {
                p.pod_namespace.as_deref() == Some(namespace) && p.pod_name.as_deref() == Some(pod)
            })
            .filter_map(|p| p.shape.clone())
            .max_by_key(|s| s.absorbed_ooms.len())
    }

    /// Peak the node's agent measured for a pod's processes.
    pub fn measured_for_pod(&self, node: &str, namespace: &str, pod: &str) -> Option<u64> {
        let gpu_node = self.gpu_nodes.get(&ObjectRef::new(node))?;
        let status = gpu_node.status.as_ref()?;
        status
            .gpus
            .iter()
            .flat_map(|g| g.processes.iter())
            .filter(|p| {
                p.pod_namespace.as_deref() == Some(namespace) && p.pod_name.as_deref() == Some(pod)
            })
            .map(|p| p.peak_bytes.max(p.used_bytes))
            .max()
    }

    /// The GPU models of the cluster's nodes, each with the largest capacity
    /// a GPU of that model reports, in name order.
    pub fn gpu_models(&self) -> Vec<(String, u64)> {
        self.gpu_models_cache.get_or_compute(|| {
            let mut models = std::collections::BTreeMap::<String, u64>::new();
            for node in self.gpu_nodes.state() {
                for gpu in node.status.iter().flat_map(|s| s.gpus.iter()) {
                    // Runs over every GPU (once per change of their GPUs):
                    // the name is copied only the first time its model is seen.
                    match models.get_mut(&gpu.model) {
                        Some(largest) => *largest = (*largest).max(gpu.total_bytes),
                        None => {
                            models.insert(gpu.model.clone(), gpu.total_bytes);
                        }
                    }
                }
            }
            models.into_iter().collect()
        })
    }

    /// True when the node's agent reported the pod for exceeding its budget.
    pub fn agent_reported_oom(&self, node: &str, namespace: &str, pod: &str) -> bool {
        self.gpu_nodes
            .get(&ObjectRef::new(node))
            .and_then(|n| n.status.clone())
            .is_some_and(|s| {
                s.oom_reports
                    .iter()
                    .any(|r| r.pod_namespace == namespace && r.pod_name == pod)
            })
    }
}

/// Runs the controller until a termination signal (`Ok`), until it loses its
/// Lease (`Error::LeadershipLost`) or until a background task stops.
pub async fn run(client: Client, options: ControllerOptions) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    let mut tasks = supervise::Supervisor::default();
    if let Some(addr) = options.metrics_addr {
        let ui = UiSource {
            client: client.clone(),
            namespace: options.namespace.clone(),
            node_selector: options.node_selector.clone(),
            heartbeat_ttl: options.heartbeat_ttl,
        };
        // Bound before the election, so a standby serves /healthz and /ui too
        // and a taken address fails the start-up rather than a task later.
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Io {
                path: format!("--metrics-addr {addr}"),
                source,
            })?;
        tasks.spawn(
            "metrics server",
            serve_metrics(listener, metrics.clone(), ui),
        );
    }
    let mut lease_manager = None;
    let mut leader_fence = Arc::new(fence::Fence::unfenced());
    if let Some(lease) = &options.lease {
        let (lost, manager, channel, fence) = acquire_leadership(client.clone(), lease).await?;
        tasks.spawn("lease", lost);
        lease_manager = Some((manager, channel));
        leader_fence = fence;
    }
    let jobs_api: Api<TrainingJob> = match &options.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let pods_api: Api<Pod> = match &options.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut node_config = watcher::Config::default();
    if let Some(selector) = &options.node_selector {
        node_config = node_config.labels(selector);
    }
    let (gpu_nodes, gpu_node_writer) = reflector::store::<GpuNode>();
    let (nodes, node_writer) = reflector::store::<Node>();
    // The training pods, cached: their changes trigger the owning job's
    // reconcile, and the reconcile reads them from here instead of the API.
    let (pods, pod_writer) = reflector::store::<Pod>();
    let pod_stream = watcher(
        pods_api,
        watcher::Config::default().labels(crate::job::keys::JOB_LABEL),
    )
    .default_backoff()
    // Nothing reads managedFields; dropping them keeps the cache small.
    .modify(|pod| pod.metadata.managed_fields = None)
    .reflect(pod_writer)
    .touched_objects();
    // The job watch, as `Controller::new` would make it, with the index of what
    // predictions read across all jobs kept from its events.
    let (jobs, job_writer) = reflector::store::<TrainingJob>();
    let index = Arc::new(job_index::JobIndex::default());
    let wake = Arc::new(Notify::new());
    let held_predictions = Arc::new(held::HeldPredictions::default());
    let own_writes = Arc::new(held::OwnWrites::default());
    let job_stream = {
        let index = index.clone();
        let wake = wake.clone();
        let (held, own_writes) = (held_predictions.clone(), own_writes.clone());
        watcher(jobs_api, watcher::Config::default())
            // Nothing reads managedFields; dropping them keeps the cache small.
            .modify(|job| job.metadata.managed_fields = None)
            .reflect(job_writer)
            .inspect_ok(move |event| {
                index.observe(event);
                // A job gone frees its room once its pod is: the cycle
                // deletes the pod and counts it until then.
                if let watcher::Event::Delete(job) = event {
                    // What is kept in memory for the job goes with it.
                    let uid = job.metadata.uid.as_deref().unwrap_or_default();
                    held.forget(uid);
                    own_writes.forget(uid);
                    wake.notify_one();
                }
            })
            .applied_objects()
    };
    let controller = Controller::for_stream(job_stream, jobs.clone()).with_config(
        kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY),
    );
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "vramfit-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let (event_queue, queued_events) = events::EventQueue::new();
    let pods_first = Arc::new(pods_first::PodsFirst::default());
    tasks.spawn(
        "event publisher",
        events::send_all(recorder, queued_events, pods_first.clone()),
    );
    let (status_queue, queued_statuses) = status_writer::StatusQueue::new();
    let ctx = Arc::new(Context {
        client: client.clone(),
        events: event_queue,
        metrics,
        assignments: Assignments::default(),
        held: held_predictions,
        own_writes,
        index,
        gpu_nodes: gpu_nodes.clone(),
        gpu_models_cache: Default::default(),
        pods: pods.clone(),
        wake,
        stats_root: options.stats_root.clone(),
        fence: leader_fence,
        status_queue,
        defer_placed_status: options.status_writers > 0,
        pods_first,
    });
    let (trigger, triggers) = futures::channel::mpsc::unbounded::<ObjectRef<TrainingJob>>();
    if options.status_writers > 0 {
        tasks.spawn(
            "status writer",
            status_writer::run(
                ctx.clone(),
                jobs.clone(),
                queued_statuses,
                options.status_writers,
            ),
        );
    }

    // A GpuNode change wakes the scheduler unless it only changed the
    // allocation the controller itself writes there. Most are heartbeats; the
    // jobs placed on a node only read its processes and OOM reports, so only
    // a change of those re-runs them.
    let gpu_node_stream = {
        let ctx = ctx.clone();
        watcher(Api::<GpuNode>::all(client.clone()), node_config.clone())
            .default_backoff()
            .reflect(gpu_node_writer)
            .inspect_ok({
                let ctx = ctx.clone();
                move |event| ctx.gpu_models_cache.observe(event)
            })
            .applied_objects()
            .inspect_ok({
                let mut seen = SchedulerFacing::default();
                move |node| {
                    if seen.changed(node) {
                        ctx.wake_scheduler();
                    }
                }
            })
            .predicate_filter(
                |node: &GpuNode| Some(job_facing_fingerprint(node)),
                Default::default(),
            )
    };
    let jobs_on_node = {
        let jobs = jobs.clone();
        move |gpu_node: GpuNode| {
            let name = gpu_node.name_any();
            jobs.state()
                .into_iter()
                .filter(|job| recorded(job).is_some_and(|p| p.node == name))
                .map(|job| ObjectRef::from_obj(job.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    let node_stream = watcher(Api::<Node>::all(client.clone()), node_config)
        .default_backoff()
        .reflect(node_writer)
        .applied_objects();
    {
        let ctx = ctx.clone();
        tasks.spawn("Node watch", async move {
            let mut stream = std::pin::pin!(node_stream);
            while stream.next().await.is_some() {
                ctx.wake_scheduler();
            }
            Ok(())
        });
    }
    let allocations = Arc::new(Notify::new());
    tasks.spawn(
        "allocation writer",
        allocation::run(
            client.clone(),
            jobs.clone(),
            gpu_nodes.clone(),
            allocations.clone(),
            ctx.fence.clone(),
            heartbeat_ttl(&options),
        ),
    );
    tasks.spawn(
        "scheduling loop",
        scheduling_loop(
            ctx.clone(),
            jobs.clone(),
            gpu_nodes,
            nodes,
            options.clone(),
            trigger,
            allocations,
        ),
    );

    tracing::info!(namespace = ?options.namespace, policy = ?options.policy, "controller started");
    let controller = controller
        .owns_stream(pod_stream)
        .watches_stream(gpu_node_stream, jobs_on_node)
        .reconcile_on(triggers)
        .shutdown_on_signal()
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile error");
            }
        });
    // Whatever ends first ends the process; the rest is dropped at once (an
    // in-flight reconcile stops at its next request), so a replica that lost
    // its Lease writes nothing more.
    let result = tokio::select! {
        () = controller => {
            tracing::info!("controller stopped on a termination signal");
            Ok(())
        }
        error = tasks.first_exit() => {
            tracing::error!(%error, "controller stopping");
            Err(error)
        }
    };
    drop(tasks);
    if let Some((manager, channel)) = lease_manager {
        // A replica that lost the Lease (or let it run out) releases nothing:
        // the lease manager's view may be older than the loss, and its
        // release would clear the new holder's hold.
        if matches!(result, Err(Error::LeadershipLost(_))) {
            manager.abort();
        }
        // Otherwise (a termination signal, a task that stopped), the last
        // receiver of its channel gone, the manager releases the Lease, so a
        // standby takes over at once instead of after the Lease's 15 s.
        drop(channel);
        let _ = tokio::time::timeout(Duration::from_secs(2), manager).await;
    }
    result
}

/// Hash of what can change a placement in a `GpuNode`: its labels, deletion,
/// spec (cordon) and each GPU's identity, model, capacity and health. Not the
/// heartbeat, the memory in use, the processes, the probe or the
/// `status.allocation` the controller writes: the cycle does not read them
/// (memory is committed by budget, not by use), and one wake-up per
/// heartbeat would run a cycle for nearly every heartbeat at a few thousand
/// nodes. A heartbeat that crosses the TTL (a node gone stale, or back) is
/// seen by the cycle that runs at least every `--cycle-seconds`.
fn scheduler_facing_fingerprint(gpu_node: &GpuNode) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    gpu_node.metadata.labels.hash(&mut hasher);
    gpu_node
        .metadata
        .deletion_timestamp
        .is_some()
        .hash(&mut hasher);
    serde_json::to_string(&gpu_node.spec)
        .unwrap_or_default()
        .hash(&mut hasher);
    match gpu_node.status.as_ref() {
        None => 0u8.hash(&mut hasher),
        Some(status) => {
            1u8.hash(&mut hasher);
            for gpu in &status.gpus {
                (gpu.index, &gpu.uuid, &gpu.model, gpu.total_bytes).hash(&mut hasher);
                serde_json::to_string(&gpu.health)
                    .unwrap_or_default()
                    .hash(&mut hasher);
            }
        }
    }
    hasher.finish()
}

/// The last [`scheduler_facing_fingerprint`] of each `GpuNode` seen.
#[derive(Default)]
struct SchedulerFacing {
    seen: HashMap<String, u64>,
}

impl SchedulerFacing {
    /// True when what the scheduler reads of `gpu_node` changed since its
    /// last version seen (or it is new).
    fn changed(&mut self, gpu_node: &GpuNode) -> bool {
        let fingerprint = scheduler_facing_fingerprint(gpu_node);
        self.seen.insert(gpu_node.name_any(), fingerprint) != Some(fingerprint)
    }
}

/// Hash of what the reconciles of the jobs on a node read from its `GpuNode`:
/// per-process usage (measured peaks) and the agent's OOM reports.
fn job_facing_fingerprint(gpu_node: &GpuNode) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    if let Some(status) = gpu_node.status.as_ref() {
        for gpu in &status.gpus {
            serde_json::to_string(&gpu.processes)
                .unwrap_or_default()
                .hash(&mut hasher);
        }
        serde_json::to_string(&status.oom_reports)
            .unwrap_or_default()
            .hash(&mut hasher);
    }
    hasher.finish()
}

fn heartbeat_ttl(options: &ControllerOptions) -> SignedDuration {
    SignedDuration::try_from(options.heartbeat_ttl).unwrap_or(SignedDuration::from_secs(120))
}

async fn scheduling_loop(
    ctx: Arc<Context>,
    jobs: Store<TrainingJob>,
    gpu_nodes: Store<GpuNode>,
    nodes: Store<Node>,
    options: ControllerOptions,
    trigger: futures::channel::mpsc::UnboundedSender<ObjectRef<TrainingJob>>,
    allocations: Arc<Notify>,
) -> Result<()> {
    // A cycle on a half-filled job cache could hand out memory that a job not
    // yet seen already holds, so the first cycle waits for complete caches.
    wait_ready(&jobs).await?;
    wait_ready(&gpu_nodes).await?;
    wait_ready(&nodes).await?;
    // Pods hold memory their jobs' status may not record (`pod_ledger`).
    wait_ready(&ctx.pods).await?;
    tracing::debug!("caches ready; scheduling starts");
    let ttl = heartbeat_ttl(&options);
    let mut deleting = HashMap::new();
    loop {
        // A replica past its Lease decides nothing more (and the process ends).
        ctx.fence.check()?;
        let started = Instant::now();
        // Jobs whose prediction is held (not yet written) are placed on it.
        let job_list = ctx.held.overlay_all(jobs.state());
        let job_refs: Vec<&TrainingJob> = job_list.iter().map(|j| j.as_ref()).collect();
        let gpu_node_list = gpu_nodes.state();
        let node_list = nodes.state();
        let pod_list = ctx.pods.state();
        let outcome = run_cycle(
            &ctx.assignments,
            &job_refs,
            &pod_list.iter().map(|p| p.as_ref()).collect::<Vec<_>>(),
            &gpu_node_list.iter().map(|n| n.as_ref()).collect::<Vec<_>>(),
            &node_list.iter().map(|n| n.as_ref()).collect::<Vec<_>>(),
            Timestamp::now(),
            ttl,
            options.policy,
        );
        for job in &outcome.changed {
            let _ = trigger.unbounded_send(ObjectRef::from_obj(*job));
        }
        delete_orphans(&ctx, outcome.orphans.clone(), &mut deleting);
        let (view, ledger) = (outcome.view, outcome.ledger);
        update_gauges(&ctx.metrics, &job_refs, &view, &ledger);
        // A replica past its Lease decides nothing more (and the process ends).
        ctx.fence.check()?;
        // The GpuNodes' allocations follow on their own task.
        allocations.notify_one();
        ctx.metrics
            .cycle_seconds
            .observe(started.elapsed().as_secs_f64());
        tokio::select! {
            _ = ctx.wake.notified() => {}
            _ = tokio::time::sleep(options.cycle_interval) => {}
        }
        // Wake-ups come in bursts (one per predicted job); a short pause lets
        // one cycle take the whole burst instead of one cycle per wake-up.
        tokio::time::sleep(CYCLE_BATCH_WINDOW).await;
    }
}

/// How long a pod asked to be deleted is left to the request before it is
/// asked again (the request failed, or the job turned out to exist).
const ORPHAN_RETRY: Duration = Duration::from_secs(30);

/// Deletes the pods of jobs that are gone, each once per [`ORPHAN_RETRY`]:
/// `deleting` keeps when each was asked for, until a cycle no longer lists it
/// (its deletion is seen in the cache). Each job is read first, so a job the
/// cache has not seen yet keeps its pod.
fn delete_orphans(
    ctx: &Arc<Context>,
    orphans: Vec<pod_ledger::OrphanPod>,
    deleting: &mut HashMap<pod_ledger::OrphanPod, Instant>,
) {
    deleting.retain(|pod, asked| orphans.contains(pod) && asked.elapsed() < ORPHAN_RETRY);
    for orphan in orphans {
        if deleting.contains_key(&orphan) {
            continue;
        }
        deleting.insert(orphan.clone(), Instant::now());
        let ctx = ctx.clone();
        tokio::spawn(async move {
            if let Err(error) = delete_orphan(&ctx, &orphan).await {
                tracing::warn!(%error, namespace = orphan.namespace, pod = orphan.pod,
                    "could not delete the pod of a deleted job");
            }
        });
    }
}

async fn delete_orphan(ctx: &Context, orphan: &pod_ledger::OrphanPod) -> Result<()> {
    let jobs: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &orphan.namespace);
    let job = jobs.get_opt(&orphan.job).await.map_err(Error::Kube)?;
    if job.is_some_and(|j| j.metadata.uid.as_deref() == Some(orphan.job_uid.as_str())) {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &orphan.namespace);
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(orphan.pod_uid.clone()),
            resource_version: None,
        }),
        ..kube::api::DeleteParams::background()
    };
    ctx.fence.check()?;
    match pods.delete(&orphan.pod, &params).await {
        Ok(_) => {
            tracing::info!(
                namespace = orphan.namespace,
                job = orphan.job,
                pod = orphan.pod,
                decision = "released",
                "decision"
            );
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// What one scheduling cycle decided.
pub struct CycleOutcome<'a> {
    /// The inventory it placed on.
    pub view: ClusterView,
    /// Every placement after the cycle: recorded in status, assigned and not
    /// yet recorded, and made by this cycle.
    pub ledger: Vec<crate::place::Placement>,
    /// Jobs that were waiting.
    pub waiting: usize,
    /// Jobs whose verdict changed (their reconcile must run).
    pub changed: Vec<&'a TrainingJob>,
    /// Pods of jobs that are gone, to delete.
    pub orphans: Vec<pod_ledger::OrphanPod>,
}

/// One scheduling cycle over a snapshot of the caches: rebuilds the ledger
/// (from the jobs' status, the cycle's own decisions not yet written and the
/// pods that neither records, `pod_ledger`), places the waiting jobs and
/// records the verdicts in `assignments`.
#[allow(clippy::too_many_arguments)]
pub fn run_cycle<'a>(
    assignments: &Assignments,
    jobs: &[&'a TrainingJob],
    pods: &[&Pod],
    gpu_nodes: &[&GpuNode],
    nodes: &[&Node],
    now: Timestamp,
    ttl: SignedDuration,
    policy: PolicyKind,
) -> CycleOutcome<'a> {
    let view = cluster_view(gpu_nodes, nodes, now, ttl);
    let mut changed = Vec::new();
    let from_pods = pod_ledger::read_pods(jobs, pods, |uid, attempt| {
        assignments.placement(uid, attempt).is_some()
    });
    if !from_pods.unrecorded.is_empty() {
        // A pod created before a stop that kept its placement from status:
        // the cycle takes it as its own decision, which the job's reconcile
        // then writes.
        let by_uid: HashMap<&str, &'a TrainingJob> = jobs
            .iter()
            .filter_map(|j| j.metadata.uid.as_deref().map(|uid| (uid, *j)))
            .collect();
        for (uid, attempt, placement) in from_pods.unrecorded {
            assignments.record(&uid, attempt, scheduler::Verdict::Place(placement));
            if let Some(job) = by_uid.get(uid.as_str()) {
                changed.push(*job);
            }
        }
    }
    let mut ledger = recorded_placements(jobs.iter().copied());
    ledger.extend(assignments.pending_ledger(jobs));
    ledger.extend(from_pods.orphaned);
    let waiting: Vec<&'a TrainingJob> = jobs
        .iter()
        .copied()
        .filter(|job| {
            let uid = job.metadata.uid.as_deref().unwrap_or_default();
            is_waiting(
                job,
                assignments.placement(uid, current_attempt(job)).is_some(),
            )
        })
        .collect();
    tracing::debug!(
        nodes = view.inventory.nodes.len(),
        placed = ledger.len(),
        waiting = waiting.len(),
        "scheduling cycle"
    );
    if !waiting.is_empty() {
        let by_key: HashMap<String, &'a TrainingJob> = waiting
            .iter()
            .map(|j| (inventory::job_key(j), *j))
            .collect();
        let verdicts = plan_cycle(&view, &ledger, &waiting, Policy::new(policy, 42));
        for (key, verdict) in verdicts {
            let Some(job) = by_key.get(&key) else {
                continue;
            };
            let uid = job.metadata.uid.as_deref().unwrap_or_default();
            if let Verdict::Place(p) = &verdict {
                ledger.push(inventory::recorded_placement(job, p));
            }
            if assignments.record(uid, current_attempt(job), verdict) {
                changed.push(*job);
            }
        }
    }
    CycleOutcome {
        view,
        ledger,
        waiting: waiting.len(),
        changed,
        orphans: from_pods.to_delete,
    }
}

/// Waits for a reflector's first complete list. The store's readiness signal
/// wakes only the last task that polled it, and the controller's runner polls
/// the same one, so poll again on a short timer rather than wait for a wake-up.
async fn wait_ready<K>(store: &Store<K>) -> Result<()>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(_)) => {
                return Err(Error::TaskStopped {
                    task: "watch cache",
                    reason: "dropped before its first list".into(),
                });
            }
            Err(_) => continue,
        }
    }
}

fn update_gauges(
    metrics: &Metrics,
    jobs: &[&TrainingJob],
    view: &ClusterView,
    ledger: &[crate::place::Placement],
) {
    let mut counts: HashMap<Phase, i64> = HashMap::new();
    for job in jobs {
        let phase = job.status.as_ref().map(|s| s.phase).unwrap_or_default();
        *counts.entry(phase).or_default() += 1;
    }
    for phase in [
        Phase::Pending,
        Phase::Placed,
        Phase::Running,
        Phase::Retrying,
        Phase::Succeeded,
        Phase::Failed,
    ] {
        let label = PhaseLabel {
            phase: format!("{phase:?}"),
        };
        metrics
            .jobs
            .get_or_create(&label)
            .set(counts.get(&phase).copied().unwrap_or(0));
    }
    let total: u64 = view
        .inventory
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .map(|g| g.capacity)
        .sum();
    let committed: u64 = ledger
        .iter()
        .map(|p| p.gpu_budget * p.gpu_indices.len() as u64)
        .sum();
    metrics
        .total_bytes
        .set(i64::try_from(total).unwrap_or(i64::MAX));
    metrics
        .committed_bytes
        .set(i64::try_from(committed).unwrap_or(i64::MAX));
}

/// What the `/ui` page reads: the same objects as `vramfit status`, listed
/// on each request (a standby replica serves the page too).
#[derive(Clone)]
struct UiSource {
    client: Client,
    namespace: Option<String>,
    node_selector: Option<String>,
    heartbeat_ttl: Duration,
}

/// Seconds between the page's reloads.
const UI_REFRESH_SECONDS: u32 = 5;

impl UiSource {
    async fn view(&self) -> std::result::Result<crate::status::ClusterStatus, String> {
        let (jobs, gpu_nodes) = crate::status::fetch(
            &self.client,
            self.namespace.as_deref(),
            self.node_selector.as_deref(),
        )
        .await
        .map_err(|e| format!("listing TrainingJobs and GpuNodes: {e}"))?;
        let ttl =
            SignedDuration::try_from(self.heartbeat_ttl).unwrap_or(SignedDuration::from_secs(120));
        Ok(crate::status::cluster_status(
            &jobs,
            &gpu_nodes,
            Timestamp::now(),
            ttl,
        ))
    }
}

async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ui: UiSource,
) -> Result<()> {
    use axum::http::{StatusCode, header};
    use axum::response::{IntoResponse, Redirect};
    use axum::{Router, routing::get};
    let page_source = ui.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move { m.encode() }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/", get(|| async { Redirect::temporary("/ui") }))
        .route(
            "/ui",
            get(move || {
                let source = page_source.clone();
                async move {
                    match source.view().await {
                        Ok(view) => (
                            StatusCode::OK,
                            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                            crate::status::html::render(&view, UI_REFRESH_SECONDS),
                        )
                            .into_response(),
                        Err(message) => (
                            StatusCode::BAD_GATEWAY,
                            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                            crate::status::html::error_page(&message, UI_REFRESH_SECONDS),
                        )
                            .into_response(),
                    }
                }
            }),
        )
        .route(
            "/ui/status.json",
            get(move || {
                let source = ui.clone();
                async move {
                    match source.view().await {
                        Ok(view) => axum::Json(view).into_response(),
                        Err(message) => (StatusCode::BAD_GATEWAY, message).into_response(),
                    }
                }
            }),
        );
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    axum::serve(listener, app)
        .await
        .map_err(|source| Error::Io {
            path: format!("metrics server on {addr}"),
            source,
        })
}

/// Waits until this replica holds the Lease. Returns the lease manager's task,
/// a receiver of its channel (dropping the last one releases the Lease), the
/// fence the writes check, and a future that ends with
/// `Error::LeadershipLost` when another replica takes the Lease, when the
/// Lease expires before this replica is seen renewing it (the API server away
/// longer than the Lease, or this process paused past it), or when the lease
/// manager stops: the controller then stops acting at once and the process
/// exits, to campaign again as a standby when restarted.
async fn acquire_leadership(
    client: Client,
    lease: &LeaseOptions,
) -> Result<(
    impl std::future::Future<Output = Result<()>> + Send + 'static,
    tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    tokio::sync::watch::Receiver<bool>,
    Arc<fence::Fence>,
)> {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_lease_manager::LeaseManagerBuilder;
    let manager = LeaseManagerBuilder::new(client.clone(), &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await
        .map_err(|e| Error::Leadership(e.to_string()))?;
    let (mut channel, manager_task) = manager.watch().await;
    tracing::info!(lease = %lease.name, identity = %lease.identity, "waiting for leadership");
    while !*channel.borrow_and_update() {
        if channel.changed().await.is_err() {
            return Err(Error::Leadership("lease manager stopped".into()));
        }
    }
    // The fence opens until the expiry of the Lease as this replica took it.
    let leases: Api<Lease> = Api::namespaced(client, &lease.namespace);
    let taken = leases
        .get(&lease.name)
        .await
        .map_err(|e| Error::Leadership(format!("reading Lease {}: {e}", lease.name)))?;
    let until = fence::hold_until(&taken, &lease.identity).ok_or_else(|| {
        Error::Leadership(format!(
            "Lease {} is not held by {} after it was taken",
            lease.name, lease.identity
        ))
    })?;
    let leader_fence = Arc::new(fence::Fence::until(until));
    tracing::info!(lease = %lease.name, "became leader");
    // Held by the caller until it decides whether the Lease is released (the
    // manager releases it once every receiver is gone).
    let kept = channel.clone();
    let (name, identity, fence) = (
        lease.name.clone(),
        lease.identity.clone(),
        leader_fence.clone(),
    );
    let lost = async move {
        // Each renewal shows in the Lease's watch and moves the fence on.
        let renewals = watcher(
            leases,
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .default_backoff()
        .applied_objects();
        let mut renewals = std::pin::pin!(renewals);
        loop {
            let left = fence
                .deadline()
                .and_then(|d| d.duration_since(std::time::SystemTime::now()).ok())
                .unwrap_or_default();
            tokio::select! {
                changed = channel.changed() => {
                    if changed.is_err() {
                        fence.lose();
                        return Err(Error::LeadershipLost(format!(
                            "the manager of Lease {name} stopped"
                        )));
                    }
                    if !*channel.borrow_and_update() {
                        fence.lose();
                        return Err(Error::LeadershipLost(format!(
                            "Lease {name} is held by another replica or could not be renewed"
                        )));
                    }
                }
                seen = renewals.next() => match seen {
                    Some(Ok(seen)) => match fence::hold_until(&seen, &identity) {
                        Some(until) => fence.renewed(until),
                        None => {
                            fence.lose();
                            let holder = seen.spec.and_then(|s| s.holder_identity);
                            return Err(Error::LeadershipLost(format!(
                                "Lease {name} is held by {}",
                                holder.as_deref().unwrap_or("nobody")
                            )));
                        }
                    },
                    // The watch retries by itself.
                    Some(Err(error)) => tracing::debug!(%error, "Lease watch"),
                    None => {
                        fence.lose();
                        return Err(Error::LeadershipLost(format!("the watch of Lease {name} ended")));
                    }
                },
                // The deadline passed, or a write found the fence closed.
                () = async {
                    tokio::select! {
                        () = tokio::time::sleep(left) => {}
                        () = fence.closed() => {}
                    }
                } => {
                    if fence.check().is_err() {
                        return Err(Error::LeadershipLost(format!(
                            "Lease {name} expired before this replica was seen renewing it"
                        )));
                    }
                }
            }
        }
    };
    Ok((lost, manager_task, kept, leader_fence))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TrainingJobStatus;
    use crate::place::{GpuSpec, Inventory, NodeSpec, Placement};

    const GIB: u64 = 1 << 30;

    fn job(phase: Option<Phase>) -> TrainingJob {
        let mut job: TrainingJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "j", "namespace": "ml"},
            "spec": {"batch": {"global": 8, "micro": 8},
                     "model": {"mlp": {"layers": 2, "hidden": 64}}, "template": {}}
        }))
        .unwrap();
        job.status = phase.map(|phase| TrainingJobStatus {
            phase,
            ..Default::default()
        });
        job
    }

    fn gauge(text: &str, series: &str) -> Option<i64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn gauges_count_jobs_by_phase_and_gpu_memory_committed_and_total() {
        let jobs = [
            job(None),
            job(Some(Phase::Pending)),
            job(Some(Phase::Running)),
            job(Some(Phase::Running)),
            job(Some(Phase::Failed)),
        ];
        let refs: Vec<&TrainingJob> = jobs.iter().collect();
        let node = |name: &str, gpus: &[u64]| NodeSpec {
            name: name.into(),
            cpu_milli: 1000,
            memory_bytes: GIB,
            taints: vec![],
            gpus: gpus
                .iter()
                .map(|&capacity| GpuSpec {
                    model: "H200".into(),
                    capacity,
                })
                .collect(),
        };
        let view = ClusterView {
            inventory: Inventory {
                nodes: vec![node("a", &[80 * GIB, 80 * GIB]), node("b", &[24 * GIB])],
            },
            ..ClusterView::default()
        };
        let placement = |gpus: Vec<u32>, budget: u64| Placement {
            job_id: "ml/j".into(),
            node: "a".into(),
            gpu_indices: gpus,
            gpu_budget: budget,
            cpu_milli: 0,
            memory_bytes: 0,
        };
        let ledger = [placement(vec![0, 1], 10 * GIB), placement(vec![0], 3 * GIB)];
        let metrics = Metrics::default();
        update_gauges(&metrics, &refs, &view, &ledger);
        let text = metrics.encode();
        for (phase, count) in [
            ("Pending", 2),
            ("Placed", 0),
            ("Running", 2),
            ("Retrying", 0),
            ("Succeeded", 0),
            ("Failed", 1),
        ] {
            let series = format!("vramfit_trainingjobs{{phase=\"{phase}\"}}");
            assert_eq!(gauge(&text, &series), Some(count), "{series} in\n{text}");
        }
        assert_eq!(
            gauge(&text, "vramfit_gpu_memory_total_bytes"),
            Some((184 * GIB) as i64)
        );
        assert_eq!(
            gauge(&text, "vramfit_gpu_memory_committed_bytes"),
            Some((23 * GIB) as i64),
            "a two-GPU job holds its budget twice"
        );

        // A later cycle overwrites the gauges instead of adding to them.
        update_gauges(&metrics, &refs[..1], &ClusterView::default(), &[]);
        let text = metrics.encode();
        assert_eq!(
            gauge(&text, "vramfit_trainingjobs{phase=\"Running\"}"),
            Some(0)
        );
        assert_eq!(
            gauge(&text, "vramfit_trainingjobs{phase=\"Pending\"}"),
            Some(1)
        );
        assert_eq!(gauge(&text, "vramfit_gpu_memory_total_bytes"), Some(0));
    }

    fn reported_node(heartbeat: &str, used: u64, allocation: Option<&str>) -> GpuNode {
        let mut status = serde_json::json!({
            "gpus": [{"index": 0, "uuid": "GPU-0", "model": "H200", "totalBytes": 80 * GIB,
                      "usedBytes": used, "health": "Healthy"}],
            "gpuCount": 1, "heartbeat": heartbeat,
        });
        if let Some(committed) = allocation {
            status["allocation"] = serde_json::json!({
                "committedBytes": 1, "freeBytes": 2, "committed": committed, "free": "2 B",
                "used": "0 B", "gpuFree": "0:2B", "jobs": 1,
            });
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": "n"}, "spec": {}, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_gpu_node_wakes_the_scheduler_when_new_or_changed_for_it() {
        let t = "2026-12-01T12:00:00Z";
        let mut seen = SchedulerFacing::default();
        let node = reported_node(t, 0, None);
        assert!(seen.changed(&node), "a new node");
        assert!(!seen.changed(&reported_node("2026-12-01T12:00:30Z", GIB, None)));
        let mut other = node.clone();
        other.metadata.name = Some("m".into());
        assert!(seen.changed(&other), "another node");
        let mut cordoned = node.clone();
        cordoned.spec.cordoned = true;
        assert!(seen.changed(&cordoned));
        assert!(!seen.changed(&cordoned));
        assert!(seen.changed(&node), "uncordoned");
    }

    #[test]
    fn only_what_can_change_a_placement_wakes_the_scheduler() {
        let t = "2026-12-01T12:00:00Z";
        let plain = reported_node(t, 0, None);
        let fingerprint = scheduler_facing_fingerprint;
        // The controller's own allocation writes, heartbeats and the memory
        // in use do not wake it.
        let written = reported_node(t, 0, Some("1 B"));
        let rewritten = reported_node(t, 0, Some("9 B"));
        let later = reported_node("2026-12-01T12:00:10Z", 0, Some("1 B"));
        let busier = reported_node(t, GIB, Some("1 B"));
        for same in [&written, &rewritten, &later, &busier] {
            assert_eq!(fingerprint(&plain), fingerprint(same));
        }
        // A node's spec, a GPU's health, capacity, model or identity, a GPU
        // more, labels, a deletion and a status appearing do.
        let mut cordoned = plain.clone();
        cordoned.spec.cordoned = true;
        let with_gpu = |change: &dyn Fn(&mut crate::api::GpuDevice)| {
            let mut node = plain.clone();
            change(&mut node.status.as_mut().unwrap().gpus[0]);
            node
        };
        let faulty = with_gpu(&|g| g.health = crate::api::GpuHealth::Faulty);
        let smaller = with_gpu(&|g| g.total_bytes -= GIB);
        let other_model = with_gpu(&|g| g.model = "L4".into());
        let other_uuid = with_gpu(&|g| g.uuid = "GPU-1".into());
        let mut more = plain.clone();
        let mut second = more.status.as_ref().unwrap().gpus[0].clone();
        second.index = 1;
        more.status.as_mut().unwrap().gpus.push(second);
        let mut labelled = plain.clone();
        labelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("pool".into(), "a".into());
        let mut deleted = plain.clone();
        deleted.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        let mut bare = plain.clone();
        bare.status = None;
        for changed in [
            &cordoned,
            &faulty,
            &smaller,
            &other_model,
            &other_uuid,
            &more,
            &labelled,
            &deleted,
            &bare,
        ] {
            assert_ne!(fingerprint(&plain), fingerprint(changed), "{changed:?}");
        }
    }
}
