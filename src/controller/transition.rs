//! The reconcile's status transitions as pure functions.
//!
//! Each step of a TrainingJob's life takes what the reconcile observed (the
//! job's spec and status, the scheduling cycle's decision, the pod's outcome,
//! the node agent's reports) and returns a [`Transition`]: the new status, the
//! side effects to carry out and when to look again. `reconcile.rs` only
//! gathers those facts and carries the result out. It writes the status first
//! and the effects after, so a failed status write repeats the whole step
//! rather than leaving it half done (an OOM'd pod deleted while the status
//! still names it would be created again).
//!
//! ```text
//!   (new) -> Pending -> Placed -> Running -> Succeeded
//!              |  ^        |         |
//!              |  |        +---------+--> OOM -> Retrying -> Placed ...
//!              |  |                  |          (or Failed at the floor)
//!              v  +-- spec fixed     +--> Failed (other exit)
//!           Failed (Invalid)
//! ```

use std::time::Duration;

use crate::api::{
    AttemptRecord, ObservedShape, Phase, PlacementStatus, TrainingJob, TrainingJobStatus,
};

use super::absorbed::{absorbed_message, newly_absorbed};
use super::retry::PodRejection;
use super::status_patch::{
    CONDITION_COMPLETE, CONDITION_INVALID, CONDITION_PLACED, CONDITION_POD_REJECTED, reason,
    set_condition,
};
use crate::job::attempt::{AttemptEnd, NextAttempt, RetriesUsed, next_attempt};
use crate::job::backoff::BatchShape;
use crate::job::budget::{Budget, attempt_budget, gpu_model_budgets, oom_correction};
use crate::job::exit::PodOutcome;
use crate::job::keys::pod_name;
use crate::job::signature::job_signature;
use crate::quantity::human_bytes;

/// Resync period of a job whose pod waits or runs: pod changes and the node
/// agent's reports trigger reconciles of their own, so this is no poll.
pub const POD_RESYNC: Duration = Duration::from_secs(300);
/// Resync of a job that waits for the scheduling cycle.
pub const WAIT_RESYNC: Duration = Duration::from_secs(60);
/// Resync after a write whose own watch event brings the job back (a short
/// requeue would run on the cached object from before the write whenever the
/// watch lags, and repeat the step).
pub const WRITE_RESYNC: Duration = Duration::from_secs(30);
/// Pause before the attempt that follows an OOM.
pub const RETRY_DELAY: Duration = Duration::from_secs(1);

/// History outcome of an attempt that ran out of GPU memory.
pub const OUTCOME_OOM: &str = "OutOfMemory";
/// History outcome of an attempt whose container started without its GPU.
pub const OUTCOME_NO_GPU: &str = "NoGpu";

/// When the reconcile should look at the job again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// Only when the job (or something it watches) changes.
    AwaitChange,
    /// After this long at the latest.
    After(Duration),
}

/// A side effect of a transition, carried out after the status is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Publish an event on the job.
    Event {
        /// Warning rather than Normal.
        warning: bool,
        /// Event reason (PascalCase).
        reason: &'static str,
        /// The event's text.
        note: String,
    },
    /// Delete this pod of the job (an attempt that ran out of memory).
    DeletePod(String),
    /// Drop what the scheduling cycle decided for the job.
    ForgetAssignment,
    /// Ask for a scheduling cycle soon.
    WakeScheduler,
    /// Count an OOM retry.
    CountOomRetry,
    /// Count a placement; the latency since creation is observed for a first
    /// attempt only (a retry's wait starts at its OOM).
    CountPlacement {
        /// The job's first attempt.
        first_attempt: bool,
    },
    /// Observe (predicted - measured) / measured of a finished attempt.
    PredictionError(f64),
}

/// The result of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// What was decided, for the decision log (`predicted`, `placed`, ...).
    pub decision: &'static str,
    /// The new status (written when it differs from the old one).
    pub status: TrainingJobStatus,
    /// What to do after the status is written, in order.
    pub effects: Vec<Effect>,
    /// When to look again.
    pub requeue: Requeue,
}

/// Where a job stands, and the status its next step starts from.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Finished: nothing to do until the job changes.
    Done,
    /// Predict the attempt's budget.
    Predict {
        /// The status to start from.
        status: TrainingJobStatus,
        /// The attempt (1 for a new job).
        attempt: u32,
        /// The spec changed while the job waited: the cycle's decision for the
        /// old budget no longer holds.
        forget_assignment: bool,
    },
    /// Write the placement the cycle made.
    RecordPlacement {
        /// The status to start from.
        status: TrainingJobStatus,
        /// The cycle's placement.
        placement: PlacementStatus,
    },
    /// The cycle has not placed the attempt: say why it waits.
    ReportWaiting {
        /// The status to start from.
        status: TrainingJobStatus,
        /// The attempt the cycle's verdict must be for.
        attempt: u32,
    },
    /// The attempt is placed: create or follow its pod.
    FollowPod {
        /// The status to start from.
        status: TrainingJobStatus,
        /// The recorded placement.
        placement: PlacementStatus,
    },
}

