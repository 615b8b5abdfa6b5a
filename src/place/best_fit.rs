//! Best-fit: put the job where the least room is left afterwards.
//!
//! The classic bin-packing rule, over all three dimensions: the score is the
//! sum of the node's GPU, CPU and memory fractions left after the placement
//! (a dimension the node lacks counts as used up). Inside the node it takes
//! the GPU with the least room (memory, and compute where the job's counts)
//! that still fits. It packs tightly but is blind
//! to what the leftovers are good for, which is the gap FGD closes.

use super::inventory::COMPUTE_WHOLE;
use super::policy::{Score, left_fraction};
use super::state::{Demand, GpuSet, NodeState};

/// Best-fit score of placing `demand` on `gpus` of `node`; lower is better.
pub(crate) fn score(node: &NodeState, demand: &Demand, gpus: GpuSet) -> Score {
    let gpu_left = node.gpu_free.iter().sum::<u64>() - demand.gpu_units();
    let primary = left_fraction(gpu_left, node.gpu_capacity_total())
        + left_fraction(node.cpu_free - demand.cpu, node.cpu_total)
        + left_fraction(node.mem_free - demand.mem, node.mem_total);
    [primary, chosen_gpu_room_left(node, demand, gpus)]
}

/// Room left on the chosen GPUs after the placement, as a fraction of their
/// capacity, plus the compute left on them when the job's compute counts:
/// the tighter, the better the GPU-level fit.
pub(crate) fn chosen_gpu_room_left(node: &NodeState, demand: &Demand, gpus: GpuSet) -> f64 {
    (0..node.gpu_free.len())
        .filter(|g| gpus & (1 << g) != 0)
        .map(|g| {
            let memory = left_fraction(node.gpu_free[g] - demand.per_gpu, node.gpu_capacity[g]);
            // The job takes the same compute on every candidate, so what the
            // GPU has now orders them as what it would have left does.
            let compute = if demand.compute > 0 {
                left_fraction(node.gpu_compute_free[g], COMPUTE_WHOLE)
            } else {
                0.0
            };
            memory + compute
        })
        .sum()
}
