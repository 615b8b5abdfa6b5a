//! Plain descriptions of what the cluster offers and what a job asks for.
//!
//! These types carry no Kubernetes types on purpose: the controller maps its
//! `GpuNode`s, node objects and `TrainingJob`s into them, the trace loader maps
//! CSV rows into them, and the engine never needs to know which one it got.

use serde::{Deserialize, Serialize};

/// A whole GPU's compute, in the thousandths that [`JobRequest::gpu_compute`]
/// counts.
pub const COMPUTE_WHOLE: u64 = 1000;

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// One GPU of a node, as the inventory reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSpec {
    /// Model name (`H200`, `T4`, ...); matched exactly against a job's allowed models.
    pub model: String,
    /// Capacity in generic units: bytes for real GPUs, 1000 for trace GPUs.
    pub capacity: u64,
}

/// Effect of a node taint; only the effects that keep new pods away matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaintEffect {
    /// New pods are not scheduled without a matching toleration.
    NoSchedule,
    /// Soft preference; the engine ignores it, as the default scheduler may.
    PreferNoSchedule,
    /// Like `NoSchedule`, and running pods are evicted.
    NoExecute,
}

/// A node taint (`key=value:Effect`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    /// Taint key.
    pub key: String,
    /// Taint value; empty when the taint has none.
    pub value: String,
    /// What the taint does to pods that do not tolerate it.
    pub effect: TaintEffect,
}

/// A job's toleration, with Kubernetes matching semantics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Toleration {
    /// Key to match; `None` with `value: None` tolerates every taint (operator `Exists`, empty key).
    pub key: Option<String>,
    /// Value to match (operator `Equal`); `None` means operator `Exists`.
    pub value: Option<String>,
    /// Effect to match; `None` matches every effect.
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    /// Whether this toleration lets a pod onto a node carrying `taint`.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        let key_ok = self.key.as_deref().is_none_or(|k| k == taint.key);
        let value_ok = self.value.as_deref().is_none_or(|v| v == taint.value);
        let effect_ok = self.effect.is_none_or(|e| e == taint.effect);
        key_ok && value_ok && effect_ok
    }
}

/// One schedulable node: what it can give to the jobs vramfit places there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Node name, unique in the inventory.
    pub name: String,
    /// Allocatable CPU in millicores.
    pub cpu_milli: u64,
    /// Allocatable memory in bytes.
    pub memory_bytes: u64,
    /// Taints; `NoSchedule`/`NoExecute` ones keep away jobs that do not tolerate them.
    pub taints: Vec<Taint>,
    /// GPUs in index order (the index is what the pod gets).
    pub gpus: Vec<GpuSpec>,
}

/// The whole cluster as the placement engine sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// Nodes in a stable order; ties between equally good nodes go to the earlier one.
    pub nodes: Vec<NodeSpec>,
}

/// What a job asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRequest {
    /// Stable identity (for a TrainingJob: `namespace/name`); releases use it.
    pub id: String,
    /// Number of GPUs, all on one node; 0 for a CPU-only job.
    pub gpus: u32,
    /// Memory budget per GPU in the GPUs' units (bytes, or thousandths of a trace GPU).
    pub gpu_budget: u64,
    /// Compute needed on each of those GPUs, in thousandths of a GPU
    /// ([`COMPUTE_WHOLE`] is all of it): the jobs on one GPU never need more
    /// than the whole. 0: not counted, the job shares by memory alone.
    #[serde(default)]
    pub gpu_compute: u64,
    /// CPU request in millicores.
    pub cpu_milli: u64,
    /// Memory request in bytes.
    pub memory_bytes: u64,
    /// Allowed GPU models; empty means any model.
    pub gpu_models: Vec<String>,
    /// Tolerations for node taints.
    pub tolerations: Vec<Toleration>,
}

/// A job bound to a node and GPUs: the engine's ledger entry, and what the
/// controller stores in the job's status so a restart can rebuild the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The job's identity.
    pub job_id: String,
    /// Node name.
    pub node: String,
    /// GPU indices on that node, ascending; empty for a CPU-only job.
    pub gpu_indices: Vec<u32>,
    /// Budget reserved on each of those GPUs, in the GPUs' units.
    pub gpu_budget: u64,
    /// Compute reserved on each of those GPUs, thousandths of a GPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_compute: u64,
    /// CPU reserved on the node, millicores.
    pub cpu_milli: u64,
    /// Memory reserved on the node, bytes.
    pub memory_bytes: u64,
}

/// The engine's answer for a job that fits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// What was (or would be) recorded in the ledger.
    pub placement: Placement,
    /// Index of the node in the inventory.
    pub node_index: usize,
    /// Per chosen GPU, `gpu_budget / capacity`: the value for `VRAMFIT_MEMORY_FRACTION`.
    pub memory_fractions: Vec<f64>,
}

impl JobRequest {
    /// A job with no taint tolerations and no model constraint; the usual starting point in tests.
    pub fn new(
        id: impl Into<String>,
        gpus: u32,
        gpu_budget: u64,
        cpu_milli: u64,
        memory_bytes: u64,
    ) -> Self {
        Self {
            id: id.into(),
            gpus,
            gpu_budget,
            gpu_compute: 0,
            cpu_milli,
            memory_bytes,
            gpu_models: Vec::new(),
            tolerations: Vec::new(),
        }
    }

    /// The same job needing `thousandths` of each GPU's compute.
    pub fn with_compute(mut self, thousandths: u64) -> Self {
        self.gpu_compute = thousandths;
        self
    }
}
