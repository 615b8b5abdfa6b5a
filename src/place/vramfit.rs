//! vramfit's policy: fragmentation gradient descent with a richer measure,
//! a learned target workload and a price on CPU.
//!
//! The score of a candidate (lower is better) is
//!
//! ```text
//! Δ(fragmentation + stranding) + CPU_PRICE * cpu_request * free_gpu / free_cpu
//! ```
//!
//! with best-fit as the tie-breaker, where:
//!
//! - *fragmentation* is FGD's measure (see [`super::fragmentation`]): free
//!   GPU a task type cannot use because it does not fit or the GPU is too full;
//! - *stranding* ([`super::fragmentation::task_stranding`]) also counts what
//!   a stream of tasks of a type could not use: the tail of a GPU too small
//!   for another copy (600 free, 460-unit tasks: 140 stranded) and GPUs whose
//!   node runs out of CPU or memory before they fill (3 free GPUs, CPU for one
//!   more task: 2 stranded). FGD only asks whether one more task fits;
//! - the CPU price charges a job for the CPU it takes, in GPU units: a node's
//!   free GPU per free millicore is how much GPU capacity each millicore
//!   guards there. CPU-heavy and CPU-only jobs drift to nodes with CPU to
//!   spare, which keeps the CPU-poor nodes' GPUs usable. On the openb traces,
//!   where 1.3x the GPU demand brings about as much CPU demand as the cluster
//!   has, this is what closes the gap on CPU-bound nodes;
//! - the target workload is learned online from arriving jobs (an
//!   exponentially decayed histogram, half-life [`HALF_LIFE_ARRIVALS`]), not
//!   given: a controller does not know the future mix, and the learned one
//!   scores within noise of the true trace distribution;
//! - ties fall to best-fit (least room left), which packs rather than spreads.
//!
//! Tried and dropped (mean over seeds 42..51, allocation at 130%): weighting
//! task types by GPU size instead of count (-0.3 to -0.5 points), a memory
//! price like the CPU price (no gain), random tie-breaking (no gain).

use super::fragmentation::{TargetWorkload, WorkloadModel, measure_node};
use super::policy::Score;
use super::state::{Demand, GpuSet, NodeState, NodeView};

/// Arrivals after which an observed job counts half: long enough to smooth
/// noise, short enough to follow a mix that changes over a day.
pub(crate) const HALF_LIFE_ARRIVALS: f64 = 4096.0;

/// Arrivals between looks at whether the learned mix moved.
const REFRESH_EVERY: u64 = 32;

/// Total-variation distance the learned mix must move before the target is
/// republished; each republication invalidates every cached score.
const REPUBLISH_TOLERANCE: f64 = 0.05;

/// GPU units charged per (millicore x free GPU units per free millicore).
const CPU_PRICE: f64 = 0.5;

/// The learned target workload vramfit measures fragmentation against.
pub(crate) fn workload_model() -> WorkloadModel {
    WorkloadModel::new(HALF_LIFE_ARRIVALS, REFRESH_EVERY).with_tolerance(REPUBLISH_TOLERANCE)
}

/// The node measure vramfit descends: fragmentation plus stranding.
pub(crate) fn measure(view: &NodeView, target: &TargetWorkload) -> f64 {
    let m = measure_node(view, target);
    m.fragmentation + m.stranding
}

/// vramfit's score of placing `demand` on `gpus` of `node`, given the growth
/// of [`measure`] it causes; lower is better.
pub(crate) fn score(node: &NodeState, demand: &Demand, gpus: GpuSet, measure_growth: f64) -> Score {
    // A job that takes no CPU costs nothing (0 times the rate).
    let cpu_cost = CPU_PRICE * demand.cpu as f64 * node.view().gpu_room_total() as f64
        / node.cpu_free.max(1) as f64;
    [
        measure_growth + cpu_cost,
        super::best_fit::score(node, demand, gpus)[0],
    ]
}
