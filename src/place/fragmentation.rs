//! Fragmentation of a node with respect to a target workload (Weng et al.,
//! "Beware of Fragmentation", USENIX ATC 2023), and the workload model that
//! supplies the task-type popularities.
//!
//! A node's fragmentation for one task type is the free GPU capacity that
//! task type cannot use there: all of the node's free GPU when the task cannot
//! run on the node at all (CPU, memory, taints, too few serving GPUs), and
//! otherwise the free capacity of the GPUs that cannot serve one of the task's
//! GPUs (too little room left, or a model the task does not accept). The
//! expected fragmentation is that measure averaged over the task types,
//! weighted by how popular each type is.
//!
//! Where jobs count compute ([`super::inventory::JobRequest::gpu_compute`]),
//! a GPU's free capacity is its [`NodeView::gpu_room`]: its free memory, but
//! no more than its capacity times the share of its compute left. Memory on a
//! GPU whose compute is taken can serve no job that needs compute; counting
//! it as fragmented would make the policies spread jobs over fresh GPUs
//! rather than fill one's compute.

use std::collections::HashMap;

use super::state::{Demand, ModelMask, NodeView};

/// One task type of the target workload and its popularity.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskType {
    /// What a task of this type asks for.
    pub demand: Demand,
    /// Popularity; the weights of a [`TargetWorkload`] sum to 1.
    pub weight: f64,
}

/// The distribution of incoming task types that fragmentation is measured
/// against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetWorkload {
    types: Vec<TaskType>,
    /// The same types grouped by their GPU shape, so the per-GPU work of a
    /// measure is done once per shape rather than once per type.
    groups: Vec<ShapeGroup>,
}

/// Task types that ask for the same GPUs and differ in CPU, memory or
/// tolerations.
#[derive(Debug, Clone, PartialEq)]
struct ShapeGroup {
    gpus: u32,
    per_gpu: u64,
    compute: u64,
    models: ModelMask,
    /// (cpu, mem, weight) per member type.
    members: Vec<(u64, u64, f64)>,
}

impl TargetWorkload {
    /// Popularity by count: each demand in `demands` is one observed task.
    pub fn from_demands<'a>(demands: impl IntoIterator<Item = &'a Demand>) -> Self {
        let mut counts: HashMap<&Demand, f64> = HashMap::new();
        for d in demands {
            *counts.entry(d).or_default() += 1.0;
        }
        Self::from_weights(counts.into_iter().map(|(d, w)| (d.clone(), w)))
    }

    /// Normalises arbitrary non-negative weights; types are sorted most
    /// popular first, before the total is summed, so the order, and hence the
    /// float sums, do not depend on the order the weights come in (a hash
    /// map's, which differs from run to run).
    pub fn from_weights(weights: impl IntoIterator<Item = (Demand, f64)>) -> Self {
        let mut types: Vec<TaskType> = weights
            .into_iter()
            .filter(|(_, w)| *w > 0.0)
            .map(|(demand, weight)| TaskType { demand, weight })
            .collect();
        types.sort_by(|a, b| {
            b.weight
                .total_cmp(&a.weight)
                .then(a.demand.per_gpu.cmp(&b.demand.per_gpu))
                .then(a.demand.compute.cmp(&b.demand.compute))
                .then(a.demand.gpus.cmp(&b.demand.gpus))
                .then(a.demand.cpu.cmp(&b.demand.cpu))
                .then(a.demand.mem.cmp(&b.demand.mem))
                .then(a.demand.models.cmp(&b.demand.models))
        });
        let total: f64 = types.iter().map(|t| t.weight).sum();
        types.iter_mut().for_each(|t| t.weight /= total);
        let mut groups: Vec<ShapeGroup> = Vec::new();
        for t in &types {
            let d = &t.demand;
            let member = (d.cpu, d.mem, t.weight);
            match groups.iter_mut().find(|g| {
                g.gpus == d.gpus
                    && g.per_gpu == d.per_gpu
                    && g.compute == d.compute
                    && g.models == d.models
            }) {
                Some(g) => g.members.push(member),
                None => groups.push(ShapeGroup {
                    gpus: d.gpus,
                    per_gpu: d.per_gpu,
                    compute: d.compute,
                    models: d.models,
                    members: vec![member],
                }),
            }
        }
        Self { types, groups }
    }

    /// Task types, most popular first.
    pub fn types(&self) -> &[TaskType] {
        &self.types
    }

    /// Whether no task has been seen yet.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

