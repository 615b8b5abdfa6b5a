//! Elastic placement's decisions, and the prediction, placement and OOM
//! transitions with elastic inputs.

use super::*;
use crate::api::{AttemptRecord, ElasticPlacement, Phase, PlacementStatus};
use crate::controller::transition::{
    Effect, OUTCOME_OOM, PodFacts, PredictFacts, follow, place, predict,
};
use crate::job::exit::PodOutcome;
use serde_json::json;

const GIB: u64 = 1 << 30;

/// A GPT-2 job, global batch 64 at micro-batch 16 on one GPU (micro-batches
/// 1 to 64 divide it), its `spec.batch.elastic` as given.
fn gpt2(elastic: Option<bool>) -> TrainingJob {
    let mut job = TrainingJob::test("g")
        .batch(64, 16)
        .model(
            json!({"huggingFace": {"seqLen": 1024, "config": {"model_type": "gpt2"}},
            "precision": "amp-bf16", "optimizer": "adamw"}),
        )
        .build();
    job.spec.batch.elastic = elastic;
    job
}

#[test]
fn the_job_s_own_setting_wins_over_the_cluster_default() {
    // (spec.batch.elastic, --elastic-default, elastic)
    let cases = [
        (None, false, false),
        (None, true, true),
        (Some(false), true, false),
        (Some(true), false, true),
        (Some(true), true, true),
    ];
    for (own, default, expected) in cases {
        assert_eq!(
            is_elastic(&gpt2(own).spec, default),
            expected,
            "{own:?} {default}"
        );
    }
}

fn record(attempt: u32, outcome: &str) -> AttemptRecord {
    AttemptRecord {
        attempt,
        micro_batch: 8,
        grad_accum: 8,
        outcome: outcome.into(),
        message: None,
    }
}

#[test]
fn an_attempt_after_an_elastic_one_starts_from_its_preferred_shape_unless_it_ran_out_of_memory() {
    // (preferred micro-batch kept, history, attempt, micro-batch to start from)
    let cases = [
        // no elastic attempt before
        (None, vec![record(1, "NoGpuDevice")], 2, None),
        // the elastic attempt ended without an OOM: its preferred shape
        (Some(16), vec![record(1, "NoGpuDevice")], 2, Some(16)),
        // after an OOM the back-off's shape (status.microBatch)
        (Some(16), vec![record(1, OUTCOME_OOM)], 2, None),
        // a record of another attempt than the previous one
        (Some(16), vec![record(1, "NoGpuDevice")], 3, None),
        // no attempt ended yet
        (Some(16), vec![], 1, None),
    ];
    for (preferred, history, attempt, expected) in cases {
        let status = TrainingJobStatus {
            preferred_micro_batch: preferred,
            micro_batch: Some(8),
            history: history.clone(),
            ..Default::default()
        };
        assert_eq!(
            restart_micro(&status, attempt, OUTCOME_OOM),
            expected,
            "{preferred:?} {history:?} {attempt}"
        );
    }
}

fn no_measurement(_: &str) -> Option<u64> {
    None
}

fn facts(models: &[(String, u64)], elastic_default: bool) -> PredictFacts<'_> {
    PredictFacts {
        attempt: 1,
        learned: None,
        profile: Ok(None),
        measured: &no_measurement,
        gpu_models: models,
        elastic_default,
        compute_default: None,
    }
}

#[test]
fn an_elastic_job_s_prediction_lists_its_smaller_shapes_with_budgets_and_step_times() {
    let t = predict(
        &gpt2(Some(true)),
        TrainingJobStatus::default(),
        facts(&[], false),
    );
    let s = &t.status;
    let shapes: Vec<(u32, u32)> = s
        .elastic_shapes
        .iter()
        .map(|r| (r.micro_batch, r.grad_accum))
        .collect();
    assert_eq!(shapes, [(1, 64), (2, 32), (4, 16), (8, 8)]);
    let preferred = s.budget_bytes.unwrap();
    for pair in s.elastic_shapes.windows(2) {
        assert!(pair[0].budget_bytes < pair[1].budget_bytes, "{pair:?}");
        assert!(pair[0].relative_step_time > pair[1].relative_step_time);
    }
    for row in &s.elastic_shapes {
        assert!(row.budget_bytes < preferred && row.gpu_model.is_none());
        assert!(row.relative_step_time > 1.0, "{row:?}");
        // Budgets are predicted as the attempt's: the predictor plus headroom.
        let at =
            crate::job::budget::attempt_budget(&gpt2(None), row.micro_batch, None, None).unwrap();
        assert_eq!(
            (row.predicted_bytes, row.budget_bytes),
            (at.predicted, at.budget)
        );
    }
    // The cluster default makes a job that does not say elastic; one that
    // says no, or no default, gets no shapes.
    for (own, default, listed) in [
        (None, true, true),
        (None, false, false),
        (Some(false), true, false),
    ] {
        let t = predict(
            &gpt2(own),
            TrainingJobStatus::default(),
            facts(&[], default),
        );
        assert_eq!(
            !t.status.elastic_shapes.is_empty(),
            listed,
            "{own:?} {default}"
        );
    }
}

