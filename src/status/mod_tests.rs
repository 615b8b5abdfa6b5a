use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::*;
use crate::fixtures::JobBuilder;

const GIB: u64 = 1 << 30;

fn now() -> Timestamp {
    "2026-12-01T08:00:00Z".parse().unwrap()
}

fn ttl() -> SignedDuration {
    SignedDuration::from_secs(120)
}

fn gpu_node(name: &str, heartbeat: &str, gpus: Value) -> GpuNode {
    GpuNode::test(name)
        .heartbeat(heartbeat)
        .gpus(gpus)
        .status_fields(json!({"agent": {"version": "0.1.0", "mode": "simulated"}}))
        .build()
}

fn h200(index: u32, used: u64) -> Value {
    json!({"index": index, "uuid": format!("GPU-{index}"), "model": "H200",
           "totalBytes": 140 * GIB, "usedBytes": used, "health": "Healthy"})
}

/// A pending job at attempt 1, 1e9 parameters, global batch 64 at 8:
/// `job("a").placed("n1", &[0], 20 * GIB).build()`.
fn job(name: &str) -> JobBuilder {
    TrainingJob::test(name)
        .created("2026-12-01T07:50:00Z")
        .batch(64, 8)
        .model(json!({"parameters": 1_000_000_000u64}))
        .template_spec(json!({"containers": []}))
        .status_fields(json!({"phase": "Pending", "attempt": 1}))
}

fn view(jobs: &[TrainingJob], nodes: &[GpuNode]) -> ClusterStatus {
    cluster_status(jobs, nodes, now(), ttl())
}

