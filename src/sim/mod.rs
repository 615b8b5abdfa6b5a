//! `vramfit bench cluster`: a discrete-event simulation of a GPU cluster over
//! an openb trace, comparing how much training each policy finishes.
//!
//! The cluster is the trace's node list (CPU and memory as listed) with
//! every GPU an H200; the jobs are drawn from its pod list
//! ([`workload`]). Each policy replays the same jobs through the real
//! placer ([`crate::place::Placer`]); the vramfit policies budget from the
//! real predictor and run the OOM back-off the helper runs. Policies:
//!
//! - `exclusive`: one job per GPU (Kubernetes with the NVIDIA device
//!   plugin), best fit.
//! - `guessed`: HAMi/KAI-style limits the user guessed (the true peak times a
//!   drawn factor), best fit by the guess. A run that exceeds its limit is
//!   killed where its peak comes (the OOM point), all of its work is lost,
//!   and it is resubmitted at the back of the queue with the limit raised
//!   1.5x, as a user who read the OOM would.
//! - `vramfit`: the predicted budget (plus the job's 5 % headroom) at the
//!   preferred micro-batch, the vramfit packing policy. A run whose true
//!   peak exceeds its budget halves its micro-batch in the process at the
//!   OOM point (absorbed: no work lost, the rest slower), as the helper does.
//! - `vramfit-elastic`: as `vramfit`, and a job whose preferred shape fits
//!   nowhere now may start at once with a smaller micro-batch
//!   ([`crate::place::elastic`]) when its slowdown costs less than the
//!   expected wait for the preferred hole.
//!
//! The queue is first come, first served with backfilling: at every event
//! the first `window` waiting jobs are tried in order, and each one that
//! fits starts. Times are seconds of simulated time.
//!
//! Jobs that share a GPU are time-sliced ([`contention_factor`]): each runs
//! slower by the sum of the GPU shares on it (a job's share is its pod's share
//! of a GPU in the trace, the compute it asked for), at least 1, times the
//! measured cost of switching between processes; a job on several GPUs goes
//! at the pace of its most crowded one. Every start and end on a GPU changes
//! the pace of the others there.
//!
//! Every job asks for its share of each GPU's compute
//! ([`JobRequest::gpu_compute`], the guessed limits as HAMi's `gpucores`), so
//! the jobs on one GPU never ask for more than its whole compute and sharing
//! costs each the switching alone (`compute_shares`; off: they share by
//! memory alone, as the figures before 2026-12-04, night). The vramfit
//! policies place with `packer` (the controller's vramfit policy by default).

pub mod kinds;
pub mod plots;
pub mod workload;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use serde::Serialize;

use crate::place::elastic::{self, Shape};
use crate::place::inventory::{COMPUTE_WHOLE, GpuSpec, Inventory, JobRequest, Placement};
use crate::place::openb;
use crate::place::{Placer, Policy, PolicyKind};
use crate::predict::GpuProfile;
use kinds::ModelKind;
use workload::{SimJob, WorkloadOptions};

const GIB: u64 = 1 << 30;

/// What sharing costs beyond dividing the GPU's time: K compute-bound
/// training processes on one H200 each ran 2.2x (K = 2) and 4.4x (K = 4)
/// slower, BERT-base 1.5x and 3.0x (docs/benchmarks/cluster.md).
pub const SHARED_OVERHEAD: f64 = 1.1;

/// How much slower each of the jobs on one GPU runs, given the GPU shares
/// (compute) they asked for: alone, not at all; shared, the sum of the shares
/// (at least 1: idle time is free to take) times [`SHARED_OVERHEAD`].
pub fn contention_factor(shares: &[f64]) -> f64 {
    if shares.len() <= 1 {
        return 1.0;
    }
    shares.iter().sum::<f64>().max(1.0) * SHARED_OVERHEAD
}

/// A policy of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClusterPolicy {
    /// One job per GPU.
    Exclusive,
    /// Limits the users guessed.
    Guessed,
    /// Predicted budgets, fixed shape.
    Vramfit,
    /// Predicted budgets, smaller shapes in smaller holes.
    VramfitElastic,
}

impl ClusterPolicy {
    /// Every policy, in the report's order.
    pub const ALL: [ClusterPolicy; 4] = [
        ClusterPolicy::Exclusive,
        ClusterPolicy::Guessed,
        ClusterPolicy::Vramfit,
        ClusterPolicy::VramfitElastic,
    ];

    /// The name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ClusterPolicy::Exclusive => "exclusive",
            ClusterPolicy::Guessed => "guessed",
            ClusterPolicy::Vramfit => "vramfit",
            ClusterPolicy::VramfitElastic => "vramfit-elastic",
        }
    }
}