#[test]
fn shapes_are_predicted_per_gpu_model_when_the_job_is_and_raised_after_ooms() {
    let models = [("H100-80GB".to_string(), 80 * GIB)];
    let t = predict(
        &gpt2(Some(true)),
        TrainingJobStatus::default(),
        facts(&models, false),
    );
    let s = &t.status;
    assert_eq!(s.gpu_model_budgets.len(), 1);
    assert!(!s.elastic_shapes.is_empty());
    assert!(
        s.elastic_shapes
            .iter()
            .all(|r| r.gpu_model.as_deref() == Some("H100-80GB") && r.micro_batch < 16),
        "{:?}",
        s.elastic_shapes
    );
    // A retry after an OOM raises the shapes' budgets as it raises its own.
    let after_oom = TrainingJobStatus {
        attempt: 2,
        micro_batch: Some(16),
        history: vec![AttemptRecord {
            micro_batch: 32,
            grad_accum: 2,
            ..record(1, OUTCOME_OOM)
        }],
        ..Default::default()
    };
    let first = predict(
        &gpt2(Some(true)),
        TrainingJobStatus::default(),
        facts(&[], false),
    );
    let retry = predict(
        &gpt2(Some(true)),
        after_oom,
        PredictFacts {
            attempt: 2,
            ..facts(&[], false)
        },
    );
    for (a, b) in first
        .status
        .elastic_shapes
        .iter()
        .zip(&retry.status.elastic_shapes)
    {
        assert_eq!(a.micro_batch, b.micro_batch);
        assert!(b.budget_bytes > a.budget_bytes, "{a:?} {b:?}");
    }
    // A memory request is the budget at any micro-batch: nothing smaller.
    let mut requested = gpt2(Some(true));
    requested.spec.memory = Some(crate::api::MemorySpec {
        request: Some("20Gi".into()),
        headroom: 0.05,
    });
    let t = predict(&requested, TrainingJobStatus::default(), facts(&[], false));
    assert!(
        t.status.elastic_shapes.is_empty(),
        "{:?}",
        t.status.elastic_shapes
    );
}

#[test]
fn a_new_attempt_after_an_elastic_one_is_predicted_at_the_preferred_shape() {
    // Attempt 1 ran 8x8 elastically (preferring 16x4) and ended without an
    // OOM: attempt 2 asks for 16x4 again.
    let status = TrainingJobStatus {
        attempt: 2,
        micro_batch: Some(8),
        grad_accum: Some(8),
        preferred_micro_batch: Some(16),
        history: vec![record(1, "NoGpuDevice")],
        ..Default::default()
    };
    let t = predict(
        &gpt2(Some(true)),
        status.clone(),
        PredictFacts {
            attempt: 2,
            ..facts(&[], false)
        },
    );
    assert_eq!(t.status.batch_shape.as_deref(), Some("16x4"));
    assert_eq!(t.status.preferred_micro_batch, None);
    // After an OOM at 8x8: the back-off's 4x16 (in microBatch).
    let status = TrainingJobStatus {
        micro_batch: Some(4),
        grad_accum: Some(16),
        history: vec![record(1, OUTCOME_OOM)],
        ..status
    };
    let t = predict(
        &gpt2(Some(true)),
        status,
        PredictFacts {
            attempt: 2,
            ..facts(&[], false)
        },
    );
    assert_eq!(t.status.batch_shape.as_deref(), Some("4x16"));
}

