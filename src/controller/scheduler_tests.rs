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
