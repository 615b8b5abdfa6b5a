//! Tests of the placement engine: ledger, messages, policies, measures and
//! the trace protocol.

use super::bench::{PackBenchOptions, arrival_order, parse_vm_hwm_bytes, run_pack_bench};
use super::fragmentation::{
    TargetWorkload, WorkloadModel, expected_fragmentation, expected_stranding, measure_node,
    task_fragmentation, task_stranding,
};
use super::openb::{parse_nodes, parse_pods, requested_milli_gpu};
use super::rng::SeededRng;
use super::state::{ClusterState, Demand, ModelMask, NodeView};
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

fn demand(gpus: u32, per_gpu: u64, cpu: u64) -> Demand {
    Demand {
        gpus,
        per_gpu,
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
