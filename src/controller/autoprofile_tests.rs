use std::io::Write;

use base64::Engine;
use k8s_openapi::api::core::v1::PodStatus;

use super::*;

const PROFILE: &str = r#"{"format":"vramfit.profile/v1","microBatch":8,"sizes":[1024,4096],"events":[0,1,-2,1,-3,-1]}"#;

fn line(json: &str) -> String {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(json.as_bytes()).unwrap();
    let encoded = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
    format!("{PROFILE_LINE}{encoded}")
}

fn auto_job() -> TrainingJob {
    TrainingJob::test("a")
        .model(serde_json::json!({"auto": {"deadlineSeconds": 120}}))
        .template_spec(serde_json::json!({
            "initContainers": [{"name": "fetch", "image": "busybox",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}],
            "containers": [{"name": "train", "image": "trainer:1", "command": ["python", "t.py"],
                "env": [{"name": "VRAMFIT_BUDGET_BYTES", "value": "1"}, {"name": "KEEP", "value": "x"}],
                "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "80Gi"}}}]
        }))
        .build()
}

#[test]
fn the_key_follows_what_decides_the_profile_and_nothing_else() {
    let job = auto_job();
    let key = profile_key(&job, 8);
    assert_eq!(key, profile_key(&job, 8), "stable");
    assert_ne!(key, profile_key(&job, 4), "micro-batch");
    let mut other = job.clone();
    other.metadata.namespace = Some("other".into());
    assert_ne!(key, profile_key(&other, 8), "namespace");
    let mut image = job.clone();
    image.spec.template["spec"]["containers"][0]["image"] = "trainer:2".into();
    assert_ne!(key, profile_key(&image, 8), "image");
    let mut command = job.clone();
    command.spec.template["spec"]["containers"][0]["command"] =
        serde_json::json!(["python", "u.py"]);
    assert_ne!(key, profile_key(&command, 8), "command");
    let mut precision = job.clone();
    precision.spec.model.precision = crate::api::Precision::AmpBf16;
    assert_ne!(key, profile_key(&precision, 8), "model section");
    let mut unrelated = job.clone();
    unrelated.spec.priority = 5;
    unrelated.metadata.name = Some("b".into());
    assert_eq!(
        key,
        profile_key(&unrelated, 8),
        "another job of the same kind"
    );
    assert_eq!(config_map_name(&key), format!("vramfit-profile-{key}"));
}

#[test]
fn the_profiling_pod_is_the_template_without_a_gpu_with_the_profile_phase() {
    let job = auto_job();
    let pod = profile_pod(&job, BatchShape { micro: 8, accum: 1 }).unwrap();
    assert_eq!(pod.metadata.name.as_deref(), Some("a-profile-g1"));
    let labels = pod.metadata.labels.clone().unwrap();
    assert_eq!(labels.get(PROFILE_OF_LABEL).map(String::as_str), Some("a"));
    assert!(
        !labels.contains_key(crate::job::keys::JOB_LABEL),
        "not a training attempt: the pod ledger must not count it"
    );
    let annotations = pod.metadata.annotations.clone().unwrap();
    assert!(
        annotations
            .keys()
            .all(|k| !k.starts_with("vramfit.dev/") && !crate::job::keys::is_device_annotation(k))
    );
    assert_eq!(pod.metadata.owner_references.as_ref().unwrap()[0].name, "a");
    let spec = pod.spec.unwrap();
    assert_eq!(spec.node_name, None, "the scheduler places it, on any node");
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.active_deadline_seconds, Some(120));
    let train = &spec.containers[0];
    let env: BTreeMap<String, String> = train
        .env
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        env.get("VRAMFIT_PHASE").map(String::as_str),
        Some("profile")
    );
    assert_eq!(
        env.get("VRAMFIT_MICRO_BATCH").map(String::as_str),
        Some("8")
    );
    assert_eq!(env.get("VRAMFIT_GRAD_ACCUM").map(String::as_str), Some("1"));
    assert_eq!(
        env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
        Some("void")
    );
    assert_eq!(env.get("KEEP").map(String::as_str), Some("x"));
    assert!(
        !env.contains_key("VRAMFIT_BUDGET_BYTES"),
        "the template's own is dropped"
    );
    let resources = train.resources.clone().unwrap();
    assert_eq!(resources.requests, None, "small requests");
    assert!(
        resources.limits.unwrap().contains_key("memory"),
        "the limits stay"
    );
    let init_env = spec.init_containers.unwrap()[0].env.clone().unwrap();
    assert!(
        init_env
            .iter()
            .any(|v| v.name == "NVIDIA_VISIBLE_DEVICES" && v.value.as_deref() == Some("void"))
            && init_env
                .iter()
                .filter(|v| v.name == "NVIDIA_VISIBLE_DEVICES")
                .count()
                == 1
    );
    let mut without = job.clone();
    without.spec.model.auto = Some(Default::default());
    let pod = profile_pod(&without, BatchShape { micro: 8, accum: 1 }).unwrap();
    assert_eq!(
        pod.spec.unwrap().active_deadline_seconds,
        Some(i64::from(DEFAULT_DEADLINE_SECONDS))
    );
}

