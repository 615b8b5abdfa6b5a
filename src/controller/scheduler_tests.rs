use super::*;
use crate::api::TrainingJobStatus;
use crate::place::{GpuSpec, Inventory, NodeSpec, PolicyKind};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const GIB: u64 = 1 << 30;

fn job(name: &str, priority: i32, created: &str, budget: u64) -> TrainingJob {
    TrainingJob::test(name)
        .priority(priority)
        .created(created)
        .budget(budget)
        .build()
}

fn one_gpu_cluster(capacity: u64) -> ClusterView {
    let mut view = ClusterView {
        inventory: Inventory {
            nodes: vec![NodeSpec {
                name: "n1".into(),
                cpu_milli: 64_000,
                memory_bytes: 512 * GIB,
                taints: vec![],
                gpus: vec![GpuSpec {
                    model: "H200".into(),
                    capacity,
                }],
            }],
        },
        ..ClusterView::default()
    };
    view.uuids.insert(("n1".into(), 0), "GPU-0".into());
    view
}

/// A placement of `budget` on GPU 0 of `n1` (a 100 GiB GPU).
fn on_gpu0(budget: u64) -> PlacementStatus {
    PlacementStatus {
        compute_percent: None,
        node: "n1".into(),
        gpus: vec![AssignedGpu {
            index: 0,
            uuid: "GPU-0".into(),
        }],
        budget_bytes: budget,
        memory_fraction: budget as f64 / (100 * GIB) as f64,
        attempt: 1,
        gpu_model: None,
        micro_batch: None,
        elastic: None,
    }
}

fn placed_names(verdicts: &[(String, Verdict)]) -> Vec<&str> {
    verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Place(_)))
        .map(|(k, _)| k.as_str())
        .collect()
}

#[test]
fn higher_priority_then_older_jobs_get_the_room_first() {
    let view = one_gpu_cluster(100 * GIB);
    let cases = [
        // (jobs, expected placed) with room for two 40 GiB jobs.
        (
            vec![
                job("old", 0, "2026-01-01T00:00:00Z", 40 * GIB),
                job("new", 0, "2026-01-02T00:00:00Z", 40 * GIB),
                job("newest", 0, "2026-01-03T00:00:00Z", 40 * GIB),
            ],
            vec!["ml/old", "ml/new"],
        ),
        (
            vec![
                job("old", 0, "2026-01-01T00:00:00Z", 40 * GIB),
                job("new", 0, "2026-01-02T00:00:00Z", 40 * GIB),
                job("urgent", 5, "2026-01-03T00:00:00Z", 40 * GIB),
            ],
            vec!["ml/urgent", "ml/old"],
        ),
        // An older job that does not fit does not block a smaller one behind it.
        (
            vec![
                job("first", 0, "2026-01-01T00:00:00Z", 70 * GIB),
                job("huge", 0, "2026-01-02T00:00:00Z", 50 * GIB),
                job("small", 0, "2026-01-03T00:00:00Z", 20 * GIB),
            ],
            vec!["ml/first", "ml/small"],
        ),
    ];
    for (jobs, expected) in cases {
        let refs: Vec<&TrainingJob> = jobs.iter().collect();
        let verdicts = plan_cycle(&view, &[], &refs, Policy::new(PolicyKind::BestFit, 42));
        assert_eq!(placed_names(&verdicts), expected);
    }
}

#[test]
fn recorded_placements_and_pending_assignments_count_in_the_ledger() {
    let view = one_gpu_cluster(100 * GIB);
    let mut running = job("running", 0, "2026-01-01T00:00:00Z", 60 * GIB);
    let status = running.status.as_mut().unwrap();
    status.placement = Some(on_gpu0(60 * GIB));
    let waiting = job("waiting", 0, "2026-01-02T00:00:00Z", 50 * GIB);
    let ledger = recorded_placements([&running]);
    assert_eq!(ledger.len(), 1);
    let verdicts = plan_cycle(
        &view,
        &ledger,
        &[&waiting],
        Policy::new(PolicyKind::BestFit, 42),
    );
    match &verdicts[0].1 {
        Verdict::Wait {
            message,
            never_fits,
        } => {
            assert!(!never_fits);
            assert!(message.contains("largest free slot 40.0 GiB"), "{message}");
        }
        other => panic!("expected a wait, got {other:?}"),
    }

    // An assignment the job's status does not show yet still holds its room.
    let assignments = Assignments::default();
    let assigned = job("assigned", 0, "2026-01-01T00:00:00Z", 60 * GIB);
    let placement = on_gpu0(60 * GIB);
    assert!(assignments.record("uid-assigned", 1, Verdict::Place(placement)));
    let ledger = assignments.pending_ledger(&[&assigned, &waiting]);
    assert_eq!(ledger.len(), 1, "kept until status shows it");
    let verdicts = plan_cycle(
        &view,
        &ledger,
        &[&waiting],
        Policy::new(PolicyKind::BestFit, 42),
    );
    assert!(
        placed_names(&verdicts).is_empty(),
        "no double booking: {verdicts:?}"
    );
    // Once the job is gone, its assignment is dropped.
    assert!(assignments.pending_ledger(&[&waiting]).is_empty());
}

