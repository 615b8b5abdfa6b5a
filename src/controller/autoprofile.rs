//! Automatic profiling: a job whose model the analytic path does not describe
//! (`model.auto`, or a Hugging Face `model_type` it does not know, with no
//! `memory.request`) is predicted from a profile captured from its own pod.
//!
//! The controller runs the job's pod template once without a GPU: no device
//! annotation, no placement, no requests, `restartPolicy: Never`, its own
//! deadline, and `VRAMFIT_PHASE=profile` with the job's batch variables. The
//! Python helper captures the first training steps on the CPU under fake
//! tensors and prints the profile as one line, `vramfit-profile: ` and the
//! base64 of its gzip (also its termination message when that fits in 4 KiB),
//! or `vramfit-profile-error: ` and why (docs/profile-format.md, "Automatic
//! profiling"). The controller reads the line from the termination message
//! or the container's log, stores the profile in a ConfigMap owned by the job
//! and named after the profile's key (`vramfit-profile-<key>`), and predicts
//! from it. The key hashes what decides the profile (namespace, images and
//! commands, model section, micro-batch, GPU count), so a second job of the
//! same kind finds the ConfigMap and skips the phase.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, EnvVar, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use kube::{Resource, ResourceExt};

use super::Context;
use crate::api::TrainingJob;
use crate::job::backoff::BatchShape;
use crate::job::env;
use crate::{Error, Result};

/// Label of a profiling pod: the name of its job.
pub const PROFILE_OF_LABEL: &str = "vramfit.dev/profile-of";
/// Label of a captured profile's ConfigMap: the profile's key.
pub const PROFILE_KEY_LABEL: &str = "vramfit.dev/profile-key";
/// Label every allocation-profile ConfigMap carries.
pub const KIND_LABEL: &str = "vramfit.dev/kind";
/// Its value.
pub const KIND_PROFILE: &str = "allocation-profile";
/// Key of the profile inside the ConfigMap.
pub const DATA_KEY: &str = "profile.json";
/// Seconds a profiling pod may run unless `model.auto.deadlineSeconds` says.
pub const DEFAULT_DEADLINE_SECONDS: u32 = 600;
/// Seconds a profiling pod may wait to start (no node took it) on top of its
/// deadline before the capture counts as failed.
pub const START_GRACE_SECONDS: i64 = 300;
/// The helper's line with the profile.
pub const PROFILE_LINE: &str = "vramfit-profile: ";
/// The helper's line when the capture failed.
pub const ERROR_LINE: &str = "vramfit-profile-error: ";
/// The largest profile accepted, decompressed (a ConfigMap holds 1 MiB).
pub const MAX_PROFILE_BYTES: u64 = 900 * 1024;
/// The most of a container's log read to find the line.
const MAX_LOG_BYTES: i64 = 4 << 20;

/// What automatic profiling has for a job now.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The profile's text.
    Ready(String),
    /// Capturing; the status message says where.
    Waiting(String),
    /// The capture failed; why, in words.
    Failed(String),
}

