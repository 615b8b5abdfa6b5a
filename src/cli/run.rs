//! `vramfit run --local JOB.yaml -- COMMAND...`: a TrainingJob as local processes,
//! with the controller's loop: predict -> budget -> environment -> start -> on an
//! OOM (exit 42 and PyTorch's text) half the micro-batch, twice the accumulation,
//! start again -> stop at `batch.minMicro` or `maxOOMRetries`.
//!
//! What follows each attempt is the controller's own decision,
//! [`next_attempt`] (its back-off is [`after_oom`](crate::job::backoff::after_oom));
//! the budget is the controller's [`attempt_budget`]; the exit protocol is
//! [`is_oom_exit`].
//! On a GPU the budget is also enforced from outside, as on a cluster node:
//! `vramfit-agent run --local-budget` watches each attempt's process tree
//! ([`agent`]) and its OOM report makes the attempt an OOM.

pub mod agent;
mod gpu;

use std::fs;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;

use super::{OutputFormat, read_text};
use crate::api::{AbsorbedOom, TrainingJob};
use crate::job::attempt::{AttemptEnd, NextAttempt, RetriesUsed, next_attempt};
use crate::job::backoff::BatchShape;
use crate::job::budget::attempt_budget;
use crate::job::env::{self, Attempt, attempt_env};
use crate::job::exit::{OOM_EXIT_CODE, first_line, is_oom_exit};
use crate::job::shape_file::{self, ShapeFile};
use crate::quantity::human_bytes;

pub use gpu::{LocalGpu, PeakSource};

/// Arguments of `vramfit run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Run the job on this machine (the only mode: on a cluster, apply the job).
    #[arg(long, required = true)]
    pub local: bool,
    /// The TrainingJob manifest (YAML or JSON).
    pub job: PathBuf,
    /// The allocation profile of a profile-based job (the ConfigMap's value).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// GPU indices to run on (default: the first `spec.gpus` GPUs).
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<u32>,
    /// Folder for each attempt's termination log and stats (default: a new
    /// folder under the system's temporary folder).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Milliseconds between two samples of the GPU memory (also the agent's
    /// reading interval).
    #[arg(long, default_value_t = 500)]
    pub sample_ms: u64,
    /// The node agent that enforces each attempt's budget on the GPU
    /// (default: `vramfit-agent` beside this binary, else on PATH).
    #[arg(long, value_name = "PATH", conflicts_with = "no_agent")]
    pub agent: Option<PathBuf>,
    /// Run without the agent: the budget is then enforced only inside the
    /// training process (its allocator or memory fraction).
    #[arg(long)]
    pub no_agent: bool,
    /// Output format of the summary (with `json`, the training's standard
    /// output goes to standard error so that standard output is one JSON object).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// The training command, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// One attempt as `run --local` reports it.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AttemptReport {
    /// Attempt number, from 1.
    pub attempt: u32,
    /// Micro-batch per GPU the attempt started with.
    pub micro_batch: u32,
    /// Accumulation steps the attempt started with.
    pub grad_accum: u32,
    /// Budget per GPU, bytes.
    pub budget_bytes: u64,
    /// `request`, `model` or `profile`.
    pub budget_source: String,
    /// Predicted peak per GPU, bytes.
    pub predicted_bytes: u64,
    /// Budget over the GPU's memory, when there is a GPU.
    pub memory_fraction: Option<f64>,
    /// Highest memory measured for the attempt (NVML), when there is a GPU.
    pub measured_peak_bytes: Option<u64>,
    /// `nvml-process` or `nvml-device`, with a measured peak.
    pub peak_source: Option<String>,
    /// `Succeeded`, `OutOfMemory` or `Failed`.
    pub outcome: String,
    /// The process's exit code (None when a signal ended it).
    pub exit_code: Option<i32>,
    /// The termination message's OOM line, or why it failed.
    pub message: Option<String>,
    /// Why the node agent stopped the attempt (its OOM report), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by_agent: Option<String>,
    /// OOMs the process absorbed itself (its shape file).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub absorbed_ooms: Vec<AbsorbedOom>,
    /// The shape the process ended with, when it reported one.
    pub final_shape: Option<String>,
    /// When the attempt started, Unix milliseconds.
    pub started_unix_ms: u64,
    /// Wall-clock seconds of the attempt.
    pub seconds: f64,
}

