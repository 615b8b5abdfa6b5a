use super::*;
use crate::api::{AbsorbedOom, AssignedGpu, GpuModelBudget};
use crate::job::attempt::MAX_NO_GPU_RETRIES;
use serde_json::json;

const GIB: u64 = 1 << 30;

/// A one-GPU MLP job, global batch 8, micro-batch 8, generation 1.
fn job_with(spec_extra: serde_json::Value, status: Option<TrainingJobStatus>) -> TrainingJob {
    let mut job = TrainingJob::test("j").spec(spec_extra).build();
    job.status = status;
    job
}

fn job(status: Option<TrainingJobStatus>) -> TrainingJob {
    job_with(json!({}), status)
}

fn placement(attempt: u32) -> PlacementStatus {
    PlacementStatus {
        compute_percent: None,
        node: "n1".into(),
        gpus: vec![AssignedGpu {
            index: 0,
            uuid: "GPU-0".into(),
        }],
        budget_bytes: 10 * GIB,
        memory_fraction: 0.125,
        attempt,
        gpu_model: None,
        micro_batch: None,
        elastic: None,
    }
}

/// A status the cycle can place: predicted, budget set, observed at generation 1.
fn predicted(attempt: u32, phase: Phase) -> TrainingJobStatus {
    TrainingJobStatus {
        phase,
        attempt,
        budget_bytes: Some(10 * GIB),
        predicted_bytes: Some(8 * GIB),
        micro_batch: Some(8),
        grad_accum: Some(1),
        observed_generation: Some(1),
        ..Default::default()
    }
}

/// The same status, placed for its attempt.
fn placed(attempt: u32, phase: Phase) -> TrainingJobStatus {
    TrainingJobStatus {
        placement: Some(placement(attempt)),
        ..predicted(attempt, phase)
    }
}

fn invalid_condition() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        CONDITION_INVALID,
        true,
        "InvalidSpec",
        "x",
        Some(1),
    );
    conditions.remove(0)
}

fn condition<'a>(
    status: &'a TrainingJobStatus,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", status.conditions))
}

/// Event reasons of the effects, in order.
fn events(t: &Transition) -> Vec<(&'static str, bool)> {
    t.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Event {
                reason, warning, ..
            } => Some((*reason, *warning)),
            _ => None,
        })
        .collect()
}

/// The short name of a step, for the table.
fn kind(step: &Step) -> String {
    match step {
        Step::Done => "done".into(),
        Step::Predict {
            attempt,
            forget_assignment,
            ..
        } => format!("predict a{attempt} forget={forget_assignment}"),
        Step::RecordPlacement { placement, .. } => format!("record a{}", placement.attempt),
        Step::ReportWaiting { attempt, .. } => format!("wait a{attempt}"),
        Step::FollowPod { placement, .. } => format!("follow a{}", placement.attempt),
    }
}

#[test]
fn next_step_follows_the_phase_machine() {
    let with = |mut status: TrainingJobStatus, f: &dyn Fn(&mut TrainingJobStatus)| {
        f(&mut status);
        status
    };
    let invalid_failed = with(predicted(1, Phase::Failed), &|s| {
        s.conditions.push(invalid_condition())
    });
    // (what, status, generation, the cycle's placement, expected step)
    let cases: Vec<(&str, Option<TrainingJobStatus>, i64, bool, &str)> = vec![
        (
            "a new job is predicted",
            None,
            1,
            false,
            "predict a1 forget=false",
        ),
        (
            "a job that succeeded stays done",
            Some(placed(1, Phase::Succeeded)),
            1,
            false,
            "done",
        ),
        (
            "a job that ran and failed stays done after a spec change",
            Some(predicted(1, Phase::Failed)),
            2,
            false,
            "done",
        ),
        (
            "a job that failed while valid stays done after a spec change",
            Some(with(predicted(1, Phase::Failed), &|s| {
                set_condition(
                    &mut s.conditions,
                    CONDITION_INVALID,
                    false,
                    "Valid",
                    "",
                    Some(1),
                );
                set_condition(
                    &mut s.conditions,
                    CONDITION_COMPLETE,
                    true,
                    "Failed",
                    "",
                    Some(1),
                );
            })),
            2,
            false,
            "done",
        ),
        (
            "an invalid job stays done while its spec is unchanged",
            Some(invalid_failed.clone()),
            1,
            false,
            "done",
        ),
        (
            "an invalid job starts over once its spec is fixed",
            Some(invalid_failed),
            2,
            false,
            "predict a1 forget=true",
        ),
        (
            "a job whose pod was refused stays done while its spec is unchanged",
            Some(pod_rejected_status()),
            1,
            false,
            "done",
        ),
        (
            "a job whose pod was refused starts over once its spec changes",
            Some(pod_rejected_status()),
            2,
            false,
            "predict a1 forget=true",
        ),
        (
            "a waiting job whose spec changed is predicted again",
            Some(predicted(1, Phase::Pending)),
            2,
            true,
            "predict a1 forget=true",
        ),
        (
            "a placed job whose spec changed keeps running as placed",
            Some(placed(1, Phase::Running)),
            2,
            false,
            "follow a1",
        ),
        (
            "a retry without a budget is predicted",
            Some(with(predicted(2, Phase::Retrying), &|s| {
                s.budget_bytes = None
            })),
            1,
            false,
            "predict a2 forget=false",
        ),
        (
            "attempt 0 is predicted as attempt 1",
            Some(predicted(0, Phase::Pending)),
            1,
            false,
            "predict a1 forget=false",
        ),
        (
            "the cycle's placement is recorded",
            Some(predicted(1, Phase::Pending)),
            1,
            true,
            "record a1",
        ),
        (
            "without one the job waits",
            Some(predicted(1, Phase::Pending)),
            1,
            false,
            "wait a1",
        ),
        (
            "a placement of an earlier attempt is not the current one",
            Some(TrainingJobStatus {
                placement: Some(placement(1)),
                ..predicted(2, Phase::Retrying)
            }),
            1,
            false,
            "wait a2",
        ),
        (
            "a status never observed at a generation is no spec change",
            Some(with(predicted(1, Phase::Pending), &|s| {
                s.observed_generation = None
            })),
            3,
            false,
            "wait a1",
        ),
        (
            "a placed job is followed",
            Some(placed(1, Phase::Placed)),
            1,
            true,
            "follow a1",
        ),
    ];
    for (what, status, generation, assigned, expected) in cases {
        let mut job = job(status);
        job.metadata.generation = Some(generation);
        let step = next_step(&job, |attempt| assigned.then(|| placement(attempt)));
        assert_eq!(kind(&step), expected, "{what}");
    }
}

