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
use crate::api::{AbsorbedOom, ObservedShape};

/// The format version the helper writes.
pub const VERSION: u32 = 1;
/// The largest shape file read; a real one is well under 4 KiB.
pub const MAX_FILE_BYTES: u64 = 64 << 10;
/// Absorbed OOMs kept from one file (the latest). Each one halves the
/// micro-batch, so a real process absorbs at most about 30.
pub const MAX_ABSORBED: usize = 32;

/// The file, as the helper writes it (fields the readers do not need are
/// left out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = r#"{"version": 1, "pid": 7, "microBatch": 8, "gradAccum": 8, "globalBatch": 64,
        "attempt": 1, "absorbedOoms": [{"fromMicro": 16, "toMicro": 8, "fromAccum": 4,
        "toAccum": 8, "unixMs": 1764547200000}]}"#;

    #[test]
    fn the_helpers_file_gives_shape_and_absorbed_ooms() {
        let file = parse(ONE.as_bytes()).unwrap();
        assert_eq!(file.shape(), BatchShape { micro: 8, accum: 8 });
        let observed = file.observed();
        assert_eq!((observed.micro_batch, observed.grad_accum), (8, 8));
        assert_eq!(observed.absorbed_ooms.len(), 1);
        let a = &observed.absorbed_ooms[0];
        assert_eq!(
            (a.from_micro, a.to_micro, a.from_accum, a.to_accum),
            (16, 8, 4, 8)
        );
        assert_eq!(a.time, "2025-12-01T00:00:00Z");
        let with_ms = ONE.replace("1764547200000", "1764547200123");
        assert_eq!(
            parse(with_ms.as_bytes()).unwrap().absorbed()[0].time,
            "2025-12-01T00:00:00.123Z"
        );
    }

    #[test]
    fn another_version_a_zero_shape_or_a_missing_key_is_refused() {
        for bad in [
            ONE.replace("\"version\": 1", "\"version\": 2"),
            ONE.replace("\"microBatch\": 8", "\"microBatch\": 0"),
            ONE.replace("\"gradAccum\": 8", "\"gradAccum\": 0"),
            ONE.replace("\"microBatch\": 8,", ""),
            r#"{"version": 1}"#.to_string(),
            "[[[[".to_string(),
        ] {
            assert!(
                matches!(parse(bad.as_bytes()), Err(ReadError::Format(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_hostile_list_of_absorbed_ooms_keeps_only_the_latest() {
        let entries: Vec<String> = (0..10_000)
            .map(|i| {
                format!(
                    r#"{{"fromMicro": 2, "toMicro": 1, "fromAccum": 1, "toAccum": 2, "unixMs": {i}}}"#
                )
            })
            .collect();
        let text = format!(
            r#"{{"version": 1, "microBatch": 1, "gradAccum": 2, "absorbedOoms": [{}]}}"#,
            entries.join(",")
        );
        // Over the size cap as a file: refused outright.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path_for(dir.path(), 1), &text).unwrap();
        assert!(matches!(
            read(&path_for(dir.path(), 1)),
            Err(ReadError::TooLarge(_))
        ));
        // Under it, the list is cut to the latest entries.
        let file = parse(text.as_bytes()).unwrap();
        assert_eq!(file.absorbed_ooms.len(), MAX_ABSORBED);
        assert_eq!(file.absorbed_ooms[0].unix_ms, 10_000 - MAX_ABSORBED as i64);
        assert_eq!(file.absorbed_ooms.last().unwrap().unix_ms, 9_999);
    }

    #[test]
    fn a_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("real.json"), ONE).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real.json"), path_for(dir.path(), 7)).unwrap();
        assert!(matches!(
            read(&path_for(dir.path(), 7)),
            Err(ReadError::NotRegular)
        ));
        assert!(read(&dir.path().join("real.json")).is_ok());
    }
}
