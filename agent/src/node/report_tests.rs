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
        gpus: None,
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
        r#"{"version":1,"pid":1,"microBatch":4,"gradAccum":16,
            "progress":{"steps":30,"totalSteps":300,"secondsPerStep":2.0,"unixMs":1000}}"#,
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
    let progress = process.shape.as_ref().unwrap().progress.as_ref().unwrap();
    assert_eq!(
        (
            progress.steps,
            progress.total_steps,
            progress.seconds_per_step
        ),
        (30, Some(300), Some(2.0))
    );
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

/// A pod's use of a GPU is `given` only when its placement names that GPU;
/// with no placement known (local mode) every GPU counts against the budget.
#[test]
fn usage_on_a_gpu_the_placement_does_not_name_is_not_given() {
    let mut elsewhere = pod("a-a1", 20 * GIB, None);
    elsewhere.gpus = Some(vec!["GPU-7".into()]);
    let mut here = pod("b-a1", 20 * GIB, None);
    here.gpus = Some(vec!["GPU-0".into()]);
    let owners = Owners {
        pods: HashMap::from([
            (10, elsewhere),
            (11, here),
            (12, pod("c-a1", 20 * GIB, None)),
        ]),
        exited: HashSet::new(),
    };
    let (_, usage) = StatusBuilder::new("nvml").build(
        &reading(&[(10, GIB), (11, GIB), (12, GIB)]),
        &owners,
        0,
        "t".into(),
    );
    let given: Vec<(&str, bool)> = usage
        .iter()
        .map(|u| (u.owner.name.as_str(), u.given))
        .collect();
    assert_eq!(given, [("a-a1", false), ("b-a1", true), ("c-a1", true)]);
}

/// A hostile stats file is handed over once, with the pod it belongs to,
/// for the event on that pod; later readings skip it silently.
#[test]
fn a_bad_stats_file_is_reported_once_with_its_pod() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("shape-1.json")).unwrap();
    let owners = Owners {
        pods: HashMap::from([(10, pod("a-a1", 20 * GIB, Some(dir.path().into())))]),
        exited: HashSet::new(),
    };
    let mut builder = StatusBuilder::new("nvml");
    builder.build(&reading(&[(10, GIB)]), &owners, 2000, "t".into());
    let bad = std::mem::take(&mut builder.bad_files);
    assert_eq!(
        bad,
        [BadStatsFile {
            owner: owners.pods[&10].owner.clone(),
            file: "shape-1.json".into(),
            error: "not a regular file".into(),
        }]
    );
    builder.build(&reading(&[(10, GIB)]), &owners, 3000, "t".into());
    assert!(builder.bad_files.is_empty(), "once per file");
}