/// True when the status carries a true `Invalid` condition.
pub fn is_invalid(status: &TrainingJobStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_INVALID && c.status == "True")
}

/// True when the status carries a true `PodRejected` condition.
pub fn is_pod_rejected(status: &TrainingJobStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_POD_REJECTED && c.status == "True")
}

/// Decides the job's next step. `assigned` gives the scheduling cycle's
/// placement for an attempt, if it made one.
pub fn next_step(job: &TrainingJob, assigned: impl FnOnce(u32) -> Option<PlacementStatus>) -> Step {
    let mut status = job.status.clone().unwrap_or_default();
    let spec_changed = status.observed_generation.is_some()
        && status.observed_generation != job.metadata.generation;
    if status.phase.is_terminal() {
        // A job that failed validation, or whose pod the API server
        // refused, starts over once its spec is changed; a job that ran
        // keeps its outcome.
        let refused = is_invalid(&status) || is_pod_rejected(&status);
        if !(spec_changed && refused) {
            return Step::Done;
        }
        let generation = job.metadata.generation;
        let mut conditions = status.conditions;
        if conditions.iter().any(|c| c.type_ == CONDITION_POD_REJECTED) {
            set_condition(
                &mut conditions,
                CONDITION_POD_REJECTED,
                false,
                "SpecChanged",
                "the spec changed since the pod was refused",
                generation,
            );
        }
        status = TrainingJobStatus {
            conditions,
            ..TrainingJobStatus::default()
        };
    }
    let attempt = status.attempt.max(1);
    let recorded = status.recorded_placement().cloned();
    if spec_changed && recorded.is_none() {
        // A waiting job is predicted again from its new spec. A placed job
        // keeps running as it was placed.
        if attempt == 1 {
            status.micro_batch = None;
        }
        return Step::Predict {
            status,
            attempt,
            forget_assignment: true,
        };
    }
    if status.budget_bytes.is_none() || status.attempt == 0 {
        return Step::Predict {
            status,
            attempt,
            forget_assignment: false,
        };
    }
    match recorded {
        Some(placement) => Step::FollowPod { status, placement },
        None => match assigned(attempt) {
            Some(placement) => Step::RecordPlacement { status, placement },
            None => Step::ReportWaiting { status, attempt },
        },
    }
}

/// True when the prediction step should look for a starting micro-batch
/// learned from other jobs of the same model: a first attempt whose
/// micro-batch is not set yet.
pub fn wants_learned_start(status: &TrainingJobStatus, attempt: u32) -> bool {
    attempt == 1 && status.micro_batch.is_none()
}

/// What the prediction step reads besides the job.
pub struct PredictFacts<'a> {
    /// The attempt to predict.
    pub attempt: u32,
    /// A starting micro-batch learned from another job, and that job's name
    /// (asked for only when [`wants_learned_start`]).
    pub learned: Option<(u32, String)>,
    /// The profile ConfigMap's content for profile-based jobs, or why it could
    /// not be read.
    pub profile: Result<Option<&'a str>, String>,
    /// The highest peak measured for a model signature.
    pub measured: &'a dyn Fn(&str) -> Option<u64>,
    /// The cluster's GPU models with the largest capacity of each.
    pub gpu_models: &'a [(String, u64)],
    /// Whether jobs that do not set `spec.batch.elastic` are elastic.
    pub elastic_default: bool,
    /// The compute share, percent, of jobs that do not set
    /// `spec.gpuComputePercent` (`None`: theirs is not counted).
    pub compute_default: Option<u32>,
}

