use super::*;
use crate::place::inventory::{GpuSpec, Inventory, JobRequest, NodeSpec};
use crate::place::{ClusterState, Placer, Policy, PolicyKind};

const GIB: u64 = 1 << 30;

fn shape(micro: u32, gib: u64, relative_time: f64) -> Shape {
    Shape {
        micro,
        budget: gib * GIB,
        relative_time,
    }
}

#[test]
fn starting_smaller_now_wins_only_when_the_slowdown_costs_less_than_the_wait() {
    // 1 h of work, 1.2x slower: 12 min lost.
    assert!(start_smaller_now(1.2, 3600.0, Some(721.0)));
    assert!(!start_smaller_now(1.2, 3600.0, Some(720.0)));
    assert!(!start_smaller_now(1.2, 3600.0, Some(0.0)));
    assert!(
        start_smaller_now(50.0, 3600.0, None),
        "no end in sight: start"
    );
}

#[test]
fn the_fastest_shape_that_fits_and_is_worth_it_is_chosen() {
    let smaller = [shape(2, 10, 2.0), shape(8, 30, 1.1), shape(4, 20, 1.4)];
    let mut asked = Vec::new();
    let choice = choose_smaller(&smaller, 40 * GIB, 3600.0, Some(3600.0), |s| {
        asked.push(s.micro);
        s.budget <= 20 * GIB
    })
    .expect("micro 4 fits and costs 24 min < 60 min");
    assert_eq!(choice.shape.micro, 4);
    assert_eq!(asked, vec![8, 4], "fastest first, stops at the first fit");
    assert_eq!(choice.preferred_budget, 40 * GIB);
    assert_eq!(choice.expected_wait, Some(3600.0));
}

#[test]
fn a_short_wait_keeps_the_job_waiting_for_its_preferred_shape() {
    let smaller = [shape(8, 30, 1.1), shape(4, 20, 1.4)];
    // 1.1x of 1 h costs 6 min: a 5-minute wait is better.
    let mut asked = 0;
    let choice = choose_smaller(&smaller, 40 * GIB, 3600.0, Some(300.0), |_| {
        asked += 1;
        true
    });
    assert_eq!(choice, None);
    assert_eq!(asked, 0, "nothing worth it is tried");
}

#[test]
fn shapes_no_smaller_than_the_preferred_are_ignored() {
    let smaller = [shape(16, 40, 0.9), shape(8, 50, 1.0)];
    assert_eq!(
        choose_smaller(&smaller, 40 * GIB, 3600.0, None, |_| true),
        None
    );
}

fn cluster() -> (Inventory, Placer) {
    let node = |name: &str| NodeSpec {
        name: name.into(),
        cpu_milli: 64_000,
        memory_bytes: 512 * GIB,
        taints: Vec::new(),
        gpus: (0..2)
            .map(|_| GpuSpec {
                model: "H200".into(),
                capacity: 100 * GIB,
            })
            .collect(),
    };
    let inventory = Inventory {
        nodes: vec![node("a"), node("b")],
    };
    let placer = Placer::new(&inventory, Policy::new(PolicyKind::BestFit, 1)).unwrap();
    (inventory, placer)
}

