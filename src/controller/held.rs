//! What the controller keeps in memory between a job's reconciles to save API
//! requests: predictions not yet written, and the versions its own status
//! writes produced.
//!
//! A new job's prediction is held until the first scheduling cycle has placed
//! it (or said why it waits), and then written once together with that
//! verdict: one status write per job on the common path instead of two. A
//! held prediction is only valid for the job version it was made from; any
//! change of the job (a spec edit, a status written by anyone) drops it and
//! the job is predicted again. A restart loses what is held, which costs a
//! prediction, nothing else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::api::{TrainingJob, TrainingJobStatus};

/// A prediction made and not yet written.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldPrediction {
    /// The job version it was made from.
    pub resource_version: String,
    /// The predicted status, as it would have been written.
    pub status: TrainingJobStatus,
    /// The note of the prediction's event, sent with the write that records it.
    pub note: String,
    /// A placed status whose pod exists, written by the status writer
    /// (`status_writer`) rather than with the next step.
    pub deferred_write: bool,
}

impl HeldPrediction {
    /// True when it was made from this version of the job.
    fn made_from(&self, resource_version: Option<&str>) -> bool {
        resource_version == Some(self.resource_version.as_str())
    }

    /// The job as it would be with its prediction written.
    pub fn overlay(&self, job: &TrainingJob) -> TrainingJob {
        let mut seen = job.clone();
        seen.status = Some(self.status.clone());
        seen
    }
}

/// Held predictions by job UID.
#[derive(Default)]
pub struct HeldPredictions {
    inner: Mutex<HashMap<String, Held>>,
}

/// A held prediction and the job as the cycle sees it with it, made once:
/// a burst of new jobs holds thousands of placed statuses until the status
/// writer has written them, and every cycle reads them all.
struct Held {
    prediction: HeldPrediction,
    seen: Option<Arc<TrainingJob>>,
}

impl HeldPredictions {
    /// Holds a prediction of `uid` (replacing an older one).
    pub fn hold(&self, uid: &str, held: HeldPrediction) {
        self.lock().insert(
            uid.to_string(),
            Held {
                prediction: held,
                seen: None,
            },
        );
    }

    /// The prediction held for `uid` if it was made from `resource_version`.
    pub fn get(&self, uid: &str, resource_version: Option<&str>) -> Option<HeldPrediction> {
        self.lock()
            .get(uid)
            .map(|h| &h.prediction)
            .filter(|h| h.made_from(resource_version))
            .cloned()
    }

    /// What is held for `uid`, whatever version it was made from.
    pub fn get_any(&self, uid: &str) -> Option<HeldPrediction> {
        self.lock().get(uid).map(|h| h.prediction.clone())
    }

    /// Drops what is held for `uid` if it was made from `resource_version`
    /// (a newer hold stays).
    pub fn forget_if(&self, uid: &str, resource_version: &str) {
        let mut held = self.lock();
        if held
            .get(uid)
            .is_some_and(|h| h.prediction.resource_version == resource_version)
        {
            held.remove(uid);
        }
    }

    /// Drops what is held for `uid` (its status was written, or it is gone).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// The jobs as the scheduling cycle must see them: a job with a held
    /// prediction for its current version carries that prediction. The job
    /// with its prediction is made on the first call and shared after: the
    /// cached job of one version does not change.
    pub fn overlay_all(&self, jobs: Vec<Arc<TrainingJob>>) -> Vec<Arc<TrainingJob>> {
        let mut held = self.lock();
        if held.is_empty() {
            return jobs;
        }
        jobs.into_iter()
            .map(|job| {
                let uid = job.metadata.uid.as_deref().unwrap_or_default();
                match held.get_mut(uid).filter(|h| {
                    h.prediction
                        .made_from(job.metadata.resource_version.as_deref())
                }) {
                    Some(h) => h
                        .seen
                        .get_or_insert_with(|| Arc::new(h.prediction.overlay(&job)))
                        .clone(),
                    None => job,
                }
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.inner.lock().expect("held predictions lock")
    }
}

/// The `resourceVersion` each job's last status write by this process
/// returned. A cached job at that version is what this process wrote last,
/// so nothing written before it (by an earlier leader, or an older attempt)
/// can be newer than the cache: the read-back before creating a pod is then
/// not needed.
///
/// Two writes of one job can be in flight at once (the reconcile's and the
/// status writer's), and their answers can come back in either order, so the
/// last answer processed is not always the newest version. A write that
/// overlapped another of the same job records nothing ("not known"): the
/// next pod create reads the job back. A write that failed records nothing
/// either (it may have landed).
#[derive(Default)]
pub struct OwnWrites {
    inner: Mutex<HashMap<String, Own>>,
}

#[derive(Default)]
struct Own {
    /// The version the last write returned, when it is known to be the newest.
    version: Option<String>,
    in_flight: u32,
    /// A write began while another was in flight.
    overlapped: bool,
}

/// One status write of a job, begun with [`OwnWrites::begin`]; dropped
/// without [`OwnWrite::wrote`], it counts as failed.
pub struct OwnWrite<'a> {
    writes: &'a OwnWrites,
    uid: String,
    version: Option<String>,
}

impl OwnWrite<'_> {
    /// The write succeeded and returned `version`.
    pub fn wrote(mut self, version: Option<String>) {
        self.version = version;
    }
}

impl Drop for OwnWrite<'_> {
    fn drop(&mut self) {
        let mut writes = self.writes.lock();
        let own = writes.entry(self.uid.clone()).or_default();
        own.in_flight = own.in_flight.saturating_sub(1);
        own.version = if own.overlapped {
            None
        } else {
            self.version.take()
        };
        if own.in_flight == 0 {
            own.overlapped = false;
            if own.version.is_none() {
                writes.remove(&self.uid);
            }
        }
    }
}

impl OwnWrites {
    /// Begins a status write of `uid`; record what it returns on the result.
    pub fn begin(&self, uid: &str) -> OwnWrite<'_> {
        let mut writes = self.lock();
        let own = writes.entry(uid.to_string()).or_default();
        own.in_flight += 1;
        if own.in_flight > 1 {
            own.overlapped = true;
        }
        OwnWrite {
            writes: self,
            uid: uid.to_string(),
            version: None,
        }
    }

    /// True when `job` (from the cache) is the version this process wrote last.
    pub fn is_latest(&self, job: &TrainingJob) -> bool {
        let uid = job.metadata.uid.as_deref().unwrap_or_default();
        let writes = self.lock();
        job.metadata
            .resource_version
            .as_ref()
            .is_some_and(|version| {
                writes
                    .get(uid)
                    .is_some_and(|own| own.in_flight == 0 && own.version.as_ref() == Some(version))
            })
    }

    /// Forgets `uid` (the job is gone).
    pub fn forget(&self, uid: &str) {
        let mut writes = self.lock();
        if let Some(own) = writes.get_mut(uid) {
            own.version = None;
            if own.in_flight == 0 {
                writes.remove(uid);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Own>> {
        self.inner.lock().expect("own writes lock")
    }
}

#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
