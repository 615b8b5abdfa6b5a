//! The `TrainingJob` resource: what a user applies, and the status the controller
//! keeps on it.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::model::{MemoryBreakdown, ModelSpec};

/// A deep-learning training job that vramfit places on a shared GPU with an
/// enforced memory budget.
// The printer columns repeat `type_`, which the lint mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "vramfit.dev",
    version = "v1alpha1",
    kind = "TrainingJob",
    namespaced,
    shortname = "tj",
    category = "vramfit",
    status = "TrainingJobStatus",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Predicted",
        type_ = "string",
        json_path = ".status.predicted",
        description = "predicted peak GPU memory per GPU"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.placement.node"),
    printcolumn(name = "GPU", type_ = "string", json_path = ".status.gpu"),
    printcolumn(
        name = "MicroxAccum",
        type_ = "string",
        json_path = ".status.batchShape",
        description = "micro-batch x gradient accumulation"
    ),
    printcolumn(name = "Attempt", type_ = "integer", json_path = ".status.attempt"),
    printcolumn(
        name = "Measured",
        type_ = "string",
        json_path = ".status.measured",
        description = "measured peak GPU memory"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.gpus < 1 || self.batch.micro < 1 || self.batch.global % (self.batch.micro * self.gpus) == 0").message("batch.global must be divisible by batch.micro * gpus (gradient accumulation = global / (micro * gpus))").field_path(".batch.global"))]
pub struct TrainingJobSpec {
    /// GPUs for the job, all on one node.
    #[serde(default = "default_gpus")]
    #[schemars(range(min = 1, max = 64))]
    pub gpus: u32,
    /// Allowed GPU models (for example `H200`, `H100-80GB`); any model when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16))]
    pub gpu_models: Option<Vec<String>>,
    /// Global, micro and minimum micro batch.
    pub batch: BatchSpec,
    /// The model and how it is trained.
    pub model: ModelSpec,
    /// The memory budget: an explicit request, or the prediction plus headroom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySpec>,
    /// OOM retries (each halves the micro-batch) before the job fails.
    #[serde(default = "default_max_oom_retries", rename = "maxOOMRetries")]
    #[schemars(range(min = 0, max = 16))]
    pub max_oom_retries: u32,
    /// Higher runs first when jobs wait for room; equal priorities run in
    /// creation order.
    #[serde(default)]
    #[schemars(range(min = -1000000, max = 1000000))]
    pub priority: i32,
    /// The pod that runs the training (a PodTemplateSpec); vramfit adds the
    /// node, the GPU and the `VRAMFIT_*` variables.
    #[schemars(schema_with = "crate::api::schema::pod_template")]
    #[serde(deserialize_with = "crate::api::free_form::deserialize")]
    pub template: serde_json::Map<String, serde_json::Value>,
}

fn default_gpus() -> u32 {
    1
}

fn default_max_oom_retries() -> u32 {
    4
}

/// Batch sizes. Gradient accumulation is `global / (micro * gpus)` and must be a
/// whole number; vramfit never changes `global`.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minMicro <= self.micro").message("batch.minMicro must not exceed batch.micro").field_path(".minMicro"))]
pub struct BatchSpec {
    /// Samples per optimizer step, over all GPUs.
    #[schemars(range(min = 1, max = 16777216))]
    pub global: u32,
    /// Starting micro-batch per GPU.
    #[schemars(range(min = 1, max = 1048576))]
    pub micro: u32,
    /// Floor of the OOM back-off.
    #[serde(default = "default_min_micro")]
    #[schemars(range(min = 1, max = 1048576))]
    pub min_micro: u32,
    /// Let the controller choose the micro-batch of the first attempt for the
    /// GPU model it places the job on: the largest that divides
    /// `global / gpus`, lies between `minMicro` and `micro`, and whose
    /// prediction plus headroom fits that GPU. The OOM back-off still applies.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_micro: bool,
}

fn default_min_micro() -> u32 {
    1
}

/// How the job's memory budget is set.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemorySpec {
    /// Use this budget per GPU instead of the prediction (for example `20Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::quantity")]
    pub request: Option<String>,
    /// Fraction added on top of the prediction, 0 to 1.
    #[serde(default = "default_headroom")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub headroom: f64,
}

/// Headroom used when `memory.headroom` is not given.
pub const DEFAULT_HEADROOM: f64 = 0.05;

fn default_headroom() -> f64 {
    DEFAULT_HEADROOM
}

impl TrainingJobSpec {
    /// The pod template, parsed. Kept as JSON in the spec so that a malformed
    /// template is reported on its job instead of breaking every watch.
    pub fn pod_template(&self) -> Result<PodTemplateSpec, String> {
        check_pod_template(&self.template)
    }

    /// Headroom over the prediction, with the documented default.
    pub fn headroom(&self) -> f64 {
        self.memory
            .as_ref()
            .map_or(DEFAULT_HEADROOM, |m| m.headroom)
    }
}

