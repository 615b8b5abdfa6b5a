//! The counters a training process publishes in its stats folder
//! (docs/node-protocol.md): `alloc-<pid>-<device>.json` from the in-process
//! allocator and `shape-<pid>.json` from the Python helper, where `pid` is
//! the process's PID in its own namespace.

use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
use vramfit::alloc::stats_file::{self, ReadError};
use vramfit::api::{AllocatorStats, ObservedShape};
use vramfit::job::shape_file;

/// Allocator counters older than this are ignored (the allocator rewrites
/// them every second while it runs).
pub const STALE_AFTER_MS: i64 = 10_000;

/// A file of a stats folder that was skipped as hostile or broken (not
/// missing): its path and why.
pub type BadFile = (PathBuf, String);

fn note_bad(bad: &mut Vec<BadFile>, path: PathBuf, error: &ReadError) {
    if error.is_bad_file() {
        bad.push((path, error.to_string()));
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
/// A file skipped as hostile or broken is added to `bad`.
pub fn read_allocator(
    dir: &Path,
    pid: u32,
    device: u32,
    now_ms: i64,
    bad: &mut Vec<BadFile>,
) -> Option<AllocatorStats> {
    let file = stats_file::read(dir, pid, device)
        .inspect_err(|e| note_bad(bad, stats_file::path_for(dir, pid, device), e))
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
/// A file skipped as hostile or broken is added to `bad`.
pub fn read_shape(dir: &Path, pid: u32, bad: &mut Vec<BadFile>) -> Option<ObservedShape> {
    let path = shape_file::path_for(dir, pid);
    shape_file::read(&path)
        .inspect_err(|e| note_bad(bad, path.clone(), e))
        .ok()
        .map(|f| f.observed())
}

#[cfg(test)]
#[path = "stats_tests.rs"]
mod tests;
