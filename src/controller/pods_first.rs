//! Pods before bookkeeping: the status writer and the event sender give way
//! to the pod creates in flight.
//!
//! On a busy API server every request in flight takes its share of the CPU.
//! A placed status (the dearest write of a job's path) and an event are only
//! reports; the pod is what starts the job. So while pods are being created,
//! each report waits for the creates to drain, for at most [`MAX_YIELD`], so
//! that a steady stream of new jobs still sees its statuses and events.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The longest a report waits for the pod creates in flight.
pub const MAX_YIELD: Duration = Duration::from_millis(250);

/// Counts the pod creates in flight.
#[derive(Default)]
pub struct PodsFirst {
    in_flight: AtomicUsize,
    drained: Notify,
}

/// Held while a pod create is in flight.
pub struct Creating<'a>(&'a PodsFirst);

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.drained.notify_waiters();
        }
    }
}

impl PodsFirst {
    /// Marks a pod create in flight until the guard is dropped.
    pub fn creating(&self) -> Creating<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Creating(self)
    }

    /// Pod creates in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Waits until no pod create is in flight, or `max` has passed.
    pub async fn wait_turn(&self, max: Duration) {
        let _ = tokio::time::timeout(max, async {
            loop {
                let drained = self.drained.notified();
                if self.in_flight() == 0 {
                    return;
                }
                drained.await;
            }
        })
        .await;
    }
}

#[cfg(test)]
#[path = "pods_first_tests.rs"]
mod tests;
