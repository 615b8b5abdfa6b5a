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
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
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
}
