use super::*;

const UID: &str = "0f1c2d3e-4a5b-6c7d-8e9f-a0b1c2d3e4f5";
const ID: &str = "3f4a5b6c7d8e9f00112233445566778899aabbccddeeff00112233445566778a";

#[test]
fn cgroup_files_of_both_drivers_and_both_versions_name_the_pod_and_container() {
    let systemd_uid = UID.replace('-', "_");
    let cases = [
        (
            "v2 systemd burstable",
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/cri-containerd-{ID}.scope\n"
            ),
        ),
        (
            "v2 systemd guaranteed, crio",
            format!("0::/kubepods.slice/kubepods-pod{systemd_uid}.slice/crio-{ID}.scope\n"),
        ),
        (
            "v2 cgroupfs besteffort",
            format!("0::/kubepods/besteffort/pod{UID}/{ID}\n"),
        ),
        (
            "v2 seen from the agent's own cgroup namespace",
            format!(
                "0::/../../kubepods-besteffort-pod{systemd_uid}.slice/cri-containerd-{ID}.scope\n"
            ),
        ),
        (
            "v1 cgroupfs",
            format!(
                "12:memory:/kubepods/burstable/pod{UID}/{ID}\n11:pids:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
            ),
        ),
        (
            "v1 systemd, docker",
            format!(
                "4:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/docker-{ID}.scope\n"
            ),
        ),
        (
            "hybrid: the v2 line has no pod, a v1 line has",
            format!("12:memory:/kubepods/pod{UID}/{ID}\n0::/init.scope\n"),
        ),
    ];
    for (what, text) in cases {
        let found = parse_cgroup(&text).unwrap_or_else(|| panic!("{what}: no pod in {text}"));
        assert_eq!(found.pod_uid, UID, "{what}");
        assert_eq!(found.container_id.as_deref(), Some(ID), "{what}");
    }
}

#[test]
fn the_v2_line_is_read_before_v1_lines() {
    let other = "11111111-2222-3333-4444-555555555555";
    let text = format!("3:memory:/kubepods/pod{other}/{ID}\n0::/kubepods/pod{UID}/{ID}\n");
    assert_eq!(parse_cgroup(&text).unwrap().pod_uid, UID);
}

#[test]
fn processes_outside_pods_have_no_pod() {
    for text in [
        "0::/system.slice/containerd.service\n",
        "0::/user.slice/user-0.slice/session-1.scope\n",
        "0::/\n",
        "12:memory:/\n0::/init.scope\n",
        // A slice that looks like a pod outside kubepods.
        "0::/system.slice/foo-pod0f1c2d3e_4a5b_6c7d_8e9f_a0b1c2d3e4f5.slice\n",
        // Not a UID.
        "0::/kubepods/burstable/podnotauid/abc\n",
        "",
    ] {
        assert_eq!(parse_cgroup(text), None, "{text:?}");
    }
}

#[test]
fn a_pod_cgroup_without_a_container_gives_the_pod_only() {
    let found = parse_cgroup(&format!("0::/kubepods/burstable/pod{UID}\n")).unwrap();
    assert_eq!((found.pod_uid.as_str(), found.container_id), (UID, None));
    // conmon of CRI-O sits beside the container: not the container.
    let conmon = format!(
        "0::/kubepods.slice/kubepods-pod{}.slice/crio-conmon-{ID}.scope\n",
        UID.replace('-', "_")
    );
    assert_eq!(parse_cgroup(&conmon).unwrap().container_id, None);
}

#[test]
fn container_ids_lose_their_runtime_prefix() {
    assert_eq!(strip_runtime_prefix(&format!("containerd://{ID}")), ID);
    assert_eq!(strip_runtime_prefix(&format!("cri-o://{ID}")), ID);
    assert_eq!(strip_runtime_prefix(ID), ID);
}

#[test]
fn the_parent_is_read_after_the_command_whatever_it_holds() {
    assert_eq!(parse_ppid("4242 (python3) S 17 4242 17 0"), Some(17));
    assert_eq!(parse_ppid("7 (a) b (c) R 1 7 7 0"), Some(1));
    assert_eq!(parse_ppid("7 (truncated"), None);
    let me = std::process::id();
    let parent = ProcFs::default().parent_of(me).unwrap();
    assert_eq!(parent, std::os::unix::process::parent_id());
}

#[test]
fn nspid_lists_host_pid_first_and_namespace_pid_last() {
    let status = "Name:\tpython\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t17\t1\nNSpgid:\t4242\n";
    assert_eq!(parse_nspid(status), Some(vec![4242, 17, 1]));
    assert_eq!(parse_nspid("NSpid:\t99\n"), Some(vec![99]));
    assert_eq!(
        parse_nspid("Name:\tx\n"),
        None,
        "kernels before 4.1 lack NSpid"
    );
    assert_eq!(parse_nspid("NSpid:\tx\t1\n"), None);
}

#[test]
fn proc_tree_is_read_from_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let proc_dir = dir.path().join("4242");
    std::fs::create_dir(&proc_dir).unwrap();
    std::fs::write(
        proc_dir.join("cgroup"),
        format!("0::/kubepods/pod{UID}/{ID}\n"),
    )
    .unwrap();
    std::fs::write(proc_dir.join("status"), "NSpid:\t4242\t1\n").unwrap();
    let proc = ProcFs::new(dir.path());
    assert_eq!(proc.pod_of(4242).unwrap().pod_uid, UID);
    assert_eq!(proc.namespace_pid(4242), Some(1));
    assert!(proc.is_running(4242));
    assert!(!proc.is_running(4243));
    assert_eq!(proc.pod_of(4243), None, "an exited process has no pod");
}
