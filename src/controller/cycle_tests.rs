use super::*;
use crate::place::{GpuSpec, Inventory, NodeSpec, Placement};

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
    let refs: Vec<&TrainingJob> = jobs.iter().collect();
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
        job_id: "ml/j".into(),
        node: "a".into(),
        gpu_indices: gpus,
        gpu_budget: budget,
        cpu_milli: 0,
        memory_bytes: 0,
    };
    let ledger = [placement(vec![0, 1], 10 * GIB), placement(vec![0], 3 * GIB)];
    let metrics = Metrics::default();
    update_gauges(&metrics, &refs, &view, &ledger);
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
    update_gauges(&metrics, &refs[..1], &ClusterView::default(), &[]);
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
