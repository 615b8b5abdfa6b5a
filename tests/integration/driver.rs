//! A test driver that stands in for the parts of a cluster the local control
//! plane lacks, with the simulated node of `vramfit-agent` (its Node
//! registration, its GpuNode writer and its kubelet's pod statuses): it
//! creates Node and GpuNode objects for simulated GPU nodes, fills GpuNode
//! status as the node agent would, and moves pods through Running /
//! Succeeded / Failed as a kubelet would, step by step as a test says. It also
//! runs the real `vramfit controller` binary, scoped to the test's namespace
//! and nodes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vramfit::api::{
    AbsorbedOom, GpuNode, GpuNodeStatus, GpuProcess, ObservedShape, OomReport, Phase,
    ReportedProgress, TrainingJob,
};
use vramfit_agent::daemon::api::GpuNodeWriter;
use vramfit_agent::sim::cluster::{NodeResources, register_node};
use vramfit_agent::sim::kubelet::{exit_status, patch_pod_status, running_status};
use vramfit_agent::sim::simulated_device;

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
    /// Kubeconfig of the control plane, as the controller gets it.
    kubeconfig: PathBuf,
}

impl TestCluster {
    /// Creates the namespace `t-<name>`; nodes get the label `vramfit.dev/pool=<name>`.
    pub async fn new(name: &str) -> Self {
        Self::on(name, controlplane::kubeconfig()).await
    }

