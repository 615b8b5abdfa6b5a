use super::*;

fn shape(micro: u32, accum: u32) -> BatchShape {
    BatchShape { micro, accum }
}

/// The table shared with the Python helper (`python/vramfit/backoff.py`),
/// so the in-process back-off and the controller's cannot drift apart.
const SHARED_CASES: &str = include_str!("../../tests/data/backoff-cases.json");

#[test]
fn oom_halves_micro_batch_and_keeps_global_batch() {
    let table: serde_json::Value = serde_json::from_str(SHARED_CASES).unwrap();
    let cases = table["cases"].as_array().unwrap();
    assert!(cases.len() >= 10, "the shared table lost its cases");
    let num = |case: &serde_json::Value, key: &str| case[key].as_u64().unwrap() as u32;
    let pair = |value: &serde_json::Value| {
        let v = value.as_array().unwrap();
        shape(v[0].as_u64().unwrap() as u32, v[1].as_u64().unwrap() as u32)
    };
    for case in cases {
        let (global, gpus) = (num(case, "global"), num(case, "gpus"));
        let got = after_oom(
            global,
            gpus,
            pair(&case["current"]),
            num(case, "minMicro"),
            num(case, "used"),
            num(case, "max"),
        );
        match (&got, case.get("retry")) {
            (OomDecision::Retry(next), Some(want)) => {
                assert_eq!(*next, pair(want), "{case}");
                assert_eq!(
                    next.micro * next.accum * gpus,
                    global,
                    "global batch changed"
                );
            }
            (OomDecision::Fail(message), None) => {
                for words in case["fail"].as_array().unwrap() {
                    let words = words.as_str().unwrap();
                    assert!(message.contains(words), "{case}: {message}");
                }
            }
            _ => panic!("{case}: got {got:?}"),
        }
    }
}

#[test]
fn oom_at_min_micro_fails_with_a_clear_message() {
    match after_oom(64, 1, shape(2, 32), 2, 2, 4) {
        OomDecision::Fail(message) => {
            assert!(message.contains("minMicro 2"), "{message}");
            assert!(message.contains("micro-batch 2"), "{message}");
        }
        other => panic!("expected failure, got {other:?}"),
    }
    assert!(matches!(
        after_oom(64, 1, shape(1, 64), 1, 0, 4),
        OomDecision::Fail(_)
    ));
}

#[test]
fn oom_past_max_retries_fails() {
    match after_oom(64, 1, shape(8, 8), 1, 3, 3) {
        OomDecision::Fail(message) => assert!(message.contains("maxOOMRetries 3"), "{message}"),
        other => panic!("expected failure, got {other:?}"),
    }
}

#[test]
fn batch_shape_requires_an_exact_division() {
    assert_eq!(BatchShape::for_micro(64, 8, 1), Some(shape(8, 8)));
    assert_eq!(BatchShape::for_micro(60, 8, 1), None);
    assert_eq!(BatchShape::for_micro(64, 0, 1), None);
    // Zero GPUs or a zero micro-batch is never a shape, not a division by zero.
    assert_eq!(BatchShape::for_micro(0, 8, 0), None);
    assert_eq!(BatchShape::for_micro(0, 0, 1), None);
    assert_eq!(shape(8, 8).display(), "8x8");
}
