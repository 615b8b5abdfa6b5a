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
mod tests {
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
}
