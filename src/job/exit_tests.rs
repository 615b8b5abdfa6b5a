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

#[test]
fn only_the_no_gpu_protocol_counts_as_no_gpu() {
    let said = "vramfit: no GPU device: the attempt was placed on GPU-1 but the container has no /dev/nvidiaN";
    let cases = [
        (
            pod_with("Failed", 43, &format!("traceback\n{said}"), "Error"),
            true,
        ),
        // The text with another exit code, or the code without the text.
        (pod_with("Failed", 1, said, "Error"), false),
        (pod_with("Failed", 43, "KeyError: 'x'", "Error"), false),
        // The OOM protocol is not a missing GPU.
        (pod_with("Failed", 42, "CUDA out of memory", "Error"), false),
    ];
    for (pod, no_gpu) in cases {
        match pod_outcome(&pod) {
            PodOutcome::NoGpu(line) => {
                assert!(no_gpu, "{line}");
                assert_eq!(line, said);
            }
            other => assert!(!no_gpu, "{other:?}"),
        }
    }
}
