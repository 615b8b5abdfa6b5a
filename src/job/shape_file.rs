//! `shape-<pid>.json`: the batch shape a training process runs with and the
//! OOMs it absorbed in process, written by the Python helper into its stats
//! folder (docs/node-protocol.md) and read by the node agent and by
//! `vramfit run --local`.
//!
//! The folder belongs to the training process, so the file is read as
//! untrusted input: no link followed, no FIFO waited on, at most
//! [`MAX_FILE_BYTES`], and at most [`MAX_ABSORBED`] absorbed OOMs kept (the
//! latest), so a hostile list cannot make the GpuNode status too large to
//! write.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vramfit_alloc_core::stats_file::{ReadError, read_untrusted};

use super::backoff::BatchShape;
use crate::api::{AbsorbedOom, ObservedShape, ReportedProgress};

/// The format version the helper writes.
pub const VERSION: u32 = 1;
/// The largest shape file read; a real one is well under 4 KiB.
pub const MAX_FILE_BYTES: u64 = 64 << 10;
/// Absorbed OOMs kept from one file (the latest). Each one halves the
/// micro-batch, so a real process absorbs at most about 30.
pub const MAX_ABSORBED: usize = 32;

/// The file, as the helper writes it (fields the readers do not need are
/// left out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShapeFile {
    /// Format version ([`VERSION`]).
    pub version: u32,
    /// The micro-batch the process runs with now.
    pub micro_batch: u32,
    /// Its gradient accumulation.
    pub grad_accum: u32,
    /// OOMs the process absorbed by halving its micro-batch, oldest first.
    #[serde(default)]
    pub absorbed_ooms: Vec<AbsorbedEntry>,
    /// How far the training has come, when the helper reports it (older
    /// helpers do not). A malformed value is dropped, not the file: the shape
    /// stays readable.
    #[serde(default, deserialize_with = "lenient_progress")]
    pub progress: Option<ProgressEntry>,
}

/// The training's progress as the helper writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressEntry {
    /// Optimizer steps done.
    pub steps: u64,
    /// Optimizer steps in all, when the script knows.
    #[serde(default)]
    pub total_steps: Option<u64>,
    /// Smoothed seconds per optimizer step, once measured.
    #[serde(default)]
    pub seconds_per_step: Option<f64>,
    /// When `steps` was counted (milliseconds since the Unix epoch).
    pub unix_ms: i64,
}

/// `progress` when it is an object of the right form, else `None`; a
/// `totalSteps` of 0 and a step time that is not a positive finite number
/// are dropped.
fn lenient_progress<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<ProgressEntry>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    let Some(mut entry) = value.and_then(|v| serde_json::from_value::<ProgressEntry>(v).ok())
    else {
        return Ok(None);
    };
    entry.total_steps = entry.total_steps.filter(|&t| t > 0);
    entry.seconds_per_step = entry.seconds_per_step.filter(|s| s.is_finite() && *s > 0.0);
    Ok(Some(entry))
}

/// One OOM absorbed in process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AbsorbedEntry {
    /// Micro-batch before.
    pub from_micro: u32,
    /// Micro-batch after.
    pub to_micro: u32,
    /// Accumulation before.
    pub from_accum: u32,
    /// Accumulation after.
    pub to_accum: u32,
    /// When (milliseconds since the Unix epoch).
    #[serde(default)]
    pub unix_ms: i64,
}

/// The file's name for process `pid` (its namespace PID).
pub fn file_name(pid: u32) -> String {
    format!("shape-{pid}.json")
}

/// The file's path under `dir`.
pub fn path_for(dir: &Path, pid: u32) -> PathBuf {
    dir.join(file_name(pid))
}

/// Reads and checks the shape file at `path`.
pub fn read(path: &Path) -> Result<ShapeFile, ReadError> {
    let bytes = read_untrusted(path, MAX_FILE_BYTES)?;
    parse(&bytes)
}

/// Parses a shape file's bytes: version [`VERSION`], a micro-batch and an
/// accumulation of at least 1, at most [`MAX_ABSORBED`] absorbed OOMs kept.
pub fn parse(bytes: &[u8]) -> Result<ShapeFile, ReadError> {
    let mut file: ShapeFile =
        serde_json::from_slice(bytes).map_err(|e| ReadError::Format(e.to_string()))?;
    if file.version != VERSION {
        return Err(ReadError::Format(format!("version {}", file.version)));
    }
    if file.micro_batch == 0 || file.grad_accum == 0 {
        return Err(ReadError::Format(
            "microBatch and gradAccum must be at least 1".into(),
        ));
    }
    let excess = file.absorbed_ooms.len().saturating_sub(MAX_ABSORBED);
    file.absorbed_ooms.drain(..excess);
    Ok(file)
}

/// RFC 3339 in UTC, milliseconds only when there are any.
fn rfc3339(unix_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(unix_ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
        .unwrap_or_default()
}

impl ShapeFile {
    /// The shape the process runs with.
    pub fn shape(&self) -> BatchShape {
        BatchShape {
            micro: self.micro_batch,
            accum: self.grad_accum,
        }
    }

    /// The absorbed OOMs as the API reports them.
    pub fn absorbed(&self) -> Vec<AbsorbedOom> {
        self.absorbed_ooms
            .iter()
            .map(|a| AbsorbedOom {
                from_micro: a.from_micro,
                to_micro: a.to_micro,
                from_accum: a.from_accum,
                to_accum: a.to_accum,
                time: rfc3339(a.unix_ms),
            })
            .collect()
    }

    /// The shape as a GpuNode reports it.
    pub fn observed(&self) -> ObservedShape {
        ObservedShape {
            micro_batch: self.micro_batch,
            grad_accum: self.grad_accum,
            absorbed_ooms: self.absorbed(),
            progress: self.progress.as_ref().map(|p| ReportedProgress {
                steps: p.steps,
                total_steps: p.total_steps,
                seconds_per_step: p.seconds_per_step,
                time: rfc3339(p.unix_ms),
            }),
        }
    }
}

#[cfg(test)]
#[path = "shape_file_tests.rs"]
mod tests;
