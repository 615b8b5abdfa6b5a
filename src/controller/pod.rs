//! The training pod of one attempt, built from the job's template.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, Volume,
    VolumeMount,
};
use kube::Resource;
use kube::api::ObjectMeta;

use crate::api::{PlacementStatus, TrainingJob};
use crate::job::backoff::BatchShape;
use crate::job::env::{self, Attempt, attempt_env};
use crate::job::keys::*;

/// The value of a container's CDI annotation: a YAML list of the placed GPUs.
fn cdi_devices(uuids: &[&str]) -> String {
    uuids
        .iter()
        .map(|u| format!("- {CDI_GPU_KIND}={u}\n"))
        .collect()
}

/// True when `fresh` (the job as the API server has it now) still runs the
/// attempt of `placement` there: not deleted, not finished, the same
/// placement for its current attempt. A pod missing from the cache is created
/// only then: the cached job may be older than the pod cache, and an attempt
/// whose pod was deleted after it ran out of memory (its next attempt already
/// written) must not get its pod again.
pub fn still_wanted(fresh: &TrainingJob, placement: &PlacementStatus) -> bool {
    fresh.metadata.deletion_timestamp.is_none()
        && fresh
            .status
            .as_ref()
            .and_then(|s| s.recorded_placement())
            .is_some_and(|recorded| recorded == placement)
}

/// Builds the pod of an attempt: the user's template, bound to the placed node,
/// with the GPUs given through CDI (an annotation per container, see
/// [`CDI_ANNOTATION_PREFIX`]) and `NVIDIA_VISIBLE_DEVICES`, the `VRAMFIT_*`
/// variables the training helper reads and the stats folder, an `emptyDir`
/// the agent reads through the kubelet's pod folder (docs/node-protocol.md).
/// Nothing of the node is mounted, so a namespace under Pod Security
/// (baseline or restricted) admits the pod as it admits the template.
pub fn training_pod(
    job: &TrainingJob,
    placement: &PlacementStatus,
    shape: BatchShape,
    attempt: u32,
) -> Result<Pod, String> {
    let name = job.metadata.name.clone().ok_or("job has no name")?;
    let pod = pod_name(&name, attempt);
    let owner = job.controller_owner_ref(&()).ok_or("job has no uid yet")?;
    let template = job.spec.pod_template()?;
    let mut spec: PodSpec = template.spec.unwrap_or_default();
    if spec.containers.is_empty() {
        return Err("spec.template.spec.containers is empty".into());
    }
    spec.node_name = Some(placement.node.clone());
    spec.restart_policy = Some("Never".into());
    let uuids: Vec<&str> = placement.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let protocol = attempt_env(
        &job.spec,
        &Attempt {
            shape,
            attempt,
            budget_bytes: placement.budget_bytes,
            gpu_model: placement.gpu_model.as_deref(),
            memory_fraction: Some(placement.memory_fraction),
            gpu_uuids: uuids.clone(),
            stats_dir: STATS_DIR,
        },
    );
    let downward = [
        (env::POD_NAME, "metadata.name"),
        (env::POD_NAMESPACE, "metadata.namespace"),
        (env::POD_UID, "metadata.uid"),
    ];
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != STATS_VOLUME);
    volumes.push(Volume {
        name: STATS_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            // The counters and shape files are a few KiB.
            size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                "16Mi".into(),
            )),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    });
    for container in &mut spec.containers {
        let vars = container.env.get_or_insert_with(Vec::new);
        // A template's own device list or VRAMFIT_* variable never reaches
        // the process: vramfit's are the only ones.
        vars.retain(|v| !env::is_reserved(&v.name));
        vars.extend(protocol.iter().map(|(k, v)| EnvVar {
            name: (*k).into(),
            value: Some(v.clone()),
            ..EnvVar::default()
        }));
        vars.extend(downward.iter().map(|(k, field)| EnvVar {
            name: (*k).into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: (*field).into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }));
        let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
        mounts.retain(|m| m.name != STATS_VOLUME && m.mount_path != STATS_DIR);
        mounts.push(VolumeMount {
            name: STATS_VOLUME.into(),
            mount_path: STATS_DIR.into(),
            ..VolumeMount::default()
        });
        // The OOM text reaches the termination message even when the process
        // could not write /dev/termination-log itself.
        if container.termination_message_policy.is_none() {
            container.termination_message_policy = Some("FallbackToLogsOnError".into());
        }
    }
    // Init containers get no GPU: none of the device list or budget
    // variables a template may have put there, and an explicit "void"
    // device list, which wins over one an `envFrom` source brings.
    for container in spec.init_containers.iter_mut().flatten() {
        let vars = container.env.get_or_insert_with(Vec::new);
        vars.retain(|v| !env::is_reserved(&v.name));
        vars.push(EnvVar {
            name: env::VISIBLE_DEVICES.into(),
            value: Some("void".into()),
            ..EnvVar::default()
        });
    }
    let template_meta = template.metadata.unwrap_or_default();
    let mut labels: BTreeMap<String, String> = template_meta.labels.unwrap_or_default();
    labels.insert(JOB_LABEL.into(), name.clone());
    labels.insert(ATTEMPT_LABEL.into(), attempt.to_string());
    let mut annotations = template_meta.annotations.unwrap_or_default();
    // CDI devices come from the placement only: a template's own keys (the
    // pod-wide one, an init container's, a container's) are dropped.
    annotations.retain(|k, _| !crate::job::keys::is_device_annotation(k));
    annotations.insert(BUDGET_ANNOTATION.into(), placement.budget_bytes.to_string());
    annotations.insert(
        PLACEMENT_ANNOTATION.into(),
        serde_json::to_string(placement).map_err(|e| format!("placement: {e}"))?,
    );
    for container in &spec.containers {
        annotations.insert(
            format!("{CDI_ANNOTATION_PREFIX}{}", container.name),
            cdi_devices(&uuids),
        );
    }
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod),
            namespace: job.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
