//! Writing a TrainingJob's status, its conditions and its events.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

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

/// Event reasons (PascalCase, as Kubernetes events expect).
pub mod reason {
    /// The memory prediction was made.
    pub const PREDICTED: &str = "Predicted";
    /// The spec cannot be run.
    pub const INVALID: &str = "Invalid";
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
    /// The training process absorbed an OOM itself with a smaller micro-batch.
    pub const OOM_ABSORBED: &str = "OomAbsorbed";
    /// The job succeeded.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The job failed.
    pub const FAILED: &str = "Failed";
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

/// Writes the whole status with server-side apply. The controller owns every
/// status field, so fields left out are removed. Returns the job's new
/// `resourceVersion`.
pub async fn write_status(
    api: &Api<TrainingJob>,
    job: &TrainingJob,
    status: &TrainingJobStatus,
) -> Result<Option<String>> {
    let patch = json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "status": status,
    });
    let written = api
        .patch_status(
            &job.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::Kube)?;
    Ok(written.metadata.resource_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let long_ago = Time("2026-01-01T00:00:00Z".parse().unwrap());
        let mut conditions = vec![Condition {
            type_: CONDITION_PLACED.into(),
            status: "False".into(),
            reason: "WaitingForRoom".into(),
            message: "waiting".into(),
            observed_generation: Some(1),
            last_transition_time: long_ago.clone(),
        }];
        // Same status, new reason and message: the time stays.
        set_condition(
            &mut conditions,
            CONDITION_PLACED,
            false,
            "FitsNoNode",
            "never",
            Some(2),
        );
        assert_eq!(conditions.len(), 1);
        let c = &conditions[0];
        assert_eq!(
            (c.reason.as_str(), c.message.as_str()),
            ("FitsNoNode", "never")
        );
        assert_eq!(c.observed_generation, Some(2));
        assert_eq!(c.last_transition_time, long_ago);
        // The status flips: the time moves.
        set_condition(
            &mut conditions,
            CONDITION_PLACED,
            true,
            "Placed",
            "placed",
            Some(2),
        );
        assert_eq!(conditions[0].status, "True");
        assert!(conditions[0].last_transition_time.0 > long_ago.0);
        // Another type is added beside it.
        set_condition(
            &mut conditions,
            CONDITION_COMPLETE,
            true,
            "Succeeded",
            "done",
            Some(2),
        );
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[1].type_, CONDITION_COMPLETE);
    }
}
