use super::*;

fn job(global: u32, micro: u32, min_micro: u32, gpus: u32, retries: u32) -> TrainingJob {
    let manifest = TrainingJob::test("t")
        .gpus(gpus)
        .max_oom_retries(retries)
        .batch(global, micro)
        .min_micro(min_micro)
        .model(serde_json::json!({"mlp": {"layers": 2, "hidden": 64},
                                  "precision": "fp32", "optimizer": "sgd"}))
        .template_spec(serde_json::json!({"containers": []}))
        .manifest();
    parse_training_job(&manifest.to_string()).expect("job parses")
}

fn exited(code: i32) -> ExitStatus {
    ExitStatus::from_raw(code << 8)
}

const TORCH: &str =
    "CUDA out of memory. Tried to allocate 2.00 GiB.\n\n|  PyTorch CUDA memory summary |";

#[test]
fn exits_are_classified_like_pods() {
    assert_eq!(classify_exit(exited(0), ""), AttemptEnd::Succeeded);
    assert_eq!(
        classify_exit(exited(42), TORCH),
        AttemptEnd::OutOfMemory("CUDA out of memory. Tried to allocate 2.00 GiB.".into())
    );
    match classify_exit(exited(42), "KeyError") {
        AttemptEnd::Failed(m) => assert!(m.contains("lacks \"CUDA out of memory\""), "{m}"),
        other => panic!("{other:?}"),
    }
    match classify_exit(exited(1), TORCH) {
        AttemptEnd::Failed(m) => assert!(m.contains("code 1"), "{m}"),
        other => panic!("{other:?}"),
    }
    match classify_exit(ExitStatus::from_raw(9), "") {
        AttemptEnd::Failed(m) => assert!(m.contains("signal 9"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_agents_report_makes_any_exit_an_oom() {
    for status in [ExitStatus::from_raw(9), exited(0), exited(1)] {
        match outcome_of(status, "", Some("used 30 GiB over 20 GiB")) {
            AttemptEnd::OutOfMemory(m) => {
                assert_eq!(m, "stopped by vramfit-agent: used 30 GiB over 20 GiB")
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(
        outcome_of(ExitStatus::from_raw(9), "", None),
        AttemptEnd::Failed(_)
    ));
}

#[test]
fn the_environment_is_the_node_protocols() {
    let j = job(64, 16, 2, 1, 4);
    let gpus = [LocalGpu {
        index: 3,
        uuid: "GPU-x".into(),
        total_bytes: 100 << 30,
    }];
    let dir = Path::new("/tmp/w/attempt-2");
    let plan = AttemptPlan {
        job: &j,
        shape: BatchShape { micro: 8, accum: 8 },
        attempt: 2,
        budget_bytes: 25 << 30,
        gpus: &gpus,
        dir,
    };
    let env: std::collections::HashMap<String, String> = plan.environment().into_iter().collect();
    assert_eq!(env["VRAMFIT_MICRO_BATCH"], "8");
    assert_eq!(env["VRAMFIT_GRAD_ACCUM"], "8");
    assert_eq!(env["VRAMFIT_GLOBAL_BATCH"], "64");
    assert_eq!(env["VRAMFIT_MIN_MICRO_BATCH"], "2");
    assert_eq!(env["VRAMFIT_ATTEMPT"], "2");
    assert_eq!(env["VRAMFIT_BUDGET_BYTES"], (25u64 << 30).to_string());
    assert_eq!(
        env["VRAMFIT_CONTEXT_BYTES"],
        crate::predict::default_gpu().context_bytes.to_string(),
        "the part of the budget kept outside the allocator"
    );
    assert_eq!(env["VRAMFIT_MEMORY_FRACTION"], "0.250000");
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "3");
    assert_eq!(
        env["VRAMFIT_TERMINATION_LOG"],
        "/tmp/w/attempt-2/termination-log"
    );
    assert_eq!(env["VRAMFIT_STATS_DIR"], "/tmp/w/attempt-2/stats");
    let cpu = AttemptPlan { gpus: &[], ..plan };
    let env: std::collections::HashMap<String, String> = cpu.environment().into_iter().collect();
    assert!(
        !env.contains_key("VRAMFIT_MEMORY_FRACTION") && !env.contains_key("CUDA_VISIBLE_DEVICES")
    );
}

#[test]
fn the_newest_shape_file_gives_the_shape_the_process_ended_with() {
    let dir = tempfile::tempdir().unwrap();
    assert!(read_shape_files(dir.path()).is_none());
    std::fs::write(
            dir.path().join("shape-7.json"),
            r#"{"version": 1, "pid": 7, "microBatch": 8, "gradAccum": 8, "globalBatch": 64,
            "attempt": 1, "absorbedOoms": [{"fromMicro": 16, "toMicro": 8, "fromAccum": 4, "toAccum": 8, "unixMs": 1700000000000}]}"#,
        )
        .unwrap();
    // Not a shape file, and a broken one: both skipped.
    std::fs::write(dir.path().join("alloc-7-0.json"), "{}").unwrap();
    std::fs::write(dir.path().join("shape-9.json"), "{\"version\": 1}").unwrap();
    let (shape, absorbed) = read_shape_files(dir.path()).unwrap();
    assert_eq!(shape, BatchShape { micro: 8, accum: 8 });
    assert_eq!(absorbed.len(), 1);
    assert_eq!((absorbed[0].from_micro, absorbed[0].to_accum), (16, 8));
    assert_eq!(absorbed[0].time, "2023-11-14T22:13:20Z");
}
