//! Tests of the placement engine: ledger, messages, policies, measures and
//! the trace protocol.

use super::bench::{PackBenchOptions, arrival_order, parse_vm_hwm_bytes, run_pack_bench};
use super::fragmentation::{
    TargetWorkload, WorkloadModel, expected_fragmentation, expected_stranding, measure_node,
    task_fragmentation, task_stranding,
};
use super::openb::{parse_nodes, parse_pods, requested_milli_gpu};
use super::rng::SeededRng;
use super::state::{ClusterState, Demand, GpuSet, ModelMask, NodeView};
use super::*;

const GIB: u64 = 1 << 30;

fn node(name: &str, cores: u64, gpus: &[(&str, u64)]) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_milli: cores * 1000,
        memory_bytes: 512 * GIB,
        taints: Vec::new(),
        gpus: gpus
            .iter()
            .map(|(m, c)| GpuSpec {
                model: (*m).into(),
                capacity: *c,
            })
            .collect(),
    }
}

fn trace_node(name: &str, cores: u64, gpus: usize) -> NodeSpec {
    node(name, cores, &vec![("T4", 1000); gpus])
}

fn job(id: &str, gpus: u32, budget: u64) -> JobRequest {
    JobRequest::new(id, gpus, budget, 1000, GIB)
}

fn placer(nodes: Vec<NodeSpec>, kind: PolicyKind) -> Placer {
    Placer::new(&Inventory { nodes }, Policy::new(kind, 1)).expect("valid inventory")
}

/// Every GPU's compute free, for views of up to 64 GPUs.
const FULL_COMPUTE: [u64; 64] = [COMPUTE_WHOLE; 64];

/// Capacities no free amount in these views reaches, so that the measures
/// count the free units alone (the compute is all free).
const LARGE_CAPACITY: [u64; 64] = [u64::MAX / COMPUTE_WHOLE; 64];

/// A node view with these free units, free compute and capacities per GPU.
fn view_of<'a>(
    gpu_free: &'a [u64],
    gpu_compute_free: &'a [u64],
    gpu_capacity: &'a [u64],
    gpu_model: &'a [u8],
) -> NodeView<'a> {
    NodeView {
        cpu_free: 64_000,
        mem_free: u64::MAX,
        gpu_free,
        gpu_compute_free,
        gpu_capacity,
        gpu_model,
        taints: &[],
    }
}

fn demand(gpus: u32, per_gpu: u64, cpu: u64) -> Demand {
    Demand {
        gpus,
        per_gpu,
        compute: 0,
        cpu,
        mem: 0,
        models: ModelMask::MAX,
        tolerations: Vec::new(),
    }
}

fn view<'a>(cpu_free: u64, gpu_free: &'a [u64], models: &'a [u8]) -> NodeView<'a> {
    NodeView {
        cpu_free,
        mem_free: u64::MAX,
        gpu_free,
        gpu_compute_free: &FULL_COMPUTE,
        gpu_capacity: &LARGE_CAPACITY,
        gpu_model: models,
        taints: &[],
    }
}

#[test]
fn multi_gpu_job_takes_whole_gpus_on_one_node() {
    for kind in PolicyKind::ALL {
        let mut p = placer(vec![trace_node("a", 64, 2), trace_node("b", 64, 4)], kind);
        p.place(&job("share", 1, 300)).unwrap();
        let d = p.place(&job("pair", 2, 1000)).unwrap();
        assert_eq!(d.placement.gpu_indices.len(), 2, "{kind}");
        assert_eq!(d.memory_fractions, vec![1.0, 1.0], "{kind}");
        let node = &p.state().nodes()[d.node_index];
        for &g in &d.placement.gpu_indices {
            assert_eq!(
                node.gpu_free[g as usize], 0,
                "{kind}: GPU {g} must be taken whole"
            );
        }
    }
}

#[test]
fn eight_gpu_job_fails_when_no_node_has_eight_untouched_gpus() {
    let mut p = placer(vec![trace_node("a", 96, 8)], PolicyKind::Vramfit);
    p.place(&job("small", 1, 100)).unwrap();
    let err = p.place(&job("big", 8, 1000)).unwrap_err();
    assert!(matches!(err, PlaceError::NoRoomNow { .. }), "{err}");
    assert!(err.to_string().contains("at most 7 on a"), "{err}");
}

#[test]
fn shares_of_one_gpu_stack_and_carry_their_memory_fraction() {
    let mut p = placer(
        vec![node("a", 64, &[("H200", 140 * GIB)])],
        PolicyKind::Vramfit,
    );
    let first = p
        .place(&JobRequest::new("a", 1, 35 * GIB, 1000, GIB))
        .unwrap();
    let second = p
        .place(&JobRequest::new("b", 1, 70 * GIB, 1000, GIB))
        .unwrap();
    assert_eq!(first.placement.gpu_indices, vec![0]);
    assert_eq!(second.placement.gpu_indices, vec![0]);
    assert_eq!(first.memory_fractions, vec![0.25]);
    assert_eq!(second.memory_fractions, vec![0.5]);
    assert_eq!(p.state().nodes()[0].gpu_free[0], 35 * GIB);
}

#[test]
fn failures_say_whether_waiting_can_help() {
    let cases: [(&str, u64, bool, &str); 3] = [
        (
            "too big for any gpu",
            31 * GIB + GIB / 5,
            true,
            "needs 31.2 GiB per GPU; bigger than any GPU in the cluster",
        ),
        (
            "waits for room",
            20 * GIB,
            false,
            "needs 20.0 GiB per GPU; largest free slot 10.0 GiB on node-b",
        ),
        ("fits", 8 * GIB, false, ""),
    ];
    for (name, budget, never, message) in cases {
        let mut p = placer(
            vec![
                node("node-a", 32, &[("A10", 24 * GIB)]),
                node("node-b", 32, &[("A10", 24 * GIB)]),
            ],
            PolicyKind::BestFit,
        );
        p.place(&JobRequest::new("x", 1, 24 * GIB, 1000, GIB))
            .unwrap();
        p.place(&JobRequest::new("y", 1, 14 * GIB, 1000, GIB))
            .unwrap();
        match p.place(&JobRequest::new("job", 1, budget, 1000, GIB)) {
            Ok(_) => assert!(message.is_empty(), "{name}: should not fit"),
            Err(e) => {
                assert_eq!(
                    matches!(e, PlaceError::NeverFits { .. }),
                    never,
                    "{name}: {e}"
                );
                assert!(
                    matches!(
                        e,
                        PlaceError::NeverFits { .. } | PlaceError::NoRoomNow { .. }
                    ),
                    "{name}: {e}"
                );
                assert!(e.to_string().contains(message), "{name}: {e}");
            }
        }
    }
}

#[test]
fn cpu_shortage_is_reported_as_such() {
    let mut p = placer(vec![trace_node("a", 8, 2)], PolicyKind::Fgd);
    p.place(&JobRequest::new("hog", 0, 0, 7000, GIB)).unwrap();
    let err = p
        .place(&JobRequest::new("job", 1, 500, 4000, GIB))
        .unwrap_err();
    assert!(matches!(err, PlaceError::NoRoomNow { .. }));
    assert!(
        err.to_string()
            .contains("GPU room on 1 node(s), but none with 4.0 CPU"),
        "{err}"
    );
}

#[test]
fn allowed_models_and_taints_restrict_the_nodes() {
    let mut tainted = node("tainted", 32, &[("H100", 1000)]);
    tainted.taints.push(Taint {
        key: "team".into(),
        value: "a".into(),
        effect: TaintEffect::NoSchedule,
    });
    let nodes = vec![
        node("t4", 32, &[("T4", 1000)]),
        node("h200", 32, &[("H200", 1000)]),
        tainted,
    ];
    let tolerate = Toleration {
        key: Some("team".into()),
        value: Some("a".into()),
        effect: None,
    };
    type Case<'a> = (
        &'a str,
        Vec<&'a str>,
        Vec<Toleration>,
        Result<&'a str, &'a str>,
    );
    let cases: [Case; 4] = [
        ("model constraint", vec!["H200"], vec![], Ok("h200")),
        (
            "taint tolerated",
            vec!["H100"],
            vec![tolerate],
            Ok("tainted"),
        ),
        (
            "taint not tolerated",
            vec!["H100"],
            vec![],
            Err("even when empty"),
        ),
        (
            "model absent",
            vec!["B200"],
            vec![],
            Err("no GPU of the allowed models (B200)"),
        ),
    ];
    for (name, models, tolerations, expected) in cases {
        let mut p = placer(nodes.clone(), PolicyKind::Vramfit);
        let mut j = job("j", 1, 500);
        j.gpu_models = models.into_iter().map(String::from).collect();
        j.tolerations = tolerations;
        match (p.place(&j), expected) {
            (Ok(d), Ok(node)) => assert_eq!(d.placement.node, node, "{name}"),
            (Err(e), Err(text)) => {
                assert!(matches!(e, PlaceError::NeverFits { .. }), "{name}: {e}");
                assert!(e.to_string().contains(text), "{name}: {e}");
            }
            (got, _) => panic!("{name}: unexpected {got:?}"),
        }
    }
}

#[test]
fn release_frees_exactly_what_was_taken_and_tolerates_repeats() {
    let mut p = placer(vec![trace_node("a", 64, 2)], PolicyKind::Vramfit);
    p.place(&JobRequest::new("j", 2, 1000, 6000, 4 * GIB))
        .unwrap();
    assert_eq!(p.state().allocated_total(), 2000);
    let released = p.release("j").expect("was placed");
    assert_eq!(released.gpu_indices, vec![0, 1]);
    assert_eq!(p.state().allocated_total(), 0);
    assert_eq!(p.state().nodes()[0].cpu_free, 64_000);
    assert!(p.release("j").is_none());
    assert!(
        p.place(&job("j", 2, 1000)).is_ok(),
        "released room is usable again"
    );
}

#[test]
fn placing_the_same_job_twice_is_refused() {
    let mut p = placer(vec![trace_node("a", 64, 2)], PolicyKind::BestFit);
    p.place(&job("j", 1, 100)).unwrap();
    assert!(matches!(
        p.place(&job("j", 1, 100)),
        Err(PlaceError::AlreadyPlaced { .. })
    ));
}