#[test]
fn a_job_bigger_than_every_gpu_is_told_so() {
    let view = one_gpu_cluster(24 * GIB);
    let big = job("big", 0, "2026-01-01T00:00:00Z", 40 * GIB);
    let verdicts = plan_cycle(&view, &[], &[&big], Policy::new(PolicyKind::Vramfit, 42));
    match &verdicts[0].1 {
        Verdict::Wait {
            message,
            never_fits: true,
        } => assert!(message.contains("24.0 GiB"), "{message}"),
        other => panic!("{other:?}"),
    }
}

/// Two nodes: `h200` with one 141 GiB GPU, `l4` with one 24 GiB GPU.
fn h200_and_l4() -> ClusterView {
    let node = |name: &str, model: &str, capacity: u64| NodeSpec {
        name: name.into(),
        cpu_milli: 64_000,
        memory_bytes: 512 * GIB,
        taints: vec![],
        gpus: vec![GpuSpec {
            model: model.into(),
            capacity,
        }],
    };
    ClusterView {
        inventory: Inventory {
            nodes: vec![node("h200", "H200", 141 * GIB), node("l4", "L4", 24 * GIB)],
        },
        ..ClusterView::default()
    }
}

fn per_model(model: &str, micro: u32, budget: u64) -> crate::api::GpuModelBudget {
    crate::api::GpuModelBudget {
        gpu_model: model.into(),
        micro_batch: micro,
        predicted_bytes: budget,
        budget_bytes: budget,
    }
}

#[test]
fn a_job_predicted_per_gpu_model_gets_the_budget_of_the_model_it_lands_on() {
    let view = h200_and_l4();
    let policy = || Policy::new(PolicyKind::BestFit, 42);
    // (budgets per model, the top-level budget, where it goes, with what budget and micro)
    let cases = [
        // fits both: the smaller GPU, with the smaller GPU's budget
        (
            vec![per_model("H200", 8, 30 * GIB), per_model("L4", 2, 20 * GIB)],
            "l4",
            20 * GIB,
            2,
        ),
        // the L4 budget does not fit the L4: the H200 with its own budget
        (
            vec![per_model("H200", 8, 30 * GIB), per_model("L4", 8, 28 * GIB)],
            "h200",
            30 * GIB,
            8,
        ),
        // only the H200 was predicted: the L4 gets the top-level budget (too big)
        (vec![per_model("H200", 4, 60 * GIB)], "h200", 60 * GIB, 4),
    ];
    for (budgets, node, budget, micro) in cases {
        let mut j = job("j", 0, "2026-01-01T00:00:00Z", 60 * GIB);
        j.status.as_mut().unwrap().gpu_model_budgets = budgets;
        let verdicts = plan_cycle(&view, &[], &[&j], policy());
        let Verdict::Place(p) = &verdicts[0].1 else {
            panic!("not placed: {:?}", verdicts[0].1)
        };
        assert_eq!(
            (p.node.as_str(), p.budget_bytes, p.micro_batch),
            (node, budget, Some(micro))
        );
        assert_eq!(
            p.gpu_model.as_deref(),
            Some(if node == "l4" { "L4" } else { "H200" })
        );
    }
    // A GPU model the prediction did not cover is tried with the top-level budget.
    let mut j = job("j", 0, "2026-01-01T00:00:00Z", 10 * GIB);
    j.status.as_mut().unwrap().gpu_model_budgets = vec![per_model("H200", 8, 150 * GIB)];
    let verdicts = plan_cycle(&view, &[], &[&j], policy());
    let Verdict::Place(p) = &verdicts[0].1 else {
        panic!("not placed: {:?}", verdicts[0].1)
    };
    assert_eq!(
        (p.node.as_str(), p.budget_bytes, p.gpu_model.as_deref()),
        ("l4", 10 * GIB, None)
    );
    // Nothing fits anywhere: never fits, naming each model.
    j.status.as_mut().unwrap().budget_bytes = Some(200 * GIB);
    let verdicts = plan_cycle(&view, &[], &[&j], policy());
    match &verdicts[0].1 {
        Verdict::Wait {
            message,
            never_fits,
        } => {
            assert!(never_fits, "{message}");
            assert!(
                message.contains("H200:") && message.contains("other models:"),
                "{message}"
            );
        }
        other => panic!("placed: {other:?}"),
    }
}

