//! The cluster at a glance: one view model, built as a pure function of the
//! TrainingJobs and GpuNodes, drawn by `vramfit status` ([`text`]) and by the
//! controller's `/ui` page ([`html`]).

pub mod access;
pub mod html;
pub mod text;

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde::Serialize;

use crate::api::{GpuHealth, GpuNode, NodeAllocation, Phase, TrainingJob};

/// Retries shown, most recent first.
pub const RECENT_RETRIES: usize = 10;

/// What `vramfit status` and `/ui` show.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// When the view was built (RFC 3339).
    pub time: String,
    /// GPU nodes in name order.
    pub nodes: Vec<NodeView>,
    /// Jobs placed on a GPU no GpuNode reports (a node gone, a GPU lost).
    pub orphans: Vec<JobOnGpu>,
    /// Jobs waiting for room, in the order the scheduler considers them.
    pub waiting: Vec<WaitingJob>,
    /// The most recent OOM retries (attempts that ran out of memory and the
    /// OOMs absorbed inside training processes), newest first.
    pub retries: Vec<RetryView>,
    /// Jobs by phase.
    pub phases: BTreeMap<String, usize>,
    /// Sums over the usable GPUs.
    pub totals: Totals,
    /// Jobs by namespace, then phase: what [`access::restrict`] sums
    /// `phases` from for a reader of some namespaces only. Not shown.
    #[serde(skip)]
    pub phases_by_namespace: BTreeMap<String, BTreeMap<String, usize>>,
}

/// Sums over the GPUs of nodes with a fresh heartbeat that are not faulty.
#[derive(Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// GPUs counted.
    pub gpus: usize,
    /// Their memory.
    pub capacity_bytes: u64,
    /// Budgets committed on them.
    pub committed_bytes: u64,
    /// Memory in use on them (NVML).
    pub measured_bytes: u64,
}

/// One GPU node.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// The agent's last heartbeat (RFC 3339).
    pub heartbeat: Option<String>,
    /// Seconds since the heartbeat.
    pub heartbeat_age_seconds: Option<i64>,
    /// False when the heartbeat is missing or older than the trusted age: the
    /// controller places nothing there.
    pub fresh: bool,
    /// Cordoned in its GpuNode spec.
    pub cordoned: bool,
    /// `nvml` or `simulated`, when the agent says.
    pub agent_mode: Option<String>,
    /// The GPUs.
    pub gpus: Vec<GpuView>,
}

/// One GPU and the jobs on it.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    /// NVML index.
    pub index: u32,
    /// GPU model.
    pub model: String,
    /// Healthy, Degraded or Faulty.
    pub health: GpuHealth,
    /// Total memory.
    pub capacity_bytes: u64,
    /// Sum of the budgets of the jobs placed on it.
    pub committed_bytes: u64,
    /// Capacity minus committed (0 when over-committed).
    pub free_bytes: u64,
    /// Memory in use, as the agent measures it.
    pub measured_bytes: u64,
    /// Jobs on the GPU, by name.
    pub jobs: Vec<JobOnGpu>,
}

/// A job placed on a GPU.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobOnGpu {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Placed, Running or Retrying.
    pub phase: Phase,
    /// Node.
    pub node: String,
    /// GPU index on the node.
    pub gpu: u32,
    /// Budget per GPU.
    pub budget_bytes: u64,
    /// Memory its processes use on this GPU now (the agent), else the highest
    /// peak the controller recorded.
    pub measured_bytes: Option<u64>,
    /// Micro-batch.
    pub micro_batch: Option<u32>,
    /// Gradient accumulation.
    pub grad_accum: Option<u32>,
    /// Attempt, from 1.
    pub attempt: u32,
}

/// A job waiting for a GPU.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WaitingJob {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Priority.
    pub priority: i32,
    /// GPUs it needs.
    pub gpus: u32,
    /// Budget per GPU it waits for (none until predicted).
    pub budget_bytes: Option<u64>,
    /// Attempt, from 1.
    pub attempt: u32,
    /// Why it waits, as the controller wrote it.
    pub reason: String,
    /// Seconds since it was created.
    pub age_seconds: Option<i64>,
}