#[test]
fn rebuild_reproduces_the_ledger_and_rejects_conflicts() {
    let inventory = Inventory {
        nodes: vec![trace_node("a", 64, 2), trace_node("b", 64, 2)],
    };
    let mut live = Placer::new(&inventory, Policy::new(PolicyKind::Vramfit, 1)).unwrap();
    let placements: Vec<Placement> = ["x", "y", "z"]
        .iter()
        .map(|id| live.place(&job(id, 1, 600)).unwrap().placement)
        .collect();
    let rebuilt =
        Placer::rebuild(&inventory, &placements, Policy::new(PolicyKind::Vramfit, 1)).unwrap();
    for (a, b) in live.state().nodes().iter().zip(rebuilt.state().nodes()) {
        assert_eq!((a.cpu_free, &a.gpu_free), (b.cpu_free, &b.gpu_free));
    }
    let mut over = placements[0].clone();
    over.job_id = "again".into();
    let mut twice = placements.clone();
    twice.push(over);
    let err = Placer::rebuild(&inventory, &twice, Policy::new(PolicyKind::Vramfit, 1)).unwrap_err();
    assert!(matches!(err, PlaceError::Conflict { .. }), "{err}");
    let mut unknown = placements[0].clone();
    unknown.node = "gone".into();
    assert!(Placer::rebuild(&inventory, &[unknown], Policy::new(PolicyKind::Vramfit, 1)).is_err());
}

#[test]
fn contradictory_jobs_are_invalid() {
    let mut p = placer(vec![trace_node("a", 64, 2)], PolicyKind::Vramfit);
    assert!(matches!(
        p.place(&job("j", 1, 0)),
        Err(PlaceError::InvalidJob { .. })
    ));
    assert!(matches!(
        p.place(&job("k", 0, 10)),
        Err(PlaceError::InvalidJob { .. })
    ));
}

#[test]
fn fgd_fragmentation_matches_a_hand_computed_example() {
    // Node: GPUs with 1000 and 400 free, 8 cores free.
    // A (500 units, 5 cores, p=0.5): fits on GPU0; GPU1's 400 is a fragment -> 400.
    // B (whole GPU, 1 core, p=0.25): fits on GPU0; GPU1 is a fragment       -> 400.
    // C (300 units, 16 cores, p=0.25): too little CPU, all 1400 is a fragment.
    // Expected: 0.5*400 + 0.25*400 + 0.25*1400 = 650.
    let free = [1000, 400];
    let models = [0, 0];
    let v = view(8000, &free, &models);
    let (a, b, c) = (
        demand(1, 500, 5000),
        demand(1, 1000, 1000),
        demand(1, 300, 16_000),
    );
    assert_eq!(
        [
            task_fragmentation(&v, &a),
            task_fragmentation(&v, &b),
            task_fragmentation(&v, &c)
        ],
        [400, 400, 1400]
    );
    let target =
        TargetWorkload::from_weights([(a.clone(), 2.0), (b.clone(), 1.0), (c.clone(), 1.0)]);
    assert!((expected_fragmentation(&v, &target) - 650.0).abs() < 1e-9);
    // Stranding also sees that CPU allows one more A only (5 of 8 cores):
    // A uses 500 of 1400 -> 900; B uses 1000 -> 400; C -> 1400.
    // 0.5*900 + 0.25*400 + 0.25*1400 = 900.
    assert_eq!(task_stranding(&v, &a), 900);
    assert!((expected_stranding(&v, &target) - 900.0).abs() < 1e-9);
}

#[test]
fn a_gpu_of_a_model_the_task_refuses_is_fragmented_for_it() {
    let free = [1000, 1000];
    let models = [0, 1];
    let v = view(64_000, &free, &models);
    let mut only_model_0 = demand(1, 500, 1000);
    only_model_0.models = 1;
    assert_eq!(task_fragmentation(&v, &only_model_0), 1000);
    let mut two_of_model_0 = demand(2, 1000, 1000);
    two_of_model_0.models = 1;
    assert_eq!(
        task_fragmentation(&v, &two_of_model_0),
        2000,
        "cannot run at all: everything is fragmented"
    );
}

#[test]
fn fused_measure_agrees_with_the_reference_definitions() {
    let mut rng = SeededRng::new(9);
    let shapes = [
        (1, 230),
        (1, 470),
        (1, 810),
        (1, 1000),
        (2, 1000),
        (8, 1000),
        (0, 0),
    ];
    let target = TargetWorkload::from_weights(
        shapes
            .iter()
            .enumerate()
            .map(|(i, &(g, u))| (demand(g, u, 2000 * (i as u64 + 1)), 1.0 + i as f64)),
    );
    for _ in 0..500 {
        let gpus = 1 + rng.below(8) as usize;
        let free: Vec<u64> = (0..gpus).map(|_| 10 * rng.below(101)).collect();
        let models = vec![0u8; gpus];
        let v = view(rng.below(40_000), &free, &models);
        let fused = measure_node(&v, &target);
        assert!((fused.fragmentation - expected_fragmentation(&v, &target)).abs() < 1e-6);
        assert!((fused.stranding - expected_stranding(&v, &target)).abs() < 1e-6);
    }
}

#[test]
fn fgd_keeps_room_that_the_workload_can_use_where_best_fit_does_not() {
    // Node y's GPU0 has exactly 500 free; the workload is all 500-unit tasks.
    // A 400-unit job there would leave a useless 100: best-fit takes it
    // (tightest), FGD does not.
    let nodes = vec![trace_node("x", 64, 2), trace_node("y", 64, 2)];
    let target = TargetWorkload::from_weights([(demand(1, 500, 1000), 1.0)]);
    for (kind, expect_tight) in [(PolicyKind::BestFit, true), (PolicyKind::Fgd, false)] {
        let policy = Policy::new(kind, 3).with_target_workload(target.clone());
        let mut p = Placer::new(
            &Inventory {
                nodes: nodes.clone(),
            },
            policy,
        )
        .unwrap();
        p.state
            .restore(&Placement {
                gpu_compute: 0,
                job_id: "old".into(),
                node: "y".into(),
                gpu_indices: vec![0],
                gpu_budget: 500,
                cpu_milli: 0,
                memory_bytes: 0,
            })
            .unwrap();
        let d = p.place(&job("new", 1, 400)).unwrap();
        let tight = d.placement.node == "y" && d.placement.gpu_indices == vec![0];
        assert_eq!(tight, expect_tight, "{kind}: {:?}", d.placement);
    }
}

#[test]
fn vramfit_sends_cpu_only_jobs_to_nodes_with_cpu_to_spare() {
    // Same GPUs; "lean" has 8 cores per GPU, "rich" 52. A 32-core CPU-only
    // job on "lean" would strand GPUs for the 12-core GPU jobs.
    let mut p = placer(
        vec![trace_node("lean", 64, 8), trace_node("rich", 104, 2)],
        PolicyKind::Vramfit,
    );
    for _ in 0..20 {
        p.policy.observe(&demand(1, 1000, 12_000));
    }
    let d = p.place(&JobRequest::new("cpu", 0, 0, 32_000, GIB)).unwrap();
    assert_eq!(d.placement.node, "rich");
    assert!(d.placement.gpu_indices.is_empty());
}

#[test]
fn workload_model_learns_popularity_and_forgets_the_past() {
    let (a, b) = (demand(1, 500, 1000), demand(1, 1000, 1000));
    let weight = |m: &WorkloadModel, d: &Demand| {
        m.target()
            .types()
            .iter()
            .find(|t| t.demand == *d)
            .map_or(0.0, |t| t.weight)
    };
    let mut counts = WorkloadModel::new(f64::INFINITY, 1);
    [&a, &a, &a, &b].into_iter().for_each(|d| counts.observe(d));
    assert!((weight(&counts, &a) - 0.75).abs() < 1e-9);
    let mut decayed = WorkloadModel::new(2.0, 1);
    (0..20).for_each(|_| decayed.observe(&a));
    (0..20).for_each(|_| decayed.observe(&b));
    assert!(weight(&decayed, &b) > 0.99, "recent arrivals dominate");
}

#[test]
fn inflation_stops_before_exceeding_tune_times_capacity() {
    let cases: [(&[u64], u64, f64, u64); 3] = [
        (&[100], 1000, 1.3, 1300),
        (&[300, 700], 1000, 1.3, 0),
        (&[1000, 1000, 1000], 1000, 1.3, 3000),
    ];
    for (requests, capacity, tune, exact) in cases {
        let pods: Vec<JobRequest> = requests.iter().map(|&r| job("p", 1, r)).collect();
        for seed in 42..52 {
            let order = arrival_order(&pods, capacity, tune, seed);
            let total: u64 = order.iter().map(|&i| requested_milli_gpu(&pods[i])).sum();
            let limit = (tune * capacity as f64) as u64;
            assert!(
                total <= limit.max(requests.iter().sum()),
                "total {total} over {limit}"
            );
            if exact > 0 {
                assert_eq!(total, exact, "requests {requests:?}");
            }
            for i in 0..pods.len() {
                assert!(order.contains(&i), "the original list is kept whole");
            }
        }
    }
}

#[test]
fn shuffle_is_deterministic_per_seed() {
    let pods: Vec<JobRequest> = (1..=50).map(|k| job(&format!("p{k}"), 1, 10 * k)).collect();
    let a = arrival_order(&pods, 20_000, 1.3, 42);
    assert_eq!(a, arrival_order(&pods, 20_000, 1.3, 42));
    assert_ne!(a, arrival_order(&pods, 20_000, 1.3, 43));
    assert_ne!(
        a[..50],
        (0..50).collect::<Vec<_>>()[..],
        "shuffled, not appended in order"
    );
}

const NODES_CSV: &str =
    "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,96000,393216,8,G2\n";
const PODS_CSV: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n\
p0,4000,8192,1,460,,LS\np1,8000,16384,2,1000,,LS\np2,2000,4096,0,0,,BE\np3,6000,8192,1,1000,T4|G2,LS\n";

