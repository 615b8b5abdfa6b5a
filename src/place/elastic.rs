//! Memory-elastic placement: a job whose preferred shape fits nowhere now may
//! start at once with a smaller micro-batch (more gradient accumulation, the
//! same global batch, so the same maths) in a hole its preferred shape does
//! not fit, when finishing slower but now beats waiting for the preferred
//! hole. Pure decisions over plain figures; the caller predicts the budgets,
//! knows the step-time curve and the running jobs' expected ends.

use std::collections::HashMap;

use super::inventory::Placement;
use super::state::ClusterState;

/// One shape a job could run with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Micro-batch per GPU.
    pub micro: u32,
    /// Budget per GPU this shape needs (the GPUs' units).
    pub budget: u64,
    /// Step time relative to the preferred shape (1.0 for it, above 1 for
    /// smaller micro-batches).
    pub relative_time: f64,
}

/// Whether starting now with a shape `relative_time` times slower beats
/// waiting `expected_wait` seconds for the preferred shape, for a job with
/// `remaining` seconds of work at its preferred shape. Without an estimate
/// (`None`: no running job's end would make room) waiting has no end in
/// sight, so starting now wins.
pub fn start_smaller_now(relative_time: f64, remaining: f64, expected_wait: Option<f64>) -> bool {
    match expected_wait {
        None => true,
        Some(wait) => remaining * relative_time < wait + remaining,
    }
}

/// Why a smaller shape was chosen: the figures an `ElasticShape` event shows.
#[derive(Debug, Clone, PartialEq)]
pub struct ElasticChoice {
    /// The shape chosen.
    pub shape: Shape,
    /// The preferred shape's budget, which fits nowhere now.
    pub preferred_budget: u64,
    /// The estimated wait for the preferred shape, seconds (`None`: unknown).
    pub expected_wait: Option<f64>,
}

/// Chooses among `smaller` shapes (any order; each smaller than the
/// preferred one) the fastest one that `fits` now and is worth starting now
/// rather than waiting `expected_wait` for the preferred shape. `fits` is
/// asked about shapes fastest first, and not after the first that fits.
pub fn choose_smaller(
    smaller: &[Shape],
    preferred_budget: u64,
    remaining: f64,
    expected_wait: Option<f64>,
    mut fits: impl FnMut(&Shape) -> bool,
) -> Option<ElasticChoice> {
    let mut order: Vec<&Shape> = smaller
        .iter()
        .filter(|s| s.budget < preferred_budget)
        .collect();
    order.sort_by(|a, b| a.relative_time.total_cmp(&b.relative_time));
    for shape in order {
        if !start_smaller_now(shape.relative_time, remaining, expected_wait) {
            // The rest are slower still.
            return None;
        }
        if fits(shape) {
            return Some(ElasticChoice {
                shape: *shape,
                preferred_budget,
                expected_wait,
            });
        }
    }
    None
}

/// What a waiting job needs: `gpus` GPUs of one node, each with `per_gpu`
/// units and `compute` thousandths of its compute free (0: compute not
/// counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hole {
    /// GPUs, all on one node.
    pub gpus: u32,
    /// Units free on each.
    pub per_gpu: u64,
    /// Compute free on each, thousandths of the GPU.
    pub compute: u64,
}

impl Hole {
    /// `gpus` GPUs with `per_gpu` units free each, compute not counted.
    pub fn new(gpus: u32, per_gpu: u64) -> Self {
        Self {
            gpus,
            per_gpu,
            compute: 0,
        }
    }

    /// The same hole with `compute` thousandths free on each GPU too.
    pub fn with_compute(self, compute: u64) -> Self {
        Self { compute, ..self }
    }
}

/// Seconds from `now` until `hole` is expected to open, from the running
/// jobs' expected ends (`ends`: end time and placement, in any order): the
/// first end after which some node has the hole's GPUs, counting what every
/// job ending by then releases. CPU and memory are not considered. `None`
/// when no running job's end makes such a hole; `Some(0.0)` when the hole is
/// already there.
pub fn expected_wait<'a>(
    state: &ClusterState,
    ends: impl IntoIterator<Item = (f64, &'a Placement)>,
    hole: Hole,
    now: f64,
) -> Option<f64> {
    expected_wait_on(state, ends, hole, now, |_, _| true)
}

/// [`expected_wait`] counting only the GPUs `usable(node, gpu)` accepts
/// (by index into [`ClusterState::nodes`] and into the node's GPUs): those
/// of the GPU model a job's budget was predicted for, say.
pub fn expected_wait_on<'a>(
    state: &ClusterState,
    ends: impl IntoIterator<Item = (f64, &'a Placement)>,
    hole: Hole,
    now: f64,
    usable: impl Fn(usize, usize) -> bool,
) -> Option<f64> {
    let mut ends: Vec<(f64, &Placement)> = ends.into_iter().collect();
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let nodes = state.nodes();
    // (units, compute) freed per (node, GPU) by the ends counted so far.
    let mut freed: HashMap<(usize, u32), (u64, u64)> = HashMap::new();
    let serving = |node: usize, freed: &HashMap<(usize, u32), (u64, u64)>| {
        let n = &nodes[node];
        (0..n.gpu_free.len())
            .filter(|&g| {
                let (units, compute) = freed.get(&(node, g as u32)).copied().unwrap_or((0, 0));
                usable(node, g)
                    && n.gpu_free[g] + units >= hole.per_gpu
                    && n.gpu_compute_free[g] + compute >= hole.compute
            })
            .count()
            >= hole.gpus as usize
    };
    if (0..nodes.len()).any(|n| serving(n, &freed)) {
        return Some(0.0);
    }
    for (end, placement) in ends {
        let Some(node) = state.node_index(&placement.node) else {
            continue;
        };
        for &g in &placement.gpu_indices {
            let entry = freed.entry((node, g)).or_default();
            entry.0 += placement.gpu_budget;
            entry.1 += placement.gpu_compute;
        }
        if serving(node, &freed) {
            return Some((end - now).max(0.0));
        }
    }
    None
}

#[cfg(test)]
#[path = "elastic_tests.rs"]
mod tests;
