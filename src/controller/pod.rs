//! The training pod of one attempt, built from the job's template.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, Pod, PodSpec};
use kube::Resource;
use kube::api::ObjectMeta;

use super::backoff::BatchShape;
use super::exit::OOM_EXIT_CODE;
use crate::api::{PlacementStatus, TrainingJob};

/// Label carrying the owning TrainingJob's name.
pub const JOB_LABEL: &str = "vramfit.dev/training-job";
/// Label carrying the attempt number.
pub const ATTEMPT_LABEL: &str = "vramfit.dev/attempt";
/// Annotation carrying the budget in bytes (read by the node agent).
pub const BUDGET_ANNOTATION: &str = "vramfit.dev/budget-bytes";
/// Prefix of the annotation (one per container, the container's name follows)
/// listing the CDI devices it gets. On the node, an NRI plugin hands them to
/// containerd's CDI injection (`hack/node/containerd/nri-cdi`): the kubelet
/// passes pod annotations to the runtime, but no pod field names a CDI device.
pub const CDI_ANNOTATION_PREFIX: &str = "cdi-devices.noderesource.dev/container.";
/// CDI kind of a node's GPUs; each GPU is a device named by its UUID.
pub const CDI_GPU_KIND: &str = "nvidia.com/gpu";

/// The value of a container's CDI annotation: a YAML list of the placed GPUs.
fn cdi_devices(uuids: &[&str]) -> String {
    uuids
        .iter()
        .map(|u| format!("- {CDI_GPU_KIND}={u}\n"))
        .collect()
}

/// Name of the pod of `attempt`: one name per attempt, so a restarted
/// controller that creates it again gets `AlreadyExists`, never a second pod.
pub fn pod_name(job_name: &str, attempt: u32) -> String {
    let suffix = format!("-a{attempt}");
    let keep = 63 - suffix.len();
    let base: String = job_name.chars().take(keep).collect();
    format!("{}{suffix}", base.trim_end_matches(['-', '.']))
}

/// Builds the pod of an attempt: the user's template, bound to the placed node,
/// with the GPUs given through CDI (an annotation per container, see
/// [`CDI_ANNOTATION_PREFIX`]) and `NVIDIA_VISIBLE_DEVICES`, and the `VRAMFIT_*`
/// variables the training helper reads.
pub fn training_pod(
    job: &TrainingJob,
    placement: &PlacementStatus,
    shape: BatchShape,
    attempt: u32,
) -> Result<Pod, String> {
    let name = job.metadata.name.clone().ok_or("job has no name")?;
    let owner = job.controller_owner_ref(&()).ok_or("job has no uid yet")?;
    let template = job.spec.pod_template()?;
    let mut spec: PodSpec = template.spec.unwrap_or_default();
    if spec.containers.is_empty() {
        return Err("spec.template.spec.containers is empty".into());
    }
    spec.node_name = Some(placement.node.clone());
    spec.restart_policy = Some("Never".into());
    let uuids: Vec<&str> = placement.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", uuids.join(",")),
        (
            "VRAMFIT_MEMORY_FRACTION",
            format!("{:.6}", placement.memory_fraction),
        ),
        ("VRAMFIT_BUDGET_BYTES", placement.budget_bytes.to_string()),
        ("VRAMFIT_MICRO_BATCH", shape.micro.to_string()),
        ("VRAMFIT_GRAD_ACCUM", shape.accum.to_string()),
        ("VRAMFIT_GLOBAL_BATCH", job.spec.batch.global.to_string()),
        ("VRAMFIT_ATTEMPT", attempt.to_string()),
        ("VRAMFIT_OOM_EXIT_CODE", OOM_EXIT_CODE.to_string()),
    ];
    for container in &mut spec.containers {
        let vars = container.env.get_or_insert_with(Vec::new);
        vars.retain(|v| !env.iter().any(|(k, _)| *k == v.name));
        vars.extend(env.iter().map(|(k, v)| EnvVar {
            name: (*k).into(),
            value: Some(v.clone()),
            ..EnvVar::default()
        }));
        // The OOM text reaches the termination message even when the process
        // could not write /dev/termination-log itself.
        if container.termination_message_policy.is_none() {
            container.termination_message_policy = Some("FallbackToLogsOnError".into());
        }
    }
    let template_meta = template.metadata.unwrap_or_default();
    let mut labels: BTreeMap<String, String> = template_meta.labels.unwrap_or_default();
    labels.insert(JOB_LABEL.into(), name.clone());
    labels.insert(ATTEMPT_LABEL.into(), attempt.to_string());
    let mut annotations = template_meta.annotations.unwrap_or_default();
    annotations.insert(BUDGET_ANNOTATION.into(), placement.budget_bytes.to_string());
    for container in &spec.containers {
        annotations.insert(
            format!("{CDI_ANNOTATION_PREFIX}{}", container.name),
            cdi_devices(&uuids),
        );
    }
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&name, attempt)),
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
mod tests {
    use super::*;
    use crate::api::AssignedGpu;
    use serde_json::json;

    fn job() -> TrainingJob {
        serde_json::from_value(json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "gpt2", "namespace": "ml", "uid": "u-1"},
            "spec": {
                "gpus": 1,
                "batch": {"global": 64, "micro": 8},
                "model": {"mlp": {"layers": 2, "hidden": 64}},
                "template": {"metadata": {"labels": {"team": "nlp"}},
                             "spec": {"containers": [{"name": "train", "image": "img",
                                                      "env": [{"name": "VRAMFIT_MICRO_BATCH", "value": "999"}]}]}}
            }
        }))
        .expect("job parses")
    }

    fn placement() -> PlacementStatus {
        PlacementStatus {
            node: "gpu-1".into(),
            gpus: vec![AssignedGpu {
                index: 3,
                uuid: "GPU-abc".into(),
            }],
            budget_bytes: 20 << 30,
            memory_fraction: 0.14,
            attempt: 2,
        }
    }

    fn env_of(pod: &Pod) -> BTreeMap<String, String> {
        pod.spec.as_ref().unwrap().containers[0]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn pod_is_bound_to_the_placed_node_and_gpu_with_the_batch_variables() {
        let pod = training_pod(
            &job(),
            &placement(),
            BatchShape {
                micro: 4,
                accum: 16,
            },
            2,
        )
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("gpt2-a2"));
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some("gpu-1")
        );
        assert_eq!(
            pod.spec.as_ref().unwrap().restart_policy.as_deref(),
            Some("Never")
        );
        let env = env_of(&pod);
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-abc");
        assert_eq!(
            env["VRAMFIT_MICRO_BATCH"], "4",
            "the user's value is replaced"
        );
        assert_eq!(env["VRAMFIT_GRAD_ACCUM"], "16");
        assert_eq!(env["VRAMFIT_GLOBAL_BATCH"], "64");
        assert_eq!(env["VRAMFIT_MEMORY_FRACTION"], "0.140000");
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            annotations["cdi-devices.noderesource.dev/container.train"], "- nvidia.com/gpu=GPU-abc\n",
            "the placed GPU reaches the container through CDI"
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[JOB_LABEL], "gpt2");
        assert_eq!(labels["team"], "nlp");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("TrainingJob", "u-1", Some(true))
        );
    }

    #[test]
    fn pod_names_stay_within_the_dns_label_limit() {
        let long = "x".repeat(80);
        let name = pod_name(&long, 12);
        assert!(name.len() <= 63, "{name}");
        assert!(name.ends_with("-a12"));
    }
}
