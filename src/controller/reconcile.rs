//! The lifecycle of one TrainingJob: predict, take the cycle's placement, run
//! the attempt's pod, follow it, and back off on out-of-memory.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};

use super::held::HeldPrediction;
use super::metrics::ErrorLabel;
use super::pod::{still_wanted, training_pod};
use super::pod_ledger;
use super::retry::{self, PodRejection};
use super::scheduler::Verdict;
use super::status_patch::write_status;
use super::transition::{self, Effect, PodFacts, PredictFacts, Requeue, Step, Transition};
use super::{Context, FINALIZER};
use crate::api::{PlacementStatus, TrainingJob, TrainingJobStatus};
use crate::job::backoff::BatchShape;
use crate::job::exit::pod_outcome;
use crate::job::keys::pod_name;
use crate::{Error, Result};

/// How soon a job whose placement was taken from its pod is reconciled again
/// after its prediction is held, to record the two together.
const ADOPTED_REQUEUE: std::time::Duration = std::time::Duration::from_millis(10);

/// The longest a prediction may run. Every input the predictor reads is
/// bounded (the schema's limits, a config's counts), and the largest allowed
/// job predicts in seconds; past this limit the job is refused rather than
/// holding a reconcile and the memory its prediction builds.
const PREDICTION_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs CPU-bound `work` on the blocking pool and waits at most `limit`
/// for it. `Err` says why there is no result: it ran past the limit (it
/// then finishes unobserved) or it panicked.
async fn bounded<T: Send + 'static>(
    limit: std::time::Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(limit, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(failed)) => {
            let reason = match failed.try_into_panic() {
                Ok(panic) => panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "no message".into()),
                Err(cancelled) => cancelled.to_string(),
            };
            Err(format!("the prediction failed: {reason}"))
        }
        Err(_) => Err(format!(
            "the prediction did not finish within {} s",
            limit.as_secs()
        )),
    }
}