#[test]
fn trace_rows_become_nodes_and_jobs() {
    let inventory = parse_nodes(NODES_CSV).unwrap();
    assert_eq!(inventory.nodes[1].gpus.len(), 8);
    assert_eq!(inventory.nodes[0].memory_bytes, 131_072 << 20);
    let pods = parse_pods(PODS_CSV).unwrap();
    assert_eq!((pods[0].gpus, pods[0].gpu_budget), (1, 460));
    assert_eq!((pods[1].gpus, pods[1].gpu_budget), (2, 1000));
    assert_eq!((pods[2].gpus, pods[2].gpu_budget), (0, 0));
    assert_eq!(pods[3].gpu_models, vec!["T4", "G2"]);
    let no_spec = parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,500\n").unwrap();
    assert!(no_spec[0].gpu_models.is_empty());
}

#[test]
fn malformed_trace_rows_name_file_and_line() {
    let cases = [
        (
            "name,cpu_milli\np,1\n",
            "header lacks column \"memory_mib\"",
        ),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1500\n",
            "line 2: gpu_milli 1500",
        ),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,1,1,500\n",
            "line 2: expected a non-negative integer",
        ),
    ];
    for (csv, text) in cases {
        let err = parse_pods(csv).unwrap_err().to_string();
        assert!(err.contains(text), "{err}");
    }
}

#[test]
fn pack_report_has_the_fixed_shape() {
    for policy in PolicyKind::ALL {
        let opts = PackBenchOptions {
            tune: 1.3,
            seed: 42,
            policy,
        };
        let report = run_pack_bench(NODES_CSV, PODS_CSV, &opts).unwrap();
        let json = serde_json::to_value(&report).unwrap();
        for key in [
            "unallocatedGpus",
            "placementsPerSecond",
            "pods",
            "failedPods",
        ] {
            assert!(json.get(key).is_some(), "{policy}: {key}");
        }
        let at = &json["allocationPercentAt"];
        assert!(
            at["100"].as_f64().is_some() && at["130"].as_f64().is_some(),
            "{policy}: {json}"
        );
        assert!(at["130"].as_f64().unwrap() <= 100.0);
        assert!(report.pods >= 4 && report.failed_pods < report.pods);
    }
    let bad = PackBenchOptions {
        tune: f64::NAN,
        ..PackBenchOptions::default()
    };
    assert!(matches!(
        run_pack_bench(NODES_CSV, PODS_CSV, &bad),
        Err(PlaceError::BenchOptions(_))
    ));
}

#[test]
fn policy_names_round_trip() {
    for kind in PolicyKind::ALL {
        assert_eq!(kind.name().parse::<PolicyKind>().unwrap(), kind);
    }
    assert!(matches!(
        "first-fit".parse::<PolicyKind>(),
        Err(PlaceError::UnknownPolicy(_))
    ));
}

#[test]
fn peak_rss_is_read_from_proc_status_text() {
    assert_eq!(
        parse_vm_hwm_bytes("Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t1 kB\n"),
        Some(2 << 20)
    );
    assert_eq!(parse_vm_hwm_bytes("Name:\tx\n"), None);
}

#[test]
fn duplicate_node_names_are_rejected() {
    let inventory = Inventory {
        nodes: vec![trace_node("a", 8, 1), trace_node("a", 8, 1)],
    };
    assert!(matches!(
        ClusterState::new(&inventory),
        Err(PlaceError::InvalidInventory(_))
    ));
}

#[test]
fn observing_running_jobs_teaches_the_job_mix_without_placing_them() {
    let mut p = placer(
        vec![node("n1", 64, &[("A", 1000), ("A", 1000)])],
        PolicyKind::Vramfit,
    );
    assert!(p.policy().target().is_empty());
    p.observe(&job("running", 1, 500)).unwrap();
    assert!(
        !p.policy().target().is_empty(),
        "the mix has the observed size"
    );
    assert!(p.release("running").is_none(), "observing places nothing");
    let decision = p.place(&job("next", 1, 1000)).unwrap();
    assert_eq!(decision.placement.gpu_indices.len(), 1);
}

/// One node with two 1000-unit GPUs, 8 cores and 4000 bytes of memory, of
/// which a job already holds 200 units of GPU 0, 2 cores and 1000 bytes:
/// 800 and 1000 units, 6000 millicores and 3000 bytes are free.
fn partly_used_node() -> ClusterState {
    let mut state = ClusterState::new(&Inventory {
        nodes: vec![NodeSpec {
            name: "n".into(),
            cpu_milli: 8000,
            memory_bytes: 4000,
            taints: Vec::new(),
            gpus: vec![
                GpuSpec {
                    model: "T4".into(),
                    capacity: 1000,
                };
                2
            ],
        }],
    })
    .unwrap();
    state
        .restore(&Placement {
            gpu_compute: 0,
            job_id: "old".into(),
            node: "n".into(),
            gpu_indices: vec![0],
            gpu_budget: 200,
            cpu_milli: 2000,
            memory_bytes: 1000,
        })
        .unwrap();
    state
}

fn assert_score(got: [f64; 2], want: [f64; 2], what: &str) {
    assert!(
        (got[0] - want[0]).abs() < 1e-9 && (got[1] - want[1]).abs() < 1e-9,
        "{what}: got {got:?}, want {want:?}"
    );
}

#[test]
fn best_fit_scores_the_room_left_on_the_node_then_on_the_chosen_gpus() {
    let state = partly_used_node();
    let node = &state.nodes()[0];
    // (GPUs, per-GPU units, millicores, bytes, GPU set, score). One GPU of
    // 300 units, 1 core, 500 bytes leaves 1500 of 2000 units, 5000 of 8000
    // millicores and 2500 of 4000 bytes (0.75 + 0.625 + 0.625), and 500 of
    // GPU 0's 1000 or 700 of GPU 1's.
    let cases: [(u32, u64, u64, u64, GpuSet, [f64; 2]); 5] = [
        (1, 300, 1000, 500, 0b01, [2.0, 0.5]),
        (1, 300, 1000, 500, 0b10, [2.0, 0.7]),
        // Two GPUs of 300: 1200 of 2000 units left; 500 + 700 on the GPUs.
        (2, 300, 1000, 500, 0b11, [1.85, 1.2]),
        // More CPU, less memory: 0.75 + 3000/8000 + 3000/4000.
        (1, 300, 3000, 0, 0b10, [1.875, 0.7]),
        // CPU-only: 1800 of 2000 units stay free, no GPU is chosen.
        (0, 0, 4000, 3000, 0, [0.9 + 0.25 + 0.0, 0.0]),
    ];
    for (gpus, per_gpu, cpu, mem, set, want) in cases {
        let mut d = demand(gpus, per_gpu, cpu);
        d.mem = mem;
        assert_score(
            super::best_fit::score(node, &d, set),
            want,
            &format!("{gpus} x {per_gpu} on {set:#b}, {cpu} m, {mem} B"),
        );
    }
}

#[test]
fn vramfit_charges_cpu_by_the_gpu_units_each_free_millicore_guards() {
    let state = partly_used_node();
    let node = &state.nodes()[0];
    // 1800 free GPU units over 6000 free millicores: each millicore guards
    // 0.3 units, and a job pays half of that per millicore it takes, on top
    // of the measure's growth. Best-fit's room left breaks ties.
    let cases: [(u64, f64, [f64; 2]); 4] = [
        (1000, 10.0, [10.0 + 150.0, 2.0]),
        (3000, -4.0, [-4.0 + 450.0, 1.75]),
        (0, 10.0, [10.0, 2.125]),
        (0, 0.0, [0.0, 2.125]),
    ];
    for (cpu, growth, want) in cases {
        let mut d = demand(1, 300, cpu);
        d.mem = 500;
        assert_score(
            super::vramfit::score(node, &d, 0b01, growth),
            want,
            &format!("{cpu} m, growth {growth}"),
        );
    }
}

#[test]
fn vramfit_descends_fragmentation_plus_stranding_and_fgd_fragmentation_alone() {
    // The node and workload of fgd_fragmentation_matches_a_hand_computed_example:
    // fragmentation 650, stranding 900.
    let free = [1000, 400];
    let models = [0, 0];
    let v = view(8000, &free, &models);
    let target = TargetWorkload::from_weights([
        (demand(1, 500, 5000), 2.0),
        (demand(1, 1000, 1000), 1.0),
        (demand(1, 300, 16_000), 1.0),
    ]);
    assert!((super::vramfit::measure(&v, &target) - 1550.0).abs() < 1e-9);
    assert_score(super::fgd::score(650.0), [650.0, 0.0], "fgd");
}

#[test]
fn a_toleration_matches_key_value_and_effect_each_exactly_or_any() {
    use TaintEffect::{NoExecute, NoSchedule};
    let taint = Taint {
        key: "team".into(),
        value: "a".into(),
        effect: NoSchedule,
    };
    let tol = |key: Option<&str>, value: Option<&str>, effect| Toleration {
        key: key.map(Into::into),
        value: value.map(Into::into),
        effect,
    };
    let cases = [
        (
            "exact",
            tol(Some("team"), Some("a"), Some(NoSchedule)),
            true,
        ),
        ("any effect", tol(Some("team"), Some("a"), None), true),
        ("exists", tol(Some("team"), None, None), true),
        ("everything", tol(None, None, None), true),
        ("other key", tol(Some("zone"), Some("a"), None), false),
        ("other key, exists", tol(Some("zone"), None, None), false),
        ("other value", tol(Some("team"), Some("b"), None), false),
        (
            "other effect",
            tol(Some("team"), Some("a"), Some(NoExecute)),
            false,
        ),
        (
            "only the effect",
            tol(Some("zone"), Some("b"), Some(NoSchedule)),
            false,
        ),
    ];
    for (name, toleration, tolerates) in cases {
        assert_eq!(toleration.tolerates(&taint), tolerates, "{name}");
    }
}

