//! The labels and annotations of a training pod, and where its stats folder
//! lives: what the controller writes and the node agent, the NRI plugin and
//! `vramfit status` read.

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
/// CDI kind of a node's GPUs; each GPU is a device named by its UUID.
pub const CDI_GPU_KIND: &str = "nvidia.com/gpu";

/// Where the training process finds its stats folder (docs/node-protocol.md).
pub const STATS_DIR: &str = "/run/vramfit";
/// The pod volume of the stats folder.
pub const STATS_VOLUME: &str = "vramfit-stats";
/// The node folder that holds the pods' stats folders unless the controller's
/// `--stats-root` says otherwise; the agent's `--stats-root` must agree.
pub const DEFAULT_STATS_ROOT: &str = "/var/run/vramfit/pods";

/// The stats folder of pod `name` in `namespace` on its node:
/// `<stats_root>/<namespace>_<name>`.
pub fn stats_host_path(stats_root: &str, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}_{name}", stats_root.trim_end_matches('/'))
}

/// Name of the pod of `attempt`: one name per attempt, so a restarted
/// controller that creates it again gets `AlreadyExists`, never a second pod.
pub fn pod_name(job_name: &str, attempt: u32) -> String {
    let suffix = format!("-a{attempt}");
    let keep = 63 - suffix.len();
    let base: String = job_name.chars().take(keep).collect();
    format!("{}{suffix}", base.trim_end_matches(['-', '.']))
}