/// A stable key of what decides the captured profile.
pub fn profile_key(job: &TrainingJob, micro: u32) -> String {
    let template = &job.spec.template;
    let containers = |field: &str| -> Vec<serde_json::Value> {
        template
            .get("spec")
            .and_then(|s| s.get(field))
            .and_then(|c| c.as_array())
            .map(|list| {
                list.iter()
                    .map(|c| {
                        serde_json::json!({
                            "image": c.get("image"),
                            "command": c.get("command"),
                            "args": c.get("args"),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let canonical = serde_json::json!({
        "namespace": job.metadata.namespace,
        "containers": containers("containers"),
        "init": containers("initContainers"),
        "model": job.spec.model,
        "micro": micro,
        "gpus": job.spec.gpus,
    })
    .to_string();
    crate::job::signature::stable_hash(&canonical)
}

/// The profiling pod's name for the job's current generation.
pub fn pod_name(job: &TrainingJob) -> String {
    format!(
        "{}-profile-g{}",
        job.name_any(),
        job.metadata.generation.unwrap_or(0)
    )
}

/// The job's profiling pod: its template without a GPU, with the profile
/// phase's variables.
pub fn profile_pod(job: &TrainingJob, shape: BatchShape) -> std::result::Result<Pod, String> {
    let owner = job.controller_owner_ref(&()).ok_or("job has no uid yet")?;
    let template = job.spec.pod_template()?;
    let mut spec: PodSpec = template.spec.unwrap_or_default();
    if spec.containers.is_empty() {
        return Err("spec.template.spec.containers is empty".into());
    }
    spec.node_name = None;
    spec.restart_policy = Some("Never".into());
    spec.active_deadline_seconds = Some(i64::from(
        job.spec
            .model
            .auto
            .as_ref()
            .and_then(|a| a.deadline_seconds)
            .unwrap_or(DEFAULT_DEADLINE_SECONDS),
    ));
    let vars = [
        (env::PHASE, env::PHASE_PROFILE.to_string()),
        (env::MICRO_BATCH, shape.micro.to_string()),
        (env::GRAD_ACCUM, shape.accum.to_string()),
        (env::GLOBAL_BATCH, job.spec.batch.global.to_string()),
        // No GPU: the NVIDIA runtime, if any, mounts none.
        (env::VISIBLE_DEVICES, "void".to_string()),
    ];
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for container in containers {
        let list = container.env.get_or_insert_with(Vec::new);
        list.retain(|v| !env::is_reserved(&v.name));
        list.extend(vars.iter().map(|(k, v)| EnvVar {
            name: (*k).into(),
            value: Some(v.clone()),
            ..EnvVar::default()
        }));
        // Small: what the pod asks for is the CPU capture, not the training.
        if let Some(resources) = container.resources.as_mut() {
            resources.requests = None;
        }
        if container.termination_message_policy.is_none() {
            container.termination_message_policy = Some("FallbackToLogsOnError".into());
        }
    }
    let meta = template.metadata.unwrap_or_default();
    let mut labels: BTreeMap<String, String> = meta.labels.unwrap_or_default();
    labels.retain(|k, _| !k.starts_with("vramfit.dev/"));
    labels.insert(PROFILE_OF_LABEL.into(), job.name_any());
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.retain(|k, _| {
        !crate::job::keys::is_device_annotation(k) && !k.starts_with("vramfit.dev/")
    });
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(job)),
            namespace: job.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// Where a profiling pod stands.
#[derive(Clone, Debug, PartialEq)]
pub enum PodState {
    /// Waiting to start or running.
    Running,
    /// Exited 0: the profile is in its termination message or log.
    Succeeded,
    /// Failed; why, in words.
    Failed(String),
}

/// The state of `pod` at `now`: failed also when it has waited to start for
/// longer than its deadline plus [`START_GRACE_SECONDS`].
pub fn pod_state(pod: &Pod, now: Timestamp) -> PodState {
    let status = pod.status.clone().unwrap_or_default();
    match status.phase.as_deref() {
        Some("Succeeded") => return PodState::Succeeded,
        Some("Failed") => {
            let line = termination_messages(pod)
                .into_iter()
                .find_map(|m| find_line(&m).and_then(|r| r.err()));
            let why = line.unwrap_or_else(|| {
                let reason = status.reason.unwrap_or_else(|| "Failed".into());
                let message = status.message.unwrap_or_default();
                format!("the profiling pod failed ({reason}) {message}")
                    .trim_end()
                    .to_string()
            });
            return PodState::Failed(why);
        }
        _ => {}
    }
    let started = status.start_time.is_some();
    let deadline = pod
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .unwrap_or(i64::from(DEFAULT_DEADLINE_SECONDS));
    let age = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| now.as_second() - t.0.as_second());
    if !started && age > deadline + START_GRACE_SECONDS {
        return PodState::Failed(format!(
            "the profiling pod did not start within {} s (no node took it?)",
            deadline + START_GRACE_SECONDS
        ));
    }
    PodState::Running
}

fn termination_messages(pod: &Pod) -> Vec<String> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
        .collect()
}

/// The helper's verdict in `text` (a termination message or a log), the last
/// line of either kind: `Ok` with the profile's JSON, or `Err` with the
/// capture's error or why the line is unreadable. `None` without one.
pub fn find_line(text: &str) -> Option<std::result::Result<String, String>> {
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with(PROFILE_LINE) || l.starts_with(ERROR_LINE))?;
    if let Some(message) = line.strip_prefix(ERROR_LINE) {
        return Some(Err(format!("the capture failed: {message}")));
    }
    Some(decode(&line[PROFILE_LINE.len()..]))
}

fn decode(encoded: &str) -> std::result::Result<String, String> {
    let gz = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|e| format!("the profile line is not base64: {e}"))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .take(MAX_PROFILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("the profile line is not gzip of UTF-8 text: {e}"))?;
    if text.len() as u64 > MAX_PROFILE_BYTES {
        return Err(format!(
            "the captured profile is larger than {MAX_PROFILE_BYTES} bytes"
        ));
    }
    crate::predict::profile::parse_profile(&text).map_err(|e| format!("the captured {e}"))?;
    Ok(text)
}

fn kube_error(what: &str, source: kube::Error) -> Error {
    tracing::warn!("{what}: {source}");
    Error::Kube(source)
}

/// Finds, captures or waits for the job's profile at `shape`.
pub async fn run(job: &TrainingJob, ctx: &Context, shape: BatchShape) -> Result<Outcome> {
    let namespace = job.namespace().unwrap_or_default();
    let key = profile_key(job, shape.micro);
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let cached = maps
        .get_opt(&config_map_name(&key))
        .await
        .map_err(|e| kube_error("reading the captured profiles", e))?;
    if let Some(text) = cached.and_then(|m| m.data?.remove(DATA_KEY)) {
        return Ok(Outcome::Ready(text));
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let name = pod_name(job);
    let Some(pod) = pods
        .get_opt(&name)
        .await
        .map_err(|e| kube_error("reading the profiling pod", e))?
    else {
        let pod = match profile_pod(job, shape) {
            Ok(pod) => pod,
            Err(message) => return Ok(Outcome::Failed(message)),
        };
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            // The namespace refused it (Pod Security, a quota): the job's
            // template cannot run here at all.
            Err(kube::Error::Api(e)) if (400..500).contains(&e.code) => {
                return Ok(Outcome::Failed(format!(
                    "the profiling pod was refused: {}",
                    e.message
                )));
            }
            Err(e) => return Err(kube_error("creating the profiling pod", e)),
        }
        return Ok(Outcome::Waiting(waiting_message(&name, shape)));
    };
    match pod_state(&pod, Timestamp::now()) {
        PodState::Running => Ok(Outcome::Waiting(waiting_message(&name, shape))),
        PodState::Failed(why) => Ok(Outcome::Failed(why)),
        PodState::Succeeded => {
            let mut found = termination_messages(&pod).iter().find_map(|m| find_line(m));
            if found.is_none() {
                for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
                    let params = LogParams {
                        container: Some(container.name.clone()),
                        limit_bytes: Some(MAX_LOG_BYTES),
                        ..LogParams::default()
                    };
                    match pods.logs(&name, &params).await {
                        Ok(log) => {
                            found = find_line(&log);
                            if found.is_some() {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(pod = %name, "reading the profiling pod's log: {e}")
                        }
                    }
                }
            }
            let text = match found {
                Some(Ok(text)) => text,
                Some(Err(why)) => return Ok(Outcome::Failed(why)),
                None => {
                    return Ok(Outcome::Failed(
                        "the profiling pod finished without printing a profile: its script must \
                         train through vramfit.Step, the Lightning or Trainer callback, or call \
                         vramfit.profile.capture_step (docs/profile-format.md)"
                            .into(),
                    ));
                }
            };
            store(job, &maps, &key, &text).await?;
            // The capture is kept; the pod is no longer needed.
            let _ = pods.delete(&name, &DeleteParams::default()).await;
            Ok(Outcome::Ready(text))
        }
    }
}

/// The ConfigMap that holds the profile of `key`: found by name, so a
/// second job of the same kind needs no right to list ConfigMaps.
pub fn config_map_name(key: &str) -> String {
    format!("vramfit-profile-{key}")
}

fn waiting_message(pod: &str, shape: BatchShape) -> String {
    format!(
        "capturing the allocation profile at micro-batch {} on a CPU (pod {pod})",
        shape.micro
    )
}

/// Stores the captured profile in a ConfigMap owned by the job.
async fn store(job: &TrainingJob, maps: &Api<ConfigMap>, key: &str, text: &str) -> Result<()> {
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_map_name(key)),
            namespace: job.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (PROFILE_KEY_LABEL.to_string(), key.to_string()),
                (KIND_LABEL.to_string(), KIND_PROFILE.to_string()),
                (PROFILE_OF_LABEL.to_string(), job.name_any()),
            ])),
            owner_references: job.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(DATA_KEY.to_string(), text.to_string())])),
        ..ConfigMap::default()
    };
    match maps.create(&PostParams::default(), &map).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(kube_error("storing the captured profile", e)),
    }
}

#[cfg(test)]
#[path = "autoprofile_tests.rs"]
mod tests;
