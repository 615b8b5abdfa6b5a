//! The scheduling cycle: places waiting jobs over the caches, deletes
//! orphaned pods, and keeps the gauges current.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;

use super::*;
use crate::api::{GpuNode, Phase, TrainingJob};
use crate::place::{Policy, PolicyKind};
use crate::{Error, Result};
use cluster_view::{ClusterView, cluster_view};
use metrics::{Metrics, PhaseLabel};
use scheduler::{
    Assignments, Verdict, current_attempt, is_waiting, plan_cycle, recorded_placements,
};

/// How long the first cycle waits after the caches are listed, for writes
/// an earlier controller had in flight to reach the watches.
pub const STARTUP_SETTLE: Duration = Duration::from_secs(5);

pub(super) async fn scheduling_loop(
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
    // A controller that stopped (or was killed) with a pod create in flight:
    // the API server may commit that pod after the list above. Planning
    // without it would place its memory twice; its watch event lands within
    // the settle time.
    tokio::time::sleep(STARTUP_SETTLE).await;
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
            .map(|j| (cluster_view::job_key(j), *j))
            .collect();
        let verdicts = plan_cycle(&view, &ledger, &waiting, Policy::new(policy, 42));
        for (key, verdict) in verdicts {
            let Some(job) = by_key.get(&key) else {
                continue;
            };
            let uid = job.metadata.uid.as_deref().unwrap_or_default();
            if let Verdict::Place(p) = &verdict {
                ledger.push(cluster_view::recorded_placement(job, p));
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
pub(super) async fn wait_ready<K>(store: &Store<K>) -> Result<()>
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

#[cfg(test)]
#[path = "cycle_tests.rs"]
mod tests;
