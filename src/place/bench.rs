//! Packing benchmarks: the openb trace protocol of the FGD paper, a seed
//! sweep over it, and a synthetic scale run.
//!
//! Protocol (see `traces/openb/README.md`):
//! 1. Inflate: append pods drawn uniformly with replacement from the list
//!    (seeded) until the next one would push the total requested GPU
//!    (`num_gpu * gpu_milli`) over `tune` x the cluster's capacity; that pod
//!    is not added and drawing stops.
//! 2. Shuffle (same seeded stream) and schedule one by one; nothing leaves; a
//!    pod that fits nowhere fails and the run goes on.
//! 3. Allocation % = allocated milli-GPU / capacity, taken right after the
//!    first pod whose arrival brings the submitted GPU requests to 100% of
//!    capacity, and after the last pod (`tune` x 100%, short of it by less
//!    than one pod).
//!
//! The random stream is this crate's own ([`SeededRng`]), so results match
//! the paper's simulator in distribution, not pod for pod.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::fragmentation::TargetWorkload;
use super::inventory::{GpuSpec, Inventory, JobRequest, NodeSpec};
use super::openb::{self, requested_milli_gpu};
use super::policy::{Policy, PolicyKind};
use super::rng::SeededRng;
use super::{PlaceError, Placer, Result};

/// Options of one openb packing run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PackBenchOptions {
    /// Submitted GPU requests as a multiple of capacity (the paper uses 1.3).
    pub tune: f64,
    /// Seed of inflation, shuffle and the policy's random choices.
    pub seed: u64,
    /// Policy under test.
    pub policy: PolicyKind,
}

impl Default for PackBenchOptions {
    fn default() -> Self {
        Self {
            tune: 1.3,
            seed: 42,
            policy: PolicyKind::Vramfit,
        }
    }
}

/// Outcome of one openb packing run; serializes to the shape `vramfit bench
/// pack -o json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PackReport {
    /// Allocation % keyed by arrived % (`"100"`, and `tune` x 100, e.g. `"130"`).
    pub allocation_percent_at: BTreeMap<String, f64>,
    /// GPUs with no allocation at all at the end.
    pub unallocated_gpus: usize,
    /// Scheduling decisions (placed or failed) per second of scheduling time,
    /// single-threaded; parsing and inflation are not timed.
    pub placements_per_second: f64,
    /// Pods submitted after inflation.
    pub pods: usize,
    /// Pods that fit nowhere.
    pub failed_pods: usize,
    /// Policy name.
    pub policy: String,
    /// Seed used.
    pub seed: u64,
    /// GPUs in the cluster.
    pub total_gpus: usize,
}

/// Runs the openb protocol on trace text.
pub fn run_pack_bench(
    nodes_csv: &str,
    pods_csv: &str,
    opts: &PackBenchOptions,
) -> Result<PackReport> {
    let inventory = openb::parse_nodes(nodes_csv)?;
    let pods = openb::parse_pods(pods_csv)?;
    run_pack(&inventory, &pods, opts)
}

