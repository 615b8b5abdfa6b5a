use super::*;
use kube::runtime::reflector::store;
use kube::runtime::watcher::Event;
use serde_json::json;

const UID: &str = "0f1c2d3e-4a5b-6c7d-8e9f-a0b1c2d3e4f5";
const ID: &str = "3f4a5b6c7d8e9f00112233445566778899aabbccddeeff00112233445566778a";

fn pod() -> Pod {
    serde_json::from_value(json!({
            "metadata": {"name": "gpt2-a1", "namespace": "ml", "uid": UID,
                         "labels": {JOB_LABEL: "gpt2"},
                         "annotations": {BUDGET_ANNOTATION: "21474836480"}},
            "status": {"containerStatuses": [
                {"name": "sidecar", "image": "s", "imageID": "", "ready": true, "restartCount": 0,
                 "containerID": "containerd://aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
                {"name": "train", "image": "t", "imageID": "", "ready": true, "restartCount": 0,
                 "containerID": format!("containerd://{ID}")}]}
        }))
        .unwrap()
}

#[test]
fn a_process_maps_to_its_pod_container_budget_and_stats_folder() {
    let dir = tempfile::tempdir().unwrap();
    let proc_dir = dir.path().join("4242");
    std::fs::create_dir(&proc_dir).unwrap();
    let systemd_uid = UID.replace('-', "_");
    std::fs::write(
            proc_dir.join("cgroup"),
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/cri-containerd-{ID}.scope\n"),
        )
        .unwrap();
    std::fs::write(proc_dir.join("status"), "NSpid:\t4242\t1\n").unwrap();
    let (reader, mut writer) = store::<Pod>();
    writer.apply_watcher_event(&Event::Apply(pod()));
    let owners = PodOwners::snapshot(
        &ProcFs::new(dir.path()),
        Path::new("/var/lib/kubelet"),
        &reader,
    );
    let owner = owners.owner_of(4242).unwrap();
    assert_eq!(owner.owner.name, "gpt2-a1");
    assert_eq!(owner.owner.uid, UID);
    assert_eq!(owner.container.as_deref(), Some("train"));
    assert_eq!(owner.training_job.as_deref(), Some("gpt2"));
    assert_eq!(owner.budget_bytes, Some(20 << 30));
    assert_eq!(owner.namespace_pid, Some(1));
    assert_eq!(
        owner.stats_dir.unwrap(),
        PathBuf::from(format!(
            "/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~empty-dir/vramfit-stats"
        ))
    );
    // Once the pod is deleted from the watch, the process has no owner.
    writer.apply_watcher_event(&Event::Delete(pod()));
    let owners = PodOwners::snapshot(&ProcFs::new(dir.path()), Path::new("/x"), &reader);
    assert_eq!(owners.owner_of(4242), None);
}

/// The budget and the GPUs come from the controller's placement: a budget
/// annotation next to it does not raise the budget, and a pod with neither
/// was given no GPU at all.
#[test]
fn budget_and_gpus_come_from_the_placement() {
    let root = Path::new("/stats");
    let with = |annotations: serde_json::Value| {
        let mut p = pod();
        p.metadata.annotations = serde_json::from_value(annotations).unwrap();
        owner_from_pod(&p, None, root)
    };
    let placement = json!({"node": "n", "gpus": [{"index": 0, "uuid": "GPU-a"}],
                           "budgetBytes": 1024, "memoryFraction": 0.1, "attempt": 1});
    let placed = with(json!({PLACEMENT_ANNOTATION: placement.to_string(),
                            BUDGET_ANNOTATION: "999999999999"}));
    assert_eq!(placed.budget_bytes, Some(1024));
    assert_eq!(placed.gpus, Some(vec!["GPU-a".to_string()]));
    let legacy = with(json!({BUDGET_ANNOTATION: "2048"}));
    assert_eq!((legacy.budget_bytes, legacy.gpus), (Some(2048), None));
    let bare = with(json!({}));
    assert_eq!((bare.budget_bytes, bare.gpus), (None, Some(vec![])));
    // A placement that does not parse counts as none.
    let broken = with(json!({PLACEMENT_ANNOTATION: "{"}));
    assert_eq!((broken.budget_bytes, broken.gpus), (None, Some(vec![])));
}
