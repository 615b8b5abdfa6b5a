use super::*;
use crate::controller::scheduler::{Verdict, plan_cycle};
use crate::place::{Policy, PolicyKind};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;
const NOW: &str = "2026-06-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn ttl() -> SignedDuration {
    SignedDuration::from_secs(120)
}

/// A GpuNode whose agent reported `gpus` (model, bytes, health) `age_s` ago.
fn gpu_node(name: &str, age_s: i64, gpus: &[(&str, u64, &str)]) -> GpuNode {
    let heartbeat = now()
        .checked_sub(SignedDuration::from_secs(age_s))
        .unwrap()
        .to_string();
    gpus.iter()
        .enumerate()
        .fold(
            GpuNode::test(name).gpus(json!([])),
            |node, (i, (model, bytes, health))| {
                node.gpu(model, *bytes)
                    .uuid(&format!("GPU-{name}-{i}"))
                    .used(0)
                    .health(health)
            },
        )
        .status_fields(json!({"gpuCount": gpus.len()}))
        .heartbeat(&heartbeat)
        .build()
}

fn node(name: &str, spec: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": spec,
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}
    }))
    .unwrap()
}

fn view_of(gpu_nodes: &[GpuNode], nodes: &[Node]) -> ClusterView {
    cluster_view(
        &gpu_nodes.iter().collect::<Vec<_>>(),
        &nodes.iter().collect::<Vec<_>>(),
        now(),
        ttl(),
    )
}

fn names(view: &ClusterView) -> Vec<&str> {
    view.inventory
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .collect()
}

fn job(spec_extra: Value, template_spec: Value) -> TrainingJob {
    TrainingJob::test("j")
        .created("2026-01-01T00:00:00Z")
        .template_spec(template_spec)
        .spec(spec_extra)
        .budget(10 * GIB)
        .build()
}

fn containers() -> Value {
    json!([{"name": "t", "image": "i", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}])
}

/// The verdict of one cycle for `job` on `view`.
fn verdict(view: &ClusterView, job: &TrainingJob) -> Verdict {
    let mut verdicts = plan_cycle(view, &[], &[job], Policy::new(PolicyKind::BestFit, 42));
    verdicts.remove(0).1
}

fn placed_on(verdict: &Verdict) -> Option<(String, Vec<u32>)> {
    match verdict {
        Verdict::Place(p) => Some((p.node.clone(), p.gpus.iter().map(|g| g.index).collect())),
        Verdict::Wait { .. } => None,
    }
}

#[test]
fn a_fresh_gpu_node_with_its_node_is_used_with_the_node_allocatable() {
    let view = view_of(
        &[gpu_node("a", 10, &[("H200", 141 * GIB, "Healthy")])],
        &[node("a", json!({}))],
    );
    assert_eq!(names(&view), ["a"]);
    let a = &view.inventory.nodes[0];
    assert_eq!((a.cpu_milli, a.memory_bytes), (64_000, 512 * GIB));
    assert_eq!(a.gpus[0].capacity, 141 * GIB);
    assert_eq!(view.uuids[&("a".to_string(), 0)], "GPU-a-0");
}

#[test]
fn stale_heartbeats_are_ignored() {
    let gpu = [("H200", 141 * GIB, "Healthy")];
    let view = view_of(
        &[
            gpu_node("fresh", 0, &gpu),
            gpu_node("edge", 120, &gpu),
            gpu_node("stale", 121, &gpu),
            gpu_node("old", 3600, &gpu),
        ],
        &[
            node("fresh", json!({})),
            node("edge", json!({})),
            node("stale", json!({})),
            node("old", json!({})),
        ],
    );
    assert_eq!(names(&view), ["edge", "fresh"]);

    // No heartbeat at all, or one that does not parse: not trusted either.
    let mut silent = gpu_node("silent", 0, &gpu);
    silent.status.as_mut().unwrap().heartbeat = None;
    let mut garbled = gpu_node("garbled", 0, &gpu);
    garbled.status.as_mut().unwrap().heartbeat = Some("yesterday".into());
    let view = view_of(
        &[silent, garbled],
        &[node("silent", json!({})), node("garbled", json!({}))],
    );
    assert!(names(&view).is_empty(), "{:?}", names(&view));
}

#[test]
fn cordoned_unschedulable_and_node_less_gpu_nodes_are_skipped() {
    let gpu = [("H200", 141 * GIB, "Healthy")];
    let mut cordoned = gpu_node("cordoned", 0, &gpu);
    cordoned.spec.cordoned = true;
    let view = view_of(
        &[
            cordoned,
            gpu_node("drained", 0, &gpu),
            gpu_node("orphan", 0, &gpu),
            gpu_node("ok", 0, &gpu),
        ],
        &[
            node("cordoned", json!({})),
            node("drained", json!({"unschedulable": true})),
            node("ok", json!({"unschedulable": false})),
        ],
    );
    assert_eq!(names(&view), ["ok"]);
}

