//! Faults, against the real control plane with the real `vramfit controller`
//! binary: the API server restarted, etcd restarted, the controller's watches
//! cut, the controller killed at random moments during a run, and a paused
//! leader resuming past its Lease. After each, no job is lost, none is placed
//! twice, no GPU holds more budget than its memory. docs/controller.md
//! ("Faults") says what each shows.
//!
//! The restarts need a control plane of their own (restarting the shared one
//! would disturb the other tests); the rest use the shared one.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use vramfit::api::{GpuNode, Phase, PlacementStatus, TrainingJob};
use vramfit::controller::pod_ledger::pod_placement;
use vramfit::job::keys::{ATTEMPT_LABEL, BUDGET_ANNOTATION, JOB_LABEL};
use vramfit_agent::node::publish::PublishPolicy;

use crate::agent::{Proxy, SimAgent, api_server_addr};
use crate::controlplane::{self, PrivateControlPlane};
use crate::driver::{ControllerProcess, GIB, TestCluster, mlp_job};
use crate::follow::follow;

fn phase(job: &TrainingJob) -> Phase {
    job.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn is_terminal_pod(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn visible_devices(pod: &Pod) -> Vec<String> {
    let value = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|v| v.name == "NVIDIA_VISIBLE_DEVICES"))
        .and_then(|v| v.value.clone())
        .unwrap_or_default();
    let mut uuids: Vec<String> = value.split(',').map(|s| s.trim().to_string()).collect();
    uuids.sort();
    uuids
}

/// What the fault tests hold the cluster to. The watches record every
/// version of every job and pod (so a placement changed and changed back
/// between two checks is caught too); [`Audit::check`] lists everything and
/// adds up the budgets per GPU.
#[derive(Default)]
struct Audit {
    /// (job uid, attempt) -> (node, GPU UUIDs) of the first placement seen.
    placements: HashMap<(String, u32), (String, Vec<String>)>,
    /// Pod name -> UIDs of the pods seen with that name (one, or the
    /// attempt ran twice).
    pod_uids: HashMap<String, BTreeSet<String>>,
    /// Job name -> attempts that had a pod.
    pod_attempts: HashMap<String, BTreeSet<u32>>,
    /// What broke, as found.
    violations: Vec<String>,
    checks: usize,
}

impl Audit {
    fn observe_job(&mut self, job: &TrainingJob) {
        let Some(placement) = job.status.as_ref().and_then(|s| s.placement.as_ref()) else {
            return;
        };
        let uid = job.uid().unwrap_or_default();
        self.observe_placement(&job.name_any(), uid, placement);
    }

    /// Records the first placement seen of an attempt, from its job's status
    /// or from its pod (created before the status records it); any other
    /// placement of the same attempt is a violation.
    fn observe_placement(&mut self, job: &str, uid: String, placement: &PlacementStatus) {
        let mut uuids: Vec<String> = placement.gpus.iter().map(|g| g.uuid.clone()).collect();
        uuids.sort();
        let key = (uid, placement.attempt);
        let seen = (placement.node.clone(), uuids);
        match self.placements.get(&key) {
            None => {
                self.placements.insert(key, seen);
            }
            Some(first) if *first != seen => self.violations.push(format!(
                "{job} attempt {} placed twice: {first:?}, then {seen:?}",
                placement.attempt
            )),
            Some(_) => {}
        }
    }

    fn observe_pod(&mut self, pod: &Pod) {
        if let Some(read) = pod_placement(pod) {
            self.observe_placement(&read.job, read.job_uid, &read.placement);
        }
        let uids = self.pod_uids.entry(pod.name_any()).or_default();
        uids.insert(pod.uid().unwrap_or_default());
        if uids.len() > 1 {
            self.violations.push(format!(
                "pod {} was created {} times",
                pod.name_any(),
                uids.len()
            ));
        }
        let labels = pod.labels();
        if let (Some(job), Some(attempt)) = (
            labels.get(JOB_LABEL),
            labels.get(ATTEMPT_LABEL).and_then(|a| a.parse().ok()),
        ) {
            self.pod_attempts
                .entry(job.clone())
                .or_default()
                .insert(attempt);
        }
    }

