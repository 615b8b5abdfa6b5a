use super::*;
use crate::api::Phase;

fn job(version: &str) -> TrainingJob {
    TrainingJob::test("j")
        .namespace("ns")
        .meta("uid", serde_json::json!("u"))
        .meta("resourceVersion", serde_json::json!(version))
        .build()
}

fn held(version: &str, deferred_write: bool) -> HeldPrediction {
    HeldPrediction {
        resource_version: version.into(),
        status: TrainingJobStatus {
            phase: Phase::Placed,
            ..Default::default()
        },
        note: String::new(),
        deferred_write,
    }
}

#[test]
fn only_a_deferred_placement_of_the_cached_version_is_written() {
    let status = held("7", true).status;
    assert_eq!(
        plan(Some(&held("7", true)), Some(&job("7"))),
        Write::Status {
            resource_version: "7".into(),
            status: Box::new(status)
        }
    );
    let cases = [
        ("nothing held", None, Some(job("7"))),
        ("the job is gone", Some(held("7", true)), None),
        (
            "a held prediction, written with its verdict",
            Some(held("7", false)),
            Some(job("7")),
        ),
    ];
    for (case, held, cached) in cases {
        assert_eq!(plan(held.as_ref(), cached.as_ref()), Write::Skip, "{case}");
    }
}

/// A deferred placement made from a version the job has since left is not
/// written and not forgotten either: the writer drops it and names the
/// attempt, whose placement the job's reconcile then writes anew.
#[test]
fn a_deferred_placement_of_an_older_version_is_stale() {
    let mut placed = held("7", true);
    placed.status.placement = Some(crate::api::PlacementStatus {
        compute_percent: None,
        node: "n".into(),
        gpus: vec![],
        budget_bytes: 1,
        memory_fraction: 0.1,
        attempt: 3,
        gpu_model: None,
        micro_batch: None,
        elastic: None,
    });
    assert_eq!(
        plan(Some(&placed), Some(&job("8"))),
        Write::Stale {
            resource_version: "7".into(),
            attempt: Some(3)
        }
    );
    assert_eq!(
        plan(Some(&held("7", true)), Some(&job("8"))),
        Write::Stale {
            resource_version: "7".into(),
            attempt: None
        }
    );
}

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(Box::new(
        kube::core::Status::failure("refused", "Reason").with_code(code),
    ))
}

#[test]
fn a_refused_write_is_dropped_only_when_it_can_never_land() {
    assert!(matches!(outcome(Ok::<u8, _>(7)), Outcome::Written(7)));
    let cases = [
        (404, "the job is gone", true),
        (409, "a conflict: the job changed", true),
        (422, "the resourceVersion test failed", true),
        (429, "too many requests", false),
        (500, "the server failed", false),
        (503, "the server is away", false),
        (403, "not allowed (RBAC is being fixed)", false),
    ];
    for (code, case, superseded) in cases {
        let got = outcome::<()>(Err(api_error(code)));
        assert_eq!(
            matches!(got, Outcome::Superseded),
            superseded,
            "{code} {case}: {got:?}"
        );
        assert_eq!(
            matches!(got, Outcome::Retry(_)),
            !superseded,
            "{code} {case}"
        );
    }
    let lost = kube::Error::Service("connection reset".into());
    assert!(matches!(outcome::<()>(Err(lost)), Outcome::Retry(_)));
}

#[test]
fn deferred_writes_are_made_by_the_controllers_field_manager() {
    assert_eq!(params().field_manager.as_deref(), Some(FIELD_MANAGER));
    assert!(!params().force, "a status patch never forces ownership");
}

#[test]
fn the_write_is_tied_to_the_version_it_was_made_from() {
    let status = TrainingJobStatus {
        phase: Phase::Placed,
        attempt: 1,
        ..Default::default()
    };
    let patch = serde_json::to_value(patch("42", &status).unwrap()).unwrap();
    assert_eq!(
        patch,
        serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
            {"op": "add", "path": "/status", "value": serde_json::to_value(&status).unwrap()}
        ])
    );
}
