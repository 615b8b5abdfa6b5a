//! The TrainingJob controller: predict -> place -> pod -> status -> OOM back-off.
//!
//! Pure decisions live in [`transition`] (the reconcile's status
//! transitions), [`backoff`], [`exit`], [`pod`], [`inventory`] and
//! [`scheduler::plan_cycle`]; this module wires them to the API server. See
//! docs/controller.md.

pub mod absorbed;
pub mod allocation;
pub mod autoprofile;
pub mod cluster_view;
mod context;
mod cycle;
pub mod elastic;
pub mod fence;
pub mod held;
mod http;
pub mod job_index;
pub mod kept_view;
mod leader;
pub mod ledger;
pub mod metrics;
pub mod model_cache;
pub mod pod;
pub mod pod_ledger;
pub mod pods_first;
pub mod progress;
mod reconcile;
pub mod recorder;
pub mod retry;
pub mod scheduler;
pub mod standing;
pub mod status_patch;
pub mod status_writer;
pub mod supervise;
pub mod transition;
pub mod ui_auth;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::SignedDuration;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;

use crate::api::{GpuNode, TrainingJob};
use crate::{Error, Result};
pub use context::{Context, ControllerOptions, LeaseOptions, UiAuthMode};
pub use cycle::{CycleOutcome, CycleState, check as check_cycle, check_view, run_cycle};
use cycle::{scheduling_loop, wait_ready};
use http::{UiSource, serve_metrics};
use leader::acquire_leadership;
use metrics::Metrics;
use scheduler::{Assignments, recorded};

/// Finalizer that releases a job's placement and pod.
pub const FINALIZER: &str = "vramfit.dev/release-placement";

/// Reconciles that run at once. Each one talks to the API server; without a
/// bound, a burst of new jobs opens one connection and one request per job.
const RECONCILE_CONCURRENCY: u16 = 32;

/// Pause after a wake-up before the scheduling cycle runs.
const CYCLE_BATCH_WINDOW: Duration = Duration::from_millis(100);

/// Runs the controller until a termination signal (`Ok`), until it loses its
/// Lease (`Error::LeadershipLost`) or until a background task stops.
pub async fn run(client: Client, options: ControllerOptions) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    let mut tasks = supervise::Supervisor::default();
    let ui = UiSource::new(client.clone(), &options);
    // Bound before the election, so a standby serves /healthz and /ui too
    // and a taken address fails the start-up rather than a task later.
    for (addr, pages) in http::listeners(options.metrics_addr, options.ui_addr) {
        let flag = if pages.metrics {
            "--metrics-addr"
        } else {
            "--ui-addr"
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Io {
                path: format!("{flag} {addr}"),
                source,
            })?;
        let router = http::router(pages, metrics.clone(), ui.clone());
        tasks.spawn(
            if pages.metrics {
                "metrics server"
            } else {
                "ui server"
            },
            serve_metrics(listener, router),
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
    // What the controller reads of a pod, not its environment and volumes.
    .modify(pod_ledger::slim_for_cache)
    .reflect(pod_writer)
    .touched_objects();
    // The job watch, as `Controller::new` would make it, with the index of what
    // predictions read across all jobs kept from its events.
    let (jobs, job_writer) = reflector::store::<TrainingJob>();
    {
        // Once both caches hold a full LIST, the /ui page reads them
        // instead of listing.
        let (caches, jobs, gpu_nodes) = (ui.caches.clone(), jobs.clone(), gpu_nodes.clone());
        tokio::spawn(async move {
            if jobs.wait_until_ready().await.is_ok() && gpu_nodes.wait_until_ready().await.is_ok() {
                let _ = caches.set((jobs, gpu_nodes));
            }
        });
    }
    let index = Arc::new(job_index::JobIndex::default());
    let wake = Arc::new(Notify::new());
    let held_predictions = Arc::new(held::HeldPredictions::default());
    let own_writes = Arc::new(held::OwnWrites::default());
    // The GpuNodes' allocations follow the jobs' recorded placements.
    let allocations = Arc::new(Notify::new());
    let job_stream = {
        let index = index.clone();
        let wake = wake.clone();
        let allocations = allocations.clone();
        let mut placements = allocation::PlacementWatch::default();
        let (held, own_writes) = (held_predictions.clone(), own_writes.clone());
        watcher(jobs_api, watcher::Config::default())
            // Nothing reads managedFields; dropping them keeps the cache small.
            .modify(|job| job.metadata.managed_fields = None)
            .reflect(job_writer)
            .inspect_ok(move |event| {
                index.observe(event);
                if placements.observe(event) {
                    allocations.notify_one();
                }
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
    let (event_queue, queued_events) = recorder::EventQueue::new();
    let pods_first = Arc::new(pods_first::PodsFirst::default());
    tasks.spawn(
        "event publisher",
        recorder::send_all(recorder, queued_events, pods_first.clone()),
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
        fence: leader_fence,
        status_queue,
        defer_placed_status: options.status_writers > 0,
        pods_first,
        elastic_default: options.elastic_default,
        compute_default: options.compute_default,
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

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
