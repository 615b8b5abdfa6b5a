//! The lifecycle of one TrainingJob: predict, take the cycle's placement, run
//! the attempt's pod, follow it, and back off on out-of-memory.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};

use super::absorbed::{absorbed_message, newly_absorbed};
use super::backoff::{BatchShape, OomDecision, after_oom};
use super::budget::{attempt_budget, gpu_model_budgets};
use super::exit::{PodOutcome, pod_outcome};
use super::pod::{pod_name, training_pod};
use super::quantity::human_bytes;
use super::scheduler::{Verdict, recorded};
use super::signature::model_signature;
use super::status::{
    CONDITION_COMPLETE, CONDITION_INVALID, CONDITION_PLACED, publish, reason, set_condition,
    write_status,
};
use super::{Context, FINALIZER};
use crate::api::{AttemptRecord, Phase, TrainingJob, TrainingJobStatus};
use crate::{Error, Result};

/// Resync period of a job whose pod waits or runs.
const POD_RESYNC: Duration = Duration::from_secs(300);

/// Reconciles one TrainingJob.
pub async fn reconcile(job: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = job.namespace().unwrap_or_default();
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, job, |event| async {
        match event {
            Finalizer::Apply(job) => apply(&job, &ctx).await,
            Finalizer::Cleanup(job) => cleanup(&job, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Requeue delay after an error.
pub fn error_policy(_job: Arc<TrainingJob>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

async fn apply(job: &TrainingJob, ctx: &Context) -> Result<Action> {
    let mut status = job.status.clone().unwrap_or_default();
    let uid = job.uid().unwrap_or_default();
    let spec_changed = status.observed_generation.is_some()
        && status.observed_generation != job.metadata.generation;
    if status.phase.is_terminal() {
        // A job that failed validation starts over once its spec is fixed;
        // a job that ran keeps its outcome.
        if !(spec_changed && is_invalid(&status)) {
            return Ok(Action::await_change());
        }
        status = TrainingJobStatus {
            conditions: status.conditions,
            ..TrainingJobStatus::default()
        };
    }
    let api: Api<TrainingJob> =
        Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    let attempt = status.attempt.max(1);
    let placed = recorded(job).is_some() && !status.phase.is_terminal();
    if spec_changed && !placed {
        // A waiting job is predicted again from its new spec; a decision the
        // cycle made for the old budget no longer holds. A placed job keeps
        // running as it was placed.
        ctx.assignments.forget(&uid);
        if attempt == 1 {
            status.micro_batch = None;
        }
        return predict(job, &api, ctx, status, attempt).await;
    }
    if status.budget_bytes.is_none() || status.attempt == 0 {
        return predict(job, &api, ctx, status, attempt).await;
    }
    let placement = match recorded(job) {
        Some(placement) => placement.clone(),
        None => match ctx.assignments.placement(&uid, attempt) {
            Some(placement) => return record_placement(job, &api, ctx, status, placement).await,
            None => return report_waiting(job, &api, ctx, status, &uid, attempt).await,
        },
    };
    follow_pod(job, &api, ctx, status, &placement).await
}

fn is_invalid(status: &TrainingJobStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_INVALID && c.status == "True")
}

/// Predicts the current attempt's budget and writes it; the cycle places the
/// job afterwards.
async fn predict(
    job: &TrainingJob,
    api: &Api<TrainingJob>,
    ctx: &Context,
    mut status: TrainingJobStatus,
    attempt: u32,
) -> Result<Action> {
    let generation = job.metadata.generation;
    let learned = (attempt == 1 && status.micro_batch.is_none())
        .then(|| ctx.learned_start_micro(&job.spec))
        .flatten();
    let micro = status
        .micro_batch
        .or(learned.as_ref().map(|(m, _)| *m))
        .unwrap_or(job.spec.batch.micro);
    let shape = BatchShape::for_micro(job.spec.batch.global, micro, job.spec.gpus);
    let profile = match load_profile(job, ctx).await {
        Ok(profile) => profile,
        Err(message) => return fail_invalid(job, api, ctx, status, &message).await,
    };
    let signature = model_signature(&job.spec, micro);
    let measured = ctx.measured_peak_for(&signature);
    let budget = match (shape, job.spec.pod_template()) {
        (None, _) => Err(format!(
            "batch.global {} is not divisible by micro-batch {micro} x {} GPU(s)",
            job.spec.batch.global, job.spec.gpus
        )),
        (_, Err(message)) => Err(message),
        (Some(_), Ok(_)) => attempt_budget(job, micro, profile.as_deref(), measured),
    };
    let (budget, shape) = match (budget, shape) {
        (Ok(budget), Some(shape)) => (budget, shape),
        (Err(message), _) => return fail_invalid(job, api, ctx, status, &message).await,
        (Ok(_), None) => unreachable!("a budget is only computed for a valid batch shape"),
    };
    // The budget for each GPU model the job could land on; the cycle gives it
    // the one of the model it places it on.
    let auto = job.spec.batch.auto_micro && attempt == 1;
    let per_model = gpu_model_budgets(
        job,
        micro,
        auto,
        &ctx.gpu_models(),
        profile.as_deref(),
        &|m| ctx.measured_peak_for(&model_signature(&job.spec, m)),
    );
    status.gpu_model_budgets = per_model;
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
    let start = learned.map_or(String::new(), |(m, from)| {
        format!("; starts at micro-batch {m}, where job {from} of the same model absorbed its OOMs")
    });
    status.message = Some(format!(
        "budget {} per GPU ({} from {}){start}",
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
    write_status(api, job, &status).await?;
    publish(
        &ctx.recorder,
        job,
        EventType::Normal,
        reason::PREDICTED,
        format!(
            "attempt {attempt}: predicted peak {} per GPU ({}), budget {}",
            human_bytes(budget.predicted),
            budget.source,
            human_bytes(budget.budget)
        ),
    )
    .await;
    ctx.wake_scheduler();
    Ok(Action::requeue(Duration::from_secs(60)))
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

async fn fail_invalid(
    job: &TrainingJob,
    api: &Api<TrainingJob>,
    ctx: &Context,
    mut status: TrainingJobStatus,
    message: &str,
) -> Result<Action> {
    let generation = job.metadata.generation;
    status.phase = Phase::Failed;
    status.message = Some(message.to_string());
    status.observed_generation = generation;
    set_condition(
        &mut status.conditions,
        CONDITION_INVALID,
        true,
        "InvalidSpec",
        message,
        generation,
    );
    set_condition(
        &mut status.conditions,
        CONDITION_COMPLETE,
        true,
        reason::FAILED,
        message,
        generation,
    );
    write_status(api, job, &status).await?;
    publish(
        &ctx.recorder,
        job,
        EventType::Warning,
        reason::INVALID,
        message.to_string(),
    )
    .await;
    Ok(Action::await_change())
}

async fn record_placement(
    job: &TrainingJob,
    api: &Api<TrainingJob>,
    ctx: &Context,
    mut status: TrainingJobStatus,
    placement: crate::api::PlacementStatus,
) -> Result<Action> {
    let generation = job.metadata.generation;
    let gpus: Vec<String> = placement.gpus.iter().map(|g| g.index.to_string()).collect();
    let message = format!(
        "placed on {} GPU {} with {} per GPU (fraction {:.3})",
        placement.node,
        gpus.join(","),
        human_bytes(placement.budget_bytes),
        placement.memory_fraction
    );
    // A placement on a GPU model with its own prediction takes that model's
    // micro-batch and budget.
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
            status.model_signature = Some(model_signature(&job.spec, shape.micro));
        }
        status.predicted_bytes = Some(chosen.predicted_bytes);
        status.predicted = Some(human_bytes(chosen.predicted_bytes));
        status.budget_bytes = Some(chosen.budget_bytes);
    }
    status.phase = Phase::Placed;
    status.gpu = Some(gpus.join(","));
    status.pod_name = Some(pod_name(&job.name_any(), placement.attempt));
    status.placement = Some(placement);
    status.message = Some(message.clone());
    set_condition(
        &mut status.conditions,
        CONDITION_PLACED,
        true,
        reason::PLACED,
        &message,
        generation,
    );
    write_status(api, job, &status).await?;
    // Latency of first placements only: a retry's wait starts at the OOM.
    let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    if let Some(created) = created.filter(|_| status.history.is_empty()) {
        let seconds = Timestamp::now().duration_since(created).as_secs_f64();
        ctx.metrics.placement_latency.observe(seconds.max(0.0));
    }
    ctx.metrics.placements.inc();
    publish(
        &ctx.recorder,
        job,
        EventType::Normal,
        reason::PLACED,
        message,
    )
    .await;
    // The next reconcile, triggered by this write's watch event, creates the
    // pod. A short requeue here would run on the cached object from before the
    // write whenever the watch lags, and write the placement again.
    Ok(Action::requeue(Duration::from_secs(30)))
}

async fn report_waiting(
    job: &TrainingJob,
    api: &Api<TrainingJob>,
    ctx: &Context,
    mut status: TrainingJobStatus,
    uid: &str,
    attempt: u32,
) -> Result<Action> {
    let Some(Verdict::Wait {
        message,
        never_fits,
    }) = ctx.assignments.waiting(uid, attempt)
    else {
        ctx.wake_scheduler();
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    if status.message.as_deref() != Some(message.as_str()) {
        let why = if never_fits {
            reason::FITS_NO_NODE
        } else {
            reason::WAITING
        };
        status.message = Some(message.clone());
        set_condition(
            &mut status.conditions,
            CONDITION_PLACED,
            false,
            why,
            &message,
            job.metadata.generation,
        );
        write_status(api, job, &status).await?;
        let kind = if never_fits {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(&ctx.recorder, job, kind, why, message).await;
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

async fn follow_pod(
    job: &TrainingJob,
    api: &Api<TrainingJob>,
    ctx: &Context,
    mut status: TrainingJobStatus,
    placement: &crate::api::PlacementStatus,
) -> Result<Action> {
    let namespace = job.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let name = pod_name(&job.name_any(), placement.attempt);
    // A pod missing from the cache is created; if the cache only lags, the
    // create answers AlreadyExists and the pod's watch event brings us back.
    let Some(pod) = ctx.cached_pod(&namespace, &name) else {
        let shape = BatchShape {
            micro: status.micro_batch.unwrap_or(job.spec.batch.micro),
            accum: status.grad_accum.unwrap_or(1),
        };
        let pod = match training_pod(job, placement, shape, placement.attempt, &ctx.stats_root) {
            Ok(pod) => pod,
            Err(message) => return fail_invalid(job, api, ctx, status, &message).await,
        };
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {
                publish(
                    &ctx.recorder,
                    job,
                    EventType::Normal,
                    reason::POD_CREATED,
                    format!("created pod {name}"),
                )
                .await
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    let before = status.clone();
    let measured = ctx.measured_for_pod(&placement.node, &namespace, &name);
    if let Some(bytes) = measured.filter(|b| Some(*b) > status.measured_peak_bytes) {
        status.measured_peak_bytes = Some(bytes);
        status.measured = Some(human_bytes(bytes));
    }
    if let Some(observed) = ctx.observed_shape_for_pod(&placement.node, &namespace, &name) {
        record_absorbed(job, ctx, &mut status, &observed).await;
    }
    let outcome = if ctx.agent_reported_oom(&placement.node, &namespace, &name) {
        PodOutcome::OutOfMemory(
            "the node agent stopped the pod for exceeding its GPU memory budget".into(),
        )
    } else {
        pod_outcome(&pod)
    };
    // Pod changes and the node agent's reports trigger reconciles of their
    // own; the requeue is only a slow resync, not a poll of the pod.
    let action = match outcome {
        PodOutcome::Waiting => {
            status.phase = Phase::Placed;
            Action::requeue(POD_RESYNC)
        }
        PodOutcome::Running => {
            status.phase = Phase::Running;
            Action::requeue(POD_RESYNC)
        }
        PodOutcome::Succeeded => {
            finish(job, ctx, &mut status, Phase::Succeeded, "Succeeded", None).await;
            Action::await_change()
        }
        PodOutcome::Failed(message) => {
            finish(
                job,
                ctx,
                &mut status,
                Phase::Failed,
                "Failed",
                Some(message),
            )
            .await;
            Action::await_change()
        }
        PodOutcome::OutOfMemory(message) => {
            back_off(job, ctx, &mut status, &message).await;
            if status.phase == Phase::Retrying {
                let _ = pods.delete(&name, &DeleteParams::background()).await;
            }
            Action::requeue(Duration::from_secs(1))
        }
    };
    if status != before {
        write_status(api, job, &status).await?;
    }
    Ok(action)
}

/// Records the OOMs the pod's process absorbed itself: the shape it runs with
/// now, the signature that its measured peak belongs to, an event for each.
async fn record_absorbed(
    job: &TrainingJob,
    ctx: &Context,
    status: &mut TrainingJobStatus,
    observed: &crate::api::ObservedShape,
) {
    let Some(update) = newly_absorbed(&job.spec, status, observed) else {
        return;
    };
    status.micro_batch = Some(update.shape.micro);
    status.grad_accum = Some(update.shape.accum);
    status.batch_shape = Some(update.shape.display());
    status.model_signature = Some(model_signature(&job.spec, update.shape.micro));
    for oom in update.new {
        let text = absorbed_message(&oom);
        status.message = Some(text.clone());
        status.absorbed_ooms.push(oom);
        publish(
            &ctx.recorder,
            job,
            EventType::Normal,
            reason::OOM_ABSORBED,
            text,
        )
        .await;
    }
}

async fn finish(
    job: &TrainingJob,
    ctx: &Context,
    status: &mut TrainingJobStatus,
    phase: Phase,
    outcome: &str,
    message: Option<String>,
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
        ctx.metrics.prediction_error.observe(error);
    }
    ctx.assignments.forget(&job.uid().unwrap_or_default());
    ctx.wake_scheduler();
    let (kind, why) = if phase == Phase::Succeeded {
        (EventType::Normal, reason::SUCCEEDED)
    } else {
        (EventType::Warning, reason::FAILED)
    };
    publish(&ctx.recorder, job, kind, why, text).await;
}

async fn back_off(job: &TrainingJob, ctx: &Context, status: &mut TrainingJobStatus, message: &str) {
    let spec = &job.spec;
    let current = BatchShape {
        micro: status.micro_batch.unwrap_or(spec.batch.micro),
        accum: status.grad_accum.unwrap_or(1),
    };
    let used = status
        .history
        .iter()
        .filter(|r| r.outcome == "OutOfMemory")
        .count() as u32;
    publish(
        &ctx.recorder,
        job,
        EventType::Warning,
        reason::OUT_OF_MEMORY,
        format!(
            "attempt {} at micro-batch {}: {message}",
            status.attempt, current.micro
        ),
    )
    .await;
    match after_oom(
        spec.batch.global,
        spec.gpus,
        current,
        spec.batch.min_micro,
        used,
        spec.max_oom_retries,
    ) {
        OomDecision::Retry(next) => {
            status.history.push(AttemptRecord {
                attempt: status.attempt,
                micro_batch: current.micro,
                grad_accum: current.accum,
                outcome: "OutOfMemory".into(),
                message: Some(message.to_string()),
            });
            let text = format!(
                "out of memory at micro-batch {}; retrying with {} (global batch {} kept)",
                current.micro,
                next.display(),
                spec.batch.global
            );
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
            ctx.metrics.oom_retries.inc();
            ctx.wake_scheduler();
            publish(
                &ctx.recorder,
                job,
                EventType::Normal,
                reason::RETRYING,
                text,
            )
            .await;
        }
        OomDecision::Fail(reason_text) => {
            finish(
                job,
                ctx,
                status,
                Phase::Failed,
                "OutOfMemory",
                Some(reason_text),
            )
            .await;
        }
    }
}

async fn cleanup(job: &TrainingJob, ctx: &Context) -> Result<Action> {
    let namespace = job.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(placement) = job.status.as_ref().and_then(|s| s.placement.as_ref()) {
        let name = pod_name(&job.name_any(), placement.attempt);
        match pods.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    ctx.assignments.forget(&job.uid().unwrap_or_default());
    ctx.wake_scheduler();
    tracing::info!(job = %job.name_any(), namespace, "released");
    Ok(Action::await_change())
}
