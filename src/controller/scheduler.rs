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

use super::cluster_view::{
    ClusterView, compute_percent, compute_thousandths, job_key, job_request, recorded_placement,
};
use crate::api::{AssignedGpu, ElasticPlacement, GpuModelBudget, PlacementStatus, TrainingJob};
use crate::place::elastic::{self, Shape};
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

/// When running jobs are expected to end, for elastic placement's estimate
/// of how long a job would wait for its preferred shape.
#[derive(Clone, Debug, Default)]
pub struct ExpectedEnds {
    /// Now, in the clock of `ends`.
    pub now: f64,
    /// Running placements with the time each is expected to end. A running
    /// job without an expected end is left out: it makes no room that can
    /// be counted on.
    pub ends: Vec<(f64, Placement)>,
}

/// Plans one cycle: rebuilds the ledger from `placed` (placements in status and
/// not-yet-written assignments) and places `waiting` in order, knowing no
/// running job's expected end, so elastic placement estimates no wait
/// ([`plan_cycle_at`]; the controller's cycle passes the ends,
/// `progress::expected_ends`).
pub fn plan_cycle(
    view: &ClusterView,
    placed: &[Placement],
    waiting: &[&TrainingJob],
    policy: Policy,
) -> Vec<(String, Verdict)> {
    plan_cycle_at(view, placed, waiting, policy, &ExpectedEnds::default())
}

/// [`plan_cycle`] with the running jobs' expected ends.
pub fn plan_cycle_at(
    view: &ClusterView,
    placed: &[Placement],
    waiting: &[&TrainingJob],
    policy: Policy,
    ends: &ExpectedEnds,
) -> Vec<(String, Verdict)> {
    let mut placer = match Placer::new(&view.inventory, policy) {
        Ok(placer) => placer,
        Err(error) => return unusable_inventory(&error, waiting),
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
        observe_running(&mut placer, placement);
    }
    plan_on(&mut placer, view, waiting, ends)
}

/// Every waiting job waits: the inventory cannot be placed on.
pub fn unusable_inventory(
    error: &crate::place::PlaceError,
    waiting: &[&TrainingJob],
) -> Vec<(String, Verdict)> {
    let message = format!("no usable GPU inventory: {error}");
    waiting
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
        .collect()
}

/// Shows the policy a running placement (what it learns the job mix from).
pub fn observe_running(placer: &mut Placer, placement: &Placement) {
    let running = JobRequest {
        id: placement.job_id.clone(),
        gpus: placement.gpu_indices.len() as u32,
        gpu_budget: placement.gpu_budget,
        gpu_compute: placement.gpu_compute,
        cpu_milli: placement.cpu_milli,
        memory_bytes: placement.memory_bytes,
        gpu_models: Vec::new(),
        tolerations: Vec::new(),
    };
    let _ = placer.observe(&running);
}