/// Resource that the device plugin hands out; vramfit assigns the GPUs itself.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Parses a job's pod template and refuses what vramfit must decide itself:
/// the node (`nodeName`) and GPUs requested from the device plugin
/// (`nvidia.com/gpu`). Errors name the field, such as
/// `spec.template.spec.containers[0].resources.limits.nvidia.com/gpu`.
pub fn check_pod_template(
    template: &serde_json::Map<String, serde_json::Value>,
) -> Result<PodTemplateSpec, String> {
    if let Some(path) = super::free_form::too_deep(template) {
        return Err(format!(
            "spec.template.{path} is nested deeper than {} levels",
            super::free_form::MAX_DEPTH
        ));
    }
    let value = serde_json::Value::Object(template.clone());
    let parsed: PodTemplateSpec = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            "spec.template".to_string()
        } else {
            format!("spec.template.{path}")
        };
        format!("{at}: {}", e.inner())
    })?;
    let Some(spec) = parsed.spec.as_ref() else {
        return Ok(parsed);
    };
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Err(
            "spec.template.spec.nodeName: must not be set; vramfit chooses the node".into(),
        );
    }
    let lists = [
        ("containers", spec.containers.as_slice()),
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
    ];
    for (list, containers) in lists {
        for (index, container) in containers.iter().enumerate() {
            let Some(resources) = container.resources.as_ref() else {
                continue;
            };
            for (kind, amounts) in [
                ("limits", &resources.limits),
                ("requests", &resources.requests),
            ] {
                if amounts
                    .as_ref()
                    .is_some_and(|a| a.contains_key(GPU_RESOURCE))
                {
                    return Err(format!(
                        "spec.template.spec.{list}[{index}].resources.{kind}.{GPU_RESOURCE}: must not be set; vramfit assigns the GPUs and their memory"
                    ));
                }
            }
        }
    }
    Ok(parsed)
}

/// Where a job is in its life.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Phase {
    /// Waiting for a GPU with room (or not yet seen by the controller).
    #[default]
    Pending,
    /// Its allocation profile is being captured on a CPU (`model.auto`).
    Profiling,
    /// A GPU is reserved and the pod is created.
    Placed,
    /// The pod runs.
    Running,
    /// The last attempt ran out of memory; a smaller micro-batch follows.
    Retrying,
    /// The training pod finished successfully.
    Succeeded,
    /// The job failed (invalid, or out of memory at the floor of the back-off).
    Failed,
}

impl Phase {
    /// True once the job will never run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// A GPU of the node the job is placed on.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AssignedGpu {
    /// NVML index on the node.
    pub index: u32,
    /// GPU UUID (what `NVIDIA_VISIBLE_DEVICES` receives).
    pub uuid: String,
}

/// Where the current attempt runs and with how much memory.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlacementStatus {
    /// Node name.
    pub node: String,
    /// The GPUs of the job on that node.
    pub gpus: Vec<AssignedGpu>,
    /// Budget per GPU in bytes (prediction + headroom, or `memory.request`).
    pub budget_bytes: u64,
    /// Budget over the GPU's capacity, as passed to
    /// `torch.cuda.set_per_process_memory_fraction`.
    pub memory_fraction: f64,
    /// The attempt this placement was made for.
    pub attempt: u32,
    /// GPU model of the placement, when the budget was predicted per model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Micro-batch chosen for that GPU model (`batch.autoMicro`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
}

/// The prediction of the current attempt for one GPU model of the cluster.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuModelBudget {
    /// GPU model (as `GpuNode`s name it).
    pub gpu_model: String,
    /// Micro-batch per GPU on that model.
    pub micro_batch: u32,
    /// Predicted peak per GPU in bytes.
    pub predicted_bytes: u64,
    /// Budget per GPU in bytes (prediction + headroom, or `memory.request`).
    pub budget_bytes: u64,
}

/// The outcome of one finished attempt.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// Attempt number, from 1.
    pub attempt: u32,
    /// Micro-batch of that attempt.
    pub micro_batch: u32,
    /// Gradient accumulation of that attempt.
    pub grad_accum: u32,
    /// `Succeeded`, `OutOfMemory` or `Failed`.
    pub outcome: String,
    /// What the pod or the agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The controller's view of the job.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// Pending, Placed, Running, Retrying, Succeeded or Failed.
    #[serde(default)]
    pub phase: Phase,
    /// Why the job waits or failed, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Predicted peak per GPU in bytes (whole process, context included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_bytes: Option<u64>,
    /// Predicted peak, human-readable (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<String>,
    /// The memory budget per GPU for the current attempt, in bytes: the
    /// prediction plus headroom, or `memory.request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_bytes: Option<u64>,
    /// The prediction for each GPU model the job could be placed on; the
    /// scheduler gives the job the budget of the model it places it on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_model_budgets: Vec<GpuModelBudget>,
    /// Where the budget came from: `model`, `profile`, `measured` (a finished
    /// job with the same model signature) or `request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction_source: Option<String>,
    /// Hash of what determines the job's memory (model, precision, optimizer,
    /// micro-batch, GPUs); jobs with the same signature share measurements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_signature: Option<String>,
    /// The prediction by cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<MemoryBreakdown>,
    /// The placement of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementStatus>,
    /// GPU indices of the placement, comma-separated (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Micro-batch of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    /// Gradient accumulation of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_accum: Option<u32>,
    /// `micro x accum` (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_shape: Option<String>,
    /// Current attempt, from 1.
    #[serde(default)]
    pub attempt: u32,
    /// Highest GPU memory the agent measured for the job's process, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_peak_bytes: Option<u64>,
    /// Measured peak, human-readable (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<String>,
    /// Name of the pod of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// Finished attempts, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<AttemptRecord>,
    /// OOMs the training process absorbed itself (it halved its micro-batch
    /// inside the process and went on), oldest first; `microBatch` and
    /// `gradAccum` show the shape it runs with since.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absorbed_ooms: Vec<crate::api::AbsorbedOom>,
    /// Standard conditions (`Placed`, `Invalid`, ...), each with observedGeneration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl TrainingJobStatus {
    /// The placement of the current attempt as recorded here, while the job
    /// is live.
    pub fn recorded_placement(&self) -> Option<&PlacementStatus> {
        self.placement
            .as_ref()
            .filter(|p| p.attempt == self.attempt.max(1) && !self.phase.is_terminal())
    }
}