/// Predicts the attempt's budget: the job waits for the cycle with it, or
/// fails as invalid when its spec cannot be run.
pub fn predict(
    job: &TrainingJob,
    mut status: TrainingJobStatus,
    facts: PredictFacts,
) -> Transition {
    let spec = &job.spec;
    let generation = job.metadata.generation;
    let attempt = facts.attempt;
    let micro = super::elastic::restart_micro(&status, attempt, OUTCOME_OOM)
        .or(status.micro_batch)
        .or(facts.learned.as_ref().map(|(m, _)| *m))
        .unwrap_or(spec.batch.micro);
    status.preferred_micro_batch = None;
    let profile = match facts.profile {
        Ok(profile) => profile,
        Err(message) => return invalid(job, status, &message),
    };
    let signature = job_signature(job, micro);
    let Some(shape) = BatchShape::for_micro(spec.batch.global, micro, spec.gpus) else {
        let message = format!(
            "batch.global {} is not divisible by micro-batch {micro} x {} GPU(s)",
            spec.batch.global, spec.gpus
        );
        return invalid(job, status, &message);
    };
    if let Err(message) = spec.pod_template() {
        return invalid(job, status, &message);
    }
    // Each OOM of the job proved its attempt's budget too small: a retry's
    // predicted (or measured) budget is raised by that ratio, up to the
    // largest GPU it could use.
    let ooms = status
        .history
        .iter()
        .filter(|r| r.outcome == OUTCOME_OOM)
        .count() as u32;
    let largest = facts.gpu_models.iter().map(|(_, c)| *c).max();
    let budget: Budget = match attempt_budget(job, micro, profile, (facts.measured)(&signature)) {
        Ok(budget) => budget.after_ooms(ooms, spec.headroom(), largest),
        Err(message) => return invalid(job, status, &message),
    };
    let auto = spec.batch.auto_micro && attempt == 1;
    if !auto && let Some(message) = never_fits(job, &budget, micro, largest) {
        return fail_until_changed(
            job,
            status,
            FailedFor {
                decision: "never fits",
                condition: (CONDITION_INVALID, "NeverFits", &message),
                complete_reason: reason::FAILED,
                event_reason: reason::INVALID,
                message: message.clone(),
            },
        );
    }
    // The budget for each GPU model the job could land on; the cycle gives it
    // the one of the model it places it on.
    status.gpu_model_budgets =
        gpu_model_budgets(job, micro, auto, facts.gpu_models, profile, &|m| {
            (facts.measured)(&job_signature(job, m))
        });
    for b in &mut status.gpu_model_budgets {
        let capacity = facts
            .gpu_models
            .iter()
            .find(|(m, _)| *m == b.gpu_model)
            .map(|(_, c)| *c);
        let scaled = Budget {
            predicted: b.predicted_bytes,
            breakdown: None,
            budget: b.budget_bytes,
            source: budget.source,
        }
        .after_ooms(ooms, spec.headroom(), capacity);
        b.predicted_bytes = scaled.predicted;
        b.budget_bytes = scaled.budget;
    }
    status.compute_percent = spec.gpu_compute_percent.or(facts.compute_default);
    // An elastic job's smaller shapes, for when its own fits no GPU now.
    status.elastic_shapes = if super::elastic::is_elastic(spec, facts.elastic_default) {
        super::elastic::smaller_shapes(
            job,
            &super::elastic::ShapeFacts {
                micro: shape.micro,
                budget: budget.budget,
                per_model: &status.gpu_model_budgets,
                ooms,
                gpu_models: facts.gpu_models,
                profile,
                measured: facts.measured,
            },
        )
    } else {
        Vec::new()
    };
    status.attempt = attempt;
    status.phase = if attempt > 1 {
        Phase::Retrying
    } else {
        Phase::Pending
    };
    status.predicted_bytes = Some(budget.predicted);
    status.predicted = Some(human_bytes(budget.predicted));
    status.breakdown = budget.breakdown.clone();
    status.budget_bytes = Some(budget.budget);
    status.prediction_source = Some(budget.source.into());
    status.model_signature = Some(signature);
    status.micro_batch = Some(shape.micro);
    status.grad_accum = Some(shape.accum);
    status.batch_shape = Some(shape.display());
    status.observed_generation = generation;
    let raised = if ooms > 0 && budget.source != "request" {
        format!(
            ", raised x{:.2} after {ooms} OOM(s)",
            oom_correction(ooms, spec.headroom())
        )
    } else {
        String::new()
    };
    let start = facts.learned.map_or(String::new(), |(m, from)| {
        format!("; starts at micro-batch {m}, where job {from} of the same model absorbed its OOMs")
    });
    status.message = Some(format!(
        "budget {} per GPU ({} from {}{raised}){start}",
        human_bytes(budget.budget),
        human_bytes(budget.predicted),
        budget.source
    ));
    set_condition(
        &mut status.conditions,
        CONDITION_INVALID,
        false,
        "Valid",
        "the spec can be run",
        generation,
    );
    let note = format!(
        "attempt {attempt}: predicted peak {} per GPU ({}), budget {}",
        human_bytes(budget.predicted),
        budget.source,
        human_bytes(budget.budget)
    );
    Transition {
        decision: "predicted",
        status,
        effects: vec![
            Effect::Event {
                warning: false,
                reason: reason::PREDICTED,
                note,
            },
            Effect::WakeScheduler,
        ],
        requeue: Requeue::After(WAIT_RESYNC),
    }
}