#[test]
fn gpus_whose_indices_do_not_match_their_positions_leave_the_node_out() {
    let mut gapped = gpu_node("gapped", 0, &[("H200", 141 * GIB, "Healthy")]);
    gapped.status.as_mut().unwrap().gpus[0].index = 1;
    let view = view_of(
        &[gapped, gpu_node("ok", 0, &[("H200", 141 * GIB, "Healthy")])],
        &[node("gapped", json!({})), node("ok", json!({}))],
    );
    assert_eq!(names(&view), ["ok"]);
}

#[test]
fn faulty_gpus_are_held_back_and_the_others_used() {
    let view = view_of(
        &[gpu_node(
            "a",
            0,
            &[
                ("H200", 141 * GIB, "Faulty"),
                ("H200", 141 * GIB, "Degraded"),
            ],
        )],
        &[node("a", json!({}))],
    );
    assert_eq!(view.reserved.len(), 1);
    assert_eq!(view.reserved[0].gpu_indices, [0]);
    assert_eq!(view.reserved[0].gpu_budget, 141 * GIB);
    assert_eq!(
        view.reserved[0].gpu_compute,
        crate::place::COMPUTE_WHOLE,
        "all of it, as its memory"
    );
    let job = job(json!({}), json!({"containers": containers()}));
    assert_eq!(
        placed_on(&verdict(&view, &job)),
        Some(("a".into(), vec![1])),
        "the faulty GPU 0 is not used"
    );

    let view = view_of(
        &[gpu_node("a", 0, &[("H200", 141 * GIB, "Faulty")])],
        &[node("a", json!({}))],
    );
    assert_eq!(placed_on(&verdict(&view, &job)), None);
}