#[test]
fn starting_over_keeps_only_the_conditions_and_a_waiting_first_attempt_loses_its_micro_batch() {
    let mut status = predicted(1, Phase::Failed);
    status.conditions.push(invalid_condition());
    status.message = Some("bad".into());
    let mut fixed = job(Some(status.clone()));
    fixed.metadata.generation = Some(2);
    match next_step(&fixed, |_| None) {
        Step::Predict { status: s, .. } => assert_eq!(
            s,
            TrainingJobStatus {
                conditions: status.conditions.clone(),
                ..Default::default()
            }
        ),
        other => panic!("{other:?}"),
    }

    // A first attempt picks its micro-batch again; a retry keeps its back-off.
    for (attempt, micro) in [(1, None), (2, Some(8))] {
        let mut changed = job(Some(predicted(attempt, Phase::Pending)));
        changed.metadata.generation = Some(2);
        match next_step(&changed, |_| None) {
            Step::Predict { status, .. } => {
                assert_eq!(status.micro_batch, micro, "attempt {attempt}")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_cycle_is_asked_for_the_current_attempt() {
    let job = job(Some(predicted(3, Phase::Retrying)));
    let mut asked = None;
    let _ = next_step(&job, |attempt| {
        asked = Some(attempt);
        None
    });
    assert_eq!(asked, Some(3));
}

#[test]
fn learned_starts_are_looked_up_for_a_first_attempt_without_a_micro_batch() {
    let mut status = TrainingJobStatus::default();
    assert!(wants_learned_start(&status, 1));
    assert!(!wants_learned_start(&status, 2));
    status.micro_batch = Some(4);
    assert!(!wants_learned_start(&status, 1));
}

fn facts<'a>(
    attempt: u32,
    measured: &'a dyn Fn(&str) -> Option<u64>,
    models: &'a [(String, u64)],
) -> PredictFacts<'a> {
    PredictFacts {
        attempt,
        learned: None,
        profile: Ok(None),
        measured,
        gpu_models: models,
        elastic_default: false,
        compute_default: None,
    }
}

#[test]
fn a_prediction_sets_the_budget_and_waits_for_the_cycle() {
    let job = job(None);
    let t = predict(&job, TrainingJobStatus::default(), facts(1, &|_| None, &[]));
    let s = &t.status;
    assert_eq!(t.decision, "predicted");
    assert_eq!(s.phase, Phase::Pending);
    assert_eq!(s.attempt, 1);
    assert_eq!(s.micro_batch, Some(8));
    assert_eq!(s.grad_accum, Some(1));
    assert_eq!(s.batch_shape.as_deref(), Some("8x1"));
    assert_eq!(s.prediction_source.as_deref(), Some("model"));
    let (predicted, budget) = (s.predicted_bytes.unwrap(), s.budget_bytes.unwrap());
    assert!(budget > predicted, "headroom: {budget} over {predicted}");
    assert_eq!(
        s.predicted.as_deref(),
        Some(human_bytes(predicted).as_str())
    );
    assert!(s.breakdown.is_some());
    assert_eq!(s.model_signature, Some(job_signature(&job, 8)));
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(
        s.message.as_deref(),
        Some(
            format!(
                "budget {} per GPU ({} from model)",
                human_bytes(budget),
                human_bytes(predicted)
            )
            .as_str()
        )
    );
    let valid = condition(s, CONDITION_INVALID);
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "Valid")
    );
    assert_eq!(events(&t), vec![(reason::PREDICTED, false)]);
    assert!(t.effects.contains(&Effect::WakeScheduler));
    assert_eq!(t.requeue, Requeue::After(WAIT_RESYNC));
}

#[test]
fn a_retry_is_predicted_at_its_backed_off_micro_batch() {
    let job = job(None);
    let status = TrainingJobStatus {
        micro_batch: Some(4),
        attempt: 2,
        ..Default::default()
    };
    let t = predict(&job, status, facts(2, &|_| None, &[]));
    assert_eq!(t.status.phase, Phase::Retrying);
    assert_eq!(t.status.attempt, 2);
    assert_eq!(t.status.batch_shape.as_deref(), Some("4x2"));
    assert_eq!(t.status.model_signature, Some(job_signature(&job, 4)));
}