impl std::str::FromStr for ClusterPolicy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        ClusterPolicy::ALL
            .into_iter()
            .find(|p| p.name() == text)
            .ok_or_else(|| {
                format!("unknown policy {text:?} (expected exclusive, guessed, vramfit or vramfit-elastic)")
            })
    }
}

/// Options of one simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterOptions {
    /// How jobs are drawn.
    pub workload: WorkloadOptions,
    /// Waiting jobs tried at each event, from the front of the queue.
    pub window: usize,
    /// Policies to compare, in order.
    pub policies: Vec<ClusterPolicy>,
    /// Headroom added to a predicted peak (a TrainingJob's default).
    pub headroom: f64,
    /// Jobs that share a GPU slow each other down ([`contention_factor`]);
    /// off: a job runs as fast shared as alone (the figures before
    /// 2026-12-04 evening).
    pub contention: bool,
    /// Jobs ask for their GPU share of compute, and the jobs on one GPU never
    /// ask for more than the whole ([`JobRequest::gpu_compute`]); off: they
    /// share by memory alone (the figures before 2026-12-04, night).
    pub compute_shares: bool,
    /// The placement policy of the vramfit policies (the others use
    /// best-fit, as Kubernetes' own scoring does).
    pub packer: PolicyKind,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            workload: WorkloadOptions::default(),
            window: 64,
            policies: ClusterPolicy::ALL.to_vec(),
            headroom: crate::api::DEFAULT_HEADROOM,
            contention: true,
            compute_shares: true,
            packer: PolicyKind::Vramfit,
        }
    }
}

/// What one policy achieved; the shape `vramfit bench cluster -o json`
/// prints per policy (../shared/DESIGN.md).
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    /// Policy name.
    pub name: String,
    /// Jobs submitted.
    pub jobs: usize,
    /// Jobs that finished their work.
    pub finished: usize,
    /// Mean job completion time (arrival to end), seconds.
    pub mean_jct_seconds: f64,
    /// 95th percentile of the completion times, seconds.
    pub p95_jct_seconds: f64,
    /// Mean time a job spent waiting (all its attempts), seconds.
    pub mean_queue_seconds: f64,
    /// Mean time a job spent running (all its runs, killed ones too),
    /// seconds: a completion time is its wait plus its run.
    pub mean_run_seconds: f64,
    /// Mean work of a job at its preferred shape alone, seconds: what its
    /// run would take with no slowdown and no lost work.
    pub mean_work_seconds: f64,
    /// GPU memory the running jobs used (their true peaks), over all GPU
    /// memory, averaged from the first arrival to the last (the steady
    /// state; the drain after it is left out).
    pub memory_utilization: f64,
    /// GPU memory held for them (budgets, whole GPUs, limits), likewise.
    pub committed_utilization: f64,
    /// Runs killed by an OOM and started again from the beginning.
    pub oom_restarts: usize,
    /// OOMs absorbed in the process (micro-batch halved, work kept).
    pub ooms_absorbed: usize,
    /// GPU-hours of work lost to killed runs.
    pub wasted_gpu_hours: f64,
    /// Jobs started with a smaller micro-batch than preferred.
    pub elastic_starts: usize,
    /// Mean step time of the finished jobs' runs relative to their
    /// preferred shapes, weighted by time (1.0: no slowdown).
    pub mean_slowdown: f64,
    /// First arrival to last end, seconds.
    pub makespan_seconds: f64,
    /// Jobs that fit no node even when empty (never started).
    pub never_fit: usize,
    /// Wall-clock seconds the simulation of this policy took.
    pub sim_seconds: f64,
    /// Completion times of the finished jobs, seconds (not serialized).
    #[serde(skip)]
    pub jct: Vec<f64>,
    /// (time, used bytes, committed bytes) after each event, thinned to
    /// about 2,000 samples (not serialized; for the plots).
    #[serde(skip)]
    pub timeline: Vec<(f64, u64, u64)>,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    /// One report per policy, in the order asked.
    pub policies: Vec<PolicyReport>,
    /// Seed of the draws.
    pub seed: u64,
    /// Nodes and GPUs of the cluster.
    pub nodes: usize,
    /// GPUs (all H200 in the simulation).
    pub gpus: usize,
    /// Jobs drawn.
    pub jobs: usize,
    /// The workload's parameters, so a result says what it assumed.
    pub workload: WorkloadSummary,
}

