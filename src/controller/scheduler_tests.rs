use super::*;
use crate::api::TrainingJobStatus;
use crate::place::{GpuSpec, Inventory, NodeSpec, PolicyKind};
use serde_json::json;

const GIB: u64 = 1 << 30;

fn job(name: &str, priority: i32, created: &str, budget: u64) -> TrainingJob {
    let mut job: TrainingJob = serde_json::from_value(json!({
        "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": created},
        "spec": {"priority": priority, "batch": {"global": 8, "micro": 8},
                 "model": {"mlp": {"layers": 2, "hidden": 64}},
                 "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}
    }))
    .unwrap();
    job.status = Some(TrainingJobStatus {
        attempt: 1,
        budget_bytes: Some(budget),
        ..Default::default()
    });
    job
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
