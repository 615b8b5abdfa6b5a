use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::api::{GpuHealth, Phase};
use crate::status::{ClusterStatus, GpuView, JobOnGpu, NodeView, RetryView, Totals, WaitingJob};

const GIB: u64 = 1 << 30;

fn on_gpu(namespace: &str, name: &str, node: &str, gpu: u32) -> JobOnGpu {
    JobOnGpu {
        namespace: namespace.into(),
        name: name.into(),
        phase: Phase::Running,
        node: node.into(),
        gpu,
        budget_bytes: 10 * GIB,
        measured_bytes: Some(8 * GIB),
        micro_batch: Some(8),
        grad_accum: Some(1),
        attempt: 1,
    }
}

fn gpu(index: u32, jobs: Vec<JobOnGpu>) -> GpuView {
    GpuView {
        index,
        model: "H200".into(),
        health: GpuHealth::Healthy,
        capacity_bytes: 140 * GIB,
        committed_bytes: 10 * GIB * jobs.len() as u64,
        free_bytes: 140 * GIB - 10 * GIB * jobs.len() as u64,
        measured_bytes: 8 * GIB * jobs.len() as u64,
        jobs,
    }
}

fn node(name: &str, gpus: Vec<GpuView>) -> NodeView {
    NodeView {
        name: name.into(),
        heartbeat: None,
        heartbeat_age_seconds: Some(1),
        fresh: true,
        cordoned: false,
        agent_mode: Some("nvml".into()),
        gpus,
    }
}

fn waiting(namespace: &str, name: &str) -> WaitingJob {
    WaitingJob {
        namespace: namespace.into(),
        name: name.into(),
        priority: 0,
        gpus: 1,
        budget_bytes: Some(200 * GIB),
        attempt: 1,
        reason: "no GPU has room".into(),
        age_seconds: Some(5),
    }
}

fn retry(namespace: &str, name: &str) -> RetryView {
    RetryView {
        namespace: namespace.into(),
        name: name.into(),
        kind: "restart".into(),
        attempt: 1,
        from: "16x1".into(),
        to: Some("8x2".into()),
        message: None,
        time: None,
    }
}

fn phases(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(p, n)| (p.to_string(), *n)).collect()
}

/// Two teams: a's job shares GPU 0 of n1 with b's, b has n1's GPU 1 alone,
/// n2 runs nothing; each team has a waiting job and a retry, b an orphan.
fn cluster() -> ClusterStatus {
    let nodes = vec![
        node(
            "n1",
            vec![
                gpu(
                    0,
                    vec![on_gpu("a", "a1", "n1", 0), on_gpu("b", "b1", "n1", 0)],
                ),
                gpu(1, vec![on_gpu("b", "b2", "n1", 1)]),
            ],
        ),
        node("n2", vec![gpu(0, vec![])]),
    ];
    let by_ns = BTreeMap::from([
        ("a".to_string(), phases(&[("Running", 1), ("Pending", 1)])),
        (
            "b".to_string(),
            phases(&[("Running", 2), ("Pending", 1), ("Succeeded", 4)]),
        ),
    ]);
    ClusterStatus {
        time: "2026-12-04T00:00:00Z".into(),
        totals: super::totals(&nodes),
        nodes,
        orphans: vec![on_gpu("b", "b9", "gone", 0)],
        waiting: vec![waiting("a", "a2"), waiting("b", "b3")],
        retries: vec![retry("b", "b1"), retry("a", "a1")],
        phases: sum_phases(by_ns.values()),
        phases_by_namespace: by_ns,
    }
}

fn names(view: &ClusterStatus) -> Vec<String> {
    let mut out: Vec<String> = view
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().flat_map(|g| g.jobs.iter()))
        .chain(view.orphans.iter())
        .map(|j| format!("gpu:{}", j.name))
        .collect();
    out.extend(view.waiting.iter().map(|w| format!("wait:{}", w.name)));
    out.extend(view.retries.iter().map(|r| format!("retry:{}", r.name)));
    out
}

fn only(namespaces: &[&str], gpu_nodes: bool) -> Access {
    Access {
        namespaces: Namespaces::Only(namespaces.iter().map(|s| s.to_string()).collect()),
        gpu_nodes,
    }
}

