use std::sync::Arc;

use super::*;
use crate::api::{AssignedGpu, PlacementStatus, TrainingJob};
use crate::controller::cluster_view::job_key;
use crate::controller::scheduler::{Assignments, ExpectedEnds, plan_on};
use crate::place::{GpuSpec, JobRequest, NodeSpec};
use serde_json::json;

const GIB: u64 = 1 << 30;

fn view(gpu_gib: u64) -> ClusterView {
    ClusterView {
        inventory: Inventory {
            nodes: vec![NodeSpec {
                name: "n1".into(),
                cpu_milli: 64_000,
                memory_bytes: 512 * GIB,
                taints: vec![],
                gpus: vec![
                    GpuSpec {
                        model: "H200".into(),
                        capacity: gpu_gib * GIB,
                    };
                    2
                ],
            }],
        },
        ..ClusterView::default()
    }
}

fn status(gpu: u32) -> serde_json::Value {
    serde_json::to_value(PlacementStatus {
        compute_percent: None,
        node: "n1".into(),
        gpus: vec![AssignedGpu {
            index: gpu,
            uuid: String::new(),
        }],
        budget_bytes: 10 * GIB,
        memory_fraction: 0.1,
        attempt: 1,
        gpu_model: None,
        micro_batch: None,
        elastic: None,
    })
    .unwrap()
}

fn running(name: &str, gpu: u32) -> Arc<TrainingJob> {
    Arc::new(
        TrainingJob::test(name)
            .status_fields(
                json!({"phase": "Running", "attempt": 1, "budgetBytes": 10 * GIB,
                "placement": status(gpu)}),
            )
            .build(),
    )
}

fn waiting(name: &str) -> Arc<TrainingJob> {
    Arc::new(
        TrainingJob::test(name)
            .status_fields(json!({"phase": "Pending", "attempt": 1, "budgetBytes": 10 * GIB}))
            .build(),
    )
}

fn sync(ledger: &mut Ledger, jobs: &[Arc<TrainingJob>], assignments: &Assignments) {
    ledger.sync(jobs, &[], &mut assignments.lock());
}

fn free(standing: &StandingPlacer) -> Vec<u64> {
    standing.placer().state().nodes()[0]
        .gpu_free
        .iter()
        .map(|b| b / GIB)
        .collect()
}

#[test]
fn it_follows_the_entries_that_change_as_a_fresh_build_would_hold_them() {
    let (mut ledger, assignments, view) = (Ledger::default(), Assignments::default(), view(80));
    let mut jobs = vec![running("a", 0), running("b", 1)];
    sync(&mut ledger, &jobs, &assignments);
    let mut standing = StandingPlacer::build(&view, &ledger, PolicyKind::Vramfit).unwrap();
    ledger.take_changed();
    assert_eq!(free(&standing), vec![70, 70]);
    jobs[1] = running("b", 0);
    jobs.push(running("c", 1));
    sync(&mut ledger, &jobs, &assignments);
    standing.follow(&mut ledger);
    assert_eq!(free(&standing), vec![60, 70]);
    assert!(standing.differences(&view, &ledger).is_empty());
    jobs.remove(0);
    sync(&mut ledger, &jobs, &assignments);
    standing.follow(&mut ledger);
    assert_eq!(free(&standing), vec![70, 70]);
    assert!(standing.differences(&view, &ledger).is_empty());
}

#[test]
fn an_entry_left_out_for_lack_of_room_is_taken_once_room_frees() {
    let (mut ledger, assignments, view) = (Ledger::default(), Assignments::default(), view(15));
    let mut jobs = vec![running("a", 0), running("b", 0)];
    sync(&mut ledger, &jobs, &assignments);
    let mut standing = StandingPlacer::build(&view, &ledger, PolicyKind::Vramfit).unwrap();
    ledger.take_changed();
    assert_eq!(standing.unrestored(), 1, "two 10 GiB budgets, 15 GiB");
    jobs.remove(0);
    sync(&mut ledger, &jobs, &assignments);
    standing.follow(&mut ledger);
    assert_eq!(standing.unrestored(), 0);
    assert_eq!(free(&standing), vec![5, 15]);
}

