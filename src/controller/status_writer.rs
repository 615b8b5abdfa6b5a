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
    /// Nothing to write: the job is gone, its status was written since, or
    /// the job changed and its reconcile decides again.
    Skip,
}

/// Decides the write of a queued job.
pub fn plan(held: Option<&HeldPrediction>, cached: Option<&TrainingJob>) -> Write {
    let (Some(held), Some(job)) = (held, cached) else {
        return Write::Skip;
    };
    if !held.deferred_write || job.resource_version().as_deref() != Some(&held.resource_version) {
        return Write::Skip;
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
    let Write::Status {
        resource_version,
        status,
    } = plan(held.as_ref(), cached.as_deref())
    else {
        return Ok(());
    };
    let api: Api<TrainingJob> = Api::namespaced(
        ctx.client.clone(),
        job.namespace.as_deref().unwrap_or_default(),
    );
    ctx.pods_first.wait_turn(super::pods_first::MAX_YIELD).await;
    ctx.fence.check()?;
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
            ctx.own_writes
                .wrote(&uid, written.metadata.resource_version);
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
mod tests {
    use super::*;
    use crate::api::Phase;

    fn job(version: &str) -> TrainingJob {
        let mut job: TrainingJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u", "resourceVersion": version},
            "spec": {"model": {"mlp": {"layers": 2, "hidden": 64}},
                     "batch": {"global": 8, "micro": 8},
                     "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}
        }))
        .unwrap();
        job.status = None;
        job
    }

    fn held(version: &str, deferred_write: bool) -> HeldPrediction {
        HeldPrediction {
            resource_version: version.into(),
            status: TrainingJobStatus {
                phase: Phase::Placed,
                ..Default::default()
            },
            note: String::new(),
            deferred_write,
        }
    }

    #[test]
    fn only_a_deferred_placement_of_the_cached_version_is_written() {
        let status = held("7", true).status;
        assert_eq!(
            plan(Some(&held("7", true)), Some(&job("7"))),
            Write::Status {
                resource_version: "7".into(),
                status: Box::new(status)
            }
        );
        let cases = [
            ("nothing held", None, Some(job("7"))),
            ("the job is gone", Some(held("7", true)), None),
            (
                "the job changed since",
                Some(held("7", true)),
                Some(job("8")),
            ),
            (
                "a held prediction, written with its verdict",
                Some(held("7", false)),
                Some(job("7")),
            ),
        ];
        for (case, held, cached) in cases {
            assert_eq!(plan(held.as_ref(), cached.as_ref()), Write::Skip, "{case}");
        }
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Reason").with_code(code),
        ))
    }

    #[test]
    fn a_refused_write_is_dropped_only_when_it_can_never_land() {
        assert!(matches!(outcome(Ok::<u8, _>(7)), Outcome::Written(7)));
        let cases = [
            (404, "the job is gone", true),
            (409, "a conflict: the job changed", true),
            (422, "the resourceVersion test failed", true),
            (429, "too many requests", false),
            (500, "the server failed", false),
            (503, "the server is away", false),
            (403, "not allowed (RBAC is being fixed)", false),
        ];
        for (code, case, superseded) in cases {
            let got = outcome::<()>(Err(api_error(code)));
            assert_eq!(
                matches!(got, Outcome::Superseded),
                superseded,
                "{code} {case}: {got:?}"
            );
            assert_eq!(
                matches!(got, Outcome::Retry(_)),
                !superseded,
                "{code} {case}"
            );
        }
        let lost = kube::Error::Service("connection reset".into());
        assert!(matches!(outcome::<()>(Err(lost)), Outcome::Retry(_)));
    }

    #[test]
    fn deferred_writes_are_made_by_the_controllers_field_manager() {
        assert_eq!(params().field_manager.as_deref(), Some(FIELD_MANAGER));
        assert!(!params().force, "a status patch never forces ownership");
    }

    #[test]
    fn the_write_is_tied_to_the_version_it_was_made_from() {
        let status = TrainingJobStatus {
            phase: Phase::Placed,
            attempt: 1,
            ..Default::default()
        };
        let patch = serde_json::to_value(patch("42", &status).unwrap()).unwrap();
        assert_eq!(
            patch,
            serde_json::json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/status", "value": serde_json::to_value(&status).unwrap()}
            ])
        );
    }
}
