//! The ledger: what is free on every node and GPU, and which job holds what.
//!
//! Jobs are compiled into a [`Demand`] once (models interned into a bit mask),
//! so the hot loops of the policies compare integers only.

use std::collections::HashMap;

use super::inventory::{
    COMPUTE_WHOLE, Decision, Inventory, JobRequest, Placement, Taint, TaintEffect, Toleration,
};
use super::{PlaceError, Result};

/// Bit mask over the cluster's interned GPU models; bit `i` is model `i`.
pub type ModelMask = u128;

/// Bit mask over GPU indices of one node; bit `i` is GPU `i`.
pub type GpuSet = u64;

/// Most distinct GPU models one cluster may have (the width of [`ModelMask`]).
pub const MAX_MODELS: usize = 128;

/// Most GPUs one node may have (the width of [`GpuSet`]).
pub const MAX_GPUS_PER_NODE: usize = 64;

/// A job's request compiled against one cluster: what fit checks and
/// fragmentation measures need, and nothing else. Equal demands are one task
/// type for the policies.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Demand {
    /// GPUs on one node; 0 for CPU-only.
    pub gpus: u32,
    /// Free units needed on each of those GPUs.
    pub per_gpu: u64,
    /// Free compute (thousandths of a GPU) needed on each of those GPUs; 0
    /// when the job's compute is not counted.
    pub compute: u64,
    /// CPU millicores.
    pub cpu: u64,
    /// Memory bytes.
    pub mem: u64,
    /// Allowed models; all bits set when the job accepts any model.
    pub models: ModelMask,
    /// Tolerations, only consulted on tainted nodes.
    pub tolerations: Vec<Toleration>,
}

impl Demand {
    /// GPU units the demand takes in total.
    pub fn gpu_units(&self) -> u64 {
        u64::from(self.gpus) * self.per_gpu
    }
}

/// A node's current (or hypothetical) free resources, borrowed for fit checks
/// and fragmentation measures without copying the node.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// Free CPU millicores.
    pub cpu_free: u64,
    /// Free memory bytes.
    pub mem_free: u64,
    /// Free units per GPU.
    pub gpu_free: &'a [u64],
    /// Free compute per GPU, thousandths of the GPU.
    pub gpu_compute_free: &'a [u64],
    /// Capacity per GPU.
    pub gpu_capacity: &'a [u64],
    /// Interned model per GPU.
    pub gpu_model: &'a [u8],
    /// Blocking taints of the node.
    pub taints: &'a [Taint],
}

impl NodeView<'_> {
    /// Whether the job's tolerations let it onto this node at all.
    pub fn admits(&self, demand: &Demand) -> bool {
        self.taints
            .iter()
            .all(|t| demand.tolerations.iter().any(|tol| tol.tolerates(t)))
    }

    /// Whether GPU `g` can take one GPU's share of `demand`.
    #[inline]
    pub fn gpu_serves(&self, g: usize, demand: &Demand) -> bool {
        self.gpu_takes(g, demand.per_gpu, demand.compute, demand.models)
    }

    /// Whether GPU `g` has `per_gpu` units and `compute` free and is one of
    /// `models`.
    #[inline]
    pub fn gpu_takes(&self, g: usize, per_gpu: u64, compute: u64, models: ModelMask) -> bool {
        self.gpu_free[g] >= per_gpu
            && self.gpu_compute_free[g] >= compute
            && models & (1u128 << self.gpu_model[g]) != 0
    }

    /// How many one-GPU shares of `per_gpu` units and `compute` GPU `g` has
    /// room for, by memory and by compute (a share that needs no compute is
    /// limited by memory alone).
    #[inline]
    pub fn gpu_copies(&self, g: usize, per_gpu: u64, compute: u64) -> u64 {
        let by_memory = self.gpu_free[g] / per_gpu.max(1);
        match self.gpu_compute_free[g].checked_div(compute) {
            Some(by_compute) => by_memory.min(by_compute),
            None => by_memory,
        }
    }

    /// Whether `demand` fits the node as it is.
    pub fn fits(&self, demand: &Demand) -> bool {
        if demand.cpu > self.cpu_free || demand.mem > self.mem_free {
            return false;
        }
        if !self.taints.is_empty() && !self.admits(demand) {
            return false;
        }
        let needed = demand.gpus as usize;
        needed == 0
            || (0..self.gpu_free.len())
                .filter(|&g| self.gpu_serves(g, demand))
                .count()
                >= needed
    }

    /// Sum of free GPU units on the node.
    pub fn gpu_free_total(&self) -> u64 {
        self.gpu_free.iter().sum()
    }

    /// The free units of GPU `g` the fragmentation measures count: its free
    /// memory, but no more than its capacity times the share of its compute
    /// left. A GPU whose compute is taken is full, whatever memory it has
    /// left: no placement can use that memory, so it is not fragmentation to
    /// avoid. Without compute counted this is the free memory.
    pub fn gpu_room(&self, g: usize) -> u64 {
        let by_compute = u128::from(self.gpu_capacity[g]) * u128::from(self.gpu_compute_free[g])
            / u128::from(COMPUTE_WHOLE);
        self.gpu_free[g].min(by_compute as u64)
    }

    /// Sum of [`Self::gpu_room`] over the node's GPUs.
    pub fn gpu_room_total(&self) -> u64 {
        (0..self.gpu_free.len()).map(|g| self.gpu_room(g)).sum()
    }
}

