//! A simulated training process: its memory over time and how it ends.
//!
//! The process's memory grows linearly from the CUDA context to its true
//! peak over the first half of its run, then stays there. Like a real process
//! under vramfit's in-process allocator, it cannot take more than its budget:
//! when its true peak exceeds the budget it fails at the moment it would
//! cross it, with the OOM exit protocol (exit 42 and PyTorch's message).

use std::time::{Duration, Instant};

use vramfit::job::exit::{OOM_EXIT_CODE, OOM_MESSAGE_MARK};
use vramfit::quantity::parse_quantity;

/// Annotation that gives a simulated pod's true peak per GPU: a quantity
/// (`30Gi`), or `<fixed>+<per sample>` (`10Gi+2Gi`: 10 GiB plus 2 GiB per
/// sample of the pod's `VRAMFIT_MICRO_BATCH`, so halving the micro-batch
/// shrinks it). Without it the predictor's peak for the pod's job is used.
pub const PEAK_ANNOTATION: &str = "vramfit.dev/simulated-peak";

/// Annotation that gives a simulated pod's run time (`20s`, `2m`).
pub const RUN_ANNOTATION: &str = "vramfit.dev/simulated-run";

/// Annotation (`"true"`) for a simulated process that does not run under
/// vramfit's allocator: nothing in the process holds it to its budget, so it
/// grows to its true peak and only the agent's watchdog can stop it.
pub const UNBOUNDED_ANNOTATION: &str = "vramfit.dev/simulated-unbounded";

/// How a simulated process ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Exit code.
    pub code: i32,
    /// Termination message.
    pub message: String,
}

impl Exit {
    /// `Succeeded` (0) or `Failed`.
    pub fn phase(&self) -> &'static str {
        if self.code == 0 {
            "Succeeded"
        } else {
            "Failed"
        }
    }
}

/// The true peak `annotation` gives at micro-batch `micro`; `None` when it
/// does not parse.
pub fn peak_from_annotation(annotation: &str, micro: u32) -> Option<u64> {
    match annotation.split_once('+') {
        Some((fixed, per_sample)) => {
            let fixed = parse_quantity(fixed.trim(), 1)?;
            let per_sample = parse_quantity(per_sample.trim(), 1)?;
            Some(fixed + per_sample * u64::from(micro))
        }
        None => parse_quantity(annotation.trim(), 1),
    }
}

/// One simulated process.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// When it started.
    pub started: Instant,
    /// How long it runs when nothing stops it.
    pub run_for: Duration,
    /// Memory right after start (the CUDA context).
    pub context_bytes: u64,
    /// The most memory it would use without a limit.
    pub true_peak_bytes: u64,
    /// The budget its in-process allocator holds it to (`None`: nothing
    /// does).
    pub budget_bytes: Option<u64>,
}

impl Workload {
    fn ramp(&self) -> Duration {
        self.run_for / 2
    }

    /// The memory its unlimited self would use at `now`.
    fn wanted_at(&self, now: Instant) -> u64 {
        let ramp = self.ramp().as_secs_f64();
        let share = if ramp <= 0.0 {
            1.0
        } else {
            (now.saturating_duration_since(self.started).as_secs_f64() / ramp).min(1.0)
        };
        let low = self.context_bytes.min(self.true_peak_bytes);
        low + ((self.true_peak_bytes - low) as f64 * share) as u64
    }

    /// When it runs out of its budget, if it does.
    fn oom_at(&self) -> Option<Instant> {
        let budget = self.budget_bytes?;
        if self.true_peak_bytes <= budget {
            return None;
        }
        let low = self.context_bytes.min(self.true_peak_bytes);
        let share = budget.saturating_sub(low) as f64 / (self.true_peak_bytes - low) as f64;
        Some(self.started + self.ramp().mul_f64(share.clamp(0.0, 1.0)))
    }

    /// Bytes it uses at `now` (never more than its budget).
    pub fn used_at(&self, now: Instant) -> u64 {
        let wanted = self.wanted_at(now);
        self.budget_bytes.map_or(wanted, |b| wanted.min(b))
    }

    /// How it ended by `now`, if it did.
    pub fn exit_at(&self, now: Instant) -> Option<Exit> {
        if let Some(at) = self.oom_at()
            && now >= at
        {
            let budget = self.budget_bytes.unwrap_or_default();
            return Some(Exit {
                code: OOM_EXIT_CODE,
                message: format!(
                    "torch.OutOfMemoryError: {OOM_MESSAGE_MARK}. Tried to allocate {:.2} GiB \
                     (simulated: true peak {:.2} GiB, budget {:.2} GiB)",
                    (self.true_peak_bytes - budget) as f64 / GIB,
                    self.true_peak_bytes as f64 / GIB,
                    budget as f64 / GIB
                ),
            });
        }
        (now >= self.started + self.run_for).then(|| Exit {
            code: 0,
            message: String::new(),
        })
    }
}

const GIB: f64 = (1u64 << 30) as f64;

#[cfg(test)]
#[path = "workload_tests.rs"]
mod tests;
