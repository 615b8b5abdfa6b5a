//! The labels and annotations of a training pod, and where its stats folder
//! lives: what the controller writes and the node agent, the NRI plugin and
//! `vramfit status` read.

use std::path::{Path, PathBuf};

/// Label carrying the owning TrainingJob's name.
pub const JOB_LABEL: &str = "vramfit.dev/training-job";
/// Label carrying the attempt number.
pub const ATTEMPT_LABEL: &str = "vramfit.dev/attempt";
/// Annotation carrying the budget in bytes (read by the node agent).
pub const BUDGET_ANNOTATION: &str = "vramfit.dev/budget-bytes";
/// Annotation carrying the attempt's placement (JSON of `PlacementStatus`):
/// the pod is created before the job's status records it, so a restarted
/// controller reads the placement from here (`controller::pod_ledger`).
pub const PLACEMENT_ANNOTATION: &str = "vramfit.dev/placement";
/// Prefix of the annotation (one per container, the container's name follows)
/// listing the CDI devices it gets. On the node, an NRI plugin hands them to
/// containerd's CDI injection (`hack/node/containerd/nri-cdi`): the kubelet
/// passes pod annotations to the runtime, but no pod field names a CDI device.
pub const CDI_ANNOTATION_PREFIX: &str = "cdi-devices.noderesource.dev/container.";
/// Every CDI annotation key of the NRI device injector starts with this
/// (`/pod` for the whole pod, `/container.<name>` per container).
pub const CDI_ANNOTATION_DOMAIN: &str = "cdi-devices.noderesource.dev/";
/// Prefix of the CDI annotations containerd itself reads (`cdi.k8s.io/<name>`).
pub const CDI_K8S_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// True for an annotation key that names devices: the NRI plugin's
/// (`cdi-devices.noderesource.dev/...`) or containerd's own (`cdi.k8s.io/...`).
pub fn is_device_annotation(key: &str) -> bool {
    key.starts_with(CDI_ANNOTATION_DOMAIN) || key.starts_with(CDI_K8S_ANNOTATION_PREFIX)
}
/// CDI kind of a node's GPUs; each GPU is a device named by its UUID.
pub const CDI_GPU_KIND: &str = "nvidia.com/gpu";

/// Where the training process finds its stats folder (docs/node-protocol.md).
pub const STATS_DIR: &str = "/run/vramfit";
/// The pod volume of the stats folder: an `emptyDir`, so that a namespace
/// under Pod Security (baseline or restricted) admits the pod.
pub const STATS_VOLUME: &str = "vramfit-stats";
/// The kubelet's root folder, unless the agent's `--kubelet-root` says otherwise.
pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Where the kubelet keeps the stats folder of the pod with `pod_uid` on its
/// node: `<kubelet_root>/pods/<uid>/volumes/kubernetes.io~empty-dir/vramfit-stats`.
/// `None` for a UID that is not one (hex digits and dashes), so that no
/// name can lead the agent out of the kubelet's folder.
pub fn stats_node_path(kubelet_root: &Path, pod_uid: &str) -> Option<PathBuf> {
    let is_uid = !pod_uid.is_empty()
        && pod_uid.len() <= 64
        && pod_uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    is_uid.then(|| {
        kubelet_root
            .join("pods")
            .join(pod_uid)
            .join("volumes/kubernetes.io~empty-dir")
            .join(STATS_VOLUME)
    })
}

/// Name of the pod of `attempt`: one name per attempt, so a restarted
/// controller that creates it again gets `AlreadyExists`, never a second pod.
pub fn pod_name(job_name: &str, attempt: u32) -> String {
    let suffix = format!("-a{attempt}");
    let keep = 63 - suffix.len();
    let base: String = job_name.chars().take(keep).collect();
    format!("{}{suffix}", base.trim_end_matches(['-', '.']))
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
