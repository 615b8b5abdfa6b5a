//! Whether a new status is worth a write to the API server.
//!
//! Most readings differ from the last written status by a few bytes: writing
//! each would make a thousand agents a steady load on the API server. A status
//! is written when something a reader acts on changed (a process came or went,
//! health, a probe, an OOM report, the batch shape), when a byte figure moved
//! by more than a threshold, or when the heartbeat is due.

use std::time::{Duration, Instant};

use vramfit::api::{AllocatorStats, GpuDevice, GpuNodeStatus, GpuProcess};

/// When to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishPolicy {
    /// A byte figure must move by more than this to count as a change.
    pub threshold_bytes: u64,
    /// Longest time between two writes.
    pub heartbeat: Duration,
}

impl Default for PublishPolicy {
    fn default() -> Self {
        Self {
            threshold_bytes: 64 << 20,
            heartbeat: Duration::from_secs(10),
        }
    }
}

/// Why a status is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishReason {
    /// Nothing was written yet.
    First,
    /// Something changed beyond the threshold.
    Changed,
    /// The heartbeat is due.
    Heartbeat,
}

/// The decision for `current`, given the status last written and when.
pub fn publish_reason(
    policy: &PublishPolicy,
    last: Option<(&GpuNodeStatus, Instant)>,
    current: &GpuNodeStatus,
    now: Instant,
) -> Option<PublishReason> {
    let Some((previous, at)) = last else {
        return Some(PublishReason::First);
    };
    if differs(previous, current, policy.threshold_bytes) {
        Some(PublishReason::Changed)
    } else if now.saturating_duration_since(at) >= policy.heartbeat {
        Some(PublishReason::Heartbeat)
    } else {
        None
    }
}

/// True when `b` differs from `a` in anything but the heartbeat and byte
/// figures that moved by at most `threshold`.
pub fn differs(a: &GpuNodeStatus, b: &GpuNodeStatus, threshold: u64) -> bool {
    a.gpu_count != b.gpu_count
        || a.model != b.model
        || a.oom_reports != b.oom_reports
        || a.agent != b.agent
        || a.gpus.len() != b.gpus.len()
        || a.gpus
            .iter()
            .zip(&b.gpus)
            .any(|(x, y)| gpu_differs(x, y, threshold))
}

fn moved(a: u64, b: u64, threshold: u64) -> bool {
    a.abs_diff(b) > threshold
}

fn gpu_differs(a: &GpuDevice, b: &GpuDevice, threshold: u64) -> bool {
    a.index != b.index
        || a.uuid != b.uuid
        || a.model != b.model
        || a.total_bytes != b.total_bytes
        || a.context_overhead_bytes != b.context_overhead_bytes
        || a.health != b.health
        || a.probe != b.probe
        || moved(a.used_bytes, b.used_bytes, threshold)
        || a.processes.len() != b.processes.len()
        || a.processes
            .iter()
            .zip(&b.processes)
            .any(|(x, y)| process_differs(x, y, threshold))
}

fn process_differs(a: &GpuProcess, b: &GpuProcess, threshold: u64) -> bool {
    a.pid != b.pid
        || a.pod_namespace != b.pod_namespace
        || a.pod_name != b.pod_name
        || a.pod_uid != b.pod_uid
        || a.container != b.container
        || a.training_job != b.training_job
        || a.shape != b.shape
        || moved(a.used_bytes, b.used_bytes, threshold)
        || moved(a.peak_bytes, b.peak_bytes, threshold)
        || match (&a.allocator, &b.allocator) {
            (Some(x), Some(y)) => allocator_differs(x, y, threshold),
            (x, y) => x.is_some() != y.is_some(),
        }
}

fn allocator_differs(a: &AllocatorStats, b: &AllocatorStats, threshold: u64) -> bool {
    a.policy != b.policy
        || a.budget_bytes != b.budget_bytes
        || a.num_ooms != b.num_ooms
        || moved(a.allocated_bytes, b.allocated_bytes, threshold)
        || moved(a.reserved_bytes, b.reserved_bytes, threshold)
        || moved(a.peak_allocated_bytes, b.peak_allocated_bytes, threshold)
        || moved(a.peak_reserved_bytes, b.peak_reserved_bytes, threshold)
}

#[cfg(test)]
mod tests {
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
    fn writes_follow_changes_thresholds_and_the_heartbeat() {
        let policy = PublishPolicy {
            threshold_bytes: 64 * MIB,
            heartbeat: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let base = status();
        let soon = t0 + Duration::from_secs(1);
        let late = t0 + Duration::from_secs(10);
        type Edit = fn(&mut GpuNodeStatus);
        let cases: [(&str, Edit, Option<PublishReason>, Option<PublishReason>); 9] = [
            ("nothing", |_| {}, None, Some(PublishReason::Heartbeat)),
            (
                "heartbeat text only",
                |s| s.heartbeat = Some("2026-12-01T00:00:09Z".into()),
                None,
                Some(PublishReason::Heartbeat),
            ),
            (
                "used moved below the threshold",
                |s| s.gpus[0].processes[0].used_bytes += 60 * MIB,
                None,
                Some(PublishReason::Heartbeat),
            ),
            (
                "used moved beyond the threshold",
                |s| s.gpus[0].processes[0].used_bytes += 65 * MIB,
                Some(PublishReason::Changed),
                Some(PublishReason::Changed),
            ),
            (
                "peak moved beyond the threshold",
                |s| s.gpus[0].processes[0].peak_bytes += 100 * MIB,
                Some(PublishReason::Changed),
                Some(PublishReason::Changed),
            ),
            (
                "a process left",
                |s| s.gpus[0].processes.clear(),
                Some(PublishReason::Changed),
                Some(PublishReason::Changed),
            ),
            (
                "health",
                |s| s.gpus[0].health = GpuHealth::Faulty,
                Some(PublishReason::Changed),
                Some(PublishReason::Changed),
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
                Some(PublishReason::Changed),
                Some(PublishReason::Changed),
            ),
            (
                "a probe",
                |s| s.gpus[0].probe = Some(ProbeStatus::default()),
                Some(PublishReason::Changed),
                Some(PublishReason::Changed),
            ),
        ];
        for (what, edit, at_once, after_heartbeat) in cases {
            let mut current = base.clone();
            edit(&mut current);
            assert_eq!(
                publish_reason(&policy, Some((&base, t0)), &current, soon),
                at_once,
                "{what}, 1 s later"
            );
            assert_eq!(
                publish_reason(&policy, Some((&base, t0)), &current, late),
                after_heartbeat,
                "{what}, 10 s later"
            );
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
        assert!(!differs(&base, &small, 64 * MIB));
        let mut oom = base.clone();
        oom.gpus[0].processes[0]
            .allocator
            .as_mut()
            .unwrap()
            .num_ooms = 1;
        assert!(differs(&base, &oom, 64 * MIB));
        let mut gone = base.clone();
        gone.gpus[0].processes[0].allocator = None;
        assert!(differs(&base, &gone, 64 * MIB));
    }
}