/// A prediction the reconcile holds in memory until the scheduling cycle's
/// verdict, instead of writing it at once (see [`super::held`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Deferred {
    /// The predicted status.
    pub status: TrainingJobStatus,
    /// The prediction's event note, sent with the write that records it.
    pub note: String,
    /// The effects to carry out now (the scheduler's wake-up).
    pub effects: Vec<Effect>,
    /// When to look again.
    pub requeue: Requeue,
}

/// What to do with the prediction step's transition.
#[derive(Clone, Debug, PartialEq)]
pub enum Prediction {
    /// Hold it until the cycle's verdict.
    Hold(Deferred),
    /// Write it at once (an invalid spec).
    Write(Transition),
}

/// Splits a prediction into what is held until the cycle's verdict: the
/// status and the note of its event. Any other transition (an invalid spec)
/// is given back to be written at once.
pub fn defer_prediction(transition: Transition) -> Prediction {
    if transition.decision != "predicted" {
        return Prediction::Write(transition);
    }
    let mut note = None;
    let mut effects = Vec::new();
    for effect in transition.effects {
        match effect {
            Effect::Event {
                reason: reason::PREDICTED,
                note: n,
                ..
            } => note = Some(n),
            other => effects.push(other),
        }
    }
    Prediction::Hold(Deferred {
        status: transition.status,
        note: note.unwrap_or_default(),
        effects,
        requeue: transition.requeue,
    })
}

/// The step taken on a held prediction (`held_note`: its event's note),
/// against the status last written (`written`). A step that writes records
/// the prediction with it, and its first event carries the prediction's
/// note (the prediction's own event when the step has none). A cycle that
/// has not decided yet writes nothing: the prediction stays held.
pub fn with_held(
    mut transition: Transition,
    written: &TrainingJobStatus,
    held_note: &str,
) -> Transition {
    if transition.decision == "unscheduled" {
        transition.status = written.clone();
        return transition;
    }
    let first_event = transition
        .effects
        .iter_mut()
        .find_map(|effect| match effect {
            Effect::Event { note, .. } => Some(note),
            _ => None,
        });
    match first_event {
        Some(note) => *note = format!("{held_note}; {note}"),
        None => transition.effects.insert(
            0,
            Effect::Event {
                warning: false,
                reason: reason::PREDICTED,
                note: held_note.to_string(),
            },
        ),
    }
    transition
}

/// The spec cannot be run: the job fails with an `Invalid` condition until
/// its spec changes.
pub fn invalid(job: &TrainingJob, status: TrainingJobStatus, message: &str) -> Transition {
    fail_until_changed(
        job,
        status,
        FailedFor {
            decision: "invalid",
            condition: (CONDITION_INVALID, "InvalidSpec", message),
            complete_reason: reason::FAILED,
            event_reason: reason::INVALID,
            message: message.to_string(),
        },
    )
}

/// How often a job whose profile is being captured looks at its pod.
pub const PROFILE_POLL: Duration = Duration::from_secs(2);

/// The job's allocation profile is being captured (`autoprofile`): phase
/// `Profiling` with where, looked at again in [`PROFILE_POLL`].
pub fn profiling(job: &TrainingJob, mut status: TrainingJobStatus, message: &str) -> Transition {
    status.phase = Phase::Profiling;
    status.message = Some(message.to_string());
    status.observed_generation = job.metadata.generation;
    Transition {
        decision: "profiling",
        status,
        effects: Vec::new(),
        requeue: Requeue::After(PROFILE_POLL),
    }
}

/// The capture of the job's profile failed and nothing else gives it a
/// budget: it fails with the capture's words until its spec changes.
pub fn profile_failed(job: &TrainingJob, status: TrainingJobStatus, message: &str) -> Transition {
    let message = format!(
        "automatic profiling failed: {message}; set spec.memory.request to run with a budget you choose"
    );
    fail_until_changed(
        job,
        status,
        FailedFor {
            decision: "profile failed",
            condition: (CONDITION_INVALID, "ProfileFailed", &message),
            complete_reason: reason::FAILED,
            event_reason: reason::PROFILE_FAILED,
            message: message.clone(),
        },
    )
}

/// Why a job fails until its spec changes: the decision, the condition set
/// true (type, reason, message), the reasons of `Complete` and of the
/// warning event, and the status message.
struct FailedFor<'a> {
    decision: &'static str,
    condition: (&'a str, &'a str, &'a str),
    complete_reason: &'a str,
    event_reason: &'static str,
    message: String,
}