    /// [`TestCluster::new`] on the control plane of `kubeconfig` (a test's
    /// private one).
    pub async fn on(name: &str, kubeconfig: &Path) -> Self {
        let client = controlplane::client_of(kubeconfig).await;
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
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// Adds a simulated GPU node named `<pool>-<suffix>` with GPUs of
    /// (model, bytes), as a Node (with allocatable CPU and memory) and a
    /// GpuNode whose status the "agent" fills with a fresh heartbeat.
    pub async fn add_gpu_node(&self, suffix: &str, gpus: &[(&str, u64)]) -> String {
        let name = self.node_name(suffix);
        register_node(
            &self.client,
            &name,
            &self.labels(),
            &NodeResources::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("registering node {name}: {e}"));
        let devices = gpus
            .iter()
            .enumerate()
            .map(|(index, (model, bytes))| simulated_device(&name, index as u32, model, *bytes))
            .collect();
        let status = GpuNodeStatus {
            gpus: devices,
            gpu_count: gpus.len() as u32,
            model: Some(gpus[0].0.to_string()),
            ..GpuNodeStatus::default()
        };
        self.agent_report(&name, status).await;
        name
    }

    /// The name of the test's node `suffix`.
    pub fn node_name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.pool)
    }

    /// The labels of the test's nodes (the controller's node selector).
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("vramfit.dev/pool".to_string(), self.pool.clone())])
    }

    /// Writes the GpuNode status as the node agent does, with a fresh heartbeat.
    /// A process of `pod` in this cluster's namespace, as the agent reports it.
    fn pod_process(&self, pid: u32, pod: &str, used: u64, peak: u64) -> GpuProcess {
        GpuProcess {
            pid,
            used_bytes: used,
            peak_bytes: peak,
            pod_namespace: Some(self.namespace.clone()),
            pod_name: Some(pod.to_string()),
            training_job: None,
            pod_uid: None,
            container: None,
            allocator: None,
            shape: None,
        }
    }

    pub async fn agent_report(&self, node: &str, mut status: GpuNodeStatus) {
        status.heartbeat = Some(Timestamp::now().to_string());
        GpuNodeWriter::new(self.client.clone(), node, self.labels())
            .write(&status)
            .await
            .expect("GpuNode status write");
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

    /// Waits until the job is gone.
    pub async fn wait_job_gone(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self
            .jobs()
            .get_opt(name)
            .await
            .expect("get TrainingJob")
            .is_some()
        {
            assert!(Instant::now() < deadline, "{name} is still there");
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
        patch_pod_status(&self.pods(), pod, running_status(&["train".into()]))
            .await
            .unwrap_or_else(|e| panic!("pod {pod} status: {e}"));
    }

    /// Waits until the pod's deletion is asked for, then removes it as the
    /// kubelet does once its containers have stopped (a delete with no grace
    /// period).
    pub async fn kubelet_removes_deleted(&self, pod: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let current = self.pods().get_opt(pod).await.expect("get pod");
            match current {
                None => return,
                Some(p) if p.metadata.deletion_timestamp.is_some() => break,
                Some(_) => {
                    assert!(Instant::now() < deadline, "pod {pod} was not deleted");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        match self
            .pods()
            .delete(pod, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("remove pod {pod}: {e}"),
        }
    }

    /// Ends a pod with `exit_code` and a termination message, as the kubelet would.
    pub async fn kubelet_exit(&self, pod: &str, exit_code: i32, message: &str) {
        patch_pod_status(
            &self.pods(),
            pod,
            exit_status(&["train".into()], exit_code, message),
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
        let mut status = current.status.expect("GpuNode status");
        status.gpus[gpu].processes = vec![self.pod_process(4242, pod, used, peak)];
        status.gpus[gpu].used_bytes = used;
        self.agent_report(node, status).await;
    }

    /// Reports that the node agent stopped `pod` for exceeding its budget.
    pub async fn agent_reports_oom(&self, node: &str, pod: &str, used: u64, budget: u64) {
        let gpu_nodes: Api<GpuNode> = Api::all(self.client.clone());
        let current = gpu_nodes.get_status(node).await.expect("GpuNode");
        let mut status = current.status.expect("GpuNode status");
        status.oom_reports.push(OomReport {
            pod_namespace: self.namespace.clone(),
            pod_name: pod.to_string(),
            used_bytes: used,
            budget_bytes: budget,
            time: Timestamp::now().to_string(),
            pod_uid: None,
            reason: None,
        });
        self.agent_report(node, status).await;
    }

    /// Reports a process of `pod` that runs at `micro` x `accum` after the OOMs
    /// it absorbed itself (`(from_micro, to_micro, from_accum, to_accum)`), as
    /// the node agent copies the helper's shape file.
    pub async fn agent_reports_shape(
        &self,
        node: &str,
        gpu: usize,
        pod: &str,
        (micro, accum): (u32, u32),
        absorbed: &[(u32, u32, u32, u32)],
    ) {
        let gpu_nodes: Api<GpuNode> = Api::all(self.client.clone());
        let current = gpu_nodes.get_status(node).await.expect("GpuNode");
        let mut status = current.status.expect("GpuNode status");
        let absorbed_ooms = absorbed
            .iter()
            .enumerate()
            .map(
                |(i, &(from_micro, to_micro, from_accum, to_accum))| AbsorbedOom {
                    from_micro,
                    to_micro,
                    from_accum,
                    to_accum,
                    time: format!("2026-01-01T00:00:0{i}Z"),
                },
            )
            .collect();
        status.gpus[gpu].processes = vec![GpuProcess {
            shape: Some(ObservedShape {
                micro_batch: micro,
                grad_accum: accum,
                absorbed_ooms,
                progress: None,
            }),
            ..self.pod_process(4243, pod, GIB, GIB)
        }];
        self.agent_report(node, status).await;
    }

    /// Reports a process of `pod` at `micro` x `accum` whose helper reports
    /// `progress`, as the node agent copies the helper's shape file.
    pub async fn agent_reports_progress(
        &self,
        node: &str,
        gpu: usize,
        pod: &str,
        (micro, accum): (u32, u32),
        progress: ReportedProgress,
    ) {
        let gpu_nodes: Api<GpuNode> = Api::all(self.client.clone());
        let current = gpu_nodes.get_status(node).await.expect("GpuNode");
        let mut status = current.status.expect("GpuNode status");
        status.gpus[gpu].processes = vec![GpuProcess {
            shape: Some(ObservedShape {
                micro_batch: micro,
                grad_accum: accum,
                absorbed_ooms: Vec::new(),
                progress: Some(progress),
            }),
            ..self.pod_process(4244, pod, GIB, GIB)
        }];
        self.agent_report(node, status).await;
    }

    /// The notes of the events about `job` with `reason`, oldest first.
    pub async fn event_notes(&self, job: &str, reason: &str) -> Vec<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let mut notes: Vec<(String, String)> = events
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(job))
            .map(|e| {
                (
                    e.metadata
                        .creation_timestamp
                        .map(|t| t.0.to_string())
                        .unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect();
        notes.sort();
        notes.into_iter().map(|(_, n)| n).collect()
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

    /// Starts `vramfit controller` with `extra` arguments and its output
    /// (log lines and the final error) in a file, for tests that read what it says.
    pub fn start_logged_controller(&self, extra: &[&str], metrics_addr: &str) -> ControllerProcess {
        self.start_logged_controller_via(&self.kubeconfig, extra, metrics_addr)
    }

    /// [`TestCluster::start_logged_controller`] reaching the API server
    /// through `kubeconfig` (a proxy's, say).
    pub fn start_logged_controller_via(
        &self,
        kubeconfig: &Path,
        extra: &[&str],
        metrics_addr: &str,
    ) -> ControllerProcess {
        // Several controllers of one test (replicas, restarts) each get their own.
        static LOGS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let log = std::env::temp_dir().join(format!(
            "vramfit-{}-{}-{}.log",
            self.namespace,
            std::process::id(),
            LOGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let file = std::fs::File::create(&log).expect("controller log file");
        let stdout = file.try_clone().expect("controller log file");
        let mut process =
            self.spawn_with_output(kubeconfig, extra, metrics_addr, stdout.into(), file.into());
        process.log = Some(log);
        process
    }

    fn spawn_controller_at(&self, extra: &[&str], metrics_addr: &str) -> ControllerProcess {
        self.spawn_with_output(
            &self.kubeconfig,
            extra,
            metrics_addr,
            Stdio::null(),
            Stdio::inherit(),
        )
    }

    fn spawn_with_output(
        &self,
        kubeconfig: &Path,
        extra: &[&str],
        metrics_addr: &str,
        stdout: Stdio,
        stderr: Stdio,
    ) -> ControllerProcess {
        // A cycle a second unless the test sets its own.
        let cycle: &[&str] = if extra.contains(&"--cycle-seconds") {
            &[]
        } else {
            &["--cycle-seconds", "1"]
        };
        let child = Command::new(vramfit_bin())
            .arg("controller")
            .args(cycle)
            .args(extra)
            .args(["--namespace", &self.namespace])
            .args([
                "--node-selector",
                &format!("vramfit.dev/pool={}", self.pool),
            ])
            .args(["--metrics-addr", metrics_addr])
            .args(["--ui-addr", metrics_addr])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn,vramfit=info")
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("vramfit controller starts");
        ControllerProcess { child, log: None }
    }
}

/// The `vramfit` binary the tests run: `VRAMFIT_TEST_BINARY` when set (a release
/// build, or this tree's own `target/debug/deps/vramfit-<hash>` when several
/// trees share one target folder and overwrite `target/debug/vramfit`), else
/// the one cargo built for this test.
pub fn vramfit_bin() -> std::path::PathBuf {
    std::env::var_os("VRAMFIT_TEST_BINARY")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_vramfit").into())
}

/// The controller process; killed (SIGKILL) when dropped.
pub struct ControllerProcess {
    child: Child,
    log: Option<std::path::PathBuf>,
}

impl ControllerProcess {
    /// The process id (the replica's Lease identity is `vramfit-<pid>`).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the process to exit by itself; its exit code
    /// (`None` when killed by a signal), or a panic when it keeps running.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the controller") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "the controller still runs after {timeout:?}; its log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What the controller logged, for one started with its log in a file.
    pub fn log_text(&self) -> String {
        self.log
            .as_ref()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .unwrap_or_default()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("waiting for the controller")
            .is_none()
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of this child, which has not been reaped.
        let rc = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(rc, 0, "signal {signal} to the controller");
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
        if let Some(log) = &self.log {
            // A failing test keeps the log and shows its end.
            if std::thread::panicking() {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!(
                    "controller log {} (last 40 lines):\n{}",
                    log.display(),
                    lines[lines.len().saturating_sub(40)..].join("\n")
                );
            } else {
                let _ = std::fs::remove_file(log);
            }
        }
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
    let job = TrainingJob::test(name)
        .batch(global, micro)
        .min_micro(min_micro)
        .model(json!({"mlp": {"layers": 8, "hidden": 4096}, "precision": "fp32", "optimizer": "adamw"}))
        .max_oom_retries(4)
        .template_spec(trainer_template());
    match request {
        Some(request) => job.request(request),
        None => job,
    }
    .manifest()
}

/// The pod template's spec of the test jobs: one container `train` of
/// image `trainer`, 2 CPUs, 8Gi.
pub fn trainer_template() -> Value {
    json!({"containers": [{"name": "train", "image": "trainer",
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}]})
}

/// A port nothing listens on now (bound and released).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().unwrap().port()
}

/// GET `path` from 127.0.0.1:`port` over plain HTTP/1.0 (the controller's
/// local page server), with `Authorization: Bearer <token>` when given: the
/// status code and body, or what went wrong (nothing listening yet, say).
pub fn http_get(port: u16, path: &str, token: Option<&str>) -> Result<(u16, String), String> {
    use std::io::{Read as _, Write as _};
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{auth}\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .map_err(|e| format!("read: {e}"))?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line: {text}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}