/// Each OOM proved its attempt's budget too small: the retry's prediction is
/// raised by the headroom's ratio per OOM (at least 5%), up to the largest
/// GPU; a requested budget stays as the user set it.
#[test]
fn a_retry_after_ooms_gets_a_raised_budget_and_a_request_stays() {
    let oom = |attempt: u32| AttemptRecord {
        attempt,
        micro_batch: 8,
        grad_accum: 1,
        outcome: OUTCOME_OOM.into(),
        message: None,
    };
    let retry = |ooms: u32| TrainingJobStatus {
        micro_batch: Some(4),
        attempt: ooms + 1,
        history: (1..=ooms).map(oom).collect(),
        ..Default::default()
    };
    let models = [("H200".to_string(), 141 * GIB)];
    // (what, spec, OOMs so far, the expected factor)
    let cases: [(&str, serde_json::Value, u32, f64); 5] = [
        ("no OOM yet", json!({"memory": {"headroom": 0.2}}), 0, 1.0),
        (
            "one OOM, headroom 20%",
            json!({"memory": {"headroom": 0.2}}),
            1,
            1.2,
        ),
        (
            "two OOMs compound",
            json!({"memory": {"headroom": 0.2}}),
            2,
            1.44,
        ),
        (
            "no headroom: 5% per OOM",
            json!({"memory": {"headroom": 0.0}}),
            2,
            1.1025,
        ),
        (
            "a request is kept",
            json!({"memory": {"request": "3Gi"}}),
            2,
            1.0,
        ),
    ];
    for (what, spec, ooms, factor) in cases {
        let job = job_with(spec, None);
        let base = predict(&job, retry(0), facts(1, &|_| None, &models)).status;
        let t = predict(&job, retry(ooms), facts(ooms + 1, &|_| None, &models));
        let expected = |bytes: u64| (bytes as f64 * factor).ceil() as u64;
        let (b0, b) = (base.budget_bytes.unwrap(), t.status.budget_bytes.unwrap());
        assert!(
            expected(b0).abs_diff(b) <= 1,
            "{what}: {b} vs {b0} x {factor}"
        );
        let (p0, p) = (
            base.predicted_bytes.unwrap(),
            t.status.predicted_bytes.unwrap(),
        );
        assert!(
            expected(p0).abs_diff(p) <= 1,
            "{what}: predicted {p} vs {p0} x {factor}"
        );
        let m0 = base.gpu_model_budgets[0].budget_bytes;
        let m = t.status.gpu_model_budgets[0].budget_bytes;
        assert!(
            expected(m0).abs_diff(m) <= 1,
            "{what}: per-model {m} vs {m0} x {factor}"
        );
        let message = t.status.message.unwrap();
        assert_eq!(
            message.contains(&format!("raised x{factor:.2} after {ooms} OOM(s)")),
            factor > 1.0,
            "{what}: {message}"
        );
    }
    // Never above the largest GPU the job could use.
    let job = job_with(json!({"memory": {"headroom": 0.2}}), None);
    let base = predict(&job, retry(0), facts(1, &|_| None, &models)).status;
    let small = [("H200".to_string(), base.budget_bytes.unwrap() + 1)];
    let t = predict(&job, retry(3), facts(4, &|_| None, &small));
    assert_eq!(t.status.budget_bytes, Some(base.budget_bytes.unwrap() + 1));
    assert_eq!(
        t.status.gpu_model_budgets[0].budget_bytes,
        base.budget_bytes.unwrap() + 1
    );
}

#[test]
fn a_learned_start_applies_unless_the_status_has_a_micro_batch() {
    let job = job(None);
    let mut f = facts(1, &|_| None, &[]);
    f.learned = Some((2, "other".into()));
    let t = predict(&job, TrainingJobStatus::default(), f);
    assert_eq!(t.status.micro_batch, Some(2));
    assert!(
        t.status.message.as_deref().unwrap().ends_with(
            "; starts at micro-batch 2, where job other of the same model absorbed its OOMs"
        ),
        "{:?}",
        t.status.message
    );

    let mut f = facts(1, &|_| None, &[]);
    f.learned = Some((2, "other".into()));
    let status = TrainingJobStatus {
        micro_batch: Some(4),
        ..Default::default()
    };
    assert_eq!(predict(&job, status, f).status.micro_batch, Some(4));
}

#[test]
fn a_measured_peak_of_the_same_signature_replaces_the_prediction() {
    let job = job(None);
    let signature = job_signature(&job, 8);
    let measured = |s: &str| (s == signature).then_some(5 * GIB);
    let t = predict(&job, TrainingJobStatus::default(), facts(1, &measured, &[]));
    assert_eq!(t.status.prediction_source.as_deref(), Some("measured"));
    assert_eq!(t.status.predicted_bytes, Some(5 * GIB));
    // Another attempt's micro-batch has another signature.
    let status = TrainingJobStatus {
        micro_batch: Some(4),
        ..Default::default()
    };
    let t = predict(&job, status, facts(2, &measured, &[]));
    assert_eq!(t.status.prediction_source.as_deref(), Some("model"));
    // The same model in another tenant's namespace does not read that peak.
    let mut elsewhere = job.clone();
    elsewhere.metadata.namespace = Some("team-b".into());
    let t = predict(
        &elsewhere,
        TrainingJobStatus::default(),
        facts(1, &measured, &[]),
    );
    assert_eq!(t.status.prediction_source.as_deref(), Some("model"));
}

#[test]
fn each_gpu_model_of_the_cluster_gets_its_budget() {
    let job = job(None);
    let models = [
        ("H200".to_string(), 141 * GIB),
        ("L4".to_string(), 24 * GIB),
    ];
    let t = predict(
        &job,
        TrainingJobStatus::default(),
        facts(1, &|_| None, &models),
    );
    let names: Vec<&str> = t
        .status
        .gpu_model_budgets
        .iter()
        .map(|b| b.gpu_model.as_str())
        .collect();
    assert_eq!(names, ["H200", "L4"]);
    assert!(
        t.status
            .gpu_model_budgets
            .iter()
            .all(|b| b.micro_batch == 8)
    );
}

/// (what, job, status, the profile read, text of the message)
type InvalidCase = (
    &'static str,
    TrainingJob,
    TrainingJobStatus,
    Result<Option<&'static str>, String>,
    &'static str,
);

