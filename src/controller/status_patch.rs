//! Writing a TrainingJob's status, its conditions and its events.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use crate::api::{TrainingJob, TrainingJobStatus};
use crate::{Error, Result};

/// Field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "vramfit-controller";

/// Condition: the spec cannot be run (an unknown model type, a profile that
/// does not parse, a malformed pod template).
pub const CONDITION_INVALID: &str = "Invalid";
/// Condition: the current attempt holds a GPU placement.
pub const CONDITION_PLACED: &str = "Placed";
/// Condition: the job finished (successfully or not).
pub const CONDITION_COMPLETE: &str = "Complete";
/// Condition type: the API server refused the attempt's pod (admission or
/// validation); the job waits for its spec to change.
pub const CONDITION_POD_REJECTED: &str = "PodRejected";

/// Event reasons (PascalCase, as Kubernetes events expect).
pub mod reason {
    /// The memory prediction was made.
    pub const PREDICTED: &str = "Predicted";
    /// The spec cannot be run.
    pub const INVALID: &str = "Invalid";
    /// The automatic capture of the job's allocation profile failed.
    pub const PROFILE_FAILED: &str = "ProfileFailed";
    /// A GPU placement was made.
    pub const PLACED: &str = "Placed";
    /// The job waits for room.
    pub const WAITING: &str = "WaitingForRoom";
    /// No node of the cluster could hold the job even when empty (a job
    /// larger than any GPU, a GPU model the cluster lacks, ...).
    pub const FITS_NO_NODE: &str = "FitsNoNode";
    /// The attempt's pod was created.
    pub const POD_CREATED: &str = "PodCreated";
    /// The attempt ran out of GPU memory.
    pub const OUT_OF_MEMORY: &str = "OutOfMemory";
    /// A new attempt with a smaller micro-batch follows.
    pub const RETRYING: &str = "Retrying";
    /// The attempt's container started without its GPU; the same shape is
    /// tried again.
    pub const NO_GPU: &str = "NoGpu";
    /// The training process absorbed an OOM itself with a smaller micro-batch.
    pub const OOM_ABSORBED: &str = "OomAbsorbed";
    /// The job succeeded.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The job failed.
    pub const FAILED: &str = "Failed";
    /// The API server refused the attempt's pod.
    pub const POD_REJECTED: &str = "PodRejected";
    /// Elastic placement started the attempt with a smaller shape than it
    /// prefers.
    pub const ELASTIC_SHAPE: &str = "ElasticShape";
}

/// Sets `type_` in `conditions`, keeping the transition time when the status
/// does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let now = Time(Timestamp::now());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = now;
            }
            existing.status = status;
            existing.reason = reason.into();
            existing.message = message.into();
            existing.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: message.into(),
            observed_generation: generation,
            last_transition_time: now,
        }),
    }
}

/// Replaces the whole status with one JSON patch (`add` of `/status`: it
/// replaces the member when present and creates it when not). The controller
/// owns every status field, so fields left out are removed. A JSON patch
/// costs the API server less than a server-side apply of the same status
/// (no YAML decoding of the patch, no field-ownership merge), and this is the
/// write every job makes. Returns the job's new `resourceVersion`.
pub async fn write_status(
    api: &Api<TrainingJob>,
    job: &TrainingJob,
    status: &TrainingJobStatus,
) -> Result<Option<String>> {
    let written = api
        .patch_status(
            &job.name_any(),
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Json::<()>(status_patch(status)?),
        )
        .await
        .map_err(Error::Kube)?;
    Ok(written.metadata.resource_version)
}

/// The JSON patch that makes `status` the job's whole status.
pub(super) fn status_patch(status: &TrainingJobStatus) -> Result<json_patch::Patch> {
    let value = serde_json::to_value(status).map_err(Error::Json)?;
    Ok(json_patch::Patch(vec![json_patch::PatchOperation::Add(
        json_patch::AddOperation {
            path: json_patch::jsonptr::PointerBuf::from_tokens(["status"]),
            value,
        },
    )]))
}

#[cfg(test)]
#[path = "status_patch_tests.rs"]
mod tests;
