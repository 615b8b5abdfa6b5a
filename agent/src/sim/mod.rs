//! Simulated mode (`vramfit-agent run --simulate 8xH200`): a node without
//! GPUs or a kubelet. Its GPUs are of a model the predictor knows; the agent
//! plays the kubelet for the pods bound to the node ([`kubelet`]), each pod
//! a simulated process whose memory the simulated GPUs report. Everything
//! after the reading (owners, report, watchdog, writes) is the real agent's.
//!
//! Nothing here is used on a real node; nothing of the real path (NVML,
//! `/proc`) is used here.

pub mod cluster;
pub mod fleet;
pub mod kubelet;
pub mod workload;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vramfit::api::{GpuDevice, GpuHealth, ProbeStatus};
use vramfit::predict::{GPU_PROFILES, GpuProfile, gpu_profile};

use crate::daemon::{NodeBackend, RunOptions, run_loop, watch_node_pods};
use crate::gpu::Backoff;
use crate::gpu::{GpuReading, ProcessSample, Reading};
use crate::node::report::{OwnerLookup, ProcessOwner};
use crate::node::watchdog::{Owner, StopOrder};
use crate::probe::expected_bandwidth_gbps;
use workload::Workload;

/// `<count>x<model>`, as `--simulate` takes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimSpec {
    /// GPUs of the node.
    pub count: u32,
    /// Their model.
    pub profile: &'static GpuProfile,
}

/// Parses `8xH200`, `2xA100-80GB`, `H100-80GB` (one GPU).
pub fn parse_sim_spec(text: &str) -> Result<SimSpec, String> {
    let (count, model) = match text.split_once(['x', 'X']) {
        Some((n, model)) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => (
            n.parse::<u32>().map_err(|e| format!("{text:?}: {e}"))?,
            model,
        ),
        _ => (1, text),
    };
    if count == 0 || count > 64 {
        return Err(format!("--simulate {text:?}: between 1 and 64 GPUs"));
    }
    let profile = gpu_profile(model).ok_or_else(|| {
        let known: Vec<&str> = GPU_PROFILES.iter().map(|p| p.name).collect();
        format!(
            "--simulate {text:?}: unknown GPU model {model:?}; the predictor knows {}",
            known.join(", ")
        )
    })?;
    Ok(SimSpec { count, profile })
}

/// The UUID of simulated GPU `index` of `node`.
pub fn simulated_uuid(node: &str, index: u32) -> String {
    format!("GPU-{node}-{index}")
}

/// An idle simulated GPU of `model` with `total_bytes`, as the agent reports it.
pub fn simulated_device(node: &str, index: u32, model: &str, total_bytes: u64) -> GpuDevice {
    GpuDevice {
        index,
        uuid: simulated_uuid(node, index),
        model: model.into(),
        total_bytes,
        used_bytes: 0,
        context_overhead_bytes: 0,
        processes: Vec::new(),
        health: GpuHealth::Healthy,
        probe: None,
    }
}

/// A simulated GPU.
#[derive(Clone, Debug)]
pub struct SimGpu {
    /// UUID.
    pub uuid: String,
}

/// A pod running on the simulated node.
#[derive(Clone, Debug)]
pub struct SimPod {
    /// The pod.
    pub owner: Owner,
    /// Its TrainingJob.
    pub training_job: Option<String>,
    /// Its containers (the first runs the process).
    pub containers: Vec<String>,
    /// Its budget per GPU.
    pub budget_bytes: Option<u64>,
    /// UUIDs of its GPUs.
    pub gpus: Vec<String>,
    /// The simulated PID of its process.
    pub pid: u32,
    /// Its process.
    pub workload: Workload,
    /// The watchdog stopped it.
    pub killed: bool,
    /// Its end was written to the pod's status.
    pub reported_end: bool,
}

/// The simulated node, shared by the agent's loop and the kubelet task.
#[derive(Debug)]
pub struct SimState {
    /// GPU model.
    pub profile: &'static GpuProfile,
    /// GPUs.
    pub gpus: Vec<SimGpu>,
    /// Pods by UID.
    pub pods: BTreeMap<String, SimPod>,
    /// Last PID handed out.
    pub next_pid: u32,
    /// Run time of a pod without the run annotation.
    pub run_for: Duration,
}

impl SimState {
    /// A node `node` of `spec`, pods running `run_for` by default.
    pub fn new(node: &str, spec: SimSpec, run_for: Duration) -> Self {
        Self {
            profile: spec.profile,
            gpus: (0..spec.count)
                .map(|i| SimGpu {
                    uuid: simulated_uuid(node, i),
                })
                .collect(),
            pods: BTreeMap::new(),
            next_pid: 100_000,
            run_for,
        }
    }
}

/// The simulated node as the agent's loop sees it.
pub struct SimNode {
    state: Arc<Mutex<SimState>>,
    probe_bytes: u64,
}

