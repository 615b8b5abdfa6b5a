//! Writes placed jobs' status after their pods, a few at a time.
//!
//! A placement's status write is the dearest request of a job's path (the
//! API server decodes, prunes, validates and encodes the whole custom
//! resource). The pod needs none of it: it is created first and carries the
//! placement (`pod_ledger`). So the placed status is held in memory
//! (`held`, `deferred_write`), the job's reconciles and the scheduling cycle
//! see it as written, and this task writes it with a bounded number of
//! requests in flight. During a burst of new jobs the pods are created at the
//! rate of the reconciles and the status follows; otherwise the write follows
//! the pod at once.
//!
//! A write is tied to the job's version the status was made from (a JSON
//! patch `test` of `metadata.resourceVersion`): a job changed meanwhile (a
//! spec edit, a newer status written by its reconcile) is left to its
//! reconcile, which decides again. A stop loses what is held: the pod is
//! still there, and the restarted controller takes the placement from it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};

use super::Context;
use super::held::HeldPrediction;
use super::status_patch::FIELD_MANAGER;
use crate::api::{TrainingJob, TrainingJobStatus};
use crate::{Error, Result};

/// Status writes in flight unless `--status-writers` says otherwise.
pub const DEFAULT_WRITERS: usize = 2;

/// How long a failed write waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The queue of jobs whose placed status waits to be written.
#[derive(Clone)]
pub struct StatusQueue {
    sender: futures::channel::mpsc::UnboundedSender<ObjectRef<TrainingJob>>,
}

impl StatusQueue {
    /// A queue and the receiving end [`run`] drains.
    pub fn new() -> (
        Self,
        futures::channel::mpsc::UnboundedReceiver<ObjectRef<TrainingJob>>,
    ) {
        let (sender, receiver) = futures::channel::mpsc::unbounded();
        (Self { sender }, receiver)
    }

    /// Queues the job's held status.
    pub fn push(&self, job: ObjectRef<TrainingJob>) {
        let _ = self.sender.unbounded_send(job);
    }
}

/// What the writer does with a queued job, from what is held for it and the
/// cached job.
#[derive(Debug, PartialEq)]
pub enum Write {
    /// Write this status, tied to this version of the job.
    Status {
        /// The version the status was made from.
        resource_version: String,
        /// The status.
        status: Box<TrainingJobStatus>,
    },
    /// Nothing to write: the job is gone or its status was written since.
    Skip,
    /// The job changed since the held status was made (another writer, a
    /// late write of a stopped controller): the held status is dropped and
    /// the attempt's placement marked unwritten, so the job's reconcile
    /// decides again instead of waiting for a write that never comes.
    Stale {
        /// The version the dropped status was made from.
        resource_version: String,
        /// The attempt of its placement, if it records one.
        attempt: Option<u32>,
    },
}

/// Decides the write of a queued job.
pub fn plan(held: Option<&HeldPrediction>, cached: Option<&TrainingJob>) -> Write {
    let (Some(held), Some(job)) = (held, cached) else {
        return Write::Skip;
    };
    if !held.deferred_write {
        return Write::Skip;
    }
    if job.resource_version().as_deref() != Some(&held.resource_version) {
        return Write::Stale {
            resource_version: held.resource_version.clone(),
            attempt: held.status.placement.as_ref().map(|p| p.attempt),
        };
    }
    Write::Status {
        resource_version: held.resource_version.clone(),
        status: Box::new(held.status.clone()),
    }
}

/// The JSON patch of a deferred write: the whole status, only while the job
/// is still at `resource_version`.
pub fn patch(resource_version: &str, status: &TrainingJobStatus) -> Result<json_patch::Patch> {
    use json_patch::{PatchOperation, TestOperation, jsonptr::PointerBuf};
    let mut patch = super::status_patch::status_patch(status)?;
    patch.0.insert(
        0,
        PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
            value: resource_version.into(),
        }),
    );
    Ok(patch)
}

/// Drains the queue with at most `writers` writes in flight.
pub async fn run(
    ctx: Arc<Context>,
    jobs: Store<TrainingJob>,
    queued: futures::channel::mpsc::UnboundedReceiver<ObjectRef<TrainingJob>>,
    writers: usize,
) -> Result<()> {
    queued
        .for_each_concurrent(writers.max(1), |job| {
            let ctx = ctx.clone();
            let jobs = jobs.clone();
            async move {
                if let Err(error) = write(&ctx, &jobs, &job).await {
                    tracing::warn!(%error, job = job.name, "status write failed; trying again");
                    let queue = ctx.status_queue.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(RETRY_AFTER).await;
                        queue.push(job);
                    });
                }
            }
        })
        .await;
    Ok(())
}

async fn write(
    ctx: &Context,
    jobs: &Store<TrainingJob>,
    job: &ObjectRef<TrainingJob>,
) -> Result<()> {
    let cached = jobs.get(job);
    let uid = cached.as_ref().and_then(|j| j.uid()).unwrap_or_default();
    let held = ctx.held.get_any(&uid);
    let (resource_version, status) = match plan(held.as_ref(), cached.as_deref()) {
        Write::Status {
            resource_version,
            status,
        } => (resource_version, status),
        Write::Skip => return Ok(()),
        Write::Stale {
            resource_version,
            attempt,
        } => {
            ctx.held.forget_if(&uid, &resource_version);
            if let Some(attempt) = attempt {
                ctx.assignments.unmark_recorded(&uid, attempt);
            }
            return Ok(());
        }
    };
    let api: Api<TrainingJob> = Api::namespaced(
        ctx.client.clone(),
        job.namespace.as_deref().unwrap_or_default(),
    );
    ctx.pods_first.wait_turn(super::pods_first::MAX_YIELD).await;
    ctx.fence.check()?;
    let own = ctx.own_writes.begin(&uid);
    let result = api
        .patch_status(
            &job.name,
            &params(),
            &Patch::Json::<()>(patch(&resource_version, &status)?),
        )
        .await;
    match outcome(result) {
        Outcome::Written(written) => {
            ctx.held.forget_if(&uid, &resource_version);
            own.wrote(written.metadata.resource_version);
            ctx.metrics.status_writes_deferred.inc();
            Ok(())
        }
        Outcome::Superseded => {
            ctx.held.forget_if(&uid, &resource_version);
            if let Some(placement) = &status.placement {
                ctx.assignments.unmark_recorded(&uid, placement.attempt);
            }
            Ok(())
        }
        Outcome::Retry(e) => Err(Error::Kube(e)),
    }
}

/// The parameters of a deferred write: the controller's field manager, so
/// that the status fields stay owned by the same manager as the reconcile's
/// own writes.
fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// What the API server's answer to a deferred write means.
#[derive(Debug)]
enum Outcome<T> {
    /// Written: the job as it is now.
    Written(T),
    /// Not written and never to be: the job is gone (404), or it changed
    /// since the status was made (the `test` failed: 422; a conflict: 409).
    /// The held status is dropped and the job's reconcile decides again.
    Superseded,
    /// Not written for a reason that may pass (the server busy or away, a
    /// lost connection): written again after [`RETRY_AFTER`].
    Retry(kube::Error),
}

fn outcome<T>(result: std::result::Result<T, kube::Error>) -> Outcome<T> {
    match result {
        Ok(written) => Outcome::Written(written),
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => Outcome::Superseded,
        Err(e) => Outcome::Retry(e),
    }
}

#[cfg(test)]
#[path = "status_writer_tests.rs"]
mod tests;