#[test]
fn node_taints_keep_jobs_away_unless_the_template_tolerates_them() {
    let gpu = [("H200", 141 * GIB, "Healthy")];
    let taint =
        |effect: &str| json!({"taints": [{"key": "gpu", "value": "reserved", "effect": effect}]});
    let cases = [
        // (taint effect, tolerations, placed)
        ("NoSchedule", json!([]), false),
        ("NoExecute", json!([]), false),
        // A soft preference does not keep the job away.
        ("PreferNoSchedule", json!([]), true),
        (
            "NoSchedule",
            json!([{"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}]),
            true,
        ),
        (
            "NoSchedule",
            json!([{"key": "gpu", "operator": "Equal", "value": "other", "effect": "NoSchedule"}]),
            false,
        ),
        // Exists matches any value; no effect matches every effect.
        (
            "NoExecute",
            json!([{"key": "gpu", "operator": "Exists"}]),
            true,
        ),
        (
            "NoSchedule",
            json!([{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]),
            false,
        ),
        // An empty key with Exists tolerates everything.
        ("NoSchedule", json!([{"operator": "Exists"}]), true),
        // A toleration with an unknown effect tolerates nothing.
        (
            "NoSchedule",
            json!([{"key": "gpu", "operator": "Exists", "effect": "Sometimes"}]),
            false,
        ),
    ];
    for (effect, tolerations, placed) in cases {
        let view = view_of(&[gpu_node("a", 0, &gpu)], &[node("a", taint(effect))]);
        let job = job(
            json!({}),
            json!({"containers": containers(), "tolerations": tolerations}),
        );
        assert_eq!(
            placed_on(&verdict(&view, &job)).is_some(),
            placed,
            "{effect} with {tolerations}"
        );
    }
}

#[test]
fn gpu_models_restrict_the_gpus_a_job_may_use() {
    let view = view_of(
        &[
            gpu_node("a", 0, &[("L4", 24 * GIB, "Healthy")]),
            gpu_node("b", 0, &[("H200", 141 * GIB, "Healthy")]),
        ],
        &[node("a", json!({})), node("b", json!({}))],
    );
    let template = json!({"containers": containers()});
    // Best fit alone would take the L4.
    let any = job(json!({}), template.clone());
    assert_eq!(
        placed_on(&verdict(&view, &any)),
        Some(("a".into(), vec![0]))
    );
    let h200 = job(json!({"gpuModels": ["H200"]}), template.clone());
    assert_eq!(
        placed_on(&verdict(&view, &h200)),
        Some(("b".into(), vec![0]))
    );
    let absent = job(json!({"gpuModels": ["A100-80GB"]}), template);
    match verdict(&view, &absent) {
        Verdict::Wait { never_fits, .. } => assert!(never_fits),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_request_carries_the_template_requests_and_the_gpu_count() {
    let job = job(
        json!({"gpus": 2, "gpuModels": ["H200"], "batch": {"global": 16, "micro": 8}}),
        json!({"containers": [
            {"name": "a", "image": "i", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}},
            {"name": "b", "image": "i", "resources": {"requests": {"cpu": "2", "memory": "512Mi"}}},
            {"name": "c", "image": "i"}
        ]}),
    );
    let request = job_request(&job, 7 * GIB).unwrap();
    assert_eq!(request.id, "ml/j");
    assert_eq!(request.gpus, 2);
    assert_eq!(request.gpu_budget, 7 * GIB);
    assert_eq!(request.cpu_milli, 3500);
    assert_eq!(request.memory_bytes, 2 * GIB + 512 * 1024 * 1024);
    assert_eq!(request.gpu_models, ["H200"]);
}

#[test]
fn a_recorded_placement_holds_its_budget_on_each_of_its_gpus() {
    let job = job(json!({}), json!({"containers": containers()}));
    let placement = PlacementStatus {
        compute_percent: None,
        node: "a".into(),
        gpus: vec![
            crate::api::AssignedGpu {
                index: 3,
                uuid: "x".into(),
            },
            crate::api::AssignedGpu {
                index: 1,
                uuid: "y".into(),
            },
        ],
        budget_bytes: 5 * GIB,
        memory_fraction: 0.1,
        attempt: 1,
        gpu_model: None,
        micro_batch: None,
        elastic: None,
    };
    let p = recorded_placement(&job, &placement);
    assert_eq!(
        (p.job_id.as_str(), p.node.as_str(), p.gpu_indices.clone()),
        ("ml/j", "a", vec![1, 3])
    );
    assert_eq!(
        (p.gpu_budget, p.cpu_milli, p.memory_bytes),
        (5 * GIB, 500, GIB)
    );
}

#[test]
fn a_toleration_names_its_key_or_with_an_empty_key_tolerates_any() {
    let gpu = [("H200", 141 * GIB, "Healthy")];
    let taint = json!({"taints": [{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}]});
    // (tolerations, placed)
    let cases = [
        (json!([{"key": "other", "operator": "Exists"}]), false),
        (
            json!([{"key": "other", "operator": "Equal", "value": "reserved"}]),
            false,
        ),
        (json!([{"key": "", "operator": "Exists"}]), true),
        (json!([{"key": "gpu", "operator": "Exists"}]), true),
    ];
    for (tolerations, placed) in cases {
        let view = view_of(&[gpu_node("a", 0, &gpu)], &[node("a", taint.clone())]);
        let job = job(
            json!({}),
            json!({"containers": containers(), "tolerations": tolerations}),
        );
        assert_eq!(
            placed_on(&verdict(&view, &job)).is_some(),
            placed,
            "{tolerations}"
        );
    }
}

#[test]
fn node_taints_are_carried_with_their_effect_and_unknown_effects_dropped() {
    let view = view_of(
        &[gpu_node("a", 0, &[("H200", 141 * GIB, "Healthy")])],
        &[node(
            "a",
            json!({"taints": [
                {"key": "soft", "effect": "PreferNoSchedule"},
                {"key": "hard", "value": "v", "effect": "NoSchedule"},
                {"key": "evict", "effect": "NoExecute"},
                {"key": "odd", "effect": "Sometimes"}
            ]}),
        )],
    );
    let taint = |key: &str, value: &str, effect| Taint {
        key: key.into(),
        value: value.into(),
        effect,
    };
    assert_eq!(
        view.inventory.nodes[0].taints,
        [
            taint("soft", "", TaintEffect::PreferNoSchedule),
            taint("hard", "v", TaintEffect::NoSchedule),
            taint("evict", "", TaintEffect::NoExecute),
        ]
    );
}

/// The ledger reads the requests from the template's JSON; they are what the
/// parsed template requests.
#[test]
fn the_requests_read_from_the_template_json_are_those_of_the_parsed_template() {
    let templates = [
        json!({}),
        json!({"spec": {"containers": []}}),
        json!({"spec": {"containers": [{"name": "a", "image": "i"}]}}),
        json!({"spec": {"containers": [
            {"name": "a", "image": "i", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "b", "image": "i", "resources": {"requests": {"cpu": "2", "memory": "512Mi"}}},
            {"name": "c", "image": "i", "resources": {"limits": {"cpu": "8"}}}
        ]}}),
        json!({"spec": {
            "containers": [{"name": "a", "image": "i", "resources": {"requests": {"cpu": "1.5"}}}],
            "initContainers": [{"name": "x", "image": "i", "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]
        }}),
    ];
    let mut sums = vec![];
    for template in templates {
        let map = template.as_object().unwrap().clone();
        let parsed = crate::api::check_pod_template(&map).unwrap();
        let want = pod_requests(parsed.spec.as_ref());
        assert_eq!(template_requests(&map), want, "{template}");
        sums.push(want);
    }
    assert_eq!(
        sums,
        [(0, 0), (0, 0), (0, 0), (2500, GIB + GIB / 2), (1500, 0)]
    );
}

#[test]
fn the_request_asks_the_compute_share_the_prediction_fixed() {
    let mut job = job(
        json!({"gpuComputePercent": 40, "batch": {"global": 16, "micro": 8}}),
        json!({"containers": containers()}),
    );
    // predicted before the status carried the share: the spec's
    assert_eq!(job_request(&job, GIB).unwrap().gpu_compute, 400);
    // the share the prediction fixed (here the cluster's default) wins
    job.status = Some(crate::api::TrainingJobStatus {
        compute_percent: Some(60),
        ..Default::default()
    });
    assert_eq!(job_request(&job, GIB).unwrap().gpu_compute, 600);
    job.spec.gpu_compute_percent = None;
    assert_eq!(compute_percent(&job), Some(60));
    job.status = None;
    assert_eq!(job_request(&job, GIB).unwrap().gpu_compute, 0);
}