#[test]
fn committed_memory_is_the_sum_of_the_budgets_placed_on_each_gpu() {
    let nodes = [gpu_node(
        "n1",
        "2026-12-01T07:59:50Z",
        json!([h200(0, 0), h200(1, 0)]),
    )];
    let jobs = [
        job("a").placed("n1", &[0], 20 * GIB).build(),
        job("b").placed("n1", &[0], 30 * GIB).build(),
        job("c").placed("n1", &[1], 50 * GIB).build(),
        // Finished and earlier-attempt placements hold nothing.
        job("done")
            .placed("n1", &[1], 40 * GIB)
            .status_fields(json!({"phase": "Succeeded"}))
            .build(),
        job("old")
            .placed("n1", &[1], 40 * GIB)
            .status_fields(json!({"attempt": 2, "phase": "Retrying"}))
            .build(),
    ];
    let status = view(&jobs, &nodes);
    let gpus = &status.nodes[0].gpus;
    assert_eq!(gpus[0].committed_bytes, 50 * GIB);
    assert_eq!(gpus[0].free_bytes, 90 * GIB);
    assert_eq!(
        gpus[0]
            .jobs
            .iter()
            .map(|j| j.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(gpus[1].committed_bytes, 50 * GIB);
    assert_eq!(status.totals.committed_bytes, 100 * GIB);
    assert_eq!(status.totals.capacity_bytes, 280 * GIB);
    assert_eq!(status.phases.get("Succeeded"), Some(&1));
    // The job waiting for its second attempt is listed as waiting.
    assert_eq!(status.waiting.len(), 1);
    assert_eq!(status.waiting[0].name, "old");
}

#[test]
fn a_multi_gpu_job_commits_its_budget_on_each_of_its_gpus() {
    let nodes = [gpu_node(
        "n1",
        "2026-12-01T07:59:50Z",
        json!([h200(0, 0), h200(1, 0)]),
    )];
    let jobs = [job("ddp").placed("n1", &[0, 1], 60 * GIB).build()];
    let status = view(&jobs, &nodes);
    assert_eq!(status.nodes[0].gpus[0].committed_bytes, 60 * GIB);
    assert_eq!(status.nodes[0].gpus[1].committed_bytes, 60 * GIB);
    assert_eq!(status.nodes[0].gpus[1].jobs[0].gpu, 1);
}

#[test]
fn measured_is_what_the_agent_sees_the_pod_use_now_else_the_recorded_peak() {
    let mut gpu = h200(0, 25 * GIB);
    gpu["processes"] = json!([
        {"pid": 10, "usedBytes": 9 * GIB, "podNamespace": "ml", "podName": "a-1"},
        {"pid": 11, "usedBytes": 3 * GIB, "podNamespace": "ml", "podName": "a-1"},
        {"pid": 12, "usedBytes": 7 * GIB, "podNamespace": "other", "podName": "a-1"},
    ]);
    let nodes = [gpu_node("n1", "2026-12-01T07:59:50Z", json!([gpu]))];
    let jobs = [
        job("a")
            .placed("n1", &[0], 20 * GIB)
            .status_fields(json!({"podName": "a-1", "measuredPeakBytes": 15 * GIB}))
            .build(),
        job("b")
            .placed("n1", &[0], 20 * GIB)
            .status_fields(json!({"podName": "b-1", "measuredPeakBytes": 4 * GIB}))
            .build(),
        job("c").placed("n1", &[0], 20 * GIB).build(),
    ];
    let status = view(&jobs, &nodes);
    let on_gpu = &status.nodes[0].gpus[0];
    assert_eq!(on_gpu.measured_bytes, 25 * GIB);
    assert_eq!(on_gpu.jobs[0].measured_bytes, Some(12 * GIB));
    assert_eq!(on_gpu.jobs[1].measured_bytes, Some(4 * GIB));
    assert_eq!(on_gpu.jobs[2].measured_bytes, None);
}

#[test]
fn waiting_jobs_come_in_scheduling_order_with_their_reason() {
    let nodes = [gpu_node("n1", "2026-12-01T07:59:50Z", json!([h200(0, 0)]))];
    let reason = "no GPU has 150.0 GiB free (largest free: 140.0 GiB on n1 GPU 0)";
    let jobs = [
        job("young")
            .created("2026-12-01T07:59:00Z")
            .status_fields(json!({"budgetBytes": 150 * GIB, "message": reason}))
            .build(),
        job("old").created("2026-12-01T07:00:00Z").build(),
        job("urgent")
            .created("2026-12-01T07:59:30Z")
            .priority(10)
            .build(),
        job("failed")
            .status_fields(json!({"phase": "Failed"}))
            .build(),
    ];
    let status = view(&jobs, &nodes);
    let names: Vec<&str> = status.waiting.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["urgent", "old", "young"]);
    assert_eq!(status.waiting[2].reason, reason);
    assert_eq!(status.waiting[2].budget_bytes, Some(150 * GIB));
    assert_eq!(status.waiting[2].age_seconds, Some(60));
    assert_eq!(status.waiting[1].reason, "not predicted yet");
}

#[test]
fn stale_nodes_and_faulty_gpus_are_shown_but_not_counted_as_usable() {
    let mut faulty = h200(1, 0);
    faulty["health"] = json!("Faulty");
    let nodes = [
        gpu_node(
            "fresh",
            "2026-12-01T07:59:00Z",
            json!([h200(0, GIB), faulty]),
        ),
        gpu_node("stale", "2026-12-01T07:50:00Z", json!([h200(0, 0)])),
    ];
    let status = view(&[], &nodes);
    assert!(status.nodes[0].fresh);
    assert_eq!(status.nodes[0].heartbeat_age_seconds, Some(60));
    assert!(!status.nodes[1].fresh);
    assert_eq!(status.totals.gpus, 1);
    assert_eq!(status.totals.capacity_bytes, 140 * GIB);
    assert_eq!(status.totals.measured_bytes, GIB);
    let text = text::render(&status, false);
    assert!(text.contains("NODE stale  heartbeat 10m ago, simulated  STALE"));
    assert!(text.contains("Faulty"));
}

#[test]
fn a_job_on_a_gpu_no_node_reports_is_listed_apart() {
    let nodes = [gpu_node("n1", "2026-12-01T07:59:50Z", json!([h200(0, 0)]))];
    let jobs = [
        job("lost").placed("gone", &[0], 20 * GIB).build(),
        job("nogpu").placed("n1", &[3], 20 * GIB).build(),
    ];
    let status = view(&jobs, &nodes);
    assert_eq!(status.orphans.len(), 2);
    assert_eq!(status.nodes[0].gpus[0].committed_bytes, 0);
    assert!(text::render(&status, false).contains("UNSEEN GPUS (2)"));
}

#[test]
fn recent_retries_show_each_oom_with_the_shape_that_followed_newest_first() {
    let mut gpu = h200(0, 0);
    gpu["processes"] = json!([{"pid": 10, "usedBytes": GIB, "podNamespace": "ml", "podName": "b-1",
        "shape": {"microBatch": 4, "gradAccum": 16, "absorbedOoms": [
            {"fromMicro": 16, "toMicro": 8, "fromAccum": 4, "toAccum": 8, "time": "2026-12-01T07:58:00Z"},
            {"fromMicro": 8, "toMicro": 4, "fromAccum": 8, "toAccum": 16, "time": "2026-12-01T07:59:00Z"}]}}]);
    let nodes = [gpu_node("n1", "2026-12-01T07:59:50Z", json!([gpu]))];
    let jobs = [
        job("a")
            .status_fields(json!({"phase": "Running", "attempt": 3, "microBatch": 2, "gradAccum": 32,
                "history": [
                    {"attempt": 1, "microBatch": 8, "gradAccum": 8, "outcome": "OutOfMemory", "message": "CUDA out of memory"},
                    {"attempt": 2, "microBatch": 4, "gradAccum": 16, "outcome": "OutOfMemory"}]}))
            .build(),
        job("b")
            .placed("n1", &[0], 20 * GIB)
            .status_fields(json!({"podName": "b-1", "history": [
                {"attempt": 1, "microBatch": 8, "gradAccum": 8, "outcome": "Failed"}]}))
            .build(),
    ];
    let status = view(&jobs, &nodes);
    let seen: Vec<(String, u32, String, Option<String>)> = status
        .retries
        .iter()
        .map(|r| (r.name.clone(), r.attempt, r.from.clone(), r.to.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            ("b".into(), 1, "8x8".into(), Some("4x16".into())),
            ("b".into(), 1, "16x4".into(), Some("8x8".into())),
            ("a".into(), 2, "4x16".into(), Some("2x32".into())),
            ("a".into(), 1, "8x8".into(), Some("4x16".into())),
        ]
    );
    assert_eq!(status.retries[0].kind, "in-process");
    assert_eq!(
        status.retries[3].message.as_deref(),
        Some("CUDA out of memory")
    );
}

#[test]
fn only_the_most_recent_retries_are_kept() {
    let history: Vec<Value> = (1..=15)
        .map(|a| json!({"attempt": a, "microBatch": 1, "gradAccum": 1, "outcome": "OutOfMemory"}))
        .collect();
    let jobs = [job("a")
        .status_fields(json!({"attempt": 16, "history": history}))
        .build()];
    let status = view(&jobs, &[]);
    assert_eq!(status.retries.len(), RECENT_RETRIES);
    assert_eq!(status.retries[0].attempt, 15);
}

#[test]
fn a_nodes_allocation_sums_its_gpus_and_counts_free_memory_on_usable_gpus_only() {
    let mut faulty = h200(2, 0);
    faulty["health"] = json!("Faulty");
    let nodes = [
        gpu_node(
            "n1",
            "2026-12-01T07:59:50Z",
            json!([h200(0, 10 * GIB), h200(1, 5 * GIB), faulty]),
        ),
        gpu_node("stale", "2026-12-01T07:00:00Z", json!([h200(0, 0)])),
    ];
    let jobs = [
        job("ddp").placed("n1", &[0, 1], 40 * GIB).build(),
        job("one").placed("n1", &[0], 20 * GIB).build(),
    ];
    let status = view(&jobs, &nodes);
    let allocation = node_allocation(&status.nodes[0]);
    assert_eq!(allocation.committed_bytes, 100 * GIB);
    assert_eq!(allocation.committed, "100.0 GiB");
    // 140 - 60 on GPU 0, 140 - 40 on GPU 1, nothing on the faulty GPU 2.
    assert_eq!(allocation.free_bytes, 180 * GIB);
    assert_eq!(allocation.gpu_free, "0:80.0GiB 1:100.0GiB 2:-");
    assert_eq!(allocation.used, "15.0 GiB");
    assert_eq!(allocation.jobs, 2);
    let stale = node_allocation(&status.nodes[1]);
    assert_eq!((stale.free_bytes, stale.gpu_free.as_str()), (0, "0:-"));
}

#[test]
fn bars_fill_in_proportion_and_mark_overcommitment() {
    assert_eq!(text::bar(0, 100), format!("[{}]", ".".repeat(30)));
    assert_eq!(
        text::bar(50, 100),
        format!("[{}{}]", "#".repeat(15), ".".repeat(15))
    );
    assert_eq!(text::bar(150, 100), format!("[{}!]", "#".repeat(29)));
    assert_eq!(text::bar(5, 0), format!("[{}]", ".".repeat(30)));
}

#[test]
fn text_has_colour_only_when_asked() {
    let nodes = [gpu_node("n1", "2026-12-01T07:59:50Z", json!([h200(0, 0)]))];
    let jobs = [job("a")
        .placed("n1", &[0], 70 * GIB)
        .status_fields(json!({"microBatch": 8, "gradAccum": 8}))
        .build()];
    let status = view(&jobs, &nodes);
    let plain = text::render(&status, false);
    assert!(!plain.contains('\x1b'));
    assert!(
        plain.contains("committed [###############...............]   70.0 GiB  50%  free 70.0 GiB")
    );
    assert!(plain.contains("ml/a  70.0 GiB  -         8x8          1        Running"));
    let coloured = text::render(&status, true);
    assert!(coloured.contains("\x1b[32m[###############"));
}

#[test]
fn the_page_escapes_what_users_wrote_and_reloads_itself() {
    let jobs = [job("a")
        .status_fields(json!({"message": "<script>alert(1)</script>"}))
        .build()];
    let page = html::render(&view(&jobs, &[]), 5);
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!page.contains("<script>"));
    assert!(page.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
}

#[test]
fn the_page_draws_committed_and_measured_bars_per_gpu() {
    let nodes = [gpu_node(
        "n1",
        "2026-12-01T07:59:50Z",
        json!([h200(0, 35 * GIB)]),
    )];
    let jobs = [job("a").placed("n1", &[0], 70 * GIB).build()];
    let page = html::render(&view(&jobs, &nodes), 5);
    assert!(page.contains("id=\"gpu-n1-0\""));
    assert!(page.contains("<div class=\"committed\" style=\"width:50.0%\">"));
    assert!(page.contains("<div class=\"measured\" style=\"width:25.0%\">"));
    assert!(page.contains("data-job=\"ml/a\""));
}

#[test]
fn json_names_fields_in_camel_case() {
    let nodes = [gpu_node("n1", "2026-12-01T07:59:50Z", json!([h200(0, 0)]))];
    let value = serde_json::to_value(view(&[], &nodes)).unwrap();
    assert_eq!(
        value["nodes"][0]["gpus"][0]["capacityBytes"],
        json!(140 * GIB)
    );
    assert_eq!(value["totals"]["gpus"], json!(1));
}