#[test]
fn the_wait_is_until_the_first_end_that_opens_a_big_enough_hole() {
    let (_, mut placer) = cluster();
    let mut placed = Vec::new();
    // Fill every GPU with 70 GiB jobs: 30 free on each.
    for i in 0..4 {
        let d = placer
            .place(&JobRequest::new(format!("j{i}"), 1, 70 * GIB, 1000, GIB))
            .unwrap();
        placed.push(d.placement);
    }
    let state: &ClusterState = placer.state();
    let ends: Vec<(f64, &Placement)> = placed
        .iter()
        .enumerate()
        .map(|(i, p)| (100.0 * (i as f64 + 1.0), p))
        .collect();
    // 40 GiB needs one job gone: the first end, at 100 s.
    assert_eq!(
        expected_wait(state, ends.iter().copied(), Hole::new(1, 40 * GIB), 30.0),
        Some(70.0)
    );
    // Two GPUs of one node with 40 GiB: both jobs of one node must end. The
    // jobs are on a, a, b, b or spread; either way the answer is the end of
    // the second job on the same node.
    let on = |node: &str| {
        let mut t: Vec<f64> = ends
            .iter()
            .filter(|(_, p)| p.node == node)
            .map(|(t, _)| *t)
            .collect();
        t.sort_by(f64::total_cmp);
        t
    };
    let want = [on("a"), on("b")]
        .iter()
        .filter(|t| t.len() == 2)
        .map(|t| t[1])
        .fold(f64::INFINITY, f64::min);
    assert_eq!(
        expected_wait(state, ends.iter().copied(), Hole::new(2, 40 * GIB), 0.0),
        Some(want)
    );
    // More than a GPU holds: no end helps.
    assert_eq!(
        expected_wait(state, ends.iter().copied(), Hole::new(1, 101 * GIB), 0.0),
        None
    );
    // A hole that is already there: no wait.
    assert_eq!(
        expected_wait(state, ends.iter().copied(), Hole::new(1, 30 * GIB), 0.0),
        Some(0.0),
        "fits now"
    );
}

#[test]
fn the_wait_counts_only_the_gpus_the_caller_can_use() {
    let (_, mut placer) = cluster();
    let mut placed = Vec::new();
    for i in 0..4 {
        let d = placer
            .place(&JobRequest::new(format!("j{i}"), 1, 70 * GIB, 1000, GIB))
            .unwrap();
        placed.push(d.placement);
    }
    let state = placer.state();
    let ends: Vec<(f64, &Placement)> = placed
        .iter()
        .enumerate()
        .map(|(i, p)| (100.0 * (i as f64 + 1.0), p))
        .collect();
    // (usable GPUs, per GPU, wait): only node b's GPUs usable.
    let b = state.node_index("b").unwrap();
    let first_end_on_b = ends
        .iter()
        .filter(|(_, p)| p.node == "b")
        .map(|(t, _)| *t)
        .fold(f64::INFINITY, f64::min);
    type Usable<'a> = &'a dyn Fn(usize, usize) -> bool;
    let cases: [(Usable, u64, Option<f64>); 4] = [
        (&|_, _| true, 30 * GIB, Some(0.0)),
        (&|n, _| n == b, 30 * GIB, Some(0.0)),
        (&|n, _| n == b, 40 * GIB, Some(first_end_on_b)),
        (&|_, _| false, 30 * GIB, None),
    ];
    for (usable, per_gpu, want) in cases {
        assert_eq!(
            expected_wait_on(
                state,
                ends.iter().copied(),
                Hole::new(1, per_gpu),
                0.0,
                usable
            ),
            want
        );
    }
}

#[test]
fn a_hole_that_needs_compute_waits_for_the_job_that_holds_it() {
    // One 100 GiB GPU: a job holding 10 GiB and all the compute ends at
    // 100 s. Memory alone is there now; with compute the hole opens at 100 s.
    let inv = Inventory {
        nodes: vec![NodeSpec {
            name: "n".into(),
            cpu_milli: 64_000,
            memory_bytes: 512 * GIB,
            taints: vec![],
            gpus: vec![GpuSpec {
                model: "H200".into(),
                capacity: 100 * GIB,
            }],
        }],
    };
    let mut placer = Placer::new(&inv, Policy::new(PolicyKind::BestFit, 1)).unwrap();
    let held = placer
        .place(&JobRequest::new("busy", 1, 10 * GIB, 0, 0).with_compute(1000))
        .unwrap()
        .placement;
    let ends = [(100.0, &held)];
    let state = placer.state();
    let memory = Hole::new(1, 40 * GIB);
    assert_eq!(
        expected_wait(state, ends.iter().copied(), memory, 0.0),
        Some(0.0)
    );
    let both = memory.with_compute(500);
    assert_eq!(both.compute, 500);
    assert_eq!(
        expected_wait(state, ends.iter().copied(), both, 0.0),
        Some(100.0)
    );
}
