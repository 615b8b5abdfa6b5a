//! Whether a new status is worth a write to the API server.
//!
//! Most readings differ from the last written status by a few bytes: writing
//! each would make a thousand agents a steady load on the API server. A status
//! is written at once when something a reader acts on changed (a process came
//! or went, health, a probe, an OOM report, the batch shape, an allocator OOM
//! count, a training's progress appearing or its total steps); when only byte
//! figures moved by more than a threshold, at most once per minimum gap (a
//! process ramping up would otherwise cost a write per reading); and when the
//! heartbeat is due. A training's step count and step time move with every
//! report: they ride the next write (at the latest the heartbeat's).

use std::time::{Duration, Instant};

use vramfit::api::{AllocatorStats, GpuDevice, GpuNodeStatus, GpuProcess, ObservedShape};

/// When to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishPolicy {
    /// A byte figure must move by more than this to count as a change.
    pub threshold_bytes: u64,
    /// Shortest time between two writes for byte figures alone.
    pub min_gap: Duration,
    /// Longest time between two writes.
    pub heartbeat: Duration,
}

impl Default for PublishPolicy {
    fn default() -> Self {
        Self {
            threshold_bytes: 64 << 20,
            min_gap: Duration::from_secs(5),
            heartbeat: Duration::from_secs(10),
        }
    }
}

/// How a status differs from the last one written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Only within the threshold (or the heartbeat text).
    None,
    /// Byte figures moved beyond the threshold; nothing else changed.
    Bytes,
    /// Something besides byte figures changed.
    Structure,
}

/// Why a status is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishReason {
    /// Nothing was written yet.
    First,
    /// Something besides byte figures changed.
    Changed,
    /// Byte figures moved beyond the threshold and the minimum gap passed.
    Moved,
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
    let since = now.saturating_duration_since(at);
    match change(previous, current, policy.threshold_bytes) {
        Change::Structure => Some(PublishReason::Changed),
        Change::Bytes if since >= policy.min_gap => Some(PublishReason::Moved),
        _ if since >= policy.heartbeat => Some(PublishReason::Heartbeat),
        _ => None,
    }
}

/// How `b` differs from `a`, the heartbeat aside.
pub fn change(a: &GpuNodeStatus, b: &GpuNodeStatus, threshold: u64) -> Change {
    let structure = a.gpu_count != b.gpu_count
        || a.model != b.model
        || a.oom_reports != b.oom_reports
        || a.agent != b.agent
        || a.gpus.len() != b.gpus.len()
        || a.gpus
            .iter()
            .zip(&b.gpus)
            .any(|(x, y)| gpu_structure_differs(x, y));
    if structure {
        return Change::Structure;
    }
    let moved = a
        .gpus
        .iter()
        .zip(&b.gpus)
        .any(|(x, y)| gpu_bytes_moved(x, y, threshold));
    if moved { Change::Bytes } else { Change::None }
}

fn moved(a: u64, b: u64, threshold: u64) -> bool {
    a.abs_diff(b) > threshold
}

fn gpu_structure_differs(a: &GpuDevice, b: &GpuDevice) -> bool {
    a.index != b.index
        || a.uuid != b.uuid
        || a.model != b.model
        || a.total_bytes != b.total_bytes
        || a.context_overhead_bytes != b.context_overhead_bytes
        || a.health != b.health
        || a.probe != b.probe
        || a.processes.len() != b.processes.len()
        || a.processes
            .iter()
            .zip(&b.processes)
            .any(|(x, y)| process_structure_differs(x, y))
}

fn process_structure_differs(a: &GpuProcess, b: &GpuProcess) -> bool {
    a.pid != b.pid
        || a.pod_namespace != b.pod_namespace
        || a.pod_name != b.pod_name
        || a.pod_uid != b.pod_uid
        || a.container != b.container
        || a.training_job != b.training_job
        || match (&a.shape, &b.shape) {
            (Some(x), Some(y)) => shape_structure_differs(x, y),
            (x, y) => x.is_some() != y.is_some(),
        }
        || match (&a.allocator, &b.allocator) {
            (Some(x), Some(y)) => {
                x.policy != y.policy || x.budget_bytes != y.budget_bytes || x.num_ooms != y.num_ooms
            }
            (x, y) => x.is_some() != y.is_some(),
        }
}

/// The shape, its absorbed OOMs, whether there is a progress and its total:
/// not the steps done or the step time.
fn shape_structure_differs(a: &ObservedShape, b: &ObservedShape) -> bool {
    a.micro_batch != b.micro_batch
        || a.grad_accum != b.grad_accum
        || a.absorbed_ooms != b.absorbed_ooms
        || a.progress.as_ref().map(|p| p.total_steps) != b.progress.as_ref().map(|p| p.total_steps)
}

fn gpu_bytes_moved(a: &GpuDevice, b: &GpuDevice, threshold: u64) -> bool {
    moved(a.used_bytes, b.used_bytes, threshold)
        || a.processes.iter().zip(&b.processes).any(|(x, y)| {
            moved(x.used_bytes, y.used_bytes, threshold)
                || moved(x.peak_bytes, y.peak_bytes, threshold)
                || match (&x.allocator, &y.allocator) {
                    (Some(p), Some(q)) => allocator_bytes_moved(p, q, threshold),
                    _ => false,
                }
        })
}

fn allocator_bytes_moved(a: &AllocatorStats, b: &AllocatorStats, threshold: u64) -> bool {
    moved(a.allocated_bytes, b.allocated_bytes, threshold)
        || moved(a.reserved_bytes, b.reserved_bytes, threshold)
        || moved(a.peak_allocated_bytes, b.peak_allocated_bytes, threshold)
        || moved(a.peak_reserved_bytes, b.peak_reserved_bytes, threshold)
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod tests;
