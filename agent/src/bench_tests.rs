use super::*;
use vramfit::alloc::{AllocatorConfig, Policy, SimulatedDevice, new_allocator};

#[test]
fn size_mix_is_reproducible_and_balanced() {
    let mix = size_mix(10_000, 42);
    assert_eq!(mix, size_mix(10_000, 42));
    let allocs = mix
        .iter()
        .filter(|e| matches!(e, AllocEvent::Alloc { .. }))
        .count();
    assert!((5_000..5_100).contains(&allocs), "{allocs} allocations");
}

#[test]
fn size_mix_matches_the_python_generator() {
    // First sizes as scripts/gpu/bench_torch_alloc.py draws them for seed 42.
    let sizes: Vec<u64> = size_mix(4, 42)
        .into_iter()
        .filter_map(|e| match e {
            AllocEvent::Alloc { bytes, .. } => Some(bytes),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, PYTHON_FIRST_SIZES);
}

const PYTHON_FIRST_SIZES: [u64; 4] = [2048, 4096, 66_811_916, 7_579_030];

#[test]
fn caching_allocators_run_the_mix_on_a_simulated_device() {
    let mix = size_mix(2_000, 7);
    for policy in [Policy::Pytorch, Policy::Vramfit] {
        let mut allocator = new_allocator(
            policy,
            SimulatedDevice::new(1 << 40),
            AllocatorConfig::default(),
        );
        let row = run_mix(&policy.to_string(), &mut allocator, &mix, 2).unwrap();
        assert_eq!(row.allocs + row.frees, 2_000);
        assert!(row.peak_reserved_bytes > 0);
    }
}

/// The passes over the mix repeat: the vramfit policy plans them, and
/// the last passes make no driver calls.
#[test]
fn the_vramfit_policy_plans_the_repeated_passes() {
    let mix = size_mix(2_000, 7);
    let mut allocator = new_allocator(
        Policy::Vramfit,
        SimulatedDevice::new(1 << 40),
        AllocatorConfig::default(),
    );
    run_mix("planned", &mut allocator, &mix, 5).unwrap();
    let figures = allocator.plan_figures().unwrap();
    assert!(figures.active, "{figures:?}");
    let calls = allocator.stats().num_device_allocs + allocator.stats().num_device_frees;
    run_mix("planned", &mut allocator, &mix, 2).unwrap();
    let after = allocator.stats().num_device_allocs + allocator.stats().num_device_frees;
    assert_eq!(after, calls, "no driver calls under the plan");
}

/// The steady-state row times only passes served from the plan; the
/// row over all passes includes the ones before it.
#[test]
fn untimed_rounds_leave_the_settling_passes_out() {
    let mix = size_mix(2_000, 7);
    let fresh = || {
        new_allocator(
            Policy::Vramfit,
            SimulatedDevice::new(1 << 40),
            AllocatorConfig::default(),
        )
    };
    let steady = run_mix_after("steady", &mut fresh(), &mix, 5, 3).unwrap();
    assert_eq!(steady.allocs + steady.frees, 2 * 2_000);
    assert_eq!(steady.planned_share, 1.0, "{steady:?}");
    let all = run_mix("all", &mut fresh(), &mix, 5).unwrap();
    assert_eq!(all.allocs + all.frees, 4 * 2_000);
    assert!(all.planned_share < 1.0, "{all:?}");
    let pytorch = run_mix(
        "pytorch",
        &mut new_allocator(
            Policy::Pytorch,
            SimulatedDevice::new(1 << 40),
            AllocatorConfig::default(),
        ),
        &mix,
        2,
    )
    .unwrap();
    assert_eq!(pytorch.planned_share, 0.0);
}