/// The whole run.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    /// The job's name.
    pub job: String,
    /// The training command.
    pub command: Vec<String>,
    /// GPU indices used (empty without a GPU).
    pub devices: Vec<u32>,
    /// Global batch (never changes).
    pub global_batch: u32,
    /// Where the attempts' files are.
    pub workdir: String,
    /// Every attempt, in order.
    pub attempts: Vec<AttemptReport>,
    /// `Succeeded` or `Failed`.
    pub outcome: String,
    /// Why the run failed, in words.
    pub message: Option<String>,
}

/// Classifies an exit the way the controller classifies a pod.
pub fn classify_exit(status: ExitStatus, termination_message: &str) -> AttemptEnd {
    match (status.code(), status.signal()) {
        (Some(0), _) => AttemptEnd::Succeeded,
        (Some(code), _) if is_oom_exit(code, termination_message) => {
            AttemptEnd::OutOfMemory(first_line(termination_message))
        }
        (Some(code), _) => {
            let detail = if termination_message.trim().is_empty() {
                String::new()
            } else {
                format!(": {}", first_line(termination_message))
            };
            let hint = if code == OOM_EXIT_CODE {
                " (exit code of the OOM protocol, but the termination log lacks \"CUDA out of memory\")"
            } else {
                ""
            };
            AttemptEnd::Failed(format!("exited with code {code}{hint}{detail}"))
        }
        (None, Some(signal)) => AttemptEnd::Failed(format!("killed by signal {signal}")),
        (None, None) => AttemptEnd::Failed("ended without an exit code".into()),
    }
}

/// An attempt's outcome: the agent's OOM report, when there is one, wins over
/// the exit (the controller's rule, docs/agent.md: the agent saw the attempt
/// over its budget past the grace period, whatever its exit says).
pub fn outcome_of(
    status: ExitStatus,
    termination_message: &str,
    stopped_by_agent: Option<&str>,
) -> AttemptEnd {
    classify_exit(status, termination_message)
        .or_stopped_by_agent(stopped_by_agent.map(|r| format!("stopped by vramfit-agent: {r}")))
}

/// Everything an attempt's process gets in its environment.
#[derive(Clone, Debug)]
pub struct AttemptPlan<'a> {
    /// The job.
    pub job: &'a TrainingJob,
    /// The attempt's shape.
    pub shape: BatchShape,
    /// Attempt number.
    pub attempt: u32,
    /// Budget per GPU, bytes.
    pub budget_bytes: u64,
    /// The GPUs (empty without one).
    pub gpus: &'a [LocalGpu],
    /// The attempt's folder.
    pub dir: &'a Path,
}

impl AttemptPlan<'_> {
    /// Budget over the smallest chosen GPU's memory.
    pub fn memory_fraction(&self) -> Option<f64> {
        let total = self.gpus.iter().map(|g| g.total_bytes).min()?;
        Some((self.budget_bytes as f64 / total as f64).min(1.0))
    }

    /// The variables of `docs/node-protocol.md`, as the controller sets them,
    /// plus `CUDA_VISIBLE_DEVICES` and the per-attempt termination log.
    pub fn environment(&self) -> Vec<(String, String)> {
        let uuids: Vec<&str> = self.gpus.iter().map(|g| g.uuid.as_str()).collect();
        let stats_dir = self.dir.join("stats").display().to_string();
        let mut vars = attempt_env(
            &self.job.spec,
            &Attempt {
                shape: self.shape,
                attempt: self.attempt,
                budget_bytes: self.budget_bytes,
                // The budget is predicted for the default profile.
                gpu_model: None,
                memory_fraction: self.memory_fraction(),
                gpu_uuids: uuids,
                stats_dir: &stats_dir,
            },
        );
        vars.extend([
            (
                env::TERMINATION_LOG,
                self.termination_log().display().to_string(),
            ),
            (
                env::POD_NAME,
                format!("{}-local-{}", job_name(self.job), self.attempt),
            ),
        ]);
        if !self.gpus.is_empty() {
            let indices: Vec<String> = self.gpus.iter().map(|g| g.index.to_string()).collect();
            vars.push(("CUDA_VISIBLE_DEVICES", indices.join(",")));
        }
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Where the process writes its OOM message.
    pub fn termination_log(&self) -> PathBuf {
        self.dir.join("termination-log")
    }
}