#[test]
fn the_current_attempt_is_the_status_attempt_and_at_least_one() {
    let mut j = job("j", 0, "2026-01-01T00:00:00Z", GIB);
    // (status attempt, current attempt); no status at all is the first attempt.
    for (attempt, current) in [(None, 1), (Some(0), 1), (Some(1), 1), (Some(3), 3)] {
        j.status = attempt.map(|attempt| TrainingJobStatus {
            attempt,
            ..Default::default()
        });
        assert_eq!(current_attempt(&j), current, "status attempt {attempt:?}");
    }
    // The cycle's placement is for the current attempt.
    j.status = Some(TrainingJobStatus {
        attempt: 3,
        budget_bytes: Some(10 * GIB),
        ..Default::default()
    });
    let verdicts = plan_cycle(
        &one_gpu_cluster(100 * GIB),
        &[],
        &[&j],
        Policy::new(PolicyKind::BestFit, 42),
    );
    let Verdict::Place(p) = &verdicts[0].1 else {
        panic!("not placed: {:?}", verdicts[0].1)
    };
    assert_eq!((p.attempt, p.budget_bytes), (3, 10 * GIB));
    assert_eq!(p.gpus[0].uuid, "GPU-0");
}

#[test]
fn a_job_waits_only_when_predicted_alive_unplaced_and_unassigned() {
    let waiting = || job("j", 0, "2026-01-01T00:00:00Z", 10 * GIB);
    // Each row differs from the waiting job in one fact.
    let no_status = {
        let mut j = waiting();
        j.status = None;
        j
    };
    let deleted = {
        let mut j = waiting();
        j.metadata.deletion_timestamp = Some(Time("2026-01-02T00:00:00Z".parse().unwrap()));
        j
    };
    let finished = {
        let mut j = waiting();
        j.status.as_mut().unwrap().phase = crate::api::Phase::Succeeded;
        j
    };
    let failed = {
        let mut j = waiting();
        j.status.as_mut().unwrap().phase = crate::api::Phase::Failed;
        j
    };
    let unpredicted = {
        let mut j = waiting();
        j.status.as_mut().unwrap().budget_bytes = None;
        j
    };
    let placed = {
        let mut j = waiting();
        j.status.as_mut().unwrap().placement = Some(on_gpu0(10 * GIB));
        j
    };
    let placed_before = {
        // A placement of an earlier attempt does not count.
        let mut j = waiting();
        let status = j.status.as_mut().unwrap();
        status.placement = Some(on_gpu0(10 * GIB));
        status.attempt = 2;
        j
    };
    let cases = [
        ("predicted, alive, not placed", waiting(), false, true),
        ("assigned by the cycle", waiting(), true, false),
        ("no status", no_status, false, false),
        ("being deleted", deleted, false, false),
        ("succeeded", finished, false, false),
        ("failed", failed, false, false),
        ("not predicted", unpredicted, false, false),
        ("placed in status", placed, false, false),
        ("placed for an earlier attempt", placed_before, false, true),
    ];
    for (what, job, assigned, expected) in cases {
        assert_eq!(is_waiting(&job, assigned), expected, "{what}");
    }
}

