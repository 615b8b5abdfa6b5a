//! What follows an attempt: one pure decision over how the attempt ended,
//! which the controller (over a pod) and `vramfit run --local` (over a local
//! process) both take, so the two loops cannot drift apart.
//!
//! Succeeded: the job is done. Failed: the job fails with the attempt's
//! reason, no retry. Out of memory (the exit protocol of [`super::exit`], or
//! the node agent's report, which wins over any exit): the next attempt at
//! half the micro-batch ([`after_oom`]), or a failure at `batch.minMicro` or
//! past `maxOOMRetries`. No GPU (the exit protocol of [`super::exit`] for a
//! container started without its GPU): the next attempt at the same shape,
//! at most [`MAX_NO_GPU_RETRIES`] times per job; it is not an OOM and does
//! not count against `maxOOMRetries`.

use crate::api::TrainingJobSpec;
use crate::job::backoff::{BatchShape, OomDecision, after_oom};

/// How an attempt ended, from its pod or its process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Exited 0.
    Succeeded,
    /// Ran out of GPU memory: the OOM line, or who stopped it and why.
    OutOfMemory(String),
    /// Its container had no GPU device although it was placed on one.
    NoGpu(String),
    /// Anything else, in words.
    Failed(String),
}

/// Attempts of one job that may end without their GPU before the job fails:
/// enough to outlast the replacement of a node's device plugin, few enough
/// that a node that never gives GPUs fails the job within minutes.
pub const MAX_NO_GPU_RETRIES: u32 = 5;

impl AttemptEnd {
    /// `Succeeded`, `OutOfMemory`, `NoGpu` or `Failed`: the outcome the job's history
    /// and the local run's report record.
    pub fn name(&self) -> &'static str {
        match self {
            AttemptEnd::Succeeded => "Succeeded",
            AttemptEnd::OutOfMemory(_) => "OutOfMemory",
            AttemptEnd::NoGpu(_) => "NoGpu",
            AttemptEnd::Failed(_) => "Failed",
        }
    }

    /// The message: the OOM line or why it failed; none for a success.
    pub fn message(&self) -> Option<&str> {
        match self {
            AttemptEnd::Succeeded => None,
            AttemptEnd::OutOfMemory(m) | AttemptEnd::NoGpu(m) | AttemptEnd::Failed(m) => Some(m),
        }
    }

    /// The end once the node agent's OOM report, when there is one, is
    /// counted: it wins over the exit (the agent saw the attempt over its
    /// budget past the grace period, whatever the exit says; docs/agent.md).
    /// `report` is the message the attempt's end then carries.
    pub fn or_stopped_by_agent(self, report: Option<String>) -> Self {
        match report {
            Some(message) => AttemptEnd::OutOfMemory(message),
            None => self,
        }
    }
}

/// The retries a job made before an attempt, by why.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetriesUsed {
    /// After an OOM (count against `maxOOMRetries`).
    pub oom: u32,
    /// After an attempt that started without its GPU.
    pub no_gpu: u32,
}

/// What follows an attempt that ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextAttempt {
    /// Stop: the job succeeded.
    Done,
    /// Run another attempt with this shape.
    Retry(BatchShape),
    /// Stop: the job failed, with the reason.
    Fail(String),
}

/// Decides what follows an attempt of a job of `spec` that ended with `end`
/// at `shape` (the shape its process ended with, after any OOM it absorbed
/// itself), after `used` retries of the job.
pub fn next_attempt(
    spec: &TrainingJobSpec,
    shape: BatchShape,
    end: &AttemptEnd,
    used: RetriesUsed,
) -> NextAttempt {
    match end {
        AttemptEnd::Succeeded => NextAttempt::Done,
        AttemptEnd::Failed(reason) => NextAttempt::Fail(reason.clone()),
        AttemptEnd::NoGpu(reason) if used.no_gpu >= MAX_NO_GPU_RETRIES => {
            NextAttempt::Fail(format!(
                "{} attempts started without their GPU; the last: {reason}. The node's \
                 device injection (the vramfit agent's NRI plugin) is not giving GPUs",
                used.no_gpu + 1
            ))
        }
        AttemptEnd::NoGpu(_) => NextAttempt::Retry(shape),
        AttemptEnd::OutOfMemory(_) => match after_oom(
            spec.batch.global,
            spec.gpus,
            shape,
            spec.batch.min_micro,
            used.oom,
            spec.max_oom_retries,
        ) {
            OomDecision::Retry(next) => NextAttempt::Retry(next),
            OomDecision::Fail(reason) => NextAttempt::Fail(reason),
        },
    }
}

#[cfg(test)]
#[path = "attempt_tests.rs"]
mod tests;