#[test]
fn a_spec_that_cannot_be_run_fails_as_invalid() {
    let not_divisible = TrainingJobStatus {
        micro_batch: Some(3),
        ..Default::default()
    };
    let cases: Vec<InvalidCase> = vec![
        (
            "an unreadable profile",
            job(None),
            TrainingJobStatus::default(),
            Err("spec.model.profile: ConfigMap p does not exist".into()),
            "ConfigMap p does not exist",
        ),
        (
            "a micro-batch that does not divide the global batch",
            job(None),
            not_divisible,
            Ok(None),
            "batch.global 8 is not divisible by micro-batch 3 x 1 GPU(s)",
        ),
        (
            "a template that sets nodeName",
            job_with(
                json!({"template": {"spec": {"nodeName": "x", "containers": [{"name": "t", "image": "i"}]}}}),
                None,
            ),
            TrainingJobStatus::default(),
            Ok(None),
            "nodeName",
        ),
        (
            "a request that is no quantity",
            job_with(json!({"memory": {"request": "lots"}}), None),
            TrainingJobStatus::default(),
            Ok(None),
            "spec.memory.request \"lots\" is not a positive quantity",
        ),
    ];
    for (what, job, status, profile, text) in cases {
        let mut f = facts(1, &|_| None, &[]);
        f.profile = profile;
        let t = predict(&job, status, f);
        assert_eq!(t.decision, "invalid", "{what}");
        assert_eq!(t.status.phase, Phase::Failed, "{what}");
        assert!(
            t.status.message.as_deref().unwrap().contains(text),
            "{what}: {:?}",
            t.status.message
        );
        assert_eq!(t.status.budget_bytes, None, "{what}");
    }
}

fn rejection() -> PodRejection {
    PodRejection {
        reason: "Forbidden",
        message: "pods \"j-1\" is forbidden: violates PodSecurity \"baseline:latest\": hostPath volumes (volume \"data\")".into(),
    }
}

/// A placed job whose pod the API server refused.
fn pod_rejected_status() -> TrainingJobStatus {
    pod_rejected(&job(None), placed(1, Phase::Placed), &rejection()).status
}