/// The job fails with `why`: phase `Failed`, its condition and `Complete`
/// true, one warning event, and nothing more until the spec changes.
fn fail_until_changed(
    job: &TrainingJob,
    mut status: TrainingJobStatus,
    why: FailedFor,
) -> Transition {
    let generation = job.metadata.generation;
    let (type_, reason, condition_message) = why.condition;
    status.phase = Phase::Failed;
    status.message = Some(why.message.clone());
    status.observed_generation = generation;
    set_condition(
        &mut status.conditions,
        type_,
        true,
        reason,
        condition_message,
        generation,
    );
    set_condition(
        &mut status.conditions,
        CONDITION_COMPLETE,
        true,
        why.complete_reason,
        &why.message,
        generation,
    );
    Transition {
        decision: why.decision,
        status,
        effects: vec![Effect::Event {
            warning: true,
            reason: why.event_reason,
            note: why.message,
        }],
        requeue: Requeue::AwaitChange,
    }
}

/// The API server refused the attempt's pod (Pod Security, an admission
/// policy, a quota, validation): the job fails with the server's words, its
/// placement is released (a failed job holds none), and it is not tried
/// again until its spec changes.
pub fn pod_rejected(
    job: &TrainingJob,
    status: TrainingJobStatus,
    rejection: &PodRejection,
) -> Transition {
    let message = format!(
        "the API server refused the attempt's pod ({}): {}; change the job's template to try again",
        rejection.reason, rejection.message
    );
    fail_until_changed(
        job,
        status,
        FailedFor {
            decision: "pod rejected",
            condition: (CONDITION_POD_REJECTED, rejection.reason, &rejection.message),
            complete_reason: reason::POD_REJECTED,
            event_reason: reason::POD_REJECTED,
            message,
        },
    )
}

/// The most memory one GPU is made with (NVIDIA B300, 288 GB of HBM3e): a job
/// that needs more per GPU can run nowhere, whatever node joins the cluster.
pub const LARGEST_GPU_MADE_BYTES: u64 = 288_000_000_000;

/// Why a job can never run, when its budget per GPU is larger than any GPU
/// made ([`LARGEST_GPU_MADE_BYTES`]) and every GPU of the cluster
/// (`cluster_largest`), with the changes of its spec that would make it fit
/// the largest GPU vramfit has a profile of (`predict::fit`). A job only
/// larger than the cluster's GPUs waits for a larger one instead.
pub fn never_fits(
    job: &TrainingJob,
    budget: &Budget,
    micro: u32,
    cluster_largest: Option<u64>,
) -> Option<String> {
    let largest = LARGEST_GPU_MADE_BYTES.max(cluster_largest.unwrap_or(0));
    if budget.budget <= largest {
        return None;
    }
    let spec = &job.spec;
    let source = match budget.source {
        "request" => "spec.memory.request".to_string(),
        other => format!("{} from {other}", human_bytes(budget.predicted)),
    };
    let need = format!(
        "never fits: needs {} per GPU ({source}), more than any GPU has ({} at most)",
        human_bytes(budget.budget),
        human_bytes(largest)
    );
    if budget.source != "model" {
        return Some(need);
    }
    let profile = crate::predict::GPU_PROFILES
        .iter()
        .max_by_key(|g| g.capacity_bytes)?;
    let shape = crate::predict::JobShape {
        gpus: spec.gpus,
        global_batch: spec.batch.global,
        micro_batch: micro,
    };
    let options = crate::predict::fit::fit_options(
        &spec.model,
        &shape,
        profile,
        profile.capacity_bytes,
        spec.headroom(),
    );
    let advice = crate::predict::fit::fit_advice(
        &options,
        profile.capacity_bytes,
        spec.headroom(),
        profile.name,
    );
    Some(format!("{need}; {advice}"))
}