#[test]
fn the_memo_computes_each_state_once_per_class_and_workload_version() {
    use std::cell::Cell;
    let calls = Cell::new(0);
    let compute = |v: &NodeView, _: &TargetWorkload| {
        calls.set(calls.get() + 1);
        (v.cpu_free + v.gpu_free.iter().sum::<u64>()) as f64
    };
    let target = TargetWorkload::default();
    let mut memo = super::memo::MeasureMemo::default();
    // (what, class, CPU free, GPU free, models, version, computed again, value)
    type Case = (&'static str, u32, u64, [u64; 2], [u8; 2], u64, bool, f64);
    let cases: [Case; 8] = [
        ("first sight", 0, 100, [10, 20], [0, 1], 1, true, 130.0),
        ("same state", 0, 100, [10, 20], [0, 1], 1, false, 130.0),
        ("other free units", 0, 100, [10, 30], [0, 1], 1, true, 140.0),
        ("other models", 0, 100, [10, 20], [1, 0], 1, true, 130.0),
        ("GPUs permuted", 0, 100, [20, 10], [1, 0], 1, false, 130.0),
        ("other CPU", 0, 200, [10, 20], [0, 1], 1, true, 230.0),
        ("other class", 1, 100, [10, 20], [0, 1], 1, true, 130.0),
        (
            "new workload version",
            0,
            100,
            [10, 20],
            [0, 1],
            2,
            true,
            130.0,
        ),
    ];
    for (what, class, cpu, free, models, version, again, value) in cases {
        let before = calls.get();
        let got = memo.get_or_compute(class, &view(cpu, &free, &models), &target, version, compute);
        assert_eq!(calls.get() > before, again, "{what}");
        assert_eq!(got, value, "{what}");
    }
}

#[test]
fn memo_keys_hash_apart() {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, BuildHasherDefault};
    let hasher = BuildHasherDefault::<super::memo::WordHasher>::default();
    let mut keys: Vec<Box<[u64]>> = Vec::new();
    for cpu in (0..64_000).step_by(4000) {
        for mem in [0, GIB, 2 * GIB] {
            for a in (0..=1000).step_by(100) {
                for b in (0..=1000).step_by(100) {
                    keys.push(vec![0, cpu, mem, a, b].into());
                }
            }
        }
    }
    // All-zero keys differ only in their length.
    keys.extend((1..=4).map(|n| vec![0; n].into()));
    let hashes: HashSet<u64> = keys.iter().map(|k| hasher.hash_one(k)).collect();
    assert_eq!(hashes.len(), keys.len());
}

#[test]
fn a_restored_placement_holds_its_room_and_a_conflicting_one_changes_nothing() {
    let mut p = placer(vec![trace_node("a", 8, 2)], PolicyKind::BestFit);
    let held = Placement {
        gpu_compute: 0,
        job_id: "old".into(),
        node: "a".into(),
        gpu_indices: vec![1],
        gpu_budget: 600,
        cpu_milli: 2000,
        memory_bytes: GIB,
    };
    p.restore(&held).unwrap();
    assert_eq!(p.state().placement("old"), Some(&held));
    assert_eq!(p.state().nodes()[0].gpu_free, vec![1000, 400]);
    assert_eq!(p.state().nodes()[0].cpu_free, 6000);
    let over = Placement {
        job_id: "over".into(),
        gpu_budget: 500,
        ..held.clone()
    };
    assert!(matches!(p.restore(&over), Err(PlaceError::Conflict { .. })));
    assert!(matches!(
        p.restore(&held),
        Err(PlaceError::AlreadyPlaced { .. })
    ));
    assert!(p.state().placement("over").is_none());
    assert_eq!(p.state().nodes()[0].gpu_free, vec![1000, 400]);
    assert_eq!(p.state().placed_jobs(), 1);
}

/// A cluster of one-GPU, 64-core nodes (1000 units a GPU) whose GPU `i`
/// already has `held[i]` units taken, for the policy tests.
fn cluster_with_held(held: &[u64]) -> Vec<(NodeSpec, u64)> {
    held.iter()
        .enumerate()
        .map(|(i, &h)| (trace_node(&format!("n{i}"), 64, 1), h))
        .collect()
}

/// A placer over `nodes` where each node's GPU 0 has the paired units held.
fn placer_with_held(nodes: Vec<(NodeSpec, u64)>, policy: Policy) -> Placer {
    let inventory = Inventory {
        nodes: nodes.iter().map(|(n, _)| n.clone()).collect(),
    };
    let mut p = Placer::new(&inventory, policy).unwrap();
    for (n, held) in nodes.iter().filter(|(_, h)| *h > 0) {
        p.restore(&Placement {
            gpu_compute: 0,
            job_id: format!("held-{}", n.name),
            node: n.name.clone(),
            gpu_indices: vec![0],
            gpu_budget: *held,
            cpu_milli: 0,
            memory_bytes: 0,
        })
        .unwrap();
    }
    p
}

#[test]
fn scores_within_epsilon_tie_and_the_second_component_breaks_ties() {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let cases: [(&str, [f64; 2], [f64; 2], std::cmp::Ordering); 11] = [
        ("first decides", [1.0, 0.0], [0.0, 1.0], Greater),
        ("first within epsilon", [1e-9, 0.0], [0.0, 1.0], Less),
        ("first exactly epsilon apart", [1e-7, 0.0], [0.0, 1.0], Less),
        ("first equal", [0.5, 0.0], [0.5, 1.0], Less),
        ("tiny firsts", [1e-8, 0.0], [2e-8, 1.0], Less),
        ("second decides", [2.0, 5.0], [2.0, 3.0], Greater),
        ("second of opposite signs", [0.0, 1.0], [0.0, -1.0], Greater),
        ("second within epsilon", [0.0, 1e-9], [0.0, 0.0], Equal),
        (
            "second exactly epsilon apart",
            [0.0, 1e-7],
            [0.0, 0.0],
            Equal,
        ),
        ("tiny seconds", [0.0, 1e-8], [0.0, 2e-8], Equal),
        ("same", [1.0, 1.0], [1.0, 1.0], Equal),
    ];
    for (name, a, b, expected) in cases {
        assert_eq!(super::policy::compare(&a, &b), expected, "{name}");
    }
}

#[test]
fn policy_kinds_display_as_their_names() {
    let shown: Vec<String> = PolicyKind::ALL.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["random", "best-fit", "fgd", "vramfit"]);
}

#[test]
fn a_cached_choice_is_the_choice_a_fresh_policy_makes() {
    // A long-lived policy keeps scores per (node, task type) and the node
    // measures across jobs; after every change it must choose as a policy
    // that has seen the same arrivals but has nothing cached.
    let mut nodes = vec![
        trace_node("a", 32, 2),
        trace_node("b", 96, 4),
        node("c", 64, &[("A100", 1000), ("A100", 1000), ("T4", 1000)]),
        trace_node("d", 16, 1),
        trace_node("e", 96, 4),
    ];
    nodes[3].taints.push(Taint {
        key: "spot".into(),
        value: String::new(),
        effect: TaintEffect::NoExecute,
    });
    let inventory = Inventory { nodes };
    let shapes: [(u32, u64, u64); 6] = [
        (1, 230, 4000),
        (1, 500, 8000),
        (1, 1000, 12_000),
        (2, 1000, 16_000),
        (0, 0, 24_000),
        (1, 470, 2000),
    ];
    for kind in [PolicyKind::BestFit, PolicyKind::Vramfit] {
        let mut rng = SeededRng::new(5);
        let mut state = ClusterState::new(&inventory).unwrap();
        let mut live = Policy::new(kind, 1);
        let mut seen: Vec<Demand> = Vec::new();
        let mut placed: Vec<String> = Vec::new();
        for step in 0..300 {
            if !placed.is_empty() && rng.below(3) == 0 {
                let k = rng.below(placed.len() as u64) as usize;
                state.release(&placed.swap_remove(k)).unwrap();
                continue;
            }
            let (gpus, budget, cpu) = shapes[rng.below(shapes.len() as u64) as usize];
            let mut request = JobRequest::new(format!("j{step}"), gpus, budget, cpu, GIB);
            if rng.below(4) == 0 {
                request.tolerations.push(Toleration {
                    key: Some("spot".into()),
                    value: None,
                    effect: None,
                });
            }
            let d = state.demand_of(&request).unwrap();
            live.observe(&d);
            seen.push(d.clone());
            let mut fresh = Policy::new(kind, 1);
            seen.iter().for_each(|s| fresh.observe(s));
            let chosen = live.choose(&state, &d);
            assert_eq!(chosen, fresh.choose(&state, &d), "{kind}, step {step}");
            if let Some((node, set)) = chosen {
                state.commit(&request, &d, node, set).unwrap();
                placed.push(request.id);
            }
        }
    }
}

#[test]
fn a_job_that_takes_exactly_the_free_cpu_or_memory_fits() {
    for kind in PolicyKind::ALL {
        let mut p = placer(vec![trace_node("a", 8, 2)], kind);
        let exact_cpu = JobRequest::new("cpu", 1, 500, 8000, GIB);
        let exact_mem = JobRequest::new("mem", 1, 500, 0, 511 * GIB);
        assert!(p.place(&exact_cpu).is_ok(), "{kind}: all 8 cores");
        assert!(p.place(&exact_mem).is_ok(), "{kind}: the remaining 511 GiB");
    }
}

#[test]
fn on_equal_growth_best_fit_and_vramfit_take_the_tightest_earliest_node_and_fgd_any() {
    // 200-unit tasks use 1000 or 700 free units alike (no fragment, no
    // stranding change), so the growth ties everywhere. Best-fit's room left
    // prefers 700 (n1, before its twin n2); FGD picks uniformly.
    let target = TargetWorkload::from_weights([(demand(1, 200, 0), 1.0)]);
    let job = JobRequest::new("j", 1, 200, 0, 0);
    let mut fgd_counts = [0u32; 3];
    for seed in 0..300 {
        for kind in [PolicyKind::BestFit, PolicyKind::Vramfit, PolicyKind::Fgd] {
            let policy = Policy::new(kind, seed).with_target_workload(target.clone());
            let mut p = placer_with_held(cluster_with_held(&[0, 300, 300]), policy);
            let node = p.place(&job).unwrap().node_index;
            if kind == PolicyKind::Fgd {
                fgd_counts[node] += 1;
            } else {
                assert_eq!(node, 1, "{kind}, seed {seed}");
            }
        }
    }
    // 100 each on average; 60..140 is almost five standard deviations.
    assert!(
        fgd_counts.iter().all(|&c| (60..140).contains(&c)),
        "{fgd_counts:?}"
    );
}

