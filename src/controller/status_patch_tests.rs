use super::*;

#[test]
fn the_status_patch_replaces_the_whole_status_or_creates_it() {
    let new = TrainingJobStatus {
        message: Some("waiting for room".into()),
        predicted_bytes: Some(7),
        ..TrainingJobStatus::default()
    };
    let patch = status_patch(&new).unwrap();
    let expected = serde_json::to_value(&new).unwrap();
    // An older status with fields the new one leaves out: they go.
    let mut job = serde_json::json!({
        "metadata": {"name": "a"},
        "spec": {"x": 1},
        "status": {"gpu": "GPU-1", "predictedBytes": 3, "microBatch": 4},
    });
    json_patch::patch(&mut job, &patch).unwrap();
    assert_eq!(job["status"], expected);
    assert_eq!(job["spec"], serde_json::json!({"x": 1}));
    // A job without a status gets one.
    let mut fresh = serde_json::json!({"metadata": {"name": "b"}});
    json_patch::patch(&mut fresh, &patch).unwrap();
    assert_eq!(fresh["status"], expected);
}

#[test]
fn a_condition_keeps_its_transition_time_until_its_status_changes() {
    let long_ago = Time("2026-01-01T00:00:00Z".parse().unwrap());
    let mut conditions = vec![Condition {
        type_: CONDITION_PLACED.into(),
        status: "False".into(),
        reason: "WaitingForRoom".into(),
        message: "waiting".into(),
        observed_generation: Some(1),
        last_transition_time: long_ago.clone(),
    }];
    // Same status, new reason and message: the time stays.
    set_condition(
        &mut conditions,
        CONDITION_PLACED,
        false,
        "FitsNoNode",
        "never",
        Some(2),
    );
    assert_eq!(conditions.len(), 1);
    let c = &conditions[0];
    assert_eq!(
        (c.reason.as_str(), c.message.as_str()),
        ("FitsNoNode", "never")
    );
    assert_eq!(c.observed_generation, Some(2));
    assert_eq!(c.last_transition_time, long_ago);
    // The status flips: the time moves.
    set_condition(
        &mut conditions,
        CONDITION_PLACED,
        true,
        "Placed",
        "placed",
        Some(2),
    );
    assert_eq!(conditions[0].status, "True");
    assert!(conditions[0].last_transition_time.0 > long_ago.0);
    // Another type is added beside it.
    set_condition(
        &mut conditions,
        CONDITION_COMPLETE,
        true,
        "Succeeded",
        "done",
        Some(2),
    );
    assert_eq!(conditions.len(), 2);
    assert_eq!(conditions[1].type_, CONDITION_COMPLETE);
}
