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
#[path = "models_tests.rs"]
mod tests;
