use super::*;

fn measured(bandwidth: f64, errors: u64) -> ProbeResult {
    ProbeResult {
        gpu_name: "NVIDIA H200".into(),
        bandwidth_gbps: bandwidth,
        expected_bandwidth_gbps: expected_bandwidth_gbps("NVIDIA H200").unwrap(),
        tested_bytes: 1 << 30,
        errors,
        ..Default::default()
    }
}

#[test]
fn probe_results_map_to_gpu_node_health() {
    let healthy = ProbeResult {
        ok: true,
        ..ProbeResult::default()
    };
    let slow = ProbeResult {
        ok: false,
        ..ProbeResult::default()
    };
    let broken = ProbeResult {
        ok: false,
        errors: 3,
        ..ProbeResult::default()
    };
    assert_eq!(healthy.health(), GpuHealth::Healthy);
    assert_eq!(slow.health(), GpuHealth::Degraded);
    assert_eq!(broken.health(), GpuHealth::Faulty);
    let status = broken.to_status("2026-11-30T00:00:00Z".into());
    assert_eq!((status.ok, status.errors), (false, 3));
    assert_eq!(status.time.as_deref(), Some("2026-11-30T00:00:00Z"));
}

#[test]
fn verdicts_follow_errors_and_bandwidth() {
    for (bandwidth, errors, ok, says) in [
        (4200.0, 0, true, "healthy"),
        (1500.0, 0, false, "throttled"),
        (4200.0, 3, false, "faulty memory"),
    ] {
        let result = judge(measured(bandwidth, errors));
        assert_eq!(result.ok, ok, "{bandwidth} GB/s, {errors} errors");
        assert!(result.message.contains(says), "{}", result.message);
    }
}

#[test]
fn unknown_models_are_not_judged_on_bandwidth() {
    assert_eq!(expected_bandwidth_gbps("Some Future GPU"), None);
    let result = judge(ProbeResult {
        bandwidth_gbps: 1.0,
        tested_bytes: 1 << 20,
        ..Default::default()
    });
    assert!(result.ok);
}

/// The PTX the agent loads was compiled from the CUDA C beside it: its
/// first line records the source's hash (`hack/gpu-tests.sh ptx`), so a
/// change to the kernels without a new PTX fails here, on a machine
/// without nvcc.
#[test]
fn the_probe_ptx_is_compiled_from_the_kernels_beside_it() {
    let source = include_bytes!("cuda/probe_kernels.cu");
    let ptx = include_str!("cuda/probe_kernels.ptx");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in source {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let first = ptx.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("// source fnv1a64 {hash:016x} ")),
        "probe_kernels.ptx is stale (its first line: {first:?}); run hack/gpu-tests.sh ptx on a GPU machine"
    );
    for kernel in ["fill_pattern", "check_pattern"] {
        assert!(ptx.contains(&format!(".entry {kernel}(")), "{kernel}");
    }
}
