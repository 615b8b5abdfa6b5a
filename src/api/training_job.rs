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
        name = "Progress",
        type_ = "string",
        json_path = ".status.progress.done",
        description = "optimizer steps done (of the total, when the training reports one)"
    ),
    printcolumn(
        name = "Expected-End",
        type_ = "string",
        json_path = ".status.progress.expectedEnd",
        description = "when the running attempt is expected to end",
        priority = "1"
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
    /// The share of each of its GPUs' compute the job needs, in percent: the
    /// jobs placed on one GPU never need more than 100 together, so none is
    /// slowed by another's kernels beyond the switching between them.
    /// Absent: not counted, the job shares its GPU by memory alone (right
    /// for jobs that leave the GPU idle most of the time: data loading,
    /// small models, interactive work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub gpu_compute_percent: Option<u32>,
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
    /// How long the job is expected to run at its preferred shape, as the
    /// user estimates it (like Slurm's `--time`, but never enforced): whole
    /// numbers with units `d`, `h`, `m` or `s`, such as `2h`, `90m` or
    /// `1d12h`. Elastic placement weighs it against the wait for the
    /// preferred shape, and it gives a running job an expected end until
    /// the training reports its own progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::duration")]
    pub expected_duration: Option<String>,
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
    /// Memory-elastic placement: when the attempt's shape (micro-batch x
    /// accumulation) fits no GPU now, start at once with a smaller
    /// micro-batch and more accumulation (the same global batch) where that
    /// fits, if finishing slower beats waiting. A running job is never
    /// moved. Absent: the controller's default (`--elastic-default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<bool>,
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
    /// Compute reserved on each GPU, percent (`spec.gpuComputePercent`);
    /// absent: not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u32>,
    /// GPU model of the placement, when the budget was predicted per model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Micro-batch chosen for that GPU model (`batch.autoMicro`), or the
    /// smaller one elastic placement chose (`elastic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    /// Set when elastic placement started the attempt with a smaller shape
    /// than it prefers, because the preferred one fit no GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticPlacement>,
}

/// Why an attempt runs with a smaller shape than it prefers: the figures of
/// elastic placement's choice (`spec.batch.elastic`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ElasticPlacement {
    /// The micro-batch the attempt prefers.
    pub preferred_micro_batch: u32,
    /// Its gradient accumulation.
    pub preferred_grad_accum: u32,
    /// Budget per GPU in bytes the preferred shape needs, which fit no GPU.
    pub preferred_budget_bytes: u64,
    /// Predicted step time of the chosen shape over the preferred one's.
    pub relative_step_time: f64,
    /// Seconds the preferred shape was expected to wait for room; absent
    /// when no running job's expected end would make room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_wait_seconds: Option<f64>,
}

/// One smaller shape an elastic job may start with, predicted like the
/// attempt's own budget.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ShapeBudget {
    /// GPU model the prediction is for (absent: the default GPU profile, as
    /// `budgetBytes` of the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Micro-batch per GPU.
    pub micro_batch: u32,
    /// Gradient accumulation that keeps the global batch.
    pub grad_accum: u32,
    /// Predicted peak per GPU in bytes.
    pub predicted_bytes: u64,
    /// Budget per GPU in bytes (prediction + headroom).
    pub budget_bytes: u64,
    /// Predicted step time over the attempt's preferred shape's (above 1).
    pub relative_step_time: f64,
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
    /// `Succeeded`, `OutOfMemory`, `NoGpu` (its container started without
    /// its GPU) or `Failed`.
    pub outcome: String,
    /// What the pod or the agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The running attempt's progress and expected end.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobProgress {
    /// The attempt this describes.
    pub attempt: u32,
    /// Optimizer steps done, as the training reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Optimizer steps in all, when the training knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_steps: Option<u64>,
    /// Smoothed seconds per optimizer step, as the training measures it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_per_step: Option<f64>,
    /// When the training counted `steps` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<String>,
    /// `steps/totalSteps` or `steps` (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<String>,
    /// When the attempt is expected to end (RFC 3339); absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_end: Option<String>,
    /// What `expectedEnd` comes from: `progress` (steps, total and step
    /// time reported) or `expectedDuration` (the pod's start plus
    /// `spec.expectedDuration`, times the relative step time of an elastic
    /// placement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
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
    /// Elastic jobs only: the smaller shapes the current attempt may start
    /// with when its own fits no GPU now, each with its budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elastic_shapes: Vec<ShapeBudget>,
    /// The share of each GPU's compute the current attempt is placed with, in
    /// percent: `spec.gpuComputePercent`, else the cluster's default
    /// (`vramfit controller --default-gpu-compute-percent`), fixed when the
    /// attempt is predicted; absent: not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u32>,
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
    /// The micro-batch the current attempt prefers, while elastic placement
    /// runs it with a smaller one: an attempt that follows without an OOM
    /// starts from it again (one that follows an OOM halves the shape that
    /// ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_micro_batch: Option<u32>,
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
    /// How far the running attempt has come and when it is expected to end,
    /// from the training's own report (through the node agent) or from
    /// `spec.expectedDuration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<JobProgress>,
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
