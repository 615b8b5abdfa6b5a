//! Step time against the micro-batch, at a fixed global batch: what a smaller
//! micro-batch costs. A curve holds measured points (seconds per optimizer
//! step at some micro-batches, e.g. `scripts/gpu/step_time.py` on the H200,
//! docs/benchmarks/step-time.md) and answers for any micro-batch by
//! interpolating linearly in log2(micro) between them.
//!
//! Outside the measured range the curve is pessimistic: below the smallest
//! measured micro-batch every micro-step is taken to cost as much as there
//! (the step time grows as `1 / micro`, a launch-bound model), and above the
//! largest nothing is gained. A placer that trades step time for memory
//! therefore never counts on a speed-up it has not seen.

/// Measured seconds per optimizer step at a fixed global batch, by micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimeCurve {
    /// (micro-batch, seconds per step), micro-batches strictly ascending.
    points: Vec<(u32, f64)>,
}

impl StepTimeCurve {
    /// A curve through `points` (any order). Fails on no points, a
    /// micro-batch of 0, a repeated micro-batch or a time that is not a
    /// positive finite number.
    pub fn new(mut points: Vec<(u32, f64)>) -> Result<Self, String> {
        if points.is_empty() {
            return Err("a step-time curve needs at least one point".into());
        }
        points.sort_by_key(|p| p.0);
        for (i, &(micro, seconds)) in points.iter().enumerate() {
            if micro == 0 {
                return Err("micro-batch 0 in a step-time curve".into());
            }
            if !(seconds.is_finite() && seconds > 0.0) {
                return Err(format!(
                    "step time {seconds} at micro-batch {micro} is not a positive number"
                ));
            }
            if i > 0 && points[i - 1].0 == micro {
                return Err(format!("micro-batch {micro} appears twice"));
            }
        }
        Ok(Self { points })
    }

    /// The measured points, ascending by micro-batch.
    pub fn points(&self) -> &[(u32, f64)] {
        &self.points
    }

    /// Seconds per optimizer step at `micro` (0 is taken as 1).
    pub fn step_seconds(&self, micro: u32) -> f64 {
        let micro = micro.max(1);
        let (first_micro, first_s) = self.points[0];
        let (last_micro, last_s) = self.points[self.points.len() - 1];
        if micro <= first_micro {
            return first_s * f64::from(first_micro) / f64::from(micro);
        }
        if micro >= last_micro {
            return last_s;
        }
        let upper = self.points.partition_point(|p| p.0 < micro);
        let (m1, s1) = self.points[upper - 1];
        let (m2, s2) = self.points[upper];
        if m2 == micro {
            return s2;
        }
        let x = |m: u32| f64::from(m).log2();
        let t = (x(micro) - x(m1)) / (x(m2) - x(m1));
        s1 + t * (s2 - s1)
    }

    /// Step time at `micro` relative to the time at `preferred`: 1.0 at the
    /// preferred micro-batch, above 1 where a smaller one is slower.
    pub fn relative(&self, micro: u32, preferred: u32) -> f64 {
        self.step_seconds(micro) / self.step_seconds(preferred)
    }
}

#[cfg(test)]
#[path = "step_time_tests.rs"]
mod tests;
