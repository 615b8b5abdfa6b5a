//! The scheduling cycle. Reconcilers never choose GPUs: they predict, and the
//! cycle places the waiting jobs in order (priority, then creation time) on a
//! snapshot of the cluster, so that a job never overtakes a higher-priority one
//! for the same room and two jobs are never given the same memory.
//!
//! The cycle keeps its decisions in memory (`assignments`) until the job's own
//! reconcile has written them to the job's status; the ledger of the next cycle
//! is the placements in status plus those assignments, so a lagging watch cache
//! cannot make it hand the same room out twice, and a restarted controller
//! rebuilds everything from status.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::cluster_view::{ClusterView, job_key, job_request, recorded_placement};
use crate::api::{AssignedGpu, GpuModelBudget, PlacementStatus, TrainingJob};
use crate::place::{JobRequest, PlaceError, Placement, Placer, Policy};

/// The cycle's verdict for one waiting job.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Run the current attempt here.
    Place(PlacementStatus),
    /// Wait; the message says why.
    Wait {
        /// Why, in words (the largest free slot, the model constraint, ...).
        message: String,
        /// True when no GPU in the cluster could ever hold the job.
        never_fits: bool,
    },
}

fn never_fits(verdict: &Verdict) -> bool {
    matches!(
        verdict,
        Verdict::Wait {
            never_fits: true,
            ..
        }
    )
}

/// Attempt number of the job's current attempt.
pub fn current_attempt(job: &TrainingJob) -> u32 {
    job.status.as_ref().map_or(1, |s| s.attempt.max(1))
}

/// The placement recorded in status for the current attempt, if any.
pub fn recorded(job: &TrainingJob) -> Option<&PlacementStatus> {
    job.status.as_ref()?.recorded_placement()
}

/// True when the job waits for a placement: predicted, alive, not placed.
pub fn is_waiting(job: &TrainingJob, assigned: bool) -> bool {
    let Some(status) = job.status.as_ref() else {
        return false;
    };
    job.metadata.deletion_timestamp.is_none()
        && !status.phase.is_terminal()
        && status.budget_bytes.is_some()
        && recorded(job).is_none()
        && !assigned
}

/// Plans one cycle: rebuilds the ledger from `placed` (placements in status and
/// not-yet-written assignments) and places `waiting` in order.
pub fn plan_cycle(
    view: &ClusterView,
    placed: &[Placement],
    waiting: &[&TrainingJob],
    policy: Policy,
) -> Vec<(String, Verdict)> {
    let mut placer = match Placer::new(&view.inventory, policy) {
        Ok(placer) => placer,
        Err(error) => {
            let message = format!("no usable GPU inventory: {error}");
            return waiting
                .iter()
                .map(|job| {
                    (
                        job_key(job),
                        Verdict::Wait {
                            message: message.clone(),
                            never_fits: false,
                        },
                    )
                })
                .collect();
        }
    };
    for placement in view.reserved.iter().chain(placed) {
        if let Err(error) = placer.restore(placement) {
            // A placement on a node that left the inventory (no heartbeat) or
            // that no longer fits it: its memory is not handed out again here,
            // because the node is gone from the view altogether.
            tracing::debug!(%error, job = %placement.job_id, "placement not restored");
        }
    }
    // The policy learns the job mix it packs for from the jobs it sees; the
    // engine is rebuilt every cycle, so show it the running jobs too.
    for placement in placed {
        let running = JobRequest {
            id: placement.job_id.clone(),
            gpus: placement.gpu_indices.len() as u32,
            gpu_budget: placement.gpu_budget,
            cpu_milli: placement.cpu_milli,
            memory_bytes: placement.memory_bytes,
            gpu_models: Vec::new(),
            tolerations: Vec::new(),
        };
        let _ = placer.observe(&running);
    }
    let mut order: Vec<&TrainingJob> = waiting.to_vec();
    order.sort_by(|a, b| {
        b.spec
            .priority
            .cmp(&a.spec.priority)
            .then_with(|| created(a).cmp(&created(b)))
            .then_with(|| job_key(a).cmp(&job_key(b)))
    });
    order
        .into_iter()
        .map(|job| (job_key(job), place_one(&mut placer, view, job)))
        .collect()
}

