//! The `GpuNode` resource: one per node, written by the node agent.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The GPUs of one node as the node agent sees them. Named after the node.
// The printer columns repeat `type_`, which the lint mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "vramfit.dev",
    version = "v1alpha1",
    kind = "GpuNode",
    shortname = "gn",
    category = "vramfit",
    status = "GpuNodeStatus",
    printcolumn(name = "GPUs", type_ = "integer", json_path = ".status.gpuCount"),
    printcolumn(name = "Model", type_ = "string", json_path = ".status.model"),
    printcolumn(
        name = "Committed",
        type_ = "string",
        json_path = ".status.allocation.committed",
        description = "GPU memory committed to the jobs placed here (sum of their budgets)"
    ),
    printcolumn(
        name = "Free",
        type_ = "string",
        json_path = ".status.allocation.free",
        description = "GPU memory not committed, over the usable GPUs"
    ),
    printcolumn(
        name = "Used",
        type_ = "string",
        json_path = ".status.allocation.used",
        description = "GPU memory in use as the agent measures it",
        priority = "1"
    ),
    printcolumn(
        name = "Free-per-GPU",
        type_ = "string",
        json_path = ".status.allocation.gpuFree",
        description = "free (uncommitted) memory of each GPU, index:free",
        priority = "1"
    ),
    printcolumn(
        name = "Jobs",
        type_ = "integer",
        json_path = ".status.allocation.jobs",
        priority = "1"
    ),
    printcolumn(
        name = "Agent",
        type_ = "string",
        json_path = ".status.agent.mode",
        priority = "1"
    ),
    printcolumn(name = "Heartbeat", type_ = "date", json_path = ".status.heartbeat"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeSpec {
    /// Set to stop new placements on this node's GPUs (running jobs stay).
    #[serde(default)]
    pub cordoned: bool,
}

/// Health of a GPU as the agent judges it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GpuHealth {
    /// Usable.
    #[default]
    Healthy,
    /// Usable but slow (throttled, bandwidth below expectation).
    Degraded,
    /// Not usable (memory errors, lost, NVML failures).
    Faulty,
}

/// A process using a GPU.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuProcess {
    /// Host PID.
    pub pid: u32,
    /// GPU memory the process uses, in bytes (NVML).
    pub used_bytes: u64,
    /// Highest usage seen since the process appeared, in bytes.
    #[serde(default)]
    pub peak_bytes: u64,
    /// Namespace of the pod that owns the process, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    /// Name of the pod that owns the process, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// The TrainingJob the pod belongs to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_job: Option<String>,
    /// UID of the pod that owns the process, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// Container of the pod that runs the process, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// What vramfit's in-process allocator reports for this process, when it
    /// runs under it (docs/node-protocol.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorStats>,
    /// The batch shape the training helper runs with now, when it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<ObservedShape>,
}

/// Counters of vramfit's in-process allocator for one process and device,
/// as it publishes them to the node agent.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorStats {
    /// Allocator policy (`pytorch` or `vramfit`).
    pub policy: String,
    /// The hard budget the allocator enforces, in bytes (0: none).
    #[serde(default)]
    pub budget_bytes: u64,
    /// Bytes handed to PyTorch now.
    #[serde(default)]
    pub allocated_bytes: u64,
    /// Bytes taken from the driver now.
    #[serde(default)]
    pub reserved_bytes: u64,
    /// Highest `allocatedBytes` since the process started.
    #[serde(default)]
    pub peak_allocated_bytes: u64,
    /// Highest `reservedBytes` since the process started.
    #[serde(default)]
    pub peak_reserved_bytes: u64,
    /// Allocations refused for the budget or by the driver.
    #[serde(default)]
    pub num_ooms: u64,
    /// When the process last wrote the counters (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
}

/// The batch shape a training process reports through the helper.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObservedShape {
    /// Micro-batch per GPU now.
    pub micro_batch: u32,
    /// Gradient-accumulation steps now.
    pub grad_accum: u32,
    /// OOMs the helper absorbed inside the process, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absorbed_ooms: Vec<AbsorbedOom>,
    /// How far the training has come, when the helper reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ReportedProgress>,
}

