//! Kubernetes Events on the jobs, sent by a task of their own: a reconcile
//! queues its events and goes on, instead of waiting for one request per
//! event after its status write or pod create.
//!
//! The queue is bounded ([`QUEUE`]): when the API server falls that far
//! behind, a reconcile waits for room, so events are delayed but not dropped.
//! At most [`CONCURRENCY`] events are in flight; they start in the order they
//! were queued.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;

use crate::Result;
use crate::api::TrainingJob;

/// Events waiting to be sent.
pub const QUEUE: usize = 4096;

/// Events sent at once.
pub const CONCURRENCY: usize = 8;

/// One event on one job.
pub struct Queued {
    /// The job.
    pub job: ObjectReference,
    /// The event.
    pub event: Event,
}

/// Where reconciles queue their events.
#[derive(Clone)]
pub struct EventQueue(mpsc::Sender<Queued>);

impl EventQueue {
    /// A queue and the receiving end that [`send_all`] empties.
    pub fn new() -> (Self, mpsc::Receiver<Queued>) {
        let (sender, receiver) = mpsc::channel(QUEUE);
        (Self(sender), receiver)
    }

    /// Queues an event on `job` (the note is cut to the API's 1,000
    /// characters). Waits only when the queue is full.
    pub async fn publish(&self, job: &TrainingJob, type_: EventType, reason: &str, note: String) {
        let queued = Queued {
            job: job.object_ref(&()),
            event: Event {
                type_,
                reason: reason.into(),
                note: Some(note.chars().take(1000).collect()),
                action: reason.into(),
                secondary: None,
            },
        };
        if self.0.send(queued).await.is_err() {
            // Only when the sender task is gone, which ends the controller.
            tracing::warn!("event queue closed; event not sent");
        }
    }
}

/// The sender task: publishes queued events until every queue handle is
/// dropped. A failed event is logged, not retried.
pub async fn send_all(
    recorder: Recorder,
    receiver: mpsc::Receiver<Queued>,
    pods_first: std::sync::Arc<super::pods_first::PodsFirst>,
) -> Result<()> {
    tokio_stream_of(receiver)
        .map(|queued| {
            let recorder = recorder.clone();
            let pods_first = pods_first.clone();
            async move {
                pods_first.wait_turn(super::pods_first::MAX_YIELD).await;
                if let Err(error) = recorder.publish(&queued.event, &queued.job).await {
                    tracing::warn!(
                        %error,
                        job = queued.job.name.as_deref().unwrap_or_default(),
                        reason = queued.event.reason,
                        "could not publish event"
                    );
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<()>()
        .await;
    Ok(())
}

fn tokio_stream_of<T>(mut receiver: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

#[cfg(test)]
#[path = "recorder_tests.rs"]
mod tests;
