//! The OOM back-off: half the micro-batch, twice the accumulation, same global batch.

/// The batch shape of one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchShape {
    /// Micro-batch per GPU.
    pub micro: u32,
    /// Gradient-accumulation steps.
    pub accum: u32,
}

impl BatchShape {
    /// The shape for `micro` given the global batch and the GPU count, when
    /// `global` divides evenly (the CRD's CEL rule guarantees it for the start).
    pub fn for_micro(global: u32, micro: u32, gpus: u32) -> Option<Self> {
        let per_step = micro.checked_mul(gpus)?;
        (per_step > 0 && global.is_multiple_of(per_step)).then(|| Self {
            micro,
            accum: global / per_step,
        })
    }

    /// `micro x accum`, as the `kubectl get` column shows it.
    pub fn display(&self) -> String {
        format!("{}x{}", self.micro, self.accum)
    }
}

/// What to do after an attempt ran out of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OomDecision {
    /// Start another attempt with this shape.
    Retry(BatchShape),
    /// Give up, with the reason in words.
    Fail(String),
}

/// Decides the next attempt after an out-of-memory failure.
///
/// `oom_retries_used` counts the OOM retries already made. The next micro-batch
/// is the largest value not above half the current one that keeps
/// `global / (micro * gpus)` whole, so odd sizes still back off (12 -> 6 -> 3 ->
/// 1 for a global batch of 48); below `min_micro` or past `max_retries` the job
/// fails.
pub fn after_oom(
    global: u32,
    gpus: u32,
    current: BatchShape,
    min_micro: u32,
    oom_retries_used: u32,
    max_retries: u32,
) -> OomDecision {
    if oom_retries_used >= max_retries {
        return OomDecision::Fail(format!(
            "out of memory at micro-batch {} after {} retries (maxOOMRetries {})",
            current.micro, oom_retries_used, max_retries
        ));
    }
    let half = current.micro / 2;
    let next = (min_micro.max(1)..=half)
        .rev()
        .find_map(|micro| BatchShape::for_micro(global, micro, gpus));
    match next {
        Some(shape) => OomDecision::Retry(shape),
        None => OomDecision::Fail(format!(
            "out of memory at micro-batch {} and no smaller micro-batch at or above minMicro {} divides the global batch {} over {} GPU(s)",
            current.micro, min_micro, global, gpus
        )),
    }
}

#[cfg(test)]
#[path = "backoff_tests.rs"]
mod tests;
