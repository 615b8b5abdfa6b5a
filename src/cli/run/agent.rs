//! The node agent beside a local attempt: `vramfit run --local` starts
//! `vramfit-agent run --local-budget PID=BYTES` for each attempt's process,
//! so the budget is enforced on the GPU as on a cluster node (the agent
//! SIGKILLs a process tree that stays over its budget plus tolerance for the
//! grace period, and writes an OOM report first). The report decides the
//! attempt's outcome, as the agent's report does for the controller
//! (docs/agent.md, "Which OOM path wins").

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::api::GpuNodeStatus;

/// The agent binary's name.
pub const AGENT_BINARY: &str = "vramfit-agent";

/// Finds the agent: `explicit` when given (it must exist), else
/// `vramfit-agent` beside the running `vramfit`, else on `PATH`.
pub fn find_agent(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        bail!("--agent {}: no such file", path.display());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(AGENT_BINARY)));
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join(AGENT_BINARY));
    beside
        .into_iter()
        .chain(on_path)
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{AGENT_BINARY} not found beside this vramfit or on PATH: it enforces the budget \
             on the GPU; pass --agent PATH, or --no-agent to rely on the training process alone"
            )
        })
}

/// The agent's command line for one attempt: standalone (no API server),
/// no probe and no context measurement (they would take GPU memory beside
/// the training), readings every `interval`, the process and its
/// descendants held to `budget_bytes` per GPU.
pub fn agent_args(
    pid: u32,
    budget_bytes: u64,
    interval: Duration,
    status_file: &Path,
) -> Vec<String> {
    vec![
        "run".into(),
        "--node".into(),
        "local".into(),
        "--standalone".into(),
        "--no-probe".into(),
        "--no-context-overhead".into(),
        "--interval".into(),
        format!("{}ms", interval.as_millis().max(1)),
        "--local-budget".into(),
        format!("{pid}={budget_bytes}"),
        "--status-file".into(),
        status_file.display().to_string(),
    ]
}

/// The reason of the agent's OOM report for the attempt's process `pid`
/// (owner `local-<pid>`), if the agent stopped it.
pub fn stop_reason(status: &GpuNodeStatus, pid: u32) -> Option<String> {
    let uid = format!("local-{pid}");
    status
        .oom_reports
        .iter()
        .rev()
        .find(|r| r.pod_uid.as_deref() == Some(uid.as_str()))
        .map(|r| {
            r.reason.clone().unwrap_or_else(|| {
                format!("{} bytes over a budget of {}", r.used_bytes, r.budget_bytes)
            })
        })
}

/// A running agent watching one attempt.
pub struct AttemptWatchdog {
    child: Option<Child>,
    pid: u32,
    status_file: PathBuf,
    log: PathBuf,
}

impl AttemptWatchdog {
    /// Starts `agent` for process `pid`; its status goes to
    /// `dir/agent-status.json`, its log to `dir/agent.log`.
    pub fn start(
        agent: &Path,
        pid: u32,
        budget_bytes: u64,
        interval: Duration,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let status_file = dir.join("agent-status.json");
        let log = dir.join("agent.log");
        let _ = fs::remove_file(&status_file);
        let mut command = Command::new(agent);
        // SAFETY: the closure runs in the forked child before exec and makes
        // one async-signal-safe system call: the agent gets SIGTERM when
        // `vramfit` dies (Ctrl-C, a kill), so it never outlives the run.
        unsafe {
            use std::os::unix::process::CommandExt as _;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = command
            .args(agent_args(pid, budget_bytes, interval, &status_file))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?)
            .spawn()
            .with_context(|| format!("starting {}", agent.display()))?;
        Ok(Self {
            child: Some(child),
            pid,
            status_file,
            log,
        })
    }

    /// Stops the agent (SIGTERM, then SIGKILL after 5 s) once the attempt's
    /// process has ended, and returns the reason of its OOM report for the
    /// process, if it stopped it. An agent that ended on its own before
    /// (bad flags, a crash) is an error naming its log.
    pub fn finish(mut self) -> anyhow::Result<Option<String>> {
        let mut child = self.child.take().context("the agent was already stopped")?;
        if let Some(exit) = child.try_wait()? {
            let tail = fs::read_to_string(&self.log).unwrap_or_default();
            let last = tail.lines().last().unwrap_or("").to_string();
            bail!(
                "{AGENT_BINARY} ended early ({exit}); its log is {}: {last}",
                self.log.display()
            );
        }
        // SAFETY: kill(2) with the agent's PID (our child, not yet reaped).
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let Ok(text) = fs::read_to_string(&self.status_file) else {
            return Ok(None);
        };
        let status: GpuNodeStatus = serde_json::from_str(&text)
            .with_context(|| format!("reading {}", self.status_file.display()))?;
        Ok(stop_reason(&status, self.pid))
    }
}

impl Drop for AttemptWatchdog {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