#[test]
fn everything_is_the_whole_view() {
    assert_eq!(restrict(cluster(), &Access::everything()), cluster());
}

#[test]
fn a_reader_of_one_namespace_sees_its_jobs_only() {
    let cases: &[(Access, &[&str])] = &[
        (only(&["a"], false), &["gpu:a1", "wait:a2", "retry:a1"]),
        (only(&["a"], true), &["gpu:a1", "wait:a2", "retry:a1"]),
        (
            only(&["b"], false),
            &["gpu:b1", "gpu:b2", "gpu:b9", "wait:b3", "retry:b1"],
        ),
        (only(&[], true), &[]),
        (
            Access {
                namespaces: Namespaces::All,
                gpu_nodes: false,
            },
            &[
                "gpu:a1", "gpu:b1", "gpu:b2", "gpu:b9", "wait:a2", "wait:b3", "retry:b1",
                "retry:a1",
            ],
        ),
    ];
    for (access, want) in cases {
        assert_eq!(names(&restrict(cluster(), access)), *want, "{access:?}");
    }
}

#[test]
fn phase_counts_are_the_readers_namespaces_only() {
    let view = restrict(cluster(), &only(&["a"], true));
    assert_eq!(view.phases, phases(&[("Running", 1), ("Pending", 1)]));
    assert_eq!(view.phases_by_namespace.len(), 1);
    let view = restrict(cluster(), &only(&["a", "b", "c"], false));
    assert_eq!(
        view.phases,
        phases(&[("Running", 3), ("Pending", 2), ("Succeeded", 4)])
    );
}

#[test]
fn a_reader_of_gpu_nodes_keeps_every_gpu_and_its_figures() {
    let view = restrict(cluster(), &only(&["a"], true));
    let whole = cluster();
    assert_eq!(view.nodes.len(), 2);
    assert_eq!(view.totals, whole.totals);
    // GPU 0 of n1 still counts b's budget, though b's job is not shown.
    let shared = &view.nodes[0].gpus[0];
    assert_eq!(shared.jobs.len(), 1);
    assert_eq!(shared.committed_bytes, 20 * GIB);
    assert_eq!(view.nodes[0].gpus.len(), 2);
    assert!(view.nodes[0].gpus[1].jobs.is_empty());
}

#[test]
fn another_reader_sees_only_the_gpus_running_their_jobs() {
    let view = restrict(cluster(), &only(&["a"], false));
    assert_eq!(view.nodes.len(), 1, "n2 runs none of a's jobs");
    assert_eq!(view.nodes[0].gpus.len(), 1, "n1's GPU 1 runs b's only");
    assert_eq!(view.nodes[0].gpus[0].index, 0);
    assert_eq!(
        view.totals,
        Totals {
            gpus: 1,
            capacity_bytes: 140 * GIB,
            committed_bytes: 20 * GIB,
            measured_bytes: 16 * GIB,
        }
    );
    let none = restrict(cluster(), &only(&["c"], false));
    assert!(none.nodes.is_empty());
    assert_eq!(none.totals, Totals::default());
}

#[test]
fn access_from_the_reviews() {
    let ns = |pairs: &[(&str, bool)]| -> Vec<(String, bool)> {
        pairs.iter().map(|(n, a)| (n.to_string(), *a)).collect()
    };
    assert_eq!(
        Access::from_reviews(true, ns(&[("a", false)]), false),
        Some(Access {
            namespaces: Namespaces::All,
            gpu_nodes: false,
        })
    );
    assert_eq!(
        Access::from_reviews(false, ns(&[("a", true), ("b", false)]), true),
        Some(only(&["a"], true))
    );
    assert_eq!(
        Access::from_reviews(false, ns(&[("a", false)]), true),
        Some(Access {
            namespaces: Namespaces::Only(BTreeSet::new()),
            gpu_nodes: true,
        })
    );
    assert_eq!(
        Access::from_reviews(false, ns(&[("a", false), ("b", false)]), false),
        None,
        "may see nothing: refused"
    );
}