/// A training process's progress as the helper reports it: optimizer steps
/// done, the total when the script knows it, and a smoothed step time.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReportedProgress {
    /// Optimizer steps done by this process.
    pub steps: u64,
    /// Optimizer steps the process will run in all, when it knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_steps: Option<u64>,
    /// Seconds per optimizer step, smoothed over the recent steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_per_step: Option<f64>,
    /// When `steps` was counted (RFC 3339).
    pub time: String,
}

/// One OOM absorbed inside the training process: the step ran again with a
/// smaller micro-batch and more accumulation, the same global batch.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AbsorbedOom {
    /// Micro-batch before.
    pub from_micro: u32,
    /// Micro-batch after.
    pub to_micro: u32,
    /// Accumulation before.
    pub from_accum: u32,
    /// Accumulation after.
    pub to_accum: u32,
    /// When (RFC 3339).
    pub time: String,
}

/// The result of the agent's last probe of a GPU.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProbeStatus {
    /// True when the probe found nothing wrong.
    pub ok: bool,
    /// Device-to-device copy bandwidth, GB/s.
    #[serde(default)]
    pub bandwidth_gbps: f64,
    /// Bytes allocated and written by the probe.
    #[serde(default)]
    pub tested_bytes: u64,
    /// Words read back different from what was written.
    #[serde(default)]
    pub errors: u64,
    /// When the probe ran (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// What the probe found, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One GPU of the node.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuDevice {
    /// NVML index.
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Model name as vramfit profiles name it (for example `H200`).
    pub model: String,
    /// Total memory in bytes.
    pub total_bytes: u64,
    /// Memory in use in bytes (NVML).
    #[serde(default)]
    pub used_bytes: u64,
    /// Memory a bare CUDA context takes on this GPU, measured by the agent.
    #[serde(default)]
    pub context_overhead_bytes: u64,
    /// Processes on the GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcess>,
    /// Healthy, Degraded or Faulty.
    #[serde(default)]
    pub health: GpuHealth,
    /// Last probe result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeStatus>,
}

/// A budget violation or out-of-memory the agent saw.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OomReport {
    /// Namespace of the pod.
    pub pod_namespace: String,
    /// Name of the pod.
    pub pod_name: String,
    /// Bytes used when the agent acted.
    pub used_bytes: u64,
    /// The pod's budget in bytes.
    pub budget_bytes: u64,
    /// When (RFC 3339).
    pub time: String,
    /// UID of the pod, when known (tells attempts with reused names apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// Why the agent acted, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The agent itself, as it reports on its own state.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    /// Agent version.
    pub version: String,
    /// `nvml` on a real node, `simulated` for `--simulate`.
    pub mode: String,
    /// Healthy, or Degraded when the agent cannot see everything it should
    /// (NVML failing, a GPU lost); `message` says what.
    #[serde(default)]
    pub health: GpuHealth,
    /// What is wrong, in words, when not Healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What the agent last reported.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// The node's GPUs.
    #[serde(default)]
    pub gpus: Vec<GpuDevice>,
    /// Number of GPUs (for `kubectl get`).
    #[serde(default)]
    pub gpu_count: u32,
    /// Model of the first GPU (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Last time the agent wrote this status (RFC 3339); the controller trusts
    /// the status only while this is fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<String>,
    /// Pods the agent stopped for exceeding their budget, most recent last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_reports: Vec<OomReport>,
    /// The agent's own state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentInfo>,
    /// How much of the node's GPU memory is committed to placed jobs. Written
    /// by the controller (its own field manager), never by the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<NodeAllocation>,
}

/// The controller's account of a node's GPU memory, for `kubectl get gn`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeAllocation {
    /// Budgets of the jobs placed on the node's GPUs, summed, in bytes.
    pub committed_bytes: u64,
    /// Capacity minus committed over the usable GPUs (healthy or degraded,
    /// fresh heartbeat), in bytes.
    pub free_bytes: u64,
    /// `committedBytes`, human-readable.
    pub committed: String,
    /// `freeBytes`, human-readable.
    pub free: String,
    /// Memory in use on the node's GPUs (the agent's NVML figures), human-readable.
    pub used: String,
    /// Free memory of each GPU, `index:free` separated by spaces.
    pub gpu_free: String,
    /// Jobs placed on the node.
    pub jobs: u32,
}