#[test]
fn a_refused_pod_fails_the_job_with_the_server_s_words_and_waits_for_a_change() {
    let t = pod_rejected(&job(None), placed(1, Phase::Placed), &rejection());
    assert_eq!(t.decision, "pod rejected");
    assert_eq!(
        t.status.phase,
        Phase::Failed,
        "a failed job holds no placement"
    );
    assert_eq!(t.status.observed_generation, Some(1));
    let message = t.status.message.clone().unwrap_or_default();
    assert!(message.contains("(Forbidden)"), "{message}");
    assert!(message.contains("hostPath volumes"), "{message}");
    let rejected = condition(&t.status, CONDITION_POD_REJECTED);
    assert_eq!(
        (
            rejected.status.as_str(),
            rejected.reason.as_str(),
            rejected.message.as_str()
        ),
        ("True", "Forbidden", rejection().message.as_str())
    );
    let complete = condition(&t.status, CONDITION_COMPLETE);
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("True", reason::POD_REJECTED)
    );
    assert_eq!(events(&t), vec![(reason::POD_REJECTED, true)]);
    assert_eq!(t.requeue, Requeue::AwaitChange);
    assert!(is_pod_rejected(&t.status) && !is_invalid(&t.status));

    // Starting over after a change keeps the condition, now false.
    let mut changed = job(Some(t.status));
    changed.metadata.generation = Some(2);
    match next_step(&changed, |_| None) {
        Step::Predict { status, .. } => {
            assert!(!is_pod_rejected(&status));
            let c = condition(&status, CONDITION_POD_REJECTED);
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", "SpecChanged")
            );
            assert_eq!(status.phase, Phase::Pending);
            assert_eq!(status.placement, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_sets_both_conditions_and_waits_for_a_change() {
    let t = invalid(&job(None), TrainingJobStatus::default(), "spec.x: bad");
    assert_eq!(t.status.phase, Phase::Failed);
    assert_eq!(t.status.message.as_deref(), Some("spec.x: bad"));
    assert_eq!(t.status.observed_generation, Some(1));
    let invalid = condition(&t.status, CONDITION_INVALID);
    assert_eq!(
        (
            invalid.status.as_str(),
            invalid.reason.as_str(),
            invalid.message.as_str()
        ),
        ("True", "InvalidSpec", "spec.x: bad")
    );
    let complete = condition(&t.status, CONDITION_COMPLETE);
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("True", reason::FAILED)
    );
    assert_eq!(events(&t), vec![(reason::INVALID, true)]);
    assert_eq!(t.requeue, Requeue::AwaitChange);
}

#[test]
fn a_placement_is_recorded_with_its_pod_name_and_counted() {
    let job = job(None);
    let t = place(&job, predicted(1, Phase::Pending), placement(1));
    let s = &t.status;
    assert_eq!(t.decision, "placed");
    assert_eq!(s.phase, Phase::Placed);
    assert_eq!(s.gpu.as_deref(), Some("0"));
    assert_eq!(s.pod_name.as_deref(), Some("j-a1"));
    assert_eq!(s.placement, Some(placement(1)));
    assert_eq!(
        s.message.as_deref(),
        Some("placed on n1 GPU 0 with 10.0 GiB per GPU (fraction 0.125)")
    );
    assert_eq!(condition(s, CONDITION_PLACED).status, "True");
    // No GPU-model budget: the attempt's own budget and shape stay.
    assert_eq!(s.budget_bytes, Some(10 * GIB));
    assert_eq!(s.micro_batch, Some(8));
    assert_eq!(
        t.effects[0],
        Effect::CountPlacement {
            first_attempt: true
        }
    );
    assert_eq!(events(&t), vec![(reason::PLACED, false)]);
    assert_eq!(t.requeue, Requeue::After(WRITE_RESYNC));

    let mut retry = predicted(2, Phase::Retrying);
    retry.history.push(AttemptRecord {
        attempt: 1,
        micro_batch: 8,
        grad_accum: 1,
        outcome: OUTCOME_OOM.into(),
        message: None,
    });
    let t = place(&job, retry, placement(2));
    assert_eq!(t.status.pod_name.as_deref(), Some("j-a2"));
    assert_eq!(
        t.effects[0],
        Effect::CountPlacement {
            first_attempt: false
        }
    );
}

#[test]
fn a_placement_on_a_gpu_model_takes_that_model_s_shape_and_budget() {
    let job = job(None);
    let mut status = predicted(1, Phase::Pending);
    let budget = |model: &str, micro| GpuModelBudget {
        gpu_model: model.into(),
        micro_batch: micro,
        predicted_bytes: 3 * GIB,
        budget_bytes: 4 * GIB,
    };
    status.gpu_model_budgets = vec![budget("L4", 2), budget("H200", 4)];
    let on = |model: &str| PlacementStatus {
        gpu_model: Some(model.into()),
        ..placement(1)
    };
    let t = place(&job, status.clone(), on("H200"));
    assert_eq!(t.status.batch_shape.as_deref(), Some("4x2"));
    assert_eq!(t.status.micro_batch, Some(4));
    assert_eq!(t.status.grad_accum, Some(2));
    assert_eq!(t.status.model_signature, Some(job_signature(&job, 4)));
    assert_eq!(t.status.budget_bytes, Some(4 * GIB));
    assert_eq!(t.status.predicted_bytes, Some(3 * GIB));
    assert_eq!(t.status.predicted.as_deref(), Some("3.0 GiB"));

    // A model without a budget of its own keeps the attempt's.
    let t = place(&job, status.clone(), on("A100-80GB"));
    assert_eq!(t.status.budget_bytes, Some(10 * GIB));
    assert_eq!(t.status.micro_batch, Some(8));

    // A model micro-batch that does not divide the batch keeps the shape.
    status.gpu_model_budgets = vec![budget("H200", 3)];
    let t = place(&job, status, on("H200"));
    assert_eq!(t.status.micro_batch, Some(8));
    assert_eq!(t.status.budget_bytes, Some(4 * GIB));
}

#[test]
fn waiting_says_why_once() {
    let job = job(None);
    let t = wait(&job, predicted(1, Phase::Pending), None);
    assert_eq!(t.status, predicted(1, Phase::Pending));
    assert_eq!(t.effects, vec![Effect::WakeScheduler]);
    assert_eq!(t.requeue, Requeue::After(WRITE_RESYNC));

    for (never_fits, why) in [(false, reason::WAITING), (true, reason::FITS_NO_NODE)] {
        let t = wait(
            &job,
            predicted(1, Phase::Pending),
            Some(("no room", never_fits)),
        );
        assert_eq!(t.status.message.as_deref(), Some("no room"));
        let placed = condition(&t.status, CONDITION_PLACED);
        assert_eq!(
            (placed.status.as_str(), placed.reason.as_str()),
            ("False", why)
        );
        assert_eq!(events(&t), vec![(why, never_fits)]);
        assert_eq!(t.requeue, Requeue::After(WAIT_RESYNC));

        // The same message again: nothing to write or publish.
        let again = wait(&job, t.status.clone(), Some(("no room", never_fits)));
        assert_eq!(again.status, t.status);
        assert!(again.effects.is_empty());
    }
}

fn pod(outcome: PodOutcome) -> PodFacts {
    PodFacts {
        outcome,
        ..Default::default()
    }
}

#[test]
fn the_pod_s_outcome_moves_the_phase() {
    let job = job(None);
    // (outcome, phase, decision, requeue, event reasons)
    let cases = [
        (
            PodOutcome::Waiting,
            Phase::Placed,
            "pod-waiting",
            Requeue::After(POD_RESYNC),
            vec![],
        ),
        (
            PodOutcome::Running,
            Phase::Running,
            "running",
            Requeue::After(POD_RESYNC),
            vec![],
        ),
        (
            PodOutcome::Succeeded,
            Phase::Succeeded,
            "succeeded",
            Requeue::AwaitChange,
            vec![(reason::SUCCEEDED, false)],
        ),
        (
            PodOutcome::Failed("container t exited with code 1".into()),
            Phase::Failed,
            "failed",
            Requeue::AwaitChange,
            vec![(reason::FAILED, true)],
        ),
        (
            PodOutcome::OutOfMemory("CUDA out of memory".into()),
            Phase::Retrying,
            "oom-retry",
            Requeue::After(RETRY_DELAY),
            vec![(reason::OUT_OF_MEMORY, true), (reason::RETRYING, false)],
        ),
    ];
    for (outcome, phase, decision, requeue, reasons) in cases {
        let what = format!("{outcome:?}");
        let t = follow(&job, placed(1, Phase::Placed), &placement(1), pod(outcome));
        assert_eq!(t.status.phase, phase, "{what}");
        assert_eq!(t.decision, decision, "{what}");
        assert_eq!(t.requeue, requeue, "{what}");
        assert_eq!(events(&t), reasons, "{what}");
    }
}

#[test]
fn a_finished_attempt_is_recorded_released_and_its_prediction_error_observed() {
    let job = job(None);
    let mut status = placed(1, Phase::Running);
    status.measured_peak_bytes = Some(4 * GIB);
    let t = follow(&job, status, &placement(1), pod(PodOutcome::Succeeded));
    let s = &t.status;
    assert_eq!(
        s.history,
        vec![AttemptRecord {
            attempt: 1,
            micro_batch: 8,
            grad_accum: 1,
            outcome: "Succeeded".into(),
            message: None,
        }]
    );
    assert_eq!(s.message.as_deref(), Some("attempt 1 succeeded"));
    let released = condition(s, CONDITION_PLACED);
    assert_eq!(
        (released.status.as_str(), released.reason.as_str()),
        ("False", "Released")
    );
    let complete = condition(s, CONDITION_COMPLETE);
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("True", "Succeeded")
    );
    assert_eq!(
        t.effects[..3],
        [
            Effect::PredictionError(1.0),
            Effect::ForgetAssignment,
            Effect::WakeScheduler
        ]
    );

    // A failure keeps its message; nothing measured, no error observed.
    let t = follow(
        &job,
        placed(1, Phase::Running),
        &placement(1),
        pod(PodOutcome::Failed("exit 3".into())),
    );
    assert_eq!(t.status.message.as_deref(), Some("exit 3"));
    assert_eq!(t.status.history[0].outcome, "Failed");
    assert_eq!(t.status.history[0].message.as_deref(), Some("exit 3"));
    assert_eq!(condition(&t.status, CONDITION_COMPLETE).reason, "Failed");
    assert!(
        !t.effects
            .iter()
            .any(|e| matches!(e, Effect::PredictionError(_)))
    );
    assert!(t.effects.contains(&Effect::ForgetAssignment));

    // A measured peak of zero is no measurement.
    let mut status = placed(1, Phase::Running);
    status.measured_peak_bytes = Some(0);
    let t = follow(&job, status, &placement(1), pod(PodOutcome::Succeeded));
    assert!(
        !t.effects
            .iter()
            .any(|e| matches!(e, Effect::PredictionError(_)))
    );
}