fn created(job: &TrainingJob) -> Option<&Time> {
    job.metadata.creation_timestamp.as_ref()
}

fn place_one(placer: &mut Placer, view: &ClusterView, job: &TrainingJob) -> Verdict {
    let per_model = job
        .status
        .as_ref()
        .map(|s| s.gpu_model_budgets.as_slice())
        .unwrap_or_default();
    if !per_model.is_empty() {
        return place_per_model(placer, view, job, per_model);
    }
    let budget = job
        .status
        .as_ref()
        .and_then(|s| s.budget_bytes)
        .unwrap_or(0);
    place_with(placer, view, job, budget, None)
}

/// Places a job predicted per GPU model: each model is tried with its own
/// budget, and of the models with room now the one with the least capacity
/// is taken (the larger GPUs stay free for jobs that need them).
fn place_per_model(
    placer: &mut Placer,
    view: &ClusterView,
    job: &TrainingJob,
    per_model: &[GpuModelBudget],
) -> Verdict {
    let capacity = |model: &str| {
        view.inventory
            .nodes
            .iter()
            .flat_map(|n| n.gpus.iter())
            .filter(|g| g.model == model)
            .map(|g| g.capacity)
            .max()
            .unwrap_or(u64::MAX)
    };
    let mut order: Vec<&GpuModelBudget> = per_model.iter().collect();
    order.sort_by_key(|b| (capacity(&b.gpu_model), b.gpu_model.clone()));
    let mut waits = Vec::new();
    for candidate in order {
        match place_with(placer, view, job, candidate.budget_bytes, Some(candidate)) {
            Verdict::Place(placement) => return Verdict::Place(placement),
            Verdict::Wait {
                message,
                never_fits,
            } => waits.push((candidate.gpu_model.clone(), message, never_fits)),
        }
    }
    // GPU models that joined the cluster after the prediction get the
    // prediction for the default GPU profile, as jobs without per-model
    // budgets do.
    let covered: Vec<&str> = per_model.iter().map(|b| b.gpu_model.as_str()).collect();
    let allowed = job.spec.gpu_models.as_deref().unwrap_or_default();
    let mut others: Vec<String> = view
        .inventory
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(|g| g.model.clone()))
        .filter(|m| !covered.contains(&m.as_str()) && (allowed.is_empty() || allowed.contains(m)))
        .collect();
    others.sort();
    others.dedup();
    if let (false, Some(budget)) = (
        others.is_empty(),
        job.status.as_ref().and_then(|s| s.budget_bytes),
    ) {
        match place_restricted(placer, view, job, budget, others) {
            Verdict::Place(placement) => return Verdict::Place(placement),
            Verdict::Wait {
                message,
                never_fits,
            } => waits.push(("other models".into(), message, never_fits)),
        }
    }
    let never_fits = waits.iter().all(|(_, _, never)| *never);
    let message = waits
        .iter()
        .map(|(model, message, _)| format!("{model}: {message}"))
        .collect::<Vec<_>>()
        .join("; ");
    Verdict::Wait {
        message,
        never_fits,
    }
}

fn place_restricted(
    placer: &mut Placer,
    view: &ClusterView,
    job: &TrainingJob,
    budget: u64,
    models: Vec<String>,
) -> Verdict {
    place_request(placer, view, job, budget, None, Some(models))
}

fn place_with(
    placer: &mut Placer,
    view: &ClusterView,
    job: &TrainingJob,
    budget: u64,
    model: Option<&GpuModelBudget>,
) -> Verdict {
    let models = model.map(|m| vec![m.gpu_model.clone()]);
    place_request(placer, view, job, budget, model, models)
}

