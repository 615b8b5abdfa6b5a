//! Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation:
//! Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
//! USENIX ATC 2023), as the paper defines it.
//!
//! For every feasible node and GPU choice, FGD computes how much the node's
//! expected fragmentation (see [`super::fragmentation`]) grows if the task is
//! placed there, and takes the choice where it grows least: a step along the
//! steepest descent of cluster-wide fragmentation, since the other nodes do
//! not change. Equal scores are broken uniformly at random, as the Kubernetes
//! scheduler framework the paper builds on does.

use super::fragmentation::{TargetWorkload, measure_node};
use super::policy::Score;
use super::state::{Demand, GpuSet, NodeState};

/// FGD's score: growth of the node's expected fragmentation; lower is better.
pub(crate) fn score(
    node: &NodeState,
    demand: &Demand,
    gpus: GpuSet,
    target: &TargetWorkload,
    measure_now: f64,
    scratch: &mut Vec<u64>,
) -> Score {
    let after = node.view_after(demand, gpus, scratch);
    [measure_node(&after, target).fragmentation - measure_now, 0.0]
}