/// One node in the ledger.
#[derive(Debug, Clone)]
pub struct NodeState {
    /// Node name.
    pub name: String,
    /// Allocatable CPU millicores.
    pub cpu_total: u64,
    /// Allocatable memory bytes.
    pub mem_total: u64,
    /// Free CPU millicores.
    pub cpu_free: u64,
    /// Free memory bytes.
    pub mem_free: u64,
    /// Capacity per GPU.
    pub gpu_capacity: Vec<u64>,
    /// Free units per GPU.
    pub gpu_free: Vec<u64>,
    /// Free compute per GPU, thousandths of the GPU.
    pub gpu_compute_free: Vec<u64>,
    /// Interned model per GPU.
    pub gpu_model: Vec<u8>,
    /// Taints that keep pods away (`NoSchedule`, `NoExecute`).
    pub taints: Vec<Taint>,
    /// Changes whenever the node's free resources change; caches compare it.
    pub stamp: u64,
    /// Nodes with the same GPU models (in order) and taints share a class:
    /// the same free resources then mean the same measures.
    pub class: u32,
}

impl NodeState {
    /// The node as it is now.
    pub fn view(&self) -> NodeView<'_> {
        NodeView {
            cpu_free: self.cpu_free,
            mem_free: self.mem_free,
            gpu_free: &self.gpu_free,
            gpu_compute_free: &self.gpu_compute_free,
            gpu_capacity: &self.gpu_capacity,
            gpu_model: &self.gpu_model,
            taints: &self.taints,
        }
    }

    /// The node as it would be after placing `demand` on `gpus`; `scratch`
    /// holds the changed GPU lists (free units, then free compute) so nothing
    /// is allocated per call.
    pub fn view_after<'a>(
        &'a self,
        demand: &Demand,
        gpus: GpuSet,
        scratch: &'a mut Vec<u64>,
    ) -> NodeView<'a> {
        let count = self.gpu_free.len();
        scratch.clear();
        scratch.extend_from_slice(&self.gpu_free);
        scratch.extend_from_slice(&self.gpu_compute_free);
        for g in 0..count {
            if gpus & (1 << g) != 0 {
                scratch[g] -= demand.per_gpu;
                scratch[count + g] -= demand.compute;
            }
        }
        let (gpu_free, gpu_compute_free) = scratch.split_at(count);
        NodeView {
            cpu_free: self.cpu_free - demand.cpu,
            mem_free: self.mem_free - demand.mem,
            gpu_free,
            gpu_compute_free,
            gpu_capacity: &self.gpu_capacity,
            gpu_model: &self.gpu_model,
            taints: &self.taints,
        }
    }

    /// Total GPU capacity of the node.
    pub fn gpu_capacity_total(&self) -> u64 {
        self.gpu_capacity.iter().sum()
    }
}

/// Free resources of every node plus the ledger of placed jobs.
#[derive(Debug, Clone)]
pub struct ClusterState {
    nodes: Vec<NodeState>,
    node_by_name: HashMap<String, usize>,
    models: Vec<String>,
    ledger: HashMap<String, Placement>,
    capacity_total: u64,
    allocated_total: u64,
    next_stamp: u64,
}