#[test]
fn models_with_their_own_budget_are_not_tried_again_with_the_top_level_one() {
    // The H200 was predicted at 150 GiB (more than it has); the top-level
    // budget of 30 GiB is for models without their own prediction (the L4,
    // too small for it), not a second chance on the H200.
    let view = h200_and_l4();
    let mut j = job("j", 0, "2026-01-01T00:00:00Z", 30 * GIB);
    j.status.as_mut().unwrap().gpu_model_budgets = vec![per_model("H200", 8, 150 * GIB)];
    let verdicts = plan_cycle(&view, &[], &[&j], Policy::new(PolicyKind::BestFit, 42));
    match &verdicts[0].1 {
        Verdict::Wait {
            message,
            never_fits,
        } => {
            assert!(never_fits, "{message}");
            assert!(
                message.contains("H200:") && message.contains("other models:"),
                "{message}"
            );
        }
        other => panic!("placed: {other:?}"),
    }
}

fn wait(message: &str) -> Verdict {
    Verdict::Wait {
        message: message.into(),
        never_fits: false,
    }
}

#[test]
fn a_recorded_verdict_reports_whether_it_changed_and_is_kept_per_attempt() {
    let assignments = Assignments::default();
    let start = std::time::Instant::now();
    let later = start + super::WAIT_MESSAGE_REFRESH;
    let never = Verdict::Wait {
        message: "bigger than any GPU".into(),
        never_fits: true,
    };
    // (verdict, when, changed?)
    let steps = [
        (wait("no room"), start, true),
        (wait("no room"), start, false),
        // A new message of the same kind is told once the refresh is due.
        (wait("still no room"), start, false),
        (wait("still no room, elsewhere"), later, true),
        (wait("no room at all"), later, false),
        // Another kind is told at once.
        (never, later, true),
        (Verdict::Place(on_gpu0(GIB)), later, true),
    ];
    for (i, (verdict, now, changed)) in steps.into_iter().enumerate() {
        assert_eq!(
            assignments.record_at("uid-a", 1, verdict.clone(), now),
            changed,
            "step {i}: {verdict:?}"
        );
        if let Verdict::Wait { .. } = verdict {
            assert_eq!(assignments.waiting("uid-a", 1), Some(verdict));
            assert_eq!(assignments.placement("uid-a", 1), None);
        }
    }
    assert_eq!(assignments.placement("uid-a", 1), Some(on_gpu0(GIB)));
    assert_eq!(
        assignments.waiting("uid-a", 1),
        None,
        "placed: no longer waits"
    );
    // Per job and attempt.
    assert_eq!(assignments.placement("uid-a", 2), None);
    assert_eq!(assignments.placement("uid-b", 1), None);
    assert_eq!(assignments.waiting("uid-b", 1), None);
}

#[test]
fn forgetting_a_job_drops_only_its_own_entries() {
    let assignments = Assignments::default();
    for uid in ["uid-a", "uid-b"] {
        assignments.record(uid, 1, Verdict::Place(on_gpu0(GIB)));
        assignments.record(uid, 2, wait("no room"));
    }
    assignments.forget("uid-a");
    assert_eq!(assignments.placement("uid-a", 1), None);
    assert_eq!(assignments.waiting("uid-a", 2), None);
    assert_eq!(assignments.placement("uid-b", 1), Some(on_gpu0(GIB)));
    assert_eq!(assignments.waiting("uid-b", 2), Some(wait("no room")));
}

/// A status of attempt 2 written by this process drops the assignments of
/// attempt 1 at once, before the cache shows that status: a reconcile of the
/// job cached at an older version would otherwise take attempt 1's
/// assignment as a placement to record and create its pod a second time
/// (seen in the kill test after an OOM retry).
#[test]
fn a_later_attempt_written_drops_the_earlier_attempts_assignments() {
    let assignments = Assignments::default();
    assignments.record("uid-a", 1, Verdict::Place(on_gpu0(GIB)));
    assignments.mark_recorded("uid-a", 1);
    assignments.record("uid-a", 2, wait("no room"));
    assignments.record("uid-a", 3, Verdict::Place(on_gpu0(2 * GIB)));
    assignments.record("uid-b", 1, Verdict::Place(on_gpu0(GIB)));
    let _ = assignments.lock().take_touched();

    assignments.forget_before("uid-a", 2);
    assert_eq!(assignments.placement("uid-a", 1), None);
    assert!(!assignments.is_recorded("uid-a", 1));
    assert_eq!(assignments.waiting("uid-a", 2), Some(wait("no room")));
    assert_eq!(assignments.placement("uid-a", 3), Some(on_gpu0(2 * GIB)));
    assert_eq!(assignments.placement("uid-b", 1), Some(on_gpu0(GIB)));
    assert_eq!(assignments.lock().take_touched(), vec!["uid-a".to_string()]);

    // The cached job at attempt 1 lags the write: attempt 1 is not waiting
    // (the cycle would place it again), attempt 2 is up to the cycle.
    assert!(assignments.is_taken("uid-a", 1));
    assert!(!assignments.is_taken("uid-a", 2));
    assert!(assignments.is_taken("uid-a", 3), "assigned");

    // Nothing before the first attempt: nothing changes, nothing is touched.
    assignments.forget_before("uid-b", 1);
    assert_eq!(assignments.placement("uid-b", 1), Some(on_gpu0(GIB)));
    assert!(assignments.lock().take_touched().is_empty());
    assert!(assignments.is_taken("uid-b", 1), "assigned");
    assert!(!assignments.is_taken("uid-b", 2));

    // A job forgotten (finished, deleted) leaves nothing behind.
    assignments.forget("uid-a");
    assert!(!assignments.is_taken("uid-a", 1));
}

