//! Choosing a node and GPUs: the shared search loop, the per-node score
//! cache that keeps it fast, and the dispatch to the individual policies.
//!
//! Every policy except `random` scores each feasible (node, GPU set)
//! candidate; lower is better. A node's best candidate depends only on the
//! node's free resources, the job's demand and the target workload, so it is
//! cached per (node, task type) and recomputed only when one of them changed.
//! Placing a job changes one node, so the next job of a known type costs one
//! cache probe per untouched node.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::fragmentation::{TargetWorkload, WorkloadModel, measure_node};
use super::memo::MeasureMemo;
use super::rng::SeededRng;
use super::state::{ClusterState, Demand, GpuSet, NodeState, NodeView};
use super::{PlaceError, best_fit, fgd, vramfit};

/// Which placement policy to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Uniformly random feasible node and GPUs (a floor for comparisons).
    Random,
    /// Least remaining resources after placement, tightest GPU.
    BestFit,
    /// Fragmentation Gradient Descent (Weng et al., ATC 2023).
    Fgd,
    /// vramfit's policy: FGD's measure plus stranding (CPU, memory, GPU
    /// tails) on a learned target workload, a price on CPU, best-fit ties.
    Vramfit,
}

impl PolicyKind {
    /// Every policy, in the order result tables list them.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Random,
        PolicyKind::BestFit,
        PolicyKind::Fgd,
        PolicyKind::Vramfit,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::BestFit => "best-fit",
            PolicyKind::Fgd => "fgd",
            PolicyKind::Vramfit => "vramfit",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = PlaceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| PlaceError::UnknownPolicy(s.to_string()))
    }
}

/// Lexicographic score, lower is better: the first component decides, the
/// second breaks ties that the first leaves within [`SCORE_EPSILON`].
pub(crate) type Score = [f64; 2];

/// Scores this close are equal: they are sums of popularity-weighted integers,
/// so anything smaller is floating-point noise, not a preference.
const SCORE_EPSILON: f64 = 1e-7;

/// Past this many distinct task types the cache is dropped and rebuilt, so
/// a controller that sees ever-new byte-exact budgets does not grow forever.
const MAX_CACHED_TYPES: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct CacheEntry {
    node_stamp: u64,
    workload_version: u64,
    best: Option<(Score, GpuSet)>,
}

/// A policy with its state: learned workload, score cache, random stream.
#[derive(Debug, Clone)]
pub struct Policy {
    kind: PolicyKind,
    rng: SeededRng,
    workload: WorkloadModel,
    types: HashMap<Demand, u32>,
    /// `cache[type][node]`: type-major, so the scan over nodes for one job
    /// reads memory in order.
    cache: Vec<Vec<CacheEntry>>,
    /// Per node: (stamp, workload version, the policy's node measure now).
    measure_now: Vec<(u64, u64, f64)>,
    scratch: Vec<u64>,
    memo: MeasureMemo,
}

impl Policy {
    /// A policy whose random choices (and FGD's tie-breaks) follow `seed`.
    /// FGD and vramfit learn the target workload from the jobs they are asked
    /// to place; see [`Policy::with_target_workload`] to fix it instead.
    pub fn new(kind: PolicyKind, seed: u64) -> Self {
        let workload = match kind {
            // The paper's FGD weighs task types by plain counts.
            PolicyKind::Fgd => WorkloadModel::new(f64::INFINITY, 64),
            _ => vramfit::workload_model(),
        };
        Self {
            kind,
            rng: SeededRng::new(seed),
            workload,
            types: HashMap::new(),
            cache: Vec::new(),
            measure_now: Vec::new(),
            scratch: Vec::new(),
            memo: MeasureMemo::default(),
        }
    }

    /// Measures fragmentation against a known, fixed target workload (what
    /// the FGD paper does with the trace's task distribution).
    pub fn with_target_workload(mut self, target: TargetWorkload) -> Self {
        self.workload = WorkloadModel::fixed(target);
        self
    }

    /// Which policy this is.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// The target workload fragmentation is measured against right now.
    pub fn target(&self) -> &TargetWorkload {
        self.workload.target()
    }

