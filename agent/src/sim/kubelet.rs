//! The kubelet's part for the pods bound to a simulated node: each pod runs
//! as a simulated process ([`Workload`]) on the GPUs its
//! `NVIDIA_VISIBLE_DEVICES` names, goes `Running`, then `Succeeded` or
//! `Failed` (the OOM exit protocol when its true peak exceeds its budget;
//! exit 137 when the watchdog stops it); a pod being deleted is removed, as a
//! kubelet confirms a deletion.
//!
//! The status builders are shared with the controller's integration tests.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vramfit::api::TrainingJob;
use vramfit::job::keys::{BUDGET_ANNOTATION, JOB_LABEL};
use vramfit::predict::{JobShape, gpu_profile, predict_model};

use super::workload::{
    Exit, PEAK_ANNOTATION, RUN_ANNOTATION, UNBOUNDED_ANNOTATION, Workload, peak_from_annotation,
};
use super::{SimPod, SimState};
use crate::daemon::local::parse_duration;
use crate::node::watchdog::Owner;

/// Exit code of a process killed by SIGKILL, as the container runtime
/// reports it.
pub const SIGKILL_EXIT_CODE: i32 = 137;

fn container_status(name: &str, state: Value) -> Value {
    json!({"name": name, "image": "simulated", "imageID": "", "ready": false,
           "restartCount": 0, "state": state})
}

/// Pod status of a pod whose containers run.
pub fn running_status(containers: &[String]) -> Value {
    let now = Timestamp::now().to_string();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| container_status(c, json!({"running": {"startedAt": now}})))
        .collect();
    json!({"phase": "Running", "startTime": now, "containerStatuses": statuses})
}

/// Pod status of a pod whose first container exited with `exit_code` and
/// `message` (the others, if any, exited 0).
pub fn exit_status(containers: &[String], exit_code: i32, message: &str) -> Value {
    let phase = if exit_code == 0 {
        "Succeeded"
    } else {
        "Failed"
    };
    let statuses: Vec<Value> = containers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (code, text) = if i == 0 {
                (exit_code, message)
            } else {
                (0, "")
            };
            let reason = if code == 0 { "Completed" } else { "Error" };
            container_status(
                c,
                json!({"terminated": {"exitCode": code, "reason": reason, "message": text,
                                      "finishedAt": Timestamp::now().to_string()}}),
            )
        })
        .collect();
    json!({"phase": phase, "containerStatuses": statuses})
}

/// Writes a pod's status, as the kubelet does.
pub async fn patch_pod_status(pods: &Api<Pod>, name: &str, status: Value) -> kube::Result<Pod> {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await
}

fn env_of(pod: &Pod, name: &str) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|v| v.name == name)
        .and_then(|v| v.value.clone())
}

fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Plays the kubelet for the pods in `pods` (those bound to the node) every
/// `interval`, until the task is dropped.
pub async fn run_kubelet(
    client: Client,
    pods: Store<Pod>,
    state: Arc<Mutex<SimState>>,
    interval: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        kubelet_pass(&client, &pods, &state).await;
    }
}

async fn kubelet_pass(client: &Client, pods: &Store<Pod>, state: &Arc<Mutex<SimState>>) {
    let now = Instant::now();
    let listed = pods.state();
    let alive: Vec<String> = listed.iter().filter_map(|p| p.uid()).collect();
    state
        .lock()
        .expect("simulated node state")
        .pods
        .retain(|uid, _| alive.contains(uid));
    for pod in listed {
        let (Some(uid), Some(namespace)) = (pod.uid(), pod.namespace()) else {
            continue;
        };
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        if pod.metadata.deletion_timestamp.is_some() {
            // The containers stop; the kubelet confirms the deletion.
            state.lock().expect("state").pods.remove(&uid);
            if let Err(e) = api
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await
            {
                tracing::debug!(pod = %name, "confirming the deletion: {e}");
            }
            continue;
        }
        let known = state.lock().expect("state").pods.contains_key(&uid);
        if !known {
            if is_terminal(&pod) {
                continue;
            }
            let sim_pod = start_pod(client, &pod, state).await;
            let containers = sim_pod.containers.clone();
            state
                .lock()
                .expect("state")
                .pods
                .insert(uid.clone(), sim_pod);
            if let Err(e) = patch_pod_status(&api, &name, running_status(&containers)).await {
                tracing::warn!(pod = %name, "cannot mark the pod Running: {e}");
                state.lock().expect("state").pods.remove(&uid);
            }
            continue;
        }
        let ended = {
            let mut guard = state.lock().expect("state");
            let sim_pod = guard.pods.get_mut(&uid).expect("known pod");
            if sim_pod.reported_end {
                None
            } else {
                let exit = sim_pod.exit_at(now);
                if exit.is_some() {
                    sim_pod.reported_end = true;
                }
                exit.map(|e| (e, sim_pod.containers.clone()))
            }
        };
        if let Some((exit, containers)) = ended {
            tracing::info!(pod = %name, code = exit.code, "simulated pod ends: {}", exit.phase());
            if let Err(e) = patch_pod_status(
                &api,
                &name,
                exit_status(&containers, exit.code, &exit.message),
            )
            .await
            {
                tracing::warn!(pod = %name, "cannot write the pod's end: {e}");
                if let Some(p) = state.lock().expect("state").pods.get_mut(&uid) {
                    p.reported_end = false;
                }
            }
        }
    }
}

