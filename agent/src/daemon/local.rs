//! Plain local processes with budgets (`--local-budget PID=BYTES`): the
//! watchdog on a machine without a kubelet, and `vramfit run --local`.
//! Each watched process and its descendants (a launcher's workers, a shell's
//! python) are one owner, `local-<pid>`, as a pod's processes are one pod;
//! every other GPU process belongs to no one and is never stopped.

use std::collections::BTreeMap;

use vramfit::quantity::parse_quantity;

use crate::node::procfs::ProcFs;
use crate::node::report::{OwnerLookup, ProcessOwner};
use crate::node::watchdog::{Owner, StopOrder};

/// Parses `PID=BYTES` (bytes as a Kubernetes quantity: `21474836480`, `20Gi`).
pub fn parse_local_budget(text: &str) -> Result<(u32, u64), String> {
    let (pid, bytes) = text
        .split_once('=')
        .ok_or_else(|| format!("--local-budget {text:?}: expected PID=BYTES"))?;
    let pid = pid
        .trim()
        .parse()
        .map_err(|_| format!("--local-budget {text:?}: {pid:?} is not a PID"))?;
    let bytes = parse_quantity(bytes.trim(), 1)
        .ok_or_else(|| format!("--local-budget {text:?}: {bytes:?} is not a byte count"))?;
    Ok((pid, bytes))
}

/// Owners of the watched local processes.
pub struct LocalOwners {
    proc: ProcFs,
    budgets: BTreeMap<u32, u64>,
}

impl LocalOwners {
    /// Watches `budgets` (PID -> bytes).
    pub fn new(proc: ProcFs, budgets: BTreeMap<u32, u64>) -> Self {
        Self { proc, budgets }
    }
}

/// How far up the process tree a GPU process's watched ancestor is looked for.
const MAX_DEPTH: usize = 64;

impl LocalOwners {
    /// The watched process `pid` is, or descends from.
    fn watched_ancestor(&self, pid: u32) -> Option<u32> {
        let mut current = pid;
        for _ in 0..MAX_DEPTH {
            if self.budgets.contains_key(&current) {
                return Some(current);
            }
            current = self.proc.parent_of(current).filter(|&p| p > 1)?;
        }
        None
    }
}

impl OwnerLookup for LocalOwners {
    fn owner_of(&self, pid: u32) -> Option<ProcessOwner> {
        let pid = self.watched_ancestor(pid)?;
        let budget = self.budgets[&pid];
        Some(ProcessOwner {
            owner: Owner {
                uid: format!("local-{pid}"),
                namespace: String::new(),
                name: format!("pid-{pid}"),
            },
            training_job: None,
            container: None,
            budget_bytes: Some(budget),
            stats_dir: None,
            namespace_pid: None,
        })
    }

    fn is_running(&self, pid: u32) -> bool {
        self.proc.is_running(pid)
    }
}

/// Stops an order's processes with SIGKILL. The PIDs are host PIDs from
/// NVML, which is why the agent runs with hostPID (docs/agent.md). A process
/// already gone is not an error.
pub fn kill_processes(order: &StopOrder) -> Vec<(u32, std::io::Result<()>)> {
    order
        .pids
        .iter()
        .map(|&pid| {
            // SAFETY: kill(2) takes plain integers and touches no memory.
            let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            let result = if rc == 0 {
                Ok(())
            } else {
                let error = std::io::Error::last_os_error();
                if error.raw_os_error() == Some(libc::ESRCH) {
                    Ok(())
                } else {
                    Err(error)
                }
            };
            (pid, result)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_budgets_parse_with_and_without_suffixes() {
        assert_eq!(parse_local_budget("4242=1073741824"), Ok((4242, 1 << 30)));
        assert_eq!(parse_local_budget("7=20Gi"), Ok((7, 20 << 30)));
        assert_eq!(parse_local_budget("7=1.5Gi"), Ok((7, 3 << 29)));
        for bad in ["7", "x=1", "7=lots", "7=-1"] {
            let error = parse_local_budget(bad).unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn only_watched_processes_have_owners() {
        let owners = LocalOwners::new(ProcFs::default(), BTreeMap::from([(10, 5)]));
        assert_eq!(owners.owner_of(10).unwrap().budget_bytes, Some(5));
        assert_eq!(owners.owner_of(11), None);
    }

    #[test]
    fn a_watched_process_owns_its_descendants_and_nothing_else() {
        // The shell stays (two commands), with `sleep` as its child.
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 30; true"])
            .spawn()
            .unwrap();
        let shell_pid = shell.id();
        let proc = ProcFs::default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let sleep_pid = loop {
            let child = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .find(|&p| proc.parent_of(p) == Some(shell_pid));
            if let Some(child) = child {
                break child;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no child of the shell"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let owners = LocalOwners::new(proc.clone(), BTreeMap::from([(shell_pid, 7)]));
        let owner = owners.owner_of(sleep_pid).expect("the child is owned");
        assert_eq!(owner.owner.uid, format!("local-{shell_pid}"));
        assert_eq!(owner.budget_bytes, Some(7));
        // This test process is the shell's parent: not owned.
        assert_eq!(owners.owner_of(std::process::id()), None);
        let _ = shell.kill();
        let _ = shell.wait();
        let _ = std::process::Command::new("kill")
            .arg(sleep_pid.to_string())
            .status();
    }

    #[test]
    fn the_watchdog_kill_stops_a_real_process_and_ignores_one_already_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let order = StopOrder {
            owner: LocalOwners::new(ProcFs::default(), BTreeMap::from([(pid, 1)]))
                .owner_of(pid)
                .unwrap()
                .owner,
            gpu: "GPU-0".into(),
            used_bytes: 2,
            budget_bytes: 1,
            pids: vec![pid],
            reason: "over".into(),
        };
        assert!(kill_processes(&order).iter().all(|(_, r)| r.is_ok()));
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: the PID no longer exists.
        assert!(kill_processes(&order).iter().all(|(_, r)| r.is_ok()));
    }
}

/// A duration such as `1s`, `100ms`, `2m` or `1.5s`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, scale) = [("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)]
        .iter()
        .find_map(|(suffix, scale)| text.strip_suffix(suffix).map(|n| (n, *scale)))
        .ok_or_else(|| format!("{text:?}: give a unit (100ms, 1s, 2m)"))?;
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration"))?;
    if !(value.is_finite() && value >= 0.0) {
        return Err(format!("{text:?} is not a duration"));
    }
    Ok(std::time::Duration::from_secs_f64(value * scale))
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10").unwrap_err().contains("unit"));
        assert!(parse_duration("xs").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
