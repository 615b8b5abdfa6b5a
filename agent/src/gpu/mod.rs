//! The node's GPUs as NVML reports them, read through a small trait so that
//! the failure handling (NVML missing, failing mid-run, a GPU vanishing) is
//! tested with a fake and the real library stays behind [`nvml`].
//!
//! NVML types never leave this module: each pass becomes a [`Reading`] of
//! plain structs.

pub mod models;
pub mod nvml;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use vramfit::api::GpuHealth;

/// A compute process on a GPU in one NVML pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSample {
    /// Host PID.
    pub pid: u32,
    /// Bytes it uses; 0 when NVML cannot say (no permission, MIG).
    pub used_bytes: u64,
}

/// One GPU in one NVML pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSample {
    /// NVML index.
    pub index: u32,
    /// UUID (`GPU-…`).
    pub uuid: String,
    /// NVML's device name (`NVIDIA H200`).
    pub name: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Memory in use, bytes.
    pub used_bytes: u64,
    /// Compute processes.
    pub processes: Vec<ProcessSample>,
}

/// A failed query of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceFault {
    /// The GPU fell off the bus or is otherwise gone.
    Lost(String),
    /// Another failure (the GPU may answer the next pass).
    Failed(String),
}

/// The NVML calls the agent makes.
pub trait NvmlApi: Send {
    /// Number of GPUs.
    fn device_count(&self) -> Result<u32, String>;
    /// Everything the agent reads of GPU `index`.
    fn sample(&self, index: u32) -> Result<DeviceSample, DeviceFault>;
}

/// Loads NVML (the real one dlopens `libnvidia-ml.so.1`).
pub trait NvmlLoader: Send {
    /// A loaded, initialised NVML, or why not.
    fn load(&mut self) -> Result<Box<dyn NvmlApi>, String>;
}

/// One GPU as the agent reports it after a pass.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuReading {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Predictor profile name (see [`models::profile_name`]).
    pub model: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Memory in use, bytes (last known when the GPU did not answer).
    pub used_bytes: u64,
    /// Compute processes (none when the GPU did not answer).
    pub processes: Vec<ProcessSample>,
    /// Healthy, or Faulty when the GPU is lost or does not answer.
    pub health: GpuHealth,
    /// What went wrong, when something did.
    pub problem: Option<String>,
}

/// All GPUs after a pass, with the agent's own health.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Reading {
    /// GPUs in index order, including those lost since they were first seen.
    pub gpus: Vec<GpuReading>,
    /// Degraded when NVML or a GPU fails.
    pub health: GpuHealth,
    /// What is wrong, when not Healthy.
    pub message: Option<String>,
}

/// Doubling delays between attempts, from `min` to `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays from `min` doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
        }
    }

    /// The delay before the next attempt; the one after is twice as long.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Back to the shortest delay after a success.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Reads the GPUs pass after pass and survives NVML's failures: a missing or
/// failing library is retried with back-off, a GPU that stops answering is
/// kept in the report as Faulty so the controller stops placing on it.
pub struct GpuMonitor {
    loader: Box<dyn NvmlLoader>,
    api: Option<Box<dyn NvmlApi>>,
    backoff: Backoff,
    retry_at: Option<Instant>,
    load_error: Option<String>,
    known: BTreeMap<u32, GpuReading>,
}

impl GpuMonitor {
    /// A monitor that loads NVML through `loader` on its first pass.
    pub fn new(loader: Box<dyn NvmlLoader>) -> Self {
        Self {
            loader,
            api: None,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            retry_at: None,
            load_error: None,
            known: BTreeMap::new(),
        }
    }

