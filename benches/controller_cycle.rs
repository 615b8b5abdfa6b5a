//! The controller's scheduling cycle in one process, without an API server:
//! N GpuNodes and Nodes, M predicted TrainingJobs and their pods built in
//! memory as the watch caches hold them, then the cycle the controller runs
//! (`vramfit::controller::run_cycle`, with the state it keeps from one cycle
//! to the next) and the allocation writer's computation
//! (`allocation::wanted`), timed.
//!
//! ```sh
//! cargo bench --bench controller_cycle -- --nodes 5000 --gpus 8 --jobs 50000
//! ```
//!
//! Prints one JSON object (see `Report`). The job mix is like the one of
//! `controller_scale` (8-40 GiB per GPU, 10% on 2 or 4 GPUs).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use serde_json::json;
use vramfit::api::{GpuNode, Phase, TrainingJob};
use vramfit::controller::allocation;
use vramfit::controller::pod::training_pod;
use vramfit::controller::scheduler::Assignments;
use vramfit::controller::{CycleOutcome, CycleState, run_cycle};
use vramfit::job::backoff::BatchShape;
use vramfit::place::PolicyKind;
use vramfit::place::bench::parse_vm_hwm_bytes;

const GIB: u64 = 1 << 30;

#[derive(Parser, Debug)]
#[command(about = "vramfit scheduling-cycle benchmark (in process)")]
struct Args {
    /// GPU nodes.
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// TrainingJobs.
    #[arg(long, default_value_t = 2000)]
    jobs: usize,
    /// Memory of every GPU, GiB.
    #[arg(long, default_value_t = 80)]
    gpu_gib: u64,
    /// Steady-state cycles to time (the mean and the largest are reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The result. Field names are fixed; new fields may be added.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Report {
    nodes: usize,
    gpus: usize,
    jobs: usize,
    /// Process memory (VmRSS) before building anything, and with the nodes,
    /// jobs and pods built (what the controller's watch caches hold, without
    /// `managedFields`).
    rss_bytes_empty: u64,
    rss_bytes_with_caches: u64,
    /// Bytes of those caches per job (nodes included).
    cache_bytes_per_job: u64,
    /// The first cycle after all jobs were predicted: every job waits.
    burst_cycle_seconds: f64,
    burst_placed: usize,
    burst_waiting: usize,
    /// The first cycle once every placement is recorded in status and every
    /// pod is cached: every job and pod changed since the last cycle.
    catch_up_cycle_seconds: f64,
    /// A cycle once every placement is recorded in status and nothing waits
    /// (the cycle a heartbeat or a new job triggers), mean and largest.
    steady_cycle_seconds_mean: f64,
    steady_cycle_seconds_max: f64,
    /// A cycle like those, where a tenth of the GpuNodes carry a new
    /// heartbeat (a new object each, nothing else changed).
    heartbeat_cycle_seconds: f64,
    /// A cycle with 1% new jobs waiting on the full cluster.
    one_percent_new_cycle_seconds: f64,
    /// The next cycle, with another 1% new jobs.
    second_one_percent_new_cycle_seconds: f64,
    /// The allocation writer's computation for every node.
    allocation_seconds: f64,
    peak_rss_bytes: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rss_bytes_empty = rss();
    let now = Timestamp::now();
    let ttl = SignedDuration::from_secs(120);

    let gpu_nodes: Vec<Arc<GpuNode>> = (0..args.nodes)
        .map(|i| gpu_node(&format!("n{i:05}"), args.gpus, args.gpu_gib * GIB, now))
        .map(|r| r.map(Arc::new))
        .collect::<Result<_>>()?;
    let nodes: Vec<Arc<Node>> = (0..args.nodes)
        .map(|i| node(&format!("n{i:05}")))
        .map(|r| r.map(Arc::new))
        .collect::<Result<_>>()?;
    let mut jobs: Vec<Arc<TrainingJob>> = job_specs(args.jobs, 42)
        .into_iter()
        .enumerate()
        .map(|(i, (gpus, request))| predicted_job(i, gpus, request))
        .map(|r| r.map(Arc::new))
        .collect::<Result<_>>()?;

