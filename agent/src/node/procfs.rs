//! What `/proc` tells about a GPU process: the pod and container it runs in
//! (from its cgroup path) and its PID inside its own PID namespace.
//!
//! The parsers are pure; [`ProcFs`] reads the files under a root that tests
//! can point elsewhere.

use std::path::PathBuf;

/// The pod and container a process belongs to, as its cgroup path names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodContainer {
    /// Pod UID with dashes (`0f1c…-…`), as the API server spells it.
    pub pod_uid: String,
    /// Container ID without the runtime prefix, when the path names one.
    pub container_id: Option<String>,
}

/// Finds the pod and container in the text of `/proc/<pid>/cgroup`.
///
/// The cgroup v2 line (`0::<path>`) is read first, then the v1 lines
/// (`<n>:<controllers>:<path>`); the first path that names a pod wins. Both
/// kubelet cgroup drivers are understood:
///
/// - systemd: `…/kubepods-burstable-pod<uid with underscores>.slice/cri-containerd-<id>.scope`
/// - cgroupfs: `…/kubepods/burstable/pod<uid>/<id>`
///
/// A path seen from another cgroup namespace starts with `/../..`; only the
/// components matter, so that reads the same.
pub fn parse_cgroup(text: &str) -> Option<PodContainer> {
    let paths = text.lines().filter_map(|line| {
        let mut fields = line.splitn(3, ':');
        let hierarchy = fields.next()?;
        let _controllers = fields.next()?;
        let path = fields.next()?;
        Some((hierarchy == "0", path))
    });
    let (v2, v1): (Vec<_>, Vec<_>) = paths.partition(|(is_v2, _)| *is_v2);
    v2.into_iter()
        .chain(v1)
        .find_map(|(_, path)| parse_cgroup_path(path))
}

/// Finds the pod and container in one cgroup path.
pub fn parse_cgroup_path(path: &str) -> Option<PodContainer> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let (at, pod_uid) = components
        .iter()
        .enumerate()
        .find_map(|(i, c)| pod_uid_of(c).map(|uid| (i, uid)))?;
    let container_id = components.get(at + 1).and_then(|c| container_id_of(c));
    Some(PodContainer {
        pod_uid,
        container_id,
    })
}

/// The pod UID a cgroup component names: `pod<uid>` (cgroupfs) or
/// `kubepods[-<qos>]-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid_of(component: &str) -> Option<String> {
    let raw = if let Some(slice) = component.strip_suffix(".slice") {
        if !slice.starts_with("kubepods") {
            return None;
        }
        let (_, uid) = slice.rsplit_once("-pod")?;
        uid.replace('_', "-")
    } else {
        component.strip_prefix("pod")?.to_string()
    };
    looks_like_uid(&raw).then_some(raw)
}

fn looks_like_uid(text: &str) -> bool {
    let hex = text.chars().filter(|c| c.is_ascii_hexdigit()).count();
    hex == 32 && text.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The container ID a cgroup component names: `<id>` (cgroupfs) or
/// `<runtime>-<id>.scope` (systemd: `cri-containerd-`, `crio-`, `docker-`).
fn container_id_of(component: &str) -> Option<String> {
    let id = match component.strip_suffix(".scope") {
        Some(scope) => {
            if scope.contains("conmon") {
                return None;
            }
            scope.rsplit_once('-')?.1
        }
        None => component,
    };
    (id.len() >= 12 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The container ID of a pod's `containerStatuses[].containerID`
/// (`containerd://<id>`), without the runtime prefix.
pub fn strip_runtime_prefix(container_id: &str) -> &str {
    container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id)
}

/// The PIDs of the `NSpid:` line of `/proc/<pid>/status`, outermost (host)
/// first, innermost (the process's own namespace) last.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Option<Vec<u32>> = line.split_whitespace().map(|p| p.parse().ok()).collect();
    pids.filter(|p| !p.is_empty())
}

/// The parent PID field of `/proc/<pid>/stat` (the command, in parentheses,
/// may hold spaces and parentheses itself, so the fields count from the last
/// `)`).
pub fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Reads process facts from a `/proc` tree (the host's, given hostPID).
#[derive(Clone, Debug)]
pub struct ProcFs {
    root: PathBuf,
}

impl Default for ProcFs {
    fn default() -> Self {
        Self::new("/proc")
    }
}

impl ProcFs {
    /// A reader of the tree at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The pod and container of `pid`; `None` when it runs in no pod or has
    /// exited.
    pub fn pod_of(&self, pid: u32) -> Option<PodContainer> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("cgroup")).ok()?;
        parse_cgroup(&text)
    }

    /// The PID of `pid` in its own (innermost) PID namespace.
    pub fn namespace_pid(&self, pid: u32) -> Option<u32> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        parse_nspid(&text)?.last().copied()
    }

    /// The parent of `pid`; `None` when it has exited.
    pub fn parent_of(&self, pid: u32) -> Option<u32> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok()?;
        parse_ppid(&text)
    }

    /// True while `pid` exists.
    pub fn is_running(&self, pid: u32) -> bool {
        self.root.join(pid.to_string()).exists()
    }
}

#[cfg(test)]
mod tests {
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
}
