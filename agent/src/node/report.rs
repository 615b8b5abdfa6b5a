//! Turns one GPU reading into the `GpuNode` status and the watchdog's input:
//! each process mapped to its owner, its peak since it was first seen, the
//! counters it publishes, the context overhead and probes per GPU.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use vramfit::api::{
    AgentInfo, GpuDevice, GpuHealth, GpuNodeStatus, GpuProcess, OomReport, ProbeStatus,
};

use super::stats::{read_allocator, read_shape};
use super::watchdog::{Owner, PodGpuUsage, StopOrder};
use crate::gpu::Reading;

/// At most this many OOM reports are kept (most recent last).
pub const MAX_OOM_REPORTS: usize = 50;

/// Who a GPU process belongs to.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessOwner {
    /// The pod (or the watched local process).
    pub owner: Owner,
    /// The TrainingJob of the pod, when labelled.
    pub training_job: Option<String>,
    /// The container that runs the process.
    pub container: Option<String>,
    /// The budget per GPU, bytes, when the pod has one.
    pub budget_bytes: Option<u64>,
    /// UUIDs of the GPUs vramfit gave the pod; `None`: not known (local
    /// mode), every GPU counts against the budget.
    pub gpus: Option<Vec<String>>,
    /// The pod's stats folder on this node.
    pub stats_dir: Option<PathBuf>,
    /// The process's PID in its own namespace (names its stats files).
    pub namespace_pid: Option<u32>,
}

/// Maps host PIDs to owners.
pub trait OwnerLookup {
    /// The owner of `pid`; `None` for a process of no pod.
    fn owner_of(&self, pid: u32) -> Option<ProcessOwner>;
    /// False when `pid` has exited since NVML listed it.
    fn is_running(&self, pid: u32) -> bool;
}

/// A pod's stats file the agent skipped: reported once as an event on the
/// pod, so its owner learns why its counters are missing.
#[derive(Clone, Debug, PartialEq)]
pub struct BadStatsFile {
    /// The pod.
    pub owner: Owner,
    /// The file's name in the pod's stats folder.
    pub file: String,
    /// Why it was skipped.
    pub error: String,
}

/// The agent's state across readings.
#[derive(Debug, Default)]
pub struct StatusBuilder {
    /// `nvml` or `simulated`.
    pub mode: String,
    /// Bytes a bare CUDA context takes, per GPU UUID.
    pub context_overhead: HashMap<String, u64>,
    /// Last probe per GPU UUID.
    pub probes: HashMap<String, ProbeStatus>,
    /// OOM reports, most recent last.
    pub oom_reports: Vec<OomReport>,
    /// Stats files skipped as hostile or broken since the caller last took
    /// them, each path once for the agent's life.
    pub bad_files: Vec<BadStatsFile>,
    bad_seen: std::collections::HashSet<std::path::PathBuf>,
    /// What keeps the agent from measuring or probing (CUDA missing): the
    /// agent's health is then at least Degraded, with this in its message.
    pub problem: Option<String>,
    peaks: HashMap<(String, u32), u64>,
    /// Peaks of the status an earlier run of the agent wrote, per (GPU
    /// UUID, PID), with the process's pod UID: taken over at the first
    /// reading by a process that still runs for the same pod.
    resumed: HashMap<(String, u32), (u64, Option<String>)>,
}

impl StatusBuilder {
    /// A builder for `mode`.
    pub fn new(mode: &str) -> Self {
        Self {
            mode: mode.into(),
            ..Self::default()
        }
    }

    /// Carries over what an earlier run of the agent wrote (it restarted):
    /// the OOM reports, and each process's peak, so that a peak stays "since
    /// the pod started" and not "since the agent did".
    pub fn resume(&mut self, previous: &GpuNodeStatus) {
        self.oom_reports = previous.oom_reports.clone();
        self.resumed = previous
            .gpus
            .iter()
            .flat_map(|gpu| {
                gpu.processes
                    .iter()
                    .map(|p| ((gpu.uuid.clone(), p.pid), (p.peak_bytes, p.pod_uid.clone())))
            })
            .collect();
    }

    /// Records that the watchdog stopped a pod.
    pub fn record_stop(&mut self, order: &StopOrder, time: String) {
        self.oom_reports.push(OomReport {
            pod_namespace: order.owner.namespace.clone(),
            pod_name: order.owner.name.clone(),
            used_bytes: order.used_bytes,
            budget_bytes: order.budget_bytes,
            time,
            pod_uid: Some(order.owner.uid.clone()),
            reason: Some(order.reason.clone()),
        });
        let excess = self.oom_reports.len().saturating_sub(MAX_OOM_REPORTS);
        self.oom_reports.drain(..excess);
    }