    /// Checks the listed state: every pod matches its attempt's placement,
    /// one live pod per job, no GPU over its memory by the placements in
    /// status nor by the budgets of the live pods.
    fn audit(
        &mut self,
        jobs: &[TrainingJob],
        pods: &[Pod],
        capacity: &HashMap<String, (String, u64)>,
    ) -> Vec<String> {
        for job in jobs {
            self.observe_job(job);
        }
        for pod in pods {
            self.observe_pod(pod);
        }
        let mut problems = std::mem::take(&mut self.violations);
        let by_name: HashMap<String, &TrainingJob> =
            jobs.iter().map(|j| (j.name_any(), j)).collect();
        let mut committed: HashMap<&str, u64> = HashMap::new();
        for job in jobs {
            let Some(status) = job.status.as_ref() else {
                continue;
            };
            let Some(placement) = status
                .placement
                .as_ref()
                .filter(|p| p.attempt == status.attempt.max(1) && !status.phase.is_terminal())
            else {
                continue;
            };
            for gpu in &placement.gpus {
                *committed.entry(gpu.uuid.as_str()).or_default() += placement.budget_bytes;
            }
        }
        let mut live_budget: HashMap<String, u64> = HashMap::new();
        let mut live_per_job: HashMap<String, Vec<String>> = HashMap::new();
        for pod in pods {
            let labels = pod.labels();
            let name = pod.name_any();
            let (Some(job_name), Some(attempt)) = (
                labels.get(JOB_LABEL),
                labels
                    .get(ATTEMPT_LABEL)
                    .and_then(|a| a.parse::<u32>().ok()),
            ) else {
                problems.push(format!("pod {name} has no job or attempt label"));
                continue;
            };
            let deleting = pod.metadata.deletion_timestamp.is_some();
            let Some(job) = by_name.get(job_name) else {
                if !deleting {
                    problems.push(format!("pod {name} belongs to no job"));
                }
                continue;
            };
            let status = job.status.clone().unwrap_or_default();
            if attempt > status.attempt.max(1) {
                problems.push(format!(
                    "pod {name} is of attempt {attempt}, the job is at {}",
                    status.attempt
                ));
            }
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            match self
                .placements
                .get(&(job.uid().unwrap_or_default(), attempt))
            {
                Some((placed_node, uuids))
                    if node.as_deref() != Some(placed_node.as_str())
                        || visible_devices(pod) != *uuids =>
                {
                    problems.push(format!(
                        "pod {name} runs on {node:?} {:?}, its attempt was placed on \
                         {placed_node} {uuids:?}",
                        visible_devices(pod)
                    ));
                }
                Some(_) => {}
                // An earlier attempt's placement may reach the watch later.
                None if attempt == status.attempt.max(1) => {
                    problems.push(format!("pod {name} has no placement"))
                }
                None => {}
            }
            if is_terminal_pod(pod) || deleting {
                continue;
            }
            live_per_job
                .entry(job_name.clone())
                .or_default()
                .push(name.clone());
            let budget: u64 = pod
                .annotations()
                .get(BUDGET_ANNOTATION)
                .and_then(|b| b.parse().ok())
                .unwrap_or(0);
            for uuid in visible_devices(pod) {
                *live_budget.entry(uuid).or_default() += budget;
            }
        }
        for (job, live) in &live_per_job {
            if live.len() > 1 {
                problems.push(format!("{job} has {} live pods: {live:?}", live.len()));
            }
        }
        let over = |what: &str, sums: &HashMap<&str, u64>, problems: &mut Vec<String>| {
            for (uuid, bytes) in sums {
                match capacity.get(*uuid) {
                    Some((_, total)) if bytes <= total => {}
                    Some((node, total)) => problems.push(format!(
                        "{what}: GPU {uuid} of {node} holds {:.1} GiB of {:.1} GiB",
                        *bytes as f64 / GIB as f64,
                        *total as f64 / GIB as f64
                    )),
                    None => problems.push(format!("{what}: GPU {uuid} does not exist")),
                }
            }
        };
        over("placements", &committed, &mut problems);
        let live: HashMap<&str, u64> = live_budget.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        over("live pods", &live, &mut problems);
        self.checks += 1;
        problems
    }
}

