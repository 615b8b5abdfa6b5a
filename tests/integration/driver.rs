//! A test driver that stands in for the parts of a cluster the local control
//! plane lacks: it creates Node and GpuNode objects for simulated GPU nodes,
//! fills GpuNode status as the node agent would, and moves pods through
//! Running / Succeeded / Failed as a kubelet would. It also runs the real
//! `vramfit controller` binary, scoped to the test's namespace and nodes.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vramfit::api::{GpuNode, Phase, TrainingJob};

use crate::controlplane;

/// GiB in bytes.
pub const GIB: u64 = 1 << 30;

/// One test's slice of the cluster: a namespace and a pool of nodes.
pub struct TestCluster {
    /// API client.
    pub client: Client,
    /// Namespace of the test's jobs.
    pub namespace: String,
    pool: String,
}

impl TestCluster {
    /// Creates the namespace `t-<name>`; nodes get the label `vramfit.dev/pool=<name>`.
    pub async fn new(name: &str) -> Self {
        let client = controlplane::client().await;
        let namespace = format!("t-{name}");
        let api: Api<Namespace> = Api::all(client.clone());
        let ns = serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating namespace {namespace}: {e}"),
        }
        Self {
            client,
            namespace,
            pool: name.to_string(),
        }
    }

    /// Adds a simulated GPU node named `<pool>-<suffix>` with GPUs of
    /// (model, bytes), as a Node (with allocatable CPU and memory) and a
    /// GpuNode whose status the "agent" fills with a fresh heartbeat.
    pub async fn add_gpu_node(&self, suffix: &str, gpus: &[(&str, u64)]) -> String {
        let name = format!("{}-{suffix}", self.pool);
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"vramfit.dev/pool": self.pool}},
        }))
        .unwrap();
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating node {name}: {e}"),
        }
        // The API server taints new nodes not-ready; the node lifecycle
        // controller lifts the taint once the kubelet reports Ready.
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"taints": null}})),
            )
            .await
            .expect("node taint removal");
        let status = json!({"status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        }});
        nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("node status patch");
        let gpu_nodes: Api<GpuNode> = Api::all(self.client.clone());
        let gpu_node: GpuNode = serde_json::from_value(json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": name, "labels": {"vramfit.dev/pool": self.pool}},
            "spec": {},
        }))
        .unwrap();
        match gpu_nodes.create(&PostParams::default(), &gpu_node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating GpuNode {name}: {e}"),
        }
        let devices: Vec<Value> = gpus
            .iter()
            .enumerate()
            .map(|(index, (model, bytes))| {
                json!({"index": index, "uuid": format!("GPU-{name}-{index}"), "model": model,
                       "totalBytes": bytes, "usedBytes": 0, "health": "Healthy"})
            })
            .collect();
        self.agent_report(
            &name,
            json!({"gpus": devices, "gpuCount": gpus.len(), "model": gpus[0].0}),
        )
        .await;
        name
    }

    /// Writes GpuNode status fields as the node agent would, with a fresh heartbeat.
    pub async fn agent_report(&self, node: &str, mut status: Value) {
        status["heartbeat"] = json!(Timestamp::now().to_string());
        let gpu_nodes: Api<GpuNode> = Api::all(self.client.clone());
        gpu_nodes
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
            .expect("GpuNode status patch");
    }

    /// Applies a TrainingJob given as JSON (server-side apply, strict).
    pub async fn apply_job(&self, job: Value) -> TrainingJob {
        let api = self.jobs();
        let name = job["metadata"]["name"]
            .as_str()
            .expect("job name")
            .to_string();
        let params = PatchParams::apply("vramfit-tests");
        api.patch(&name, &params, &Patch::Apply(&job))
            .await
            .expect("apply TrainingJob")
    }

    /// The TrainingJob API of the test's namespace.
    pub fn jobs(&self) -> Api<TrainingJob> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The Pod API of the test's namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Deletes a TrainingJob.
    pub async fn delete_job(&self, name: &str) {
        self.jobs()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete TrainingJob");
    }

    /// Waits until `check` holds for the job, or panics with the last status.
    pub async fn wait_job(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&TrainingJob) -> bool,
    ) -> TrainingJob {
        let deadline = Instant::now() + Duration::from_secs(60);
        let api = self.jobs();
        loop {
            let job = api.get_opt(name).await.expect("get TrainingJob");
            if let Some(job) = &job
                && check(job)
            {
                return job.clone();
            }
            if Instant::now() > deadline {
                panic!(
                    "{name}: timed out waiting for {what}; status: {:#?}",
                    job.and_then(|j| j.status)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the job reaches `phase`.
    pub async fn wait_phase(&self, name: &str, phase: Phase) -> TrainingJob {
        self.wait_job(name, &format!("phase {phase:?}"), |j| {
            j.status.as_ref().is_some_and(|s| s.phase == phase)
        })
        .await
    }

    /// Waits until the job's status message contains `text`.
    pub async fn wait_message(&self, name: &str, text: &str) -> TrainingJob {
        self.wait_job(name, &format!("a message with {text:?}"), |j| {
            j.status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.contains(text))
        })
        .await
    }

    /// Waits until the job is gone (its finalizer ran).
    pub async fn wait_job_gone(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self
            .jobs()
            .get_opt(name)
            .await
            .expect("get TrainingJob")
            .is_some()
        {
            assert!(Instant::now() < deadline, "{name} was not finalized");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for a pod to exist and returns it.
    pub async fn wait_pod(&self, name: &str) -> Pod {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(pod) = self.pods().get_opt(name).await.expect("get pod") {
                return pod;
            }
            assert!(Instant::now() < deadline, "pod {name} never appeared");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Pods of the namespace.
    pub async fn pod_names(&self) -> Vec<String> {
        let pods = self
            .pods()
            .list(&ListParams::default())
            .await
            .expect("list pods");
        pods.items.iter().map(|p| p.name_any()).collect()
    }

    /// Moves a pod to Running, as the kubelet would.
    pub async fn kubelet_running(&self, pod: &str) {
        self.pod_status(pod, json!({"phase": "Running", "containerStatuses": [container("train", json!({"running": {"startedAt": Timestamp::now().to_string()}}))]})).await;
    }

    /// Ends a pod with `exit_code` and a termination message, as the kubelet would.
    pub async fn kubelet_exit(&self, pod: &str, exit_code: i32, message: &str) {
        let phase = if exit_code == 0 {
            "Succeeded"
        } else {
            "Failed"
        };
        let reason = if exit_code == 0 { "Completed" } else { "Error" };
        let state =
            json!({"terminated": {"exitCode": exit_code, "reason": reason, "message": message}});
        self.pod_status(
            pod,
            json!({"phase": phase, "containerStatuses": [container("train", state)]}),
        )
        .await;
    }

    async fn pod_status(&self, pod: &str, status: Value) {
        self.pods()
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
            .unwrap_or_else(|e| panic!("pod {pod} status: {e}"));
    }

    /// Reports a process of `pod` on GPU `gpu` of `node`, as the node agent would.
    pub async fn agent_reports_process(
        &self,
        node: &str,
        gpu: usize,
        pod: &str,
        used: u64,
        peak: u64,
    ) {
        let gpu_nodes: Api<GpuNode> = Api::all(self.client.clone());
        let current = gpu_nodes.get_status(node).await.expect("GpuNode");
        let mut status = serde_json::to_value(current.status.expect("GpuNode status")).unwrap();
        status["gpus"][gpu]["processes"] = json!([{
            "pid": 4242, "usedBytes": used, "peakBytes": peak,
            "podNamespace": self.namespace, "podName": pod,
        }]);
        status["gpus"][gpu]["usedBytes"] = json!(used);
        self.agent_report(node, status).await;
    }

    /// Starts `vramfit controller` for this test's namespace and nodes.
    pub fn start_controller(&self) -> ControllerProcess {
        self.spawn_controller(&["--no-leader-election"])
    }

    /// Starts a replica that competes for the Lease `lease` in the test's namespace.
    pub fn start_replica(&self, lease: &str) -> ControllerProcess {
        self.spawn_controller(&["--lease-namespace", &self.namespace, "--lease-name", lease])
    }

    /// Starts `vramfit controller` with its metrics (and `/ui`) on `metrics_addr`.
    pub fn start_controller_at(&self, metrics_addr: &str) -> ControllerProcess {
        self.spawn_controller_at(&["--no-leader-election"], metrics_addr)
    }

    fn spawn_controller(&self, extra: &[&str]) -> ControllerProcess {
        self.spawn_controller_at(extra, "127.0.0.1:0")
    }

    fn spawn_controller_at(&self, extra: &[&str], metrics_addr: &str) -> ControllerProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_vramfit"))
            .args(["controller", "--cycle-seconds", "1"])
            .args(extra)
            .args(["--namespace", &self.namespace])
            .args([
                "--node-selector",
                &format!("vramfit.dev/pool={}", self.pool),
            ])
            .args(["--metrics-addr", metrics_addr])
            .env("KUBECONFIG", controlplane::kubeconfig())
            .env("RUST_LOG", "warn,vramfit=info")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("vramfit controller starts");
        ControllerProcess { child }
    }
}

fn container(name: &str, state: Value) -> Value {
    json!({"name": name, "image": "trainer", "imageID": "", "ready": false, "restartCount": 0, "state": state})
}

/// The controller process; killed (SIGKILL) when dropped.
pub struct ControllerProcess {
    child: Child,
}

impl ControllerProcess {
    /// The process id (the replica's Lease identity is `vramfit-<pid>`).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills the controller at once, as a node failure would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TrainingJob for an MLP with the given batch and an optional explicit budget.
pub fn mlp_job(
    name: &str,
    global: u32,
    micro: u32,
    min_micro: u32,
    request: Option<&str>,
) -> Value {
    let mut job = json!({
        "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "batch": {"global": global, "micro": micro, "minMicro": min_micro},
            "model": {"mlp": {"layers": 8, "hidden": 4096}, "precision": "fp32", "optimizer": "adamw"},
            "maxOOMRetries": 4,
            "template": {"spec": {"containers": [{"name": "train", "image": "trainer",
                "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}]}}
        }
    });
    if let Some(request) = request {
        job["spec"]["memory"] = json!({"request": request});
    }
    job
}
