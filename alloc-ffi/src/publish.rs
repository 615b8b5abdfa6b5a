//! `alloc-<pid>-<device>.json` in `VRAMFIT_STATS_DIR` (docs/node-protocol.md).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::state::Published;

/// The file's content, field for field as docs/node-protocol.md shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatsFile<'a> {
    /// Format version (1).
    pub version: u32,
    /// The process's PID in its own PID namespace.
    pub pid: u32,
    /// Device index.
    pub device: u32,
    /// `pytorch` or `vramfit`.
    pub policy: &'a str,
    /// Budget in bytes (0: none).
    pub budget_bytes: u64,
    /// Bytes in live blocks.
    pub allocated_bytes: u64,
    /// Bytes held from the driver.
    pub reserved_bytes: u64,
    /// Highest allocated bytes since the process started.
    pub peak_allocated_bytes: u64,
    /// Highest reserved bytes since the process started.
    pub peak_reserved_bytes: u64,
    /// Out-of-memory errors since the process started.
    pub num_ooms: u64,
    /// When it was written (milliseconds since the Unix epoch).
    pub updated_unix_ms: u64,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The file's path for `pid` and `device` under `dir`.
pub fn path_for(dir: &Path, pid: u32, device: u32) -> PathBuf {
    dir.join(format!("alloc-{pid}-{device}.json"))
}

/// Writes the counters atomically: a temporary file in the same folder,
/// then a rename over the old one.
pub fn write(dir: &Path, pid: u32, stats: &Published, now_ms: u64) -> std::io::Result<()> {
    let file = StatsFile {
        version: 1,
        pid,
        device: stats.device,
        policy: &stats.policy,
        budget_bytes: stats.budget_bytes,
        allocated_bytes: stats.allocated_bytes,
        reserved_bytes: stats.reserved_bytes,
        peak_allocated_bytes: stats.peak_allocated_bytes,
        peak_reserved_bytes: stats.peak_reserved_bytes,
        num_ooms: stats.num_ooms,
        updated_unix_ms: now_ms,
    };
    let target = path_for(dir, pid, stats.device);
    let temp = dir.join(format!(".alloc-{pid}-{}.json.tmp", stats.device));
    let mut out = std::fs::File::create(&temp)?;
    out.write_all(&serde_json::to_vec(&file).map_err(std::io::Error::other)?)?;
    drop(out);
    std::fs::rename(&temp, &target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_has_the_protocol_fields_and_replaces_the_old_one() {
        let dir = std::env::temp_dir().join(format!("vramfit-publish-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut stats = Published {
            device: 1,
            policy: "vramfit".into(),
            budget_bytes: 4 << 30,
            allocated_bytes: 1 << 30,
            reserved_bytes: 2 << 30,
            peak_allocated_bytes: 3 << 30,
            peak_reserved_bytes: 3 << 30,
            num_ooms: 0,
        };
        write(&dir, 7, &stats, 1000).unwrap();
        stats.num_ooms = 1;
        write(&dir, 7, &stats, 2000).unwrap();
        let text = std::fs::read_to_string(dir.join("alloc-7-1.json")).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut expected = vec![
            "version",
            "pid",
            "device",
            "policy",
            "budgetBytes",
            "allocatedBytes",
            "reservedBytes",
            "peakAllocatedBytes",
            "peakReservedBytes",
            "numOoms",
            "updatedUnixMs",
        ];
        let mut keys_sorted = keys.clone();
        keys_sorted.sort();
        expected.sort();
        assert_eq!(keys_sorted, expected);
        assert_eq!(value["numOoms"], 1);
        assert_eq!(value["updatedUnixMs"], 2000);
        assert_eq!(value["budgetBytes"], 4u64 << 30);
        // Only the final file is left: the temporary one was renamed.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("alloc-7-1.json")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