fn place_request(
    placer: &mut Placer,
    view: &ClusterView,
    job: &TrainingJob,
    budget: u64,
    model: Option<&GpuModelBudget>,
    models: Option<Vec<String>>,
) -> Verdict {
    let request = match job_request(job, budget) {
        Ok(request) => request,
        Err(message) => {
            return Verdict::Wait {
                message,
                never_fits: false,
            };
        }
    };
    let mut request = request;
    if let Some(models) = models {
        request.gpu_models = models;
    }
    match placer.place(&request) {
        Ok(decision) => {
            let node = decision.placement.node.clone();
            let gpus = decision
                .placement
                .gpu_indices
                .iter()
                .map(|&index| AssignedGpu {
                    index,
                    uuid: view
                        .uuids
                        .get(&(node.clone(), index))
                        .cloned()
                        .unwrap_or_default(),
                })
                .collect();
            let fraction = decision
                .memory_fractions
                .iter()
                .copied()
                .fold(0.0, f64::max);
            Verdict::Place(PlacementStatus {
                node,
                gpus,
                budget_bytes: budget,
                memory_fraction: fraction,
                attempt: current_attempt(job),
                gpu_model: model.map(|m| m.gpu_model.clone()),
                micro_batch: model.map(|m| m.micro_batch),
            })
        }
        Err(PlaceError::NeverFits { reason, .. }) => Verdict::Wait {
            message: format!("fits no node of the cluster: {reason}"),
            never_fits: true,
        },
        Err(PlaceError::NoRoomNow { reason, .. }) => Verdict::Wait {
            message: format!("waiting for room: {reason}"),
            never_fits: false,
        },
        Err(other) => Verdict::Wait {
            message: other.to_string(),
            never_fits: false,
        },
    }
}

/// Placements that hold memory now: the current attempt of every live job, as
/// recorded in status.
pub fn recorded_placements<'a>(jobs: impl IntoIterator<Item = &'a TrainingJob>) -> Vec<Placement> {
    jobs.into_iter()
        .filter_map(|job| recorded(job).map(|p| recorded_placement(job, p)))
        .collect()
}

/// Decisions the cycle made that the jobs' reconciles have not written yet, and
/// the messages of waiting jobs. Keyed by job UID and attempt.
#[derive(Default)]
pub struct Assignments {
    inner: Mutex<AssignmentMaps>,
}

#[derive(Default)]
struct AssignmentMaps {
    placed: HashMap<(String, u32), PlacementStatus>,
    /// Placements of `placed` this process has written (or handed to the
    /// status writer): a cached job without them only lags the write.
    recorded: std::collections::HashSet<(String, u32)>,
    /// The last verdict, and when the job was last told of a change.
    waiting: HashMap<(String, u32), (Verdict, Instant)>,
}

/// How often a waiting job is told of a new message of the same kind (the
/// largest free slot moved, say). Every cycle's message would re-run and
/// re-write every waiting job each cycle; with a few hundred waiting, that
/// floods the reconcile queue, whose held requests are taken in no fair
/// order, and jobs with real changes (a pod that ended) starved there.
pub const WAIT_MESSAGE_REFRESH: Duration = Duration::from_secs(10);

impl Assignments {
    /// The cycle's placement for this attempt, if it made one.
    pub fn placement(&self, uid: &str, attempt: u32) -> Option<PlacementStatus> {
        let maps = self.inner.lock().expect("assignments lock");
        maps.placed.get(&(uid.to_string(), attempt)).cloned()
    }

    /// Notes that the placement of this attempt is written (or held for the
    /// status writer), so a cached job that lacks it only lags.
    pub fn mark_recorded(&self, uid: &str, attempt: u32) {
        let mut maps = self.inner.lock().expect("assignments lock");
        if maps.placed.contains_key(&(uid.to_string(), attempt)) {
            maps.recorded.insert((uid.to_string(), attempt));
        }
    }

