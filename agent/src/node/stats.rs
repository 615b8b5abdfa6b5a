//! The counters a training process publishes in its stats folder
//! (docs/node-protocol.md): `alloc-<pid>-<device>.json` from the in-process
//! allocator and `shape-<pid>.json` from the Python helper, where `pid` is
//! the process's PID in its own namespace.

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use vramfit::api::{AbsorbedOom, AllocatorStats, ObservedShape};

/// Allocator counters older than this are ignored (the allocator rewrites
/// them every second while it runs).
pub const STALE_AFTER_MS: i64 = 10_000;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AllocFile {
    version: u32,
    policy: String,
    #[serde(default)]
    budget_bytes: u64,
    #[serde(default)]
    allocated_bytes: u64,
    #[serde(default)]
    reserved_bytes: u64,
    #[serde(default)]
    peak_allocated_bytes: u64,
    #[serde(default)]
    peak_reserved_bytes: u64,
    #[serde(default)]
    num_ooms: u64,
    #[serde(default)]
    updated_unix_ms: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShapeFile {
    version: u32,
    micro_batch: u32,
    grad_accum: u32,
    #[serde(default)]
    absorbed_ooms: Vec<AbsorbedFile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AbsorbedFile {
    from_micro: u32,
    to_micro: u32,
    from_accum: u32,
    to_accum: u32,
    #[serde(default)]
    unix_ms: i64,
}

fn rfc3339(unix_ms: i64) -> String {
    Timestamp::from_millisecond(unix_ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The allocator counters of process `pid` (its namespace PID) on its CUDA
/// device `device`, unless missing, unreadable, of another version or stale
/// at `now_ms`.
pub fn read_allocator(dir: &Path, pid: u32, device: u32, now_ms: i64) -> Option<AllocatorStats> {
    let text = std::fs::read_to_string(dir.join(format!("alloc-{pid}-{device}.json"))).ok()?;
    let file: AllocFile = serde_json::from_str(&text)
        .inspect_err(|e| tracing::debug!(pid, device, "unreadable allocator counters: {e}"))
        .ok()?;
    if file.version != 1 || now_ms - file.updated_unix_ms > STALE_AFTER_MS {
        return None;
    }
    Some(AllocatorStats {
        policy: file.policy,
        budget_bytes: file.budget_bytes,
        allocated_bytes: file.allocated_bytes,
        reserved_bytes: file.reserved_bytes,
        peak_allocated_bytes: file.peak_allocated_bytes,
        peak_reserved_bytes: file.peak_reserved_bytes,
        num_ooms: file.num_ooms,
        updated: Some(rfc3339(file.updated_unix_ms)),
    })
}

/// The batch shape process `pid` (its namespace PID) reports, unless missing,
/// unreadable or of another version. It is written only when the shape
/// changes, so it has no age limit; the caller checks the process runs.
pub fn read_shape(dir: &Path, pid: u32) -> Option<ObservedShape> {
    let text = std::fs::read_to_string(dir.join(format!("shape-{pid}.json"))).ok()?;
    let file: ShapeFile = serde_json::from_str(&text)
        .inspect_err(|e| tracing::debug!(pid, "unreadable shape file: {e}"))
        .ok()?;
    if file.version != 1 {
        return None;
    }
    Some(ObservedShape {
        micro_batch: file.micro_batch,
        grad_accum: file.grad_accum,
        absorbed_ooms: file
            .absorbed_ooms
            .into_iter()
            .map(|a| AbsorbedOom {
                from_micro: a.from_micro,
                to_micro: a.to_micro,
                from_accum: a.from_accum,
                to_accum: a.to_accum,
                time: rfc3339(a.unix_ms),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_547_200_000;

    fn alloc_json(updated: i64) -> String {
        format!(
            r#"{{"version": 1, "pid": 1, "device": 0, "policy": "vramfit",
               "budgetBytes": 100, "allocatedBytes": 10, "reservedBytes": 20,
               "peakAllocatedBytes": 30, "peakReservedBytes": 40, "numOoms": 2,
               "updatedUnixMs": {updated}}}"#
        )
    }

    #[test]
    fn allocator_counters_are_read_unless_stale_or_of_another_version() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("alloc-1-0.json"), alloc_json(NOW - 1000)).unwrap();
        let stats = read_allocator(dir.path(), 1, 0, NOW).unwrap();
        assert_eq!(
            (
                stats.reserved_bytes,
                stats.peak_reserved_bytes,
                stats.num_ooms
            ),
            (20, 40, 2)
        );
        assert_eq!(stats.policy, "vramfit");
        assert!(stats.updated.unwrap().starts_with("2025-11-30T23:59:59"));
        assert_eq!(
            read_allocator(dir.path(), 1, 1, NOW),
            None,
            "another device"
        );
        assert_eq!(read_allocator(dir.path(), 2, 0, NOW), None, "another pid");
        assert_eq!(
            read_allocator(dir.path(), 1, 0, NOW + STALE_AFTER_MS + 1001),
            None,
            "stale"
        );
        std::fs::write(
            dir.path().join("alloc-1-0.json"),
            alloc_json(NOW).replace("\"version\": 1", "\"version\": 2"),
        )
        .unwrap();
        assert_eq!(read_allocator(dir.path(), 1, 0, NOW), None, "version 2");
        std::fs::write(dir.path().join("alloc-1-0.json"), "{\"vers").unwrap();
        assert_eq!(read_allocator(dir.path(), 1, 0, NOW), None, "half a file");
    }

    #[test]
    fn shape_files_carry_absorbed_ooms() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("shape-7.json"),
            r#"{"version": 1, "pid": 7, "microBatch": 8, "gradAccum": 8, "globalBatch": 64,
               "attempt": 1, "absorbedOoms": [{"fromMicro": 16, "toMicro": 8, "fromAccum": 4,
               "toAccum": 8, "unixMs": 1764547200000}]}"#,
        )
        .unwrap();
        let shape = read_shape(dir.path(), 7).unwrap();
        assert_eq!((shape.micro_batch, shape.grad_accum), (8, 8));
        assert_eq!(shape.absorbed_ooms.len(), 1);
        assert_eq!(shape.absorbed_ooms[0].from_micro, 16);
        assert_eq!(shape.absorbed_ooms[0].time, "2025-12-01T00:00:00Z");
        assert_eq!(read_shape(dir.path(), 8), None);
    }
}
