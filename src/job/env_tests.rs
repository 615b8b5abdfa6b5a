use super::*;
use crate::api::{TrainingJob, TrainingJobSpec};

fn spec() -> TrainingJobSpec {
    TrainingJob::test("j")
        .gpus(1)
        .batch(64, 8)
        .min_micro(2)
        .build()
        .spec
}

fn attempt<'a>() -> Attempt<'a> {
    Attempt {
        shape: BatchShape {
            micro: 4,
            accum: 16,
        },
        attempt: 3,
        budget_bytes: 10 << 30,
        gpu_model: Some("H200"),
        memory_fraction: Some(0.0712345678),
        gpu_uuids: vec!["GPU-a", "GPU-b"],
        stats_dir: "/run/vramfit",
    }
}

#[test]
fn every_protocol_variable_is_set_from_the_attempt_and_the_spec() {
    let env = attempt_env(&spec(), &attempt());
    let names: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        names,
        [
            VISIBLE_DEVICES,
            MEMORY_FRACTION,
            BUDGET_BYTES,
            CONTEXT_BYTES,
            MICRO_BATCH,
            GRAD_ACCUM,
            GLOBAL_BATCH,
            MIN_MICRO_BATCH,
            ATTEMPT,
            OOM_EXIT_CODE_VAR,
            STATS_DIR_VAR
        ]
    );
    let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
    assert_eq!(get(VISIBLE_DEVICES), "GPU-a,GPU-b");
    assert_eq!(get(MEMORY_FRACTION), "0.071235");
    assert_eq!(get(BUDGET_BYTES), (10u64 << 30).to_string());
    assert_eq!(
        get(CONTEXT_BYTES),
        outside_allocator_bytes(Some("H200"), 1).to_string()
    );
    assert_eq!(
        (get(MICRO_BATCH), get(GRAD_ACCUM), get(GLOBAL_BATCH)),
        ("4".into(), "16".into(), "64".into())
    );
    assert_eq!(
        (get(MIN_MICRO_BATCH), get(ATTEMPT)),
        ("2".into(), "3".into())
    );
    assert_eq!(get(OOM_EXIT_CODE_VAR), OOM_EXIT_CODE.to_string());
    assert_eq!(get(STATS_DIR_VAR), "/run/vramfit");
}

#[test]
fn without_a_gpu_no_device_or_fraction_is_set() {
    let mut a = attempt();
    a.gpu_uuids.clear();
    a.memory_fraction = None;
    let env = attempt_env(&spec(), &a);
    assert!(
        env.iter()
            .all(|(k, _)| *k != VISIBLE_DEVICES && *k != MEMORY_FRACTION)
    );
    assert_eq!(env.len(), 9);
}

#[test]
fn reserved_names_are_the_device_list_and_the_vramfit_prefix() {
    assert!(is_reserved("NVIDIA_VISIBLE_DEVICES"));
    assert!(is_reserved("VRAMFIT_BUDGET_BYTES"));
    assert!(is_reserved("VRAMFIT_POD_UID"));
    assert!(!is_reserved("VRAMFIT_ALLOCATOR"), "the user's choice");
    assert!(!is_reserved("VRAMFIT_TERMINATION_LOG"));
    assert!(!is_reserved("CUDA_VISIBLE_DEVICES"));
    assert!(!is_reserved("NVIDIA_DRIVER_CAPABILITIES"));
    assert!(!is_reserved("vramfit_lower"));
}