impl ClusterState {
    /// An empty ledger over `inventory`; rejects duplicate names, nodes with
    /// more than [`MAX_GPUS_PER_NODE`] GPUs and more than [`MAX_MODELS`] models.
    pub fn new(inventory: &Inventory) -> Result<Self> {
        let mut models: Vec<String> = Vec::new();
        let mut nodes = Vec::with_capacity(inventory.nodes.len());
        let mut node_by_name = HashMap::with_capacity(inventory.nodes.len());
        let mut capacity_total = 0;
        let mut classes: HashMap<(Vec<String>, Vec<Taint>), u32> = HashMap::new();
        for (i, spec) in inventory.nodes.iter().enumerate() {
            if node_by_name.insert(spec.name.clone(), i).is_some() {
                return Err(PlaceError::InvalidInventory(format!(
                    "node {} appears twice",
                    spec.name
                )));
            }
            if spec.gpus.len() > MAX_GPUS_PER_NODE {
                return Err(PlaceError::InvalidInventory(format!(
                    "node {} has {} GPUs; at most {MAX_GPUS_PER_NODE} are supported",
                    spec.name,
                    spec.gpus.len()
                )));
            }
            let mut gpu_model = Vec::with_capacity(spec.gpus.len());
            for gpu in &spec.gpus {
                let id = match models.iter().position(|m| *m == gpu.model) {
                    Some(id) => id,
                    None if models.len() < MAX_MODELS => {
                        models.push(gpu.model.clone());
                        models.len() - 1
                    }
                    None => {
                        return Err(PlaceError::InvalidInventory(format!(
                            "more than {MAX_MODELS} distinct GPU models"
                        )));
                    }
                };
                gpu_model.push(id as u8);
            }
            let gpu_capacity: Vec<u64> = spec.gpus.iter().map(|g| g.capacity).collect();
            capacity_total += gpu_capacity.iter().sum::<u64>();
            nodes.push(NodeState {
                name: spec.name.clone(),
                cpu_total: spec.cpu_milli,
                mem_total: spec.memory_bytes,
                cpu_free: spec.cpu_milli,
                mem_free: spec.memory_bytes,
                gpu_free: gpu_capacity.clone(),
                gpu_compute_free: vec![COMPUTE_WHOLE; gpu_capacity.len()],
                gpu_capacity,
                gpu_model,
                taints: spec
                    .taints
                    .iter()
                    .filter(|t| t.effect != TaintEffect::PreferNoSchedule)
                    .cloned()
                    .collect(),
                stamp: i as u64,
                class: 0,
            });
            let key = (
                spec.gpus.iter().map(|g| g.model.clone()).collect(),
                nodes[i].taints.clone(),
            );
            let next = classes.len() as u32;
            nodes[i].class = *classes.entry(key).or_insert(next);
        }
        let next_stamp = nodes.len() as u64;
        Ok(Self {
            nodes,
            node_by_name,
            models,
            ledger: HashMap::new(),
            capacity_total,
            allocated_total: 0,
            next_stamp,
        })
    }

    /// All nodes, in inventory order.
    pub fn nodes(&self) -> &[NodeState] {
        &self.nodes
    }

