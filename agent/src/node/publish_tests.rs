use super::*;
use vramfit::api::{AgentInfo, GpuHealth, OomReport, ProbeStatus};

const MIB: u64 = 1 << 20;

fn status() -> GpuNodeStatus {
    GpuNodeStatus {
        gpus: vec![GpuDevice {
            index: 0,
            uuid: "GPU-0".into(),
            model: "H200".into(),
            total_bytes: 141 << 30,
            used_bytes: 10 << 30,
            context_overhead_bytes: 500 * MIB,
            processes: vec![GpuProcess {
                pid: 7,
                used_bytes: 10 << 30,
                peak_bytes: 10 << 30,
                pod_namespace: Some("ml".into()),
                pod_name: Some("a-a1".into()),
                training_job: None,
                pod_uid: None,
                container: None,
                allocator: Some(AllocatorStats {
                    policy: "vramfit".into(),
                    reserved_bytes: 9 << 30,
                    ..Default::default()
                }),
                shape: None,
            }],
            health: GpuHealth::Healthy,
            probe: None,
        }],
        gpu_count: 1,
        model: Some("H200".into()),
        heartbeat: Some("2026-12-01T00:00:00Z".into()),
        oom_reports: vec![],
        agent: Some(AgentInfo::default()),
        allocation: None,
    }
}

#[test]
fn writes_follow_changes_thresholds_the_gap_and_the_heartbeat() {
    use PublishReason::{Changed, Heartbeat, Moved};
    let policy = PublishPolicy {
        threshold_bytes: 64 * MIB,
        min_gap: Duration::from_secs(5),
        heartbeat: Duration::from_secs(10),
    };
    let t0 = Instant::now();
    let base = status();
    type Edit = fn(&mut GpuNodeStatus);
    // (what, edit, reason 1 s / 6 s / 10 s after the last write)
    let cases: [(&str, Edit, [Option<PublishReason>; 3]); 9] = [
        ("nothing", |_| {}, [None, None, Some(Heartbeat)]),
        (
            "heartbeat text only",
            |s| s.heartbeat = Some("2026-12-01T00:00:09Z".into()),
            [None, None, Some(Heartbeat)],
        ),
        (
            "used moved below the threshold",
            |s| s.gpus[0].processes[0].used_bytes += 60 * MIB,
            [None, None, Some(Heartbeat)],
        ),
        (
            "used moved beyond the threshold",
            |s| s.gpus[0].processes[0].used_bytes += 65 * MIB,
            [None, Some(Moved), Some(Moved)],
        ),
        (
            "peak moved beyond the threshold",
            |s| s.gpus[0].processes[0].peak_bytes += 100 * MIB,
            [None, Some(Moved), Some(Moved)],
        ),
        (
            "a process left",
            |s| s.gpus[0].processes.clear(),
            [Some(Changed); 3],
        ),
        (
            "health",
            |s| s.gpus[0].health = GpuHealth::Faulty,
            [Some(Changed); 3],
        ),
        (
            "an OOM report",
            |s| {
                s.oom_reports.push(OomReport {
                    pod_namespace: "ml".into(),
                    pod_name: "a-a1".into(),
                    used_bytes: 1,
                    budget_bytes: 1,
                    time: "t".into(),
                    pod_uid: None,
                    reason: None,
                })
            },
            [Some(Changed); 3],
        ),
        (
            "a probe",
            |s| s.gpus[0].probe = Some(ProbeStatus::default()),
            [Some(Changed); 3],
        ),
    ];
    for (what, edit, want) in cases {
        let mut current = base.clone();
        edit(&mut current);
        for (after, want) in [1, 6, 10].into_iter().zip(want) {
            assert_eq!(
                publish_reason(
                    &policy,
                    Some((&base, t0)),
                    &current,
                    t0 + Duration::from_secs(after)
                ),
                want,
                "{what}, {after} s later"
            );
        }
    }
    assert_eq!(
        publish_reason(&policy, None, &base, t0),
        Some(PublishReason::First)
    );
}

#[test]
fn allocator_counters_count_like_other_byte_figures() {
    let base = status();
    let mut small = base.clone();
    small.gpus[0].processes[0]
        .allocator
        .as_mut()
        .unwrap()
        .reserved_bytes += MIB;
    assert_eq!(change(&base, &small, 64 * MIB), Change::None);
    let mut large = base.clone();
    large.gpus[0].processes[0]
        .allocator
        .as_mut()
        .unwrap()
        .reserved_bytes += 100 * MIB;
    assert_eq!(change(&base, &large, 64 * MIB), Change::Bytes);
    let mut oom = base.clone();
    oom.gpus[0].processes[0]
        .allocator
        .as_mut()
        .unwrap()
        .num_ooms = 1;
    assert_eq!(change(&base, &oom, 64 * MIB), Change::Structure);
    let mut gone = base.clone();
    gone.gpus[0].processes[0].allocator = None;
    assert_eq!(change(&base, &gone, 64 * MIB), Change::Structure);
}

#[test]
fn a_training_s_moving_step_count_rides_the_next_write() {
    use vramfit::api::{ObservedShape, ReportedProgress};
    let with = |progress: Option<ReportedProgress>, micro: u32| {
        let mut s = status();
        s.gpus[0].processes[0].shape = Some(ObservedShape {
            micro_batch: micro,
            grad_accum: 1,
            absorbed_ooms: vec![],
            progress,
        });
        s
    };
    let report = |steps: u64, total: Option<u64>| ReportedProgress {
        steps,
        total_steps: total,
        seconds_per_step: Some(0.5 + steps as f64 / 1000.0),
        time: format!("2026-12-01T00:00:{:02}Z", steps % 60),
    };
    let base = with(Some(report(10, Some(1000))), 8);
    // (what, the new status, the change)
    let cases = [
        (
            "steps and step time moved",
            with(Some(report(20, Some(1000))), 8),
            Change::None,
        ),
        (
            "the total changed",
            with(Some(report(20, Some(2000))), 8),
            Change::Structure,
        ),
        (
            "the total became known",
            with(Some(report(20, None)), 8),
            Change::Structure,
        ),
        ("the progress went away", with(None, 8), Change::Structure),
        (
            "the micro-batch changed",
            with(Some(report(10, Some(1000))), 4),
            Change::Structure,
        ),
        ("the shape went away", status(), Change::Structure),
    ];
    for (what, next, want) in cases {
        assert_eq!(change(&base, &next, 64 * MIB), want, "{what}");
    }
    assert_eq!(
        change(&with(None, 8), &base, 64 * MIB),
        Change::Structure,
        "first progress"
    );
}