/// The simulated process of a newly bound pod.
async fn start_pod(client: &Client, pod: &Pod, state: &Arc<Mutex<SimState>>) -> SimPod {
    let namespace = pod.namespace().unwrap_or_default();
    let budget = pod
        .annotations()
        .get(BUDGET_ANNOTATION)
        .and_then(|b| b.parse().ok());
    let micro: u32 = env_of(pod, "VRAMFIT_MICRO_BATCH")
        .and_then(|m| m.parse().ok())
        .unwrap_or(1);
    let (model, context_bytes, default_run, gpus, pid) = {
        let mut guard = state.lock().expect("state");
        let visible = env_of(pod, "NVIDIA_VISIBLE_DEVICES").unwrap_or_default();
        let mut gpus: Vec<String> = guard
            .gpus
            .iter()
            .filter(|g| visible.split(',').any(|v| v.trim() == g.uuid))
            .map(|g| g.uuid.clone())
            .collect();
        if gpus.is_empty() {
            gpus.extend(guard.gpus.first().map(|g| g.uuid.clone()));
        }
        guard.next_pid += 1;
        (
            guard.profile.name,
            guard.profile.context_bytes,
            guard.run_for,
            gpus,
            guard.next_pid,
        )
    };
    let annotated = pod
        .annotations()
        .get(PEAK_ANNOTATION)
        .and_then(|a| peak_from_annotation(a, micro));
    let true_peak = match annotated {
        Some(peak) => peak,
        None => predicted_peak(client, pod, &namespace, model, micro)
            .await
            .or_else(|| budget.map(|b: u64| b / 10 * 9))
            .unwrap_or(1 << 30),
    };
    let run_for = pod
        .annotations()
        .get(RUN_ANNOTATION)
        .and_then(|r| parse_duration(r).ok())
        .unwrap_or(default_run);
    let unbounded = pod
        .annotations()
        .get(UNBOUNDED_ANNOTATION)
        .is_some_and(|v| v == "true");
    tracing::info!(pod = %pod.name_any(), pid, true_peak, ?budget, unbounded, "simulated pod starts");
    SimPod {
        owner: Owner {
            uid: pod.uid().unwrap_or_default(),
            namespace,
            name: pod.name_any(),
        },
        training_job: pod.labels().get(JOB_LABEL).cloned(),
        containers: container_names(pod),
        budget_bytes: budget,
        gpus,
        pid,
        workload: Workload {
            started: Instant::now(),
            run_for,
            context_bytes,
            true_peak_bytes: true_peak,
            budget_bytes: if unbounded { None } else { budget },
        },
        killed: false,
        reported_end: false,
    }
}

/// The predictor's peak for the pod's TrainingJob at micro-batch `micro` on
/// this node's GPU model.
async fn predicted_peak(
    client: &Client,
    pod: &Pod,
    namespace: &str,
    model: &str,
    micro: u32,
) -> Option<u64> {
    let job_name = pod.labels().get(JOB_LABEL)?;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), namespace);
    let job = jobs.get_opt(job_name).await.ok()??;
    let shape = JobShape {
        gpus: job.spec.gpus,
        global_batch: job.spec.batch.global,
        micro_batch: micro,
    };
    predict_model(&job.spec.model, &shape, gpu_profile(model)?)
        .ok()
        .map(|p| p.peak_bytes)
}

impl SimPod {
    /// How the pod ended by `now`: killed by the watchdog, or its process's
    /// own end.
    pub fn exit_at(&self, now: Instant) -> Option<Exit> {
        if self.killed {
            return Some(Exit {
                code: SIGKILL_EXIT_CODE,
                message: String::new(),
            });
        }
        self.workload.exit_at(now)
    }
}