/// Runs the openb protocol on parsed data.
pub fn run_pack(
    inventory: &Inventory,
    pods: &[JobRequest],
    opts: &PackBenchOptions,
) -> Result<PackReport> {
    if !(opts.tune.is_finite() && opts.tune > 0.0) {
        return Err(PlaceError::BenchOptions(format!(
            "tune must be a positive number, got {}",
            opts.tune
        )));
    }
    let capacity: u64 = inventory
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .map(|g| g.capacity)
        .sum();
    let order = arrival_order(pods, capacity, opts.tune, opts.seed);
    let arrivals: Vec<JobRequest> = order
        .iter()
        .enumerate()
        .map(|(k, &i)| JobRequest {
            id: format!("{}#{k}", pods[i].id),
            ..pods[i].clone()
        })
        .collect();

    let mut policy = Policy::new(opts.policy, opts.seed ^ 0x5EED_0FF6);
    if opts.policy == PolicyKind::Fgd {
        // FGD is given the trace's task distribution, as in the paper; the
        // vramfit policy learns it from arrivals instead.
        let state = super::ClusterState::new(inventory)?;
        let demands = pods
            .iter()
            .map(|p| state.demand_of(p))
            .collect::<Result<Vec<_>>>()?;
        policy = policy.with_target_workload(TargetWorkload::from_demands(&demands));
    }
    let mut placer = Placer::new(inventory, policy)?;

    let mut allocation_percent_at = BTreeMap::new();
    let mut arrived = 0u64;
    let mut failed = 0usize;
    let percent =
        |placer: &Placer| 100.0 * placer.state().allocated_total() as f64 / capacity as f64;
    let started = Instant::now();
    for job in &arrivals {
        arrived += requested_milli_gpu(job);
        match placer.place(job) {
            Ok(_) => {}
            Err(PlaceError::NoRoomNow { .. } | PlaceError::NeverFits { .. }) => failed += 1,
            Err(other) => return Err(other),
        }
        if arrived >= capacity && !allocation_percent_at.contains_key("100") {
            allocation_percent_at.insert("100".to_string(), percent(&placer));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    allocation_percent_at.insert(format!("{:.0}", opts.tune * 100.0), percent(&placer));
    Ok(PackReport {
        allocation_percent_at,
        unallocated_gpus: placer.state().untouched_gpus(),
        placements_per_second: arrivals.len() as f64 / seconds.max(1e-9),
        pods: arrivals.len(),
        failed_pods: failed,
        policy: opts.policy.to_string(),
        seed: opts.seed,
        total_gpus: inventory.nodes.iter().map(|n| n.gpus.len()).sum(),
    })
}

/// Inflation and shuffle of the protocol: indices into `pods` in arrival order.
pub fn arrival_order(pods: &[JobRequest], capacity: u64, tune: f64, seed: u64) -> Vec<usize> {
    let limit = (tune * capacity as f64).floor() as u64;
    let mut order: Vec<usize> = (0..pods.len()).collect();
    let mut total: u64 = pods.iter().map(requested_milli_gpu).sum();
    let mut rng = SeededRng::new(seed);
    if !pods.is_empty() {
        loop {
            let i = rng.below(pods.len() as u64) as usize;
            let next = total + requested_milli_gpu(&pods[i]);
            if next > limit {
                break;
            }
            total = next;
            order.push(i);
        }
    }
    rng.shuffle(&mut order);
    order
}

/// Mean and per-seed results of runs over several seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SeedSweepReport {
    /// Mean allocation % per arrived point over the seeds.
    pub allocation_percent_at: BTreeMap<String, f64>,
    /// Mean count of GPUs left without any allocation.
    pub unallocated_gpus: f64,
    /// Mean placements per second.
    pub placements_per_second: f64,
    /// Mean pods submitted.
    pub pods: f64,
    /// Mean pods that failed.
    pub failed_pods: f64,
    /// Policy name.
    pub policy: String,
    /// The seeds, in order.
    pub seeds: Vec<u64>,
    /// One report per seed.
    pub per_seed: Vec<PackReport>,
}

/// Runs the protocol once per seed (e.g. 42..=51, as the paper quotes).
pub fn run_pack_bench_seeds(
    nodes_csv: &str,
    pods_csv: &str,
    opts: &PackBenchOptions,
    seeds: impl IntoIterator<Item = u64>,
) -> Result<SeedSweepReport> {
    let inventory = openb::parse_nodes(nodes_csv)?;
    let pods = openb::parse_pods(pods_csv)?;
    let per_seed = seeds
        .into_iter()
        .map(|seed| run_pack(&inventory, &pods, &PackBenchOptions { seed, ..*opts }))
        .collect::<Result<Vec<_>>>()?;
    if per_seed.is_empty() {
        return Err(PlaceError::BenchOptions("no seeds to run".into()));
    }
    let n = per_seed.len() as f64;
    let mean = |f: &dyn Fn(&PackReport) -> f64| per_seed.iter().map(f).sum::<f64>() / n;
    let mut allocation_percent_at = BTreeMap::new();
    for key in per_seed[0].allocation_percent_at.keys() {
        let values: Vec<f64> = per_seed
            .iter()
            .filter_map(|r| r.allocation_percent_at.get(key).copied())
            .collect();
        allocation_percent_at.insert(
            key.clone(),
            values.iter().sum::<f64>() / values.len() as f64,
        );
    }
    Ok(SeedSweepReport {
        allocation_percent_at,
        unallocated_gpus: mean(&|r| r.unallocated_gpus as f64),
        placements_per_second: mean(&|r| r.placements_per_second),
        pods: mean(&|r| r.pods as f64),
        failed_pods: mean(&|r| r.failed_pods as f64),
        policy: opts.policy.to_string(),
        seeds: per_seed.iter().map(|r| r.seed).collect(),
        per_seed,
    })
}

/// Options of the synthetic scale run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleOptions {
    /// Nodes in the synthetic cluster.
    pub nodes: usize,
    /// GPUs per node (capacity 1000 units each).
    pub gpus_per_node: usize,
    /// Jobs to place one after the other.
    pub jobs: usize,
    /// Seed of the job mix and the policy.
    pub seed: u64,
    /// Policy under test.
    pub policy: PolicyKind,
}