#[test]
fn an_assignment_leaves_the_ledger_once_its_job_moved_on() {
    let assigned = || job("a", 0, "2026-01-01T00:00:00Z", 10 * GIB);
    let with_status = |f: &dyn Fn(&mut TrainingJobStatus)| {
        let mut j = assigned();
        f(j.status.as_mut().unwrap());
        j
    };
    // (what, the job as the cycle sees it, still in the ledger?)
    let cases = [
        ("status does not show it yet", assigned(), true),
        (
            "status shows it",
            with_status(&|s| s.placement = Some(on_gpu0(10 * GIB))),
            false,
        ),
        (
            "the job moved to attempt 2",
            with_status(&|s| s.attempt = 2),
            false,
        ),
        (
            "the job succeeded",
            with_status(&|s| s.phase = crate::api::Phase::Succeeded),
            false,
        ),
        (
            "the job failed",
            with_status(&|s| s.phase = crate::api::Phase::Failed),
            false,
        ),
    ];
    for (what, job, kept) in cases {
        let assignments = Assignments::default();
        assignments.record("uid-a", 1, Verdict::Place(on_gpu0(10 * GIB)));
        let ledger = assignments.pending_ledger(&[&job]);
        assert_eq!(ledger.len(), usize::from(kept), "{what}");
        if kept {
            assert_eq!(
                (ledger[0].job_id.as_str(), ledger[0].gpu_budget),
                ("ml/a", 10 * GIB),
                "{what}"
            );
        }
        // Dropped entries stay dropped; kept ones stay kept.
        assert_eq!(assignments.placement("uid-a", 1).is_some(), kept, "{what}");
    }
}

#[test]
fn a_placement_marked_recorded_stays_so_until_a_new_decision_or_its_entry_goes() {
    let assignments = Assignments::default();
    assignments.mark_recorded("uid-a", 1);
    assert!(
        !assignments.is_recorded("uid-a", 1),
        "only a placement the cycle made is marked"
    );
    assignments.record("uid-a", 1, Verdict::Place(on_gpu0(10 * GIB)));
    assignments.mark_recorded("uid-a", 1);
    assert!(assignments.is_recorded("uid-a", 1));
    assert!(!assignments.is_recorded("uid-a", 2), "per attempt");
    assignments.unmark_recorded("uid-a", 1);
    assert!(!assignments.is_recorded("uid-a", 1));

    assignments.mark_recorded("uid-a", 1);
    assignments.record("uid-a", 1, Verdict::Place(on_gpu0(20 * GIB)));
    assert!(
        !assignments.is_recorded("uid-a", 1),
        "a new placement is not written yet"
    );

    assignments.mark_recorded("uid-a", 1);
    let a = job("a", 0, "2026-12-01T00:00:00Z", 20 * GIB);
    assert_eq!(assignments.pending_ledger(&[&a]).len(), 1);
    assert!(assignments.is_recorded("uid-a", 1), "kept while pending");
    assert!(assignments.pending_ledger(&[]).is_empty());
    assert!(!assignments.is_recorded("uid-a", 1), "the job is gone");

    assignments.record("uid-a", 1, Verdict::Place(on_gpu0(20 * GIB)));
    assignments.mark_recorded("uid-a", 1);
    assignments.forget("uid-a");
    assert!(!assignments.is_recorded("uid-a", 1));
}

