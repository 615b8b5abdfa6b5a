//! `alloc-<pid>-<device>.json`: the counters the in-process allocator
//! publishes in `VRAMFIT_STATS_DIR` and the node agent reads
//! (docs/node-protocol.md). Defined once here for both sides.
//!
//! The folder is writable by the training process, which the agent does not
//! trust: [`read_untrusted`] opens a file without following a symbolic link or
//! blocking on a FIFO, accepts regular files only and reads at most a cap.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The format version this crate writes and accepts.
pub const VERSION: u32 = 1;

/// The largest stats file the agent reads; a real one is about 300 bytes.
pub const MAX_FILE_BYTES: u64 = 64 << 10;

/// What the allocator knows of one device; the publisher adds the PID and
/// the time.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AllocCounters {
    /// CUDA device index as the process sees it.
    pub device: u32,
    /// `pytorch` or `vramfit`.
    pub policy: String,
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
}

/// The whole file, field for field as docs/node-protocol.md shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocStatsFile {
    /// Format version ([`VERSION`]).
    pub version: u32,
    /// The process's PID in its own PID namespace (the agent matches it with
    /// the `NSpid` line of `/proc/<pid>/status`).
    #[serde(default)]
    pub pid: u32,
    /// The counters.
    #[serde(flatten)]
    pub counters: AllocCounters,
    /// When it was written (milliseconds since the Unix epoch).
    #[serde(default)]
    pub updated_unix_ms: u64,
}

/// The file's name for `pid` (namespace PID) and `device`.
pub fn file_name(pid: u32, device: u32) -> String {
    format!("alloc-{pid}-{device}.json")
}

/// The file's path under `dir`.
pub fn path_for(dir: &Path, pid: u32, device: u32) -> PathBuf {
    dir.join(file_name(pid, device))
}

/// Writes `counters` of process `pid` atomically: a temporary file in the
/// same folder, then a rename over the old one, so a reader never sees half
/// a file.
pub fn write(dir: &Path, pid: u32, counters: &AllocCounters, now_ms: u64) -> std::io::Result<()> {
    let file = AllocStatsFile {
        version: VERSION,
        pid,
        counters: counters.clone(),
        updated_unix_ms: now_ms,
    };
    let device = counters.device;
    let temp = dir.join(format!(".alloc-{pid}-{device}.json.tmp"));
    let mut out = std::fs::File::create(&temp)?;
    out.write_all(&serde_json::to_vec(&file).map_err(std::io::Error::other)?)?;
    drop(out);
    std::fs::rename(&temp, path_for(dir, pid, device))
}

/// Why a stats file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// No such file: the process has not published (yet).
    #[error("missing")]
    Missing,
    /// A symbolic link, FIFO, device or folder where a regular file belongs.
    #[error("not a regular file")]
    NotRegular,
    /// Larger than the cap.
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    /// Reading failed.
    #[error("{0}")]
    Io(#[source] std::io::Error),
    /// Not the format, or another version.
    #[error("not a version-{VERSION} stats file: {0}")]
    Format(String),
}

impl ReadError {
    /// Whether the file is hostile or broken rather than merely absent: the
    /// agent reports those once.
    pub fn is_bad_file(&self) -> bool {
        !matches!(self, ReadError::Missing)
    }
}

/// Reads at most `cap` bytes of the regular file at `path`, refusing a
/// symbolic link (`O_NOFOLLOW`), a FIFO or device (opened `O_NONBLOCK`, so
/// opening never waits for a writer, then refused by its type) and anything
/// larger than `cap`.
pub fn read_untrusted(path: &Path, cap: u64) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => ReadError::Missing,
            Some(libc::ELOOP) => ReadError::NotRegular,
            _ => ReadError::Io(e),
        })?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > cap {
        return Err(ReadError::TooLarge(cap));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow between the stat and the read: never past the cap.
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > cap {
        return Err(ReadError::TooLarge(cap));
    }
    Ok(bytes)
}

/// Reads and parses the counters of process `pid` on `device` under `dir`.
pub fn read(dir: &Path, pid: u32, device: u32) -> Result<AllocStatsFile, ReadError> {
    let bytes = read_untrusted(&path_for(dir, pid, device), MAX_FILE_BYTES)?;
    let file: AllocStatsFile =
        serde_json::from_slice(&bytes).map_err(|e| ReadError::Format(e.to_string()))?;
    if file.version != VERSION {
        return Err(ReadError::Format(format!("version {}", file.version)));
    }
    Ok(file)
}

#[cfg(test)]
#[path = "stats_file_tests.rs"]
mod tests;