fn job_name(job: &TrainingJob) -> String {
    job.metadata
        .name
        .clone()
        .unwrap_or_else(|| "training-job".into())
}

/// Parses a TrainingJob manifest.
pub fn parse_training_job(text: &str) -> anyhow::Result<TrainingJob> {
    let job: TrainingJob = serde_saphyr::from_str(text).context("not a TrainingJob")?;
    let spec = &job.spec;
    if spec.batch.min_micro > spec.batch.micro {
        bail!(
            "spec.batch.minMicro {} exceeds spec.batch.micro {}",
            spec.batch.min_micro,
            spec.batch.micro
        );
    }
    Ok(job)
}

/// The shape file the process wrote last, if any: its shape and absorbed OOMs.
pub fn read_shape_files(stats: &Path) -> Option<(BatchShape, Vec<AbsorbedOom>)> {
    let mut newest: Option<(SystemTime, ShapeFile)> = None;
    for entry in fs::read_dir(stats).ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("shape-") && name.ends_with(".json")) {
            continue;
        }
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        let Ok(file) = shape_file::read(&entry.path()) else {
            continue;
        };
        if newest.as_ref().is_none_or(|(t, _)| modified > *t) {
            newest = Some((modified, file));
        }
    }
    let (_, file) = newest?;
    Some((file.shape(), file.absorbed()))
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs `vramfit run --local`; returns the report and whether the job succeeded.
pub fn run(args: &RunArgs) -> anyhow::Result<RunReport> {
    let job = parse_training_job(&read_text(&args.job)?)?;
    let profile = args.profile.as_deref().map(read_text).transpose()?;
    if job.spec.model.profile.is_some() && profile.is_none() {
        bail!("spec.model.profile: pass the profile file with --profile");
    }
    let spec = &job.spec;
    let all_gpus = gpu::local_gpus();
    let gpus = choose_gpus(&all_gpus, &args.devices, spec.gpus)?;
    // Without a GPU there is nothing for the agent to read.
    let agent = if gpus.is_empty() || args.no_agent {
        None
    } else {
        Some(agent::find_agent(args.agent.as_deref())?)
    };
    let workdir = match &args.workdir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!(
            "vramfit-run-{}-{}",
            job_name(&job),
            std::process::id()
        )),
    };
    fs::create_dir_all(&workdir).with_context(|| format!("creating {}", workdir.display()))?;
    let mut shape = BatchShape::for_micro(spec.batch.global, spec.batch.micro, spec.gpus)
        .with_context(|| {
            format!(
                "batch.global {} is not divisible by batch.micro {} x gpus {}",
                spec.batch.global, spec.batch.micro, spec.gpus
            )
        })?;
    let mut report = RunReport {
        job: job_name(&job),
        command: args.command.clone(),
        devices: gpus.iter().map(|g| g.index).collect(),
        global_batch: spec.batch.global,
        workdir: workdir.display().to_string(),
        attempts: Vec::new(),
        outcome: "Failed".into(),
        message: None,
    };
    let mut used = RetriesUsed::default();
    for attempt in 1.. {
        let capacity = gpus.iter().map(|g| g.total_bytes).min();
        let budget = attempt_budget(&job, shape.micro, profile.as_deref(), None)
            .map_err(anyhow::Error::msg)?
            .after_ooms(used.oom, job.spec.headroom(), capacity);
        if let Some(small) = gpus.iter().find(|g| g.total_bytes < budget.budget) {
            bail!(
                "the budget of {} at micro-batch {} does not fit GPU {} ({})",
                human_bytes(budget.budget),
                shape.micro,
                small.index,
                human_bytes(small.total_bytes)
            );
        }
        let dir = workdir.join(format!("attempt-{attempt}"));
        fs::create_dir_all(dir.join("stats"))?;
        let plan = AttemptPlan {
            job: &job,
            shape,
            attempt,
            budget_bytes: budget.budget,
            gpus: &gpus,
            dir: &dir,
        };
        let (mut attempt_report, outcome, ended) = run_attempt(&plan, args, agent.as_deref())?;
        attempt_report.budget_source = budget.source.to_string();
        attempt_report.predicted_bytes = budget.predicted;
        eprintln!("vramfit: {}", attempt_line(&attempt_report));
        report.attempts.push(attempt_report);
        match next_attempt(&job.spec, ended, &outcome, used) {
            NextAttempt::Done => {
                report.outcome = "Succeeded".into();
                break;
            }
            NextAttempt::Fail(reason) => {
                report.message = Some(reason);
                break;
            }
            NextAttempt::Retry(next) => {
                eprintln!(
                    "vramfit: out of memory at {}; next attempt {}",
                    ended.display(),
                    next.display()
                );
                shape = next;
                used.oom += 1;
            }
        }
    }
    Ok(report)
}

