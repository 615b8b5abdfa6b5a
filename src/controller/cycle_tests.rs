use super::*;
use crate::place::{GpuSpec, Inventory, NodeSpec, Placement};
use k8s_openapi::api::core::v1::Node;

const GIB: u64 = 1 << 30;

fn job(phase: Option<Phase>) -> TrainingJob {
    let job = TrainingJob::test("j");
    match phase {
        Some(phase) => job.phase(phase),
        None => job,
    }
    .build()
}

fn gauge(text: &str, series: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn gauges_count_jobs_by_phase_and_gpu_memory_committed_and_total() {
    let jobs = [
        job(None),
        job(Some(Phase::Pending)),
        job(Some(Phase::Running)),
        job(Some(Phase::Running)),
        job(Some(Phase::Failed)),
    ];
    let mut counts: HashMap<Phase, i64> = HashMap::new();
    for job in &jobs {
        *counts
            .entry(job.status.as_ref().map(|s| s.phase).unwrap_or_default())
            .or_default() += 1;
    }
    let node = |name: &str, gpus: &[u64]| NodeSpec {
        name: name.into(),
        cpu_milli: 1000,
        memory_bytes: GIB,
        taints: vec![],
        gpus: gpus
            .iter()
            .map(|&capacity| GpuSpec {
                model: "H200".into(),
                capacity,
            })
            .collect(),
    };
    let view = ClusterView {
        inventory: Inventory {
            nodes: vec![node("a", &[80 * GIB, 80 * GIB]), node("b", &[24 * GIB])],
        },
        ..ClusterView::default()
    };
    let placement = |gpus: Vec<u32>, budget: u64| Placement {
        gpu_compute: 0,
        job_id: "ml/j".into(),
        node: "a".into(),
        gpu_indices: gpus,
        gpu_budget: budget,
        cpu_milli: 0,
        memory_bytes: 0,
    };
    let ledger = [placement(vec![0, 1], 10 * GIB), placement(vec![0], 3 * GIB)];
    let metrics = Metrics::default();
    let committed = ledger.iter().map(ledger::held_bytes).sum();
    update_gauges(&metrics, &counts, &view, committed);
    let text = metrics.encode();
    for (phase, count) in [
        ("Pending", 2),
        ("Placed", 0),
        ("Running", 2),
        ("Retrying", 0),
        ("Succeeded", 0),
        ("Failed", 1),
    ] {
        let series = format!("vramfit_trainingjobs{{phase=\"{phase}\"}}");
        assert_eq!(gauge(&text, &series), Some(count), "{series} in\n{text}");
    }
    assert_eq!(
        gauge(&text, "vramfit_gpu_memory_total_bytes"),
        Some((184 * GIB) as i64)
    );
    assert_eq!(
        gauge(&text, "vramfit_gpu_memory_committed_bytes"),
        Some((23 * GIB) as i64),
        "a two-GPU job holds its budget twice"
    );

    // A later cycle overwrites the gauges instead of adding to them.
    let pending = HashMap::from([(Phase::Pending, 1)]);
    update_gauges(&metrics, &pending, &ClusterView::default(), 0);
    let text = metrics.encode();
    assert_eq!(
        gauge(&text, "vramfit_trainingjobs{phase=\"Running\"}"),
        Some(0)
    );
    assert_eq!(
        gauge(&text, "vramfit_trainingjobs{phase=\"Pending\"}"),
        Some(1)
    );
    assert_eq!(gauge(&text, "vramfit_gpu_memory_total_bytes"), Some(0));
}

fn gpu_node(name: &str, now: Timestamp) -> GpuNode {
    GpuNode::test(name)
        .gpus(serde_json::json!([]))
        .gpu("H100-80GB", 80 * GIB)
        .uuid(&format!("GPU-{name}-0"))
        .used(0)
        .health("Healthy")
        .gpu("H100-80GB", 80 * GIB)
        .uuid(&format!("GPU-{name}-1"))
        .used(0)
        .health("Healthy")
        .status_fields(serde_json::json!({"gpuCount": 2, "model": "H100-80GB",
            "heartbeat": now.to_string()}))
        .build()
}

fn node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}
    }))
    .unwrap()
}