impl SimNode {
    /// A backend over `state`.
    pub fn new(state: Arc<Mutex<SimState>>, probe_bytes: u64) -> Self {
        Self { state, probe_bytes }
    }
}

struct SimOwners(HashMap<u32, ProcessOwner>);

impl OwnerLookup for SimOwners {
    fn owner_of(&self, pid: u32) -> Option<ProcessOwner> {
        self.0.get(&pid).cloned()
    }
    fn is_running(&self, _: u32) -> bool {
        true
    }
}

impl NodeBackend for SimNode {
    fn mode(&self) -> &'static str {
        "simulated"
    }

    fn read(&mut self, now: Instant) -> Reading {
        let state = self.state.lock().expect("simulated node state");
        let gpus = state
            .gpus
            .iter()
            .enumerate()
            .map(|(index, gpu)| {
                let processes: Vec<ProcessSample> = state
                    .pods
                    .values()
                    .filter(|p| p.exit_at(now).is_none() && p.gpus.contains(&gpu.uuid))
                    .map(|p| ProcessSample {
                        pid: p.pid,
                        used_bytes: p.workload.used_at(now),
                    })
                    .collect();
                GpuReading {
                    index: index as u32,
                    uuid: gpu.uuid.clone(),
                    model: state.profile.name.into(),
                    total_bytes: state.profile.capacity_bytes,
                    used_bytes: processes.iter().map(|p| p.used_bytes).sum(),
                    processes,
                    health: GpuHealth::Healthy,
                    problem: None,
                }
            })
            .collect();
        Reading {
            gpus,
            health: GpuHealth::Healthy,
            message: None,
        }
    }

    fn owners(&self) -> Box<dyn OwnerLookup + '_> {
        let state = self.state.lock().expect("simulated node state");
        Box::new(SimOwners(
            state
                .pods
                .values()
                .map(|p| {
                    (
                        p.pid,
                        ProcessOwner {
                            owner: p.owner.clone(),
                            training_job: p.training_job.clone(),
                            container: p.containers.first().cloned(),
                            budget_bytes: p.budget_bytes,
                            gpus: None,
                            stats_dir: None,
                            namespace_pid: None,
                        },
                    )
                })
                .collect(),
        ))
    }

    fn stop(&mut self, order: &StopOrder) {
        let mut state = self.state.lock().expect("simulated node state");
        if let Some(pod) = state.pods.get_mut(&order.owner.uid) {
            tracing::warn!(pod = %order.owner.name, "simulated SIGKILL: {}", order.reason);
            pod.killed = true;
        }
    }

    fn context_overhead(&mut self, reading: &Reading) -> HashMap<String, u64> {
        // The predictor's figure for the model: there is no context to measure.
        let bytes = self.state.lock().expect("state").profile.context_bytes;
        reading
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), bytes))
            .collect()
    }

    fn probe(&mut self, reading: &Reading) -> HashMap<String, ProbeStatus> {
        let time = k8s_openapi::jiff::Timestamp::now().to_string();
        reading
            .gpus
            .iter()
            .map(|g| {
                (
                    g.uuid.clone(),
                    ProbeStatus {
                        ok: true,
                        bandwidth_gbps: expected_bandwidth_gbps(&g.model).unwrap_or(0.0),
                        tested_bytes: self.probe_bytes,
                        errors: 0,
                        time: Some(time.clone()),
                        message: Some("simulated GPU: no probe kernels ran".into()),
                    },
                )
            })
            .collect()
    }
}

/// Runs the agent on a simulated node until `shutdown`: with a client it
/// registers the `Node` and plays the kubelet for the pods bound to it.
pub async fn run_simulated(
    options: RunOptions,
    spec: SimSpec,
    run_for: Duration,
    resources: cluster::NodeResources,
    client: Option<kube::Client>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let state = Arc::new(Mutex::new(SimState::new(&options.node, spec, run_for)));
    let mut tasks = Vec::new();
    if let Some(client) = &client {
        let (pods, watch) = watch_node_pods(client.clone(), &options.node);
        tasks.push(watch);
        let (client, node, labels) = (client.clone(), options.node.clone(), options.labels.clone());
        let (state, interval) = (state.clone(), options.interval);
        tasks.push(tokio::spawn(async move {
            // The Node comes first; an API server that is away is waited for.
            let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
            while let Err(e) = cluster::register_node(&client, &node, &labels, &resources).await {
                let delay = backoff.next_delay();
                tracing::warn!(
                    retry_in_s = delay.as_secs_f64(),
                    "cannot register the simulated Node: {e}"
                );
                tokio::time::sleep(delay).await;
            }
            kubelet::run_kubelet(client, pods, state, interval).await;
        }));
    }
    let backend = Box::new(SimNode::new(state, options.probe_bytes));
    let result = run_loop(options, backend, client, shutdown).await;
    for task in tasks {
        task.abort();
    }
    result
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
