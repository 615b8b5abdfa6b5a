//! The node agent in simulated mode (`vramfit_agent::sim`) against the real
//! control plane, with the real controller: it registers its Node, writes its
//! GpuNode, plays the kubelet and runs the watchdog. Also the bad conditions
//! that involve the API server: unreachable and back, a GpuNode deleted under
//! the agent, a pod deleted while measured.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use vramfit::api::{GpuNode, GpuNodeStatus, Phase};
use vramfit_agent::daemon::RunOptions;
use vramfit_agent::node::publish::PublishPolicy;
use vramfit_agent::node::watchdog::WatchdogConfig;
use vramfit_agent::sim::cluster::NodeResources;
use vramfit_agent::sim::{parse_sim_spec, run_simulated};

use crate::controlplane;
use crate::driver::{GIB, TestCluster, mlp_job};

/// A simulated agent running in this process; stopped when dropped.
pub struct SimAgent {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl SimAgent {
    fn start(cluster: &TestCluster, node: &str, spec: &str, client: Client) -> Self {
        let publish = PublishPolicy {
            threshold_bytes: 64 << 20,
            min_gap: Duration::from_secs(1),
            heartbeat: Duration::from_secs(1),
        };
        Self::start_with(
            cluster,
            node,
            spec,
            client,
            Duration::from_secs(2),
            (Duration::from_millis(200), publish),
            "warn,vramfit_agent=info",
        )
    }

    /// An agent whose pods run `run_for` by default, reading every
    /// `interval` and writing its status by `publish`, logging at `log`.
    pub fn start_with(
        cluster: &TestCluster,
        node: &str,
        spec: &str,
        client: Client,
        run_for: Duration,
        (interval, publish): (Duration, PublishPolicy),
        log: &str,
    ) -> Self {
        // The agent's log on the test's output (shown for failing tests).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(log)
            .with_test_writer()
            .try_init();
        let mut options = RunOptions::new(node);
        options.interval = interval;
        options.publish = publish;
        options.watchdog = WatchdogConfig {
            tolerance: 0.05,
            grace: Duration::from_secs(1),
        };
        options.labels = cluster.labels();
        let spec = parse_sim_spec(spec).expect("simulate spec");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run_simulated(
            options,
            spec,
            run_for,
            NodeResources::default(),
            Some(client),
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            stop: Some(stop),
            task,
        }
    }

    /// Starts the agent on the cluster's own client and waits for its first
    /// status, with the GPU count of `spec` (`COUNTxMODEL`).
    async fn started(cluster: &TestCluster, node: &str, spec: &str) -> Self {
        let agent = Self::start(cluster, node, spec, cluster.client.clone());
        let gpus: u32 = spec
            .split('x')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("COUNTxMODEL");
        wait_status(
            &cluster.client,
            node,
            "the agent's first status",
            Duration::from_secs(30),
            |s| s.gpu_count == gpus,
        )
        .await;
        agent
    }

    fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

async fn gpu_node_status(client: &Client, node: &str) -> Option<GpuNodeStatus> {
    Api::<GpuNode>::all(client.clone())
        .get_opt(node)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.status)
}

async fn wait_status(
    client: &Client,
    node: &str,
    what: &str,
    within: Duration,
    check: impl Fn(&GpuNodeStatus) -> bool,
) -> GpuNodeStatus {
    let deadline = Instant::now() + within;
    loop {
        let status = gpu_node_status(client, node).await;
        if let Some(status) = &status
            && check(status)
        {
            return status.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{node}: timed out waiting for {what}; status: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn heartbeat(status: &GpuNodeStatus) -> Timestamp {
    status
        .heartbeat
        .as_deref()
        .and_then(|h| h.parse().ok())
        .expect("a heartbeat")
}

fn job_with(
    name: &str,
    micro: u32,
    request: &str,
    annotations: serde_json::Value,
) -> serde_json::Value {
    let mut job = mlp_job(name, 64, micro, 1, Some(request));
    job["spec"]["template"]["metadata"] = json!({"annotations": annotations});
    job
}

#[tokio::test(flavor = "multi_thread")]
async fn simulated_agent_runs_a_job_through_an_oom_and_back_off_to_success() {
    let cluster = TestCluster::new("agent-oom").await;
    let node = cluster.node_name("n1");
    let _agent = SimAgent::started(&cluster, &node, "1xH100-80GB").await;
    let _controller = cluster.start_controller();
    // Fixed budget 30 GiB; the true peak is 10 GiB + 2 GiB per sample: 42 GiB
    // at micro 16 (over: the allocator refuses, exit 42), 26 GiB at micro 8.
    cluster
        .apply_job(job_with(
            "big",
            16,
            "30Gi",
            json!({"vramfit.dev/simulated-peak": "10Gi+2Gi", "vramfit.dev/simulated-run": "3s"}),
        ))
        .await;
    let job = cluster.wait_phase("big", Phase::Succeeded).await;
    let status = job.status.unwrap();
    let outcomes: Vec<(u32, &str)> = status
        .history
        .iter()
        .map(|h| (h.micro_batch, h.outcome.as_str()))
        .collect();
    assert_eq!(outcomes, vec![(16, "OutOfMemory"), (8, "Succeeded")]);
    assert!(
        status.history[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("CUDA out of memory")),
        "{:?}",
        status.history[0]
    );
    // The peak the agent measured for the second attempt reached the job.
    let measured = status.measured_peak_bytes.expect("a measured peak") as f64;
    let want = (26 * GIB) as f64;
    assert!(
        (measured - want).abs() / want < 0.01,
        "measured {measured}, simulated true peak {want}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn watchdog_stops_an_unbounded_pod_over_budget_and_the_controller_backs_off() {
    let cluster = TestCluster::new("agent-dog").await;
    let node = cluster.node_name("n1");
    let _agent = SimAgent::started(&cluster, &node, "1xH100-80GB").await;
    let _controller = cluster.start_controller();
    // No allocator holds the process to its 20 GiB budget: at micro 8 it
    // grows to 26 GiB, past 21 GiB (5 % tolerance), and the watchdog stops
    // it; at micro 4 it needs 18 GiB.
    cluster
        .apply_job(job_with(
            "wild",
            8,
            "20Gi",
            json!({"vramfit.dev/simulated-peak": "10Gi+2Gi", "vramfit.dev/simulated-run": "4s",
                   "vramfit.dev/simulated-unbounded": "true"}),
        ))
        .await;
    let status = wait_status(
        &cluster.client,
        &node,
        "an OOM report for wild-a1",
        Duration::from_secs(60),
        |s| s.oom_reports.iter().any(|r| r.pod_name == "wild-a1"),
    )
    .await;
    let report = status
        .oom_reports
        .iter()
        .find(|r| r.pod_name == "wild-a1")
        .unwrap();
    assert_eq!(report.pod_namespace, cluster.namespace);
    assert_eq!(report.budget_bytes, 20 * GIB);
    assert!(report.used_bytes > 21 * GIB, "{report:?}");
    assert!(report.pod_uid.is_some());
    assert!(
        report
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("over its budget")),
        "{report:?}"
    );
    let job = cluster.wait_phase("wild", Phase::Succeeded).await;
    let history = job.status.unwrap().history;
    assert_eq!(history[0].outcome, "OutOfMemory");
    assert_eq!(history[0].micro_batch, 8);
    assert_eq!(history.last().unwrap().micro_batch, 4);
}

/// A TCP proxy in front of the API server that a test can take down and
/// bring back on the same port: the agent sees the API server go away and
/// come back while the other tests keep using it. While down it keeps its
/// port (another socket could take it otherwise) and drops every connection
/// it accepts.
pub struct Proxy {
    /// The port it listens on.
    pub port: u16,
    up: Arc<std::sync::atomic::AtomicBool>,
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// Listens on a free port and forwards to `target`.
    pub async fn start(target: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = {
            let (up, connections) = (up.clone(), connections.clone());
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !up.load(std::sync::atomic::Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let connection = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(target).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    connections.lock().unwrap().push(connection);
                }
            })
        };
        Self {
            port,
            up,
            accept,
            connections,
        }
    }

    /// Closes every open connection and drops the new ones.
    pub fn down(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// Forwards again.
    pub fn up(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.down();
    }
}

/// A client of the control plane that goes through `proxy`.
async fn client_through(proxy: &Proxy) -> Client {
    let kubeconfig = Kubeconfig::read_from(controlplane::kubeconfig()).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.cluster_url = format!("https://127.0.0.1:{}", proxy.port).parse().unwrap();
    Client::try_from(config).unwrap()
}

/// The address of the shared control plane's API server.
pub async fn api_server_addr() -> std::net::SocketAddr {
    let kubeconfig = Kubeconfig::read_from(controlplane::kubeconfig()).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let port = config.cluster_url.port_u16().expect("a port");
    format!("127.0.0.1:{port}").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_keeps_running_through_an_api_server_outage_and_its_heartbeat_resumes() {
    let cluster = TestCluster::new("agent-outage").await;
    let node = cluster.node_name("n1");
    let proxy = Proxy::start(api_server_addr().await).await;
    let agent = SimAgent::start(&cluster, &node, "2xH200", client_through(&proxy).await);
    wait_status(
        &cluster.client,
        &node,
        "a first heartbeat",
        Duration::from_secs(30),
        |s| s.gpu_count == 2,
    )
    .await;

    proxy.down();
    let down_at = Timestamp::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = gpu_node_status(&cluster.client, &node).await.unwrap();
    assert!(
        heartbeat(&during) < down_at,
        "no write can pass while the API server is away"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        agent.is_running(),
        "the agent does not exit while the API server is away"
    );

    proxy.up();
    let up_at = Timestamp::now();
    // Write retries back off to at most 4 s after a 6 s outage.
    let after = wait_status(
        &cluster.client,
        &node,
        "a heartbeat after the outage",
        Duration::from_secs(15),
        |s| heartbeat(s) > up_at,
    )
    .await;
    assert_eq!(after.agent.as_ref().unwrap().mode, "simulated");

    // The GpuNode deleted under the agent comes back with the next write.
    Api::<GpuNode>::all(cluster.client.clone())
        .delete(&node, &DeleteParams::default())
        .await
        .unwrap();
    let deleted_at = Timestamp::now();
    wait_status(
        &cluster.client,
        &node,
        "the GpuNode written again",
        Duration::from_secs(15),
        |s| s.gpu_count == 2 && heartbeat(s) > deleted_at,
    )
    .await;
    assert!(agent.is_running());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_deleted_while_measured_leaves_the_gpu_node_and_is_never_reported() {
    let cluster = TestCluster::new("agent-delete").await;
    let node = cluster.node_name("n1");
    let _agent = SimAgent::started(&cluster, &node, "1xH200").await;
    // A pod bound to the node directly, as the controller binds its pods.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "measured", "annotations": {
            "vramfit.dev/budget-bytes": (20 * GIB).to_string(),
            "vramfit.dev/simulated-peak": "8Gi", "vramfit.dev/simulated-run": "10m"}},
        "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
            "name": "train", "image": "trainer",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": format!("GPU-{node}-0")}]}]}
    }))
    .unwrap();
    cluster
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    wait_status(
        &cluster.client,
        &node,
        "the pod's process",
        Duration::from_secs(30),
        |s| {
            s.gpus[0]
                .processes
                .iter()
                .any(|p| p.pod_name.as_deref() == Some("measured") && p.used_bytes > 0)
        },
    )
    .await;
    cluster
        .pods()
        .delete("measured", &DeleteParams::default())
        .await
        .unwrap();
    let status = wait_status(
        &cluster.client,
        &node,
        "the process gone",
        Duration::from_secs(30),
        |s| s.gpus[0].processes.is_empty(),
    )
    .await;
    assert!(status.oom_reports.is_empty(), "{:?}", status.oom_reports);
    // The agent, as the kubelet, confirmed the deletion: the pod is gone.
    let deadline = Instant::now() + Duration::from_secs(15);
    while cluster.pods().get_opt("measured").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the pod was never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_probe_request_is_served_and_cleared_and_oom_reports_survive_a_restart() {
    let cluster = TestCluster::new("agent-probe").await;
    let node = cluster.node_name("n1");
    let agent = SimAgent::start(&cluster, &node, "1xL4", cluster.client.clone());
    let first = wait_status(
        &cluster.client,
        &node,
        "a first probe",
        Duration::from_secs(30),
        |s| s.gpus.first().is_some_and(|g| g.probe.is_some()),
    )
    .await;
    let probed_at = first.gpus[0].probe.as_ref().unwrap().time.clone();
    let gpu_nodes: Api<GpuNode> = Api::all(cluster.client.clone());
    gpu_nodes
        .patch(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"metadata": {"annotations": {
                "vramfit.dev/probe-requested": "now"}}})),
        )
        .await
        .unwrap();
    wait_status(
        &cluster.client,
        &node,
        "a second probe",
        Duration::from_secs(15),
        |s| s.gpus[0].probe.as_ref().unwrap().time != probed_at,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let object = gpu_nodes.get(&node).await.unwrap();
        let annotations = object.metadata.annotations.unwrap_or_default();
        if !annotations.contains_key("vramfit.dev/probe-requested") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the probe request was never cleared"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An OOM report an earlier agent left is kept by the next one.
    drop(agent);
    let mut status = gpu_node_status(&cluster.client, &node).await.unwrap();
    status.oom_reports.push(vramfit::api::OomReport {
        pod_namespace: cluster.namespace.clone(),
        pod_name: "earlier-a1".into(),
        used_bytes: 2,
        budget_bytes: 1,
        time: Timestamp::now().to_string(),
        pod_uid: None,
        reason: Some("before the restart".into()),
    });
    cluster.agent_report(&node, status).await;
    let restarted_at = Timestamp::now();
    let _agent = SimAgent::start(&cluster, &node, "1xL4", cluster.client.clone());
    let after = wait_status(
        &cluster.client,
        &node,
        "a heartbeat of the restarted agent",
        Duration::from_secs(30),
        |s| heartbeat(s) > restarted_at && s.agent.is_some(),
    )
    .await;
    assert!(
        after.oom_reports.iter().any(|r| r.pod_name == "earlier-a1"),
        "{:?}",
        after.oom_reports
    );
}
