//! Plain local processes with budgets (`--local-budget PID=BYTES`): the
//! watchdog on a machine without a kubelet, and `vramfit run --local`.
//! Each watched process and its descendants (a launcher's workers, a shell's
//! python) are one owner, `local-<pid>`, as a pod's processes are one pod;
//! every other GPU process belongs to no one and is never stopped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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
            gpus: None,
            stats_dir: None,
            namespace_pid: None,
        })
    }

    fn is_running(&self, pid: u32) -> bool {
        self.proc.is_running(pid)
    }
}

/// Process file descriptors (pidfd_open(2)) of the GPU processes seen,
/// opened when a process is first seen and kept while it is. A kill goes
/// through the descriptor, which names that process and no other: if it has
/// exited and its PID was given to a new process meanwhile (the OOM report
/// before a kill may wait on the API server), the signal fails with ESRCH
/// instead of reaching the newcomer.
#[derive(Default)]
pub struct PidFds {
    fds: HashMap<u32, OwnedFd>,
}

impl PidFds {
    /// Keeps the descriptors of `pids` (opening those not seen before) and
    /// closes the others'.
    pub fn track(&mut self, pids: &HashSet<u32>) {
        self.fds.retain(|pid, _| pids.contains(pid));
        for &pid in pids {
            if !self.fds.contains_key(&pid)
                && let Ok(fd) = pidfd_open(pid)
            {
                self.fds.insert(pid, fd);
            }
        }
    }

    /// Whether `pid` has a descriptor.
    pub fn tracks(&self, pid: u32) -> bool {
        self.fds.contains_key(&pid)
    }

    /// Sends SIGKILL to the process seen as `pid`: through its descriptor,
    /// or (a process first seen now) through one opened now. A process
    /// already gone is not an error.
    pub fn kill(&self, pid: u32) -> std::io::Result<()> {
        let opened;
        let fd = match self.fds.get(&pid) {
            Some(fd) => fd,
            None => match pidfd_open(pid) {
                Ok(fd) => {
                    opened = fd;
                    &opened
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
                Err(e) => return Err(e),
            },
        };
        // SAFETY: pidfd_send_signal(2) with a descriptor this process owns,
        // no siginfo (null) and no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ESRCH) {
            Ok(())
        } else {
            Err(error)
        }
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes plain integers; a non-negative result is a
    // new descriptor that only this OwnedFd closes.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// Stops an order's processes with SIGKILL through their descriptors in
/// `fds`. The PIDs are host PIDs from NVML, which is why the agent runs with
/// hostPID (docs/agent.md).
pub fn kill_processes(order: &StopOrder, fds: &PidFds) -> Vec<(u32, std::io::Result<()>)> {
    order.pids.iter().map(|&pid| (pid, fds.kill(pid))).collect()
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
#[path = "local_tests.rs"]
mod tests;