/// Outcome of a synthetic scale run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleReport {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// GPUs in the cluster.
    pub gpus: usize,
    /// Jobs submitted.
    pub jobs: usize,
    /// Jobs that fit nowhere.
    pub failed_jobs: usize,
    /// Allocated GPU units over capacity at the end, in %.
    pub allocation_percent: f64,
    /// Wall-clock seconds spent placing.
    pub seconds: f64,
    /// Decisions per second, single-threaded.
    pub placements_per_second: f64,
    /// Peak resident memory of the process in bytes, when the caller could
    /// read it (see [`parse_vm_hwm_bytes`]).
    pub peak_rss_bytes: Option<u64>,
    /// Policy name.
    pub policy: String,
}

/// Places `jobs` synthetic jobs, drawn from an openb-like mix (shares of one
/// GPU, whole GPUs, 2/4/8-GPU jobs, CPU-only jobs), on identical nodes.
pub fn run_scale_bench(opts: &ScaleOptions) -> Result<ScaleReport> {
    if opts.nodes == 0 || opts.gpus_per_node == 0 {
        return Err(PlaceError::BenchOptions(
            "nodes and GPUs per node must be positive".into(),
        ));
    }
    let gpn = opts.gpus_per_node as u64;
    let inventory = Inventory {
        nodes: (0..opts.nodes)
            .map(|i| NodeSpec {
                name: format!("node-{i}"),
                cpu_milli: 12_000 * gpn,
                memory_bytes: (96u64 << 30) * gpn,
                taints: Vec::new(),
                gpus: (0..gpn)
                    .map(|_| GpuSpec {
                        model: "G".into(),
                        capacity: 1000,
                    })
                    .collect(),
            })
            .collect(),
    };
    let mut rng = SeededRng::new(opts.seed);
    let jobs: Vec<JobRequest> = (0..opts.jobs)
        .map(|k| synthetic_job(k, gpn, &mut rng))
        .collect();
    let mut placer = Placer::new(&inventory, Policy::new(opts.policy, opts.seed ^ 0x5EED))?;
    let mut failed = 0;
    let started = Instant::now();
    for job in &jobs {
        if placer.place(job).is_err() {
            failed += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let state = placer.state();
    Ok(ScaleReport {
        nodes: opts.nodes,
        gpus: opts.nodes * opts.gpus_per_node,
        jobs: jobs.len(),
        failed_jobs: failed,
        allocation_percent: 100.0 * state.allocated_total() as f64 / state.capacity_total() as f64,
        seconds,
        placements_per_second: jobs.len() as f64 / seconds.max(1e-9),
        peak_rss_bytes: None,
        policy: opts.policy.to_string(),
    })
}

fn synthetic_job(k: usize, gpus_per_node: u64, rng: &mut SeededRng) -> JobRequest {
    const SHARES: [u64; 6] = [100, 250, 300, 460, 500, 700];
    let (gpus, budget) = match rng.below(100) {
        0..=9 => (0, 0),
        10..=49 => (1, SHARES[rng.below(SHARES.len() as u64) as usize]),
        50..=91 => (1, 1000),
        92..=95 => (2.min(gpus_per_node as u32), 1000),
        96..=98 => (4.min(gpus_per_node as u32), 1000),
        _ => (gpus_per_node as u32, 1000),
    };
    let cpu = 2000 * (1 + rng.below(6));
    let mem = (8u64 << 30) * (1 + rng.below(4));
    JobRequest::new(
        format!("job-{k}"),
        gpus,
        budget,
        cpu * u64::from(gpus.max(1)),
        mem * u64::from(gpus.max(1)),
    )
}

/// Peak resident set size from the text of `/proc/self/status` (`VmHWM`).
pub fn parse_vm_hwm_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
