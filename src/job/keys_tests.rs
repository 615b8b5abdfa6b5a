use super::*;

#[test]
fn a_pod_s_stats_folder_is_its_empty_dir_under_the_kubelet_root() {
    let root = Path::new("/var/lib/kubelet");
    let uid = "0f1c2d3e-4a5b-6c7d-8e9f-a0b1c2d3e4f5";
    assert_eq!(
        stats_node_path(root, uid),
        Some(PathBuf::from(format!(
            "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/vramfit-stats"
        )))
    );
    // Anything but a UID could lead out of the kubelet's folder.
    let long = "a".repeat(65);
    for bad in ["", "..", "../../etc", "a/b", "0f1c 2d3e", long.as_str()] {
        assert_eq!(stats_node_path(root, bad), None, "{bad:?}");
    }
    assert!(stats_node_path(root, &"a".repeat(64)).is_some());
}