#[test]
fn fgd_and_vramfit_descend_the_growth_of_the_node_measure() {
    // Target: 500-unit tasks. A 100-unit job either fills n0's 100-unit
    // fragment (the measure falls by 100) or leaves n1 at 900 (no change);
    // or it leaves n0 at 450, too small for a task (the measure grows by
    // 450), instead of n1 at 900. (held units per node, node chosen)
    let target = TargetWorkload::from_weights([(demand(1, 500, 1000), 1.0)]);
    let cases: [(&str, [u64; 2], usize); 2] = [
        ("fills a fragment", [900, 0], 0),
        ("keeps a usable GPU whole", [450, 0], 1),
    ];
    for (name, held, expected) in cases {
        for kind in [PolicyKind::Fgd, PolicyKind::Vramfit] {
            for seed in 0..20 {
                let policy = Policy::new(kind, seed).with_target_workload(target.clone());
                let mut p = placer_with_held(cluster_with_held(&held), policy);
                let d = p.place(&job("j", 1, 100)).unwrap();
                assert_eq!(d.node_index, expected, "{name}, {kind}, seed {seed}");
            }
        }
    }
}

#[test]
fn vramfit_counts_the_stranded_tail_that_fgd_does_not_see() {
    // Target: 460-unit tasks of one core. n0's GPU has 600 free (one task,
    // a 140 tail); n1's is empty (two tasks, an 80 tail) but a CPU-only job
    // holds 60 of its 64 cores. A 100-unit job without CPU on n0 shrinks
    // the tail to 40 (stranding -100); on n1 it leaves 900, room for one
    // task and a 440 tail (stranding +360). Fragmentation does not change
    // on either, so FGD's measure alone would leave it to best-fit, which
    // prefers n1 (its CPU is nearly used up).
    let target = TargetWorkload::from_weights([(demand(1, 460, 1000), 1.0)]);
    let policy = Policy::new(PolicyKind::Vramfit, 1).with_target_workload(target);
    let mut p = placer_with_held(cluster_with_held(&[400, 0]), policy);
    p.restore(&Placement {
        gpu_compute: 0,
        job_id: "cpu-hog".into(),
        node: "n1".into(),
        gpu_indices: vec![],
        gpu_budget: 0,
        cpu_milli: 60_000,
        memory_bytes: 0,
    })
    .unwrap();
    let d = p.place(&JobRequest::new("j", 1, 100, 0, 0)).unwrap();
    assert_eq!(d.placement.node, "n0");
}

#[test]
fn inside_a_node_the_tightest_gpu_is_offered_whatever_its_neighbours() {
    // (GPUs as (model, capacity, held), job units, GPU chosen by best-fit).
    type Case = (&'static str, Vec<(&'static str, u64, u64)>, u64, u32);
    let cases: Vec<Case> = vec![
        (
            "less free",
            vec![("T4", 1000, 0), ("T4", 1000, 500)],
            400,
            1,
        ),
        // Same free units; 100 of 2000 left is tighter than 100 of 1000.
        (
            "larger capacity",
            vec![("T4", 1000, 500), ("T4", 2000, 1500)],
            400,
            1,
        ),
    ];
    for (name, gpus, units, expected) in cases {
        let spec: Vec<(&str, u64)> = gpus.iter().map(|&(m, c, _)| (m, c)).collect();
        let mut p = placer(vec![node("a", 64, &spec)], PolicyKind::BestFit);
        for (g, &(_, _, held)) in gpus.iter().enumerate().filter(|(_, g)| g.2 > 0) {
            p.restore(&Placement {
                gpu_compute: 0,
                job_id: format!("held-{g}"),
                node: "a".into(),
                gpu_indices: vec![g as u32],
                gpu_budget: held,
                cpu_milli: 0,
                memory_bytes: 0,
            })
            .unwrap();
        }
        let d = p.place(&job("j", 1, units)).unwrap();
        assert_eq!(d.placement.gpu_indices, vec![expected], "{name}");
    }
    // Same free units and capacity, other model: the A100 is kept for the
    // A100-only tasks of the target, so the job goes to the T4.
    let a100_only = ModelMask::from(1u8);
    let mut task = demand(1, 600, 0);
    task.models = a100_only;
    for kind in [PolicyKind::Fgd, PolicyKind::Vramfit] {
        let policy = Policy::new(kind, 1)
            .with_target_workload(TargetWorkload::from_weights([(task.clone(), 1.0)]));
        let mut p = Placer::new(
            &Inventory {
                nodes: vec![node("a", 64, &[("A100", 1000), ("T4", 1000)])],
            },
            policy,
        )
        .unwrap();
        let d = p.place(&JobRequest::new("j", 1, 500, 0, 0)).unwrap();
        assert_eq!(d.placement.gpu_indices, vec![1], "{kind}");
    }
}