/// Records the cycle's placement. A placement on a GPU model with its own
/// prediction takes that model's micro-batch and budget.
pub fn place(
    job: &TrainingJob,
    mut status: TrainingJobStatus,
    placement: PlacementStatus,
) -> Transition {
    let gpus: Vec<String> = placement.gpus.iter().map(|g| g.index.to_string()).collect();
    let message = format!(
        "placed on {} GPU {} with {} per GPU (fraction {:.3})",
        placement.node,
        gpus.join(","),
        human_bytes(placement.budget_bytes),
        placement.memory_fraction
    );
    let chosen = placement.gpu_model.as_ref().and_then(|model| {
        status
            .gpu_model_budgets
            .iter()
            .find(|b| &b.gpu_model == model)
            .cloned()
    });
    if let Some(chosen) = chosen {
        if let Some(shape) =
            BatchShape::for_micro(job.spec.batch.global, chosen.micro_batch, job.spec.gpus)
        {
            status.micro_batch = Some(shape.micro);
            status.grad_accum = Some(shape.accum);
            status.batch_shape = Some(shape.display());
            status.model_signature = Some(job_signature(job, shape.micro));
        }
        status.predicted_bytes = Some(chosen.predicted_bytes);
        status.predicted = Some(human_bytes(chosen.predicted_bytes));
        status.budget_bytes = Some(chosen.budget_bytes);
    }
    let elastic = placement
        .elastic
        .as_ref()
        .and_then(|elastic| elastic_shape(job, &mut status, &placement, elastic));
    let message = match &elastic {
        Some((summary, _)) => format!("{message}; {summary}"),
        None => message,
    };
    let first_attempt = status.history.is_empty();
    status.phase = Phase::Placed;
    status.gpu = Some(gpus.join(","));
    status.pod_name = Some(pod_name(
        job.metadata.name.as_deref().unwrap_or_default(),
        placement.attempt,
    ));
    status.placement = Some(placement);
    status.message = Some(message.clone());
    set_condition(
        &mut status.conditions,
        CONDITION_PLACED,
        true,
        reason::PLACED,
        &message,
        job.metadata.generation,
    );
    Transition {
        decision: "placed",
        status,
        effects: vec![
            Effect::CountPlacement { first_attempt },
            Effect::Event {
                warning: false,
                reason: reason::PLACED,
                note: message,
            },
        ]
        .into_iter()
        .chain(elastic.map(|(_, note)| Effect::Event {
            warning: false,
            reason: reason::ELASTIC_SHAPE,
            note,
        }))
        .collect(),
        // The pod is created before this status is written; the next
        // reconcile, triggered by the watch events of both, follows it.
        requeue: Requeue::After(WRITE_RESYNC),
    }
}

/// Takes the smaller shape elastic placement chose into the status (the
/// attempt runs it; an OOM halves it) and keeps the preferred micro-batch
/// for an attempt that follows without an OOM. Returns the change in
/// words, for the placement's message, and the `ElasticShape` event's note; `None` (the placement's
/// shape left as predicted) when the placement names no valid micro-batch.
fn elastic_shape(
    job: &TrainingJob,
    status: &mut TrainingJobStatus,
    placement: &PlacementStatus,
    elastic: &crate::api::ElasticPlacement,
) -> Option<(String, String)> {
    let spec = &job.spec;
    let shape = BatchShape::for_micro(spec.batch.global, placement.micro_batch?, spec.gpus)?;
    let preferred = BatchShape {
        micro: elastic.preferred_micro_batch,
        accum: elastic.preferred_grad_accum,
    };
    let predicted = status
        .elastic_shapes
        .iter()
        .find(|s| s.gpu_model == placement.gpu_model && s.micro_batch == shape.micro)
        .map(|s| s.predicted_bytes);
    status.micro_batch = Some(shape.micro);
    status.grad_accum = Some(shape.accum);
    status.batch_shape = Some(shape.display());
    status.model_signature = Some(job_signature(job, shape.micro));
    status.budget_bytes = Some(placement.budget_bytes);
    if let Some(predicted) = predicted {
        status.predicted_bytes = Some(predicted);
        status.predicted = Some(human_bytes(predicted));
    }
    status.preferred_micro_batch = Some(preferred.micro);
    let note = super::elastic::event_note(
        preferred,
        elastic.preferred_budget_bytes,
        shape,
        placement.budget_bytes,
        elastic.relative_step_time,
        elastic.expected_wait_seconds,
    );
    let summary = format!(
        "elastic shape {} instead of {}",
        shape.display(),
        preferred.display()
    );
    Some((summary, note))
}

/// Why the attempt waits, from the cycle's verdict (`message`, and whether no
/// GPU of the cluster could ever hold it). No verdict yet: ask for a cycle.
pub fn wait(
    job: &TrainingJob,
    mut status: TrainingJobStatus,
    verdict: Option<(&str, bool)>,
) -> Transition {
    let Some((message, never_fits)) = verdict else {
        return Transition {
            decision: "unscheduled",
            status,
            effects: vec![Effect::WakeScheduler],
            requeue: Requeue::After(WRITE_RESYNC),
        };
    };
    let mut effects = Vec::new();
    if status.message.as_deref() != Some(message) {
        let why = if never_fits {
            reason::FITS_NO_NODE
        } else {
            reason::WAITING
        };
        status.message = Some(message.to_string());
        set_condition(
            &mut status.conditions,
            CONDITION_PLACED,
            false,
            why,
            message,
            job.metadata.generation,
        );
        effects.push(Effect::Event {
            warning: never_fits,
            reason: why,
            note: message.to_string(),
        });
    }
    Transition {
        decision: "waiting",
        status,
        effects,
        requeue: Requeue::After(WAIT_RESYNC),
    }
}