/// One OOM retry.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetryView {
    /// Namespace.
    pub namespace: String,
    /// Job (or, for an OOM absorbed in a process the agent cannot tie to a
    /// job, the pod).
    pub name: String,
    /// `restart` (the attempt was stopped and a new pod started) or
    /// `in-process` (the training step retried with a smaller micro-batch).
    pub kind: String,
    /// The attempt that ran out of memory.
    pub attempt: u32,
    /// Micro-batch x accumulation before.
    pub from: String,
    /// Micro-batch x accumulation after, when known.
    pub to: Option<String>,
    /// What the pod or the agent said.
    pub message: Option<String>,
    /// When (RFC 3339), when known.
    pub time: Option<String>,
}

/// Builds the view. `now` and `heartbeat_ttl` decide which nodes are fresh,
/// as the controller's scheduler does.
pub fn cluster_status<J: Borrow<TrainingJob>, N: Borrow<GpuNode>>(
    jobs: &[J],
    gpu_nodes: &[N],
    now: Timestamp,
    heartbeat_ttl: SignedDuration,
) -> ClusterStatus {
    let (nodes, mut orphans) = node_views(jobs, gpu_nodes, now, heartbeat_ttl);
    let mut waiting = Vec::new();
    let mut retries = Vec::new();
    let mut phases_by_namespace: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for job in jobs {
        let job = job.borrow();
        let phase = match job.status.as_ref() {
            Some(status) => format!("{:?}", status.phase),
            None => "New".into(),
        };
        *phases_by_namespace
            .entry(job.namespace().unwrap_or_default())
            .or_default()
            .entry(phase)
            .or_default() += 1;
        let Some(status) = job.status.as_ref() else {
            continue;
        };
        retries.extend(restart_retries(job));
        if job
            .status
            .as_ref()
            .and_then(|s| s.recorded_placement())
            .is_none()
            && !status.phase.is_terminal()
            && job.metadata.deletion_timestamp.is_none()
        {
            waiting.push(WaitingJob {
                namespace: job.namespace().unwrap_or_default(),
                name: job.name_any(),
                priority: job.spec.priority,
                gpus: job.spec.gpus,
                budget_bytes: status.budget_bytes,
                attempt: status.attempt.max(1),
                reason: status
                    .message
                    .clone()
                    .unwrap_or_else(|| "not predicted yet".into()),
                age_seconds: age_seconds(job, now),
            });
        }
    }
    let by_pod = jobs_by_pod(jobs);
    for node in gpu_nodes {
        retries.extend(absorbed_retries(node.borrow(), &by_pod));
    }

    let totals = totals(&nodes);
    // The scheduler's order: higher priority first, then older first.
    waiting.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(b.age_seconds.cmp(&a.age_seconds))
            .then((&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
    // Newest first; retries without a time (restart history) after those
    // with one, the latest attempt first.
    retries.sort_by(|a, b| {
        b.time
            .cmp(&a.time)
            .then(b.attempt.cmp(&a.attempt))
            .then((&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
    retries.truncate(RECENT_RETRIES);
    orphans.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    ClusterStatus {
        time: now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        nodes,
        orphans,
        waiting,
        retries,
        phases: access::sum_phases(phases_by_namespace.values()),
        totals,
        phases_by_namespace,
    }
}

/// Sums over the GPUs of fresh nodes that are not faulty.
fn totals(nodes: &[NodeView]) -> Totals {
    let mut totals = Totals::default();
    for node in nodes.iter().filter(|n| n.fresh) {
        for gpu in node.gpus.iter().filter(|g| g.health != GpuHealth::Faulty) {
            totals.gpus += 1;
            totals.capacity_bytes += gpu.capacity_bytes;
            totals.committed_bytes += gpu.committed_bytes;
            totals.measured_bytes += gpu.measured_bytes;
        }
    }
    totals
}

/// The GPU nodes in name order, each GPU with the jobs placed on it (their
/// budgets summed into `committed_bytes`, `free_bytes` what is left), and
/// the jobs placed on a GPU no node reports. Linear in jobs plus nodes.
pub fn node_views<J: Borrow<TrainingJob>, N: Borrow<GpuNode>>(
    jobs: &[J],
    gpu_nodes: &[N],
    now: Timestamp,
    heartbeat_ttl: SignedDuration,
) -> (Vec<NodeView>, Vec<JobOnGpu>) {
    let mut nodes: Vec<NodeView> = gpu_nodes
        .iter()
        .map(|n| node_view(n.borrow(), now, heartbeat_ttl))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let index: HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    let reported: HashMap<String, &GpuNode> = gpu_nodes
        .iter()
        .map(|n| (n.borrow().name_any(), n.borrow()))
        .collect();
    let mut orphans = Vec::new();
    for job in jobs {
        let job = job.borrow();
        let Some(status) = job.status.as_ref() else {
            continue;
        };
        let Some(placement) = status.recorded_placement() else {
            continue;
        };
        let namespace = job.namespace().unwrap_or_default();
        let name = job.name_any();
        for assigned in &placement.gpus {
            let measured_now = reported
                .get(&placement.node)
                .and_then(|n| n.status.as_ref())
                .and_then(|s| s.gpus.iter().find(|g| g.index == assigned.index))
                .and_then(|g| {
                    let pod = status.pod_name.as_deref()?;
                    let bytes: Vec<u64> = g
                        .processes
                        .iter()
                        .filter(|p| {
                            p.pod_namespace.as_deref() == Some(namespace.as_str())
                                && p.pod_name.as_deref() == Some(pod)
                        })
                        .map(|p| p.used_bytes)
                        .collect();
                    (!bytes.is_empty()).then(|| bytes.iter().sum())
                });
            let entry = JobOnGpu {
                namespace: namespace.clone(),
                name: name.clone(),
                phase: status.phase,
                node: placement.node.clone(),
                gpu: assigned.index,
                budget_bytes: placement.budget_bytes,
                measured_bytes: measured_now.or(status.measured_peak_bytes),
                micro_batch: status.micro_batch,
                grad_accum: status.grad_accum,
                attempt: status.attempt.max(1),
            };
            let gpu = index
                .get(&placement.node)
                .and_then(|&i| nodes[i].gpus.iter_mut().find(|g| g.index == assigned.index));
            match gpu {
                Some(gpu) => {
                    gpu.committed_bytes += placement.budget_bytes;
                    gpu.jobs.push(entry);
                }
                None => orphans.push(entry),
            }
        }
    }
    for node in &mut nodes {
        for gpu in &mut node.gpus {
            gpu.free_bytes = gpu.capacity_bytes.saturating_sub(gpu.committed_bytes);
            gpu.jobs
                .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        }
    }
    (nodes, orphans)
}

fn node_view(node: &GpuNode, now: Timestamp, ttl: SignedDuration) -> NodeView {
    let status = node.status.clone().unwrap_or_default();
    let heartbeat_age = status
        .heartbeat
        .as_deref()
        .and_then(|h| h.parse::<Timestamp>().ok())
        .map(|h| now.duration_since(h).as_secs());
    NodeView {
        name: node.name_any(),
        heartbeat: status.heartbeat.clone(),
        heartbeat_age_seconds: heartbeat_age,
        fresh: heartbeat_age.is_some_and(|age| age <= ttl.as_secs()),
        cordoned: node.spec.cordoned,
        agent_mode: status.agent.as_ref().map(|a| a.mode.clone()),
        gpus: status
            .gpus
            .iter()
            .map(|g| GpuView {
                index: g.index,
                model: g.model.clone(),
                health: g.health,
                capacity_bytes: g.total_bytes,
                committed_bytes: 0,
                free_bytes: g.total_bytes,
                measured_bytes: g.used_bytes,
                jobs: Vec::new(),
            })
            .collect(),
    }
}

fn age_seconds(job: &TrainingJob, now: Timestamp) -> Option<i64> {
    let created = job.metadata.creation_timestamp.as_ref()?;
    Some(now.duration_since(created.0).as_secs())
}

fn shape(micro: u32, accum: u32) -> String {
    format!("{micro}x{accum}")
}

/// Attempts of a job that ended out of memory, each with the shape the next
/// attempt ran with.
fn restart_retries(job: &TrainingJob) -> Vec<RetryView> {
    let Some(status) = job.status.as_ref() else {
        return Vec::new();
    };
    let history = &status.history;
    history
        .iter()
        .enumerate()
        .filter(|(_, record)| record.outcome == "OutOfMemory")
        .map(|(i, record)| {
            let next = history
                .get(i + 1)
                .map(|n| shape(n.micro_batch, n.grad_accum))
                .or_else(|| {
                    (status.attempt > record.attempt)
                        .then_some(())
                        .and(status.micro_batch.zip(status.grad_accum))
                        .map(|(m, a)| shape(m, a))
                });
            RetryView {
                namespace: job.namespace().unwrap_or_default(),
                name: job.name_any(),
                kind: "restart".into(),
                attempt: record.attempt,
                from: shape(record.micro_batch, record.grad_accum),
                to: next,
                message: record.message.clone(),
                time: None,
            }
        })
        .collect()
}

/// OOMs absorbed inside the training processes the agent reports.
/// The jobs by (namespace, pod name of their current attempt).
fn jobs_by_pod<J: Borrow<TrainingJob>>(jobs: &[J]) -> HashMap<(String, String), &TrainingJob> {
    let mut by_pod = HashMap::new();
    for job in jobs {
        let job = job.borrow();
        if let Some(pod) = job.status.as_ref().and_then(|s| s.pod_name.clone()) {
            // The first job listed wins, as a scan in list order would find.
            by_pod
                .entry((job.namespace().unwrap_or_default(), pod))
                .or_insert(job);
        }
    }
    by_pod
}

fn absorbed_retries(
    node: &GpuNode,
    jobs: &HashMap<(String, String), &TrainingJob>,
) -> Vec<RetryView> {
    let Some(status) = node.status.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for process in status.gpus.iter().flat_map(|g| g.processes.iter()) {
        let Some(observed) = process.shape.as_ref() else {
            continue;
        };
        let namespace = process.pod_namespace.clone().unwrap_or_default();
        let job = process
            .pod_name
            .clone()
            .and_then(|pod| jobs.get(&(namespace.clone(), pod)))
            .copied();
        let name = process
            .training_job
            .clone()
            .or_else(|| job.map(|j| j.name_any()))
            .or_else(|| process.pod_name.clone())
            .unwrap_or_else(|| format!("pid {}", process.pid));
        let attempt = job
            .and_then(|j| j.status.as_ref())
            .map_or(1, |s| s.attempt.max(1));
        for oom in &observed.absorbed_ooms {
            out.push(RetryView {
                namespace: namespace.clone(),
                name: name.clone(),
                kind: "in-process".into(),
                attempt,
                from: shape(oom.from_micro, oom.from_accum),
                to: Some(shape(oom.to_micro, oom.to_accum)),
                message: None,
                time: Some(oom.time.clone()),
            });
        }
    }
    out
}

/// A node's allocation as the controller writes it into `GpuNode` status
/// (`kubectl get gn` columns). Free memory counts usable GPUs only: none on a
/// node with a stale heartbeat, none on a faulty GPU.
pub fn node_allocation(node: &NodeView) -> NodeAllocation {
    use crate::quantity::human_bytes;
    let usable = |g: &GpuView| node.fresh && g.health != GpuHealth::Faulty;
    let committed: u64 = node.gpus.iter().map(|g| g.committed_bytes).sum();
    let free: u64 = node
        .gpus
        .iter()
        .filter(|g| usable(g))
        .map(|g| g.free_bytes)
        .sum();
    let used: u64 = node.gpus.iter().map(|g| g.measured_bytes).sum();
    let gpu_free = node
        .gpus
        .iter()
        .map(|g| {
            if usable(g) {
                format!("{}:{}", g.index, human_bytes(g.free_bytes).replace(' ', ""))
            } else {
                format!("{}:-", g.index)
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    let jobs: std::collections::BTreeSet<(&str, &str)> = node
        .gpus
        .iter()
        .flat_map(|g| g.jobs.iter())
        .map(|j| (j.namespace.as_str(), j.name.as_str()))
        .collect();
    NodeAllocation {
        committed_bytes: committed,
        free_bytes: free,
        committed: human_bytes(committed),
        free: human_bytes(free),
        used: human_bytes(used),
        gpu_free,
        jobs: jobs.len() as u32,
    }
}

/// Fraction `part / whole` clamped to 0..=1 (0 for an empty whole).
pub fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64).clamp(0.0, 1.0)
    }
}

/// Reads the TrainingJobs (of `namespace`, or all) and the GpuNodes (those
/// matching the label selector `node_selector`, or all).
pub async fn fetch(
    client: &kube::Client,
    namespace: Option<&str>,
    node_selector: Option<&str>,
) -> Result<(Vec<TrainingJob>, Vec<GpuNode>), kube::Error> {
    use kube::api::{Api, ListParams};
    let jobs: Api<TrainingJob> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let gpu_nodes: Api<GpuNode> = Api::all(client.clone());
    let all = ListParams::default();
    let selected = match node_selector {
        Some(selector) => ListParams::default().labels(selector),
        None => ListParams::default(),
    };
    let (jobs, gpu_nodes) = futures::try_join!(jobs.list(&all), gpu_nodes.list(&selected))?;
    Ok((jobs.items, gpu_nodes.items))
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
