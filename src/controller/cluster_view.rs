//! Maps the API objects into the placement engine's plain inventory, and jobs
//! into requests and placements.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PodSpec};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::{GpuHealth, GpuNode, PlacementStatus, TrainingJob};
use crate::place::{
    COMPUTE_WHOLE, GpuSpec, Inventory, JobRequest, NodeSpec, Placement, Taint, TaintEffect,
    Toleration,
};
use crate::quantity::parse_quantity;

/// The cluster as the engine sees it, plus the GPUs that are held back.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ClusterView {
    /// Nodes with a fresh `GpuNode` heartbeat, in name order.
    pub inventory: Inventory,
    /// Synthetic placements that keep faulty GPUs out of use.
    pub reserved: Vec<Placement>,
    /// GPU UUIDs by (node, index), for the pod's `NVIDIA_VISIBLE_DEVICES`.
    pub uuids: BTreeMap<(String, u32), String>,
}

/// What one usable GPU node adds to the view: its [`NodeSpec`], the
/// reservations of its faulty GPUs and its GPUs' UUIDs by index. Depends
/// only on the `GpuNode` and its `Node`, not on the time (the heartbeat's
/// freshness is [`gpu_node_is_live`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NodePart {
    /// The node as the engine sees it.
    pub spec: NodeSpec,
    /// Placements that hold its faulty GPUs back.
    pub reserved: Vec<Placement>,
    /// Its GPUs' UUIDs by index.
    pub uuids: Vec<(u32, String)>,
}

impl ClusterView {
    /// Appends a node's part; nodes are pushed in name order.
    pub fn push(&mut self, part: &NodePart) {
        for (index, uuid) in &part.uuids {
            self.uuids
                .insert((part.spec.name.clone(), *index), uuid.clone());
        }
        self.reserved.extend(part.reserved.iter().cloned());
        self.inventory.nodes.push(part.spec.clone());
    }
}

/// Builds the view from the `GpuNode`s whose heartbeat is younger than
/// `heartbeat_ttl` and the matching `Node` objects (allocatable CPU and memory,
/// taints, `unschedulable`). A `GpuNode` without a `Node` is skipped: nothing
/// could run there.
pub fn cluster_view(
    gpu_nodes: &[&GpuNode],
    nodes: &[&Node],
    now: Timestamp,
    heartbeat_ttl: SignedDuration,
) -> ClusterView {
    let nodes_by_name: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, *n)))
        .collect();
    let mut sorted: Vec<&GpuNode> = gpu_nodes.to_vec();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut view = ClusterView::default();
    for gpu_node in sorted {
        let Some(name) = gpu_node.metadata.name.as_deref() else {
            continue;
        };
        if !gpu_node_is_live(gpu_node, heartbeat(gpu_node).as_ref(), now, heartbeat_ttl) {
            continue;
        }
        let Some(node) = nodes_by_name.get(name) else {
            continue;
        };
        if let Some(part) = node_part(gpu_node, node) {
            view.push(&part);
        }
    }
    view
}

/// The `GpuNode`'s last heartbeat, if it has a status with one that parses.
pub fn heartbeat(gpu_node: &GpuNode) -> Option<Timestamp> {
    gpu_node
        .status
        .as_ref()?
        .heartbeat
        .as_deref()?
        .parse::<Timestamp>()
        .ok()
}

/// True when the `GpuNode` may be used now, as far as it alone says: it has
/// a status, is not cordoned and its `heartbeat` ([`heartbeat`]) is no older
/// than `ttl`.
pub fn gpu_node_is_live(
    gpu_node: &GpuNode,
    heartbeat: Option<&Timestamp>,
    now: Timestamp,
    ttl: SignedDuration,
) -> bool {
    gpu_node.status.is_some()
        && !gpu_node.spec.cordoned
        && heartbeat.is_some_and(|h| now.duration_since(*h) <= ttl)
}

/// The node's part of the view, or `None` when it cannot be used whatever
/// the time: no name or status, the `Node` unschedulable, or GPU indices that
/// do not match their positions (the engine addresses GPUs by position).
pub fn node_part(gpu_node: &GpuNode, node: &Node) -> Option<NodePart> {
    let name = gpu_node.metadata.name.clone()?;
    let status = gpu_node.status.as_ref()?;
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        return None;
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let quantity = |key: &str, scale: u64| {
        allocatable
            .and_then(|a| a.get(key))
            .and_then(|q| parse_quantity(&q.0, scale))
            .unwrap_or(0)
    };
    let mut gpus: Vec<_> = status.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    // The engine addresses GPUs by position; keep positions equal to NVML indices.
    if gpus
        .iter()
        .enumerate()
        .any(|(pos, g)| g.index as usize != pos)
    {
        return None;
    }
    let reserved = gpus
        .iter()
        .filter(|gpu| gpu.health == GpuHealth::Faulty)
        .map(|gpu| Placement {
            job_id: format!("faulty-gpu/{name}/{}", gpu.index),
            node: name.clone(),
            gpu_indices: vec![gpu.index],
            gpu_budget: gpu.total_bytes,
            gpu_compute: COMPUTE_WHOLE,
            cpu_milli: 0,
            memory_bytes: 0,
        })
        .collect();
    Some(NodePart {
        uuids: gpus.iter().map(|g| (g.index, g.uuid.clone())).collect(),
        reserved,
        spec: NodeSpec {
            cpu_milli: quantity("cpu", 1000),
            memory_bytes: quantity("memory", 1),
            taints: node_taints(node),
            gpus: gpus
                .iter()
                .map(|g| GpuSpec {
                    model: g.model.clone(),
                    capacity: g.total_bytes,
                })
                .collect(),
            name,
        },
    })
}

