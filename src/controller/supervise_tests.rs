use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

async fn forever() -> Result<()> {
    std::future::pending().await
}

/// The first exit, failing the test instead of hanging when none comes.
async fn first(supervisor: &mut Supervisor) -> Error {
    tokio::time::timeout(Duration::from_secs(5), supervisor.first_exit())
        .await
        .expect("a task ended")
}

#[tokio::test]
async fn a_panicking_task_is_reported_by_name_with_its_message() {
    let mut supervisor = Supervisor::default();
    supervisor.spawn("watch", forever());
    supervisor.spawn("scheduling loop", async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        panic!("index out of range");
    });
    let error = first(&mut supervisor).await.to_string();
    assert_eq!(
        error,
        "background task scheduling loop stopped: it panicked: index out of range"
    );
}

#[tokio::test]
async fn a_task_that_fails_or_ends_is_reported() {
    let mut supervisor = Supervisor::default();
    supervisor.spawn("metrics server", async {
        Err(Error::Io {
            path: "127.0.0.1:1".into(),
            source: std::io::Error::other("address in use"),
        })
    });
    assert_eq!(
        first(&mut supervisor).await.to_string(),
        "background task metrics server stopped: 127.0.0.1:1: address in use"
    );
    let mut supervisor = Supervisor::default();
    supervisor.spawn("node watch", async { Ok(()) });
    assert_eq!(
        first(&mut supervisor).await.to_string(),
        "background task node watch stopped: it ended"
    );
}

#[tokio::test]
async fn a_lost_lease_is_reported_as_itself() {
    let mut supervisor = Supervisor::default();
    supervisor.spawn("lease", async {
        Err(Error::LeadershipLost("the Lease has another holder".into()))
    });
    assert!(matches!(
        first(&mut supervisor).await,
        Error::LeadershipLost(_)
    ));
}

#[tokio::test]
async fn the_other_tasks_stop_when_the_supervisor_is_dropped() {
    let stopped = Arc::new(AtomicBool::new(false));
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let mut supervisor = Supervisor::default();
    let guard = SetOnDrop(stopped.clone());
    supervisor.spawn("cycle", async move {
        let _guard = guard;
        forever().await
    });
    supervisor.spawn("short", async { Ok(()) });
    let _ = first(&mut supervisor).await;
    assert!(!stopped.load(Ordering::SeqCst), "still running");
    drop(supervisor);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(stopped.load(Ordering::SeqCst), "aborted");
}
