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
