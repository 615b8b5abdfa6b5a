use super::*;
use crate::api::Phase;

fn job(uid: &str, version: &str) -> Arc<TrainingJob> {
    Arc::new(
        TrainingJob::test(uid)
            .namespace("ns")
            .uid(uid)
            .resource_version(version)
            .model(serde_json::json!({"type": "gpt2"}))
            .build(),
    )
}

fn held(version: &str, budget: u64) -> HeldPrediction {
    HeldPrediction {
        resource_version: version.into(),
        status: TrainingJobStatus {
            phase: Phase::Pending,
            budget_bytes: Some(budget),
            ..Default::default()
        },
        note: "predicted".into(),
        deferred_write: false,
    }
}

#[test]
fn a_held_prediction_is_only_for_the_version_it_was_made_from() {
    let held_predictions = HeldPredictions::default();
    held_predictions.hold("a", held("7", 10));
    assert_eq!(held_predictions.get("a", Some("7")), Some(held("7", 10)));
    assert_eq!(held_predictions.get("a", Some("8")), None);
    assert_eq!(held_predictions.get("a", None), None);
    assert_eq!(held_predictions.get("b", Some("7")), None);
    held_predictions.hold("a", held("8", 20));
    assert_eq!(held_predictions.get("a", Some("8")), Some(held("8", 20)));
    held_predictions.forget("a");
    assert_eq!(held_predictions.get("a", Some("8")), None);
}

#[test]
fn the_cycle_sees_held_predictions_of_the_current_version_only() {
    let held_predictions = HeldPredictions::default();
    held_predictions.hold("a", held("7", 10));
    held_predictions.hold("b", held("3", 20));
    let seen = held_predictions.overlay_all(vec![job("a", "7"), job("b", "4"), job("c", "1")]);
    let budgets: Vec<Option<u64>> = seen
        .iter()
        .map(|j| j.status.as_ref().and_then(|s| s.budget_bytes))
        .collect();
    assert_eq!(budgets, vec![Some(10), None, None]);
    assert_eq!(seen[0].metadata.resource_version.as_deref(), Some("7"));
}

#[test]
fn the_cycle_shares_one_overlaid_job_until_the_hold_changes() {
    let held_predictions = HeldPredictions::default();
    held_predictions.hold("a", held("7", 10));
    let first = held_predictions.overlay_all(vec![job("a", "7")]);
    let again = held_predictions.overlay_all(vec![job("a", "7")]);
    assert!(Arc::ptr_eq(&first[0], &again[0]), "made once");
    held_predictions.hold("a", held("7", 20));
    let replaced = held_predictions.overlay_all(vec![job("a", "7")]);
    assert!(!Arc::ptr_eq(&first[0], &replaced[0]));
    assert_eq!(
        replaced[0].status.as_ref().and_then(|s| s.budget_bytes),
        Some(20),
        "a new hold is seen, not the one made before it"
    );
    // A newer version of the job is not shown the old hold's status.
    let newer = held_predictions.overlay_all(vec![job("a", "8")]);
    assert_eq!(newer[0].status, None);
}

#[test]
fn only_the_version_of_the_last_own_write_counts_as_latest() {
    let writes = OwnWrites::default();
    assert!(!writes.is_latest(&job("a", "5")));
    writes.begin("a").wrote(Some("5".into()));
    assert!(writes.is_latest(&job("a", "5")));
    assert!(!writes.is_latest(&job("a", "4")));
    assert!(!writes.is_latest(&job("b", "5")));
    writes.begin("a").wrote(Some("9".into()));
    assert!(!writes.is_latest(&job("a", "5")));
    writes.begin("a").wrote(None);
    assert!(!writes.is_latest(&job("a", "9")));
    writes.begin("a").wrote(Some("9".into()));
    writes.forget("a");
    assert!(!writes.is_latest(&job("a", "9")));
}

/// Two writes of one job in flight at once (the reconcile's and the status
/// writer's) can be answered in either order: the one answered last is not
/// known to be the newest, so neither counts, and a pod create reads the job
/// back. Seen in the kill test: the status writer's answer (attempt 1 placed)
/// was processed after the reconcile's (attempt 2 retrying), the cache then
/// showed attempt 1 at that version, and its pod was created a second time.
#[test]
fn writes_of_one_job_that_overlap_leave_the_latest_version_unknown() {
    for finish_first in [0, 1] {
        let writes = OwnWrites::default();
        let mut both = vec![writes.begin("a"), writes.begin("a")];
        let first = both.remove(finish_first);
        first.wrote(Some("7".into()));
        assert!(!writes.is_latest(&job("a", "7")), "one still in flight");
        both.remove(0).wrote(Some("6".into()));
        assert!(
            !writes.is_latest(&job("a", "6")),
            "overlapped ({finish_first})"
        );
        assert!(
            !writes.is_latest(&job("a", "7")),
            "overlapped ({finish_first})"
        );
        // The next write alone is known again.
        writes.begin("a").wrote(Some("8".into()));
        assert!(writes.is_latest(&job("a", "8")));
    }
    // A write that failed (dropped without a version) may have landed.
    let writes = OwnWrites::default();
    writes.begin("a").wrote(Some("3".into()));
    drop(writes.begin("a"));
    assert!(!writes.is_latest(&job("a", "3")));
    // Another job's write does not overlap this one's.
    let a = writes.begin("a");
    writes.begin("b").wrote(Some("4".into()));
    a.wrote(Some("5".into()));
    assert!(writes.is_latest(&job("a", "5")));
    assert!(writes.is_latest(&job("b", "4")));
}

#[test]
fn a_write_drops_only_the_hold_it_was_made_from() {
    let held_predictions = HeldPredictions::default();
    held_predictions.hold("a", held("7", 10));
    held_predictions.forget_if("a", "6");
    assert_eq!(held_predictions.get_any("a"), Some(held("7", 10)));
    held_predictions.forget_if("a", "7");
    assert_eq!(held_predictions.get_any("a"), None);
}
