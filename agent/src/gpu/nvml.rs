//! The real NVML through nvml-wrapper, which dlopens `libnvidia-ml.so.1` at
//! [`Nvml::init`]: a node without the driver gets an error here, not a binary
//! that fails to start.

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use super::{DeviceFault, DeviceSample, NvmlApi, NvmlLoader, ProcessSample};

/// Loads the system's NVML.
#[derive(Debug, Default)]
pub struct SystemNvml;

impl NvmlLoader for SystemNvml {
    fn load(&mut self) -> Result<Box<dyn NvmlApi>, String> {
        let nvml = Nvml::init().map_err(|e| e.to_string())?;
        Ok(Box::new(LoadedNvml(nvml)))
    }
}

/// An initialised NVML.
pub struct LoadedNvml(Nvml);

fn fault(error: NvmlError) -> DeviceFault {
    match error {
        NvmlError::GpuLost => DeviceFault::Lost(error.to_string()),
        other => DeviceFault::Failed(other.to_string()),
    }
}

impl NvmlApi for LoadedNvml {
    fn device_count(&self) -> Result<u32, String> {
        self.0.device_count().map_err(|e| e.to_string())
    }

    fn sample(&self, index: u32) -> Result<DeviceSample, DeviceFault> {
        let device = self.0.device_by_index(index).map_err(fault)?;
        let memory = device.memory_info().map_err(fault)?;
        let processes = device
            .running_compute_processes()
            .map_err(fault)?
            .into_iter()
            .map(|p| ProcessSample {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => bytes,
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect();
        Ok(DeviceSample {
            index,
            uuid: device.uuid().map_err(fault)?,
            name: device.name().map_err(fault)?,
            total_bytes: memory.total,
            used_bytes: memory.used,
            processes,
        })
    }
}
