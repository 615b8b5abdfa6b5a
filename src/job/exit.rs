//! The OOM exit protocol between the training container and the controller.
//!
//! A training process that runs out of GPU memory exits with
//! [`OOM_EXIT_CODE`] and writes a termination message (the container's
//! `/dev/termination-log`) that contains PyTorch's text `CUDA out of memory`.
//! The `vramfit` Python helper does both when it catches
//! `torch.cuda.OutOfMemoryError`; the node agent reports a pod it stopped for
//! exceeding its budget in `GpuNode.status.oomReports`, which counts the same.
//! Anything else (a non-zero exit with another code, a host-memory OOM kill with
//! 137, an image pull failure) is an ordinary failure and is not retried.

use k8s_openapi::api::core::v1::Pod;

/// Exit code of a training process that ran out of GPU memory.
pub const OOM_EXIT_CODE: i32 = 42;

/// Text the termination message must contain (PyTorch's own wording).
pub const OOM_MESSAGE_MARK: &str = "CUDA out of memory";

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

/// The line of a termination message worth showing: the OOM line when there
/// is one, else the start of the text.
pub fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.contains(OOM_MESSAGE_MARK))
        .unwrap_or(text);
    line.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_with(phase: &str, exit_code: i32, message: &str, reason: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {
                "phase": phase,
                "containerStatuses": [{
                    "name": "train", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": exit_code, "message": message, "reason": reason}}
                }]
            }
        }))
        .expect("pod parses")
    }

    #[test]
    fn only_the_oom_protocol_counts_as_out_of_memory() {
        let torch = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.8 GiB";
        let cases = [
            (pod_with("Failed", 42, torch, "Error"), true),
            // The right text but another exit code: an ordinary failure.
            (pod_with("Failed", 1, torch, "Error"), false),
            // The exit code without the text: an ordinary failure.
            (pod_with("Failed", 42, "KeyError: 'x'", "Error"), false),
            // Host memory OOM kill: not a GPU OOM.
            (pod_with("Failed", 137, "", "OOMKilled"), false),
        ];
        for (pod, is_oom) in cases {
            let outcome = pod_outcome(&pod);
            assert_eq!(
                matches!(outcome, PodOutcome::OutOfMemory(_)),
                is_oom,
                "{outcome:?}"
            );
            if !is_oom {
                assert!(matches!(outcome, PodOutcome::Failed(_)), "{outcome:?}");
            }
        }
    }

    #[test]
    fn ordinary_failure_message_names_container_and_code() {
        match pod_outcome(&pod_with("Failed", 137, "", "OOMKilled")) {
            PodOutcome::Failed(message) => {
                assert!(message.contains("train"), "{message}");
                assert!(message.contains("137"), "{message}");
                assert!(message.contains("OOMKilled"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn phases_map_to_outcomes() {
        assert_eq!(
            pod_outcome(&pod_with("Succeeded", 0, "", "Completed")),
            PodOutcome::Succeeded
        );
        assert_eq!(
            pod_outcome(&pod_with("Running", 0, "", "")),
            PodOutcome::Running
        );
        assert_eq!(
            pod_outcome(&pod_with("Pending", 0, "", "")),
            PodOutcome::Waiting
        );
    }

    #[test]
    fn the_oom_message_is_the_line_with_pytorch_s_text_cut_to_300_characters() {
        let text = format!(
            "Traceback (most recent call last):\n  File \"train.py\"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate {}\n",
            "x".repeat(400)
        );
        match pod_outcome(&pod_with("Failed", 42, &text, "Error")) {
            PodOutcome::OutOfMemory(message) => {
                assert!(
                    message.starts_with("torch.OutOfMemoryError: CUDA out of memory."),
                    "{message}"
                );
                assert_eq!(message.chars().count(), 300);
            }
            other => panic!("{other:?}"),
        }
    }
}