/// The assumptions of a run, as reported: the options it drew the jobs
/// with and what came of them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSummary {
    /// How the jobs were drawn.
    #[serde(flatten)]
    pub options: WorkloadOptions,
    /// Share of jobs whose guess is below their true peak.
    pub under_guessed: f64,
    /// Jobs per model kind.
    pub kinds: BTreeMap<String, usize>,
    /// Backfill window.
    pub window: usize,
    /// Whether jobs sharing a GPU slowed each other ([`contention_factor`]).
    pub contention: bool,
    /// Whether the jobs on one GPU kept their compute shares within the GPU.
    pub compute_shares: bool,
    /// The vramfit policies' placement policy.
    pub packer: String,
}

/// Runs the comparison on openb trace text with the measured kinds in
/// `kinds_text` (JSON lines of `scripts/gpu/step_time.py`).
pub fn run_cluster_bench(
    nodes_csv: &str,
    pods_csv: &str,
    kinds_text: &str,
    opts: &ClusterOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ClusterReport, String> {
    let gpu: &'static GpuProfile =
        crate::predict::gpu_profile("H200").ok_or("no H200 GPU profile")?;
    let kinds = kinds::parse_kinds(kinds_text, gpu)?;
    let trace = openb::parse_nodes(nodes_csv).map_err(|e| e.to_string())?;
    let inventory = Inventory {
        nodes: trace
            .nodes
            .into_iter()
            .map(|mut n| {
                for g in &mut n.gpus {
                    *g = GpuSpec {
                        model: gpu.name.to_string(),
                        capacity: gpu.capacity_bytes,
                    };
                }
                n
            })
            .collect(),
    };
    let gpus: usize = inventory.nodes.iter().map(|n| n.gpus.len()).sum();
    if gpus == 0 {
        return Err("the node list has no GPU".into());
    }
    let pods = openb::parse_pods(pods_csv).map_err(|e| e.to_string())?;
    let jobs = workload::draw_jobs(&pods, gpus, gpu.capacity_bytes, &kinds, &opts.workload)?;
    if opts.window == 0 {
        return Err("the backfill window must be at least 1".into());
    }
    let mut kind_counts = BTreeMap::new();
    for j in &jobs {
        *kind_counts.entry(kinds[j.kind].name.clone()).or_insert(0) += 1;
    }
    let under = jobs
        .iter()
        .filter(|j| j.guess < kinds[j.kind].peak_at(j.micro).unwrap_or(0))
        .count();
    let budgets = Budgets::new(&kinds, gpu, opts.headroom)?;
    let mut policies = Vec::new();
    for &policy in &opts.policies {
        progress(&format!(
            "{}: {} jobs on {gpus} GPUs",
            policy.name(),
            jobs.len()
        ));
        let started = std::time::Instant::now();
        let mut report =
            Sim::new(&inventory, &jobs, &kinds, &budgets, policy, opts)?.run(progress)?;
        report.sim_seconds = started.elapsed().as_secs_f64();
        policies.push(report);
    }
    let w = &opts.workload;
    Ok(ClusterReport {
        policies,
        seed: w.seed,
        nodes: inventory.nodes.len(),
        gpus,
        jobs: jobs.len(),
        workload: WorkloadSummary {
            options: w.clone(),
            under_guessed: under as f64 / jobs.len() as f64,
            kinds: kind_counts,
            window: opts.window,
            contention: opts.contention,
            compute_shares: opts.compute_shares,
            packer: opts.packer.to_string(),
        },
    })
}

/// The vramfit budget of each kind at each measured micro-batch: the
/// predicted peak plus headroom, computed once.
struct Budgets {
    by_kind: Vec<Vec<(u32, u64)>>,
}

impl Budgets {
    fn new(kinds: &[ModelKind], gpu: &'static GpuProfile, headroom: f64) -> Result<Self, String> {
        let by_kind = kinds
            .iter()
            .map(|k| {
                k.micros()
                    .map(|m| {
                        let peak = k.predicted_peak(m, gpu)?;
                        Ok((m, (peak as f64 * (1.0 + headroom)).ceil() as u64))
                    })
                    .collect::<Result<Vec<_>, String>>()
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self { by_kind })
    }

    fn at(&self, kind: usize, micro: u32) -> u64 {
        self.by_kind[kind]
            .iter()
            .find(|b| b.0 == micro)
            .map_or(u64::MAX, |b| b.1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum EventKind {
    Arrive,
    End,
    Oom,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    time: f64,
    seq: u64,
    job: usize,
    kind: EventKind,
    /// The run the event belongs to; stale events are dropped.
    run: u32,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    // Earliest first in a max-heap.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.seq.cmp(&self.seq))
    }
}

/// A job's current run.
#[derive(Debug, Clone)]
struct Run {
    /// When the current segment (this micro-batch) began.
    since: f64,
    /// When the run began.
    started: f64,
    micro: u32,
    /// Budget (limit) per GPU.
    budget: u64,
    /// Step time relative to the preferred shape.
    slowdown: f64,
    /// Sharing's slowdown on the job's most crowded GPU, since `since`.
    factor: f64,
    /// Work left (at the preferred shape) when the run's OOM comes, if it
    /// comes.
    oom_left: Option<f64>,
    placement: Placement,
    end: f64,
}

#[derive(Debug, Clone, Default)]
struct JobState {
    /// Work left at the preferred shape, seconds.
    remaining: f64,
    /// The limit of the next run (guessed policy).
    limit: u64,
    run_id: u32,
    run: Option<Run>,
    queued_since: f64,
    queued_total: f64,
    finished: Option<f64>,
    /// Seconds run and slowdown-weighted seconds, for the mean slowdown.
    ran: f64,
    ran_at_preferred: f64,
}

struct Sim<'a> {
    jobs: &'a [SimJob],
    kinds: &'a [ModelKind],
    budgets: &'a Budgets,
    policy: ClusterPolicy,
    placer: Placer,
    capacity: u64,
    gpu_capacity: u64,
    window: usize,
    events: BinaryHeap<Event>,
    seq: u64,
    queue: Vec<usize>,
    state: Vec<JobState>,
    /// When a hole is expected, while no run starts or stops.
    hole_cache: HashMap<elastic::Hole, Option<f64>>,
    compute_shares: bool,
    contention: bool,
    /// The jobs running on each GPU (node, index).
    on_gpu: HashMap<(String, u32), Vec<usize>>,
    used: u64,
    committed: u64,
    last: f64,
    last_arrival: f64,
    end: f64,
    used_integral: f64,
    committed_integral: f64,
    report: PolicyReport,
}

impl<'a> Sim<'a> {
    fn new(
        inventory: &Inventory,
        jobs: &'a [SimJob],
        kinds: &'a [ModelKind],
        budgets: &'a Budgets,
        policy: ClusterPolicy,
        opts: &ClusterOptions,
    ) -> Result<Self, String> {
        let kind = match policy {
            ClusterPolicy::Exclusive | ClusterPolicy::Guessed => PolicyKind::BestFit,
            ClusterPolicy::Vramfit | ClusterPolicy::VramfitElastic => opts.packer,
        };
        let placer = Placer::new(inventory, Policy::new(kind, opts.workload.seed))
            .map_err(|e| e.to_string())?;
        let capacity = placer.state().capacity_total();
        let gpu_capacity = inventory
            .nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .map(|g| g.capacity)
            .max()
            .unwrap_or(0);
        let mut sim = Self {
            jobs,
            kinds,
            budgets,
            policy,
            placer,
            capacity,
            gpu_capacity,
            window: opts.window,
            events: BinaryHeap::new(),
            seq: 0,
            queue: Vec::new(),
            hole_cache: HashMap::new(),
            contention: opts.contention,
            compute_shares: opts.compute_shares,
            on_gpu: HashMap::new(),
            state: jobs
                .iter()
                .map(|j| JobState {
                    remaining: j.work,
                    limit: j.guess,
                    ..Default::default()
                })
                .collect(),
            used: 0,
            committed: 0,
            last: 0.0,
            last_arrival: jobs.last().map_or(0.0, |j| j.arrival),
            end: 0.0,
            used_integral: 0.0,
            committed_integral: 0.0,
            report: PolicyReport {
                name: policy.name().to_string(),
                jobs: jobs.len(),
                mean_slowdown: 1.0,
                ..Default::default()
            },
        };
        for (i, j) in jobs.iter().enumerate() {
            sim.push(j.arrival, i, EventKind::Arrive, 0);
        }
        Ok(sim)
    }

    fn push(&mut self, time: f64, job: usize, kind: EventKind, run: u32) {
        self.seq += 1;
        self.events.push(Event {
            time,
            seq: self.seq,
            job,
            kind,
            run,
        });
    }

    fn true_peak(&self, job: usize, micro: u32) -> u64 {
        let j = &self.jobs[job];
        self.kinds[j.kind]
            .peak_at(micro)
            .unwrap_or(self.gpu_capacity)
    }

    fn relative(&self, job: usize, micro: u32) -> f64 {
        let j = &self.jobs[job];
        self.kinds[j.kind].curve.relative(micro, j.micro)
    }

    fn advance(&mut self, now: f64) {
        // Utilization is averaged over the arrivals (the steady state), not
        // the drain after the last one, which a single long job stretches.
        let now = now.min(self.last_arrival);
        let dt = now - self.last;
        if dt > 0.0 {
            self.used_integral += self.used as f64 * dt;
            self.committed_integral += self.committed as f64 * dt;
            self.last = now;
        }
    }

    fn run(mut self, progress: &mut dyn FnMut(&str)) -> Result<PolicyReport, String> {
        let total = self.jobs.len();
        let mut next_progress = total / 10;
        let stride = (total / 1000).max(1) as u64;
        let mut events = 0u64;
        let first = self.jobs.first().map_or(0.0, |j| j.arrival);
        self.last = first;
        while let Some(event) = self.events.pop() {
            self.advance(event.time);
            self.end = event.time;
            self.handle(event)?;
            // Everything due at the same time first, then the queue.
            if self.events.peek().is_none_or(|next| next.time > event.time) {
                self.schedule(event.time)?;
            }
            events += 1;
            if events.is_multiple_of(stride) {
                self.report
                    .timeline
                    .push((event.time, self.used, self.committed));
            }
            if self.report.finished >= next_progress && next_progress > 0 {
                progress(&format!(
                    "{}: {} of {total} finished, {} waiting, t = {:.1} h",
                    self.policy.name(),
                    self.report.finished,
                    self.queue.len(),
                    event.time / 3600.0
                ));
                next_progress += total / 10;
            }
        }
        self.finish(first)
    }

    fn handle(&mut self, event: Event) -> Result<(), String> {
        let job = event.job;
        match event.kind {
            EventKind::Arrive => {
                let request = self.request(job, self.ask(job).1);
                // Told once; the queue tries it many times.
                self.placer.observe(&request).map_err(|e| e.to_string())?;
                self.enqueue(job, event.time);
            }
            EventKind::End if event.run == self.state[job].run_id => {
                self.stop(job, event.time);
                let s = &mut self.state[job];
                s.remaining = 0.0;
                s.finished = Some(event.time);
                self.report.finished += 1;
                self.report.jct.push(event.time - self.jobs[job].arrival);
            }
            EventKind::Oom if event.run == self.state[job].run_id => self.oom(job, event.time),
            _ => {}
        }
        Ok(())
    }

    fn enqueue(&mut self, job: usize, now: f64) {
        self.state[job].queued_since = now;
        self.queue.push(job);
    }

    /// The placer's request for `job` with `budget` per GPU.
    fn request(&self, job: usize, budget: u64) -> JobRequest {
        let j = &self.jobs[job];
        JobRequest::new(
            j.id.clone(),
            j.gpus,
            budget.min(self.gpu_capacity),
            j.cpu_milli,
            j.memory_bytes,
        )
        .with_compute(self.compute_of(job))
    }

    /// The compute `job` asks of each GPU: its share, when shares count.
    fn compute_of(&self, job: usize) -> u64 {
        if !self.compute_shares {
            return 0;
        }
        let thousandths = (self.jobs[job].share * COMPUTE_WHOLE as f64).round() as u64;
        thousandths.clamp(1, COMPUTE_WHOLE)
    }

    /// The budget per GPU and micro-batch a new run of `job` asks for.
    fn ask(&self, job: usize) -> (u32, u64) {
        let j = &self.jobs[job];
        match self.policy {
            ClusterPolicy::Exclusive => (j.micro, self.gpu_capacity),
            ClusterPolicy::Guessed => (j.micro, self.state[job].limit),
            ClusterPolicy::Vramfit | ClusterPolicy::VramfitElastic => {
                // The preferred micro-batch, or the largest one whose budget
                // fits a GPU (the controller's automatic micro-batch).
                let kind = &self.kinds[j.kind];
                let fitting = kind
                    .micros()
                    .filter(|&m| m <= j.micro)
                    .filter(|&m| self.budgets.at(j.kind, m) <= self.gpu_capacity)
                    .last();
                let micro = fitting.unwrap_or(j.micro);
                (micro, self.budgets.at(j.kind, micro))
            }
        }
    }

    fn schedule(&mut self, now: f64) -> Result<(), String> {
        let mut started = Vec::new();
        for pos in 0..self.queue.len().min(self.window) {
            let job = self.queue[pos];
            if self.try_start(job, now)? {
                started.push(pos);
            }
        }
        if !started.is_empty() {
            let mut k = 0;
            let mut pos = 0;
            self.queue.retain(|_| {
                let keep = started.get(k) != Some(&pos);
                if !keep {
                    k += 1;
                }
                pos += 1;
                keep
            });
        }
        Ok(())
    }

    fn try_start(&mut self, job: usize, now: f64) -> Result<bool, String> {
        let (micro, budget) = self.ask(job);
        if budget > self.gpu_capacity {
            // No micro-batch's budget fits any GPU: it never starts.
            if self.state[job].run_id == 0 {
                self.report.never_fit += 1;
                self.state[job].run_id = u32::MAX;
            }
            return Ok(false);
        }
        if self.state[job].run_id == u32::MAX {
            return Ok(false);
        }
        let request = self.request(job, budget);
        if let Some(decision) = self.placer.try_place(&request).map_err(|e| e.to_string())? {
            self.start(job, now, micro, budget, decision.placement);
            return Ok(true);
        }
        if self.policy != ClusterPolicy::VramfitElastic {
            return Ok(false);
        }
        self.try_elastic(job, now, micro, budget)
    }

    fn try_elastic(
        &mut self,
        job: usize,
        now: f64,
        micro: u32,
        budget: u64,
    ) -> Result<bool, String> {
        let j = &self.jobs[job];
        let smaller: Vec<Shape> = self.kinds[j.kind]
            .micros()
            .filter(|&m| m < micro)
            .map(|m| Shape {
                micro: m,
                budget: self.budgets.at(j.kind, m),
                relative_time: self.relative(job, m),
            })
            .collect();
        if smaller.is_empty() {
            return Ok(false);
        }
        // The hole's time is kept until a run starts or stops (which is
        // all that changes it): a saturated queue asks the same many times.
        let key = elastic::Hole::new(j.gpus, budget).with_compute(self.compute_of(job));
        let hole = match self.hole_cache.get(&key) {
            Some(&hole) => hole,
            None => {
                let ends: Vec<(f64, &Placement)> = self
                    .state
                    .iter()
                    .filter_map(|s| s.run.as_ref().map(|r| (r.end, &r.placement)))
                    .collect();
                let hole = elastic::expected_wait(self.placer.state(), ends, key, now)
                    .map(|wait| now + wait);
                self.hole_cache.insert(key, hole);
                hole
            }
        };
        let wait = hole.map(|at| (at - now).max(0.0));
        let remaining = self.state[job].remaining;
        let base = self.request(job, budget);
        let mut placed = None;
        let placer = &mut self.placer;
        let choice = elastic::choose_smaller(&smaller, budget, remaining, wait, |shape| {
            let request = JobRequest {
                gpu_budget: shape.budget,
                ..base.clone()
            };
            match placer.try_place(&request) {
                Ok(Some(d)) => {
                    placed = Some(d.placement);
                    true
                }
                _ => false,
            }
        });
        match (choice, placed) {
            (Some(choice), Some(placement)) => {
                self.report.elastic_starts += 1;
                self.start(job, now, choice.shape.micro, choice.shape.budget, placement);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn start(&mut self, job: usize, now: f64, micro: u32, budget: u64, placement: Placement) {
        self.hole_cache.clear();
        let gpus = u64::from(self.jobs[job].gpus);
        let peak = self.true_peak(job, micro);
        let slowdown = self.relative(job, micro);
        let oom_point = self.jobs[job].oom_point;
        let s = &mut self.state[job];
        s.queued_total += now - s.queued_since;
        // Over its budget, the run meets its peak (an OOM) after this share
        // of its work.
        let oom_left = (peak > budget).then_some(s.remaining * (1.0 - oom_point));
        s.run = Some(Run {
            since: now,
            started: now,
            micro,
            budget,
            slowdown,
            factor: 1.0,
            oom_left,
            placement: placement.clone(),
            end: now,
        });
        self.used += peak * gpus;
        self.committed += budget * gpus;
        for key in gpu_keys(&placement) {
            self.on_gpu.entry(key).or_default().push(job);
        }
        self.repace(job, now);
        self.repace_neighbours(job, &placement, now);
    }

    /// Counts the work `job`'s run did since its pace last changed.
    fn bank(&mut self, job: usize, now: f64) {
        let s = &mut self.state[job];
        let run = s.run.as_mut().expect("a running job");
        let done = (now - run.since) / (run.slowdown * run.factor);
        s.ran += now - run.since;
        s.ran_at_preferred += done;
        s.remaining = (s.remaining - done).max(0.0);
        run.since = now;
    }

    /// Sharing's slowdown of a run on `placement` now: its most crowded GPU's.
    fn factor_of(&self, placement: &Placement) -> f64 {
        if !self.contention {
            return 1.0;
        }
        gpu_keys(placement)
            .iter()
            .map(|key| {
                let shares: Vec<f64> = self
                    .on_gpu
                    .get(key)
                    .map(|jobs| jobs.iter().map(|&j| self.jobs[j].share).collect())
                    .unwrap_or_default();
                contention_factor(&shares)
            })
            .fold(1.0, f64::max)
    }

    /// Sets `job`'s pace (its work banked up to `now`) and schedules its end,
    /// or its OOM when that comes first; earlier events of the run go stale.
    fn repace(&mut self, job: usize, now: f64) {
        let factor = {
            let run = self.state[job].run.as_ref().expect("a running job");
            self.factor_of(&run.placement)
        };
        let s = &mut self.state[job];
        s.run_id += 1;
        let run_id = s.run_id;
        let remaining = s.remaining;
        let run = s.run.as_mut().expect("a running job");
        run.factor = factor;
        let pace = run.slowdown * factor;
        run.end = now + remaining * pace;
        let (at, kind) = match run.oom_left {
            Some(left) if remaining > left => (now + (remaining - left) * pace, EventKind::Oom),
            _ => (run.end, EventKind::End),
        };
        self.push(at, job, kind, run_id);
    }

    /// The other runs on `placement`'s GPUs change pace: `job` came or went.
    fn repace_neighbours(&mut self, job: usize, placement: &Placement, now: f64) {
        if !self.contention {
            return;
        }
        let mut others: Vec<usize> = gpu_keys(placement)
            .iter()
            .flat_map(|key| self.on_gpu.get(key).cloned().unwrap_or_default())
            .filter(|&j| j != job)
            .collect();
        others.sort_unstable();
        others.dedup();
        for other in others {
            self.bank(other, now);
            self.repace(other, now);
        }
    }

    /// Ends the current run at `now`, keeping the work done; returns it.
    fn stop(&mut self, job: usize, now: f64) -> Run {
        self.hole_cache.clear();
        self.bank(job, now);
        let gpus = u64::from(self.jobs[job].gpus);
        let run = self.state[job].run.take().expect("a running job");
        let peak = self.true_peak(job, run.micro);
        self.used -= peak * gpus;
        self.committed -= run.budget * gpus;
        self.placer.release(&self.jobs[job].id);
        for key in gpu_keys(&run.placement) {
            if let Some(jobs) = self.on_gpu.get_mut(&key) {
                jobs.retain(|&j| j != job);
                if jobs.is_empty() {
                    self.on_gpu.remove(&key);
                }
            }
        }
        self.repace_neighbours(job, &run.placement, now);
        run
    }

    fn oom(&mut self, job: usize, now: f64) {
        let gpus = f64::from(self.jobs[job].gpus);
        match self.policy {
            ClusterPolicy::Guessed | ClusterPolicy::Exclusive => {
                // Killed: all the work is lost, resubmitted with 1.5x the limit.
                let run = self.stop(job, now);
                self.report.oom_restarts += 1;
                self.report.wasted_gpu_hours += gpus * (now - run.started) / 3600.0;
                let s = &mut self.state[job];
                s.remaining = self.jobs[job].work;
                let raised = ((run.budget as f64 * 1.5 / GIB as f64).ceil() as u64) * GIB;
                s.limit = raised.min(self.gpu_capacity);
                self.enqueue(job, now);
            }
            ClusterPolicy::Vramfit | ClusterPolicy::VramfitElastic => {
                let run = self.state[job].run.clone().expect("a running job");
                // The helper halves the micro-batch until the peak fits the
                // budget; the run goes on with the rest of its work.
                let kind = &self.kinds[self.jobs[job].kind];
                let next = kind
                    .micros()
                    .filter(|&m| m < run.micro)
                    .filter(|&m| kind.peak_at(m).unwrap_or(u64::MAX) <= run.budget)
                    .last();
                let Some(micro) = next else {
                    // Nothing fits the budget: the controller restarts the
                    // job with a budget raised by its OOM correction.
                    let run = self.stop(job, now);
                    self.report.oom_restarts += 1;
                    self.report.wasted_gpu_hours += gpus * (now - run.started) / 3600.0;
                    self.state[job].remaining = self.jobs[job].work;
                    self.enqueue(job, now);
                    return;
                };
                self.report.ooms_absorbed += 1;
                self.hole_cache.clear();
                let old_peak = self.true_peak(job, run.micro);
                let new_peak = self.true_peak(job, micro);
                let slowdown = self.relative(job, micro);
                let g = u64::from(self.jobs[job].gpus);
                self.used = self.used - old_peak * g + new_peak * g;
                self.bank(job, now);
                let run = self.state[job].run.as_mut().expect("a running job");
                run.micro = micro;
                run.slowdown = slowdown;
                run.oom_left = None;
                self.repace(job, now);
            }
        }
    }

    fn finish(mut self, first: f64) -> Result<PolicyReport, String> {
        let mut report = std::mem::take(&mut self.report);
        report.makespan_seconds = self.end - first;
        let window = self.last_arrival - first;
        if window > 0.0 {
            let area = self.capacity as f64 * window;
            report.memory_utilization = self.used_integral / area;
            report.committed_utilization = self.committed_integral / area;
        }
        let finished: Vec<&JobState> = self.state.iter().filter(|s| s.finished.is_some()).collect();
        if !finished.is_empty() {
            let n = finished.len() as f64;
            report.mean_queue_seconds = finished.iter().map(|s| s.queued_total).sum::<f64>() / n;
            report.mean_run_seconds = finished.iter().map(|s| s.ran).sum::<f64>() / n;
            report.mean_work_seconds = self
                .state
                .iter()
                .zip(self.jobs)
                .filter(|(s, _)| s.finished.is_some())
                .map(|(_, j)| j.work)
                .sum::<f64>()
                / n;
            let ran: f64 = finished.iter().map(|s| s.ran).sum();
            let at_pref: f64 = finished.iter().map(|s| s.ran_at_preferred).sum();
            if at_pref > 0.0 {
                report.mean_slowdown = ran / at_pref;
            }
        }
        let mut jct = report.jct.clone();
        jct.sort_by(f64::total_cmp);
        if !jct.is_empty() {
            report.mean_jct_seconds = jct.iter().sum::<f64>() / jct.len() as f64;
            report.p95_jct_seconds = percentile(&jct, 0.95);
        }
        Ok(report)
    }
}

/// The GPUs of a placement, as keys of the jobs on each GPU.
fn gpu_keys(placement: &Placement) -> Vec<(String, u32)> {
    placement
        .gpu_indices
        .iter()
        .map(|&g| (placement.node.clone(), g))
        .collect()
}

/// The `q` quantile of sorted values (nearest rank).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `-o table`: one row per policy.
pub fn table(report: &ClusterReport) -> String {
    let mut out = format!(
        "{} jobs on {} nodes / {} GPUs (H200), seed {}, load {}, median work {} h, guess factor median {} (sigma {}, {:.1}% under), {}\n",
        report.jobs,
        report.nodes,
        report.gpus,
        report.seed,
        report.workload.options.load,
        report.workload.options.median_hours,
        report.workload.options.guess_median,
        report.workload.options.guess_sigma,
        report.workload.under_guessed * 100.0,
        match (report.workload.contention, report.workload.compute_shares) {
            (true, true) => "jobs sharing a GPU slow each other, their compute shares within it",
            (true, false) => "jobs sharing a GPU slow each other, shared by memory alone",
            (false, _) => "sharing a GPU costs nothing",
        }
    );
    out.push_str(&format!(
        "{:<16} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>9} {:>8} {:>8} {:>10} {:>8} {:>8}\n",
        "POLICY",
        "FINISHED",
        "MEAN JCT",
        "P95 JCT",
        "MEAN WAIT",
        "MEAN RUN",
        "MEAN WORK",
        "USED",
        "COMMITTED",
        "OOM-RST",
        "ABSORBED",
        "WASTED GPUh",
        "ELASTIC",
        "SLOWDOWN"
    ));
    for p in &report.policies {
        out.push_str(&format!(
            "{:<16} {:>8} {:>9.2}h {:>9.2}h {:>9.2}h {:>9.2}h {:>9.2}h {:>6.1}% {:>8.1}% {:>8} {:>8} {:>11.1} {:>8} {:>7.3}x\n",
            p.name,
            format!("{}/{}", p.finished, p.jobs),
            p.mean_jct_seconds / 3600.0,
            p.p95_jct_seconds / 3600.0,
            p.mean_queue_seconds / 3600.0,
            p.mean_run_seconds / 3600.0,
            p.mean_work_seconds / 3600.0,
            p.memory_utilization * 100.0,
            p.committed_utilization * 100.0,
            p.oom_restarts,
            p.ooms_absorbed,
            p.wasted_gpu_hours,
            p.elastic_starts,
            p.mean_slowdown
        ));
    }
    out
}

/// Per policy, mean JCT relative to another policy's: `1 - mine / theirs`.
pub fn jct_gain(report: &ClusterReport, mine: &str, theirs: &str) -> Option<f64> {
    let by_name: HashMap<&str, &PolicyReport> = report
        .policies
        .iter()
        .map(|p| (p.name.as_str(), p))
        .collect();
    let (a, b) = (by_name.get(mine)?, by_name.get(theirs)?);
    (b.mean_jct_seconds > 0.0).then(|| 1.0 - a.mean_jct_seconds / b.mean_jct_seconds)
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