    // The burst: every job predicted and waiting.
    let assignments = Assignments::default();
    let mut state = CycleState::default();
    let (burst_seconds, burst_placed, burst_waiting) = {
        let started = Instant::now();
        let outcome = cycle(
            &mut state,
            &assignments,
            &jobs,
            &[],
            &gpu_nodes,
            &nodes,
            now,
            ttl,
        );
        let seconds = started.elapsed().as_secs_f64();
        let placed = outcome.changed.len();
        (seconds, placed, outcome.waiting - placed)
    };

    // The reconciles record the placements in status and create the pods.
    let mut pods: Vec<Arc<Pod>> = Vec::new();
    for job in &mut jobs {
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let Some(placement) = assignments.placement(&uid, 1) else {
            continue;
        };
        let shape = BatchShape { micro: 8, accum: 1 };
        let pod = training_pod(job, &placement, shape, 1).map_err(anyhow::Error::msg)?;
        let mut pod = pod;
        pod.metadata.managed_fields = None;
        pods.push(Arc::new(pod));
        let job = Arc::make_mut(job);
        let status = job.status.get_or_insert_default();
        status.phase = Phase::Placed;
        status.placement = Some(placement);
        assignments.forget(&uid);
    }
    let rss_bytes_with_caches = rss();

    // The first cycle after every status changed, then the steady ones.
    let mut unchanged_cycle = || {
        steady_cycle_seconds(
            &mut state,
            &assignments,
            &jobs,
            &pods,
            &gpu_nodes,
            &nodes,
            now,
            ttl,
        )
    };
    let catch_up_cycle_seconds = unchanged_cycle();
    let steady: Vec<f64> = (0..args.repeat.max(1)).map(|_| unchanged_cycle()).collect();

    // A tenth of the agents report.
    let later = now.checked_add(SignedDuration::from_secs(1))?.to_string();
    let mut beating = gpu_nodes.clone();
    for node in beating.iter_mut().step_by(10) {
        if let Some(status) = Arc::make_mut(node).status.as_mut() {
            status.heartbeat = Some(later.clone());
        }
    }
    let heartbeat_cycle_seconds = steady_cycle_seconds(
        &mut state,
        &assignments,
        &jobs,
        &pods,
        &beating,
        &nodes,
        now,
        ttl,
    );

    // 1% more jobs arrive, twice.
    let mut with_new = jobs.clone();
    let mut one_percent = Vec::new();
    for (round, seed) in [7, 8].into_iter().enumerate() {
        let first = args.jobs + round * (args.jobs / 100);
        let extra: Vec<Arc<TrainingJob>> = job_specs(args.jobs / 100, seed)
            .into_iter()
            .enumerate()
            .map(|(i, (gpus, request))| predicted_job(first + i, gpus, request))
            .map(|r| r.map(Arc::new))
            .collect::<Result<_>>()?;
        with_new.extend(extra);
        let started = Instant::now();
        let _ = cycle(
            &mut state,
            &assignments,
            &with_new,
            &pods,
            &gpu_nodes,
            &nodes,
            now,
            ttl,
        );
        one_percent.push(started.elapsed().as_secs_f64());
    }

    let started = Instant::now();
    let wanted = allocation::wanted(&jobs, &gpu_nodes, now, ttl);
    let allocation_seconds = started.elapsed().as_secs_f64();
    assert_eq!(wanted.len(), args.nodes);

