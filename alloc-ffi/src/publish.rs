//! `alloc-<pid>-<device>.json` in `VRAMFIT_STATS_DIR` (docs/node-protocol.md);
//! the schema and the atomic write are `vramfit_alloc_core::stats_file`'s.

use std::time::{SystemTime, UNIX_EPOCH};

pub use vramfit_alloc_core::stats_file::write;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
