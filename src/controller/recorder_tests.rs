use super::*;

fn job() -> TrainingJob {
    TrainingJob::test("j")
        .meta("uid", serde_json::json!("u-1"))
        .build()
}

#[tokio::test]
async fn a_reconcile_queues_its_event_without_waiting_for_the_api() {
    // Nothing sends: publishing returns at once while the queue has room,
    // and the event waits there, in order, with its job.
    let (queue, mut receiver) = EventQueue::new();
    let job = job();
    let publish = async {
        queue
            .publish(&job, EventType::Normal, "Predicted", "first".into())
            .await;
        queue
            .publish(&job, EventType::Warning, "Placed", "x".repeat(2000))
            .await;
    };
    tokio::time::timeout(std::time::Duration::from_secs(1), publish)
        .await
        .expect("publishing waited although the queue had room");
    let first = receiver.try_recv().unwrap();
    assert_eq!(first.event.reason, "Predicted");
    assert_eq!(first.job.name.as_deref(), Some("j"));
    assert_eq!(first.job.namespace.as_deref(), Some("ml"));
    assert_eq!(first.job.uid.as_deref(), Some("u-1"));
    let second = receiver.try_recv().unwrap();
    assert_eq!(second.event.reason, "Placed");
    assert!(matches!(second.event.type_, EventType::Warning));
    assert_eq!(
        second.event.note.unwrap().len(),
        1000,
        "cut to the API's limit"
    );
}

#[tokio::test]
async fn a_full_queue_holds_the_reconcile_back_instead_of_dropping_events() {
    let (queue, mut receiver) = EventQueue::new();
    let job = job();
    for i in 0..QUEUE {
        queue
            .publish(&job, EventType::Normal, "Predicted", format!("{i}"))
            .await;
    }
    let one_more = queue.publish(&job, EventType::Normal, "Placed", "last".into());
    let mut one_more = std::pin::pin!(one_more);
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), &mut one_more)
            .await
            .is_err(),
        "a full queue must make the publisher wait"
    );
    receiver.recv().await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(1), one_more)
        .await
        .expect("room made, the event is queued");
    let mut last = None;
    while let Ok(queued) = receiver.try_recv() {
        last = Some(queued.event.reason);
    }
    assert_eq!(last.as_deref(), Some("Placed"));
}