#[test]
fn an_oom_starts_the_next_attempt_at_half_the_micro_batch_and_deletes_the_pod() {
    let job = job(None);
    let mut status = placed(1, Phase::Running);
    status.measured_peak_bytes = Some(9 * GIB);
    status.measured = Some("9.0 GiB".into());
    status.gpu = Some("0".into());
    status.pod_name = Some("j-a1".into());
    let t = follow(
        &job,
        status,
        &placement(1),
        pod(PodOutcome::OutOfMemory("CUDA out of memory".into())),
    );
    let s = &t.status;
    assert_eq!(s.attempt, 2);
    assert_eq!(s.phase, Phase::Retrying);
    assert_eq!((s.micro_batch, s.grad_accum), (Some(4), Some(2)));
    assert_eq!(s.batch_shape.as_deref(), Some("4x2"));
    assert_eq!(
        (&s.placement, &s.gpu, &s.pod_name, s.budget_bytes),
        (&None, &None, &None, None)
    );
    assert_eq!((s.measured_peak_bytes, &s.measured), (None, &None));
    assert_eq!(
        s.history,
        vec![AttemptRecord {
            attempt: 1,
            micro_batch: 8,
            grad_accum: 1,
            outcome: OUTCOME_OOM.into(),
            message: Some("CUDA out of memory".into()),
        }]
    );
    assert_eq!(
        s.message.as_deref(),
        Some("out of memory at micro-batch 8; retrying with 4x2 (global batch 8 kept)")
    );
    assert_eq!(condition(s, CONDITION_PLACED).reason, reason::RETRYING);
    assert!(t.effects.contains(&Effect::CountOomRetry));
    assert!(t.effects.contains(&Effect::WakeScheduler));
    assert_eq!(t.effects.last(), Some(&Effect::DeletePod("j-a1".into())));
    // The retried attempt is predicted again.
    let mut next = job.clone();
    next.status = Some(t.status.clone());
    assert_eq!(kind(&next_step(&next, |_| None)), "predict a2 forget=false");
}

/// A finished attempt 1 at 8x1 with `outcome`, for a job's history.
fn record(outcome: &str) -> AttemptRecord {
    AttemptRecord {
        attempt: 1,
        micro_batch: 8,
        grad_accum: 1,
        outcome: outcome.into(),
        message: None,
    }
}

#[test]
fn an_oom_at_the_floor_or_past_the_retries_fails_and_keeps_the_pod() {
    let oom = || pod(PodOutcome::OutOfMemory("CUDA out of memory".into()));
    let mut at_floor = placed(1, Phase::Running);
    at_floor.micro_batch = Some(1);
    at_floor.grad_accum = Some(8);
    let mut retries_used = placed(3, Phase::Running);
    retries_used.history = vec![record(OUTCOME_OOM), record(OUTCOME_OOM)];
    // Only OOMs count against maxOOMRetries.
    let mut other_failures = placed(3, Phase::Running);
    other_failures.history = vec![record("Failed"), record(OUTCOME_OOM)];
    let cases = [
        ("at the floor", json!({}), at_floor, true),
        (
            "past maxOOMRetries",
            json!({"maxOOMRetries": 2}),
            retries_used,
            true,
        ),
        (
            "one OOM of two used",
            json!({"maxOOMRetries": 2}),
            other_failures,
            false,
        ),
    ];
    for (what, extra, status, fails) in cases {
        let job = job_with(extra, None);
        let attempt = status.attempt;
        let t = follow(&job, status, &placement(attempt), oom());
        if !fails {
            assert_eq!(t.decision, "oom-retry", "{what}");
            continue;
        }
        assert_eq!(t.decision, "oom-failed", "{what}");
        assert_eq!(t.status.phase, Phase::Failed, "{what}");
        assert_eq!(
            t.status.history.last().unwrap().outcome,
            OUTCOME_OOM,
            "{what}"
        );
        assert_eq!(condition(&t.status, CONDITION_COMPLETE).reason, OUTCOME_OOM);
        assert!(
            !t.effects.iter().any(|e| matches!(e, Effect::DeletePod(_))),
            "{what}: {:?}",
            t.effects
        );
        assert_eq!(
            events(&t),
            vec![(reason::OUT_OF_MEMORY, true), (reason::FAILED, true)],
            "{what}"
        );
    }
}

#[test]
fn the_agent_s_oom_report_counts_like_the_pod_s_oom_exit() {
    let job = job(None);
    let facts = PodFacts {
        outcome: PodOutcome::Running,
        agent_reported_oom: true,
        ..Default::default()
    };
    let t = follow(&job, placed(1, Phase::Running), &placement(1), facts);
    assert_eq!(t.decision, "oom-retry");
    assert!(
        t.status.history[0]
            .message
            .as_deref()
            .unwrap()
            .contains("node agent"),
        "{:?}",
        t.status.history
    );
}

