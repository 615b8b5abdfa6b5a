//! What `vramfit run --local` learns from `nvidia-smi`: the GPUs, and the memory
//! the training processes use (NVML's per-process accounting, read through the
//! tool so that the controller binary needs no NVML library).

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

/// A local GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalGpu {
    /// NVML index.
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
}

const MIB: u64 = 1 << 20;

/// Parses `nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits`.
pub fn parse_gpus(text: &str) -> Result<Vec<LocalGpu>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let cols: Vec<&str> = line.split(',').map(str::trim).collect();
            let [index, uuid, total] = cols[..] else {
                return Err(format!("unexpected nvidia-smi line {line:?}"));
            };
            Ok(LocalGpu {
                index: index
                    .parse()
                    .map_err(|_| format!("bad GPU index in {line:?}"))?,
                uuid: uuid.to_string(),
                total_bytes: total
                    .parse::<u64>()
                    .map_err(|_| format!("bad memory.total in {line:?}"))?
                    * MIB,
            })
        })
        .collect()
}

/// Parses `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`
/// into bytes per PID (a PID on several GPUs is summed; `[N/A]` counts as 0).
pub fn parse_compute_apps(text: &str) -> HashMap<u32, u64> {
    let mut used = HashMap::new();
    for line in text.lines() {
        let mut cols = line.split(',').map(str::trim);
        let (Some(pid), Some(mib)) = (cols.next(), cols.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let bytes = mib.parse::<u64>().unwrap_or(0) * MIB;
        *used.entry(pid).or_insert(0) += bytes;
    }
    used
}

/// Parses `nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits`.
pub fn parse_device_used(text: &str) -> HashMap<u32, u64> {
    text.lines()
        .filter_map(|line| {
            let mut cols = line.split(',').map(str::trim);
            let index = cols.next()?.parse().ok()?;
            let mib: u64 = cols.next()?.parse().ok()?;
            Some((index, mib * MIB))
        })
        .collect()
}

fn nvidia_smi(query: &str) -> Option<String> {
    let out = Command::new("nvidia-smi")
        .args([query, "--format=csv,noheader,nounits"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The machine's GPUs; empty without `nvidia-smi` or a driver.
pub fn local_gpus() -> Vec<LocalGpu> {
    nvidia_smi("--query-gpu=index,uuid,memory.total")
        .and_then(|t| parse_gpus(&t).ok())
        .unwrap_or_default()
}

/// How a peak was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakSource {
    /// NVML's memory of the attempt's processes.
    Process,
    /// The GPUs' used memory above what was in use before the attempt started
    /// (where NVML cannot see the processes, for example across PID namespaces).
    Device,
}

impl PeakSource {
    /// The name in the output.
    pub fn name(self) -> &'static str {
        match self {
            PeakSource::Process => "nvml-process",
            PeakSource::Device => "nvml-device",
        }
    }
}

/// Samples the memory of one attempt and keeps the highest value.
#[derive(Debug)]
pub struct PeakSampler {
    devices: Vec<u32>,
    baseline: HashMap<u32, u64>,
    /// Highest memory of the attempt's processes, summed.
    pub process_peak: u64,
    /// Highest device memory above the baseline, summed over the devices.
    pub device_peak: u64,
}

impl PeakSampler {
    /// Starts sampling `devices`, taking their current use as the baseline.
    pub fn new(devices: Vec<u32>) -> Self {
        let baseline = nvidia_smi("--query-gpu=index,memory.used")
            .map(|t| parse_device_used(&t))
            .unwrap_or_default();
        Self {
            devices,
            baseline,
            process_peak: 0,
            device_peak: 0,
        }
    }

    /// Takes one sample for the process tree `pids`.
    pub fn sample(&mut self, pids: &BTreeSet<u32>) {
        if let Some(text) = nvidia_smi("--query-compute-apps=pid,used_memory") {
            let used = parse_compute_apps(&text);
            let ours: u64 = pids.iter().filter_map(|p| used.get(p)).sum();
            self.process_peak = self.process_peak.max(ours);
        }
        if let Some(text) = nvidia_smi("--query-gpu=index,memory.used") {
            let used = parse_device_used(&text);
            let above: u64 = self
                .devices
                .iter()
                .map(|d| {
                    let now = used.get(d).copied().unwrap_or(0);
                    now.saturating_sub(self.baseline.get(d).copied().unwrap_or(0))
                })
                .sum();
            self.device_peak = self.device_peak.max(above);
        }
    }

    /// The peak and how it was measured; `None` when nothing was seen.
    pub fn peak(&self) -> Option<(u64, PeakSource)> {
        if self.process_peak > 0 {
            Some((self.process_peak, PeakSource::Process))
        } else if self.device_peak > 0 {
            Some((self.device_peak, PeakSource::Device))
        } else {
            None
        }
    }
}

/// `pid` and its descendants, read from `/proc` (a launcher such as torchrun
/// starts the processes that hold the GPU memory).
pub fn process_tree(pid: u32) -> BTreeSet<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
                && let Some(ppid) = parse_ppid(&stat)
            {
                parents.push((child, ppid));
            }
        }
    }
    descendants(pid, &parents)
}

/// The parent PID field of `/proc/<pid>/stat` (after the command in parentheses).
pub fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `root` and every process below it in `(pid, ppid)` pairs.
pub fn descendants(root: u32, pairs: &[(u32, u32)]) -> BTreeSet<u32> {
    let mut tree = BTreeSet::from([root]);
    loop {
        let before = tree.len();
        for (pid, ppid) in pairs {
            if tree.contains(ppid) {
                tree.insert(*pid);
            }
        }
        if tree.len() == before {
            return tree;
        }
    }
}

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod tests;