    /// The status for `reading` and what each pod uses per GPU. `now_ms` is
    /// wall time (Unix ms) for the age of stats files; `heartbeat` the RFC
    /// 3339 time stamped on the status.
    pub fn build(
        &mut self,
        reading: &Reading,
        owners: &dyn OwnerLookup,
        now_ms: i64,
        heartbeat: String,
    ) -> (GpuNodeStatus, Vec<PodGpuUsage>) {
        let mut live = HashSet::new();
        let mut usage: BTreeMap<(Owner, String), PodGpuUsage> = BTreeMap::new();
        // The CUDA ordinal a process sees for a GPU: its rank among the
        // process's GPUs in NVML index order (docs/node-protocol.md).
        let mut gpus_of_pid: HashMap<u32, Vec<u32>> = HashMap::new();
        for gpu in &reading.gpus {
            for p in &gpu.processes {
                gpus_of_pid.entry(p.pid).or_default().push(gpu.index);
            }
        }
        let mut owner_cache: HashMap<u32, Option<ProcessOwner>> = HashMap::new();
        let mut devices = Vec::new();
        for gpu in &reading.gpus {
            let mut processes = Vec::new();
            for sample in &gpu.processes {
                if !owners.is_running(sample.pid) {
                    continue;
                }
                let key = (gpu.uuid.clone(), sample.pid);
                let owner = owner_cache
                    .entry(sample.pid)
                    .or_insert_with(|| owners.owner_of(sample.pid))
                    .clone();
                let pod_uid = owner
                    .as_ref()
                    .filter(|o| !o.owner.namespace.is_empty())
                    .map(|o| o.owner.uid.clone());
                let peak = self.peaks.entry(key.clone()).or_insert_with(|| {
                    // A PID the earlier run saw, still in the same pod (or
                    // still in none): the same process.
                    match self.resumed.get(&key) {
                        Some((peak, uid)) if *uid == pod_uid => *peak,
                        _ => 0,
                    }
                });
                *peak = (*peak).max(sample.used_bytes);
                let peak = *peak;
                live.insert(key);
                let mut process = GpuProcess {
                    pid: sample.pid,
                    used_bytes: sample.used_bytes,
                    peak_bytes: peak,
                    pod_namespace: None,
                    pod_name: None,
                    training_job: None,
                    pod_uid: None,
                    container: None,
                    allocator: None,
                    shape: None,
                };
                if let Some(owner) = owner {
                    if !owner.owner.namespace.is_empty() {
                        process.pod_namespace = Some(owner.owner.namespace.clone());
                        process.pod_name = Some(owner.owner.name.clone());
                        process.pod_uid = Some(owner.owner.uid.clone());
                    }
                    process.training_job = owner.training_job.clone();
                    process.container = owner.container.clone();
                    if let (Some(dir), Some(nspid)) = (&owner.stats_dir, owner.namespace_pid) {
                        let ordinal = gpus_of_pid[&sample.pid]
                            .iter()
                            .position(|i| *i == gpu.index)
                            .unwrap_or(0) as u32;
                        let mut bad = Vec::new();
                        process.allocator = read_allocator(dir, nspid, ordinal, now_ms, &mut bad);
                        process.shape = read_shape(dir, nspid, &mut bad);
                        for (path, error) in bad {
                            if self.bad_seen.insert(path.clone()) {
                                self.bad_files.push(BadStatsFile {
                                    owner: owner.owner.clone(),
                                    file: path
                                        .file_name()
                                        .map(|n| n.to_string_lossy().into_owned())
                                        .unwrap_or_default(),
                                    error,
                                });
                            }
                        }
                    }
                    let entry = usage
                        .entry((owner.owner.clone(), gpu.uuid.clone()))
                        .or_insert_with(|| PodGpuUsage {
                            owner: owner.owner.clone(),
                            gpu: gpu.uuid.clone(),
                            budget_bytes: owner.budget_bytes,
                            given: owner
                                .gpus
                                .as_ref()
                                .is_none_or(|given| given.contains(&gpu.uuid)),
                            used_bytes: 0,
                            pids: Vec::new(),
                        });
                    entry.used_bytes += sample.used_bytes;
                    entry.pids.push(sample.pid);
                }
                processes.push(process);
            }
            let probe = self.probes.get(&gpu.uuid).cloned();
            let probe_health = match &probe {
                Some(p) if p.errors > 0 => GpuHealth::Faulty,
                Some(p) if !p.ok => GpuHealth::Degraded,
                _ => GpuHealth::Healthy,
            };
            devices.push(GpuDevice {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                model: gpu.model.clone(),
                total_bytes: gpu.total_bytes,
                used_bytes: gpu.used_bytes,
                context_overhead_bytes: self.context_overhead.get(&gpu.uuid).copied().unwrap_or(0),
                processes,
                health: worse(gpu.health, probe_health),
                probe,
            });
        }
        // Peaks are per process lifetime: forget processes that left.
        self.peaks.retain(|key, _| live.contains(key));
        // Only processes alive at the restart take an earlier peak over.
        self.resumed.clear();
        let status = GpuNodeStatus {
            gpu_count: devices.len() as u32,
            model: devices.first().map(|d| d.model.clone()),
            gpus: devices,
            heartbeat: Some(heartbeat),
            oom_reports: self.oom_reports.clone(),
            agent: Some(AgentInfo {
                version: env!("CARGO_PKG_VERSION").into(),
                mode: self.mode.clone(),
                health: match self.problem {
                    Some(_) => worse(reading.health, GpuHealth::Degraded),
                    None => reading.health,
                },
                message: match (&reading.message, &self.problem) {
                    (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                    (a, b) => a.clone().or_else(|| b.clone()),
                },
            }),
            // The controller's; never part of what the agent applies.
            allocation: None,
        };
        (status, usage.into_values().collect())
    }
}

fn worse(a: GpuHealth, b: GpuHealth) -> GpuHealth {
    let rank = |h: GpuHealth| match h {
        GpuHealth::Healthy => 0,
        GpuHealth::Degraded => 1,
        GpuHealth::Faulty => 2,
    };
    if rank(a) >= rank(b) { a } else { b }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
