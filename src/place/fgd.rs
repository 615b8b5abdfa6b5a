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

use super::policy::Score;

/// FGD's score from the growth of the node's expected fragmentation that the
/// candidate causes; lower is better, no second criterion.
pub(crate) fn score(fragmentation_growth: f64) -> Score {
    [fragmentation_growth, 0.0]
}