/// Free GPU capacity on the node that a task of type `task` cannot use
/// (the paper's F_n(m)).
pub fn task_fragmentation(node: &NodeView, task: &Demand) -> u64 {
    let total = node.gpu_room_total();
    if task.cpu > node.cpu_free
        || task.mem > node.mem_free
        || (!node.taints.is_empty() && !node.admits(task))
    {
        return total;
    }
    let mut serving = 0u32;
    let mut unusable = 0u64;
    for g in 0..node.gpu_free.len() {
        if node.gpu_serves(g, task) {
            serving += 1;
        } else {
            unusable += node.gpu_room(g);
        }
    }
    if serving < task.gpus { total } else { unusable }
}

/// Popularity-weighted fragmentation of the node over the target workload.
pub fn expected_fragmentation(node: &NodeView, workload: &TargetWorkload) -> f64 {
    workload
        .types
        .iter()
        .map(|t| t.weight * task_fragmentation(node, &t.demand) as f64)
        .sum()
}

/// Learns the task-type distribution online from arrivals: an exponentially
/// decayed histogram, so the target follows a workload that drifts, and a
/// snapshot that is only rebuilt every few arrivals, so the score caches that
/// depend on it stay valid most of the time.
#[derive(Debug, Clone)]
pub struct WorkloadModel {
    counts: HashMap<Demand, f64>,
    /// Weight the next arrival gets; grows instead of decaying every entry.
    increment: f64,
    growth: f64,
    refresh_every: u64,
    since_refresh: u64,
    snapshot: TargetWorkload,
    version: u64,
    tolerance: f64,
}

impl WorkloadModel {
    /// `half_life` is in arrivals: an arrival that many tasks ago counts half
    /// as much as the latest. The snapshot is rebuilt after `refresh_every`
    /// arrivals, or at once when a task type appears that was never seen.
    pub fn new(half_life: f64, refresh_every: u64) -> Self {
        Self {
            counts: HashMap::new(),
            increment: 1.0,
            growth: 2f64.powf(1.0 / half_life.max(1.0)),
            refresh_every: refresh_every.max(1),
            since_refresh: 0,
            snapshot: TargetWorkload::default(),
            version: 0,
            tolerance: 0.0,
        }
    }

    /// Keeps the published target until the learned distribution differs
    /// from it by more than `tolerance` in total variation (half the L1
    /// distance). Every new target invalidates all cached scores, so
    /// republishing for noise costs speed and buys nothing.
    pub fn with_tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance.max(0.0);
        self
    }

    /// A fixed target: never changes with arrivals (FGD's configuration,
    /// where the target is the known trace distribution).
    pub fn fixed(target: TargetWorkload) -> Self {
        let mut model = Self::new(1.0, u64::MAX);
        model.snapshot = target;
        model.growth = 0.0;
        model
    }

    /// Records one arrival (placed or not: demand that failed is still demand).
    pub fn observe(&mut self, demand: &Demand) {
        if self.growth == 0.0 {
            return;
        }
        let new_type = match self.counts.get_mut(demand) {
            Some(c) => {
                *c += self.increment;
                false
            }
            None => {
                self.counts.insert(demand.clone(), self.increment);
                true
            }
        };
        self.increment *= self.growth;
        self.since_refresh += 1;
        if self.increment > 1e200 {
            // Rescale before the increments overflow; ratios are unchanged.
            let scale = self.increment;
            self.counts.values_mut().for_each(|c| *c /= scale);
            self.increment = 1.0;
        }
        if (new_type && self.snapshot.is_empty()) || self.since_refresh >= self.refresh_every {
            self.refresh();
        }
    }

    fn refresh(&mut self) {
        // Types below 0.1% of the mass cost time on every evaluation and move
        // the measure by less than they cost; they come back if they grow.
        let total: f64 = self.counts.values().sum();
        let cutoff = total * 1e-3;
        self.counts.retain(|_, c| *c > total * 1e-9);
        let candidate = TargetWorkload::from_weights(
            self.counts
                .iter()
                .filter(|(_, c)| **c >= cutoff)
                .map(|(d, c)| (d.clone(), *c)),
        );
        self.since_refresh = 0;
        if self.snapshot.is_empty() || total_variation(&self.snapshot, &candidate) > self.tolerance
        {
            self.snapshot = candidate;
            self.version += 1;
        }
    }

    /// The current target workload.
    pub fn target(&self) -> &TargetWorkload {
        &self.snapshot
    }

    /// Changes whenever [`Self::target`] changes; caches compare it.
    pub fn version(&self) -> u64 {
        self.version
    }
}

