//! The counters a training process publishes in its stats folder
//! (docs/node-protocol.md): `alloc-<pid>-<device>.json` from the in-process
//! allocator and `shape-<pid>.json` from the Python helper, where `pid` is
//! the process's PID in its own namespace.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use k8s_openapi::jiff::Timestamp;
use vramfit::alloc::stats_file::{self, ReadError};
use vramfit::api::{AllocatorStats, ObservedShape};
use vramfit::job::shape_file;

/// Allocator counters older than this are ignored (the allocator rewrites
/// them every second while it runs).
pub const STALE_AFTER_MS: i64 = 10_000;

/// Logs a hostile or broken file once per path, not every second.
fn report_bad_file(path: &Path, error: &ReadError) {
    static SEEN: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if seen.insert(path.to_owned()) {
        tracing::warn!(path = %path.display(), "skipping a stats file: {error}");
    }
}

fn rfc3339(unix_ms: i64) -> String {
    Timestamp::from_millisecond(unix_ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The allocator counters of process `pid` (its namespace PID) on its CUDA
/// device `device`, unless missing, unreadable, not a regular file, too
/// large, of another version or stale at `now_ms`.
pub fn read_allocator(dir: &Path, pid: u32, device: u32, now_ms: i64) -> Option<AllocatorStats> {
    let file = stats_file::read(dir, pid, device)
        .inspect_err(|e| {
            if e.is_bad_file() {
                report_bad_file(&stats_file::path_for(dir, pid, device), e);
            }
        })
        .ok()?;
    let updated = i64::try_from(file.updated_unix_ms).unwrap_or(i64::MAX);
    if now_ms.saturating_sub(updated) > STALE_AFTER_MS {
        return None;
    }
    let c = file.counters;
    Some(AllocatorStats {
        policy: c.policy,
        budget_bytes: c.budget_bytes,
        allocated_bytes: c.allocated_bytes,
        reserved_bytes: c.reserved_bytes,
        peak_allocated_bytes: c.peak_allocated_bytes,
        peak_reserved_bytes: c.peak_reserved_bytes,
        num_ooms: c.num_ooms,
        updated: Some(rfc3339(updated)),
    })
}

/// The batch shape process `pid` (its namespace PID) reports, unless missing,
/// unreadable or of another version. It is written only when the shape
/// changes, so it has no age limit; the caller checks the process runs.
pub fn read_shape(dir: &Path, pid: u32) -> Option<ObservedShape> {
    let path = shape_file::path_for(dir, pid);
    shape_file::read(&path)
        .inspect_err(|e| {
            if e.is_bad_file() {
                report_bad_file(&path, e);
            }
        })
        .ok()
        .map(|f| f.observed())
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

    #[test]
    fn hostile_files_are_skipped_without_blocking_or_reading_them_whole() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("alloc-1-0.json")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("shape-1.json")).unwrap();
        let fifo = std::ffi::CString::new(
            dir.path()
                .join("shape-2.json")
                .as_os_str()
                .as_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let d = dir.path().to_owned();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tx.send((
                read_allocator(&d, 1, 0, NOW),
                read_shape(&d, 1),
                read_shape(&d, 2),
            ))
            .unwrap()
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("a stats read blocked");
        assert_eq!(got, (None, None, None));
    }
}