fn elastic_placement(micro: Option<u32>, wait: Option<f64>) -> PlacementStatus {
    PlacementStatus {
        compute_percent: None,
        node: "n1".into(),
        gpus: vec![crate::api::AssignedGpu {
            index: 0,
            uuid: "GPU-0".into(),
        }],
        budget_bytes: 13 * GIB,
        memory_fraction: 0.1,
        attempt: 1,
        gpu_model: None,
        micro_batch: micro,
        elastic: Some(ElasticPlacement {
            preferred_micro_batch: 16,
            preferred_grad_accum: 4,
            preferred_budget_bytes: 22 * GIB,
            relative_step_time: 1.18,
            expected_wait_seconds: wait,
        }),
    }
}

fn events(effects: &[Effect]) -> Vec<(&'static str, String)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Event { reason, note, .. } => Some((*reason, note.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn an_elastic_placement_runs_the_chosen_shape_and_says_why() {
    let job = gpt2(Some(true));
    let predicted = predict(&job, TrainingJobStatus::default(), facts(&[], false)).status;
    let eight = predicted
        .elastic_shapes
        .iter()
        .find(|r| r.micro_batch == 8)
        .unwrap()
        .clone();
    // (expected wait, the note's end)
    let cases = [
        (None, "no expected end"),
        (Some(540.0), "expected wait 9 min"),
        (Some(30.0), "expected wait 30 s"),
    ];
    for (wait, words) in cases {
        let t = place(&job, predicted.clone(), elastic_placement(Some(8), wait));
        let s = &t.status;
        assert_eq!(
            (s.micro_batch, s.grad_accum, s.batch_shape.as_deref()),
            (Some(8), Some(8), Some("8x8"))
        );
        assert_eq!(s.budget_bytes, Some(13 * GIB));
        assert_eq!(s.predicted_bytes, Some(eight.predicted_bytes));
        assert_eq!(s.preferred_micro_batch, Some(16));
        assert_eq!(
            s.model_signature,
            Some(crate::job::signature::job_signature(&job, 8))
        );
        assert!(
            s.message
                .as_deref()
                .unwrap()
                .ends_with("; elastic shape 8x8 instead of 16x4"),
            "{:?}",
            s.message
        );
        let notes = events(&t.effects);
        assert_eq!(notes[0].0, "Placed");
        assert_eq!(
            notes[1],
            (
                "ElasticShape",
                format!(
                    "preferred 16x4 needs 22.0 GiB per GPU, placed 8x8 in 13.0 GiB, \
                     predicted 1.18x step time, {words}"
                )
            )
        );
    }
    // A placement without elastic figures: the predicted shape, no event.
    let plain = PlacementStatus {
        elastic: None,
        micro_batch: None,
        ..elastic_placement(None, None)
    };
    let t = place(&job, predicted.clone(), plain);
    assert_eq!(t.status.batch_shape.as_deref(), Some("16x4"));
    assert_eq!(t.status.preferred_micro_batch, None);
    assert!(events(&t.effects).iter().all(|(r, _)| *r != "ElasticShape"));
}

#[test]
fn an_oom_of_an_elastic_attempt_halves_the_shape_it_ran_with() {
    let job = gpt2(Some(true));
    let predicted = predict(&job, TrainingJobStatus::default(), facts(&[], false)).status;
    let placement = elastic_placement(Some(8), None);
    let placed = place(&job, predicted, placement.clone()).status;
    let t = follow(
        &job,
        placed,
        &placement,
        PodFacts {
            outcome: PodOutcome::OutOfMemory("CUDA out of memory".into()),
            ..Default::default()
        },
    );
    let s = &t.status;
    assert_eq!(s.phase, Phase::Retrying);
    assert_eq!(s.batch_shape.as_deref(), Some("4x16"));
    assert_eq!((s.history[0].micro_batch, s.history[0].grad_accum), (8, 8));
    // The next prediction starts from the halved shape, not the preferred.
    let next = predict(
        &job,
        s.clone(),
        PredictFacts {
            attempt: 2,
            ..facts(&[], false)
        },
    );
    assert_eq!(next.status.batch_shape.as_deref(), Some("4x16"));
}

#[test]
fn the_wait_is_said_in_minutes_or_seconds_or_as_unknown() {
    let cases = [
        (None, "no expected end"),
        (Some(0.0), "expected wait 0 s"),
        (Some(59.0), "expected wait 59 s"),
        (Some(60.0), "expected wait 1 min"),
        (Some(545.0), "expected wait 9 min"),
    ];
    for (seconds, words) in cases {
        assert_eq!(wait_words(seconds), words);
    }
}