#[test]
fn the_measured_peak_only_grows() {
    let job = job(None);
    let run = |before: Option<u64>, reported: Option<u64>| {
        let mut status = placed(1, Phase::Running);
        status.measured_peak_bytes = before;
        let facts = PodFacts {
            outcome: PodOutcome::Running,
            measured_peak: reported,
            ..Default::default()
        };
        let s = follow(&job, status, &placement(1), facts).status;
        (s.measured_peak_bytes, s.measured)
    };
    assert_eq!(
        run(None, Some(5 * GIB)),
        (Some(5 * GIB), Some("5.0 GiB".into()))
    );
    assert_eq!(run(Some(6 * GIB), Some(5 * GIB)), (Some(6 * GIB), None));
    assert_eq!(run(Some(6 * GIB), None), (Some(6 * GIB), None));
}

#[test]
fn oom_absorbed_in_process_update_the_shape_and_publish_an_event_each() {
    let job = job(None);
    let oom = |from: u32, to: u32| AbsorbedOom {
        from_micro: from,
        to_micro: to,
        from_accum: 8 / from,
        to_accum: 8 / to,
        time: format!("2026-12-01T10:0{to}:00Z"),
    };
    let facts = PodFacts {
        outcome: PodOutcome::Running,
        observed_shape: Some(ObservedShape {
            micro_batch: 2,
            grad_accum: 4,
            absorbed_ooms: vec![oom(8, 4), oom(4, 2)],
            progress: None,
        }),
        ..Default::default()
    };
    let t = follow(
        &job,
        placed(1, Phase::Running),
        &placement(1),
        facts.clone(),
    );
    let s = &t.status;
    assert_eq!(s.batch_shape.as_deref(), Some("2x4"));
    assert_eq!((s.micro_batch, s.grad_accum), (Some(2), Some(4)));
    assert_eq!(s.model_signature, Some(job_signature(&job, 2)));
    assert_eq!(s.absorbed_ooms, vec![oom(8, 4), oom(4, 2)]);
    assert_eq!(
        s.message.as_deref(),
        Some("OOM absorbed in-process: micro 4 -> 2, accumulation 2 -> 4")
    );
    assert_eq!(
        events(&t),
        vec![(reason::OOM_ABSORBED, false), (reason::OOM_ABSORBED, false)]
    );
    // Reported again: already recorded, nothing new.
    let again = follow(&job, t.status.clone(), &placement(1), facts);
    assert_eq!(again.status, t.status);
    assert!(again.effects.is_empty());
}

#[test]
fn gpu_model_budgets_pick_their_own_micro_batch_only_for_an_auto_first_attempt() {
    let models = [("H200".to_string(), 141 * GIB)];
    let at = |auto: bool, attempt: u32| {
        let job = job_with(
            json!({"batch": {"global": 8, "micro": 8, "autoMicro": auto}}),
            None,
        );
        let status = TrainingJobStatus {
            micro_batch: Some(4),
            attempt,
            ..Default::default()
        };
        let t = predict(&job, status, facts(attempt, &|_| None, &models));
        t.status.gpu_model_budgets[0].micro_batch
    };
    // The attempt's micro-batch, unless autoMicro chooses on the first attempt
    // (the largest that fits an H200: the spec's 8).
    assert_eq!(at(false, 1), 4);
    assert_eq!(at(false, 2), 4);
    assert_eq!(at(true, 2), 4);
    assert_eq!(at(true, 1), 8);
}