#[test]
fn a_plans_commit_becomes_the_jobs_entry_and_a_stray_one_is_given_back() {
    let (mut ledger, assignments, view) = (Ledger::default(), Assignments::default(), view(80));
    let jobs = vec![waiting("a"), waiting("b")];
    sync(&mut ledger, &jobs, &assignments);
    let mut standing = StandingPlacer::build(&view, &ledger, PolicyKind::Vramfit).unwrap();
    ledger.take_changed();
    let queue = ledger.waiting(&jobs);
    let verdicts = plan_on(
        standing.placer_mut(),
        &view,
        &queue[..1],
        &ExpectedEnds::default(),
    );
    // What an elastic attempt may leave: a commit for a job that then waits.
    let stray = JobRequest {
        gpu_compute: 0,
        id: job_key(queue[1]),
        gpus: 1,
        gpu_budget: 10 * GIB,
        cpu_milli: 0,
        memory_bytes: 0,
        gpu_models: vec![],
        tolerations: vec![],
    };
    standing.placer_mut().place(&stray).unwrap();
    let Verdict::Place(placed) = verdicts[0].1.clone() else {
        panic!("a fits: {verdicts:?}");
    };
    assignments.record("uid-a", 1, Verdict::Place(placed));
    ledger.refresh(&mut assignments.lock());
    standing.follow(&mut ledger);
    let wait = Verdict::Wait {
        message: String::new(),
        never_fits: false,
    };
    let mut all = verdicts.clone();
    all.push((job_key(queue[1]), wait));
    standing.settle(&ledger, &all);
    assert_eq!(standing.placer().state().placed_jobs(), 1, "a's, not b's");
    assert!(standing.placer().state().placement("ml/a").is_some());
    assert!(standing.differences(&view, &ledger).is_empty());
}

#[test]
fn it_fits_only_the_view_it_was_built_for() {
    let ledger = Ledger::default();
    let standing = StandingPlacer::build(&view(80), &ledger, PolicyKind::Vramfit).unwrap();
    assert!(standing.fits(&view(80)));
    assert!(!standing.fits(&view(40)));
}

#[test]
fn an_assignment_recorded_in_status_keeps_its_commit_and_leaves_its_node_untouched() {
    let (mut ledger, assignments, view) = (Ledger::default(), Assignments::default(), view(80));
    let mut jobs = vec![waiting("a")];
    sync(&mut ledger, &jobs, &assignments);
    let mut standing = StandingPlacer::build(&view, &ledger, PolicyKind::Vramfit).unwrap();
    ledger.take_changed();
    let queue = ledger.waiting(&jobs);
    let verdicts = plan_on(
        standing.placer_mut(),
        &view,
        &queue,
        &ExpectedEnds::default(),
    );
    let Verdict::Place(placed) = verdicts[0].1.clone() else {
        panic!("a fits: {verdicts:?}");
    };
    assignments.record("uid-a", 1, Verdict::Place(placed.clone()));
    ledger.refresh(&mut assignments.lock());
    standing.follow(&mut ledger);
    let stamp = standing.placer().state().nodes()[0].stamp;
    // The reconcile writes the placement and forgets the assignment: the
    // pending entry goes, the recorded one comes, with the same placement.
    jobs[0] = running("a", placed.gpus[0].index);
    assignments.forget("uid-a");
    sync(&mut ledger, &jobs, &assignments);
    standing.follow(&mut ledger);
    assert_eq!(standing.placer().state().placed_jobs(), 1);
    assert_eq!(
        standing.placer().state().nodes()[0].stamp,
        stamp,
        "nothing released or restored on the node"
    );
    assert!(standing.differences(&view, &ledger).is_empty());
    // The job ends: the recorded entry that took the commit gives it back.
    jobs.clear();
    sync(&mut ledger, &jobs, &assignments);
    standing.follow(&mut ledger);
    assert_eq!(standing.placer().state().placed_jobs(), 0);
    assert_eq!(free(&standing), vec![80, 80]);
}
