//! What a failed reconcile is, as a metric label, and how soon it is retried:
//! a conflict (the cache is behind) at once, a throttled or failing API server
//! after a while, a request the server rejects only after a long pause.

use std::time::Duration;

use kube::runtime::finalizer::Error as FinalizerError;

use crate::Error;

/// Retry of a write that lost a race (409): the watch brings the newer object
/// within moments.
pub const CONFLICT_RETRY: Duration = Duration::from_secs(1);
/// Retry after a transport error or a server error (5xx).
pub const SERVER_RETRY: Duration = Duration::from_secs(5);
/// Retry after the API server asked to slow down (429).
pub const THROTTLED_RETRY: Duration = Duration::from_secs(15);
/// Retry of a request the server rejected (other 4xx) or a local failure:
/// retrying sooner would fail the same way.
pub const REJECTED_RETRY: Duration = Duration::from_secs(60);

/// The metric label of a reconcile error (`vramfit_reconcile_errors_total{error}`).
pub fn error_kind(error: &Error) -> &'static str {
    match error {
        Error::Kube(e) => kube_kind(e),
        Error::Finalizer(e) => match e.as_ref() {
            FinalizerError::ApplyFailed(inner) | FinalizerError::CleanupFailed(inner) => {
                error_kind(inner)
            }
            FinalizerError::AddFinalizer(e) | FinalizerError::RemoveFinalizer(e) => kube_kind(e),
            _ => "finalizer",
        },
        Error::Json(_) | Error::Yaml(_) => "serialisation",
        Error::Io { .. } => "io",
        Error::Leadership(_) | Error::LeadershipLost(_) => "leadership",
        Error::TaskStopped { .. } => "task",
    }
}

fn kube_kind(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) => match status.code {
            409 => "conflict",
            404 => "not_found",
            429 => "throttled",
            500.. => "server",
            _ => "rejected",
        },
        _ => "transport",
    }
}

/// A pod create the API server refused for good: its admission (Pod
/// Security, a ValidatingAdmissionPolicy, a webhook, a quota) or its
/// validation said no, so the same pod would be refused again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRejection {
    /// `Forbidden`, `Invalid`, `QuotaExceeded` or `BadRequest`.
    pub reason: &'static str,
    /// The API server's message, as it wrote it.
    pub message: String,
}

/// The rejection in `status`, when it is one: 400, 403 and 422 are; a
/// conflict, a missing namespace that may yet appear, a throttled or failing
/// server are not (they are retried).
pub fn pod_rejection(status: &kube::core::Status) -> Option<PodRejection> {
    let reason = match status.code {
        403 if status.message.contains("exceeded quota") => "QuotaExceeded",
        403 => "Forbidden",
        422 => "Invalid",
        400 => "BadRequest",
        _ => return None,
    };
    Some(PodRejection {
        reason,
        message: status.message.clone(),
    })
}

/// How long to wait before reconciling a job again after `error`.
pub fn retry_delay(error: &Error) -> Duration {
    match error_kind(error) {
        "conflict" | "not_found" => CONFLICT_RETRY,
        "server" | "transport" => SERVER_RETRY,
        "throttled" => THROTTLED_RETRY,
        _ => REJECTED_RETRY,
    }
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