fn node_taints(node: &Node) -> Vec<Taint> {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    taints
        .iter()
        .filter_map(|t| {
            Some(Taint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: taint_effect(&t.effect)?,
            })
        })
        .collect()
}

fn taint_effect(effect: &str) -> Option<TaintEffect> {
    match effect {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

/// The ledger key of a job: `namespace/name`.
pub fn job_key(job: &TrainingJob) -> String {
    format!(
        "{}/{}",
        job.metadata.namespace.as_deref().unwrap_or_default(),
        job.metadata.name.as_deref().unwrap_or_default()
    )
}

/// CPU (millicores) and memory (bytes) the pod template requests, summed over
/// its containers.
pub fn pod_requests(spec: Option<&PodSpec>) -> (u64, u64) {
    let mut cpu = 0;
    let mut memory = 0;
    for container in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
        let requests = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref());
        if let Some(requests) = requests {
            cpu += requests
                .get("cpu")
                .and_then(|q| parse_quantity(&q.0, 1000))
                .unwrap_or(0);
            memory += requests
                .get("memory")
                .and_then(|q| parse_quantity(&q.0, 1))
                .unwrap_or(0);
        }
    }
    (cpu, memory)
}

/// What `pod_requests` gives for the parsed template, read from the template's
/// JSON: the ledger reads it for every placed job in every cycle, where
/// parsing the whole template cost more than the rest of the entry.
pub fn template_requests(template: &serde_json::Map<String, serde_json::Value>) -> (u64, u64) {
    let containers = template
        .get("spec")
        .and_then(|s| s.get("containers"))
        .and_then(|c| c.as_array());
    let mut cpu = 0;
    let mut memory = 0;
    for container in containers.into_iter().flatten() {
        let Some(requests) = container
            .get("resources")
            .and_then(|r| r.get("requests"))
            .and_then(|r| r.as_object())
        else {
            continue;
        };
        let quantity = |name: &str, scale: u64| {
            requests
                .get(name)
                .and_then(|q| q.as_str())
                .and_then(|q| parse_quantity(q, scale))
                .unwrap_or(0)
        };
        cpu += quantity("cpu", 1000);
        memory += quantity("memory", 1);
    }
    (cpu, memory)
}

fn tolerations(spec: Option<&PodSpec>) -> Vec<Toleration> {
    let list = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    list.iter()
        .filter_map(|t| {
            let effect = match t.effect.as_deref() {
                None | Some("") => None,
                Some(e) => Some(taint_effect(e)?),
            };
            let exists = t.operator.as_deref() == Some("Exists");
            Some(Toleration {
                key: t.key.clone().filter(|k| !k.is_empty()),
                value: if exists {
                    None
                } else {
                    Some(t.value.clone().unwrap_or_default())
                },
                effect,
            })
        })
        .collect()
}

/// The engine's request for a job with the given per-GPU budget. Fails when the
/// pod template does not parse.
pub fn job_request(job: &TrainingJob, budget: u64) -> Result<JobRequest, String> {
    let template = job.spec.pod_template()?;
    let spec = template.spec.as_ref();
    let (cpu_milli, memory_bytes) = pod_requests(spec);
    Ok(JobRequest {
        id: job_key(job),
        gpus: job.spec.gpus,
        gpu_budget: budget,
        gpu_compute: compute_thousandths(compute_percent(job)),
        cpu_milli,
        memory_bytes,
        gpu_models: job.spec.gpu_models.clone().unwrap_or_default(),
        tolerations: tolerations(spec),
    })
}

/// The compute share, percent, the job's current attempt is placed with:
/// the one its prediction fixed (`status.computePercent`: the spec's, else the
/// cluster's default), else the spec's (a job predicted before the field).
pub fn compute_percent(job: &TrainingJob) -> Option<u32> {
    job.status
        .as_ref()
        .and_then(|s| s.compute_percent)
        .or(job.spec.gpu_compute_percent)
}

/// The engine's compute units (thousandths of a GPU) of a percentage; none
/// when it is not counted.
pub fn compute_thousandths(percent: Option<u32>) -> u64 {
    percent.map_or(0, |p| u64::from(p) * COMPUTE_WHOLE / 100)
}

/// The ledger entry for a placement recorded in a job's status.
pub fn recorded_placement(job: &TrainingJob, placement: &PlacementStatus) -> Placement {
    ledger_entry(
        job_key(job),
        placement,
        template_requests(&job.spec.template),
    )
}

/// The ledger entry of `placement` under `job_id`, with the CPU (millicores)
/// and memory (bytes) its pod requests.
pub fn ledger_entry(
    job_id: String,
    placement: &PlacementStatus,
    requests: (u64, u64),
) -> Placement {
    let mut gpu_indices: Vec<u32> = placement.gpus.iter().map(|g| g.index).collect();
    gpu_indices.sort_unstable();
    Placement {
        job_id,
        node: placement.node.clone(),
        gpu_indices,
        gpu_budget: placement.budget_bytes,
        gpu_compute: compute_thousandths(placement.compute_percent),
        cpu_milli: requests.0,
        memory_bytes: requests.1,
    }
}

#[cfg(test)]
#[path = "cluster_view_tests.rs"]
mod tests;
