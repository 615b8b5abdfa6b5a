//! What follows an attempt: one pure decision over how the attempt ended,
//! which the controller (over a pod) and `vramfit run --local` (over a local
//! process) both take, so the two loops cannot drift apart.
//!
//! Succeeded: the job is done. Failed: the job fails with the attempt's
//! reason, no retry. Out of memory (the exit protocol of [`super::exit`], or
//! the node agent's report, which wins over any exit): the next attempt at
//! half the micro-batch ([`after_oom`]), or a failure at `batch.minMicro` or
//! past `maxOOMRetries`.

use crate::api::TrainingJobSpec;
use crate::job::backoff::{BatchShape, OomDecision, after_oom};

/// How an attempt ended, from its pod or its process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Exited 0.
    Succeeded,
    /// Ran out of GPU memory: the OOM line, or who stopped it and why.
    OutOfMemory(String),
    /// Anything else, in words.
    Failed(String),
}

impl AttemptEnd {
    /// `Succeeded`, `OutOfMemory` or `Failed`: the outcome the job's history
    /// and the local run's report record.
    pub fn name(&self) -> &'static str {
        match self {
            AttemptEnd::Succeeded => "Succeeded",
            AttemptEnd::OutOfMemory(_) => "OutOfMemory",
            AttemptEnd::Failed(_) => "Failed",
        }
    }

    /// The message: the OOM line or why it failed; none for a success.
    pub fn message(&self) -> Option<&str> {
        match self {
            AttemptEnd::Succeeded => None,
            AttemptEnd::OutOfMemory(m) | AttemptEnd::Failed(m) => Some(m),
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
/// itself), `oom_retries_used` OOM retries made before it.
pub fn next_attempt(
    spec: &TrainingJobSpec,
    shape: BatchShape,
    end: &AttemptEnd,
    oom_retries_used: u32,
) -> NextAttempt {
    match end {
        AttemptEnd::Succeeded => NextAttempt::Done,
        AttemptEnd::Failed(reason) => NextAttempt::Fail(reason.clone()),
        AttemptEnd::OutOfMemory(_) => match after_oom(
            spec.batch.global,
            spec.gpus,
            shape,
            spec.batch.min_micro,
            oom_retries_used,
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
