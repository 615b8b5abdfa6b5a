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
                        process.allocator = read_allocator(dir, nspid, ordinal, now_ms);
                        process.shape = read_shape(dir, nspid);
                    }
                    let entry = usage
                        .entry((owner.owner.clone(), gpu.uuid.clone()))
                        .or_insert_with(|| PodGpuUsage {
                            owner: owner.owner.clone(),
                            gpu: gpu.uuid.clone(),
                            budget_bytes: owner.budget_bytes,
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
mod tests {
    use super::*;
    use crate::gpu::{GpuReading, ProcessSample};

    const GIB: u64 = 1 << 30;

    struct Owners {
        pods: HashMap<u32, ProcessOwner>,
        exited: HashSet<u32>,
    }

    impl OwnerLookup for Owners {
        fn owner_of(&self, pid: u32) -> Option<ProcessOwner> {
            self.pods.get(&pid).cloned()
        }
        fn is_running(&self, pid: u32) -> bool {
            !self.exited.contains(&pid)
        }
    }

    fn pod(name: &str, budget: u64, stats_dir: Option<PathBuf>) -> ProcessOwner {
        ProcessOwner {
            owner: Owner {
                uid: format!("uid-{name}"),
                namespace: "ml".into(),
                name: name.into(),
            },
            training_job: Some(name.trim_end_matches("-a1").into()),
            container: Some("train".into()),
            budget_bytes: Some(budget),
            stats_dir,
            namespace_pid: Some(1),
        }
    }

    fn reading(processes: &[(u32, u64)]) -> Reading {
        Reading {
            gpus: vec![GpuReading {
                index: 0,
                uuid: "GPU-0".into(),
                model: "H200".into(),
                total_bytes: 141 * GIB,
                used_bytes: processes.iter().map(|p| p.1).sum(),
                processes: processes
                    .iter()
                    .map(|&(pid, used_bytes)| ProcessSample { pid, used_bytes })
                    .collect(),
                health: GpuHealth::Healthy,
                problem: None,
            }],
            health: GpuHealth::Healthy,
            message: None,
        }
    }

    #[test]
    fn processes_are_mapped_to_pods_and_peaks_kept_per_process() {
        let owners = Owners {
            pods: HashMap::from([
                (10, pod("a-a1", 20 * GIB, None)),
                (11, pod("b-a1", 20 * GIB, None)),
            ]),
            exited: HashSet::new(),
        };
        let mut builder = StatusBuilder::new("nvml");
        builder.context_overhead.insert("GPU-0".into(), 500 << 20);
        builder.build(
            &reading(&[(10, 8 * GIB), (11, 4 * GIB), (99, GIB)]),
            &owners,
            0,
            "t".into(),
        );
        let (status, usage) = builder.build(
            &reading(&[(10, 6 * GIB), (11, 4 * GIB), (99, GIB)]),
            &owners,
            0,
            "t".into(),
        );
        let gpu = &status.gpus[0];
        assert_eq!(gpu.context_overhead_bytes, 500 << 20);
        let a = gpu.processes.iter().find(|p| p.pid == 10).unwrap();
        assert_eq!((a.used_bytes, a.peak_bytes), (6 * GIB, 8 * GIB));
        assert_eq!(a.pod_name.as_deref(), Some("a-a1"));
        assert_eq!(a.training_job.as_deref(), Some("a"));
        assert_eq!(a.container.as_deref(), Some("train"));
        // A process of no pod is reported, without a pod, and not watched.
        let stray = gpu.processes.iter().find(|p| p.pid == 99).unwrap();
        assert_eq!(stray.pod_name, None);
        assert_eq!(usage.len(), 2);
        assert!(usage.iter().all(|u| !u.pids.contains(&99)));
        assert_eq!(status.agent.unwrap().mode, "nvml");
    }

    #[test]
    fn a_process_that_exited_between_reads_is_dropped_with_its_peak() {
        let mut owners = Owners {
            pods: HashMap::from([(10, pod("a-a1", 20 * GIB, None))]),
            exited: HashSet::new(),
        };
        let mut builder = StatusBuilder::new("nvml");
        builder.build(&reading(&[(10, 8 * GIB)]), &owners, 0, "t".into());
        // NVML still lists it, /proc no longer has it.
        owners.exited.insert(10);
        let (status, usage) = builder.build(&reading(&[(10, 8 * GIB)]), &owners, 0, "t".into());
        assert!(status.gpus[0].processes.is_empty());
        assert!(usage.is_empty());
        // A new process that reuses the PID starts with its own peak.
        owners.exited.clear();
        let (status, _) = builder.build(&reading(&[(10, GIB)]), &owners, 0, "t".into());
        assert_eq!(status.gpus[0].processes[0].peak_bytes, GIB);
    }

    #[test]
    fn stats_files_of_the_pod_are_merged_into_its_process() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("alloc-1-0.json"),
            r#"{"version":1,"pid":1,"device":0,"policy":"vramfit","reservedBytes":5,"updatedUnixMs":1000}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("shape-1.json"),
            r#"{"version":1,"pid":1,"microBatch":4,"gradAccum":16}"#,
        )
        .unwrap();
        let owners = Owners {
            pods: HashMap::from([(10, pod("a-a1", 20 * GIB, Some(dir.path().into())))]),
            exited: HashSet::new(),
        };
        let mut builder = StatusBuilder::new("nvml");
        let (status, _) = builder.build(&reading(&[(10, GIB)]), &owners, 2000, "t".into());
        let process = &status.gpus[0].processes[0];
        assert_eq!(process.allocator.as_ref().unwrap().reserved_bytes, 5);
        assert_eq!(process.shape.as_ref().unwrap().micro_batch, 4);
    }

    #[test]
    fn after_a_restart_a_process_of_the_same_pod_keeps_its_peak_and_others_start_afresh() {
        let owners = Owners {
            pods: HashMap::from([
                (10, pod("a-a1", 20 * GIB, None)),
                (11, pod("b-a1", 20 * GIB, None)),
            ]),
            exited: HashSet::new(),
        };
        let mut before = StatusBuilder::new("nvml");
        before.build(
            &reading(&[(10, 9 * GIB), (11, 7 * GIB), (99, 3 * GIB)]),
            &owners,
            0,
            "t".into(),
        );
        let (mut previous, _) = before.build(
            &reading(&[(10, 5 * GIB), (11, 4 * GIB), (99, GIB)]),
            &owners,
            0,
            "t".into(),
        );
        // PID 11 now belongs to another pod (reused).
        previous.gpus[0]
            .processes
            .iter_mut()
            .find(|p| p.pid == 11)
            .unwrap()
            .pod_uid = Some("uid-gone".into());
        previous.oom_reports = vec![OomReport {
            pod_namespace: "ml".into(),
            pod_name: "x".into(),
            used_bytes: 1,
            budget_bytes: 1,
            time: "t".into(),
            pod_uid: None,
            reason: None,
        }];
        let mut after = StatusBuilder::new("nvml");
        after.resume(&previous);
        assert_eq!(after.oom_reports.len(), 1);
        let (status, _) = after.build(
            &reading(&[(10, 5 * GIB), (11, 4 * GIB), (99, GIB)]),
            &owners,
            0,
            "t".into(),
        );
        let peak = |pid| {
            status.gpus[0]
                .processes
                .iter()
                .find(|p| p.pid == pid)
                .unwrap()
                .peak_bytes
        };
        assert_eq!(
            peak(10),
            9 * GIB,
            "same pod: the peak since the pod started"
        );
        assert_eq!(peak(11), 4 * GIB, "another pod: afresh");
        assert_eq!(peak(99), 3 * GIB, "no pod before, no pod now");
        // A process that shows up only later does not take an old peak.
        let (status, _) = after.build(&reading(&[(10, 5 * GIB)]), &owners, 0, "t".into());
        assert_eq!(status.gpus[0].processes[0].peak_bytes, 9 * GIB);
        let (status, _) = after.build(
            &reading(&[(10, 5 * GIB), (99, GIB)]),
            &owners,
            0,
            "t".into(),
        );
        let p99 = status.gpus[0]
            .processes
            .iter()
            .find(|p| p.pid == 99)
            .unwrap();
        assert_eq!(p99.peak_bytes, GIB);
    }

    #[test]
    fn cuda_missing_makes_the_agent_degraded_with_the_reason_but_not_its_gpus() {
        let owners = Owners {
            pods: HashMap::new(),
            exited: HashSet::new(),
        };
        let mut builder = StatusBuilder::new("nvml");
        let (status, _) = builder.build(&reading(&[]), &owners, 0, "t".into());
        assert_eq!(status.agent.as_ref().unwrap().health, GpuHealth::Healthy);
        builder.problem = Some("GPUs not probed: libcuda.so not found".into());
        let (status, _) = builder.build(&reading(&[]), &owners, 0, "t".into());
        let agent = status.agent.unwrap();
        assert_eq!(agent.health, GpuHealth::Degraded);
        assert_eq!(
            agent.message.as_deref(),
            Some("GPUs not probed: libcuda.so not found")
        );
        assert_eq!(status.gpus[0].health, GpuHealth::Healthy);
        // NVML's own trouble stays and comes first; Faulty is not softened.
        let mut bad = reading(&[]);
        bad.health = GpuHealth::Faulty;
        bad.message = Some("NVML unavailable".into());
        let (status, _) = builder.build(&bad, &owners, 0, "t".into());
        let agent = status.agent.unwrap();
        assert_eq!(agent.health, GpuHealth::Faulty);
        assert_eq!(
            agent.message.as_deref(),
            Some("NVML unavailable; GPUs not probed: libcuda.so not found")
        );
    }

    #[test]
    fn a_failed_probe_lowers_the_gpu_health_and_oom_reports_are_capped() {
        let owners = Owners {
            pods: HashMap::new(),
            exited: HashSet::new(),
        };
        let mut builder = StatusBuilder::new("nvml");
        builder.probes.insert(
            "GPU-0".into(),
            ProbeStatus {
                ok: false,
                errors: 3,
                ..Default::default()
            },
        );
        let order = StopOrder {
            owner: pod("a-a1", 1, None).owner,
            gpu: "GPU-0".into(),
            used_bytes: 2,
            budget_bytes: 1,
            pids: vec![10],
            reason: "over".into(),
        };
        for i in 0..MAX_OOM_REPORTS + 5 {
            builder.record_stop(&order, i.to_string());
        }
        let (status, _) = builder.build(&reading(&[]), &owners, 0, "t".into());
        assert_eq!(status.gpus[0].health, GpuHealth::Faulty);
        assert_eq!(status.oom_reports.len(), MAX_OOM_REPORTS);
        assert_eq!(
            status.oom_reports.last().unwrap().time,
            (MAX_OOM_REPORTS + 4).to_string()
        );
        assert_eq!(status.oom_reports[0].pod_uid.as_deref(), Some("uid-a-a1"));
    }
}
