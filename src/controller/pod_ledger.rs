//! What the training pods say about memory held on the GPUs.
//!
//! An attempt's pod is created before the job's status records its placement
//! (one TrainingJob write less in the way of the pod), and a TrainingJob has
//! no finalizer: its pod is deleted after the job is gone. So the job's status
//! alone does not say where memory is held. Two kinds of pod fill the gap:
//!
//! - **Unrecorded:** the pod of a live job's current attempt whose status does
//!   not record it yet (a controller that stopped between the pod and the
//!   status write), running or ended. The cycle adopts the pod's placement as
//!   its own decision for that attempt, so the job is not placed a second
//!   time, and the job's reconcile writes it to status and follows the pod
//!   (to its end, when it ended meanwhile).
//! - **Orphaned:** the pod of a job that no longer exists. It holds its
//!   memory until it is gone (a kubelet stops it after its grace period), and
//!   it is deleted.
//!
//! Everything here is pure: [`read_pods`] turns the cached jobs and pods into
//! what the cycle adds to its ledger and what it deletes.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::scheduler::{current_attempt, recorded};
use crate::api::{PlacementStatus, TrainingJob};
use crate::job::keys::{ATTEMPT_LABEL, JOB_LABEL, PLACEMENT_ANNOTATION};
use crate::place::Placement;
use crate::quantity::parse_quantity;

/// The placement a training pod was created for, as its metadata tells it.
#[derive(Clone, Debug, PartialEq)]
pub struct PodPlacement {
    /// Namespace of the pod (and of its job).
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// Name of the owning TrainingJob.
    pub job: String,
    /// UID of the owning TrainingJob (its controller owner reference).
    pub job_uid: String,
    /// The attempt the pod runs.
    pub attempt: u32,
    /// Where and with which budget.
    pub placement: PlacementStatus,
    /// CPU (millicores) and memory (bytes) its containers request.
    pub requests: (u64, u64),
    /// True once the pod ended (`Succeeded` or `Failed`): it holds nothing.
    pub ended: bool,
    /// True once its deletion was requested.
    pub deleting: bool,
}

/// The placement `existing` (the pod of `ours`'s attempt, found when creating
/// it) was created for, when it is another one than `ours`. A pod without a
/// readable placement, or of another attempt, gives `None`: there is nothing
/// to adopt from it.
pub fn other_placement(existing: &Pod, ours: &PlacementStatus) -> Option<PlacementStatus> {
    let theirs = pod_placement(existing)?;
    (theirs.attempt == ours.attempt && theirs.placement != *ours).then_some(theirs.placement)
}

/// What the pod cache keeps of a training pod: its metadata without
/// `managedFields`, its status, and of its spec the node and each
/// container's name and resources. Everything the controller reads from a
/// cached pod is there (the placement annotation and labels, the requests,
/// the phase and the containers' states); the environment, volumes,
/// commands and images, most of a pod's size, are not read from the cache.
pub fn slim_for_cache(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.as_mut() {
        let containers = std::mem::take(&mut spec.containers)
            .into_iter()
            .map(|c| Container {
                name: c.name,
                resources: c.resources,
                ..Container::default()
            })
            .collect();
        *spec = PodSpec {
            containers,
            node_name: spec.node_name.take(),
            ..PodSpec::default()
        };
    }
}

/// Reads the placement of a training pod; `None` for a pod without one (made
/// by an older controller, or not a training pod).
pub fn pod_placement(pod: &Pod) -> Option<PodPlacement> {
    let meta = &pod.metadata;
    let placement: PlacementStatus =
        serde_json::from_str(meta.annotations.as_ref()?.get(PLACEMENT_ANNOTATION)?).ok()?;
    let labels = meta.labels.as_ref()?;
    let attempt = labels.get(ATTEMPT_LABEL)?.parse().ok()?;
    let owner = meta
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "TrainingJob")?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    Some(PodPlacement {
        namespace: meta.namespace.clone().unwrap_or_default(),
        pod: meta.name.clone()?,
        pod_uid: meta.uid.clone().unwrap_or_default(),
        job: labels.get(JOB_LABEL).cloned().unwrap_or(owner.name.clone()),
        job_uid: owner.uid.clone(),
        attempt,
        placement,
        requests: pod_requests(pod),
        ended: matches!(phase, Some("Succeeded" | "Failed")),
        deleting: meta.deletion_timestamp.is_some(),
    })
}

/// CPU (millicores) and memory (bytes) the pod's containers request, summed,
/// as [`super::cluster_view::template_requests`] reads them from the template.
fn pod_requests(pod: &Pod) -> (u64, u64) {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
    let mut cpu = 0;
    let mut memory = 0;
    for container in containers.into_iter().flatten() {
        let Some(requests) = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
        else {
            continue;
        };
        let quantity = |name: &str, scale: u64| {
            requests
                .get(name)
                .and_then(|q| parse_quantity(&q.0, scale))
                .unwrap_or(0)
        };
        cpu += quantity("cpu", 1000);
        memory += quantity("memory", 1);
    }
    (cpu, memory)
}

