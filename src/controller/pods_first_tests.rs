use super::*;
use std::sync::Arc;
use std::time::Instant;

#[tokio::test]
async fn a_report_waits_for_the_creates_in_flight_and_no_longer_than_its_limit() {
    let gate = Arc::new(PodsFirst::default());
    let started = Instant::now();
    gate.wait_turn(Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "nothing in flight"
    );

    let guard = gate.creating();
    let second = gate.creating();
    assert_eq!(gate.in_flight(), 2);
    let waiter = {
        let gate = gate.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            gate.wait_turn(Duration::from_secs(5)).await;
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(guard);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "one create is still in flight");
    drop(second);
    let waited = waiter.await.unwrap();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
        "{waited:?}"
    );

    let _held = gate.creating();
    let started = Instant::now();
    gate.wait_turn(Duration::from_millis(100)).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
}