fn choose_gpus(all: &[LocalGpu], devices: &[u32], wanted: u32) -> anyhow::Result<Vec<LocalGpu>> {
    if all.is_empty() {
        if !devices.is_empty() {
            bail!("--devices given, but nvidia-smi lists no GPU");
        }
        return Ok(Vec::new());
    }
    let chosen: Vec<LocalGpu> = if devices.is_empty() {
        all.iter().take(wanted as usize).cloned().collect()
    } else {
        devices
            .iter()
            .map(|d| {
                all.iter()
                    .find(|g| g.index == *d)
                    .cloned()
                    .with_context(|| format!("no GPU with index {d}"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    if chosen.len() != wanted as usize {
        bail!(
            "the job wants {wanted} GPU(s), {} chosen (this machine has {})",
            chosen.len(),
            all.len()
        );
    }
    Ok(chosen)
}

fn run_attempt(
    plan: &AttemptPlan<'_>,
    args: &RunArgs,
    agent: Option<&Path>,
) -> anyhow::Result<(AttemptReport, AttemptEnd, BatchShape)> {
    let (program, rest) = args.command.split_first().context("no command after --")?;
    let mut command = Command::new(program);
    command.args(rest).envs(plan.environment());
    if args.output == OutputFormat::Json {
        use std::os::fd::AsFd as _;
        command.stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?));
    }
    let _ = fs::remove_file(plan.termination_log());
    let started_unix_ms = unix_ms_now();
    let started = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {program:?}"))?;
    let interval = Duration::from_millis(args.sample_ms.max(50));
    let watchdog = match agent {
        Some(agent) => match agent::AttemptWatchdog::start(
            agent,
            child.id(),
            plan.budget_bytes,
            interval,
            plan.dir,
        ) {
            Ok(w) => Some(w),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        },
        None => None,
    };
    let mut sampler = (!plan.gpus.is_empty())
        .then(|| gpu::PeakSampler::new(plan.gpus.iter().map(|g| g.index).collect()));
    let mut next_sample = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Some(sampler) = sampler.as_mut()
            && Instant::now() >= next_sample
        {
            sampler.sample(&gpu::process_tree(child.id()));
            next_sample = Instant::now() + interval;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let seconds = started.elapsed().as_secs_f64();
    let stopped_by_agent = match watchdog.map(agent::AttemptWatchdog::finish) {
        Some(Ok(reason)) => reason,
        Some(Err(e)) => {
            eprintln!("vramfit: warning: the budget was not enforced from outside: {e}");
            None
        }
        None => None,
    };
    let message = fs::read_to_string(plan.termination_log()).unwrap_or_default();
    let outcome = outcome_of(status, &message, stopped_by_agent.as_deref());
    let reported = read_shape_files(&plan.dir.join("stats"));
    let ended = reported.as_ref().map_or(plan.shape, |(s, _)| *s);
    let peak = sampler.as_ref().and_then(|s| s.peak());
    let report = AttemptReport {
        attempt: plan.attempt,
        micro_batch: plan.shape.micro,
        grad_accum: plan.shape.accum,
        budget_bytes: plan.budget_bytes,
        budget_source: String::new(),
        predicted_bytes: 0,
        memory_fraction: plan.memory_fraction(),
        measured_peak_bytes: peak.map(|(b, _)| b),
        peak_source: peak.map(|(_, s)| s.name().to_string()),
        outcome: outcome.name().to_string(),
        exit_code: status.code(),
        message: outcome.message().map(str::to_string),
        stopped_by_agent,
        absorbed_ooms: reported.map(|(_, a)| a).unwrap_or_default(),
        final_shape: Some(ended.display()),
        started_unix_ms,
        seconds,
    };
    Ok((report, outcome, ended))
}

fn peak_text(report: &AttemptReport) -> String {
    match (report.measured_peak_bytes, &report.peak_source) {
        (Some(bytes), Some(source)) => format!("{} ({source})", human_bytes(bytes)),
        _ => "n/a".into(),
    }
}

fn attempt_line(r: &AttemptReport) -> String {
    let mut line = format!(
        "attempt {} shape {}x{} budget {} peak {} {} in {:.1} s",
        r.attempt,
        r.micro_batch,
        r.grad_accum,
        human_bytes(r.budget_bytes),
        peak_text(r),
        r.outcome,
        r.seconds
    );
    if !r.absorbed_ooms.is_empty() {
        line.push_str(&format!(
            " ({} OOM(s) absorbed in-process, ended at {})",
            r.absorbed_ooms.len(),
            r.final_shape.as_deref().unwrap_or("?")
        ));
    }
    if let Some(message) = &r.message {
        line.push_str(": ");
        line.push_str(message);
    }
    line
}

/// The report as a table for people.
pub fn report_table(report: &RunReport) -> String {
    let mut out = format!(
        "{:<8} {:<10} {:<11} {:<26} {:<12} {:>8}  {}\n",
        "ATTEMPT", "SHAPE", "BUDGET", "PEAK", "OUTCOME", "TIME", "MESSAGE"
    );
    for r in &report.attempts {
        let mut shape = format!("{}x{}", r.micro_batch, r.grad_accum);
        if !r.absorbed_ooms.is_empty() {
            shape = format!("{shape}->{}", r.final_shape.as_deref().unwrap_or("?"));
        }
        out.push_str(&format!(
            "{:<8} {:<10} {:<11} {:<26} {:<12} {:>7.1}s  {}\n",
            r.attempt,
            shape,
            human_bytes(r.budget_bytes),
            peak_text(r),
            r.outcome,
            r.seconds,
            r.message.as_deref().unwrap_or("")
        ));
    }
    out.push_str(&format!("job {}: {}", report.job, report.outcome));
    if let Some(message) = &report.message {
        out.push_str(&format!(": {message}"));
    }
    out.push('\n');
    out
}

/// Runs the command and prints the summary; the process's exit code follows
/// the job's outcome (0 succeeded, 1 failed).
pub fn main(args: &RunArgs) -> anyhow::Result<std::process::ExitCode> {
    let report = run(args)?;
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Table => print!("{}", report_table(&report)),
    }
    Ok(if report.outcome == "Succeeded" {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