/// Total variation distance between two target workloads (0 = same, 1 = disjoint).
pub fn total_variation(a: &TargetWorkload, b: &TargetWorkload) -> f64 {
    let weight_in = |w: &TargetWorkload, d: &Demand| {
        w.types
            .iter()
            .find(|t| t.demand == *d)
            .map_or(0.0, |t| t.weight)
    };
    let a_side: f64 = a
        .types
        .iter()
        .map(|t| (t.weight - weight_in(b, &t.demand)).abs())
        .sum();
    let b_only: f64 = b
        .types
        .iter()
        .filter(|t| weight_in(a, &t.demand) == 0.0)
        .map(|t| t.weight)
        .sum();
    (a_side + b_only) / 2.0
}

/// Free GPU capacity on the node that a stream of tasks of type `task` alone
/// could not use: everything beyond what the copies of `task` that still fit
/// (limited by CPU, memory and GPU room, several per GPU for shares) take.
///
/// Unlike [`task_fragmentation`] this sees that a node with 3 free GPUs but
/// CPU for one more task strands two GPUs, and that a GPU with 600 units free
/// strands 140 of them for 460-unit tasks. CPU-only types keep the paper's
/// all-or-nothing rule: they use no GPU, so only their not fitting at all
/// says something about the GPUs.
pub fn task_stranding(node: &NodeView, task: &Demand) -> u64 {
    let total = node.gpu_room_total();
    if task.gpus == 0 || total == 0 {
        return task_fragmentation(node, task);
    }
    if !node.taints.is_empty() && !node.admits(task) {
        return total;
    }
    let mut slots = 0u64;
    for g in 0..node.gpu_free.len() {
        if task.models & (1u128 << node.gpu_model[g]) != 0 {
            slots += if task.gpus == 1 {
                node.gpu_copies(g, task.per_gpu, task.compute)
            } else {
                u64::from(node.gpu_serves(g, task))
            };
        }
    }
    let mut copies = slots / u64::from(task.gpus);
    // A zero request does not limit the copies.
    copies = copies.min(node.cpu_free.checked_div(task.cpu).unwrap_or(u64::MAX));
    copies = copies.min(node.mem_free.checked_div(task.mem).unwrap_or(u64::MAX));
    total - (copies * task.gpu_units()).min(total)
}

/// Popularity-weighted [`task_stranding`] over the target workload.
pub fn expected_stranding(node: &NodeView, workload: &TargetWorkload) -> f64 {
    workload
        .types
        .iter()
        .map(|t| t.weight * task_stranding(node, &t.demand) as f64)
        .sum()
}

/// Both expected measures of one node, computed in one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeMeasures {
    /// [`expected_fragmentation`].
    pub fragmentation: f64,
    /// [`expected_stranding`].
    pub stranding: f64,
}

/// [`expected_fragmentation`] and [`expected_stranding`] together, doing the
/// per-GPU work once per GPU shape of the workload instead of once per task
/// type: this is the policies' hot loop.
pub fn measure_node(node: &NodeView, workload: &TargetWorkload) -> NodeMeasures {
    if !node.taints.is_empty() {
        // Tolerations differ per type, which the shape groups ignore.
        return NodeMeasures {
            fragmentation: expected_fragmentation(node, workload),
            stranding: expected_stranding(node, workload),
        };
    }
    let total = node.gpu_room_total();
    let mut out = NodeMeasures::default();
    for group in &workload.groups {
        let (mut serving, mut slots, mut unusable) = (0u32, 0u64, 0u64);
        for g in 0..node.gpu_free.len() {
            // (A CPU-only group counts every GPU: it never reads them.)
            if node.gpu_takes(g, group.per_gpu, group.compute, group.models) {
                serving += 1;
                slots += if group.gpus == 1 {
                    node.gpu_copies(g, group.per_gpu, group.compute)
                } else {
                    1
                };
            } else {
                unusable += node.gpu_room(g);
            }
        }
        let gpu_ok = serving >= group.gpus;
        let gpu_copies = if group.gpus == 0 {
            u64::MAX
        } else {
            slots / u64::from(group.gpus)
        };
        let units = u64::from(group.gpus) * group.per_gpu;
        for &(cpu, mem, weight) in &group.members {
            let fits = gpu_ok && cpu <= node.cpu_free && mem <= node.mem_free;
            let frag = if !fits {
                total
            } else if group.gpus == 0 {
                0
            } else {
                unusable
            };
            let strand = if group.gpus == 0 || !fits {
                frag
            } else {
                let mut copies = gpu_copies;
                copies = copies.min(node.cpu_free.checked_div(cpu).unwrap_or(u64::MAX));
                copies = copies.min(node.mem_free.checked_div(mem).unwrap_or(u64::MAX));
                total - (copies * units).min(total)
            };
            out.fragmentation += weight * frag as f64;
            out.stranding += weight * strand as f64;
        }
    }
    out
}
