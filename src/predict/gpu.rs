//! GPU profiles: capacity, the memory a CUDA process holds outside the caching
//! allocator (context, kernels, libraries), and the cuBLAS workspace size.

/// How a profile's figures were obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// Measured on such a GPU (see data/calibration/).
    Measured,
    /// Estimated from the architecture and vendor figures; not measured here.
    Estimated,
}

/// One GPU model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuProfile {
    /// Name used by `--gpu` and `gpuModels`.
    pub name: &'static str,
    /// Total memory in bytes as NVML reports it.
    pub capacity_bytes: u64,
    /// Bytes a training process holds outside the caching allocator once its
    /// kernels and libraries are loaded (CUDA context, cuBLAS, module images).
    pub context_bytes: u64,
    /// One cuBLAS workspace, allocated through the caching allocator per
    /// stream and thread that runs matmuls (PyTorch's default for the arch).
    pub cublas_workspace_bytes: u64,
    /// Bytes a process adds outside the caching allocator once it joins an
    /// NCCL communicator (jobs with `gpus` > 1): NCCL's channel buffers, its
    /// proxy and the kernels it loads.
    pub nccl_bytes: u64,
    /// Multiprocessors and resident threads per multiprocessor: the launch
    /// configuration of the reduction kernel reads them, and with it the
    /// size of its staging buffer ([`super::reduce`]).
    pub reduce: ReduceDevice,
    /// Measured or estimated.
    pub provenance: Provenance,
}

use super::reduce::ReduceDevice;

const MIB: u64 = 1 << 20;
/// PyTorch's default cuBLAS workspace on Hopper (`:4096:8`, 32 MiB).
const HOPPER_WORKSPACE: u64 = 32 * MIB;
/// PyTorch's default before Hopper (`:4096:2:16:8`).
const PRE_HOPPER_WORKSPACE: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;

/// The profiles, the measured ones first.
pub const GPU_PROFILES: &[GpuProfile] = &[
    // Measured: NVML per-process usage minus torch.cuda.memory_reserved() at the
    // end of each calibration run, PyTorch 2.11 + CUDA 13: 742 MiB (fp32) to
    // 758 MiB (bf16/fp16 kernels loaded) in all 40 runs.
    GpuProfile {
        name: "H200",
        capacity_bytes: 143_771 * MIB,
        context_bytes: 758 * MIB,
        cublas_workspace_bytes: HOPPER_WORKSPACE,
        // Measured on two NVLink-connected H200s (NCCL of PyTorch 2.11, NVLS off):
        // NVML per-process usage minus memory_reserved() rises from 758 MiB to
        // 1600-1604 MiB in all 13 runs of data/calibration/h200x2-zero.jsonl.
        nccl_bytes: 846 * MIB,
        reduce: ReduceDevice {
            sms: 132,
            threads_per_sm: 2048,
        },
        provenance: Provenance::Measured,
    },
    // Measured: the fifth fresh set's 21 runs on an H100 80GB HBM3 (PyTorch
    // 2.11, CUDA 13): NVML per-process usage minus memory_reserved() 742 MiB
    // (fp32) to 762 MiB, as on the H200, and the H200's predictions of the
    // set held on it (data/calibration/h100-fresh5.jsonl). NCCL's buffers
    // are the H200's figure, not measured here.
    GpuProfile {
        name: "H100-80GB",
        capacity_bytes: 81_559 * MIB,
        context_bytes: 758 * MIB,
        cublas_workspace_bytes: HOPPER_WORKSPACE,
        nccl_bytes: 846 * MIB,
        reduce: ReduceDevice {
            sms: 132,
            threads_per_sm: 2048,
        },
        provenance: Provenance::Measured,
    },
    GpuProfile {
        name: "A100-80GB",
        capacity_bytes: 81_920 * MIB,
        context_bytes: 600 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_WORKSPACE,
        nccl_bytes: 600 * MIB,
        reduce: ReduceDevice {
            sms: 108,
            threads_per_sm: 2048,
        },
        provenance: Provenance::Estimated,
    },
    GpuProfile {
        name: "A100-40GB",
        capacity_bytes: 40_960 * MIB,
        context_bytes: 600 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_WORKSPACE,
        nccl_bytes: 600 * MIB,
        reduce: ReduceDevice {
            sms: 108,
            threads_per_sm: 2048,
        },
        provenance: Provenance::Estimated,
    },
    GpuProfile {
        name: "L40S",
        capacity_bytes: 46_068 * MIB,
        context_bytes: 560 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_WORKSPACE,
        nccl_bytes: 600 * MIB,
        reduce: ReduceDevice {
            sms: 142,
            threads_per_sm: 1536,
        },
        provenance: Provenance::Estimated,
    },
    GpuProfile {
        name: "L4",
        capacity_bytes: 23_034 * MIB,
        context_bytes: 520 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_WORKSPACE,
        nccl_bytes: 600 * MIB,
        reduce: ReduceDevice {
            sms: 58,
            threads_per_sm: 1536,
        },
        provenance: Provenance::Estimated,
    },
    GpuProfile {
        name: "T4",
        capacity_bytes: 15_360 * MIB,
        context_bytes: 420 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_WORKSPACE,
        nccl_bytes: 600 * MIB,
        reduce: ReduceDevice {
            sms: 40,
            threads_per_sm: 1024,
        },
        provenance: Provenance::Estimated,
    },
];

/// Finds a profile by name, ignoring case and an `NVIDIA ` prefix.
pub fn gpu_profile(name: &str) -> Option<&'static GpuProfile> {
    let n = name.trim();
    let n = n.strip_prefix("NVIDIA ").unwrap_or(n);
    GPU_PROFILES.iter().find(|p| p.name.eq_ignore_ascii_case(n))
}

/// The profile used when none is named.
pub fn default_gpu() -> &'static GpuProfile {
    &GPU_PROFILES[0]
}