#[test]
fn a_multi_gpu_job_takes_the_tightest_gpus_when_enough_serve() {
    // (held units per GPU of one node, GPUs, units each, GPUs chosen)
    type Case = (&'static str, Vec<u64>, u32, u64, Option<Vec<u32>>);
    let cases: Vec<Case> = vec![
        (
            "more serve than needed",
            vec![0, 400, 200],
            2,
            500,
            Some(vec![1, 2]),
        ),
        (
            "exactly as many serve",
            vec![0, 0],
            2,
            1000,
            Some(vec![0, 1]),
        ),
        ("too few serve", vec![0, 700, 0], 3, 500, None),
    ];
    for (name, held, gpus, units, expected) in cases {
        for kind in [PolicyKind::BestFit, PolicyKind::Fgd, PolicyKind::Vramfit] {
            let mut p = placer(vec![trace_node("a", 64, held.len())], kind);
            for (g, &h) in held.iter().enumerate().filter(|(_, h)| **h > 0) {
                p.restore(&Placement {
                    gpu_compute: 0,
                    job_id: format!("held-{g}"),
                    node: "a".into(),
                    gpu_indices: vec![g as u32],
                    gpu_budget: h,
                    cpu_milli: 0,
                    memory_bytes: 0,
                })
                .unwrap();
            }
            let got = p
                .place(&job("j", gpus, units))
                .ok()
                .map(|d| d.placement.gpu_indices);
            assert_eq!(got, expected, "{name}, {kind}");
        }
    }
}

#[test]
fn random_picks_among_the_feasible_nodes_only_and_every_one_of_them() {
    // n0's GPU is full; n1..n3 can take the job.
    let mut counts = [0u32; 4];
    for seed in 0..200 {
        let policy = Policy::new(PolicyKind::Random, seed);
        let mut p = placer_with_held(cluster_with_held(&[1000, 0, 300, 600]), policy);
        let d = p.place(&job("j", 1, 400)).unwrap();
        assert_eq!(d.placement.gpu_indices, vec![0]);
        counts[d.node_index] += 1;
    }
    assert_eq!(counts[0], 0, "{counts:?}");
    assert!(counts[1..].iter().all(|&c| c > 30), "{counts:?}");
    // Several GPUs: only the ones that serve, each once.
    for seed in 0..20 {
        let mut p = placer(vec![trace_node("a", 64, 4)], PolicyKind::Random);
        for g in [1, 3] {
            p.restore(&Placement {
                gpu_compute: 0,
                job_id: format!("held-{g}"),
                node: "a".into(),
                gpu_indices: vec![g],
                gpu_budget: 800,
                cpu_milli: 0,
                memory_bytes: 0,
            })
            .unwrap();
        }
        p.policy = Policy::new(PolicyKind::Random, seed);
        let d = p.place(&job("j", 2, 500)).unwrap();
        assert_eq!(d.placement.gpu_indices, vec![0, 2], "seed {seed}");
    }
}

#[test]
fn the_ledger_takes_and_gives_back_exactly_what_a_job_holds() {
    let mut p = placer(
        vec![trace_node("a", 8, 3), trace_node("b", 8, 1)],
        PolicyKind::BestFit,
    );
    let fresh = |p: &Placer, i: usize| {
        let n = &p.state().nodes()[i];
        (n.cpu_free, n.mem_free, n.gpu_free.clone())
    };
    assert_eq!(p.state().capacity_total(), 4000);
    assert_eq!(p.state().untouched_gpus(), 4);
    let pair = p
        .place(&JobRequest::new("pair", 2, 700, 3000, 100 * GIB))
        .unwrap();
    assert_eq!(pair.node_index, 0);
    let share = p
        .place(&JobRequest::new("share", 1, 200, 1000, GIB))
        .unwrap();
    assert_eq!(
        (share.node_index, share.placement.gpu_indices.clone()),
        (0, vec![0])
    );
    assert_eq!(fresh(&p, 0), (4000, 411 * GIB, vec![100, 300, 1000]));
    assert_eq!(p.state().allocated_total(), 1600);
    assert_eq!(p.state().untouched_gpus(), 2);
    assert_eq!(p.state().placed_jobs(), 2);
    assert_eq!(p.release("pair"), Some(pair.placement));
    assert_eq!(fresh(&p, 0), (7000, 511 * GIB, vec![800, 1000, 1000]));
    assert_eq!(p.state().allocated_total(), 200);
    assert_eq!(p.state().untouched_gpus(), 3);
    assert_eq!(p.state().placed_jobs(), 1);
    assert_eq!(
        fresh(&p, 1),
        (8000, 512 * GIB, vec![1000]),
        "the other node is untouched"
    );
}

#[test]
fn a_restored_placement_may_take_exactly_the_room_left_and_not_one_unit_more() {
    // Node a: 2 GPUs of 1000, 8 cores, 512 GiB; "old" holds 400 of GPU 0,
    // 2 cores and 12 GiB.
    let base = Placement {
        gpu_compute: 0,
        job_id: "new".into(),
        node: "a".into(),
        gpu_indices: vec![0],
        gpu_budget: 600,
        cpu_milli: 6000,
        memory_bytes: 500 * GIB,
    };
    let with = |f: &dyn Fn(&mut Placement)| {
        let mut p = base.clone();
        f(&mut p);
        p
    };
    let cases: [(&str, Placement, bool); 7] = [
        ("exactly what is left", base.clone(), true),
        ("one unit of GPU more", with(&|p| p.gpu_budget += 1), false),
        ("one millicore more", with(&|p| p.cpu_milli += 1), false),
        ("one byte more", with(&|p| p.memory_bytes += 1), false),
        (
            "the other GPU whole",
            with(&|p| {
                p.gpu_indices = vec![1];
                p.gpu_budget = 1000
            }),
            true,
        ),
        (
            "a GPU the node lacks",
            with(&|p| p.gpu_indices = vec![2]),
            false,
        ),
        (
            "a node not in the inventory",
            with(&|p| p.node = "z".into()),
            false,
        ),
    ];
    for (name, placement, ok) in cases {
        let mut p = placer(vec![trace_node("a", 8, 2)], PolicyKind::BestFit);
        p.restore(&Placement {
            gpu_compute: 0,
            job_id: "old".into(),
            node: "a".into(),
            gpu_indices: vec![0],
            gpu_budget: 400,
            cpu_milli: 2000,
            memory_bytes: 12 * GIB,
        })
        .unwrap();
        let before = p.state().nodes()[0].clone();
        match p.restore(&placement) {
            Ok(()) => assert!(ok, "{name}: accepted"),
            Err(e) => {
                assert!(!ok, "{name}: {e}");
                assert!(matches!(e, PlaceError::Conflict { .. }), "{name}: {e}");
                let after = &p.state().nodes()[0];
                assert_eq!(
                    (after.cpu_free, after.mem_free, &after.gpu_free),
                    (before.cpu_free, before.mem_free, &before.gpu_free),
                    "{name}: a refused placement changes nothing"
                );
                assert!(p.state().placement("new").is_none(), "{name}");
            }
        }
    }
}

#[test]
fn random_never_picks_a_node_short_of_cpu_or_memory() {
    // n0 lacks CPU, n1 memory, n2 GPU room; only n3 fits.
    let mut nodes = vec![
        trace_node("n0", 2, 1),
        trace_node("n1", 64, 1),
        trace_node("n2", 64, 1),
        trace_node("n3", 64, 1),
    ];
    nodes[1].memory_bytes = GIB;
    for seed in 0..30 {
        let mut p = Placer::new(
            &Inventory {
                nodes: nodes.clone(),
            },
            Policy::new(PolicyKind::Random, seed),
        )
        .unwrap();
        p.restore(&Placement {
            gpu_compute: 0,
            job_id: "full".into(),
            node: "n2".into(),
            gpu_indices: vec![0],
            gpu_budget: 800,
            cpu_milli: 0,
            memory_bytes: 0,
        })
        .unwrap();
        let d = p
            .place(&JobRequest::new("j", 1, 500, 4000, 2 * GIB))
            .unwrap();
        assert_eq!(d.placement.node, "n3", "seed {seed}");
    }
}

#[test]
fn fgd_measures_the_node_as_it_would_be_after_the_placement() {
    // Target: 500-unit tasks of 8 cores and 8 GiB. A 100-unit job with 10
    // cores (or 10 GiB) leaves n0 (16 cores, 16 GiB) unable to host a task,
    // so all its GPU becomes a fragment; n1 (64 cores, 512 GiB) stays usable.
    let mut task = demand(1, 500, 8000);
    task.mem = 8 * GIB;
    let target = TargetWorkload::from_weights([(task, 1.0)]);
    let mut small = trace_node("n0", 16, 1);
    small.memory_bytes = 16 * GIB;
    let nodes = vec![small, trace_node("n1", 64, 1)];
    for (what, cpu, mem) in [("CPU", 10_000, 0), ("memory", 0, 10 * GIB)] {
        for seed in 0..20 {
            let policy = Policy::new(PolicyKind::Fgd, seed).with_target_workload(target.clone());
            let mut p = Placer::new(
                &Inventory {
                    nodes: nodes.clone(),
                },
                policy,
            )
            .unwrap();
            let d = p.place(&JobRequest::new("j", 1, 100, cpu, mem)).unwrap();
            assert_eq!(d.placement.node, "n1", "{what}, seed {seed}");
        }
    }
    // Within a node, only the chosen GPU loses the units: on GPUs with 1000
    // and 550 free, GPU 0 keeps both usable, GPU 1 would leave 450.
    let target = TargetWorkload::from_weights([(demand(1, 500, 1000), 1.0)]);
    for kind in [PolicyKind::Fgd, PolicyKind::Vramfit] {
        for seed in 0..20 {
            let policy = Policy::new(kind, seed).with_target_workload(target.clone());
            let mut p = Placer::new(
                &Inventory {
                    nodes: vec![trace_node("a", 64, 2)],
                },
                policy,
            )
            .unwrap();
            p.restore(&Placement {
                gpu_compute: 0,
                job_id: "old".into(),
                node: "a".into(),
                gpu_indices: vec![1],
                gpu_budget: 450,
                cpu_milli: 0,
                memory_bytes: 0,
            })
            .unwrap();
            let d = p.place(&job("j", 1, 100)).unwrap();
            assert_eq!(d.placement.gpu_indices, vec![0], "{kind}, seed {seed}");
        }
    }
}

#[test]
fn cached_scores_and_node_measures_are_dropped_when_the_learned_mix_moves() {
    // y's two GPUs have 450 of 1000 free each. While the mix is 100-unit
    // tasks, that is nearly all usable and a 400-unit job goes to the empty
    // x; once it is 500-unit tasks, both 450s are fragments and the job
    // fills one of them. Neither node changes in between: only the
    // workload version tells the cached scores and node measures to go.
    let mut p = placer(
        vec![trace_node("x", 64, 2), trace_node("y", 64, 2)],
        PolicyKind::Vramfit,
    );
    for g in 0..2 {
        p.restore(&Placement {
            gpu_compute: 0,
            job_id: format!("old-{g}"),
            node: "y".into(),
            gpu_indices: vec![g],
            gpu_budget: 550,
            cpu_milli: 0,
            memory_bytes: 0,
        })
        .unwrap();
    }
    let d = p
        .state
        .demand_of(&JobRequest::new("j", 1, 400, 0, 0))
        .unwrap();
    let small = p.state.demand_of(&job("small", 1, 100)).unwrap();
    let large = p.state.demand_of(&job("large", 1, 500)).unwrap();
    let mut seen = Vec::new();
    let choose = |p: &mut Placer, seen: &[Demand]| {
        let mut fresh = Policy::new(PolicyKind::Vramfit, 1);
        seen.iter().for_each(|s| fresh.observe(s));
        let chosen = p.policy.choose(&p.state, &d);
        assert_eq!(
            chosen,
            fresh.choose(&p.state, &d),
            "after {} arrivals",
            seen.len()
        );
        chosen
    };
    for _ in 0..50 {
        p.policy.observe(&small);
        seen.push(small.clone());
    }
    let before = choose(&mut p, &seen);
    assert_eq!(before, Some((0, 0b01)), "the empty x");
    for _ in 0..500 {
        p.policy.observe(&large);
        seen.push(large.clone());
    }
    assert_eq!(choose(&mut p, &seen), Some((1, 0b01)), "a fragment on y");
}

/// A task finds every free GPU unit of a node fragmented when it cannot run
/// there at all: CPU or memory short by one unit, or a taint it does not
/// tolerate. Exactly the free amount still fits, and a taint counts only
/// when the task does not tolerate it.
#[test]
fn a_task_that_cannot_run_on_a_node_finds_all_its_free_gpu_fragmented() {
    let free = [1000, 300];
    let models = [0, 0];
    let taints = [Taint {
        key: "team".into(),
        value: "a".into(),
        effect: TaintEffect::NoSchedule,
    }];
    let tolerates = vec![Toleration {
        key: Some("team".into()),
        value: None,
        effect: None,
    }];
    // A 500-unit task: GPU 0 serves it, GPU 1's 300 units are a fragment.
    let fits = 300;
    let nowhere = 1300;
    type Case<'a> = (&'a str, u64, u64, &'a [Taint], Vec<Toleration>, u64);
    let cases: [Case; 10] = [
        ("room for it", 1000, GIB, &[], vec![], fits),
        ("CPU exactly what is free", 4000, GIB, &[], vec![], fits),
        ("one millicore more CPU", 4001, GIB, &[], vec![], nowhere),
        (
            "memory exactly what is free",
            1000,
            8 * GIB,
            &[],
            vec![],
            fits,
        ),
        (
            "one byte more memory",
            1000,
            8 * GIB + 1,
            &[],
            vec![],
            nowhere,
        ),
        ("both short", 4001, 8 * GIB + 1, &[], vec![], nowhere),
        (
            "a taint it does not tolerate",
            1000,
            GIB,
            &taints,
            vec![],
            nowhere,
        ),
        (
            "a taint it tolerates",
            1000,
            GIB,
            &taints,
            tolerates.clone(),
            fits,
        ),
        (
            "a toleration and no taint",
            1000,
            GIB,
            &[],
            tolerates.clone(),
            fits,
        ),
        (
            "tolerated, but CPU short",
            4001,
            GIB,
            &taints,
            tolerates.clone(),
            nowhere,
        ),
    ];
    for (name, cpu, mem, node_taints, tolerations, want) in cases {
        let v = NodeView {
            cpu_free: 4000,
            mem_free: 8 * GIB,
            gpu_free: &free,
            gpu_compute_free: &FULL_COMPUTE,
            gpu_capacity: &LARGE_CAPACITY,
            gpu_model: &models,
            taints: node_taints,
        };
        let task = Demand {
            mem,
            tolerations,
            ..demand(1, 500, cpu)
        };
        assert_eq!(task_fragmentation(&v, &task), want, "{name}");
        // Where it can run, two copies fit GPU 0 (CPU and memory allow 4):
        // GPU 1's 300 units are stranded too.
        if mem == GIB && cpu == 1000 {
            assert_eq!(task_stranding(&v, &task), want, "{name}: stranding");
        }
        // The fused measure (tainted nodes go through the definitions).
        let only = TargetWorkload::from_weights([(task, 1.0)]);
        assert_eq!(measure_node(&v, &only).fragmentation, want as f64, "{name}");
    }
}

#[test]
fn a_workload_from_observed_demands_weighs_each_type_by_its_count() {
    let (a, b) = (demand(1, 500, 1000), demand(2, 1000, 2000));
    let target = TargetWorkload::from_demands([&a, &b, &a, &a]);
    let weights: Vec<(Demand, f64)> = target
        .types()
        .iter()
        .map(|t| (t.demand.clone(), t.weight))
        .collect();
    assert_eq!(weights, [(a.clone(), 0.75), (b.clone(), 0.25)]);
    // A type of weight 0 is not a type of the workload.
    let zero = TargetWorkload::from_weights([(a.clone(), 2.0), (b, 0.0)]);
    assert_eq!(zero.types().len(), 1);
    assert_eq!(zero.types()[0].demand, a);
    assert_eq!(zero.types()[0].weight, 1.0);
}

/// Types of the same GPU shape that accept different GPU models are measured
/// with their own models: on a node with one GPU of each model, each type
/// finds the other model's GPU fragmented.
#[test]
fn types_of_one_shape_and_other_models_are_measured_apart() {
    let free = [1000, 600];
    let models = [0, 1];
    let v = view(64_000, &free, &models);
    let on_model = |mask: ModelMask| Demand {
        models: mask,
        ..demand(1, 500, 1000)
    };
    let (first, second) = (on_model(1), on_model(2));
    assert_eq!(task_fragmentation(&v, &first), 600);
    assert_eq!(task_fragmentation(&v, &second), 1000);
    // Two copies of the first fit GPU 0 (1,600 - 1,000 stranded), one of
    // the second GPU 1 (1,600 - 500).
    assert_eq!(task_stranding(&v, &first), 600);
    assert_eq!(task_stranding(&v, &second), 1100);
    let target = TargetWorkload::from_weights([(first, 1.0), (second, 1.0)]);
    let fused = measure_node(&v, &target);
    assert_eq!(fused.fragmentation, 800.0);
    assert_eq!(fused.fragmentation, expected_fragmentation(&v, &target));
    assert_eq!(fused.stranding, expected_stranding(&v, &target));
}

/// A workload model that decays fast rescales its counts before they
/// overflow: after 3,000 arrivals at a half-life of one arrival (the
/// increment doubles each time, past f64's range by the 1,024th), the
/// weights are still those of the last arrivals.
#[test]
fn a_fast_decaying_workload_model_keeps_finite_weights_over_long_runs() {
    let (a, b) = (demand(1, 500, 1000), demand(1, 250, 1000));
    let mut model = WorkloadModel::new(1.0, 1);
    for i in 0..3000 {
        model.observe(if i % 2 == 0 { &a } else { &b });
    }
    let types = model.target().types();
    let weights: Vec<(u64, f64)> = types.iter().map(|t| (t.demand.per_gpu, t.weight)).collect();
    // The last arrival (b) counts twice the one before it (a), and so on
    // back: b holds 2/3 of the weight.
    assert_eq!(weights.len(), 2, "{weights:?}");
    assert_eq!(weights[0].0, 250);
    assert!((weights[0].1 - 2.0 / 3.0).abs() < 1e-9, "{weights:?}");
    assert!((weights[1].1 - 1.0 / 3.0).abs() < 1e-9, "{weights:?}");
}

/// The published target changes only when it must: a new type refreshes it
/// at once only while nothing is published; otherwise it waits for the
/// refresh interval, and a refresh that finds the same distribution keeps
/// the published one (and its version, which the score caches compare).
#[test]
fn the_published_workload_changes_only_at_a_refresh_that_moves_it() {
    let (a, b) = (demand(1, 500, 1000), demand(1, 250, 1000));
    let per_gpu = |m: &WorkloadModel| -> Vec<u64> {
        m.target()
            .types()
            .iter()
            .map(|t| t.demand.per_gpu)
            .collect()
    };
    let mut model = WorkloadModel::new(f64::INFINITY, 4);
    model.observe(&a);
    assert_eq!((per_gpu(&model), model.version()), (vec![500], 1));
    // A new type before the interval is over: not published yet.
    model.observe(&b);
    assert_eq!((per_gpu(&model), model.version()), (vec![500], 1));
    model.observe(&a);
    model.observe(&a);
    model.observe(&b);
    // The fourth arrival since the first refresh: a counted 3 times, b twice.
    assert_eq!((per_gpu(&model), model.version()), (vec![500, 250], 2));

    // Only a's: every refresh finds the same distribution.
    let mut same = WorkloadModel::new(f64::INFINITY, 1);
    for _ in 0..5 {
        same.observe(&a);
    }
    assert_eq!((per_gpu(&same), same.version()), (vec![500], 1));
}

#[test]
fn total_variation_is_half_the_l1_distance_of_the_weights() {
    use super::fragmentation::total_variation;
    let (a, b, c) = (demand(1, 500, 0), demand(1, 250, 0), demand(2, 1000, 0));
    let w = |pairs: &[(&Demand, f64)]| {
        TargetWorkload::from_weights(pairs.iter().map(|(d, w)| ((*d).clone(), *w)))
    };
    let cases = [
        ("the same", w(&[(&a, 1.0)]), w(&[(&a, 1.0)]), 0.0),
        ("disjoint", w(&[(&a, 1.0)]), w(&[(&b, 1.0)]), 1.0),
        (
            "half moved",
            w(&[(&a, 1.0)]),
            w(&[(&a, 1.0), (&b, 1.0)]),
            0.5,
        ),
        // |0.5-0.25| + |0.5-0| + (c only) 0.75 = 1.5, halved.
        (
            "partly shared",
            w(&[(&a, 1.0), (&b, 1.0)]),
            w(&[(&a, 1.0), (&c, 3.0)]),
            0.75,
        ),
    ];
    for (name, x, y, want) in cases {
        assert!((total_variation(&x, &y) - want).abs() < 1e-12, "{name}");
        assert!(
            (total_variation(&y, &x) - want).abs() < 1e-12,
            "{name}, reversed"
        );
    }
}

/// The rescale keeps the history: at a half-life of 100 arrivals the counts
/// pass 1e200 after 66,439 arrivals and are divided down. 66,000 of one
/// type, then 445 of another: the first keeps 2^(-445/100) of the weight,
/// as without any rescale, instead of losing its history at the rescale.
#[test]
fn rescaling_the_workload_models_counts_keeps_their_ratios() {
    let (a, b) = (demand(1, 500, 1000), demand(1, 250, 1000));
    let mut model = WorkloadModel::new(100.0, 1);
    for i in 0..66_445 {
        model.observe(if i < 66_000 { &a } else { &b });
    }
    let weight = |per_gpu| {
        model
            .target()
            .types()
            .iter()
            .find(|t| t.demand.per_gpu == per_gpu)
            .map(|t| t.weight)
    };
    let old = 2f64.powf(-4.45);
    let got = weight(500).expect("the first type is still in the workload");
    assert!((got - old).abs() < 1e-3, "{got} against {old}");
    assert!((weight(250).unwrap() - (1.0 - old)).abs() < 1e-3);
}

/// A two-GPU type on three free GPUs: one copy fits, the third GPU is
/// stranded, in the fused measure as in the definition.
#[test]
fn a_multi_gpu_type_strands_the_gpus_left_over_from_its_copies() {
    let free = [1000, 1000, 1000];
    let models = [0, 0, 0];
    let v = view(64_000, &free, &models);
    let pair = demand(2, 1000, 1000);
    assert_eq!(task_stranding(&v, &pair), 1000);
    let target = TargetWorkload::from_weights([(pair, 1.0)]);
    let fused = measure_node(&v, &target);
    assert_eq!(fused.stranding, 1000.0);
    assert_eq!(fused.fragmentation, 0.0);
}

/// The target workload's weights are the same bits whatever order the
/// weights come in (a hash map's order changes from run to run): the total
/// is summed in the sorted order. 1e16 + 1 + 1 is 1e16 summed from the
/// large end and 1e16 + 2 from the small end.
#[test]
fn the_target_workload_does_not_depend_on_the_order_of_its_weights() {
    let weights = [
        (demand(1, 100, 1000), 1e16),
        (demand(1, 200, 1000), 1.0),
        (demand(2, 1000, 1000), 1.0),
    ];
    let bits = |order: [usize; 3]| -> Vec<(u64, u32, u64)> {
        TargetWorkload::from_weights(order.map(|i| weights[i].clone()))
            .types()
            .iter()
            .map(|t| (t.demand.per_gpu, t.demand.gpus, t.weight.to_bits()))
            .collect()
    };
    let first = bits([0, 1, 2]);
    for order in [[2, 1, 0], [1, 2, 0], [2, 0, 1]] {
        assert_eq!(bits(order), first, "order {order:?}");
    }
}

/// A node of one 100 GiB H200 per entry of `gpus`.
fn h200_node(gpus: usize) -> NodeSpec {
    node("n", 64, &vec![("H200", 100 * GIB); gpus])
}

/// `id` holding `budget` and `compute` on GPU `gpu` of [`h200_node`]'s node.
fn held_on(id: &str, gpu: u32, budget: u64, compute: u64) -> Placement {
    Placement {
        job_id: id.into(),
        node: "n".into(),
        gpu_indices: vec![gpu],
        gpu_budget: budget,
        gpu_compute: compute,
        cpu_milli: 0,
        memory_bytes: 0,
    }
}

#[test]
fn jobs_on_one_gpu_never_need_more_than_its_whole_compute() {
    // (case, compute of the first job, of the second, whether both fit the one GPU)
    let cases = [
        ("neither counted", 0, 0, true),
        ("400 and 600", 400, 600, true),
        ("600 and 600", 600, 600, false),
        ("all of it and one not counted", COMPUTE_WHOLE, 0, true),
        ("all of it and 1", COMPUTE_WHOLE, 1, false),
    ];
    for kind in PolicyKind::ALL {
        for (name, first, second, both) in cases {
            let mut p = placer(vec![h200_node(1)], kind);
            p.place(&job("a", 1, 10 * GIB).with_compute(first)).unwrap();
            let got = p
                .try_place(&job("b", 1, 10 * GIB).with_compute(second))
                .unwrap();
            assert_eq!(got.is_some(), both, "{kind}: {name}");
        }
    }
}

#[test]
fn a_job_goes_where_compute_is_left_even_when_another_gpu_fits_its_memory_tighter() {
    for kind in PolicyKind::ALL {
        let mut p = placer(vec![h200_node(2)], kind);
        p.restore(&held_on("busy", 0, 10 * GIB, COMPUTE_WHOLE))
            .unwrap();
        let d = p
            .place(&job("next", 1, 80 * GIB).with_compute(500))
            .unwrap();
        assert_eq!(d.placement.gpu_indices, vec![1], "{kind}");
        assert_eq!(d.placement.gpu_compute, 500, "{kind}");
    }
}

#[test]
fn inside_a_node_best_fit_takes_the_gpu_with_the_least_compute_left() {
    // Both GPUs have 90 GiB free; GPU 1 has 300 thousandths of compute
    // left, GPU 0 all of it. A job needing 200 fits both and takes GPU 1,
    // which keeps GPU 0 whole for a job that needs most of a GPU. (vramfit
    // sees that GPU 1's memory would then be of no use to more jobs like it.)
    let mut p = placer(vec![h200_node(2)], PolicyKind::BestFit);
    for (id, gpu, compute) in [("heavy", 1, 700), ("light", 0, 0)] {
        p.restore(&held_on(id, gpu, 10 * GIB, compute)).unwrap();
    }
    let d = p.place(&job("c", 1, 10 * GIB).with_compute(200)).unwrap();
    assert_eq!(d.placement.gpu_indices, vec![1]);
}

#[test]
fn compute_over_a_whole_gpu_or_without_gpus_makes_an_invalid_job() {
    let p = placer(vec![h200_node(1)], PolicyKind::BestFit);
    let cases = [
        (
            "over a GPU",
            job("x", 1, GIB).with_compute(COMPUTE_WHOLE + 1),
            Some("a GPU has 1000"),
        ),
        (
            "without GPUs",
            JobRequest::new("y", 0, 0, 1000, GIB).with_compute(100),
            Some("asks for 0 GPUs"),
        ),
        (
            "a whole GPU",
            job("z", 1, GIB).with_compute(COMPUTE_WHOLE),
            None,
        ),
    ];
    for (name, request, want) in cases {
        match (p.state().demand_of(&request), want) {
            (Ok(d), None) => assert_eq!(d.compute, request.gpu_compute, "{name}"),
            (Err(e), Some(want)) => assert!(e.to_string().contains(want), "{name}: {e}"),
            (got, want) => panic!("{name}: got {got:?}, wanted an error with {want:?}"),
        }
    }
}

#[test]
fn restore_refuses_compute_a_gpu_lacks_and_release_gives_it_back() {
    let mut p = placer(vec![h200_node(1)], PolicyKind::BestFit);
    let held = held_on("a", 0, GIB, 700);
    p.restore(&held).unwrap();
    assert_eq!(p.state().nodes()[0].gpu_compute_free, vec![300]);
    let over = Placement {
        job_id: "b".into(),
        gpu_compute: 400,
        ..held.clone()
    };
    let err = p.restore(&over).unwrap_err().to_string();
    assert!(
        err.contains("lacks 400 thousandths of its compute"),
        "{err}"
    );
    p.release("a");
    assert_eq!(p.state().nodes()[0].gpu_compute_free, vec![COMPUTE_WHOLE]);
    p.restore(&over).unwrap();
    assert_eq!(p.state().nodes()[0].gpu_compute_free, vec![600]);
}

#[test]
fn compute_limits_the_copies_a_gpu_has_room_for() {
    // GPU 0: 900 units and half its compute free; GPU 1: 300 units and all.
    let (free, compute, models) = ([900, 300], [500, COMPUTE_WHOLE], [0, 0]);
    let v = view_of(&free, &compute, &LARGE_CAPACITY, &models);
    let uncounted = demand(1, 300, 0);
    let light = Demand {
        compute: 200,
        ..demand(1, 300, 0)
    };
    let heavy = Demand {
        compute: 600,
        ..demand(1, 300, 0)
    };
    // Copies: memory alone 3 + 1; light 2 (compute) + 1; heavy 0 + 1.
    assert_eq!(task_stranding(&v, &uncounted), 0);
    assert_eq!(task_stranding(&v, &light), 300);
    assert_eq!(task_stranding(&v, &heavy), 900);
    // Heavy cannot use GPU 0 at all: its 900 units are fragmented.
    assert_eq!(task_fragmentation(&v, &light), 0);
    assert_eq!(task_fragmentation(&v, &heavy), 900);
    // The grouped pass agrees with the per-type measures.
    let target = TargetWorkload::from_demands([&uncounted, &light, &heavy]);
    let m = measure_node(&v, &target);
    assert_eq!(m.fragmentation, expected_fragmentation(&v, &target));
    assert_eq!(m.stranding, expected_stranding(&v, &target));
    assert!((m.stranding - 400.0).abs() < 1e-9, "{}", m.stranding);
}

#[test]
fn the_measure_memo_tells_states_apart_by_free_compute() {
    let mut memo = super::memo::MeasureMemo::default();
    let heavy = Demand {
        compute: 600,
        ..demand(1, 300, 0)
    };
    let target = TargetWorkload::from_demands([&heavy]);
    let (free, models) = ([900], [0]);
    let mut measured = Vec::new();
    for compute in [[COMPUTE_WHOLE], [500]] {
        let v = view_of(&free, &compute, &LARGE_CAPACITY, &models);
        measured
            .push(memo.get_or_compute(0, &v, &target, 1, |v, t| measure_node(v, t).fragmentation));
    }
    assert_eq!(measured, vec![0.0, 900.0]);
}

#[test]
fn a_job_waiting_for_compute_is_told_so_not_that_memory_is_short() {
    let mut p = placer(vec![h200_node(2)], PolicyKind::Vramfit);
    for (id, compute) in [("a", 700), ("b", 900)] {
        p.place(&job(id, 1, 10 * GIB).with_compute(compute))
            .unwrap();
    }
    let err = p
        .place(&job("c", 1, 10 * GIB).with_compute(500))
        .unwrap_err();
    assert!(matches!(err, PlaceError::NoRoomNow { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains(
            "needs 50.0 % of the compute of each of its 1 GPU(s); GPUs with room for its memory have at most 30.0 % left (n)"
        ),
        "{message}"
    );
    // Short of memory, it says memory.
    let err = p
        .place(&job("d", 1, 95 * GIB).with_compute(100))
        .unwrap_err();
    assert!(err.to_string().contains("largest free slot"), "{err}");
}

#[test]
fn a_gpu_whose_compute_is_taken_counts_as_full_in_the_measures() {
    let (free, capacity, models) = ([600, 600, 1000], [1000, 1000, 1000], [0, 0, 0]);
    let compute = [0, 500, COMPUTE_WHOLE];
    let v = view_of(&free, &compute, &capacity, &models);
    // GPU 0: no compute left, no room; GPU 1: half its compute, so half its
    // capacity although 600 units are free; GPU 2: all of it.
    assert_eq!(
        (v.gpu_room(0), v.gpu_room(1), v.gpu_room(2)),
        (0, 500, 1000)
    );
    assert_eq!(v.gpu_room_total(), 1500);
    let task = Demand {
        compute: 600,
        ..demand(1, 100, 0)
    };
    // Only GPU 2 serves it; GPU 1's 500 count as fragmented, GPU 0's
    // memory is nobody's to use and does not.
    assert_eq!(task_fragmentation(&v, &task), 500);
    // Copies: GPU 2 takes one (its compute), 100 of 1500 used.
    assert_eq!(task_stranding(&v, &task), 1400);
    let target = TargetWorkload::from_demands([&task]);
    let m = measure_node(&v, &target);
    assert_eq!((m.fragmentation, m.stranding), (500.0, 1400.0));
}

#[test]
fn vramfit_fills_a_gpus_compute_before_opening_another_gpu() {
    // Two jobs that each need half a GPU's compute: the second joins the
    // first, which keeps the other GPU whole for a job that needs all of
    // one, rather than leaving two half-used GPUs.
    for kind in [PolicyKind::Vramfit, PolicyKind::Fgd, PolicyKind::BestFit] {
        let mut p = placer(vec![h200_node(2)], kind);
        let first = p.place(&job("a", 1, 10 * GIB).with_compute(500)).unwrap();
        let second = p.place(&job("b", 1, 10 * GIB).with_compute(500)).unwrap();
        assert_eq!(
            first.placement.gpu_indices, second.placement.gpu_indices,
            "{kind}"
        );
    }
}

#[test]
fn the_view_after_a_placement_takes_the_units_and_compute_of_the_chosen_gpus() {
    let p = placer(vec![h200_node(3)], PolicyKind::BestFit);
    let node = &p.state().nodes()[0];
    let d = p
        .state()
        .demand_of(&job("x", 1, 10 * GIB).with_compute(300))
        .unwrap();
    let mut scratch = Vec::new();
    let after = node.view_after(&d, 1 << 2, &mut scratch);
    assert_eq!(after.gpu_free, [100 * GIB, 100 * GIB, 90 * GIB]);
    assert_eq!(after.gpu_compute_free, [COMPUTE_WHOLE, COMPUTE_WHOLE, 700]);
}

#[test]
fn a_placement_keeps_its_compute_through_json_and_leaves_out_a_zero() {
    let held = held_on("a", 0, GIB, 500);
    let json = serde_json::to_value(&held).unwrap();
    assert_eq!(json["gpu_compute"], 500);
    assert_eq!(serde_json::from_value::<Placement>(json).unwrap(), held);
    let plain = Placement {
        gpu_compute: 0,
        ..held
    };
    let json = serde_json::to_value(&plain).unwrap();
    assert!(json.get("gpu_compute").is_none(), "{json}");
    assert_eq!(serde_json::from_value::<Placement>(json).unwrap(), plain);
}
