use super::*;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
}

fn lease(holder: Option<&str>, renewed: Option<i64>, acquired: Option<i64>) -> Lease {
    let time = |s: i64| MicroTime(Timestamp::from_second(s).unwrap());
    Lease {
        spec: Some(LeaseSpec {
            holder_identity: holder.map(Into::into),
            lease_duration_seconds: Some(15),
            renew_time: renewed.map(time),
            acquire_time: acquired.map(time),
            ..LeaseSpec::default()
        }),
        ..Lease::default()
    }
}

#[test]
fn the_holder_may_act_until_the_expiry_less_the_skew_margin() {
    let renewed = lease(Some("me"), Some(1_000), Some(900));
    assert_eq!(hold_until(&renewed, "me"), Some(at(1_013)));
    // Acquired, never renewed.
    assert_eq!(
        hold_until(&lease(Some("me"), None, Some(900)), "me"),
        Some(at(913))
    );
    assert_eq!(hold_until(&renewed, "other"), None);
    assert_eq!(hold_until(&lease(None, Some(1_000), None), "me"), None);
    assert_eq!(hold_until(&lease(Some("me"), None, None), "me"), None);
}

#[test]
fn writes_go_until_the_deadline_and_not_after() {
    let fence = Fence::until(at(100));
    assert!(fence.check_at(at(99)).is_ok());
    assert!(matches!(
        fence.check_at(at(100)),
        Err(Error::LeadershipLost(_))
    ));
    // A renewal moves the deadline on, never back.
    fence.renewed(at(120));
    assert!(fence.check_at(at(110)).is_ok());
    fence.renewed(at(105));
    assert_eq!(fence.deadline(), Some(at(120)));
}

#[test]
fn a_lost_lease_closes_the_fence_for_good_and_no_fence_never_closes() {
    let fence = Fence::until(at(100));
    fence.lose();
    assert!(fence.check_at(at(1)).is_err());
    fence.renewed(at(200));
    assert!(fence.check_at(at(1)).is_err(), "not reopened");
    assert_eq!(fence.deadline(), None);
    let open = Fence::unfenced();
    assert!(open.check_at(at(u32::MAX as u64)).is_ok());
    assert_eq!(open.deadline(), None);
}

/// A reconcile of a replica whose fence closed fails with the lost
/// leadership before it sends anything: its client points at a port where
/// nothing listens, so any request would fail with a connection error.
#[tokio::test]
async fn a_reconcile_behind_a_closed_fence_fails_before_any_request() {
    use crate::api::TrainingJob;
    use crate::controller::{Context, metrics::Metrics, reconcile, scheduler::Assignments};
    use kube::runtime::reflector;
    use std::sync::Arc;
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let context = |fence: Fence| {
        Arc::new(Context {
            client: client.clone(),
            events: crate::controller::recorder::EventQueue::new().0,
            metrics: Arc::new(Metrics::default()),
            assignments: Assignments::default(),
            held: Default::default(),
            own_writes: Default::default(),
            index: Default::default(),
            gpu_nodes: reflector::store().0,
            gpu_models_cache: Default::default(),
            pods: reflector::store().0,
            wake: Default::default(),
            fence: Arc::new(fence),
            status_queue: crate::controller::status_writer::StatusQueue::new().0,
            defer_placed_status: false,
            pods_first: Default::default(),
            elastic_default: false,
            compute_default: None,
        })
    };
    let job: Arc<TrainingJob> = Arc::new(
        TrainingJob::test("j")
            .uid("u-1")
            .meta("generation", serde_json::Value::Null)
            .template(serde_json::json!({}))
            .build(),
    );
    let past = Fence::until(SystemTime::now() - Duration::from_secs(1));
    let error = reconcile::reconcile(job.clone(), context(past))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::LeadershipLost(_)), "{error}");
    // An open fence lets it go on to the API server (and fail there).
    let error = reconcile::reconcile(job, context(Fence::unfenced()))
        .await
        .unwrap_err();
    assert!(!matches!(error, Error::LeadershipLost(_)), "{error}");
}

#[tokio::test]
async fn a_failed_check_wakes_the_task_waiting_for_the_close() {
    let fence = std::sync::Arc::new(Fence::until(at(100)));
    let waiter = {
        let fence = fence.clone();
        tokio::spawn(async move { fence.closed().await })
    };
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(fence.check_at(at(50)).is_ok());
    assert!(!waiter.is_finished());
    assert!(fence.check_at(at(150)).is_err());
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken")
        .unwrap();
}