/// A pod whose job is gone, to delete.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OrphanPod {
    /// Namespace of the pod.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID (the delete's precondition).
    pub pod_uid: String,
    /// Name of the job it was made for.
    pub job: String,
    /// UID of that job.
    pub job_uid: String,
}

/// What the pods add to one cycle.
#[derive(Debug, Default, PartialEq)]
pub struct PodLedger {
    /// Attempts whose pod exists while neither their job's status nor the
    /// cycle's memory records them: (job UID, attempt, the pod's placement).
    pub unrecorded: Vec<(String, u32, PlacementStatus)>,
    /// Memory held by pods of jobs that are gone.
    pub orphaned: Vec<Placement>,
    /// Pods of jobs that are gone, not yet being deleted.
    pub to_delete: Vec<OrphanPod>,
}

/// Reads the cached pods against the cached jobs. `taken` says whether the
/// cycle already holds a placement for (job UID, attempt), or this process
/// wrote a later attempt of the job.
pub fn read_pods(
    jobs: &[&TrainingJob],
    pods: &[&Pod],
    taken: impl Fn(&str, u32) -> bool,
) -> PodLedger {
    let live: HashMap<&str, &TrainingJob> = jobs
        .iter()
        .filter_map(|j| j.metadata.uid.as_deref().map(|uid| (uid, *j)))
        .collect();
    let mut ledger = PodLedger::default();
    for pod in pods {
        // Most pods are their live job's recorded attempt: told apart by the
        // owner alone, without reading the placement.
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "TrainingJob");
        let job = owner.and_then(|o| live.get(o.uid.as_str()));
        if job.is_some_and(|job| !may_be_unrecorded(job)) {
            continue;
        }
        let Some(pod) = pod_placement(pod) else {
            continue;
        };
        match job {
            Some(job) => {
                if is_unrecorded(&pod, job, &taken) {
                    ledger.unrecorded.push((
                        pod.job_uid.clone(),
                        pod.attempt,
                        pod.placement.clone(),
                    ));
                }
            }
            None => {
                if !pod.ended {
                    ledger.orphaned.push(orphan_placement(&pod));
                }
                if !pod.deleting {
                    ledger.to_delete.push(orphan_pod(&pod));
                }
            }
        }
    }
    ledger
}

/// True when `pod` is the current attempt of `job` (a live job whose status
/// records no placement, [`may_be_unrecorded`]), its deletion was not asked
/// for, and the attempt is not `taken` (the cycle holds a placement for it,
/// or this process wrote a later attempt, which the cached job lags). A pod
/// that ended counts as well: its attempt ran (a controller stopped between
/// the pod and the status write, and the pod finished before the next one
/// looked), so the job follows it to its end instead of waiting for room to
/// run the attempt again. The pod of an attempt the controller ended and
/// moved past is being deleted, or is of an attempt this process wrote past:
/// taking it would make its pod again.
pub fn is_unrecorded(
    pod: &PodPlacement,
    job: &TrainingJob,
    taken: impl Fn(&str, u32) -> bool,
) -> bool {
    !pod.deleting && pod.attempt == current_attempt(job) && !taken(&pod.job_uid, pod.attempt)
}

/// The pod of a deleted job, to delete.
pub fn orphan_pod(pod: &PodPlacement) -> OrphanPod {
    OrphanPod {
        namespace: pod.namespace.clone(),
        pod: pod.pod.clone(),
        pod_uid: pod.pod_uid.clone(),
        job: pod.job.clone(),
        job_uid: pod.job_uid.clone(),
    }
}

/// True when a live job may have a pod its status does not record: it is
/// neither finished nor being deleted, and its status records no placement
/// for its current attempt.
pub fn may_be_unrecorded(job: &TrainingJob) -> bool {
    let terminal = job.status.as_ref().is_some_and(|s| s.phase.is_terminal());
    !terminal && job.metadata.deletion_timestamp.is_none() && recorded(job).is_none()
}

/// The ledger entry of an orphaned pod. Its id names the pod, not the job: a
/// new job of the same name may be placed beside it.
pub fn orphan_placement(pod: &PodPlacement) -> Placement {
    super::cluster_view::ledger_entry(
        format!("{}/{} (pod of a deleted job)", pod.namespace, pod.pod),
        &pod.placement,
        pod.requests,
    )
}

#[cfg(test)]
#[path = "pod_ledger_tests.rs"]
mod tests;