fn predicted(name: &str, gib: u64) -> Arc<TrainingJob> {
    Arc::new(
        TrainingJob::test(name)
            .created("2026-12-04T00:00:00Z")
            .template_spec(
                serde_json::json!({"containers": [{"name": "t", "image": "i",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}),
            )
            .status_fields(serde_json::json!({"phase": "Pending", "attempt": 1,
                "budgetBytes": gib * GIB}))
            .build(),
    )
}

/// The job with the cycle's placement written to its status.
fn recorded_by(job: &TrainingJob, assignments: &Assignments) -> Arc<TrainingJob> {
    let uid = job.metadata.uid.as_deref().unwrap();
    let mut job = job.clone();
    let status = job.status.get_or_insert_default();
    status.phase = Phase::Placed;
    status.placement = assignments.placement(uid, 1);
    Arc::new(job)
}

#[test]
fn cycles_that_keep_their_ledger_place_as_a_full_rebuild_would_and_never_twice() {
    let now = Timestamp::now();
    let ttl = SignedDuration::from_secs(120);
    let gpu_nodes = [Arc::new(gpu_node("n1", now)), Arc::new(gpu_node("n2", now))];
    let mut nodes = vec![Arc::new(node("n1")), Arc::new(node("n2"))];
    let assignments = Assignments::default();
    let mut state = CycleState::default();
    let mut jobs: Vec<Arc<TrainingJob>> = (0..6).map(|i| predicted(&format!("j{i}"), 50)).collect();
    let cycle = |state: &mut CycleState, jobs: &[Arc<TrainingJob>], nodes: &[Arc<Node>]| {
        let outcome = run_cycle(
            state,
            &assignments,
            jobs,
            &[],
            &gpu_nodes,
            nodes,
            now,
            ttl,
            PolicyKind::Vramfit,
        );
        let (placed, committed, waiting) =
            (outcome.placed, outcome.committed_bytes, outcome.waiting);
        check(state, &assignments, jobs, &[], &outcome.view).unwrap();
        check_view(&outcome.view, &gpu_nodes, nodes, now, ttl).unwrap();
        (placed, committed / GIB, waiting)
    };
    // Four GPUs of 80 GiB, six jobs of 50 GiB: four placed.
    assert_eq!(cycle(&mut state, &jobs, &nodes), (4, 200, 6));
    // The same caches again: the four stay, two wait.
    assert_eq!(cycle(&mut state, &jobs, &nodes), (4, 200, 2));
    // The statuses land; one placed job is deleted and frees its GPU.
    for job in jobs.iter_mut() {
        if assignments
            .placement(job.metadata.uid.as_deref().unwrap(), 1)
            .is_some()
        {
            *job = recorded_by(job, &assignments);
        }
    }
    let gone = jobs
        .iter()
        .position(|j| j.status.as_ref().is_some_and(|s| s.placement.is_some()))
        .unwrap();
    jobs.remove(gone);
    assert_eq!(cycle(&mut state, &jobs, &nodes), (4, 200, 2));
    // A node leaves: the engine is built again over the one left.
    nodes.pop();
    let (placed, _, waiting) = cycle(&mut state, &jobs, &nodes);
    assert_eq!(
        (placed, waiting),
        (4, 1),
        "the ledger keeps n2's placements"
    );
}

#[test]
fn a_two_gpu_placement_holds_its_budget_on_each_gpu() {
    let placement = Placement {
        gpu_compute: 0,
        job_id: "ml/j".into(),
        node: "a".into(),
        gpu_indices: vec![0, 1],
        gpu_budget: 10 * GIB,
        cpu_milli: 0,
        memory_bytes: 0,
    };
    assert_eq!(ledger::held_bytes(&placement), 20 * GIB);
}