/// What the reconcile observed about a placed attempt's pod.
#[derive(Clone, Debug, Default)]
pub struct PodFacts {
    /// The pod's outcome from its status.
    pub outcome: PodOutcome,
    /// The node agent reported the pod for exceeding its budget.
    pub agent_reported_oom: bool,
    /// The peak the node agent measured for the pod's processes.
    pub measured_peak: Option<u64>,
    /// The batch shape the pod's process reports through the agent.
    pub observed_shape: Option<ObservedShape>,
    /// When the pod's training started (Unix seconds), once it runs.
    pub started: Option<f64>,
}

/// Follows a placed attempt's pod: records the measured peak and the OOMs the
/// process absorbed, moves to Running, finishes, or backs off on an OOM (the
/// agent's report counts like the pod's own OOM exit).
pub fn follow(
    job: &TrainingJob,
    mut status: TrainingJobStatus,
    placement: &PlacementStatus,
    facts: PodFacts,
) -> Transition {
    let mut effects = Vec::new();
    if let Some(bytes) = facts
        .measured_peak
        .filter(|b| Some(*b) > status.measured_peak_bytes)
    {
        status.measured_peak_bytes = Some(bytes);
        status.measured = Some(human_bytes(bytes));
    }
    if let Some(observed) = &facts.observed_shape {
        record_absorbed(job, &mut status, observed, &mut effects);
    }
    let outcome = if facts.agent_reported_oom {
        PodOutcome::OutOfMemory(
            "the node agent stopped the pod for exceeding its GPU memory budget".into(),
        )
    } else {
        facts.outcome
    };
    let end = match outcome {
        PodOutcome::Waiting => {
            status.phase = Phase::Placed;
            return Transition {
                decision: "pod-waiting",
                status,
                effects,
                requeue: Requeue::After(POD_RESYNC),
            };
        }
        PodOutcome::Running => {
            status.phase = Phase::Running;
            let reported = facts
                .observed_shape
                .as_ref()
                .and_then(|s| s.progress.as_ref());
            super::progress::follow_progress(job, &mut status, placement, reported, facts.started);
            return Transition {
                decision: "running",
                status,
                effects,
                requeue: Requeue::After(POD_RESYNC),
            };
        }
        PodOutcome::Succeeded => AttemptEnd::Succeeded,
        PodOutcome::Failed(message) => AttemptEnd::Failed(message),
        PodOutcome::OutOfMemory(message) => AttemptEnd::OutOfMemory(message),
        PodOutcome::NoGpu(message) => AttemptEnd::NoGpu(message),
    };
    let (decision, requeue) = end_attempt(job, &mut status, placement, &end, &mut effects);
    Transition {
        decision,
        status,
        effects,
        requeue,
    }
}

/// Records the OOMs the pod's process absorbed itself: the shape it runs with
/// now, the signature that its measured peak belongs to, an event for each.
fn record_absorbed(
    job: &TrainingJob,
    status: &mut TrainingJobStatus,
    observed: &ObservedShape,
    effects: &mut Vec<Effect>,
) {
    let Some(update) = newly_absorbed(&job.spec, status, observed) else {
        return;
    };
    status.micro_batch = Some(update.shape.micro);
    status.grad_accum = Some(update.shape.accum);
    status.batch_shape = Some(update.shape.display());
    status.model_signature = Some(job_signature(job, update.shape.micro));
    for oom in update.new {
        let text = absorbed_message(&oom);
        status.message = Some(text.clone());
        status.absorbed_ooms.push(oom);
        effects.push(Effect::Event {
            warning: false,
            reason: reason::OOM_ABSORBED,
            note: text,
        });
    }
}

fn finish(
    job: &TrainingJob,
    status: &mut TrainingJobStatus,
    phase: Phase,
    outcome: &str,
    message: Option<String>,
    effects: &mut Vec<Effect>,
) {
    let generation = job.metadata.generation;
    status.history.push(AttemptRecord {
        attempt: status.attempt,
        micro_batch: status.micro_batch.unwrap_or_default(),
        grad_accum: status.grad_accum.unwrap_or_default(),
        outcome: outcome.into(),
        message: message.clone(),
    });
    status.phase = phase;
    let text = message.unwrap_or_else(|| format!("attempt {} succeeded", status.attempt));
    status.message = Some(text.clone());
    set_condition(
        &mut status.conditions,
        CONDITION_PLACED,
        false,
        "Released",
        "the job finished",
        generation,
    );
    set_condition(
        &mut status.conditions,
        CONDITION_COMPLETE,
        true,
        outcome,
        &text,
        generation,
    );
    if let (Some(predicted), Some(measured)) = (status.predicted_bytes, status.measured_peak_bytes)
        && measured > 0
    {
        let error = (predicted as f64 - measured as f64) / measured as f64;
        effects.push(Effect::PredictionError(error));
    }
    effects.push(Effect::ForgetAssignment);
    effects.push(Effect::WakeScheduler);
    let (warning, why) = if phase == Phase::Succeeded {
        (false, reason::SUCCEEDED)
    } else {
        (true, reason::FAILED)
    };
    effects.push(Effect::Event {
        warning,
        reason: why,
        note: text,
    });
}

