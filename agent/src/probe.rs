//! Probe results and the rules that judge them.

use serde::{Deserialize, Serialize};
use vramfit::api::{GpuHealth, ProbeStatus};

/// Share of the expected copy bandwidth under which a GPU counts as throttled.
pub const THROTTLE_SHARE: f64 = 0.7;

/// What one probe of a GPU found; small enough for the `GpuNode` status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProbeResult {
    /// Healthy: no pattern errors and bandwidth above the throttle line.
    pub ok: bool,
    /// Device name as the driver reports it.
    pub gpu_name: String,
    /// Device-to-device copy rate, counting bytes read plus bytes written.
    pub bandwidth_gbps: f64,
    /// What this model should reach (0 when unknown).
    pub expected_bandwidth_gbps: f64,
    /// Bytes allocated, written and read back.
    pub tested_bytes: u64,
    /// Bytes the driver reported free before the probe.
    pub free_bytes_before: u64,
    /// Total bytes of the device.
    pub total_bytes: u64,
    /// 32-bit words that read back differently from what was written.
    pub errors: u64,
    /// Wall time of the whole probe.
    pub duration_ms: f64,
    /// Human summary (why not ok, when not).
    pub message: String,
}

impl ProbeResult {
    /// The probe as `GpuNode.status.gpus[].probe` carries it, stamped with
    /// the time it ran (RFC 3339).
    pub fn to_status(&self, time: String) -> ProbeStatus {
        ProbeStatus {
            ok: self.ok,
            bandwidth_gbps: self.bandwidth_gbps,
            tested_bytes: self.tested_bytes,
            errors: self.errors,
            time: Some(time),
            message: Some(self.message.clone()),
        }
    }

    /// The health the `GpuNode` status reports for this probe: memory errors
    /// make a GPU faulty, a slow copy only degraded.
    pub fn health(&self) -> GpuHealth {
        if self.errors > 0 {
            GpuHealth::Faulty
        } else if self.ok {
            GpuHealth::Healthy
        } else {
            GpuHealth::Degraded
        }
    }
}

/// Device-to-device copy rate (read + write) a healthy GPU of this model
/// reaches, in GB/s; `None` for models we have no figure for.
pub fn expected_bandwidth_gbps(gpu_name: &str) -> Option<f64> {
    let name = gpu_name.to_ascii_uppercase();
    // Measured through a large device-to-device copy on an H200 (4.3 TB/s);
    // others scaled from their HBM datasheet rates by the same efficiency.
    [
        ("H200", 4300.0),
        ("H100", 3000.0),
        ("A100", 1750.0),
        ("L40S", 780.0),
        ("L4", 270.0),
    ]
    .into_iter()
    .find(|(model, _)| name.contains(model))
    .map(|(_, gbps)| gbps)
}

/// Fills in `ok` and `message` from the measurements.
pub fn judge(mut result: ProbeResult) -> ProbeResult {
    let mut problems = Vec::new();
    if result.errors > 0 {
        problems.push(format!(
            "{} words of {} read back wrong: faulty memory",
            result.errors,
            result.tested_bytes / 4
        ));
    }
    if result.expected_bandwidth_gbps > 0.0
        && result.bandwidth_gbps < THROTTLE_SHARE * result.expected_bandwidth_gbps
    {
        problems.push(format!(
            "copy bandwidth {:.0} GB/s is below {:.0}% of the {:.0} GB/s expected: throttled",
            result.bandwidth_gbps,
            THROTTLE_SHARE * 100.0,
            result.expected_bandwidth_gbps
        ));
    }
    if result.tested_bytes == 0 {
        problems.push("no memory could be allocated for the test".to_owned());
    }
    result.ok = problems.is_empty();
    result.message = if result.ok {
        format!(
            "healthy: {:.1} GiB written and read back, {:.0} GB/s copy",
            result.tested_bytes as f64 / (1u64 << 30) as f64,
            result.bandwidth_gbps
        )
    } else {
        problems.join("; ")
    };
    result
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