/// Reconciles one TrainingJob, counted and timed.
pub async fn reconcile(job: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action> {
    let started = std::time::Instant::now();
    let result = reconcile_job(job, &ctx).await;
    ctx.metrics.reconcile_runs.inc();
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    result
}

async fn reconcile_job(job: Arc<TrainingJob>, ctx: &Arc<Context>) -> Result<Action> {
    // Nothing is written by a replica past its Lease.
    ctx.fence.check()?;
    if job.metadata.deletion_timestamp.is_none() {
        return apply(&job, ctx).await;
    }
    // A job has no finalizer: once it is gone, the scheduling cycle deletes
    // its pod and counts the pod's memory until the pod is gone
    // (`pod_ledger`). A job that still carries the finalizer of an earlier
    // version is released here, and the finalizer taken off.
    if !job.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let namespace = job.namespace().unwrap_or_default();
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, job, |event| async {
        match event {
            Finalizer::Apply(_) => Ok(Action::await_change()),
            Finalizer::Cleanup(job) => cleanup(&job, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Counts the error by kind and retries after a delay that depends on it.
pub fn error_policy(job: Arc<TrainingJob>, error: &Error, ctx: Arc<Context>) -> Action {
    let kind = retry::error_kind(error);
    let delay = retry::retry_delay(error);
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabel { error: kind.into() })
        .inc();
    tracing::warn!(
        job = %job.name_any(),
        namespace = job.namespace().unwrap_or_default(),
        error_kind = kind,
        retry_seconds = delay.as_secs_f64(),
        %error,
        "reconcile failed"
    );
    Action::requeue(delay)
}

async fn apply(job: &TrainingJob, ctx: &Context) -> Result<Action> {
    let uid = job.uid().unwrap_or_default();
    let before = job.status.clone().unwrap_or_default();
    // A prediction held for this version of the job stands in for its status
    // until a step writes it (docs/controller.md, "API requests per job").
    let held = ctx.held.get(&uid, job.resource_version().as_deref());
    let overlaid = held.as_ref().map(|h| h.overlay(job));
    let seen = overlaid.as_ref().unwrap_or(job);
    let transition = match transition::next_step(seen, |attempt| {
        ctx.assignments.placement(&uid, attempt)
    }) {
        Step::Done => return Ok(Action::await_change()),
        Step::Predict {
            status,
            attempt,
            forget_assignment,
        } => {
            if forget_assignment {
                ctx.assignments.forget(&uid);
            }
            let learned = transition::wants_learned_start(&status, attempt)
                .then(|| ctx.learned_start_micro(job))
                .flatten();
            let profile = if crate::job::budget::profiled_automatically(&job.spec) {
                match auto_profile(job, ctx, &status).await? {
                    Ok(profile) => Ok(profile),
                    Err(transition) => return carry_out(job, ctx, &before, transition).await,
                }
            } else {
                load_profile(job, ctx).await
            };
            // The budgets per GPU model need the GpuNodes: a controller that
            // just started predicts only once their first list is in.
            super::wait_ready(&ctx.gpu_nodes).await?;
            let gpu_models = ctx.gpu_models();
            // A large model's prediction (and, when it fits no GPU, the
            // changes that would make it fit) takes a while: it runs on the
            // blocking pool, bounded in time, and a panic in it fails the
            // job instead of the reconcile.
            let elastic_default = ctx.elastic_default;
            let compute_default = ctx.compute_default;
            let predicted = {
                let owned = job.clone();
                let index = ctx.index.clone();
                let input = status.clone();
                bounded(PREDICTION_LIMIT, move || {
                    transition::predict(
                        &owned,
                        input,
                        PredictFacts {
                            attempt,
                            learned,
                            profile: profile.as_ref().map(|p| p.as_deref()).map_err(Clone::clone),
                            measured: &|signature| index.measured_peak_for(signature),
                            gpu_models: &gpu_models,
                            elastic_default,
                            compute_default,
                        },
                    )
                })
                .await
                .unwrap_or_else(|message| transition::invalid(job, status, &message))
            };
            // Held only for a version it can be tied to (a job read from the
            // API server always has one).
            match job.resource_version() {
                Some(version) => match transition::defer_prediction(predicted) {
                    transition::Prediction::Hold(deferred) => {
                        let rest = hold_prediction(job, ctx, version, &before, deferred);
                        let action = carry_out(job, ctx, &before, rest).await?;
                        // A placement the cycle took from the attempt's
                        // pod (`pod_ledger`) needs no cycle: record it now.
                        if ctx.assignments.placement(&uid, attempt).is_some() {
                            return Ok(Action::requeue(ADOPTED_REQUEUE));
                        }
                        return Ok(action);
                    }
                    transition::Prediction::Write(transition) => transition,
                },
                None => predicted,
            }
        }
        // This process wrote the placement already (or the status writer
        // is about to): the cached job lags the write, whose watch event
        // brings the job back. A deferred write no longer held (a later
        // prediction replaced it) is lost: with the attempt's pod in the
        // cache the placement is recorded again below (its create answers
        // AlreadyExists); without it, nothing is created.
        Step::RecordPlacement { placement, .. }
            if ctx.assignments.is_recorded(&uid, placement.attempt)
                && (ctx.held.get_any(&uid).is_some_and(|h| h.deferred_write)
                    || ctx
                        .cached_pod(
                            &job.namespace().unwrap_or_default(),
                            &pod_name(&job.name_any(), placement.attempt),
                        )
                        .is_none()) =>
        {
            return Ok(Action::requeue(transition::WRITE_RESYNC));
        }
        Step::RecordPlacement { status, placement } => {
            // The pod first, then the status that records it: the pod is the
            // first record of the placement (`pod_ledger` reads it back after
            // a restart), and it starts without waiting for a status write.
            let placed = transition::place(seen, status.clone(), placement.clone());
            match create_pod(job, ctx, &placed.status, &placement).await? {
                Ok(None) => placed,
                // The attempt's pod exists with another placement (a
                // controller stopped with its create in flight, which
                // landed after this one listed the pods): the pod is what
                // runs, so the status and the ledger take its placement.
                Ok(Some(theirs)) => {
                    tracing::info!(
                        job = %job.name_any(),
                        attempt = theirs.attempt,
                        ours = ?placement,
                        theirs = ?theirs,
                        "the attempt's pod exists with another placement: adopted"
                    );
                    ctx.assignments
                        .record(&uid, theirs.attempt, Verdict::Place(theirs.clone()));
                    transition::place(seen, status, theirs)
                }
                Err(Refused::Template(message)) => transition::invalid(job, status, &message),
                Err(Refused::Server(rejection)) => {
                    transition::pod_rejected(job, status, &rejection)
                }
            }
        }
        Step::ReportWaiting { status, attempt } => {
            let verdict = ctx.assignments.waiting(&uid, attempt);
            let verdict = match &verdict {
                Some(Verdict::Wait {
                    message,
                    never_fits,
                }) => Some((message.as_str(), *never_fits)),
                _ => None,
            };
            transition::wait(seen, status, verdict)
        }
        Step::FollowPod { status, placement } => {
            match follow_pod(job, ctx, status, &placement).await? {
                Some(transition) => transition,
                None => return Ok(Action::requeue(transition::WRITE_RESYNC)),
            }
        }
    };
    let (transition, before) = match held {
        // A placed status the status writer has yet to write: the step
        // starts from it, and writes only what changed since.
        Some(held) if held.deferred_write => (transition, held.status),
        Some(held) => (
            transition::with_held(transition, &before, &held.note),
            before,
        ),
        None => (transition, before),
    };
    carry_out(job, ctx, &before, transition).await
}

/// Holds a prediction until the cycle's verdict, which writes it (one status
/// write instead of two). Returns what is left to carry out now: the
/// prediction's other effects (the scheduler's wake-up), with nothing written.
fn hold_prediction(
    job: &TrainingJob,
    ctx: &Context,
    resource_version: String,
    written: &TrainingJobStatus,
    deferred: transition::Deferred,
) -> Transition {
    tracing::info!(
        job = %job.name_any(),
        namespace = job.namespace().unwrap_or_default(),
        decision = "predicted",
        attempt = deferred.status.attempt,
        budget_bytes = deferred.status.budget_bytes,
        status_message = deferred.status.message.as_deref(),
        "decision"
    );
    ctx.held.hold(
        &job.uid().unwrap_or_default(),
        HeldPrediction {
            resource_version,
            status: deferred.status,
            note: deferred.note,
            deferred_write: false,
        },
    );
    Transition {
        decision: "predicted",
        status: written.clone(),
        effects: deferred.effects,
        requeue: deferred.requeue,
    }
}

/// Notes a placement as written, so that a reconcile on a cached job from
/// before the write does not record it again.
fn mark_recorded(ctx: &Context, job: &TrainingJob, transition: &Transition) {
    if let (true, Some(placement)) = (
        transition.decision == "placed",
        transition.status.placement.as_ref(),
    ) {
        ctx.assignments
            .mark_recorded(&job.uid().unwrap_or_default(), placement.attempt);
    }
}

/// One structured line per decision that changes a status.
fn log_decision(job: &TrainingJob, transition: &Transition) {
    tracing::info!(
        job = %job.name_any(),
        namespace = job.namespace().unwrap_or_default(),
        decision = transition.decision,
        phase = ?transition.status.phase,
        attempt = transition.status.attempt,
        node = transition.status.placement.as_ref().map(|p| p.node.as_str()),
        gpus = transition.status.gpu.as_deref(),
        batch = transition.status.batch_shape.as_deref(),
        budget_bytes = transition.status.budget_bytes,
        status_message = transition.status.message.as_deref(),
        "decision"
    );
}

/// Writes the transition's status when it changed, then carries out its
/// effects in order.
async fn carry_out(
    job: &TrainingJob,
    ctx: &Context,
    before: &TrainingJobStatus,
    transition: Transition,
) -> Result<Action> {
    let namespace = job.namespace().unwrap_or_default();
    let deferred = ctx.defer_placed_status && transition.decision == "placed";
    if let (true, Some(version)) = (deferred, job.resource_version()) {
        // The pod exists: the status writer writes its status (`status_writer`).
        ctx.held.hold(
            &job.uid().unwrap_or_default(),
            HeldPrediction {
                resource_version: version,
                status: transition.status.clone(),
                note: String::new(),
                deferred_write: true,
            },
        );
        ctx.status_queue
            .push(kube::runtime::reflector::ObjectRef::from_obj(job));
        mark_recorded(ctx, job, &transition);
        log_decision(job, &transition);
    } else if transition.status != *before {
        let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &namespace);
        ctx.fence.check()?;
        let uid = job.uid().unwrap_or_default();
        let own = ctx.own_writes.begin(&uid);
        let written = write_status(&api, job, &transition.status).await?;
        // What is written supersedes a held prediction, and the assignments
        // of the attempts it moved on from.
        ctx.held.forget(&uid);
        ctx.assignments
            .forget_before(&uid, transition.status.attempt);
        own.wrote(written);
        mark_recorded(ctx, job, &transition);
        log_decision(job, &transition);
    }
    for effect in transition.effects {
        match effect {
            Effect::Event {
                warning,
                reason,
                note,
            } => {
                let kind = if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                };
                ctx.events.publish(job, kind, reason, note).await;
            }
            Effect::DeletePod(pod) => {
                let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
                ctx.fence.check()?;
                match pods.delete(&pod, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    // The attempt's status is written; a pod left behind has
                    // ended already and holds no budget.
                    Err(error) => tracing::warn!(%error, pod, "could not delete the pod"),
                }
            }
            Effect::ForgetAssignment => ctx.assignments.forget(&job.uid().unwrap_or_default()),
            Effect::WakeScheduler => ctx.wake_scheduler(),
            Effect::CountOomRetry => {
                ctx.metrics.oom_retries.inc();
            }
            Effect::CountPlacement { first_attempt } => {
                let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
                if let Some(created) = created.filter(|_| first_attempt) {
                    let seconds = Timestamp::now().duration_since(created).as_secs_f64();
                    ctx.metrics.placement_latency.observe(seconds.max(0.0));
                }
                ctx.metrics.placements.inc();
            }
            Effect::PredictionError(error) => ctx.metrics.prediction_error.observe(error),
        }
    }
    Ok(match transition.requeue {
        Requeue::AwaitChange => Action::await_change(),
        Requeue::After(delay) => Action::requeue(delay),
    })
}

/// The profile of a job profiled automatically: `Ok` with it (or with none
/// when its capture failed and `memory.request` gives the budget), or the
/// transition to write while it is captured or once its capture failed.
async fn auto_profile(
    job: &TrainingJob,
    ctx: &Context,
    status: &TrainingJobStatus,
) -> Result<std::result::Result<Option<String>, Transition>> {
    let spec = &job.spec;
    let micro = status.micro_batch.unwrap_or(spec.batch.micro);
    let Some(shape) = BatchShape::for_micro(spec.batch.global, micro, spec.gpus) else {
        // The prediction refuses the shape, naming it.
        return Ok(Ok(None));
    };
    let requested = spec.memory.as_ref().is_some_and(|m| m.request.is_some());
    Ok(match super::autoprofile::run(job, ctx, shape).await? {
        super::autoprofile::Outcome::Ready(text) => Ok(Some(text)),
        super::autoprofile::Outcome::Waiting(message) => {
            Err(transition::profiling(job, status.clone(), &message))
        }
        super::autoprofile::Outcome::Failed(message) if requested => {
            tracing::warn!(job = %job.name_any(), "automatic profiling failed, running with spec.memory.request: {message}");
            Ok(None)
        }
        super::autoprofile::Outcome::Failed(message) => {
            Err(transition::profile_failed(job, status.clone(), &message))
        }
    })
}

async fn load_profile(job: &TrainingJob, ctx: &Context) -> Result<Option<String>, String> {
    let Some(profile) = job.spec.model.profile.as_ref() else {
        return Ok(None);
    };
    let reference = &profile.config_map_ref;
    let api: Api<ConfigMap> =
        Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    let config_map = api
        .get_opt(&reference.name)
        .await
        .map_err(|e| {
            format!(
                "spec.model.profile: reading ConfigMap {}: {e}",
                reference.name
            )
        })?
        .ok_or_else(|| {
            format!(
                "spec.model.profile: ConfigMap {} does not exist",
                reference.name
            )
        })?;
    config_map
        .data
        .and_then(|mut d| d.remove(&reference.key))
        .ok_or_else(|| {
            format!(
                "spec.model.profile: ConfigMap {} has no key {}",
                reference.name, reference.key
            )
        })
        .map(Some)
}

/// Follows a placed attempt: creates its pod when the cache has none (`None`:
/// nothing to write; the pod's watch event brings the job back), else reads the
/// pod's and the agent's facts and decides from them.
async fn follow_pod(
    job: &TrainingJob,
    ctx: &Context,
    status: TrainingJobStatus,
    placement: &PlacementStatus,
) -> Result<Option<Transition>> {
    let namespace = job.namespace().unwrap_or_default();
    let name = pod_name(&job.name_any(), placement.attempt);
    // A pod missing from the cache is created; if the cache only lags, the
    // create answers AlreadyExists and the pod's watch event brings us back.
    let Some(pod) = ctx.cached_pod(&namespace, &name) else {
        // The cached job may be older than the pod cache (its watch lags, or
        // a restart listed it before the pods): read it back, so that an
        // attempt already followed by the next one never gets its pod again.
        // Not needed when the cache holds this process's own last write.
        if !ctx.own_writes.is_latest(job) {
            let jobs: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &namespace);
            let fresh = jobs.get(&job.name_any()).await.map_err(Error::Kube)?;
            if !still_wanted(&fresh, placement) {
                return Ok(None);
            }
        }
        return Ok(match create_pod(job, ctx, &status, placement).await? {
            // Its own pod, or one of another placement whose watch event
            // brings the job back to the pod ledger.
            Ok(_) => None,
            Err(Refused::Template(message)) => Some(transition::invalid(job, status, &message)),
            Err(Refused::Server(rejection)) => {
                Some(transition::pod_rejected(job, status, &rejection))
            }
        });
    };
    let facts = PodFacts {
        outcome: pod_outcome(&pod),
        agent_reported_oom: ctx.agent_reported_oom(&placement.node, &namespace, &name),
        measured_peak: ctx.measured_for_pod(&placement.node, &namespace, &name),
        observed_shape: ctx.observed_shape_for_pod(&placement.node, &namespace, &name),
        started: super::progress::pod_started(&pod),
    };
    Ok(Some(transition::follow(job, status, placement, facts)))
}

/// Why an attempt's pod was not made.
enum Refused {
    /// The template cannot make a pod, in words.
    Template(String),
    /// The API server refused the pod for good.
    Server(PodRejection),
}

/// Creates the pod of a placed attempt. `AlreadyExists` is success (a
/// restarted controller, or a cache that lags), unless the existing pod
/// records another placement of the attempt: that one is returned.
async fn create_pod(
    job: &TrainingJob,
    ctx: &Context,
    status: &TrainingJobStatus,
    placement: &PlacementStatus,
) -> Result<Result<Option<PlacementStatus>, Refused>> {
    let namespace = job.namespace().unwrap_or_default();
    let shape = BatchShape {
        micro: status.micro_batch.unwrap_or(job.spec.batch.micro),
        accum: status.grad_accum.unwrap_or(1),
    };
    let pod = match training_pod(job, placement, shape, placement.attempt) {
        Ok(pod) => pod,
        Err(message) => return Ok(Err(Refused::Template(message))),
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    ctx.fence.check()?;
    // No event: the `Placed` event and the pod itself say as much.
    let creating = ctx.pods_first.creating();
    let created = pods.create(&PostParams::default(), &pod).await;
    drop(creating);
    match created {
        Ok(_) => tracing::debug!(
            job = %job.name_any(),
            namespace,
            pod = pod.metadata.name.as_deref(),
            "pod created"
        ),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let existing = pods.get(name).await.map_err(Error::Kube)?;
            return Ok(Ok(pod_ledger::other_placement(&existing, placement)));
        }
        Err(kube::Error::Api(e)) => {
            let Some(rejection) = retry::pod_rejection(&e) else {
                return Err(Error::Kube(kube::Error::Api(e)));
            };
            tracing::warn!(
                job = %job.name_any(),
                namespace,
                reason = rejection.reason,
                message = %rejection.message,
                "pod refused by the API server"
            );
            return Ok(Err(Refused::Server(rejection)));
        }
        Err(e) => return Err(Error::Kube(e)),
    }
    Ok(Ok(None))
}

async fn cleanup(job: &TrainingJob, ctx: &Context) -> Result<Action> {
    let namespace = job.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(placement) = job.status.as_ref().and_then(|s| s.placement.as_ref()) {
        let name = pod_name(&job.name_any(), placement.attempt);
        ctx.fence.check()?;
        match pods.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    let uid = job.uid().unwrap_or_default();
    ctx.assignments.forget(&uid);
    ctx.held.forget(&uid);
    ctx.own_writes.forget(&uid);
    ctx.wake_scheduler();
    tracing::info!(job = %job.name_any(), namespace, "released");
    Ok(Action::await_change())
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
