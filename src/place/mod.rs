//! Placement engine: which node and which GPU(s) a job runs on.
//!
//! Pure decision code over plain data: the controller turns its `GpuNode`s
//! and `TrainingJob`s into an [`Inventory`] and [`JobRequest`]s, the trace
//! benchmark turns CSV rows into the same, and neither I/O nor Kubernetes
//! types enter here.
//!
//! # Model
//!
//! GPU capacity is in generic units: bytes for real GPUs, 1000 per GPU in the
//! openb traces. A job asks for `gpus` GPUs, each with `gpu_budget` units
//! free, plus CPU and memory on the node, optionally restricted to some GPU
//! models, and must tolerate the node's `NoSchedule`/`NoExecute` taints.
//!
//! # Multi-GPU jobs
//!
//! All GPUs of a job are on one node (distributed training over NVLink/PCIe,
//! not the network), and they are distinct GPUs, each with the per-GPU budget
//! free. A job whose budget is a GPU's whole capacity therefore takes whole
//! GPUs, which is exactly the openb traces' rule that multi-GPU pods take
//! whole GPUs; a job with a smaller budget may share its GPUs with others.
//! When a node has more serving GPUs than the job needs, the tightest ones
//! are taken (best fit inside the node), leaving the roomiest for later.
//!
//! # Decisions and failures
//!
//! A [`Decision`] names the node, the GPU indices and, per GPU, the memory
//! fraction `budget / capacity` the training helper applies. A job that fits
//! nowhere gets [`PlaceError::NeverFits`] (bigger than any GPU or node of the
//! cluster, even empty: waiting will not help) or [`PlaceError::NoRoomNow`]
//! (it would fit an empty node: it waits), each with a message a user can act
//! on, e.g. "needs 31.2 GiB per GPU; largest free slot 24.0 GiB on node-3".
//!
//! # Policies
//!
//! See [`PolicyKind`]; `docs/placement.md` explains the vramfit policy and
//! how it compares with best-fit and FGD on the openb traces.

pub mod bench;
mod best_fit;
pub mod elastic;
mod explain;
mod fgd;
pub mod fragmentation;
pub mod inventory;
pub(crate) mod memo;
pub mod openb;
pub mod policy;
pub mod rng;
pub mod state;
mod vramfit;

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;

pub use bench::{PackBenchOptions, PackReport, ScaleOptions, ScaleReport, SeedSweepReport};
pub use fragmentation::{TargetWorkload, TaskType, WorkloadModel};
pub use inventory::{
    COMPUTE_WHOLE, Decision, GpuSpec, Inventory, JobRequest, NodeSpec, Placement, Taint,
    TaintEffect, Toleration,
};
pub use policy::{Policy, PolicyKind};
pub use state::ClusterState;

/// Everything that can go wrong in placement.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// No node of the cluster could hold the job even if it were empty.
    #[error("job {job} can never fit this cluster: {reason}")]
    NeverFits {
        /// Job id.
        job: String,
        /// What is too big, in the user's units.
        reason: String,
    },
    /// Some node could hold the job, but none has the room now.
    #[error("job {job} does not fit now: {reason}")]
    NoRoomNow {
        /// Job id.
        job: String,
        /// The largest room there is, so the user sees how far off it is.
        reason: String,
    },
    /// The request contradicts itself.
    #[error("job {job} is invalid: {reason}")]
    InvalidJob {
        /// Job id.
        job: String,
        /// What is wrong.
        reason: String,
    },
    /// The job is already in the ledger; release it first to move it.
    #[error("job {job} is already placed")]
    AlreadyPlaced {
        /// Job id.
        job: String,
    },
    /// An existing placement cannot be recorded (unknown node or GPU, or it
    /// would overcommit what is already recorded).
    #[error("placement of job {job} conflicts with the inventory: {reason}")]
    Conflict {
        /// Job id.
        job: String,
        /// What conflicts.
        reason: String,
    },
    /// The inventory itself is unusable.
    #[error("invalid inventory: {0}")]
    InvalidInventory(String),
    /// A policy name nobody knows.
    #[error("unknown placement policy {0:?} (expected random, best-fit, fgd or vramfit)")]
    UnknownPolicy(String),
    /// A trace file that does not parse.
    #[error("{file} line {line}: {reason}")]
    Trace {
        /// Which trace file.
        file: &'static str,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Benchmark options that make no sense.
    #[error("invalid benchmark options: {0}")]
    BenchOptions(String),
}

/// Result with [`PlaceError`] as the default error.
pub type Result<T, E = PlaceError> = std::result::Result<T, E>;

/// The engine: the ledger of one cluster plus a policy.
#[derive(Debug, Clone)]
pub struct Placer {
    state: ClusterState,
    policy: Policy,
}

impl Placer {
    /// An engine over an empty cluster.
    pub fn new(inventory: &Inventory, policy: Policy) -> Result<Self> {
        Ok(Self {
            state: ClusterState::new(inventory)?,
            policy,
        })
    }

    /// An engine whose ledger holds `placements` (after a controller
    /// restart, from the jobs' status). Fails on the first placement that
    /// names an unknown node or GPU or would overcommit.
    pub fn rebuild(
        inventory: &Inventory,
        placements: &[Placement],
        policy: Policy,
    ) -> Result<Self> {
        let mut placer = Self::new(inventory, policy)?;
        for p in placements {
            placer.state.restore(p)?;
        }
        Ok(placer)
    }

    /// Records one existing placement (from a job's status). Fails, leaving the
    /// ledger unchanged, when it names an unknown node or GPU or would overcommit.
    pub fn restore(&mut self, placement: &Placement) -> Result<()> {
        self.state.restore(placement)
    }

    /// Tells the policy about a job without placing it: a controller that
    /// rebuilds its engine each cycle shows it the jobs already running, so
    /// the learned job mix reflects the cluster and not only the newcomers.
    pub fn observe(&mut self, job: &JobRequest) -> Result<()> {
        let demand = self.state.demand_of(job)?;
        self.policy.observe(&demand);
        Ok(())
    }

    /// Chooses a node and GPUs for `job` and records the placement.
    pub fn place(&mut self, job: &JobRequest) -> Result<Decision> {
        let demand = self.state.demand_of(job)?;
        if self.state.placement(&job.id).is_some() {
            return Err(PlaceError::AlreadyPlaced {
                job: job.id.clone(),
            });
        }
        self.policy.observe(&demand);
        match self.policy.choose(&self.state, &demand) {
            Some((node, gpus)) => self.state.commit(job, &demand, node, gpus),
            None => Err(explain::explain_no_fit(&self.state, job, &demand)),
        }
    }

    /// [`Placer::place`] for callers that only need to know whether the job
    /// fits now (a simulation trying its queue at every event): `None` when
    /// nothing fits, without building the explanation. The policy is not
    /// told about the job here, since a waiting job is tried many times: call
    /// [`Placer::observe`] once when it arrives.
    pub fn try_place(&mut self, job: &JobRequest) -> Result<Option<Decision>> {
        let demand = self.state.demand_of(job)?;
        if self.state.placement(&job.id).is_some() {
            return Err(PlaceError::AlreadyPlaced {
                job: job.id.clone(),
            });
        }
        match self.policy.choose(&self.state, &demand) {
            Some((node, gpus)) => self.state.commit(job, &demand, node, gpus).map(Some),
            None => Ok(None),
        }
    }

    /// Frees what `job_id` holds; `None` when it holds nothing.
    pub fn release(&mut self, job_id: &str) -> Option<Placement> {
        self.state.release(job_id)
    }

    /// The ledger.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// The policy and what it has learned.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}
