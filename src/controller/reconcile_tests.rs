use std::time::Duration;

use super::*;

#[tokio::test]
async fn a_prediction_is_bounded_in_time_and_its_panic_is_an_answer() {
    let limit = Duration::from_millis(100);
    assert_eq!(bounded(limit, || 7).await, Ok(7));
    let slow = bounded(limit, || std::thread::sleep(Duration::from_millis(600))).await;
    assert_eq!(
        slow,
        Err("the prediction did not finish within 0 s".into()),
        "past the limit"
    );
    // A panic's backtrace takes a while to print.
    let limit = Duration::from_secs(30);
    let panicked = bounded(limit, || -> u32 {
        panic!("attempt to multiply with overflow")
    })
    .await;
    assert_eq!(
        panicked,
        Err("the prediction failed: attempt to multiply with overflow".into())
    );
    let formatted = bounded(limit, || -> u32 { panic!("layer {}", 3) }).await;
    assert_eq!(formatted, Err("the prediction failed: layer 3".into()));
}