    /// Tells the policy a job arrived, whether or not it will fit.
    pub fn observe(&mut self, demand: &Demand) {
        if matches!(self.kind, PolicyKind::Fgd | PolicyKind::Vramfit) {
            self.workload.observe(demand);
        }
    }

    /// The best node and GPU set for `demand`, or `None` when nothing fits.
    pub fn choose(&mut self, state: &ClusterState, demand: &Demand) -> Option<(usize, GpuSet)> {
        if self.kind == PolicyKind::Random {
            return self.choose_random(state, demand);
        }
        let type_id = self.type_id(demand);
        let nodes = state.nodes();
        if self.measure_now.len() != nodes.len() {
            self.cache.clear();
            self.measure_now = vec![(u64::MAX, u64::MAX, 0.0); nodes.len()];
        }
        if self.cache.len() <= type_id {
            self.cache.resize(type_id + 1, Vec::new());
        }
        if self.cache[type_id].len() != nodes.len() {
            self.cache[type_id] = vec![
                CacheEntry {
                    node_stamp: u64::MAX,
                    workload_version: 0,
                    best: None
                };
                nodes.len()
            ];
        }
        let version = self.workload.version();
        let mut best: Option<(Score, usize, GpuSet)> = None;
        let mut ties = 0u64;
        for (i, node) in nodes.iter().enumerate() {
            // Cheap rejections first: most nodes are full late in a run.
            if node.cpu_free < demand.cpu || node.mem_free < demand.mem {
                continue;
            }
            let entry = self.cache[type_id][i];
            let found = if entry.node_stamp == node.stamp && entry.workload_version == version {
                entry.best
            } else {
                let found = self.best_on_node(i, node, demand);
                self.cache[type_id][i] = CacheEntry {
                    node_stamp: node.stamp,
                    workload_version: version,
                    best: found,
                };
                found
            };
            let Some((score, gpus)) = found else { continue };
            match best {
                None => {
                    best = Some((score, i, gpus));
                    ties = 1;
                }
                Some((b, _, _)) => match compare(&score, &b) {
                    std::cmp::Ordering::Less => {
                        best = Some((score, i, gpus));
                        ties = 1;
                    }
                    // The Kubernetes scheduler picks uniformly among the
                    // best-scored nodes; FGD as published inherits that.
                    std::cmp::Ordering::Equal if self.kind == PolicyKind::Fgd => {
                        ties += 1;
                        if self.rng.below(ties) == 0 {
                            best = Some((score, i, gpus));
                        }
                    }
                    _ => {}
                },
            }
        }
        best.map(|(_, i, g)| (i, g))
    }

    fn type_id(&mut self, demand: &Demand) -> usize {
        if let Some(&id) = self.types.get(demand) {
            return id as usize;
        }
        if self.types.len() >= MAX_CACHED_TYPES {
            self.types.clear();
            self.cache.clear();
        }
        let id = self.types.len() as u32;
        self.types.insert(demand.clone(), id);
        id as usize
    }

    fn best_on_node(
        &mut self,
        i: usize,
        node: &NodeState,
        demand: &Demand,
    ) -> Option<(Score, GpuSet)> {
        if !node.view().fits(demand) {
            return None;
        }
        let target = self.workload.target();
        let version = self.workload.version();
        let kind = self.kind;
        let measure = move |view: &NodeView, target: &TargetWorkload| match kind {
            PolicyKind::Vramfit => vramfit::measure(view, target),
            _ => measure_node(view, target).fragmentation,
        };
        let needs_measure = matches!(kind, PolicyKind::Fgd | PolicyKind::Vramfit);
        let memo = &mut self.memo;
        let measure_now = if needs_measure {
            let (stamp, ver, value) = self.measure_now[i];
            if stamp == node.stamp && ver == version {
                value
            } else {
                let value = memo.get_or_compute(node.class, &node.view(), target, version, measure);
                self.measure_now[i] = (node.stamp, version, value);
                value
            }
        } else {
            0.0
        };
        let mut best: Option<(Score, GpuSet)> = None;
        let scratch = &mut self.scratch;
        for_each_candidate(node, demand, |gpus| {
            let score = match kind {
                PolicyKind::BestFit => best_fit::score(node, demand, gpus),
                PolicyKind::Fgd | PolicyKind::Vramfit => {
                    let after = node.view_after(demand, gpus, scratch);
                    let growth = memo.get_or_compute(node.class, &after, target, version, measure)
                        - measure_now;
                    if kind == PolicyKind::Fgd {
                        fgd::score(growth)
                    } else {
                        vramfit::score(node, demand, gpus, growth)
                    }
                }
                PolicyKind::Random => unreachable!("random does not score"),
            };
            if best.is_none_or(|(b, _)| compare(&score, &b).is_lt()) {
                best = Some((score, gpus));
            }
        });
        best
    }

