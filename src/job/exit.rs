//! The OOM exit protocol between the training container and the controller.
//!
//! A training process that runs out of GPU memory exits with
//! [`OOM_EXIT_CODE`] and writes a termination message (the container's
//! `/dev/termination-log`) that contains PyTorch's text `CUDA out of memory`.
//! The `vramfit` Python helper does both when it catches
//! `torch.cuda.OutOfMemoryError`; the node agent reports a pod it stopped for
//! exceeding its budget in `GpuNode.status.oomReports`, which counts the same.
//! A process whose container lacks the GPU its attempt was placed on (the
//! node's device injection did not run for it, e.g. while the NRI plugin's
//! pod was being replaced) exits with [`NO_GPU_EXIT_CODE`] and a termination
//! message that contains [`NO_GPU_MESSAGE_MARK`]; the helper checks this in
//! `vramfit.configure()`, before CUDA is touched. Such an attempt is retried
//! at the same shape (job::attempt).
//! Anything else (a non-zero exit with another code, a host-memory OOM kill with
//! 137, an image pull failure) is an ordinary failure and is not retried.

use k8s_openapi::api::core::v1::Pod;

/// Exit code of a training process that ran out of GPU memory.
pub const OOM_EXIT_CODE: i32 = 42;

/// Text the termination message must contain (PyTorch's own wording).
pub const OOM_MESSAGE_MARK: &str = "CUDA out of memory";

/// Exit code of a training process whose container has no GPU device
/// although its attempt was placed on one.
pub const NO_GPU_EXIT_CODE: i32 = 43;

/// Text the termination message of [`NO_GPU_EXIT_CODE`] must contain.
pub const NO_GPU_MESSAGE_MARK: &str = "vramfit: no GPU device";

/// How a training pod ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PodOutcome {
    /// Still starting or running.
    Running,
    /// Not started yet (pending, image pulling, ...).
    #[default]
    Waiting,
    /// Exited 0.
    Succeeded,
    /// Ran out of GPU memory, following the protocol.
    OutOfMemory(String),
    /// Started without the GPU it was placed on, following the protocol.
    NoGpu(String),
    /// Failed for another reason.
    Failed(String),
}

/// Reads the outcome of a training pod from its status.
pub fn pod_outcome(pod: &Pod) -> PodOutcome {
    let Some(status) = pod.status.as_ref() else {
        return PodOutcome::Waiting;
    };
    match status.phase.as_deref() {
        Some("Succeeded") => PodOutcome::Succeeded,
        Some("Running") => PodOutcome::Running,
        Some("Failed") => failed_outcome(pod),
        _ => PodOutcome::Waiting,
    }
}

fn failed_outcome(pod: &Pod) -> PodOutcome {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let mut reasons = Vec::new();
    for container in statuses {
        let Some(terminated) = container.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
            continue;
        };
        let message = terminated.message.clone().unwrap_or_default();
        if is_oom_exit(terminated.exit_code, &message) {
            return PodOutcome::OutOfMemory(first_line(&message));
        }
        if is_no_gpu_exit(terminated.exit_code, &message) {
            return PodOutcome::NoGpu(marked_line(&message, NO_GPU_MESSAGE_MARK));
        }
        if terminated.exit_code != 0 {
            let reason = terminated.reason.clone().unwrap_or_else(|| "Error".into());
            let detail = if message.is_empty() {
                String::new()
            } else {
                format!(": {}", first_line(&message))
            };
            reasons.push(format!(
                "container {} exited with code {} ({reason}){detail}",
                container.name, terminated.exit_code
            ));
        }
    }
    if reasons.is_empty() {
        let said = pod.status.as_ref().and_then(|s| s.message.clone());
        reasons.push(said.unwrap_or_else(|| "pod failed".into()));
    }
    PodOutcome::Failed(reasons.join("; "))
}

/// True when a process's exit code and termination message follow the OOM
/// protocol (the controller's pods and `vramfit run --local` alike).
pub fn is_oom_exit(exit_code: i32, message: &str) -> bool {
    exit_code == OOM_EXIT_CODE && message.contains(OOM_MESSAGE_MARK)
}

/// True when a process's exit code and termination message say that its
/// container had no GPU device.
pub fn is_no_gpu_exit(exit_code: i32, message: &str) -> bool {
    exit_code == NO_GPU_EXIT_CODE && message.contains(NO_GPU_MESSAGE_MARK)
}

/// The line of a termination message worth showing: the OOM line when there
/// is one, else the start of the text.
pub fn first_line(text: &str) -> String {
    marked_line(text, OOM_MESSAGE_MARK)
}

/// The first line of `text` that holds `mark` (else the start of the text),
/// cut to 300 characters.
fn marked_line(text: &str, mark: &str) -> String {
    let line = text.lines().find(|l| l.contains(mark)).unwrap_or(text);
    line.chars().take(300).collect()
}

#[cfg(test)]
#[path = "exit_tests.rs"]
mod tests;