    /// One pass over the GPUs at `now`.
    pub fn read(&mut self, now: Instant) -> Reading {
        if self.api.is_none() && self.retry_at.is_none_or(|at| now >= at) {
            match self.loader.load() {
                Ok(api) => {
                    if self.load_error.take().is_some() {
                        tracing::info!("NVML loaded; GPU readings resume");
                    }
                    self.api = Some(api);
                    self.backoff.reset();
                    self.retry_at = None;
                }
                Err(error) => self.nvml_failed(now, format!("NVML unavailable: {error}")),
            }
        }
        let Some(api) = self.api.as_ref() else {
            return self.unavailable();
        };
        let count = match api.device_count() {
            Ok(count) => count,
            Err(error) => {
                self.api = None;
                self.nvml_failed(now, format!("NVML failed: {error}"));
                return self.unavailable();
            }
        };
        let mut problems = Vec::new();
        let mut seen = Vec::new();
        for index in 0..count {
            match api.sample(index) {
                Ok(sample) => {
                    // A GPU that came back under another index replaces its
                    // old entry.
                    self.known
                        .retain(|i, g| *i == sample.index || g.uuid != sample.uuid);
                    seen.push(sample.index);
                    self.known.insert(sample.index, healthy(sample));
                }
                Err(fault) => {
                    seen.push(index);
                    let (text, lost) = match fault {
                        DeviceFault::Lost(e) => (format!("GPU {index} lost: {e}"), true),
                        DeviceFault::Failed(e) => {
                            (format!("GPU {index} does not answer: {e}"), false)
                        }
                    };
                    if lost {
                        tracing::error!(gpu = index, "{text}");
                    } else {
                        tracing::warn!(gpu = index, "{text}");
                    }
                    problems.push(text.clone());
                    let entry = self.known.entry(index).or_insert_with(|| GpuReading {
                        index,
                        uuid: format!("unknown-{index}"),
                        model: String::new(),
                        total_bytes: 0,
                        used_bytes: 0,
                        processes: Vec::new(),
                        health: GpuHealth::Faulty,
                        problem: None,
                    });
                    entry.health = GpuHealth::Faulty;
                    entry.processes.clear();
                    entry.problem = Some(text);
                }
            }
        }
        for (index, gpu) in self.known.iter_mut() {
            if !seen.contains(index) {
                let text = format!("GPU {index} ({}) lost: NVML no longer lists it", gpu.uuid);
                if gpu.health != GpuHealth::Faulty {
                    tracing::error!(gpu = index, "{text}");
                }
                gpu.health = GpuHealth::Faulty;
                gpu.processes.clear();
                gpu.problem = Some(text.clone());
                problems.push(text);
            }
        }
        Reading {
            gpus: self.known.values().cloned().collect(),
            health: if problems.is_empty() {
                GpuHealth::Healthy
            } else {
                GpuHealth::Degraded
            },
            message: (!problems.is_empty()).then(|| problems.join("; ")),
        }
    }

    /// The loaded NVML, if any (the context measurement reads through it).
    pub fn api(&self) -> Option<&dyn NvmlApi> {
        self.api.as_deref()
    }

    fn nvml_failed(&mut self, now: Instant, text: String) {
        let delay = self.backoff.next_delay();
        self.retry_at = Some(now + delay);
        tracing::warn!(
            retry_in_s = delay.as_secs_f64(),
            "{text}; the agent reports Degraded"
        );
        self.load_error = Some(format!("{text} (next try in {} s)", delay.as_secs()));
    }

    fn unavailable(&mut self) -> Reading {
        let message = self
            .load_error
            .clone()
            .unwrap_or_else(|| "NVML unavailable".into());
        for gpu in self.known.values_mut() {
            gpu.health = GpuHealth::Faulty;
            gpu.processes.clear();
            gpu.problem = Some(message.clone());
        }
        Reading {
            gpus: self.known.values().cloned().collect(),
            health: GpuHealth::Degraded,
            message: Some(message),
        }
    }
}

fn healthy(sample: DeviceSample) -> GpuReading {
    GpuReading {
        index: sample.index,
        model: models::profile_name(&sample.name, sample.total_bytes),
        uuid: sample.uuid,
        total_bytes: sample.total_bytes,
        used_bytes: sample.used_bytes,
        processes: sample.processes,
        health: GpuHealth::Healthy,
        problem: None,
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! A scripted NVML for the failure tests.

    use std::sync::{Arc, Mutex};

    use super::*;

    /// What the fake NVML answers; shared so a test changes it between passes.
    #[derive(Clone, Default)]
    pub struct Script {
        /// `Some` makes `load` fail with this text.
        pub load_error: Option<String>,
        /// `Err` makes `device_count` fail.
        pub count: Option<Result<u32, String>>,
        /// Per index: a sample or a fault.
        pub devices: Vec<Result<DeviceSample, DeviceFault>>,
        /// Times `load` was called.
        pub loads: usize,
    }

    /// The loader and the API over one shared script.
    #[derive(Clone, Default)]
    pub struct FakeNvml(pub Arc<Mutex<Script>>);

    impl NvmlLoader for FakeNvml {
        fn load(&mut self) -> Result<Box<dyn NvmlApi>, String> {
            let mut script = self.0.lock().unwrap();
            script.loads += 1;
            if let Some(error) = &script.load_error {
                return Err(error.clone());
            }
            Ok(Box::new(self.clone()))
        }
    }

    impl NvmlApi for FakeNvml {
        fn device_count(&self) -> Result<u32, String> {
            let script = self.0.lock().unwrap();
            script
                .count
                .clone()
                .unwrap_or(Ok(script.devices.len() as u32))
        }

        fn sample(&self, index: u32) -> Result<DeviceSample, DeviceFault> {
            self.0.lock().unwrap().devices[index as usize].clone()
        }
    }

    /// An H200 with the given processes (pid, bytes).
    pub fn h200(index: u32, processes: &[(u32, u64)]) -> DeviceSample {
        DeviceSample {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H200".into(),
            total_bytes: 150_754_820_096,
            used_bytes: processes.iter().map(|p| p.1).sum(),
            processes: processes
                .iter()
                .map(|&(pid, used_bytes)| ProcessSample { pid, used_bytes })
                .collect(),
        }
    }
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
