use super::*;
use crate::api::AssignedGpu;
use serde_json::json;

fn job() -> TrainingJob {
    TrainingJob::test("gpt2")
        .meta("uid", json!("u-1"))
        .batch(64, 8)
        .spec(json!({"template": {"metadata": {"labels": {"team": "nlp"}},
                      "spec": {"containers": [{"name": "train", "image": "img",
                                               "env": [{"name": "VRAMFIT_MICRO_BATCH", "value": "999"}]}]}}}))
        .build()
}

fn placement() -> PlacementStatus {
    PlacementStatus {
        compute_percent: None,
        node: "gpu-1".into(),
        gpus: vec![AssignedGpu {
            index: 3,
            uuid: "GPU-abc".into(),
        }],
        budget_bytes: 20 << 30,
        memory_fraction: 0.14,
        attempt: 2,
        gpu_model: None,
        micro_batch: None,
        elastic: None,
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
fn a_pod_is_wanted_only_while_the_fresh_job_still_places_its_attempt_there() {
    use crate::api::{Phase, TrainingJobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let with = |phase: Phase, attempt: u32, placed: Option<PlacementStatus>| {
        let mut job = job();
        job.status = Some(TrainingJobStatus {
            phase,
            attempt,
            placement: placed,
            ..TrainingJobStatus::default()
        });
        job
    };
    let wanted = placement();
    assert!(still_wanted(
        &with(Phase::Placed, 2, Some(wanted.clone())),
        &wanted
    ));
    // The next attempt is written: the old attempt's pod stays gone.
    let mut next = wanted.clone();
    next.attempt = 3;
    assert!(!still_wanted(
        &with(Phase::Retrying, 3, Some(wanted.clone())),
        &wanted
    ));
    assert!(!still_wanted(&with(Phase::Placed, 3, Some(next)), &wanted));
    // Placed elsewhere, finished, not placed, being deleted.
    let mut elsewhere = wanted.clone();
    elsewhere.node = "gpu-2".into();
    assert!(!still_wanted(
        &with(Phase::Placed, 2, Some(elsewhere)),
        &wanted
    ));
    assert!(!still_wanted(
        &with(Phase::Succeeded, 2, Some(wanted.clone())),
        &wanted
    ));
    assert!(!still_wanted(&with(Phase::Pending, 2, None), &wanted));
    let mut deleting = with(Phase::Running, 2, Some(wanted.clone()));
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    assert!(!still_wanted(&deleting, &wanted));
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

/// The budget covers the whole process (the agent's NVML watchdog checks
/// it so); the pod is told how much of it is kept outside the allocator,
/// for the GPU model it was placed on and with NCCL's share when the job
/// spans GPUs.
#[test]
fn pod_is_told_the_part_of_its_budget_kept_outside_the_allocator() {
    let shape = BatchShape { micro: 8, accum: 8 };
    let h200 = crate::predict::gpu_profile("H200").unwrap();
    let pod = training_pod(&job(), &placement(), shape, 2).unwrap();
    assert_eq!(
        env_of(&pod)["VRAMFIT_CONTEXT_BYTES"],
        h200.context_bytes.to_string(),
        "no model named: the default profile's context"
    );

    let l4 = crate::predict::gpu_profile("L4").unwrap();
    assert_ne!(l4.context_bytes, h200.context_bytes);
    let mut job = job();
    job.spec.gpus = 2;
    let mut placed = placement();
    placed.gpu_model = Some("L4".into());
    let pod = training_pod(&job, &placed, shape, 2).unwrap();
    assert_eq!(
        env_of(&pod)["VRAMFIT_CONTEXT_BYTES"],
        (l4.context_bytes + l4.nccl_bytes).to_string(),
        "the placed model's context plus NCCL's memory for two GPUs"
    );
}

#[test]
fn pod_gets_the_node_protocol_variables_and_its_stats_folder() {
    let shape = BatchShape { micro: 8, accum: 8 };
    let mut job = job();
    job.spec.batch.min_micro = 2;
    let pod = training_pod(&job, &placement(), shape, 1).unwrap();
    assert_eq!(pod.metadata.namespace.as_deref(), Some("ml"));
    let env = env_of(&pod);
    assert_eq!(env["VRAMFIT_MIN_MICRO_BATCH"], "2");
    assert_eq!(env["VRAMFIT_STATS_DIR"], "/run/vramfit");
    let container = &pod.spec.as_ref().unwrap().containers[0];
    for (var, field) in [
        ("VRAMFIT_POD_NAME", "metadata.name"),
        ("VRAMFIT_POD_NAMESPACE", "metadata.namespace"),
        ("VRAMFIT_POD_UID", "metadata.uid"),
    ] {
        let found = container
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == var);
        let path = found
            .and_then(|v| v.value_from.as_ref())
            .and_then(|s| s.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(path, Some(field), "{var}");
    }
    let volumes = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    let stats = volumes.iter().find(|v| v.name == STATS_VOLUME).unwrap();
    // An emptyDir, nothing of the node: Pod Security baseline and
    // restricted admit it.
    let empty = stats.empty_dir.as_ref().unwrap();
    assert_eq!(
        empty.size_limit.as_ref().map(|q| q.0.as_str()),
        Some("16Mi")
    );
    assert!(volumes.iter().all(|v| v.host_path.is_none()));
    let mount = container
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == STATS_VOLUME)
        .unwrap();
    assert_eq!(mount.mount_path, "/run/vramfit");
}

#[test]
fn template_variables_named_like_ours_are_replaced_and_the_rest_kept() {
    let mut job = job();
    job.spec.template = serde_json::from_value(json!({"spec": {
            "containers": [{"name": "train", "image": "img", "env": [
                {"name": "VRAMFIT_MICRO_BATCH", "value": "999"},
                {"name": "VRAMFIT_POD_NAME", "value": "not-the-pod"},
                {"name": "HF_HOME", "value": "/cache"}]}]}}))
    .unwrap();
    let shape = BatchShape { micro: 8, accum: 8 };
    let pod = training_pod(&job, &placement(), shape, 1).unwrap();
    let vars = pod.spec.unwrap().containers[0].env.clone().unwrap();
    let named = |name: &str| vars.iter().filter(|v| v.name == name).collect::<Vec<_>>();
    assert_eq!(named("HF_HOME").len(), 1, "the user's own variable stays");
    assert_eq!(named("HF_HOME")[0].value.as_deref(), Some("/cache"));
    let micro = named("VRAMFIT_MICRO_BATCH");
    assert_eq!(micro.len(), 1, "{vars:?}");
    assert_eq!(micro[0].value.as_deref(), Some("8"));
    let pod_name = named("VRAMFIT_POD_NAME");
    assert_eq!(pod_name.len(), 1, "{vars:?}");
    assert!(pod_name[0].value.is_none() && pod_name[0].value_from.is_some());
}

/// A template cannot pick its own GPU: device annotations and variables
/// it carries (pod-wide, per container, in init containers) are dropped,
/// and only the placement's remain.
#[test]
fn a_template_asking_for_gpus_itself_gets_only_the_placed_one() {
    let mut job = job();
    job.spec.template = serde_json::from_value(json!({
            "metadata": {"annotations": {
                "cdi-devices.noderesource.dev/pod": "- nvidia.com/gpu=GPU-other",
                "cdi-devices.noderesource.dev/container.setup": "- nvidia.com/gpu=GPU-other",
                "cdi-devices.noderesource.dev/container.train": "- nvidia.com/gpu=GPU-other",
                "cdi.k8s.io/gpu": "nvidia.com/gpu=all",
                "vramfit.dev/budget-bytes": "999999999999",
                "team": "nlp"}},
            "spec": {
                "initContainers": [{"name": "setup", "image": "img", "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    {"name": "VRAMFIT_BUDGET_BYTES", "value": "1"},
                    {"name": "PIP_INDEX", "value": "x"}]}],
                "containers": [{"name": "train", "image": "img", "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    {"name": "VRAMFIT_ALLOCATOR", "value": "native"},
                    {"name": "VRAMFIT_MEMORY_FRACTION", "value": "1.0"}]}]}}))
    .unwrap();
    let shape = BatchShape { micro: 8, accum: 8 };
    let pod = training_pod(&job, &placement(), shape, 1).unwrap();
    let annotations = pod.metadata.annotations.unwrap();
    let cdi: Vec<(&String, &String)> = annotations
        .iter()
        .filter(|(k, _)| k.starts_with(CDI_ANNOTATION_DOMAIN))
        .collect();
    assert_eq!(cdi.len(), 1, "{cdi:?}");
    assert_eq!(cdi[0].0, "cdi-devices.noderesource.dev/container.train");
    assert_eq!(cdi[0].1, "- nvidia.com/gpu=GPU-abc\n");
    assert!(
        !annotations.keys().any(|k| k.starts_with("cdi.k8s.io/")),
        "containerd's own CDI keys are dropped too"
    );
    assert_eq!(annotations[BUDGET_ANNOTATION], (20u64 << 30).to_string());
    assert_eq!(annotations["team"], "nlp");
    let spec = pod.spec.unwrap();
    let init_vars = spec.init_containers.unwrap()[0].env.clone().unwrap();
    let names: Vec<(&str, Option<&str>)> = init_vars
        .iter()
        .map(|v| (v.name.as_str(), v.value.as_deref()))
        .collect();
    // An explicit "void" wins over any envFrom source's device list.
    assert_eq!(
        names,
        [
            ("PIP_INDEX", Some("x")),
            ("NVIDIA_VISIBLE_DEVICES", Some("void"))
        ]
    );
    let vars = spec.containers[0].env.clone().unwrap();
    let visible: Vec<_> = vars
        .iter()
        .filter(|v| v.name == "NVIDIA_VISIBLE_DEVICES")
        .collect();
    assert_eq!(visible.len(), 1);
    assert_eq!(visible[0].value.as_deref(), Some("GPU-abc"));
    let fraction: Vec<_> = vars
        .iter()
        .filter(|v| v.name == "VRAMFIT_MEMORY_FRACTION")
        .collect();
    assert_eq!(fraction.len(), 1);
    assert_eq!(fraction[0].value.as_deref(), Some("0.140000"));
    // The user's own choice of allocator stays.
    assert!(vars.iter().any(|v| v.name == "VRAMFIT_ALLOCATOR"));
}

#[test]
fn a_template_volume_of_the_same_name_is_replaced_not_doubled() {
    let mut job = job();
    job.spec.template = serde_json::from_value(json!({"spec": {
            "volumes": [{"name": STATS_VOLUME, "emptyDir": {}}, {"name": "data", "emptyDir": {}}],
            "containers": [{"name": "train", "image": "img",
                            "volumeMounts": [{"name": STATS_VOLUME, "mountPath": "/elsewhere"},
                                             {"name": "data", "mountPath": "/data"},
                                             {"name": "other", "mountPath": STATS_DIR}]}]}}))
    .unwrap();
    let shape = BatchShape { micro: 8, accum: 8 };
    let pod = training_pod(&job, &placement(), shape, 1).unwrap();
    let spec = pod.spec.unwrap();
    let names: Vec<&str> = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(names, vec!["data", STATS_VOLUME]);
    // The stats mount replaces one of its name or at its folder; the
    // user's other mounts stay.
    let mounts: Vec<(&str, &str)> = spec.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect();
    assert_eq!(mounts, vec![("data", "/data"), (STATS_VOLUME, STATS_DIR)]);
}

#[test]
fn pod_names_stay_within_the_dns_label_limit() {
    let long = "x".repeat(80);
    let name = pod_name(&long, 12);
    assert!(name.len() <= 63, "{name}");
    assert!(name.ends_with("-a12"));
    // As much of the job's name as fits is kept, and a cut that ends in
    // a separator drops it.
    assert_eq!(name, format!("{}-a12", "x".repeat(59)));
    assert_eq!(pod_name("job", 1), "job-a1");
    let cut_at_a_dash = format!("{}-.{}", "y".repeat(59), "z".repeat(10));
    assert_eq!(
        pod_name(&cut_at_a_dash, 1),
        format!("{}-a1", "y".repeat(59))
    );
}
