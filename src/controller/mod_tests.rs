use super::*;

use k8s_openapi::jiff::Timestamp;

const GIB: u64 = 1 << 30;

fn reported_node(heartbeat: &str, used: u64, allocation: Option<&str>) -> GpuNode {
    let node = GpuNode::test("n")
        .gpu("H200", 80 * GIB)
        .used(used)
        .health("Healthy")
        .status_fields(serde_json::json!({"gpuCount": 1}))
        .heartbeat(heartbeat);
    match allocation {
        Some(committed) => node.status_fields(serde_json::json!({"allocation": {
            "committedBytes": 1, "freeBytes": 2, "committed": committed, "free": "2 B",
            "used": "0 B", "gpuFree": "0:2B", "jobs": 1,
        }})),
        None => node,
    }
    .build()
}

#[test]
fn a_gpu_node_wakes_the_scheduler_when_new_or_changed_for_it() {
    let t = "2026-12-01T12:00:00Z";
    let mut seen = SchedulerFacing::default();
    let node = reported_node(t, 0, None);
    assert!(seen.changed(&node), "a new node");
    assert!(!seen.changed(&reported_node("2026-12-01T12:00:30Z", GIB, None)));
    let mut other = node.clone();
    other.metadata.name = Some("m".into());
    assert!(seen.changed(&other), "another node");
    let mut cordoned = node.clone();
    cordoned.spec.cordoned = true;
    assert!(seen.changed(&cordoned));
    assert!(!seen.changed(&cordoned));
    assert!(seen.changed(&node), "uncordoned");
}

#[test]
fn only_what_can_change_a_placement_wakes_the_scheduler() {
    let t = "2026-12-01T12:00:00Z";
    let plain = reported_node(t, 0, None);
    let fingerprint = scheduler_facing_fingerprint;
    // The controller's own allocation writes, heartbeats and the memory
    // in use do not wake it.
    let written = reported_node(t, 0, Some("1 B"));
    let rewritten = reported_node(t, 0, Some("9 B"));
    let later = reported_node("2026-12-01T12:00:10Z", 0, Some("1 B"));
    let busier = reported_node(t, GIB, Some("1 B"));
    for same in [&written, &rewritten, &later, &busier] {
        assert_eq!(fingerprint(&plain), fingerprint(same));
    }
    // A node's spec, a GPU's health, capacity, model or identity, a GPU
    // more, labels, a deletion and a status appearing do.
    let mut cordoned = plain.clone();
    cordoned.spec.cordoned = true;
    let with_gpu = |change: &dyn Fn(&mut crate::api::GpuDevice)| {
        let mut node = plain.clone();
        change(&mut node.status.as_mut().unwrap().gpus[0]);
        node
    };
    let faulty = with_gpu(&|g| g.health = crate::api::GpuHealth::Faulty);
    let smaller = with_gpu(&|g| g.total_bytes -= GIB);
    let other_model = with_gpu(&|g| g.model = "L4".into());
    let other_uuid = with_gpu(&|g| g.uuid = "GPU-1".into());
    let mut more = plain.clone();
    let mut second = more.status.as_ref().unwrap().gpus[0].clone();
    second.index = 1;
    more.status.as_mut().unwrap().gpus.push(second);
    let mut labelled = plain.clone();
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("pool".into(), "a".into());
    let mut deleted = plain.clone();
    deleted.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
    );
    let mut bare = plain.clone();
    bare.status = None;
    for changed in [
        &cordoned,
        &faulty,
        &smaller,
        &other_model,
        &other_uuid,
        &more,
        &labelled,
        &deleted,
        &bare,
    ] {
        assert_ne!(fingerprint(&plain), fingerprint(changed), "{changed:?}");
    }
}
