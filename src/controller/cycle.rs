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
use crate::place::PolicyKind;
use crate::{Error, Result};
use cluster_view::ClusterView;
use kept_view::KeptView;
use ledger::Ledger;
use metrics::{Metrics, PhaseLabel};
use scheduler::{Assignments, Verdict, current_attempt, plan_on};
use standing::StandingPlacer;

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
    let mut state = CycleState::default();
    loop {
        // A replica past its Lease decides nothing more (and the process ends).
        ctx.fence.check()?;
        let started = Instant::now();
        // Jobs whose prediction is held (not yet written) are placed on it.
        let job_list = ctx.held.overlay_all(jobs.state());
        let gpu_node_list = gpu_nodes.state();
        let node_list = nodes.state();
        let pod_list = ctx.pods.state();
        let outcome = run_cycle(
            &mut state,
            &ctx.assignments,
            &job_list,
            &pod_list,
            &gpu_node_list,
            &node_list,
            Timestamp::now(),
            ttl,
            options.policy,
        );
        for job in &outcome.changed {
            let _ = trigger.unbounded_send(ObjectRef::from_obj(*job));
        }
        delete_orphans(&ctx, outcome.orphans.clone(), &mut deleting);
        update_gauges(
            &ctx.metrics,
            &outcome.phases,
            &outcome.view,
            outcome.committed_bytes,
        );
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
    /// The inventory it placed on (the same `Arc` as the last cycle's when
    /// it did not change).
    pub view: Arc<ClusterView>,
    /// Placements that hold memory after the cycle: recorded in status,
    /// assigned and not yet recorded (this cycle's included), and held by
    /// pods of deleted jobs.
    pub placed: usize,
    /// GPU memory they hold.
    pub committed_bytes: u64,
    /// Jobs by phase.
    pub phases: HashMap<Phase, i64>,
    /// Jobs that were waiting.
    pub waiting: usize,
    /// Jobs whose verdict changed (their reconcile must run).
    pub changed: Vec<&'a TrainingJob>,
    /// Pods of jobs that are gone, to delete.
    pub orphans: Vec<pod_ledger::OrphanPod>,
}

/// What the cycle keeps from one run to the next: the inventory view, the
/// ledger and the placement engine, each following what changed
/// (`kept_view`, `ledger`, `standing`).
#[derive(Default)]
pub struct CycleState {
    view: KeptView,
    ledger: Ledger,
    standing: Option<StandingPlacer>,
    /// The view the engine holds (the last cycle's).
    standing_view: Option<Arc<ClusterView>>,
    cycles: u64,
}

/// How often a debug build checks the kept ledger and engine against a full
/// rebuild: the first cycle and every this many after.
#[cfg(debug_assertions)]
const CHECK_EVERY: u64 = 8;