/// The audit of one test's namespace and nodes, fed by watches.
struct Auditor {
    audit: Arc<Mutex<Audit>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Auditor {
    fn start(cluster: &TestCluster) -> Self {
        let audit = Arc::new(Mutex::new(Audit::default()));
        let jobs = {
            let audit = audit.clone();
            follow(cluster.jobs(), move |job| {
                audit.lock().unwrap().observe_job(job)
            })
        };
        let pods = {
            let audit = audit.clone();
            follow(cluster.pods(), move |pod| {
                audit.lock().unwrap().observe_pod(pod)
            })
        };
        Self {
            audit,
            tasks: vec![jobs, pods],
        }
    }

    /// Lists the jobs, pods and GpuNodes and panics with what is wrong.
    async fn check(&self, cluster: &TestCluster, when: &str) -> Vec<TrainingJob> {
        // Pods first: a pod is created after its placement is written, so
        // every pod listed has its placement in the jobs listed after.
        let pods = cluster
            .pods()
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items;
        let jobs = cluster
            .jobs()
            .list(&ListParams::default())
            .await
            .expect("list TrainingJobs")
            .items;
        let selector = cluster
            .labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let gpu_nodes = Api::<GpuNode>::all(cluster.client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("list GpuNodes")
            .items;
        let capacity: HashMap<String, (String, u64)> = gpu_nodes
            .iter()
            .flat_map(|n| {
                let node = n.name_any();
                n.status
                    .iter()
                    .flat_map(|s| s.gpus.iter())
                    .map(move |g| (g.uuid.clone(), (node.clone(), g.total_bytes)))
                    .collect::<Vec<_>>()
            })
            .collect();
        let problems = self.audit.lock().unwrap().audit(&jobs, &pods, &capacity);
        assert!(problems.is_empty(), "{when}:\n{}", problems.join("\n"));
        jobs
    }

    /// Job name -> attempts that had a pod, over the whole run.
    fn pod_attempts(&self) -> HashMap<String, BTreeSet<u32>> {
        self.audit.lock().unwrap().pod_attempts.clone()
    }
}

impl Drop for Auditor {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Waits until `check` holds for every listed job (or panics after `within`
/// with the jobs that do not).
async fn wait_all(
    cluster: &TestCluster,
    what: &str,
    within: Duration,
    check: impl Fn(&TrainingJob) -> bool,
) -> Vec<TrainingJob> {
    try_wait_all(cluster, what, within, check)
        .await
        .unwrap_or_else(|(message, _)| panic!("{message}"))
}

/// [`wait_all`], answering on time-out with the message and the names of the
/// jobs not there.
async fn try_wait_all(
    cluster: &TestCluster,
    what: &str,
    within: Duration,
    check: impl Fn(&TrainingJob) -> bool,
) -> Result<Vec<TrainingJob>, (String, Vec<String>)> {
    let deadline = Instant::now() + within;
    loop {
        let jobs = cluster
            .jobs()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let pending: Vec<String> = jobs
            .iter()
            .filter(|j| !check(j))
            .map(|j| {
                // attempt, pod and history too: a job left waiting after a
                // kill shows which attempt's record the controllers lost
                let status = j.status.as_ref();
                format!(
                    "{} {:?} {:?} attempt {:?} pod {:?} history {:?}",
                    j.name_any(),
                    phase(j),
                    status.and_then(|s| s.message.clone()),
                    status.map(|s| s.attempt),
                    status.and_then(|s| s.pod_name.clone()),
                    status.map(|s| &s.history),
                )
            })
            .collect();
        if pending.is_empty() && !jobs.is_empty() {
            return Ok(jobs);
        }
        if Instant::now() >= deadline {
            let message = format!(
                "timed out waiting for {what}: {} of {} jobs not there:\n{}",
                pending.len(),
                jobs.len(),
                pending
                    .iter()
                    .take(20)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            let names = jobs
                .iter()
                .filter(|j| !check(j))
                .map(|j| j.name_any())
                .collect();
            return Err((message, names));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn is_placed(job: &TrainingJob) -> bool {
    job.status.as_ref().is_some_and(|s| {
        s.placement
            .as_ref()
            .is_some_and(|p| p.attempt == s.attempt.max(1))
    }) && !phase(job).is_terminal()
}

/// The scenario of the restart tests, on 2 GPUs of 80 GiB and jobs of
/// 30 GiB (two fit a GPU): four run, two wait; `fault` happens; two more
/// come; the four first end, and the four others take their room. Returns the
/// controller (the one running at the end).
async fn restart_scenario<F, Fut>(
    cluster: &TestCluster,
    mut controller: ControllerProcess,
    fault: F,
) -> ControllerProcess
where
    F: FnOnce(ControllerProcess) -> Fut,
    Fut: std::future::Future<Output = ControllerProcess>,
{
    let auditor = Auditor::start(cluster);
    for i in 0..4 {
        cluster
            .apply_job(mlp_job(&format!("before-{i}"), 64, 8, 1, Some("30Gi")))
            .await;
    }
    for i in 0..4 {
        cluster
            .wait_phase(&format!("before-{i}"), Phase::Placed)
            .await;
        cluster.wait_pod(&format!("before-{i}-a1")).await;
    }
    for i in 0..2 {
        cluster
            .apply_job(mlp_job(&format!("mid-{i}"), 64, 8, 1, Some("30Gi")))
            .await;
    }
    for i in 0..2 {
        cluster
            .wait_message(&format!("mid-{i}"), "waiting for room")
            .await;
    }
    auditor.check(cluster, "before the fault").await;
    assert!(controller.is_running(), "{}", controller.log_text());

    controller = fault(controller).await;

    auditor.check(cluster, "right after the fault").await;
    for i in 0..2 {
        cluster
            .apply_job(mlp_job(&format!("after-{i}"), 64, 8, 1, Some("30Gi")))
            .await;
    }
    // Made while the controller may still be reconnecting: it must see them.
    for i in 0..4 {
        cluster.kubelet_running(&format!("before-{i}-a1")).await;
        cluster.kubelet_exit(&format!("before-{i}-a1"), 0, "").await;
    }
    let jobs = wait_all(
        cluster,
        "every job ended or placed",
        Duration::from_secs(90),
        |j| {
            if j.name_any().starts_with("before-") {
                phase(j) == Phase::Succeeded
            } else {
                is_placed(j)
            }
        },
    )
    .await;
    assert_eq!(jobs.len(), 8, "no job lost");
    for job in jobs.iter().filter(|j| !j.name_any().starts_with("before-")) {
        cluster.wait_pod(&format!("{}-a1", job.name_any())).await;
    }
    // Let a few more cycles run on the settled state, then check it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    auditor.check(cluster, "at the end").await;
    let attempts = auditor.pod_attempts();
    for job in &jobs {
        assert_eq!(
            attempts.get(&job.name_any()),
            Some(&BTreeSet::from([1])),
            "{}: one pod for its one attempt",
            job.name_any()
        );
    }
    controller
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_restarted_mid_run_loses_and_doubles_nothing_and_the_controller_rides_it_out()
 {
    let plane = PrivateControlPlane::start("apiserver");
    let cluster = TestCluster::on("apiserver-restart", plane.kubeconfig()).await;
    cluster
        .add_gpu_node("n1", &[("H100-80GB", 80 * GIB), ("H100-80GB", 80 * GIB)])
        .await;
    let controller = cluster.start_logged_controller(&["--no-leader-election"], "127.0.0.1:0");
    let pid = controller.id();
    let plane = &plane;
    let mut controller = restart_scenario(&cluster, controller, |mut controller| async move {
        plane.restart("apiserver", Duration::from_secs(2)).await;
        // Its watches broke and came back: the same process goes on.
        assert!(controller.is_running(), "{}", controller.log_text());
        controller
    })
    .await;
    assert_eq!(controller.id(), pid);
    assert!(controller.is_running(), "{}", controller.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_longer_than_the_lease_stops_the_leader_and_its_restart_loses_and_doubles_nothing()
 {
    let plane = PrivateControlPlane::start("etcd");
    let cluster = TestCluster::on("etcd-restart", plane.kubeconfig()).await;
    cluster
        .add_gpu_node("n1", &[("H100-80GB", 80 * GIB), ("H100-80GB", 80 * GIB)])
        .await;
    let namespace = cluster.namespace.clone();
    let replica = ["--lease-namespace", &namespace, "--lease-name", "etcd"];
    let controller = cluster.start_logged_controller(&replica, "127.0.0.1:0");
    let (plane, scenario_cluster) = (&plane, &cluster);
    let controller = restart_scenario(&cluster, controller, |mut controller| async move {
        // 16 s down: longer than the Lease (15 s), so the leader cannot
        // renew it in time. It stops acting when the Lease runs out (a
        // standby elsewhere could have taken it) and exits...
        let restart = plane.restart("etcd", Duration::from_secs(16));
        let exited = async {
            let code = controller.wait_exit(Duration::from_secs(40)).await;
            (code, controller.log_text())
        };
        let ((code, log), ()) = tokio::join!(exited, restart);
        assert_eq!(code, Some(1), "{log}");
        assert!(
            log.contains(
                "lost leadership: Lease etcd expired before this replica was seen renewing it"
            ),
            "{log}"
        );
        // ... and its restart (the Deployment's) campaigns and leads again.
        scenario_cluster.start_logged_controller(&replica, "127.0.0.1:0")
    })
    .await;
    drop(controller);
}

/// A kubeconfig for `proxy`: the control plane's, with the server's port
/// replaced (the certificate names 127.0.0.1, which the proxy listens on).
fn kubeconfig_through(proxy: &Proxy, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(controlplane::kubeconfig()).expect("kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("a server line")
        .to_string();
    let text = text.replace(&server, &format!("https://127.0.0.1:{}", proxy.port));
    let path = std::env::temp_dir().join(format!(
        "vramfit-proxy-{}-{name}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_sees_what_changed_while_its_watches_were_cut() {
    let cluster = TestCluster::new("watch-cut").await;
    let n1 = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let proxy = Proxy::start(api_server_addr().await).await;
    let kubeconfig = kubeconfig_through(&proxy, "watch-cut");
    let mut controller =
        cluster.start_logged_controller_via(&kubeconfig, &["--no-leader-election"], "127.0.0.1:0");
    let auditor = Auditor::start(&cluster);
    for name in ["ends", "deleted"] {
        cluster
            .apply_job(mlp_job(name, 64, 8, 1, Some("40Gi")))
            .await;
        cluster.wait_phase(name, Phase::Placed).await;
    }
    cluster.wait_pod("ends-a1").await;
    cluster.wait_pod("deleted-a1").await;
    cluster.kubelet_running("ends-a1").await;
    cluster.wait_phase("ends", Phase::Running).await;

    // Every connection of the controller is cut, and new ones are refused.
    proxy.down();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Meanwhile: a pod ends, a job is deleted, a bigger node joins, a job
    // that only fits that node and one that fits the freed room come.
    cluster.kubelet_exit("ends-a1", 0, "").await;
    cluster.delete_job("deleted").await;
    let n2 = cluster.add_gpu_node("n2", &[("H200", 141 * GIB)]).await;
    cluster
        .apply_job(mlp_job("big", 64, 8, 1, Some("100Gi")))
        .await;
    cluster
        .apply_job(mlp_job("small", 64, 8, 1, Some("40Gi")))
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let still = cluster.jobs().get("ends").await.unwrap();
    assert_eq!(
        phase(&still),
        Phase::Running,
        "nothing reached it while cut"
    );
    proxy.up();

    cluster.wait_phase("ends", Phase::Succeeded).await;
    cluster.wait_job_gone("deleted").await;
    let big = cluster.wait_phase("big", Phase::Placed).await;
    assert_eq!(big.status.unwrap().placement.unwrap().node, n2);
    let small = cluster.wait_phase("small", Phase::Placed).await;
    assert!(
        [n1.as_str(), n2.as_str()]
            .contains(&small.status.unwrap().placement.unwrap().node.as_str())
    );
    cluster.wait_pod("big-a1").await;
    cluster.wait_pod("small-a1").await;
    auditor.check(&cluster, "after the cut").await;
    assert!(
        controller.is_running(),
        "the same process rides out the cut: {}",
        controller.log_text()
    );
    let _ = std::fs::remove_file(kubeconfig);
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        Err(_) => default,
    }
}

/// A job of the kill test: `request_gib` per GPU on `gpus` GPUs, its
/// simulated process peaking under the budget, or (`ooms`) over it at the
/// first micro-batch and under it at half of it.
fn kill_test_job(name: &str, gpus: u32, request_gib: u64, ooms: bool) -> Value {
    let mut job = mlp_job(name, 64, 8, 1, Some(&format!("{request_gib}Gi")));
    job["spec"]["gpus"] = json!(gpus);
    // micro 8: half the request + the whole request (1.5x); micro 4: the request.
    let peak = if ooms {
        format!("{}Mi+{}Mi", request_gib * 512, request_gib * 128)
    } else {
        format!("{}Mi", request_gib * 800)
    };
    job["spec"]["template"]["metadata"] = json!({"annotations": {
        vramfit_agent::sim::workload::PEAK_ANNOTATION: peak,
    }});
    job
}

/// 20 SIGKILLs at random moments of a 200-job run on simulated nodes, each
/// followed by a restart; every job ends, none lost, none placed twice.
/// `VRAMFIT_FAULT_SEED`, `VRAMFIT_FAULT_KILLS`, `VRAMFIT_FAULT_JOBS` change it;
/// a failure prints its seed first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_killed_at_random_moments_loses_and_doubles_nothing() {
    let seed = env_number(
        "VRAMFIT_FAULT_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    let kills = env_number("VRAMFIT_FAULT_KILLS", 20) as usize;
    let job_count = env_number("VRAMFIT_FAULT_JOBS", 200) as usize;
    println!("kill test: seed {seed} (VRAMFIT_FAULT_SEED), {kills} kills, {job_count} jobs");
    eprintln!("kill test: seed {seed} (VRAMFIT_FAULT_SEED), {kills} kills, {job_count} jobs");
    let mut rng = vramfit::place::rng::SeededRng::new(seed);

    let cluster = TestCluster::new("kills").await;
    const NODES: usize = 4;
    let agents: Vec<SimAgent> = (0..NODES)
        .map(|i| {
            SimAgent::start_with(
                &cluster,
                &cluster.node_name(&format!("n{i}")),
                "4xH100-80GB",
                cluster.client.clone(),
                Duration::from_secs(3),
                // Few status writes: each one re-runs the reconciles of the
                // node's jobs, and this machine has two cores for all of it.
                (
                    Duration::from_millis(500),
                    PublishPolicy {
                        threshold_bytes: 8 * GIB,
                        min_gap: Duration::from_secs(2),
                        heartbeat: Duration::from_secs(10),
                    },
                ),
                "warn,vramfit_agent=warn",
            )
        })
        .collect();
    let gpu_nodes: Api<GpuNode> = Api::all(cluster.client.clone());
    for i in 0..NODES {
        let name = cluster.node_name(&format!("n{i}"));
        let deadline = Instant::now() + Duration::from_secs(60);
        while gpu_nodes
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.status)
            .is_none_or(|s| s.gpu_count != 4)
        {
            assert!(Instant::now() < deadline, "agent {name} never reported");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let auditor = Auditor::start(&cluster);
    let start = |cluster: &TestCluster| {
        cluster.start_logged_controller(&["--no-leader-election"], "127.0.0.1:0")
    };
    let mut controller = start(&cluster);
    // Each killed controller's log, for the jobs a time-out names.
    let mut logs: Vec<String> = Vec::new();

    // The jobs come over the kills' span, at random sizes; one in ten
    // runs out of memory once; one in ten takes two GPUs.
    let specs: Vec<(String, u32, u64, bool)> = (0..job_count)
        .map(|i| {
            let gpus = if rng.unit() < 0.1 { 2 } else { 1 };
            let request = 8 + rng.next_u64() % 25;
            (format!("job-{i:04}"), gpus, request, rng.unit() < 0.1)
        })
        .collect();
    let gaps: Vec<Duration> = (0..kills)
        .map(|_| Duration::from_secs_f64(0.3 + 3.2 * rng.unit()))
        .collect();
    let span: Duration = gaps.iter().sum::<Duration>().mul_f64(0.9);
    let started = Instant::now();
    let creator = {
        let jobs = cluster.jobs();
        tokio::spawn(async move {
            for (i, (name, gpus, request, ooms)) in specs.into_iter().enumerate() {
                let due = started + span.mul_f64(i as f64 / job_count as f64);
                tokio::time::sleep_until(due.into()).await;
                let job: TrainingJob =
                    serde_json::from_value(kill_test_job(&name, gpus, request, ooms)).unwrap();
                jobs.create(&PostParams::default(), &job)
                    .await
                    .unwrap_or_else(|e| panic!("creating {name}: {e}"));
            }
        })
    };
    for (k, gap) in gaps.iter().enumerate() {
        tokio::time::sleep(*gap).await;
        assert!(
            controller.is_running(),
            "the controller exited by itself before kill {k}: {}",
            controller.log_text()
        );
        controller.signal(libc::SIGKILL);
        let _ = controller.wait_exit(Duration::from_secs(10)).await;
        logs.push(controller.log_text());
        auditor
            .check(
                &cluster,
                &format!("after kill {} of {kills} (seed {seed})", k + 1),
            )
            .await;
        controller = start(&cluster);
    }
    creator.await.expect("all jobs created");
    println!(
        "kill test: {kills} kills done after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let waited = try_wait_all(
        &cluster,
        &format!("every job to end (seed {seed})"),
        // The debug build on two shared cores: about 0.8 s per job, and more
        // when a late job's out-of-memory retry queues behind the rest (seed
        // 1796446893984933348: the last retry succeeded at 180 s).
        Duration::from_secs(240.max(job_count as u64 * 6 / 5)),
        |j| phase(j).is_terminal(),
    )
    .await;
    let jobs = match waited {
        Ok(jobs) => jobs,
        Err((message, names)) => {
            logs.push(controller.log_text());
            panic!("{message}\n{}", stuck_story(&cluster, &names, &logs).await);
        }
    };
    auditor
        .check(&cluster, &format!("at the end (seed {seed})"))
        .await;
    assert_eq!(jobs.len(), job_count, "no job lost (seed {seed})");
    let attempts = auditor.pod_attempts();
    let mut retried = 0;
    for job in &jobs {
        let status = job.status.as_ref().unwrap();
        assert_eq!(
            status.phase,
            Phase::Succeeded,
            "{} (seed {seed}): {:?}",
            job.name_any(),
            status.message
        );
        let want: BTreeSet<u32> = (1..=status.attempt.max(1)).collect();
        assert_eq!(
            attempts.get(&job.name_any()),
            Some(&want),
            "{} (seed {seed}): one pod per attempt",
            job.name_any()
        );
        retried += usize::from(status.attempt > 1);
    }
    assert!(retried > 0, "some jobs went through an OOM retry");
    println!(
        "kill test: {job_count} jobs succeeded ({retried} after an OOM retry) in {:.1} s, seed {seed}",
        started.elapsed().as_secs_f64()
    );
    assert!(controller.is_running(), "{}", controller.log_text());
    drop(agents);
}

/// What the pods and every controller's log say of the jobs `names` (the
/// first five): each pod's phase, and each log line naming the job, by
/// controller in the order they ran; then the last controller's last lines
/// (a controller that stopped says why there).
async fn stuck_story(cluster: &TestCluster, names: &[String], logs: &[String]) -> String {
    let pods = cluster
        .pods()
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut story = String::new();
    for name in names.iter().take(5) {
        for pod in pods
            .iter()
            .filter(|p| p.labels().get(JOB_LABEL) == Some(name))
        {
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            story.push_str(&format!("pod {} {phase:?}\n", pod.name_any()));
        }
        let quoted = format!("{name}\"");
        let bare = format!("{name} ");
        for (i, log) in logs.iter().enumerate() {
            for line in log
                .lines()
                .filter(|l| l.contains(&quoted) || l.contains(&bare) || l.ends_with(name.as_str()))
            {
                story.push_str(&format!("controller {i}: {line}\n"));
            }
        }
    }
    if let Some(last) = logs.last() {
        let lines: Vec<&str> = last.lines().collect();
        story.push_str("the last controller's last lines:\n");
        for line in &lines[lines.len().saturating_sub(20)..] {
            story.push_str(line);
            story.push('\n');
        }
    }
    story
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref().and_then(|s| s.holder_identity.clone())
}

/// Decision lines (JSON) of a controller's log from byte `from` on.
fn decisions_after(log: &str, from: usize) -> Vec<String> {
    log.get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"message\":\"decision\""))
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_resumes_without_writing_and_exits() {
    let cluster = TestCluster::new("stale-lease").await;
    cluster
        .add_gpu_node("n1", &[("H100-80GB", 80 * GIB), ("H100-80GB", 80 * GIB)])
        .await;
    let namespace = cluster.namespace.clone();
    let replica = [
        "--lease-namespace",
        namespace.as_str(),
        "--lease-name",
        "stale",
        "--log-format",
        "json",
    ];
    let auditor = Auditor::start(&cluster);
    let mut first = cluster.start_logged_controller(&replica, "127.0.0.1:0");
    cluster
        .apply_job(mlp_job("first", 64, 8, 1, Some("20Gi")))
        .await;
    cluster.wait_phase("first", Phase::Placed).await;
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &namespace);
    let first_id = format!("vramfit-{}", first.id());
    assert_eq!(holder(&leases.get("stale").await.unwrap()), Some(first_id));
    let mut second = cluster.start_logged_controller(&replica, "127.0.0.1:0");
    let second_id = format!("vramfit-{}", second.id());

    // The leader freezes; its Lease runs out and the standby takes it.
    first.signal(libc::SIGSTOP);
    let paused = Instant::now();
    let deadline = paused + Duration::from_secs(60);
    while holder(&leases.get("stale").await.unwrap()).as_deref() != Some(second_id.as_str()) {
        assert!(Instant::now() < deadline, "the standby never took over");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster
        .apply_job(mlp_job("second", 64, 8, 1, Some("20Gi")))
        .await;
    cluster.wait_phase("second", Phase::Placed).await;
    // Work the frozen one will find on resuming: its watches deliver these
    // jobs at once, while its lease manager still has to ask the API server.
    for i in 0..3 {
        cluster
            .apply_job(mlp_job(&format!("bait-{i}"), 64, 8, 1, Some("20Gi")))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before_resume = first.log_text().len();
    first.signal(libc::SIGCONT);
    let code = first.wait_exit(Duration::from_secs(20)).await;
    let log = first.log_text();
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("lost leadership"), "{log}");
    let stale = decisions_after(&log, before_resume);
    assert!(
        stale.is_empty(),
        "the resumed replica wrote after its Lease ran out:\n{}",
        stale.join("\n")
    );
    println!(
        "stale leader: paused {:.1} s, exited with 1 after resuming",
        paused.elapsed().as_secs_f64()
    );

    for i in 0..3 {
        cluster
            .wait_phase(&format!("bait-{i}"), Phase::Placed)
            .await;
        cluster.wait_pod(&format!("bait-{i}-a1")).await;
    }
    let jobs = auditor
        .check(&cluster, "after the stale leader's exit")
        .await;
    assert_eq!(jobs.iter().filter(|j| is_placed(j)).count(), 5);
    assert_eq!(
        holder(&leases.get("stale").await.unwrap()),
        Some(second_id),
        "the new leader keeps the Lease"
    );
    assert!(second.is_running(), "{}", second.log_text());
    // Only the new leader decided about the later jobs.
    let second_log = second.log_text();
    assert!(
        decisions_after(&second_log, 0)
            .iter()
            .any(|l| l.contains("\"job\":\"bait-0\"")),
        "{second_log}"
    );
}