    fn choose_random(&mut self, state: &ClusterState, demand: &Demand) -> Option<(usize, GpuSet)> {
        let mut chosen = None;
        let mut seen = 0u64;
        for (i, node) in state.nodes().iter().enumerate() {
            if node.view().fits(demand) {
                seen += 1;
                if self.rng.below(seen) == 0 {
                    chosen = Some(i);
                }
            }
        }
        let node = &state.nodes()[chosen?];
        let view = node.view();
        let mut serving: Vec<usize> = (0..node.gpu_free.len())
            .filter(|&g| view.gpu_serves(g, demand))
            .collect();
        self.rng.shuffle(&mut serving);
        let gpus = serving
            .iter()
            .take(demand.gpus as usize)
            .fold(0, |set, &g| set | (1u64 << g));
        Some((chosen?, gpus))
    }
}

pub(crate) fn compare(a: &Score, b: &Score) -> std::cmp::Ordering {
    if (a[0] - b[0]).abs() > SCORE_EPSILON {
        return a[0].total_cmp(&b[0]);
    }
    if (a[1] - b[1]).abs() > SCORE_EPSILON {
        return a[1].total_cmp(&b[1]);
    }
    std::cmp::Ordering::Equal
}

/// Calls `visit` with every GPU set worth scoring for `demand` on `node`.
///
/// One GPU: each serving GPU, skipping GPUs identical (free units and
/// compute, capacity, model)
/// to one already offered, since they lead to the same node state. Several
/// GPUs: the tightest serving GPUs only. In the openb traces multi-GPU tasks
/// take whole GPUs, so every choice of free GPUs is the same state and this is
/// exact; with real budgets it is best-fit inside the node, which leaves the
/// roomiest GPUs for the next job.
pub(crate) fn for_each_candidate(node: &NodeState, demand: &Demand, mut visit: impl FnMut(GpuSet)) {
    let view = node.view();
    let count = node.gpu_free.len();
    match demand.gpus {
        0 => visit(0),
        1 => {
            for g in 0..count {
                if !view.gpu_serves(g, demand) {
                    continue;
                }
                let duplicate = (0..g).any(|h| {
                    view.gpu_serves(h, demand)
                        && node.gpu_free[h] == node.gpu_free[g]
                        && node.gpu_compute_free[h] == node.gpu_compute_free[g]
                        && node.gpu_capacity[h] == node.gpu_capacity[g]
                        && node.gpu_model[h] == node.gpu_model[g]
                });
                if !duplicate {
                    visit(1 << g);
                }
            }
        }
        k => {
            let mut serving: Vec<usize> =
                (0..count).filter(|&g| view.gpu_serves(g, demand)).collect();
            if serving.len() < k as usize {
                return;
            }
            serving.sort_by_key(|&g| (node.gpu_free[g], g));
            visit(
                serving[..k as usize]
                    .iter()
                    .fold(0, |set, &g| set | (1u64 << g)),
            );
        }
    }
}

/// Fraction of `total` that `left` is; a resource the node does not have
/// counts as fully used, so it never attracts jobs.
pub(crate) fn left_fraction(left: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        left as f64 / total as f64
    }
}