    /// Index of the node called `name`.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.node_by_name.get(name).copied()
    }

    /// Sum of all GPU capacities.
    pub fn capacity_total(&self) -> u64 {
        self.capacity_total
    }

    /// Sum of the GPU units held by placed jobs.
    pub fn allocated_total(&self) -> u64 {
        self.allocated_total
    }

    /// GPUs nobody holds any part of.
    pub fn untouched_gpus(&self) -> usize {
        self.nodes
            .iter()
            .flat_map(|n| n.gpu_free.iter().zip(&n.gpu_capacity))
            .filter(|(free, cap)| free == cap)
            .count()
    }

    /// The placement recorded for `job_id`, if any.
    pub fn placement(&self, job_id: &str) -> Option<&Placement> {
        self.ledger.get(job_id)
    }

    /// Number of placed jobs.
    pub fn placed_jobs(&self) -> usize {
        self.ledger.len()
    }

    /// Compiles `job` against this cluster. A job that asks for GPUs without a
    /// budget, or a budget without GPUs, is invalid rather than silently fixed.
    pub fn demand_of(&self, job: &JobRequest) -> Result<Demand> {
        if job.gpus > 0 && job.gpu_budget == 0 {
            return Err(PlaceError::InvalidJob {
                job: job.id.clone(),
                reason: "asks for GPUs with a zero per-GPU budget".into(),
            });
        }
        if job.gpus == 0 && (job.gpu_budget > 0 || job.gpu_compute > 0) {
            return Err(PlaceError::InvalidJob {
                job: job.id.clone(),
                reason: "has a GPU budget or GPU compute but asks for 0 GPUs".into(),
            });
        }
        if job.gpu_compute > COMPUTE_WHOLE {
            return Err(PlaceError::InvalidJob {
                job: job.id.clone(),
                reason: format!(
                    "needs {} thousandths of each GPU's compute; a GPU has {COMPUTE_WHOLE}",
                    job.gpu_compute
                ),
            });
        }
        let models = if job.gpu_models.is_empty() {
            ModelMask::MAX
        } else {
            self.models
                .iter()
                .enumerate()
                .filter(|(_, m)| job.gpu_models.contains(m))
                .fold(0, |mask, (i, _)| mask | (1u128 << i))
        };
        Ok(Demand {
            gpus: job.gpus,
            per_gpu: job.gpu_budget,
            compute: job.gpu_compute,
            cpu: job.cpu_milli,
            mem: job.memory_bytes,
            models,
            tolerations: job.tolerations.clone(),
        })
    }

    /// Records `job` on node `node` and GPUs `gpus`, which the caller has
    /// checked to fit; returns the decision for the controller.
    pub(crate) fn commit(
        &mut self,
        job: &JobRequest,
        demand: &Demand,
        node: usize,
        gpus: GpuSet,
    ) -> Result<Decision> {
        if self.ledger.contains_key(&job.id) {
            return Err(PlaceError::AlreadyPlaced {
                job: job.id.clone(),
            });
        }
        let state = &mut self.nodes[node];
        let gpu_indices: Vec<u32> = (0..state.gpu_free.len() as u32)
            .filter(|g| gpus & (1 << g) != 0)
            .collect();
        let memory_fractions = gpu_indices
            .iter()
            .map(|&g| demand.per_gpu as f64 / state.gpu_capacity[g as usize] as f64)
            .collect();
        let placement = Placement {
            job_id: job.id.clone(),
            node: state.name.clone(),
            gpu_indices,
            gpu_budget: demand.per_gpu,
            gpu_compute: demand.compute,
            cpu_milli: demand.cpu,
            memory_bytes: demand.mem,
        };
        self.apply(node, &placement, Direction::Take)?;
        self.ledger.insert(job.id.clone(), placement.clone());
        Ok(Decision {
            placement,
            node_index: node,
            memory_fractions,
        })
    }

    /// Frees what `job_id` held. A job that holds nothing is not an error:
    /// deletes can be observed twice.
    pub fn release(&mut self, job_id: &str) -> Option<Placement> {
        let placement = self.ledger.remove(job_id)?;
        let node = self.node_by_name[&placement.node];
        // The ledger only ever holds placements that were applied, so giving
        // them back cannot underflow.
        self.apply(node, &placement, Direction::Give)
            .expect("ledger entry was applied");
        Some(placement)
    }

    /// Records an existing placement (rebuild after a restart). Rejects
    /// placements on unknown nodes or GPUs, and ones that would overcommit.
    pub fn restore(&mut self, placement: &Placement) -> Result<()> {
        if self.ledger.contains_key(&placement.job_id) {
            return Err(PlaceError::AlreadyPlaced {
                job: placement.job_id.clone(),
            });
        }
        let node = *self
            .node_by_name
            .get(&placement.node)
            .ok_or_else(|| PlaceError::Conflict {
                job: placement.job_id.clone(),
                reason: format!("node {} is not in the inventory", placement.node),
            })?;
        self.apply(node, placement, Direction::Take)?;
        self.ledger
            .insert(placement.job_id.clone(), placement.clone());
        Ok(())
    }

    fn apply(&mut self, node: usize, p: &Placement, dir: Direction) -> Result<()> {
        let conflict = |reason: String| PlaceError::Conflict {
            job: p.job_id.clone(),
            reason,
        };
        let state = &mut self.nodes[node];
        let gpu_count = state.gpu_free.len();
        if let Some(&bad) = p.gpu_indices.iter().find(|&&g| g as usize >= gpu_count) {
            return Err(conflict(format!("node {} has no GPU {bad}", state.name)));
        }
        match dir {
            Direction::Take => {
                if state.cpu_free < p.cpu_milli || state.mem_free < p.memory_bytes {
                    return Err(conflict(format!(
                        "node {} lacks the CPU or memory",
                        state.name
                    )));
                }
                let short = p.gpu_indices.iter().find_map(|&g| {
                    let lacks = if state.gpu_free[g as usize] < p.gpu_budget {
                        format!("{} units", p.gpu_budget)
                    } else if state.gpu_compute_free[g as usize] < p.gpu_compute {
                        format!("{} thousandths of its compute", p.gpu_compute)
                    } else {
                        return None;
                    };
                    Some(format!("GPU {g} on node {} lacks {lacks}", state.name))
                });
                if let Some(reason) = short {
                    return Err(conflict(reason));
                }
                state.cpu_free -= p.cpu_milli;
                state.mem_free -= p.memory_bytes;
                for &g in &p.gpu_indices {
                    state.gpu_free[g as usize] -= p.gpu_budget;
                    state.gpu_compute_free[g as usize] -= p.gpu_compute;
                }
                self.allocated_total += p.gpu_budget * p.gpu_indices.len() as u64;
            }
            Direction::Give => {
                state.cpu_free += p.cpu_milli;
                state.mem_free += p.memory_bytes;
                for &g in &p.gpu_indices {
                    state.gpu_free[g as usize] += p.gpu_budget;
                    state.gpu_compute_free[g as usize] += p.gpu_compute;
                }
                self.allocated_total -= p.gpu_budget * p.gpu_indices.len() as u64;
            }
        }
        state.stamp = self.next_stamp;
        self.next_stamp += 1;
        Ok(())
    }

    /// Interned model names, index = model id.
    pub fn models(&self) -> &[String] {
        &self.models
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Take,
    Give,
}
