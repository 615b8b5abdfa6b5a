//! GPU processes mapped to the pods on this node: `/proc/<pid>/cgroup` gives
//! the pod UID and container ID, the pod watch (field selector
//! `spec.nodeName=<node>`) gives the pod.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::node::procfs::{ProcFs, strip_runtime_prefix};
use crate::node::report::{OwnerLookup, ProcessOwner};
use crate::node::watchdog::Owner;
use vramfit::api::PlacementStatus;
use vramfit::job::keys::{BUDGET_ANNOTATION, JOB_LABEL, PLACEMENT_ANNOTATION, stats_node_path};

/// The owner facts of a process in `pod`, in container `container_id` when
/// known. The budget and the GPUs come from the placement the controller
/// recorded on the pod; a pod without one was given no GPU (its use of any
/// is stopped), unless it carries only the budget annotation of an older
/// controller, whose budget then holds on every GPU.
pub fn owner_from_pod(pod: &Pod, container_id: Option<&str>, kubelet_root: &Path) -> ProcessOwner {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let placement: Option<PlacementStatus> = pod
        .annotations()
        .get(PLACEMENT_ANNOTATION)
        .and_then(|p| serde_json::from_str(p).ok());
    let legacy_budget: Option<u64> = pod
        .annotations()
        .get(BUDGET_ANNOTATION)
        .and_then(|b| b.trim().parse().ok());
    let container = container_id.and_then(|id| {
        let status = pod.status.as_ref()?;
        status
            .container_statuses
            .iter()
            .flatten()
            .chain(status.init_container_statuses.iter().flatten())
            .find(|c| c.container_id.as_deref().map(strip_runtime_prefix) == Some(id))
            .map(|c| c.name.clone())
    });
    ProcessOwner {
        owner: Owner {
            uid: pod.uid().unwrap_or_default(),
            namespace: namespace.clone(),
            name: name.clone(),
        },
        training_job: pod.labels().get(JOB_LABEL).cloned(),
        container,
        budget_bytes: placement.as_ref().map(|p| p.budget_bytes).or(legacy_budget),
        gpus: match (&placement, legacy_budget) {
            (Some(p), _) => Some(p.gpus.iter().map(|g| g.uuid.clone()).collect()),
            (None, Some(_)) => None,
            (None, None) => Some(Vec::new()),
        },
        // The pod's `emptyDir`, read through the kubelet's folder.
        stats_dir: pod
            .uid()
            .and_then(|uid| stats_node_path(kubelet_root, &uid)),
        namespace_pid: None,
    }
}

/// Owners from the pod cache, as of one reading.
pub struct PodOwners {
    proc: ProcFs,
    kubelet_root: PathBuf,
    by_uid: HashMap<String, Arc<Pod>>,
}

impl PodOwners {
    /// A snapshot of `pods`.
    pub fn snapshot(proc: &ProcFs, kubelet_root: &Path, pods: &Store<Pod>) -> Self {
        Self::from_pods(proc, kubelet_root, pods.state())
    }

    /// A snapshot of the given pods.
    pub fn from_pods(proc: &ProcFs, kubelet_root: &Path, pods: Vec<Arc<Pod>>) -> Self {
        Self {
            proc: proc.clone(),
            kubelet_root: kubelet_root.into(),
            by_uid: pods
                .into_iter()
                .filter_map(|p| Some((p.uid()?, p)))
                .collect(),
        }
    }

    /// True when a pod of this UID is on the node.
    pub fn has_pod(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }
}

impl OwnerLookup for PodOwners {
    fn owner_of(&self, pid: u32) -> Option<ProcessOwner> {
        let found = self.proc.pod_of(pid)?;
        // A process in a pod the watch does not know (deleted meanwhile, or
        // not yet seen) is reported without a pod and never stopped.
        let pod = self.by_uid.get(&found.pod_uid)?;
        let mut owner = owner_from_pod(pod, found.container_id.as_deref(), &self.kubelet_root);
        owner.namespace_pid = self.proc.namespace_pid(pid);
        Some(owner)
    }

    fn is_running(&self, pid: u32) -> bool {
        self.proc.is_running(pid)
    }
}

#[cfg(test)]
#[path = "pods_tests.rs"]
mod tests;
