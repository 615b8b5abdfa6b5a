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
#[path = "procfs_tests.rs"]
mod tests;
