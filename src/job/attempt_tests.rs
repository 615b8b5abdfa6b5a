use super::*;
use crate::api::TrainingJob;

fn shape(micro: u32, accum: u32) -> BatchShape {
    BatchShape { micro, accum }
}

fn spec(global: u32, gpus: u32, min_micro: u32, max_retries: u32) -> TrainingJobSpec {
    TrainingJob::test("j")
        .gpus(gpus)
        .batch(global, global / gpus)
        .min_micro(min_micro)
        .max_oom_retries(max_retries)
        .build()
        .spec
}

/// What a case wants: the next attempt, or a failure whose reason holds
/// these words.
enum Want {
    Done,
    Retry(BatchShape),
    Fail(&'static str),
}

#[test]
fn the_next_attempt_for_each_end() {
    let oom = || AttemptEnd::OutOfMemory("CUDA out of memory.".into());
    let failed = || AttemptEnd::Failed("exited with code 1".into());
    let agent = || AttemptEnd::Succeeded.or_stopped_by_agent(Some("over budget".into()));
    // (case, spec (global, gpus, minMicro, maxOOMRetries), ended at, end,
    // OOM retries used, wanted)
    #[rustfmt::skip]
    let cases = [
        ("a success is done", (64, 1, 1, 4), shape(32, 2), AttemptEnd::Succeeded, 0, Want::Done),
        ("a success is done whatever the retries", (64, 1, 1, 1), shape(8, 8), AttemptEnd::Succeeded, 4, Want::Done),
        ("a failure fails with its reason", (64, 1, 1, 4), shape(32, 2), failed(), 0, Want::Fail("exited with code 1")),
        ("a failure is never retried", (64, 1, 1, 4), shape(32, 2), failed(), 3, Want::Fail("exited with code 1")),
        ("an OOM halves micro, doubles accumulation", (64, 1, 8, 4), shape(32, 2), oom(), 0, Want::Retry(shape(16, 4))),
        ("an OOM again", (64, 1, 8, 4), shape(16, 4), oom(), 1, Want::Retry(shape(8, 8))),
        ("an OOM at minMicro fails", (64, 1, 8, 4), shape(8, 8), oom(), 2, Want::Fail("minMicro 8")),
        ("an OOM past maxOOMRetries fails", (64, 1, 1, 1), shape(16, 4), oom(), 1, Want::Fail("maxOOMRetries 1")),
        ("no OOM retry at all with maxOOMRetries 0", (64, 1, 1, 0), shape(16, 4), oom(), 0, Want::Fail("maxOOMRetries 0")),
        ("odd sizes still back off, the global batch kept", (48, 1, 1, 4), shape(12, 4), oom(), 0, Want::Retry(shape(6, 8))),
        ("the shape is per GPU", (64, 2, 1, 4), shape(8, 4), oom(), 0, Want::Retry(shape(4, 8))),
        ("from the shape the process ended with", (64, 1, 1, 4), shape(4, 16), oom(), 0, Want::Retry(shape(2, 32))),
        ("the agent's report makes a success an OOM", (64, 1, 1, 4), shape(32, 2), agent(), 0, Want::Retry(shape(16, 4))),
    ];
    for (case, (global, gpus, min_micro, max), at, end, used, want) in cases {
        let used = RetriesUsed {
            oom: used,
            no_gpu: 0,
        };
        let got = next_attempt(&spec(global, gpus, min_micro, max), at, &end, used);
        match (&got, want) {
            (NextAttempt::Done, Want::Done) => {}
            (NextAttempt::Retry(next), Want::Retry(wanted)) => {
                assert_eq!(*next, wanted, "{case}");
                assert_eq!(
                    next.micro * next.accum * gpus,
                    global,
                    "{case}: global batch changed"
                );
            }
            (NextAttempt::Fail(reason), Want::Fail(words)) => {
                assert!(reason.contains(words), "{case}: {reason}");
            }
            _ => panic!("{case}: got {got:?}"),
        }
    }
}

#[test]
fn the_agents_report_wins_over_any_end_and_names_and_messages() {
    for end in [
        AttemptEnd::Succeeded,
        AttemptEnd::Failed("exited with code 137".into()),
        AttemptEnd::OutOfMemory("CUDA out of memory.".into()),
    ] {
        assert_eq!(
            end.clone().or_stopped_by_agent(Some("used 30 GiB".into())),
            AttemptEnd::OutOfMemory("used 30 GiB".into())
        );
        assert_eq!(end.clone().or_stopped_by_agent(None), end);
    }
    let ends = [
        AttemptEnd::Succeeded,
        AttemptEnd::OutOfMemory("o".into()),
        AttemptEnd::NoGpu("n".into()),
        AttemptEnd::Failed("f".into()),
    ];
    let names: Vec<_> = ends.iter().map(|e| (e.name(), e.message())).collect();
    assert_eq!(
        names,
        [
            ("Succeeded", None),
            ("OutOfMemory", Some("o")),
            ("NoGpu", Some("n")),
            ("Failed", Some("f"))
        ]
    );
}

#[test]
fn an_attempt_without_its_gpu_is_tried_again_at_the_same_shape_a_few_times() {
    let no_gpu = AttemptEnd::NoGpu("vramfit: no GPU device".into());
    let spec = spec(64, 1, 8, 0);
    let at = shape(16, 4);
    // (case, OOM retries used, no-GPU retries used, wanted)
    #[rustfmt::skip]
    let cases = [
        ("the first: the same shape again", 0, 0, Some(at)),
        ("not an OOM: maxOOMRetries 0 and minMicro do not stop it", 9, 0, Some(at)),
        ("the last one allowed", 0, MAX_NO_GPU_RETRIES - 1, Some(at)),
        ("then the job fails", 0, MAX_NO_GPU_RETRIES, None),
    ];
    for (case, oom, used, want) in cases {
        let got = next_attempt(&spec, at, &no_gpu, RetriesUsed { oom, no_gpu: used });
        match (got, want) {
            (NextAttempt::Retry(next), Some(wanted)) => assert_eq!(next, wanted, "{case}"),
            (NextAttempt::Fail(reason), None) => {
                assert!(reason.contains("without their GPU"), "{case}: {reason}");
                assert!(
                    reason.contains("vramfit: no GPU device"),
                    "{case}: {reason}"
                );
                assert!(
                    reason.contains(&(MAX_NO_GPU_RETRIES + 1).to_string()),
                    "{case}: {reason}"
                );
            }
            (got, _) => panic!("{case}: got {got:?}"),
        }
    }
}
