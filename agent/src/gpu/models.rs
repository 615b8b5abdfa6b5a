//! NVML's device names mapped to the predictor's GPU profile names
//! (`vramfit::predict::GPU_PROFILES`), so the controller finds a profile for
//! every GPU the agent reports.

use vramfit::predict::gpu_profile;

const GIB: u64 = 1 << 30;

/// The profile name for a GPU NVML calls `nvml_name` with `total_bytes` of
/// memory; the NVML name without its `NVIDIA ` prefix when no profile fits.
pub fn profile_name(nvml_name: &str, total_bytes: u64) -> String {
    let upper = nvml_name.to_ascii_uppercase();
    let has = |needle: &str| upper.contains(needle);
    let name = if has("H200") {
        Some("H200")
    } else if has("H100") {
        // H100 NVL (94 GB) and H100 PCIe/SXM (80 GB) share the 80 GB profile's
        // context figures; the 94 GB part is reported as itself.
        (total_bytes < 90 * GIB).then_some("H100-80GB")
    } else if has("A100") {
        Some(if total_bytes > 60 * GIB {
            "A100-80GB"
        } else {
            "A100-40GB"
        })
    } else if has("L40S") {
        Some("L40S")
    } else if upper.split([' ', '-']).any(|w| w == "L4") {
        Some("L4")
    } else if upper.split([' ', '-']).any(|w| w == "T4") {
        Some("T4")
    } else {
        None
    };
    match name.and_then(gpu_profile) {
        Some(profile) => profile.name.to_string(),
        None => nvml_name
            .trim()
            .strip_prefix("NVIDIA ")
            .unwrap_or(nvml_name.trim())
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_names_map_to_predictor_profiles() {
        for (nvml, gib, want) in [
            ("NVIDIA H200", 141, "H200"),
            ("NVIDIA H200 NVL", 141, "H200"),
            ("NVIDIA H100 80GB HBM3", 80, "H100-80GB"),
            ("NVIDIA H100 PCIe", 80, "H100-80GB"),
            ("NVIDIA A100-SXM4-80GB", 80, "A100-80GB"),
            ("NVIDIA A100-SXM4-40GB", 40, "A100-40GB"),
            ("NVIDIA A100-PCIE-40GB", 40, "A100-40GB"),
            ("NVIDIA L40S", 45, "L40S"),
            ("NVIDIA L4", 22, "L4"),
            ("Tesla T4", 15, "T4"),
            ("NVIDIA H100 NVL", 94, "H100 NVL"),
            ("NVIDIA GeForce RTX 4090", 24, "GeForce RTX 4090"),
        ] {
            assert_eq!(profile_name(nvml, gib * GIB), want, "{nvml}");
        }
    }

    #[test]
    fn every_mapped_name_is_a_profile_the_predictor_knows() {
        for (nvml, gib) in [
            ("NVIDIA H200", 141),
            ("NVIDIA A100-SXM4-40GB", 40),
            ("NVIDIA L4", 22),
        ] {
            assert!(gpu_profile(&profile_name(nvml, gib * GIB)).is_some());
        }
    }
}