/// One scheduling cycle over a snapshot of the caches: brings the ledger
/// (the jobs' status, the cycle's own decisions not yet written and the
/// pods that neither records, `pod_ledger`) up to date with what changed,
/// places the waiting jobs and records the verdicts in `assignments`.
#[allow(clippy::too_many_arguments)]
pub fn run_cycle<'a>(
    state: &mut CycleState,
    assignments: &Assignments,
    jobs: &'a [Arc<TrainingJob>],
    pods: &[Arc<Pod>],
    gpu_nodes: &[Arc<GpuNode>],
    nodes: &[Arc<Node>],
    now: Timestamp,
    ttl: SignedDuration,
    policy: PolicyKind,
) -> CycleOutcome<'a> {
    state.cycles += 1;
    let view = state.view.update(gpu_nodes, nodes, now, ttl);
    let mut changed = Vec::new();
    let ledger = &mut state.ledger;
    ledger.sync(jobs, pods, &mut assignments.lock());
    let unrecorded = ledger.unrecorded();
    if !unrecorded.is_empty() {
        // A pod created before a stop that kept its placement from status:
        // the cycle takes it as its own decision, which the job's reconcile
        // then writes.
        for (uid, attempt, placement) in unrecorded {
            assignments.record(&uid, attempt, scheduler::Verdict::Place(placement));
            if let Some(job) = ledger.job(&uid, jobs) {
                changed.push(job);
            }
        }
        ledger.refresh(&mut assignments.lock());
    }
    // The view of the last cycle (the same `Arc`) is the one the engine was
    // built for or followed; another is compared.
    let same_view = state
        .standing_view
        .as_ref()
        .is_some_and(|v| Arc::ptr_eq(v, &view));
    state.standing_view = Some(view.clone());
    let standing = match state.standing.take() {
        Some(mut standing) if (same_view || standing.fits(&view)) && standing.kind() == policy => {
            standing.follow(ledger);
            Ok(standing)
        }
        _ => {
            ledger.take_changed();
            StandingPlacer::build(&view, ledger, policy)
        }
    };
    let waiting = ledger.waiting(jobs);
    tracing::debug!(
        nodes = view.inventory.nodes.len(),
        placed = ledger.len(),
        waiting = waiting.len(),
        "scheduling cycle"
    );
    let mut standing = match standing {
        Ok(standing) => Some(standing),
        Err(error) => {
            let verdicts = scheduler::unusable_inventory(&error, &waiting);
            for (job, (_, verdict)) in waiting.iter().zip(verdicts) {
                record_verdict(assignments, job, verdict, &mut changed);
            }
            None
        }
    };
    if let (false, Some(placer)) = (waiting.is_empty(), standing.as_mut()) {
        let by_key: HashMap<String, &'a TrainingJob> = waiting
            .iter()
            .map(|j| (cluster_view::job_key(j), *j))
            .collect();
        // Elastic placement weighs a wait by the running jobs' expected ends.
        let job_refs: Vec<&TrainingJob> = jobs.iter().map(|j| j.as_ref()).collect();
        let ends = progress::expected_ends(&job_refs, now);
        let verdicts = plan_on(placer.placer_mut(), &view, &waiting, &ends);
        for (key, verdict) in &verdicts {
            if let Some(job) = by_key.get(key) {
                record_verdict(assignments, job, verdict.clone(), &mut changed);
            }
        }
        ledger.refresh(&mut assignments.lock());
        placer.follow(ledger);
        placer.settle(ledger, &verdicts);
    } else {
        ledger.refresh(&mut assignments.lock());
    }
    state.standing = standing;
    #[cfg(debug_assertions)]
    if state.cycles % CHECK_EVERY == 1
        && let Err(difference) = check(state, assignments, jobs, pods, &view)
            .and_then(|()| check_view(&view, gpu_nodes, nodes, now, ttl))
    {
        tracing::error!(%difference, "the kept ledger differs from a full rebuild");
        panic!("the kept ledger differs from a full rebuild: {difference}");
    }
    let ledger = &state.ledger;
    CycleOutcome {
        placed: ledger.len(),
        committed_bytes: ledger.committed_bytes(),
        phases: ledger.phase_counts().clone(),
        view,
        waiting: waiting.len(),
        changed,
        orphans: ledger.to_delete(),
    }
}

/// Records one verdict; the job is told (`changed`) when it changed.
fn record_verdict<'a>(
    assignments: &Assignments,
    job: &'a TrainingJob,
    verdict: Verdict,
    changed: &mut Vec<&'a TrainingJob>,
) {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    if assignments.record(uid, current_attempt(job), verdict) {
        changed.push(job);
    }
}

/// Compares the kept ledger, and the standing engine, with a full rebuild
/// over the same objects (`ledger::full_rebuild`); `Err` says what differs.
/// The assignments stay locked throughout, so a reconcile's change cannot
/// fall between the two.
pub fn check(
    state: &mut CycleState,
    assignments: &Assignments,
    jobs: &[Arc<TrainingJob>],
    pods: &[Arc<Pod>],
    view: &ClusterView,
) -> std::result::Result<(), String> {
    let mut locked = assignments.lock();
    let ledger = &mut state.ledger;
    ledger.refresh(&mut locked);
    let job_refs: Vec<&TrainingJob> = jobs.iter().map(|j| j.as_ref()).collect();
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let full = ledger::full_rebuild(&job_refs, &pod_refs, &locked);
    let kept = ledger.snapshot();
    if kept != full {
        return Err(format!("kept {kept:?}\nfull rebuild {full:?}"));
    }
    if let Some(standing) = state.standing.as_mut() {
        standing.follow(ledger);
        let differences = standing.differences(view, ledger);
        if !differences.is_empty() {
            return Err(differences.join("; "));
        }
    }
    Ok(())
}

/// Compares the kept view with one built from every object
/// (`cluster_view::cluster_view`); `Err` says what differs.
pub fn check_view(
    view: &ClusterView,
    gpu_nodes: &[Arc<GpuNode>],
    nodes: &[Arc<Node>],
    now: Timestamp,
    ttl: SignedDuration,
) -> std::result::Result<(), String> {
    let gpu_nodes: Vec<&GpuNode> = gpu_nodes.iter().map(|n| n.as_ref()).collect();
    let nodes: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
    let full = cluster_view::cluster_view(&gpu_nodes, &nodes, now, ttl);
    if *view != full {
        return Err(format!("kept view {view:?}\nfull rebuild {full:?}"));
    }
    Ok(())
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
    counts: &HashMap<Phase, i64>,
    view: &ClusterView,
    committed: u64,
) {
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
