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
#[path = "stats_tests.rs"]
mod tests;