    /// Undoes [`Assignments::mark_recorded`]: the write did not happen.
    pub fn unmark_recorded(&self, uid: &str, attempt: u32) {
        let mut maps = self.inner.lock().expect("assignments lock");
        maps.recorded.remove(&(uid.to_string(), attempt));
    }

    /// True when this process wrote the placement of this attempt already.
    pub fn is_recorded(&self, uid: &str, attempt: u32) -> bool {
        let maps = self.inner.lock().expect("assignments lock");
        maps.recorded.contains(&(uid.to_string(), attempt))
    }

    /// Why the attempt waits, if the cycle said so.
    pub fn waiting(&self, uid: &str, attempt: u32) -> Option<Verdict> {
        let maps = self.inner.lock().expect("assignments lock");
        maps.waiting
            .get(&(uid.to_string(), attempt))
            .map(|(verdict, _)| verdict.clone())
    }

    /// Records a verdict; returns true when the job should be told: a
    /// placement, a first wait, a wait of another kind (`never_fits`
    /// flipped), or a new message [`WAIT_MESSAGE_REFRESH`] after the job was
    /// last told. The latest verdict is kept either way.
    pub fn record(&self, uid: &str, attempt: u32, verdict: Verdict) -> bool {
        self.record_at(uid, attempt, verdict, Instant::now())
    }

    /// [`Assignments::record`] at `now`.
    pub fn record_at(&self, uid: &str, attempt: u32, verdict: Verdict, now: Instant) -> bool {
        let mut maps = self.inner.lock().expect("assignments lock");
        let key = (uid.to_string(), attempt);
        match verdict {
            Verdict::Place(placement) => {
                maps.waiting.remove(&key);
                maps.recorded.remove(&key);
                maps.placed.insert(key, placement);
                true
            }
            wait => {
                let tell = match maps.waiting.get(&key) {
                    None => true,
                    Some((last, _)) if *last == wait => false,
                    Some((last, told)) => {
                        never_fits(last) != never_fits(&wait)
                            || now.saturating_duration_since(*told) >= WAIT_MESSAGE_REFRESH
                    }
                };
                let told = match maps.waiting.get(&key) {
                    Some((_, told)) if !tell => *told,
                    _ => now,
                };
                maps.waiting.insert(key, (wait, told));
                tell
            }
        }
    }

    /// Assignments whose job is alive and has not yet shown them in status.
    /// Entries that status now shows, or whose job is gone, are dropped.
    pub fn pending_ledger(&self, jobs: &[&TrainingJob]) -> Vec<Placement> {
        let mut maps = self.inner.lock().expect("assignments lock");
        let live: HashMap<String, &TrainingJob> = jobs
            .iter()
            .filter_map(|j| j.metadata.uid.clone().map(|uid| (uid, *j)))
            .collect();
        let mut ledger = Vec::new();
        maps.placed.retain(|(uid, attempt), placement| {
            let Some(job) = live.get(uid) else {
                return false;
            };
            let status = job.status.as_ref();
            let terminal = status.is_some_and(|s| s.phase.is_terminal());
            let moved_on = status.is_some_and(|s| s.attempt > *attempt);
            if terminal || moved_on || recorded(job).is_some_and(|p| p.attempt == *attempt) {
                return false;
            }
            ledger.push(recorded_placement(job, placement));
            true
        });
        let AssignmentMaps {
            placed,
            recorded,
            waiting,
        } = &mut *maps;
        recorded.retain(|key| placed.contains_key(key));
        waiting.retain(|(uid, _), _| live.contains_key(uid));
        ledger
    }

    /// Forgets everything about a job (deleted or finished).
    pub fn forget(&self, uid: &str) {
        let mut maps = self.inner.lock().expect("assignments lock");
        maps.placed.retain(|(u, _), _| u != uid);
        maps.recorded.retain(|(u, _)| u != uid);
        maps.waiting.retain(|(u, _), _| u != uid);
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
