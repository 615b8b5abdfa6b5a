//! The leader's fence: every write the controller makes as the leader (a
//! job's status, its finalizer, a pod, a GpuNode allocation) first checks that
//! the Lease it last saw itself renew has not expired by its own clock.
//!
//! The lease manager says when another replica holds the Lease, but only once
//! it has asked the API server; a replica that was paused (SIGSTOP, a frozen
//! VM, a long GC-like stall) past its Lease resumes with its reconciles and
//! scheduling cycle ready to write on a stale view, and they would race the
//! manager's first request. The fence closes at the Lease's expiry (less a
//! margin for clock skew), so those writes fail before they are sent, and a
//! leader that cannot renew (the API server away longer than the Lease) stops
//! acting when its Lease runs out instead of when the API server answers again.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::Notify;

use crate::{Error, Result};

/// How long before the Lease's expiry the fence closes: the clock skew a
/// standby's judgement of the expiry may have. Less than the lease manager's
/// grace (5 s), so a renewal is seen before the fence closes.
pub const SKEW_MARGIN: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Hold {
    /// No leader election: every write may go.
    Unfenced,
    /// Writes may go until then.
    Until(SystemTime),
    /// The Lease is held by another replica.
    Lost,
}

/// Whether this replica may still write as the leader.
#[derive(Debug)]
pub struct Fence {
    hold: Mutex<Hold>,
    closed: Notify,
}

impl Fence {
    /// A fence that never closes (a single replica without election).
    pub fn unfenced() -> Self {
        Self::with(Hold::Unfenced)
    }

    /// A fence open until `until`.
    pub fn until(until: SystemTime) -> Self {
        Self::with(Hold::Until(until))
    }

    fn with(hold: Hold) -> Self {
        Self {
            hold: Mutex::new(hold),
            closed: Notify::new(),
        }
    }

    fn hold(&self) -> Hold {
        *self.hold.lock().expect("fence lock")
    }

    /// The Lease was seen renewed: writes may go until `until`. Does not
    /// reopen a fence that the Lease's loss closed.
    pub fn renewed(&self, until: SystemTime) {
        let mut hold = self.hold.lock().expect("fence lock");
        if let Hold::Until(current) = *hold {
            *hold = Hold::Until(current.max(until));
        }
    }

    /// Another replica holds the Lease: no write goes any more.
    pub fn lose(&self) {
        *self.hold.lock().expect("fence lock") = Hold::Lost;
        self.closed.notify_waiters();
    }

    /// When the fence closes by itself (`None`: never, or closed already).
    pub fn deadline(&self) -> Option<SystemTime> {
        match self.hold() {
            Hold::Until(until) => Some(until),
            Hold::Unfenced | Hold::Lost => None,
        }
    }

    /// `Ok` when a write may go now; else `Error::LeadershipLost`, and the
    /// task waiting in [`Fence::closed`] wakes.
    pub fn check(&self) -> Result<()> {
        self.check_at(SystemTime::now())
    }

    /// [`Fence::check`] at `now`.
    pub fn check_at(&self, now: SystemTime) -> Result<()> {
        let reason = match self.hold() {
            Hold::Unfenced => return Ok(()),
            Hold::Until(until) if now < until => return Ok(()),
            Hold::Until(_) => "the Lease expired before it was seen renewed",
            Hold::Lost => "the Lease is held by another replica",
        };
        self.closed.notify_waiters();
        Err(Error::LeadershipLost(reason.into()))
    }

    /// Waits until a check fails or the Lease is lost.
    pub async fn closed(&self) {
        self.closed.notified().await;
    }
}

/// Until when `identity` may act on `lease`: its expiry (renewal, or else
/// acquisition, plus its duration) less [`SKEW_MARGIN`]; `None` when another
/// identity (or none) holds it or it carries no time.
pub fn hold_until(lease: &Lease, identity: &str) -> Option<SystemTime> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let seconds = u64::try_from(spec.lease_duration_seconds?).ok()?;
    let renewed = SystemTime::from(renewed);
    Some(renewed + Duration::from_secs(seconds) - SKEW_MARGIN)
}

#[cfg(test)]
#[path = "fence_tests.rs"]
mod tests;