#[test]
fn the_helpers_line_is_found_decoded_and_checked() {
    assert_eq!(find_line(&line(PROFILE)), Some(Ok(PROFILE.to_string())));
    // The last verdict of a log counts; other lines are ignored.
    let log = format!(
        "step 1\n{}\nnoise\n{ERROR_LINE}meta tensor\nbye\n",
        line(PROFILE)
    );
    assert_eq!(
        find_line(&log),
        Some(Err("the capture failed: meta tensor".into()))
    );
    let log = format!("{ERROR_LINE}first\n{}\n", line(PROFILE));
    assert_eq!(find_line(&log), Some(Ok(PROFILE.to_string())));
    assert_eq!(find_line("training...\ndone"), None);
    let garbage = find_line(&format!("{PROFILE_LINE}!!!"))
        .unwrap()
        .unwrap_err();
    assert!(garbage.contains("not base64"), "{garbage}");
    let plain = base64::engine::general_purpose::STANDARD.encode(PROFILE);
    let not_gzip = find_line(&format!("{PROFILE_LINE}{plain}"))
        .unwrap()
        .unwrap_err();
    assert!(not_gzip.contains("not gzip"), "{not_gzip}");
    let wrong = find_line(&line(
        r#"{"format":"other/v9","microBatch":1,"sizes":[1],"events":[0]}"#,
    ))
    .unwrap()
    .unwrap_err();
    assert!(wrong.contains("not supported"), "{wrong}");
    let huge = format!(
        r#"{{"format":"vramfit.profile/v1","microBatch":1,"sizes":[1],"events":[0],"source":"{}"}}"#,
        "x".repeat(MAX_PROFILE_BYTES as usize)
    );
    let too_big = find_line(&line(&huge)).unwrap().unwrap_err();
    assert!(too_big.contains("larger than"), "{too_big}");
}

fn pod_with(phase: &str, message: &str, created_ago: i64, started: bool) -> Pod {
    let now = Timestamp::now();
    let mut pod = profile_pod(&auto_job(), BatchShape { micro: 8, accum: 1 }).unwrap();
    pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::from_second(now.as_second() - created_ago).unwrap(),
    ));
    let status: PodStatus = serde_json::from_value(serde_json::json!({
        "phase": phase,
        "reason": if phase == "Failed" { "DeadlineExceeded" } else { "" },
        "containerStatuses": [{"name": "train", "image": "t", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 3, "message": message}}}],
    }))
    .unwrap();
    pod.status = Some(PodStatus {
        start_time: started.then_some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
        ..status
    });
    pod
}

#[test]
fn the_pods_state_says_why_a_capture_failed() {
    let now = Timestamp::now();
    assert_eq!(
        pod_state(&pod_with("Succeeded", "", 10, true), now),
        PodState::Succeeded
    );
    assert_eq!(
        pod_state(&pod_with("Running", "", 10, true), now),
        PodState::Running
    );
    assert_eq!(
        pod_state(
            &pod_with("Failed", &format!("{ERROR_LINE}no vramfit.Step"), 10, true),
            now
        ),
        PodState::Failed("the capture failed: no vramfit.Step".into())
    );
    assert_eq!(
        pod_state(&pod_with("Failed", "", 10, true), now),
        PodState::Failed("the profiling pod failed (DeadlineExceeded)".into())
    );
    // Never started: failed once past its deadline (120 s) and the grace.
    let limit = 120 + START_GRACE_SECONDS;
    assert_eq!(
        pod_state(&pod_with("Pending", "", limit, false), now),
        PodState::Running
    );
    assert!(matches!(
        pod_state(&pod_with("Pending", "", limit + 5, false), now),
        PodState::Failed(m) if m.contains("did not start")
    ));
    assert_eq!(
        pod_state(&pod_with("Running", "", limit + 5, true), now),
        PodState::Running,
        "started: its own deadline ends it"
    );
}