    let report = Report {
        nodes: args.nodes,
        gpus: args.nodes * args.gpus,
        jobs: args.jobs,
        rss_bytes_empty,
        rss_bytes_with_caches,
        cache_bytes_per_job: rss_bytes_with_caches.saturating_sub(rss_bytes_empty)
            / args.jobs.max(1) as u64,
        burst_cycle_seconds: round(burst_seconds),
        burst_placed,
        burst_waiting,
        catch_up_cycle_seconds: round(catch_up_cycle_seconds),
        steady_cycle_seconds_mean: round(steady.iter().sum::<f64>() / steady.len() as f64),
        steady_cycle_seconds_max: round(steady.iter().copied().fold(0.0, f64::max)),
        heartbeat_cycle_seconds: round(heartbeat_cycle_seconds),
        one_percent_new_cycle_seconds: round(one_percent[0]),
        second_one_percent_new_cycle_seconds: round(one_percent[1]),
        allocation_seconds: round(allocation_seconds),
        peak_rss_bytes: parse_vm_hwm_bytes(&std::fs::read_to_string("/proc/self/status")?)
            .unwrap_or(0),
    };
    drop(pods);
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Seconds of one cycle of the steady state, in which nothing waits.
#[allow(clippy::too_many_arguments)]
fn steady_cycle_seconds(
    state: &mut CycleState,
    assignments: &Assignments,
    jobs: &[Arc<TrainingJob>],
    pods: &[Arc<Pod>],
    gpu_nodes: &[Arc<GpuNode>],
    nodes: &[Arc<Node>],
    now: Timestamp,
    ttl: SignedDuration,
) -> f64 {
    let started = Instant::now();
    let outcome = cycle(state, assignments, jobs, pods, gpu_nodes, nodes, now, ttl);
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(outcome.waiting, 0, "nothing waits in the steady state");
    seconds
}

#[allow(clippy::too_many_arguments)]
fn cycle<'a>(
    state: &mut CycleState,
    assignments: &Assignments,
    jobs: &'a [Arc<TrainingJob>],
    pods: &[Arc<Pod>],
    gpu_nodes: &[Arc<GpuNode>],
    nodes: &[Arc<Node>],
    now: Timestamp,
    ttl: SignedDuration,
) -> CycleOutcome<'a> {
    run_cycle(
        state,
        assignments,
        jobs,
        pods,
        gpu_nodes,
        nodes,
        now,
        ttl,
        PolicyKind::Vramfit,
    )
}

fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

fn round(seconds: f64) -> f64 {
    (seconds * 1e5).round() / 1e5
}

fn gpu_node(name: &str, gpus: usize, bytes: u64, now: Timestamp) -> Result<GpuNode> {
    let node = (0..gpus).fold(
        GpuNode::test(name)
            .label("vramfit.dev/pool", "bench")
            .gpus(json!([])),
        |node, i| {
            node.gpu("H100-80GB", bytes)
                .uuid(&format!("GPU-{name}-{i}"))
                .used(0)
                .health("Healthy")
        },
    );
    Ok(node
        .status_fields(
            json!({"gpuCount": gpus, "model": "H100-80GB", "heartbeat": now.to_string()}),
        )
        .build())
}

fn node(name: &str) -> Result<Node> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"vramfit.dev/pool": "bench"}},
        "spec": {},
        "status": {"allocatable": {"cpu": "224", "memory": "2Ti", "pods": "250"}}
    }))?)
}

/// A job as the controller's cache holds it after the prediction: phase
/// Pending with its budget.
fn predicted_job(i: usize, gpus: u32, request_gib: u64) -> Result<TrainingJob> {
    Ok(TrainingJob::test(&format!("job-{i:05}"))
        .namespace("bench")
        .uid(&format!("00000000-0000-0000-0000-{i:012}"))
        .meta("generation", serde_json::Value::Null)
        .created("2026-12-01T12:00:00Z")
        .meta("finalizers", json!(["vramfit.dev/release-placement"]))
        .gpus(gpus)
        .batch(64, 8)
        .model(json!({"mlp": {"layers": 8, "hidden": 4096}, "precision": "fp32", "optimizer": "adamw"}))
        .request(&format!("{request_gib}Gi"))
        .template_spec(json!({"containers": [{"name": "train", "image": "trainer",
            "resources": {"requests": {"cpu": "4", "memory": "32Gi"}}}]}))
        .status_fields(json!({"phase": "Pending", "attempt": 1, "budgetBytes": request_gib * GIB,
                              "microBatch": 8, "gradAccum": 1}))
        .build())
}

/// (GPUs, `memory.request` GiB) per job: the mix of `controller_scale`
/// (8-40 GiB, 10% on 2 or 4 GPUs), from its own stream.
fn job_specs(jobs: usize, seed: u64) -> Vec<(u32, u64)> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut unit = move || (next() >> 11) as f64 / (1u64 << 53) as f64;
    (0..jobs)
        .map(|_| {
            let gpus = if unit() < 0.1 {
                if unit() < 0.7 { 2 } else { 4 }
            } else {
                1
            };
            let request = 8 + (unit() * 33.0) as u64;
            (gpus, request)
        })
        .collect()
}