/// Ends the attempt as [`next_attempt`] decides (the decision `vramfit run
/// --local` takes too): the job finishes, succeeded or failed, or after an
/// OOM the next attempt starts at half the micro-batch and the pod is
/// deleted. Returns the decision's name and when to look again.
fn end_attempt(
    job: &TrainingJob,
    status: &mut TrainingJobStatus,
    placement: &PlacementStatus,
    end: &AttemptEnd,
    effects: &mut Vec<Effect>,
) -> (&'static str, Requeue) {
    let spec = &job.spec;
    let current = BatchShape {
        micro: status.micro_batch.unwrap_or(spec.batch.micro),
        accum: status.grad_accum.unwrap_or(1),
    };
    let count = |outcome: &str| {
        status
            .history
            .iter()
            .filter(|r| r.outcome == outcome)
            .count() as u32
    };
    let used = RetriesUsed {
        oom: count(OUTCOME_OOM),
        no_gpu: count(OUTCOME_NO_GPU),
    };
    if let AttemptEnd::OutOfMemory(message) = end {
        effects.push(Effect::Event {
            warning: true,
            reason: reason::OUT_OF_MEMORY,
            note: format!(
                "attempt {} at micro-batch {}: {message}",
                status.attempt, current.micro
            ),
        });
    }
    match next_attempt(spec, current, end, used) {
        NextAttempt::Done => {
            finish(job, status, Phase::Succeeded, end.name(), None, effects);
            ("succeeded", Requeue::AwaitChange)
        }
        NextAttempt::Fail(reason_text) => {
            finish(
                job,
                status,
                Phase::Failed,
                end.name(),
                Some(reason_text),
                effects,
            );
            match end {
                AttemptEnd::OutOfMemory(_) => ("oom-failed", Requeue::After(RETRY_DELAY)),
                _ => ("failed", Requeue::AwaitChange),
            }
        }
        NextAttempt::Retry(next) => {
            let decision = retry(job, status, current, next, end, effects);
            effects.push(Effect::DeletePod(pod_name(
                job.metadata.name.as_deref().unwrap_or_default(),
                placement.attempt,
            )));
            (decision, Requeue::After(RETRY_DELAY))
        }
    }
}

/// The next attempt after one that ended at `current` with `end` (an OOM,
/// or no GPU), with the shape `next`; the decision's name.
fn retry(
    job: &TrainingJob,
    status: &mut TrainingJobStatus,
    current: BatchShape,
    next: BatchShape,
    end: &AttemptEnd,
    effects: &mut Vec<Effect>,
) -> &'static str {
    let spec = &job.spec;
    let no_gpu = matches!(end, AttemptEnd::NoGpu(_));
    status.history.push(AttemptRecord {
        attempt: status.attempt,
        micro_batch: current.micro,
        grad_accum: current.accum,
        outcome: if no_gpu { OUTCOME_NO_GPU } else { OUTCOME_OOM }.into(),
        message: end.message().map(str::to_string),
    });
    let text = if no_gpu {
        format!(
            "attempt {} started without its GPU (the node's device injection did not run \
             for its container); retrying with {}",
            status.attempt,
            next.display()
        )
    } else {
        format!(
            "out of memory at micro-batch {}; retrying with {} (global batch {} kept)",
            current.micro,
            next.display(),
            spec.batch.global
        )
    };
    status.attempt += 1;
    status.phase = Phase::Retrying;
    status.micro_batch = Some(next.micro);
    status.grad_accum = Some(next.accum);
    status.batch_shape = Some(next.display());
    status.placement = None;
    status.gpu = None;
    status.pod_name = None;
    status.budget_bytes = None;
    status.measured_peak_bytes = None;
    status.measured = None;
    status.message = Some(text.clone());
    set_condition(
        &mut status.conditions,
        CONDITION_PLACED,
        false,
        reason::RETRYING,
        &text,
        job.metadata.generation,
    );
    if !no_gpu {
        effects.push(Effect::CountOomRetry);
    }
    effects.push(Effect::WakeScheduler);
    effects.push(Effect::Event {
        warning: no_gpu,
        reason: if no_gpu {
            reason::NO_GPU
        } else {
            reason::RETRYING
        },
        note: text,
    });
    if no_gpu { "no-gpu-retry" } else { "oom-retry" }
}

#[cfg(test)]
#[path = "transition_tests.rs"]
mod tests;