/// Places `waiting` in order (priority, then creation time, then key) on a
/// placer that holds the cluster's placements already; what it places stays
/// committed in `placer`.
pub fn plan_on(
    placer: &mut Placer,
    view: &ClusterView,
    waiting: &[&TrainingJob],
    ends: &ExpectedEnds,
) -> Vec<(String, Verdict)> {
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
        .map(|job| {
            let verdict = match place_one(placer, view, job) {
                Verdict::Place(placement) => Verdict::Place(placement),
                wait => place_elastic(placer, view, job, ends).unwrap_or(wait),
            };
            (job_key(job), verdict)
        })
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
    let mut order: Vec<&GpuModelBudget> = per_model.iter().collect();
    order.sort_by_key(|b| (model_capacity(view, &b.gpu_model), b.gpu_model.clone()));
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

/// Elastic placement of a job whose preferred shape fits nowhere now: the
/// fastest of its smaller shapes (`status.elasticShapes`, filled for elastic
/// jobs only) that fits now, when starting slower now beats waiting for the
/// preferred shape ([`elastic::choose_smaller`]). The job's remaining work is
/// its `spec.expectedDuration` ([`super::progress::remaining_seconds`]); without one
/// it is unknown, so any known wait is taken over a slower start. Without a
/// known wait (no running job's expected end makes room) the smaller shape
/// starts. GPU
/// models are tried as [`place_per_model`] tries them, each with its own
/// preferred budget and shapes. `None`: the job keeps waiting.
fn place_elastic(
    placer: &mut Placer,
    view: &ClusterView,
    job: &TrainingJob,
    ends: &ExpectedEnds,
) -> Option<Verdict> {
    let status = job.status.as_ref()?;
    if status.elastic_shapes.is_empty() {
        return None;
    }
    let spec = &job.spec;
    // (GPU model, preferred micro-batch, preferred budget), in the order the
    // models are tried.
    let preferred: Vec<(Option<&GpuModelBudget>, u32, u64)> = if status.gpu_model_budgets.is_empty()
    {
        vec![(
            None,
            status.micro_batch.unwrap_or(spec.batch.micro),
            status.budget_bytes?,
        )]
    } else {
        let mut order: Vec<&GpuModelBudget> = status.gpu_model_budgets.iter().collect();
        order.sort_by_key(|b| (model_capacity(view, &b.gpu_model), b.gpu_model.clone()));
        order
            .into_iter()
            .map(|b| (Some(b), b.micro_batch, b.budget_bytes))
            .collect()
    };
    for (model, micro, budget) in preferred {
        let name = model.map(|m| m.gpu_model.as_str());
        let shapes: Vec<Shape> = status
            .elastic_shapes
            .iter()
            .filter(|s| s.gpu_model.as_deref() == name && s.micro_batch < micro)
            .map(|s| Shape {
                micro: s.micro_batch,
                budget: s.budget_bytes,
                relative_time: s.relative_step_time,
            })
            .collect();
        if shapes.is_empty() {
            continue;
        }
        // A budget predicted for one GPU model waits for a GPU of that model.
        let state = placer.state();
        let usable = |node: usize, gpu: usize| {
            let Some(name) = name else {
                return true;
            };
            let node = &state.nodes()[node].name;
            view.inventory
                .nodes
                .iter()
                .find(|n| &n.name == node)
                .and_then(|n| n.gpus.get(gpu))
                .is_some_and(|g| g.model == name)
        };
        let wait = elastic::expected_wait_on(
            state,
            ends.ends.iter().map(|(end, p)| (*end, p)),
            elastic::Hole::new(spec.gpus.max(1), budget)
                .with_compute(compute_thousandths(compute_percent(job))),
            ends.now,
            usable,
        );
        let mut placed = None;
        let choice = elastic::choose_smaller(
            &shapes,
            budget,
            super::progress::remaining_seconds(job),
            wait,
            |shape| match place_with(placer, view, job, shape.budget, model) {
                Verdict::Place(placement) => {
                    placed = Some(placement);
                    true
                }
                Verdict::Wait { .. } => false,
            },
        );
        if let (Some(choice), Some(mut placement)) = (choice, placed) {
            placement.micro_batch = Some(choice.shape.micro);
            placement.elastic = Some(ElasticPlacement {
                preferred_micro_batch: micro,
                preferred_grad_accum: spec.batch.global / (micro.max(1) * spec.gpus.max(1)),
                preferred_budget_bytes: budget,
                relative_step_time: choice.shape.relative_time,
                expected_wait_seconds: choice.expected_wait,
            });
            return Some(Verdict::Place(placement));
        }
    }
    None
}

/// The largest capacity of a GPU of `model` in the view (`u64::MAX` when
/// none has it).
fn model_capacity(view: &ClusterView, model: &str) -> u64 {
    view.inventory
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .filter(|g| g.model == model)
        .map(|g| g.capacity)
        .max()
        .unwrap_or(u64::MAX)
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
                compute_percent: compute_percent(job),
                gpu_model: model.map(|m| m.gpu_model.clone()),
                micro_batch: model.map(|m| m.micro_batch),
                elastic: None,
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
    /// By job UID, then attempt.
    placed: HashMap<String, std::collections::BTreeMap<u32, PlacementStatus>>,
    /// Placements of `placed` this process has written (or handed to the
    /// status writer): a cached job without them only lags the write.
    recorded: std::collections::HashSet<(String, u32)>,
    /// The last verdict, and when the job was last told of a change.
    waiting: HashMap<(String, u32), (Verdict, Instant)>,
    /// The latest attempt this process wrote a status of, by job UID: a
    /// cached job at an earlier attempt only lags that write.
    written: HashMap<String, u32>,
    /// Jobs whose placements (`placed`) changed since the cycle's ledger
    /// last took them ([`Locked::take_touched`]).
    touched: std::collections::HashSet<String>,
}

impl AssignmentMaps {
    fn is_placed(&self, uid: &str, attempt: u32) -> bool {
        self.placed
            .get(uid)
            .is_some_and(|a| a.contains_key(&attempt))
    }

    fn is_taken(&self, uid: &str, attempt: u32) -> bool {
        self.is_placed(uid, attempt) || self.written.get(uid).is_some_and(|w| *w > attempt)
    }
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
        maps.placed.get(uid)?.get(&attempt).cloned()
    }

    /// Notes that the placement of this attempt is written (or held for the
    /// status writer), so a cached job that lacks it only lags.
    pub fn mark_recorded(&self, uid: &str, attempt: u32) {
        let mut maps = self.inner.lock().expect("assignments lock");
        if maps.is_placed(uid, attempt) {
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
                maps.touched.insert(key.0.clone());
                maps.placed
                    .entry(key.0)
                    .or_default()
                    .insert(attempt, placement);
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
        let AssignmentMaps {
            placed,
            recorded,
            waiting,
            touched,
            written,
        } = &mut *maps;
        placed.retain(|uid, attempts| {
            let Some(job) = live.get(uid) else {
                touched.insert(uid.clone());
                return false;
            };
            attempts.retain(|attempt, placement| {
                if !still_pending(job, *attempt) {
                    touched.insert(uid.clone());
                    return false;
                }
                ledger.push(recorded_placement(job, placement));
                true
            });
            !attempts.is_empty()
        });
        recorded.retain(|(uid, attempt)| placed.get(uid).is_some_and(|a| a.contains_key(attempt)));
        waiting.retain(|(uid, _), _| live.contains_key(uid));
        written.retain(|uid, _| live.contains_key(uid));
        ledger
    }

    /// The assignments, locked for one pass of the cycle's ledger.
    pub fn lock(&self) -> Locked<'_> {
        Locked(self.inner.lock().expect("assignments lock"))
    }

    /// True when the cycle holds a placement for this attempt, or this
    /// process already wrote a status of a later attempt (the cached job that
    /// shows this one lags): either way the attempt is not waiting.
    pub fn is_taken(&self, uid: &str, attempt: u32) -> bool {
        self.inner
            .lock()
            .expect("assignments lock")
            .is_taken(uid, attempt)
    }

    /// Forgets the job's assignments of attempts before `attempt`: this
    /// process wrote a status of `attempt`, so they are not pending any more.
    /// Until the cache shows that status, a reconcile of the cached job at an
    /// older version would otherwise take such an assignment as a placement
    /// still to record and create its pod again.
    pub fn forget_before(&self, uid: &str, attempt: u32) {
        let mut maps = self.inner.lock().expect("assignments lock");
        let written = maps.written.entry(uid.to_string()).or_default();
        if attempt > *written {
            *written = attempt;
            if attempt > 1 {
                // The cycle must stop seeing the cached earlier attempt as waiting.
                maps.touched.insert(uid.to_string());
            }
        }
        let Some(attempts) = maps.placed.get_mut(uid) else {
            return;
        };
        let before = attempts.len();
        attempts.retain(|a, _| *a >= attempt);
        let emptied = attempts.is_empty();
        if attempts.len() != before {
            maps.touched.insert(uid.to_string());
        }
        if emptied {
            maps.placed.remove(uid);
        }
        maps.recorded.retain(|(u, a)| u != uid || *a >= attempt);
        maps.waiting.retain(|(u, a), _| u != uid || *a >= attempt);
    }

    /// Forgets everything about a job (deleted or finished).
    pub fn forget(&self, uid: &str) {
        let mut maps = self.inner.lock().expect("assignments lock");
        maps.touched.insert(uid.to_string());
        maps.placed.remove(uid);
        maps.written.remove(uid);
        maps.recorded.retain(|(u, _)| u != uid);
        maps.waiting.retain(|(u, _), _| u != uid);
    }
}