/// A smaller shape of an elastic job, on the default profile.
fn shape(micro: u32, budget: u64, relative: f64) -> crate::api::ShapeBudget {
    crate::api::ShapeBudget {
        gpu_model: None,
        micro_batch: micro,
        grad_accum: 64 / micro,
        predicted_bytes: budget,
        budget_bytes: budget,
        relative_step_time: relative,
    }
}

/// A waiting job at 16x4 (global batch 64) needing 50 GiB, with the smaller
/// shapes `shapes` (none: a job that is not elastic).
fn elastic_job(shapes: Vec<crate::api::ShapeBudget>) -> TrainingJob {
    let mut j = job("e", 0, "2026-01-02T00:00:00Z", 50 * GIB);
    j.spec.batch.global = 64;
    j.spec.batch.micro = 16;
    let status = j.status.as_mut().unwrap();
    status.micro_batch = Some(16);
    status.grad_accum = Some(4);
    status.elastic_shapes = shapes;
    j
}

fn three_shapes() -> Vec<crate::api::ShapeBudget> {
    vec![
        shape(2, 12 * GIB, 2.0),
        shape(8, 30 * GIB, 1.1),
        shape(4, 20 * GIB, 1.3),
    ]
}

#[test]
fn an_elastic_job_whose_shape_fits_nowhere_starts_with_the_fastest_smaller_one_that_fits() {
    let view = one_gpu_cluster(100 * GIB);
    // (GiB held by a running job, smaller shapes, the micro-batch placed with
    // and its budget; None: waits)
    let cases = [
        // 40 GiB free: 8x8 (30 GiB) is the fastest that fits
        (60, three_shapes(), Some((8, 30 * GIB))),
        // 25 GiB free: 8x8 does not fit, 4x16 does
        (75, three_shapes(), Some((4, 20 * GIB))),
        // 10 GiB free: none fits, the job waits
        (90, three_shapes(), None),
        // not elastic (no shapes): waits as before
        (60, vec![], None),
        // a shape not below the preferred budget is never taken
        (60, vec![shape(8, 50 * GIB, 1.1)], None),
    ];
    for (held, shapes, expected) in cases {
        let ledger = vec![recorded_placement(
            &job("running", 0, "2026-01-01T00:00:00Z", held * GIB),
            &on_gpu0(held * GIB),
        )];
        let j = elastic_job(shapes.clone());
        let verdicts = plan_cycle(&view, &ledger, &[&j], Policy::new(PolicyKind::BestFit, 42));
        match (&verdicts[0].1, expected) {
            (Verdict::Place(p), Some((micro, budget))) => {
                assert_eq!((p.micro_batch, p.budget_bytes), (Some(micro), budget));
                let elastic = p.elastic.as_ref().expect("elastic figures");
                assert_eq!(elastic.preferred_micro_batch, 16);
                assert_eq!(elastic.preferred_grad_accum, 4);
                assert_eq!(elastic.preferred_budget_bytes, 50 * GIB);
                let relative = shapes.iter().find(|s| s.micro_batch == micro).unwrap();
                assert_eq!(elastic.relative_step_time, relative.relative_step_time);
                // No running job has an expected end.
                assert_eq!(elastic.expected_wait_seconds, None);
            }
            (Verdict::Wait { message, .. }, None) => {
                assert!(message.contains("waiting for room"), "{message}")
            }
            (other, expected) => panic!("held {held}: {other:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn an_elastic_job_whose_shape_fits_takes_it_and_non_elastic_verdicts_are_unchanged() {
    let view = one_gpu_cluster(100 * GIB);
    let policy = || Policy::new(PolicyKind::BestFit, 42);
    // Room for the preferred shape: no smaller one.
    let j = elastic_job(three_shapes());
    let verdicts = plan_cycle(&view, &[], &[&j], policy());
    let Verdict::Place(p) = &verdicts[0].1 else {
        panic!("{:?}", verdicts[0].1)
    };
    assert_eq!(
        (p.budget_bytes, p.micro_batch, &p.elastic),
        (50 * GIB, None, &None)
    );
    // The same cycles with and without the shapes of a job that is not
    // elastic: the verdicts of the job without are those of plan_cycle
    // before elastic placement (the preferred budget or a wait).
    for held in [0, 40, 60, 90] {
        let ledger = vec![recorded_placement(
            &job("running", 0, "2026-01-01T00:00:00Z", held * GIB),
            &on_gpu0(held * GIB),
        )];
        let plain = elastic_job(vec![]);
        let verdict = plan_cycle(&view, &ledger, &[&plain], policy()).remove(0).1;
        match verdict {
            Verdict::Place(p) => {
                assert!(held <= 50, "held {held}");
                assert_eq!(
                    (p.budget_bytes, p.micro_batch, p.elastic),
                    (50 * GIB, None, None)
                );
            }
            Verdict::Wait { never_fits, .. } => assert!(held > 50 && !never_fits, "held {held}"),
        }
    }
}

#[test]
fn a_known_wait_for_the_preferred_shape_keeps_an_elastic_job_waiting() {
    let view = one_gpu_cluster(100 * GIB);
    let running = job("running", 0, "2026-01-01T00:00:00Z", 60 * GIB);
    let ledger = vec![recorded_placement(&running, &on_gpu0(60 * GIB))];
    let j = elastic_job(three_shapes());
    let policy = || Policy::new(PolicyKind::BestFit, 42);
    // (expected end of the running job, placed smaller). Its remaining work
    // unknown, the job does not trade a known wait for a slower start.
    let cases = [(None, true), (Some(600.0), false), (Some(100_000.0), false)];
    for (end, smaller) in cases {
        let ends = ExpectedEnds {
            now: 1000.0,
            ends: end
                .map(|e: f64| vec![(1000.0 + e, ledger[0].clone())])
                .unwrap_or_default(),
        };
        let verdicts = plan_cycle_at(&view, &ledger, &[&j], policy(), &ends);
        assert_eq!(
            matches!(verdicts[0].1, Verdict::Place(_)),
            smaller,
            "end {end:?}: {:?}",
            verdicts[0].1
        );
    }
}

#[test]
fn an_elastic_job_predicted_per_gpu_model_tries_the_smaller_model_first_with_its_shapes() {
    let view = h200_and_l4();
    // Neither model fits the preferred budget (never fits); the L4 has a
    // smaller shape that fits it, the H200 one of its own.
    let mut j = elastic_job(vec![
        crate::api::ShapeBudget {
            gpu_model: Some("L4".into()),
            ..shape(4, 20 * GIB, 1.3)
        },
        crate::api::ShapeBudget {
            gpu_model: Some("H200".into()),
            ..shape(8, 100 * GIB, 1.1)
        },
    ]);
    let status = j.status.as_mut().unwrap();
    status.gpu_model_budgets = vec![
        per_model("H200", 16, 150 * GIB),
        per_model("L4", 8, 30 * GIB),
    ];
    status.budget_bytes = Some(150 * GIB);
    let verdicts = plan_cycle(&view, &[], &[&j], Policy::new(PolicyKind::BestFit, 42));
    let Verdict::Place(p) = &verdicts[0].1 else {
        panic!("{:?}", verdicts[0].1)
    };
    assert_eq!(
        (
            p.node.as_str(),
            p.gpu_model.as_deref(),
            p.micro_batch,
            p.budget_bytes
        ),
        ("l4", Some("L4"), Some(4), 20 * GIB)
    );
    let elastic = p.elastic.as_ref().unwrap();
    assert_eq!(
        (
            elastic.preferred_micro_batch,
            elastic.preferred_budget_bytes
        ),
        (8, 30 * GIB)
    );
    // With the L4 full, the H200's own smaller shape.
    let l4_full = Placement {
        gpu_compute: 0,
        job_id: "other".into(),
        node: "l4".into(),
        gpu_indices: vec![0],
        gpu_budget: 24 * GIB,
        cpu_milli: 0,
        memory_bytes: 0,
    };
    let verdicts = plan_cycle(
        &view,
        &[l4_full],
        &[&j],
        Policy::new(PolicyKind::BestFit, 42),
    );
    let Verdict::Place(p) = &verdicts[0].1 else {
        panic!("{:?}", verdicts[0].1)
    };
    assert_eq!(
        (
            p.node.as_str(),
            p.gpu_model.as_deref(),
            p.micro_batch,
            p.budget_bytes
        ),
        ("h200", Some("H200"), Some(8), 100 * GIB)
    );
}

#[test]
fn an_elastic_job_with_an_expected_duration_starts_smaller_only_when_the_wait_costs_more() {
    let view = one_gpu_cluster(100 * GIB);
    let policy = || Policy::new(PolicyKind::BestFit, 42);
    // An hour of work at the preferred shape: 8x8 (1.1x) costs 360 s more,
    // 4x16 (1.3x) 1080 s more.
    let mut j = elastic_job(three_shapes());
    j.spec.expected_duration = Some("1h".into());
    // (GiB held by the running job, its expected end from now, the
    // micro-batch started with; None: waits)
    let cases = [
        // 40 GiB free, 8x8 fits: waiting 60 s is cheaper than 360 s slower
        (60, Some(60.0), None),
        // waiting 10 min is dearer: 8x8 now
        (60, Some(600.0), Some(8)),
        // no end known: 8x8 now
        (60, None, Some(8)),
        // 25 GiB free, only 4x16 fits: 10 min of wait is cheaper than 1080 s
        (75, Some(600.0), None),
        // half an hour is not
        (75, Some(1800.0), Some(4)),
    ];
    for (held, end, started) in cases {
        let running = job("running", 0, "2026-01-01T00:00:00Z", held * GIB);
        let ledger = vec![recorded_placement(&running, &on_gpu0(held * GIB))];
        let ends = ExpectedEnds {
            now: 1000.0,
            ends: end
                .map(|e: f64| vec![(1000.0 + e, ledger[0].clone())])
                .unwrap_or_default(),
        };
        let verdict = plan_cycle_at(&view, &ledger, &[&j], policy(), &ends)
            .remove(0)
            .1;
        match (&verdict, started) {
            (Verdict::Place(p), Some(micro)) => {
                assert_eq!(p.micro_batch, Some(micro), "held {held}, end {end:?}");
                let elastic = p.elastic.as_ref().unwrap();
                assert_eq!(elastic.expected_wait_seconds, end, "held {held}");
            }
            (Verdict::Wait { .. }, None) => {}
            (other, want) => panic!("held {held}, end {end:?}: {other:?}, expected {want:?}"),
        }
    }
    // Without an expected duration the same known wait of 30 min keeps it
    // waiting (its remaining work is unknown).
    let mut unknown = j.clone();
    unknown.spec.expected_duration = None;
    let running = job("running", 0, "2026-01-01T00:00:00Z", 75 * GIB);
    let ledger = vec![recorded_placement(&running, &on_gpu0(75 * GIB))];
    let ends = ExpectedEnds {
        now: 1000.0,
        ends: vec![(2800.0, ledger[0].clone())],
    };
    let verdict = plan_cycle_at(&view, &ledger, &[&unknown], policy(), &ends)
        .remove(0)
        .1;
    assert!(matches!(verdict, Verdict::Wait { .. }), "{verdict:?}");
}

#[test]
fn jobs_that_count_their_compute_share_a_gpu_only_while_it_has_compute_left() {
    let view = one_gpu_cluster(100 * GIB);
    let with_compute = |name: &str, created: &str, percent: Option<u32>| {
        let mut job = job(name, 0, created, 10 * GIB);
        job.spec.gpu_compute_percent = percent;
        job
    };
    let mut running = with_compute("running", "2026-01-01T00:00:00Z", Some(60));
    let mut placement = on_gpu0(10 * GIB);
    placement.compute_percent = Some(60);
    running.status.as_mut().unwrap().placement = Some(placement);
    let ledger = recorded_placements([&running]);
    assert_eq!(ledger[0].gpu_compute, 600, "the recorded share counts");
    // (waiting job's percent, whether it joins the running one)
    for (percent, joins) in [(Some(40), true), (Some(50), false), (None, true)] {
        let waiting = with_compute("waiting", "2026-01-02T00:00:00Z", percent);
        let verdicts = plan_cycle(
            &view,
            &ledger,
            &[&waiting],
            Policy::new(PolicyKind::Vramfit, 42),
        );
        match &verdicts[0].1 {
            Verdict::Place(p) => {
                assert!(joins, "{percent:?} placed beside 60 %");
                assert_eq!(p.compute_percent, percent, "recorded for the next cycle");
            }
            Verdict::Wait { message, .. } => {
                assert!(!joins, "{percent:?} waits: {message}");
                assert!(
                    message.contains("have at most 40.0 % left (n1)"),
                    "{message}"
                );
            }
        }
    }
}
