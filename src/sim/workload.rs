//! The jobs of a simulated cluster, drawn from an openb pod list with a seed.
//!
//! 1. Which pods, and how many: the openb protocol's inflation and shuffle
//!    (`place::bench::arrival_order`, `tune` x the cluster's GPU capacity),
//!    keeping the pods that ask for a GPU (CPU-only pods are left out).
//! 2. What each trains: a model kind drawn uniformly among the measured
//!    kinds; its preferred micro-batch is the largest measured one whose
//!    true peak fits the pod's share of one GPU (`gpu_milli` / 1000 of the
//!    GPU's bytes; whole GPUs for multi-GPU pods), else the smallest. The
//!    job keeps the kind's measured global batch.
//! 3. How long: work at the preferred shape drawn log-normal (median
//!    `median_hours`, sigma `duration_sigma`): the openb lists carry
//!    snapshot times, not run times, so durations are drawn.
//! 4. When: Poisson arrivals whose rate makes the offered load, the jobs'
//!    GPUs times their durations per unit of time, `load` x the cluster's
//!    GPUs: at load 1 one job per GPU keeps every GPU busy on average.
//! 5. The user's guess (for the guessed-limit policy): the true peak times a
//!    factor drawn log-normal (median `guess_median`, sigma `guess_sigma`),
//!    rounded up to whole GiB, at most a GPU. Where an OOM happens in a run
//!    that exceeds its limit: a fraction of the run drawn uniformly in
//!    [0, 0.5) (peaks come late: evaluation, a longer batch, a checkpoint).

use super::kinds::ModelKind;
use crate::place::bench::arrival_order;
use crate::place::inventory::JobRequest;
use crate::place::openb::{TRACE_GPU_CAPACITY, requested_milli_gpu};
use crate::place::rng::SeededRng;

const GIB: u64 = 1 << 30;

/// How jobs are drawn; see the module documentation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadOptions {
    /// Seed of every draw.
    pub seed: u64,
    /// Pods submitted, as a multiple of the cluster's GPU capacity.
    pub tune: f64,
    /// Offered load: GPUs times durations per second, over the GPUs.
    pub load: f64,
    /// Median work of a job at its preferred shape, hours.
    pub median_hours: f64,
    /// Sigma of the log-normal durations.
    pub duration_sigma: f64,
    /// Median of the user's over-request factor.
    pub guess_median: f64,
    /// Sigma of the log-normal over-request factor.
    pub guess_sigma: f64,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        Self {
            seed: 42,
            tune: 5.0,
            load: 1.5,
            median_hours: 2.0,
            duration_sigma: 1.0,
            guess_median: 1.5,
            guess_sigma: 0.5,
        }
    }
}

/// One job of the simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimJob {
    /// The pod's name and its place in the arrival order.
    pub id: String,
    /// Arrival, seconds from the start.
    pub arrival: f64,
    /// GPUs, all on one node.
    pub gpus: u32,
    /// CPU and memory of the pod (node resources).
    pub cpu_milli: u64,
    /// Node memory bytes.
    pub memory_bytes: u64,
    /// The pod's share of one GPU (1.0 for multi-GPU pods).
    pub share: f64,
    /// Index into the kinds.
    pub kind: usize,
    /// Preferred micro-batch (a measured one).
    pub micro: u32,
    /// Seconds of work at the preferred shape.
    pub work: f64,
    /// The user's request for the guessed-limit policy, bytes per GPU.
    pub guess: u64,
    /// Where in a run an OOM happens, as a fraction of the run.
    pub oom_point: f64,
}

fn normal(rng: &mut SeededRng) -> f64 {
    // Box-Muller; 1 - u keeps the logarithm finite.
    let u1 = 1.0 - rng.unit();
    let u2 = rng.unit();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn log_normal(rng: &mut SeededRng, median: f64, sigma: f64) -> f64 {
    median * (sigma * normal(rng)).exp()
}

/// Draws the jobs for `pods` (an openb pod list) on a cluster of `gpus`
/// GPUs of `gpu_bytes` each.
pub fn draw_jobs(
    pods: &[JobRequest],
    gpus: usize,
    gpu_bytes: u64,
    kinds: &[ModelKind],
    opts: &WorkloadOptions,
) -> Result<Vec<SimJob>, String> {
    if kinds.is_empty() {
        return Err("no model kinds".into());
    }
    for (name, value) in [
        ("tune", opts.tune),
        ("load", opts.load),
        ("median hours", opts.median_hours),
        ("guess median", opts.guess_median),
    ] {
        if !(value.is_finite() && value > 0.0) {
            return Err(format!("{name} must be a positive number, got {value}"));
        }
    }
    for (name, value) in [
        ("duration sigma", opts.duration_sigma),
        ("guess sigma", opts.guess_sigma),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(format!("{name} must be 0 or more, got {value}"));
        }
    }
    // CPU-only pods are left out before the inflation, which counts GPU
    // requests (a list of them alone would never reach its limit).
    let pods: Vec<JobRequest> = pods.iter().filter(|p| p.gpus > 0).cloned().collect();
    if pods.is_empty() {
        return Err("the pod list has no pod that asks for a GPU".into());
    }
    let capacity = gpus as u64 * TRACE_GPU_CAPACITY;
    let order = arrival_order(&pods, capacity, opts.tune, opts.seed);
    let mut rng = SeededRng::new(opts.seed ^ 0xC1_05_7E_12);
    let mut jobs = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let pod = &pods[i];
        let share = requested_milli_gpu(pod) as f64 / (f64::from(pod.gpus) * 1000.0);
        let kind_index = rng.below(kinds.len() as u64) as usize;
        let kind = &kinds[kind_index];
        let room = (share * gpu_bytes as f64) as u64;
        let micro = kind
            .largest_micro_within(room)
            .or_else(|| kind.micros().next())
            .ok_or_else(|| format!("{}: no measured micro-batch", kind.name))?;
        let work = log_normal(&mut rng, opts.median_hours * 3600.0, opts.duration_sigma);
        let true_peak = kind.peak_at(micro).unwrap_or(gpu_bytes);
        let factor = log_normal(&mut rng, opts.guess_median, opts.guess_sigma);
        let guess = ((true_peak as f64 * factor / GIB as f64).ceil() as u64).max(1) * GIB;
        jobs.push(SimJob {
            id: format!("{}#{k}", pod.id),
            arrival: 0.0,
            gpus: pod.gpus,
            cpu_milli: pod.cpu_milli,
            memory_bytes: pod.memory_bytes,
            share,
            kind: kind_index,
            micro,
            work,
            guess: guess.min(gpu_bytes),
            oom_point: rng.unit() * 0.5,
        });
    }
    // Poisson arrivals at the rate that offers `load` x the GPUs.
    let demand: f64 =
        jobs.iter().map(|j| f64::from(j.gpus) * j.work).sum::<f64>() / jobs.len() as f64;
    let rate = opts.load * gpus as f64 / demand;
    let mut t = 0.0;
    for job in &mut jobs {
        job.arrival = t;
        t += -(1.0 - rng.unit()).ln() / rate;
    }
    Ok(jobs)
}

#[cfg(test)]
#[path = "workload_tests.rs"]
mod tests;