/// True while an assignment of `attempt` holds memory the job's status does
/// not show: the job is not finished, has not moved on to a later attempt,
/// and its status does not record that attempt's placement.
pub fn still_pending(job: &TrainingJob, attempt: u32) -> bool {
    let status = job.status.as_ref();
    let terminal = status.is_some_and(|s| s.phase.is_terminal());
    let moved_on = status.is_some_and(|s| s.attempt > attempt);
    !(terminal || moved_on || recorded(job).is_some_and(|p| p.attempt == attempt))
}

/// [`Assignments`] locked: what the cycle's ledger reads and prunes, one job
/// at a time, in one consistent state.
pub struct Locked<'a>(std::sync::MutexGuard<'a, AssignmentMaps>);

impl Locked<'_> {
    /// True when the cycle holds a placement for this attempt.
    pub fn is_placed(&self, uid: &str, attempt: u32) -> bool {
        self.0.is_placed(uid, attempt)
    }

    /// [`Assignments::is_taken`].
    pub fn is_taken(&self, uid: &str, attempt: u32) -> bool {
        self.0.is_taken(uid, attempt)
    }

    /// The jobs whose placements changed since the last call.
    pub fn take_touched(&mut self) -> Vec<String> {
        self.0.touched.drain().collect()
    }

    /// [`Assignments::pending_ledger`] for one job (`None`: the job is
    /// gone): drops what is no longer pending and returns the rest, by
    /// attempt.
    pub fn prune(&mut self, uid: &str, job: Option<&TrainingJob>) -> Vec<(u32, PlacementStatus)> {
        let AssignmentMaps {
            placed,
            recorded,
            waiting,
            written,
            ..
        } = &mut *self.0;
        let Some(job) = job else {
            placed.remove(uid);
            written.remove(uid);
            recorded.retain(|(u, _)| u != uid);
            waiting.retain(|(u, _), _| u != uid);
            return Vec::new();
        };
        let Some(attempts) = placed.get_mut(uid) else {
            return Vec::new();
        };
        attempts.retain(|attempt, _| {
            let keep = still_pending(job, *attempt);
            if !keep {
                recorded.remove(&(uid.to_string(), *attempt));
            }
            keep
        });
        let kept: Vec<(u32, PlacementStatus)> =
            attempts.iter().map(|(a, p)| (*a, p.clone())).collect();
        if attempts.is_empty() {
            placed.remove(uid);
        }
        kept
    }

    /// What [`Assignments::pending_ledger`] would return now, changing
    /// nothing (the full rebuild the ledger is checked against).
    pub fn pending_view(&self, jobs: &[&TrainingJob]) -> Vec<Placement> {
        let live: HashMap<&str, &TrainingJob> = jobs
            .iter()
            .filter_map(|j| j.metadata.uid.as_deref().map(|uid| (uid, *j)))
            .collect();
        let mut ledger = Vec::new();
        for (uid, attempts) in &self.0.placed {
            let Some(job) = live.get(uid.as_str()) else {
                continue;
            };
            for (attempt, placement) in attempts {
                if still_pending(job, *attempt) {
                    ledger.push(recorded_placement(job, placement));
                }
            }
        }
        ledger
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
