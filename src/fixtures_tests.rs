use super::*;
use crate::api::GpuHealth;

#[test]
fn the_default_job_and_each_setter() {
    let plain = TrainingJob::test("a").build();
    assert_eq!(plain.metadata.name.as_deref(), Some("a"));
    assert_eq!(plain.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(plain.metadata.uid.as_deref(), Some("uid-a"));
    assert_eq!(plain.metadata.generation, Some(1));
    assert_eq!((plain.spec.batch.global, plain.spec.batch.micro), (8, 8));
    assert_eq!(plain.spec.gpus, 1);
    assert!(plain.status.is_none());

    let built = TrainingJob::test("b")
        .namespace("team")
        .created("2026-01-01T00:00:00Z")
        .meta("uid", Value::Null)
        .resource_version("7")
        .gpus(2)
        .priority(5)
        .batch(64, 16)
        .min_micro(2)
        .auto_micro(true)
        .request("20Gi")
        .max_oom_retries(3)
        .budget(7)
        .build();
    assert_eq!(built.metadata.namespace.as_deref(), Some("team"));
    assert!(built.metadata.creation_timestamp.is_some());
    assert!(built.metadata.uid.is_none());
    assert_eq!(built.metadata.resource_version.as_deref(), Some("7"));
    assert_eq!((built.spec.gpus, built.spec.priority), (2, 5));
    let batch = &built.spec.batch;
    assert_eq!((batch.global, batch.micro, batch.min_micro), (64, 16, 2));
    assert!(batch.auto_micro);
    assert_eq!(built.spec.max_oom_retries, 3);
    let memory = serde_json::to_value(&built.spec.memory).unwrap();
    assert_eq!(memory["request"], "20Gi");
    let status = built.status.unwrap();
    assert_eq!((status.attempt, status.budget_bytes), (1, Some(7)));

    let running = TrainingJob::test("c").phase(Phase::Running).build();
    assert_eq!(running.status.unwrap().phase, Phase::Running);
    let micro = TrainingJob::test("d").batch(64, 16).micro(4).build();
    assert_eq!((micro.spec.batch.global, micro.spec.batch.micro), (64, 4));
}

#[test]
fn status_fields_lie_over_the_typed_status_and_placed_takes_its_attempt() {
    let job = TrainingJob::test("a")
        .budget(9)
        .status_fields(json!({"attempt": 3, "podName": "a-3"}))
        .placed("n1", &[0, 2], 20)
        .build();
    let status = job.status.unwrap();
    assert_eq!(status.budget_bytes, Some(9), "kept from the typed status");
    assert_eq!(
        (status.attempt, status.pod_name.as_deref()),
        (3, Some("a-3"))
    );
    assert_eq!(status.phase, Phase::Running);
    let placement = status.placement.unwrap();
    assert_eq!((placement.node.as_str(), placement.attempt), ("n1", 3));
    let uuids: Vec<&str> = placement.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids, ["GPU-0", "GPU-2"]);
    assert_eq!(placement.budget_bytes, 20);
    // Without an attempt in the status, the placement is attempt 1.
    let first = TrainingJob::test("b").placed("n1", &[0], 1).build();
    assert_eq!(first.status.unwrap().placement.unwrap().attempt, 1);
}

#[test]
fn the_manifest_has_what_a_user_writes_and_the_same_spec() {
    let builder = TrainingJob::test("a").gpus(2).request("10Gi");
    let manifest = builder.manifest();
    assert_eq!(manifest["kind"], "TrainingJob");
    assert_eq!(manifest["metadata"], json!({"name": "a"}));
    assert!(manifest.get("status").is_none());
    let job = builder.clone().namespace("x").build();
    assert_eq!(serde_json::to_value(&job.spec).unwrap()["gpus"], 2);
    assert_eq!(manifest["spec"]["memory"], json!({"request": "10Gi"}));
    let namespaced = builder.namespace("team").manifest();
    assert_eq!(
        namespaced["metadata"],
        json!({"name": "a", "namespace": "team"})
    );
}

#[test]
fn the_default_gpu_node_and_each_setter() {
    let bare = GpuNode::test("n").build();
    assert_eq!(bare.metadata.name.as_deref(), Some("n"));
    assert!(bare.status.is_none());
    assert!(GpuNode::test("n").manifest().get("status").is_none());

    let node = GpuNode::test("n")
        .label("pool", "a")
        .heartbeat("2026-12-01T08:00:00Z")
        .gpu("H200", 140 << 30)
        .used(3 << 30)
        .health("Healthy")
        .gpu("L4", 24 << 30)
        .uuid("GPU-n-1")
        .status_fields(json!({"gpuCount": 2}))
        .build();
    assert_eq!(node.metadata.labels.unwrap()["pool"], "a");
    let status = node.status.unwrap();
    assert_eq!(status.gpu_count, 2);
    assert!(status.heartbeat.is_some());
    let gpus = &status.gpus;
    assert_eq!((gpus[0].index, gpus[0].uuid.as_str()), (0, "GPU-0"));
    assert_eq!(
        (gpus[0].used_bytes, gpus[0].health),
        (3 << 30, GpuHealth::Healthy)
    );
    assert_eq!((gpus[1].index, gpus[1].uuid.as_str()), (1, "GPU-n-1"));
    assert_eq!(
        (gpus[1].model.as_str(), gpus[1].total_bytes),
        ("L4", 24 << 30)
    );
    let listed = GpuNode::test("m").gpus(json!([{"index": 5, "uuid": "u", "model": "H100",
                                                "totalBytes": 1}]));
    assert_eq!(listed.build().status.unwrap().gpus[0].index, 5);
}