/// Event notes of the effects, in order.
fn notes(t: &Transition) -> Vec<String> {
    t.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Event { note, .. } => Some(note.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_prediction_is_held_with_its_note_and_an_invalid_spec_is_not() {
    let job = job(None);
    let measured = |_: &str| None;
    let t = predict(&job, TrainingJobStatus::default(), facts(1, &measured, &[]));
    let note = notes(&t).remove(0);
    let Prediction::Hold(deferred) = defer_prediction(t.clone()) else {
        panic!("a prediction is held");
    };
    assert_eq!(deferred.status, t.status);
    assert_eq!(deferred.note, note);
    assert!(deferred.note.starts_with("attempt 1: predicted peak"));
    // The event waits for the write; the wake-up does not.
    assert_eq!(deferred.effects, vec![Effect::WakeScheduler]);
    assert_eq!(deferred.requeue, t.requeue);

    let bad = job_with(json!({"batch": {"global": 7, "micro": 2}}), None);
    let t = predict(&bad, TrainingJobStatus::default(), facts(1, &measured, &[]));
    assert_eq!(t.decision, "invalid");
    assert_eq!(defer_prediction(t.clone()), Prediction::Write(t));
}

#[test]
fn a_held_prediction_is_written_with_the_cycle_s_verdict_in_one_event() {
    let job = job(None);
    let written = TrainingJobStatus::default();
    let held = predicted(1, Phase::Pending);

    // Placed: the placement's event carries the prediction's note.
    let t = with_held(
        place(&job, held.clone(), placement(1)),
        &written,
        "predicted 8 GiB",
    );
    assert_eq!(t.status.placement, Some(placement(1)));
    assert_eq!(t.status.budget_bytes, held.budget_bytes);
    assert_eq!(events(&t), vec![(reason::PLACED, false)]);
    let note = &notes(&t)[0];
    assert!(
        note.starts_with("predicted 8 GiB; placed on n1 GPU 0"),
        "{note}"
    );

    // Waiting: the same, on the waiting event.
    let t = with_held(
        wait(&job, held.clone(), Some(("no room", false))),
        &written,
        "p",
    );
    assert_eq!(t.status.message.as_deref(), Some("no room"));
    assert_eq!(events(&t), vec![(reason::WAITING, false)]);
    assert_eq!(notes(&t), vec!["p; no room".to_string()]);

    // A step without an event of its own publishes the prediction's.
    let quiet = wait(&job, held.clone(), Some(("no room", false)));
    let t = with_held(
        Transition {
            effects: vec![Effect::WakeScheduler],
            ..quiet
        },
        &written,
        "p",
    );
    assert_eq!(events(&t), vec![(reason::PREDICTED, false)]);
    assert_eq!(notes(&t), vec!["p".to_string()]);
    assert_eq!(t.effects[1], Effect::WakeScheduler);

    // No verdict yet: nothing is written, the prediction stays held.
    let t = with_held(wait(&job, held.clone(), None), &written, "p");
    assert_eq!(t.status, written);
    assert_eq!(t.effects, vec![Effect::WakeScheduler]);
    assert!(events(&t).is_empty());
}

#[test]
fn a_job_larger_than_every_gpu_fails_once_with_what_would_make_it_fit() {
    // A 70B LLaMA shape in fp32 with AdamW: over a TiB per GPU.
    let big = job_with(
        json!({"model": {"transformer": {"layers": 80, "hidden": 8192, "heads": 64, "kvHeads": 8,
                "ffn": 28672, "vocab": 128256, "seqLen": 2048, "mlp": "swiglu", "norm": "rmsnorm",
                "positional": "rotary", "tiedEmbeddings": false},
               "precision": "fp32", "optimizer": "adamw"},
               "batch": {"global": 64, "micro": 1, "minMicro": 1}}),
        None,
    );
    let t = predict(&big, TrainingJobStatus::default(), facts(1, &|_| None, &[]));
    assert_eq!(t.decision, "never fits");
    assert_eq!(t.status.phase, Phase::Failed);
    let message = t.status.message.clone().unwrap();
    assert!(message.starts_with("never fits: needs "), "{message}");
    assert!(message.contains("zeroStage: 3 with gpus: "), "{message}");
    let c = condition(&t.status, CONDITION_INVALID);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NeverFits")
    );
    // One figure of the need, as the budget.
    let budget = t.status.budget_bytes;
    assert_eq!(budget, None, "a job that never fits records no budget");

    // A request larger than any GPU made fails too, without advice; one a
    // GPU made could hold (larger than any the cluster has) waits for it, and
    // one the cluster's own larger GPU holds is predicted as usual.
    let requesting = |request: &str| {
        let mut job = job_with(json!({}), None);
        job.spec.memory = Some(crate::api::MemorySpec {
            request: Some(request.into()),
            headroom: 0.05,
        });
        job
    };
    let decide = |request: &str, models: &[(String, u64)]| {
        predict(
            &requesting(request),
            TrainingJobStatus::default(),
            facts(1, &|_| None, models),
        )
    };
    let t = decide("400Gi", &[]);
    assert_eq!(t.decision, "never fits");
    let message = t.status.message.unwrap();
    assert!(message.contains("(spec.memory.request)"), "{message}");
    assert!(!message.contains(';'), "{message}");
    assert_eq!(decide("200Gi", &[]).decision, "predicted");
    let future = [("future".to_string(), 500 * GIB)];
    assert_eq!(decide("400Gi", &future).decision, "predicted");
}

#[test]
fn an_attempt_without_its_gpu_is_retried_at_the_same_shape_and_is_not_an_oom() {
    let no_gpu = || pod(PodOutcome::NoGpu("vramfit: no GPU device".into()));
    // maxOOMRetries 0: an OOM would fail the job, a missing GPU does not.
    let job = job_with(json!({"maxOOMRetries": 0}), None);
    let mut status = placed(2, Phase::Running);
    status.micro_batch = Some(4);
    status.grad_accum = Some(2);
    status.history = vec![record(OUTCOME_OOM)];
    let t = follow(&job, status, &placement(2), no_gpu());
    assert_eq!(t.decision, "no-gpu-retry");
    assert_eq!(t.status.phase, Phase::Retrying);
    assert_eq!(t.status.attempt, 3);
    assert_eq!(
        (t.status.micro_batch, t.status.grad_accum),
        (Some(4), Some(2)),
        "the same shape"
    );
    let last = t.status.history.last().unwrap();
    assert_eq!(
        (last.attempt, last.outcome.as_str(), last.message.as_deref()),
        (2, OUTCOME_NO_GPU, Some("vramfit: no GPU device"))
    );
    assert!(t.status.placement.is_none(), "the placement is released");
    assert!(
        !t.effects.iter().any(|e| matches!(e, Effect::CountOomRetry)),
        "not counted as an OOM retry: {:?}",
        t.effects
    );
    assert!(
        t.effects
            .iter()
            .any(|e| matches!(e, Effect::DeletePod(p) if p.ends_with("-a2"))),
        "{:?}",
        t.effects
    );
    assert_eq!(events(&t), vec![(reason::NO_GPU, true)]);

    // After as many as allowed, the job fails and says why.
    let mut status = placed(9, Phase::Running);
    status.history = vec![record(OUTCOME_NO_GPU); MAX_NO_GPU_RETRIES as usize];
    let t = follow(&job_with(json!({}), None), status, &placement(9), no_gpu());
    assert_eq!(t.decision, "failed");
    assert_eq!(t.status.phase, Phase::Failed);
    assert!(
        t.status
            .message
            .as_deref()
            .unwrap()
            .contains("started without their GPU"),
        "{:?}",
        t.status.message
    );
}

#[test]
fn the_prediction_fixes_the_compute_share_the_spec_else_the_cluster_default() {
    // (spec.gpuComputePercent, the controller's default, the status's share)
    for (spec, default, want) in [
        (None, None, None),
        (None, Some(60), Some(60)),
        (Some(25), Some(60), Some(25)),
        (Some(25), None, Some(25)),
    ] {
        let mut job = job(None);
        job.spec.gpu_compute_percent = spec;
        let facts = PredictFacts {
            compute_default: default,
            ..facts(1, &|_| None, &[])
        };
        let t = predict(&job, TrainingJobStatus::default(), facts);
        assert_eq!(t.status.compute_percent, want, "{spec:?} {default:?}");
    }
}
