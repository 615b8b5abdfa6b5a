use super::*;

const ONE: &str = r#"{"version": 1, "pid": 7, "microBatch": 8, "gradAccum": 8, "globalBatch": 64,
        "attempt": 1, "absorbedOoms": [{"fromMicro": 16, "toMicro": 8, "fromAccum": 4,
        "toAccum": 8, "unixMs": 1764547200000}]}"#;

#[test]
fn the_helpers_file_gives_shape_and_absorbed_ooms() {
    let file = parse(ONE.as_bytes()).unwrap();
    assert_eq!(file.shape(), BatchShape { micro: 8, accum: 8 });
    let observed = file.observed();
    assert_eq!((observed.micro_batch, observed.grad_accum), (8, 8));
    assert_eq!(observed.absorbed_ooms.len(), 1);
    let a = &observed.absorbed_ooms[0];
    assert_eq!(
        (a.from_micro, a.to_micro, a.from_accum, a.to_accum),
        (16, 8, 4, 8)
    );
    assert_eq!(a.time, "2025-12-01T00:00:00Z");
    let with_ms = ONE.replace("1764547200000", "1764547200123");
    assert_eq!(
        parse(with_ms.as_bytes()).unwrap().absorbed()[0].time,
        "2025-12-01T00:00:00.123Z"
    );
}

#[test]
fn another_version_a_zero_shape_or_a_missing_key_is_refused() {
    for bad in [
        ONE.replace("\"version\": 1", "\"version\": 2"),
        ONE.replace("\"microBatch\": 8", "\"microBatch\": 0"),
        ONE.replace("\"gradAccum\": 8", "\"gradAccum\": 0"),
        ONE.replace("\"microBatch\": 8,", ""),
        r#"{"version": 1}"#.to_string(),
        "[[[[".to_string(),
    ] {
        assert!(
            matches!(parse(bad.as_bytes()), Err(ReadError::Format(_))),
            "{bad}"
        );
    }
}

#[test]
fn a_hostile_list_of_absorbed_ooms_keeps_only_the_latest() {
    let entries: Vec<String> = (0..10_000)
        .map(|i| {
            format!(
                r#"{{"fromMicro": 2, "toMicro": 1, "fromAccum": 1, "toAccum": 2, "unixMs": {i}}}"#
            )
        })
        .collect();
    let text = format!(
        r#"{{"version": 1, "microBatch": 1, "gradAccum": 2, "absorbedOoms": [{}]}}"#,
        entries.join(",")
    );
    // Over the size cap as a file: refused outright.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(path_for(dir.path(), 1), &text).unwrap();
    assert!(matches!(
        read(&path_for(dir.path(), 1)),
        Err(ReadError::TooLarge(_))
    ));
    // Under it, the list is cut to the latest entries.
    let file = parse(text.as_bytes()).unwrap();
    assert_eq!(file.absorbed_ooms.len(), MAX_ABSORBED);
    assert_eq!(file.absorbed_ooms[0].unix_ms, 10_000 - MAX_ABSORBED as i64);
    assert_eq!(file.absorbed_ooms.last().unwrap().unix_ms, 9_999);
}

#[test]
fn a_link_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("real.json"), ONE).unwrap();
    std::os::unix::fs::symlink(dir.path().join("real.json"), path_for(dir.path(), 7)).unwrap();
    assert!(matches!(
        read(&path_for(dir.path(), 7)),
        Err(ReadError::NotRegular)
    ));
    assert!(read(&dir.path().join("real.json")).is_ok());
}

#[test]
fn progress_is_read_when_present_and_dropped_when_malformed() {
    // A file of an older helper has none.
    assert_eq!(parse(ONE.as_bytes()).unwrap().observed().progress, None);
    let with = |progress: &str| {
        ONE.replace(
            "\"attempt\": 1,",
            &format!("\"attempt\": 1, \"progress\": {progress},"),
        )
    };
    let file = parse(
        with(
            r#"{"steps": 120, "totalSteps": 1000, "secondsPerStep": 0.5, "unixMs": 1764547200000}"#,
        )
        .as_bytes(),
    )
    .unwrap();
    let p = file.observed().progress.unwrap();
    assert_eq!(
        (p.steps, p.total_steps, p.seconds_per_step),
        (120, Some(1000), Some(0.5))
    );
    assert_eq!(p.time, "2025-12-01T00:00:00Z");
    // Unknown total, no step time yet.
    let p = parse(with(r#"{"steps": 3, "unixMs": 1764547200000}"#).as_bytes())
        .unwrap()
        .observed()
        .progress
        .unwrap();
    assert_eq!(
        (p.steps, p.total_steps, p.seconds_per_step),
        (3, None, None)
    );
    // A zero total and a step time that is no positive number are dropped.
    let p = parse(
        with(r#"{"steps": 3, "totalSteps": 0, "secondsPerStep": -1.0, "unixMs": 1764547200000}"#)
            .as_bytes(),
    )
    .unwrap()
    .progress
    .unwrap();
    assert_eq!((p.total_steps, p.seconds_per_step), (None, None));
    // A malformed progress loses the progress, not the shape.
    for bad in [
        r#""soon""#,
        r#"{"steps": -1, "unixMs": 0}"#,
        r#"{"totalSteps": 9}"#,
        "null",
    ] {
        let file = parse(with(bad).as_bytes()).unwrap();
        assert_eq!((file.micro_batch, file.progress), (8, None), "{bad}");
    }
}
