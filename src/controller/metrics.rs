//! Prometheus metrics of the controller, served on `/metrics`.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set with the job phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// Pending, Placed, Running, Retrying, Succeeded or Failed.
    pub phase: String,
}

/// Label set with the kind of a reconcile error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    /// `conflict`, `not_found`, `throttled`, `server`, `rejected`,
    /// `transport`, `finalizer`, ... (see `controller::retry::error_kind`).
    pub error: String,
}

/// Every metric the controller exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// TrainingJobs by phase.
    pub jobs: Family<PhaseLabel, Gauge>,
    /// Seconds from a job's creation (or its retry) to its placement.
    pub placement_latency: Histogram,
    /// Seconds one scheduling cycle takes.
    pub cycle_seconds: Histogram,
    /// (predicted - measured) / measured of finished attempts.
    pub prediction_error: Histogram,
    /// OOM retries started.
    pub oom_retries: Counter,
    /// Jobs placed.
    pub placements: Counter,
    /// Placed statuses written after their pods by the status writer.
    pub status_writes_deferred: Counter,
    /// GPU memory committed to placed jobs, bytes.
    pub committed_bytes: Gauge,
    /// GPU memory of the usable GPUs, bytes.
    pub total_bytes: Gauge,
    /// Reconciles run.
    pub reconcile_runs: Counter,
    /// Reconciles that failed, by the kind of error.
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    /// Seconds one reconcile takes.
    pub reconcile_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Self {
            registry: Mutex::new(Registry::with_prefix("vramfit")),
            jobs: Family::default(),
            placement_latency: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            cycle_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            prediction_error: Histogram::new([
                -0.5, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.5, 1.0,
            ]),
            oom_retries: Counter::default(),
            placements: Counter::default(),
            status_writes_deferred: Counter::default(),
            committed_bytes: Gauge::default(),
            total_bytes: Gauge::default(),
            reconcile_runs: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
        };
        {
            let mut r = metrics.registry.lock().expect("registry lock");
            r.register(
                "trainingjobs",
                "TrainingJobs by phase",
                metrics.jobs.clone(),
            );
            r.register(
                "placement_latency_seconds",
                "Seconds from creation (or retry) to placement",
                metrics.placement_latency.clone(),
            );
            r.register(
                "scheduling_cycle_seconds",
                "Seconds one scheduling cycle takes",
                metrics.cycle_seconds.clone(),
            );
            r.register(
                "prediction_error_ratio",
                "(predicted - measured) / measured peak of finished attempts",
                metrics.prediction_error.clone(),
            );
            r.register(
                "oom_retries",
                "OOM retries started",
                metrics.oom_retries.clone(),
            );
            r.register("placements", "Placements made", metrics.placements.clone());
            r.register(
                "status_writes_deferred",
                "Placed statuses written after their pods by the status writer",
                metrics.status_writes_deferred.clone(),
            );
            r.register(
                "gpu_memory_committed_bytes",
                "GPU memory committed to placed jobs",
                metrics.committed_bytes.clone(),
            );
            r.register(
                "gpu_memory_total_bytes",
                "GPU memory of the usable GPUs",
                metrics.total_bytes.clone(),
            );
            r.register(
                "reconcile_runs",
                "Reconciles run",
                metrics.reconcile_runs.clone(),
            );
            r.register(
                "reconcile_errors",
                "Reconciles that failed, by kind of error",
                metrics.reconcile_errors.clone(),
            );
            r.register(
                "reconcile_duration_seconds",
                "Seconds one reconcile takes",
                metrics.reconcile_seconds.clone(),
            );
        }
        metrics
    }
}

impl Metrics {
    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        let registry = self.registry.lock().expect("registry lock");
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
