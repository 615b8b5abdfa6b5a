//! The TrainingJob lifecycle against the real API server, with the real
//! `vramfit controller` binary and a driver in place of kubelets and agents.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use serde_json::json;
use vramfit::api::{AssignedGpu, GpuNode, Phase, PlacementStatus, TrainingJob};
use vramfit::controller::pod::training_pod;
use vramfit::job::backoff::BatchShape;

use crate::driver::{GIB, TestCluster, mlp_job, trainer_template};

fn phase(job: &TrainingJob) -> Phase {
    job.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn env_of(pod: &k8s_openapi::api::core::v1::Pod) -> BTreeMap<String, String> {
    pod.spec.as_ref().unwrap().containers[0]
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
        .collect()
}

const OOM_TEXT: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.2 GiB is free.";

#[tokio::test]
async fn job_goes_from_apply_to_placed_running_and_succeeded() {
    let cluster = TestCluster::new("lifecycle").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    // Every version of the job's status: the prediction is written with the
    // placement, in one write.
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let watch = {
        let statuses = statuses.clone();
        crate::follow::follow(cluster.jobs(), move |job: &TrainingJob| {
            let status = job.status.clone().unwrap_or_default();
            statuses
                .lock()
                .unwrap()
                .push((status.budget_bytes.is_some(), status.placement.is_some()));
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.apply_job(mlp_job("mlp", 64, 8, 1, None)).await;

    let job = cluster.wait_phase("mlp", Phase::Placed).await;
    // The watch may lag the wait on a busy machine: give it the time to see
    // the placed status before looking at what it saw.
    for _ in 0..100 {
        if statuses.lock().unwrap().contains(&(true, true)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.abort();
    let seen = statuses.lock().unwrap().clone();
    assert!(
        seen.iter().all(|&(predicted, placed)| predicted == placed),
        "a status with a prediction but no placement was written: {seen:?}"
    );
    assert!(seen.contains(&(true, true)), "{seen:?}");
    // One event for both, the placement's, with the prediction's note first.
    let mut placed_notes = Vec::new();
    for _ in 0..50 {
        placed_notes = cluster.event_notes("mlp", "Placed").await;
        if !placed_notes.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(placed_notes.len(), 1, "{placed_notes:?}");
    assert!(
        placed_notes[0].starts_with("attempt 1: predicted peak")
            && placed_notes[0].contains("; placed on"),
        "{placed_notes:?}"
    );
    assert!(cluster.event_notes("mlp", "Predicted").await.is_empty());
    let status = job.status.unwrap();
    let placement = status.placement.expect("placement");
    assert_eq!(placement.node, node);
    assert_eq!(placement.gpus[0].index, 0);
    assert!(
        status.predicted_bytes.unwrap() > GIB,
        "a real prediction: {:?}",
        status.predicted
    );
    assert_eq!(status.prediction_source.as_deref(), Some("model"));
    assert_eq!(status.batch_shape.as_deref(), Some("8x8"));
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1))
    );

    let pod = cluster.wait_pod("mlp-a1").await;
    let env = env_of(&pod);
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(node.as_str())
    );
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], format!("GPU-{node}-0"));
    assert_eq!(env["VRAMFIT_MICRO_BATCH"], "8");
    assert_eq!(env["VRAMFIT_GRAD_ACCUM"], "8");
    let fraction: f64 = env["VRAMFIT_MEMORY_FRACTION"].parse().unwrap();
    assert!((fraction - placement.budget_bytes as f64 / (80 * GIB) as f64).abs() < 1e-5);

    cluster.kubelet_running("mlp-a1").await;
    cluster.wait_phase("mlp", Phase::Running).await;
    cluster.kubelet_exit("mlp-a1", 0, "").await;
    let job = cluster.wait_phase("mlp", Phase::Succeeded).await;
    assert_eq!(job.status.unwrap().history.len(), 1);
}

/// `kubectl get gn` follows a placement as soon as the job's status
/// records it, not at the next scheduling cycle: with cycles a minute apart,
/// the GpuNode's `status.allocation` shows the job's budget within seconds of
/// its Placed status (it lagged by up to a cycle, since the cycle that
/// places a job runs before its status is written).
#[tokio::test]
async fn the_gpunode_allocation_follows_a_placement_without_waiting_for_a_cycle() {
    let cluster = TestCluster::new("gn-follows").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_logged_controller(
        &["--no-leader-election", "--cycle-seconds", "60"],
        "127.0.0.1:0",
    );
    let gpu_nodes: kube::Api<vramfit::api::GpuNode> = kube::Api::all(cluster.client.clone());
    let committed = || async {
        gpu_nodes
            .get_status(&node)
            .await
            .ok()
            .and_then(|n| n.status?.allocation)
            .map(|a| a.committed_bytes)
    };
    // The node's first allocation (nothing committed) is written at start;
    // the next write may follow 5 s later (allocation::MIN_INTERVAL).
    let deadline = Instant::now() + Duration::from_secs(30);
    while committed().await.is_none() {
        assert!(Instant::now() < deadline, "no allocation written at start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster
        .apply_job(mlp_job("a", 64, 8, 1, Some("30Gi")))
        .await;
    cluster.wait_phase("a", Phase::Placed).await;
    let placed = Instant::now();
    loop {
        if committed().await.is_some_and(|c| c >= 30 * GIB) {
            break;
        }
        assert!(
            placed.elapsed() < Duration::from_secs(10),
            "GpuNode {node} still shows {:?} bytes committed 10 s after the job was placed",
            committed().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "allocation shown {:.1} s after the Placed status",
        placed.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn two_jobs_share_one_gpu_with_enforced_fractions() {
    let cluster = TestCluster::new("share").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster
        .apply_job(mlp_job("a", 64, 8, 1, Some("30Gi")))
        .await;
    cluster
        .apply_job(mlp_job("b", 64, 8, 1, Some("30Gi")))
        .await;
    for name in ["a", "b"] {
        let job = cluster.wait_phase(name, Phase::Placed).await;
        let placement = job.status.unwrap().placement.unwrap();
        assert_eq!(
            (placement.node.as_str(), placement.gpus[0].index),
            (node.as_str(), 0)
        );
        assert_eq!(placement.budget_bytes, 30 * GIB);
        assert!((placement.memory_fraction - 0.375).abs() < 1e-9);
    }
}

#[tokio::test]
async fn jobs_share_a_gpu_only_while_their_compute_shares_fit_it() {
    let cluster = TestCluster::new("compute").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    let with_compute = |name: &str, percent: u32| {
        let mut job = mlp_job(name, 64, 8, 1, Some("20Gi"));
        job["spec"]["gpuComputePercent"] = json!(percent);
        job
    };
    cluster.apply_job(with_compute("first", 60)).await;
    let first = cluster.wait_phase("first", Phase::Placed).await;
    let placement = first.status.unwrap().placement.unwrap();
    assert_eq!(placement.compute_percent, Some(60));
    cluster.wait_pod("first-a1").await;
    // Memory for both, compute for one: the second waits, told why.
    cluster.apply_job(with_compute("second", 60)).await;
    let waiting = cluster
        .wait_message("second", "of the compute of each of its 1 GPU(s)")
        .await;
    assert_eq!(phase(&waiting), Phase::Pending);
    // A job that needs what is left joins the first on its GPU.
    cluster.apply_job(with_compute("third", 40)).await;
    let third = cluster.wait_phase("third", Phase::Placed).await;
    let placement = third.status.unwrap().placement.unwrap();
    assert_eq!(
        (placement.node.as_str(), placement.gpus[0].index),
        (node.as_str(), 0)
    );
    // The first ends: the second takes its compute, beside the third.
    cluster.delete_job("first").await;
    cluster.wait_job_gone("first").await;
    cluster.kubelet_removes_deleted("first-a1").await;
    let second = cluster.wait_phase("second", Phase::Placed).await;
    assert_eq!(second.status.unwrap().placement.unwrap().gpus[0].index, 0);
}

#[tokio::test]
async fn the_clusters_default_compute_share_holds_for_jobs_that_set_none() {
    let cluster = TestCluster::new("compute-default").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_logged_controller(
        &["--no-leader-election", "--default-gpu-compute-percent=60"],
        "127.0.0.1:0",
    );
    // Neither sets gpuComputePercent: each needs the default's 60 %.
    cluster
        .apply_job(mlp_job("first", 64, 8, 1, Some("20Gi")))
        .await;
    let first = cluster.wait_phase("first", Phase::Placed).await;
    let status = first.status.unwrap();
    assert_eq!(status.compute_percent, Some(60));
    assert_eq!(status.placement.unwrap().compute_percent, Some(60));
    cluster.wait_pod("first-a1").await;
    cluster
        .apply_job(mlp_job("second", 64, 8, 1, Some("20Gi")))
        .await;
    let waiting = cluster
        .wait_message("second", "needs 60.0 % of the compute")
        .await;
    assert_eq!(phase(&waiting), Phase::Pending);
    // A job's own share wins over the default: 40 % joins the first.
    let mut third = mlp_job("third", 64, 8, 1, Some("20Gi"));
    third["spec"]["gpuComputePercent"] = json!(40);
    cluster.apply_job(third).await;
    let third = cluster.wait_phase("third", Phase::Placed).await;
    let placement = third.status.unwrap().placement.unwrap();
    assert_eq!(placement.compute_percent, Some(40));
    assert_eq!(
        (placement.node.as_str(), placement.gpus[0].index),
        (node.as_str(), 0)
    );
}

#[tokio::test]
async fn job_larger_than_any_gpu_waits_and_is_placed_when_a_larger_gpu_appears() {
    let cluster = TestCluster::new("toobig").await;
    cluster.add_gpu_node("small", &[("L4", 24 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster
        .apply_job(mlp_job("big", 64, 8, 1, Some("40Gi")))
        .await;
    let job = cluster.wait_message("big", "bigger than any GPU").await;
    let status = job.status.unwrap();
    assert_eq!(status.phase, Phase::Pending);
    let message = status.message.unwrap();
    assert!(
        message.contains("24.0 GiB"),
        "names the largest GPU: {message}"
    );
    let placed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Placed")
        .expect("Placed condition");
    assert_eq!(
        (placed.status.as_str(), placed.reason.as_str()),
        ("False", "FitsNoNode")
    );

    let large = cluster.add_gpu_node("large", &[("H200", 141 * GIB)]).await;
    let job = cluster.wait_phase("big", Phase::Placed).await;
    assert_eq!(job.status.unwrap().placement.unwrap().node, large);
}

#[tokio::test]
async fn oom_halves_micro_batch_and_doubles_accumulation_in_a_new_pod() {
    let cluster = TestCluster::new("oom").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster.apply_job(mlp_job("oom", 64, 8, 1, None)).await;
    let first = cluster.wait_phase("oom", Phase::Placed).await;
    let first_budget = first.status.unwrap().budget_bytes.unwrap();
    cluster.wait_pod("oom-a1").await;
    cluster.kubelet_running("oom-a1").await;
    cluster.kubelet_exit("oom-a1", 42, OOM_TEXT).await;

    let job = cluster
        .wait_job("oom", "attempt 2 placed", |j| {
            j.status
                .as_ref()
                .is_some_and(|s| s.attempt == 2 && s.phase == Phase::Placed)
        })
        .await;
    let status = job.status.clone().unwrap();
    assert_eq!((status.micro_batch, status.grad_accum), (Some(4), Some(16)));
    assert_eq!(status.batch_shape.as_deref(), Some("4x16"));
    assert_eq!(
        job.spec.batch.global, 64,
        "the global batch is never changed"
    );
    // Re-predicted for the smaller micro-batch, and raised by what the OOM
    // proved missing (this MLP's memory is mostly its parameters, so halving
    // the micro-batch alone would have left the budget that just failed).
    let at_four = vramfit::job::budget::attempt_budget(&job, 4, None, None).unwrap();
    let raised = (at_four.budget as f64 * 1.05).ceil() as u64;
    let budget = status.budget_bytes.unwrap();
    assert!(budget.abs_diff(raised) <= 1, "{budget} vs {raised}");
    assert_ne!(budget, first_budget);
    assert_eq!(status.history[0].outcome, "OutOfMemory");
    let pod = cluster.wait_pod("oom-a2").await;
    let env = env_of(&pod);
    assert_eq!(
        (
            env["VRAMFIT_MICRO_BATCH"].as_str(),
            env["VRAMFIT_GRAD_ACCUM"].as_str()
        ),
        ("4", "16")
    );
    assert_eq!(env["VRAMFIT_GLOBAL_BATCH"], "64");
}

#[tokio::test]
async fn oom_at_min_micro_fails_and_other_failures_are_not_retried() {
    let cluster = TestCluster::new("oomfloor").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster.apply_job(mlp_job("floor", 64, 4, 2, None)).await;
    cluster.apply_job(mlp_job("crash", 64, 8, 1, None)).await;

    cluster.wait_pod("floor-a1").await;
    cluster.kubelet_exit("floor-a1", 42, OOM_TEXT).await;
    cluster
        .wait_job("floor", "attempt 2", |j| {
            j.status.as_ref().is_some_and(|s| s.attempt == 2)
        })
        .await;
    cluster.wait_pod("floor-a2").await;
    cluster.kubelet_exit("floor-a2", 42, OOM_TEXT).await;
    let job = cluster.wait_phase("floor", Phase::Failed).await;
    let message = job.status.unwrap().message.unwrap();
    assert!(message.contains("minMicro 2"), "{message}");

    cluster.wait_pod("crash-a1").await;
    cluster
        .kubelet_exit("crash-a1", 1, "KeyError: 'labels'")
        .await;
    let job = cluster.wait_phase("crash", Phase::Failed).await;
    let status = job.status.unwrap();
    assert_eq!(status.attempt, 1, "an ordinary failure is not an OOM");
    assert!(status.message.unwrap().contains("exited with code 1"));
}

#[tokio::test]
async fn an_attempt_started_without_its_gpu_is_tried_again_at_the_same_shape() {
    let cluster = TestCluster::new("nogpu").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    // maxOOMRetries 0: were it counted as an OOM, the job would fail.
    let mut job = mlp_job("nogpu", 64, 8, 1, None);
    job["spec"]["maxOOMRetries"] = serde_json::json!(0);
    cluster.apply_job(job).await;
    cluster.wait_pod("nogpu-a1").await;
    cluster.kubelet_running("nogpu-a1").await;
    let said = "vramfit: no GPU device: the attempt was placed on GPU-1, but this container has no /dev/nvidiaN device";
    cluster.kubelet_exit("nogpu-a1", 43, said).await;

    let job = cluster
        .wait_job("nogpu", "attempt 2 placed", |j| {
            j.status
                .as_ref()
                .is_some_and(|s| s.attempt == 2 && s.phase == Phase::Placed)
        })
        .await;
    let status = job.status.unwrap();
    assert_eq!((status.micro_batch, status.grad_accum), (Some(8), Some(8)));
    assert_eq!(status.history[0].outcome, "NoGpu");
    assert_eq!(status.history[0].message.as_deref(), Some(said));
    let pod = cluster.wait_pod("nogpu-a2").await;
    assert_eq!(env_of(&pod)["VRAMFIT_MICRO_BATCH"], "8");
    let notes = cluster.event_notes("nogpu", "NoGpu").await;
    assert!(
        notes.iter().any(|n| n.contains("started without its GPU")),
        "{notes:?}"
    );
    cluster.kubelet_running("nogpu-a2").await;
    cluster.kubelet_exit("nogpu-a2", 0, "").await;
    cluster.wait_phase("nogpu", Phase::Succeeded).await;
}

#[tokio::test]
async fn deleting_a_job_frees_its_gpu_for_the_next() {
    let cluster = TestCluster::new("delete").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster
        .apply_job(mlp_job("first", 64, 8, 1, Some("60Gi")))
        .await;
    cluster.wait_phase("first", Phase::Placed).await;
    cluster.wait_pod("first-a1").await;
    cluster
        .apply_job(mlp_job("second", 64, 8, 1, Some("60Gi")))
        .await;
    let waiting = cluster.wait_message("second", "waiting for room").await;
    assert_eq!(phase(&waiting), Phase::Pending);

    cluster.delete_job("first").await;
    // No finalizer holds the job: it goes at once.
    cluster.wait_job_gone("first").await;
    // Its pod is deleted, and holds its memory until its containers stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = cluster.jobs().get("second").await.unwrap();
    assert_eq!(
        phase(&still),
        Phase::Pending,
        "the deleted job's pod still holds the GPU"
    );
    cluster.kubelet_removes_deleted("first-a1").await;
    cluster.wait_phase("second", Phase::Placed).await;
}

/// Applies a 60 GiB job and creates its first attempt's pod on GPU `gpu` of
/// `node`, as a controller that stopped before the status write leaves it:
/// the pod is the only record of the placement. Returns the placement.
async fn job_with_unrecorded_pod(
    cluster: &TestCluster,
    node: &str,
    gpu: u32,
    name: &str,
) -> PlacementStatus {
    let gpu_nodes: Api<GpuNode> = Api::all(cluster.client.clone());
    let uuid = gpu_nodes
        .get_status(node)
        .await
        .unwrap()
        .status
        .unwrap()
        .gpus[gpu as usize]
        .uuid
        .clone();
    let job = cluster
        .apply_job(mlp_job(name, 64, 8, 1, Some("60Gi")))
        .await;
    let placement = PlacementStatus {
        compute_percent: None,
        node: node.to_string(),
        gpus: vec![AssignedGpu { index: gpu, uuid }],
        budget_bytes: 60 * GIB,
        memory_fraction: 0.75,
        attempt: 1,
        gpu_model: Some("H100-80GB".into()),
        micro_batch: None,
        elastic: None,
    };
    let shape = BatchShape { micro: 8, accum: 1 };
    let pod = training_pod(&job, &placement, shape, 1).unwrap();
    cluster
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    placement
}

#[tokio::test]
async fn a_pod_created_before_its_status_was_written_is_taken_as_the_placement() {
    // A controller that stopped between an attempt's pod and its status
    // write left the pod as the only record of the placement.
    let cluster = TestCluster::new("adopt").await;
    let node = cluster
        .add_gpu_node("n1", &[("H100-80GB", 80 * GIB), ("H100-80GB", 80 * GIB)])
        .await;
    let placement = job_with_unrecorded_pod(&cluster, &node, 1, "adopted").await;
    // Two more jobs of 60 GiB: one fits GPU 0, the other only GPU 1, which
    // the pod holds.
    for name in ["second", "third"] {
        cluster
            .apply_job(mlp_job(name, 64, 8, 1, Some("60Gi")))
            .await;
    }
    let _controller = cluster.start_controller();
    let adopted = cluster.wait_phase("adopted", Phase::Placed).await;
    assert_eq!(
        adopted.status.unwrap().placement,
        Some(placement),
        "the pod's placement is recorded, not a new one"
    );
    // Whichever of the two is predicted first takes GPU 0; the other waits.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (first, other) = loop {
        let second = cluster.jobs().get("second").await.unwrap();
        let third = cluster.jobs().get("third").await.unwrap();
        match (phase(&second), phase(&third)) {
            (Phase::Placed, _) => break (second, "third"),
            (_, Phase::Placed) => break (third, "second"),
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "neither second nor third was placed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(first.status.unwrap().placement.unwrap().gpus[0].index, 0);
    cluster.wait_message(other, "waiting for room").await;
    let names: Vec<String> = cluster
        .pods()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(
        names.len(),
        2,
        "no second pod for the adopted job: {names:?}"
    );
}

#[tokio::test]
async fn a_pod_that_ended_before_its_status_was_written_ends_its_job_without_new_room() {
    // The stopped controller's pods: one finished while no controller ran,
    // the other still runs and holds the only GPU. The finished attempt is
    // over: its job succeeds from its pod instead of waiting for room to run
    // it again (the pods are not placed anew: one pod each).
    let cluster = TestCluster::new("adopt-ended").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    job_with_unrecorded_pod(&cluster, &node, 0, "ran").await;
    cluster.kubelet_exit("ran-a1", 0, "").await;
    let runs = job_with_unrecorded_pod(&cluster, &node, 0, "runs").await;
    cluster.kubelet_running("runs-a1").await;
    let _controller = cluster.start_controller();
    let done = cluster.wait_phase("ran", Phase::Succeeded).await;
    let status = done.status.unwrap();
    assert_eq!(status.attempt, 1);
    assert_eq!(status.history.len(), 1, "{:?}", status.history);
    let running = cluster.wait_phase("runs", Phase::Running).await;
    assert_eq!(running.status.unwrap().placement, Some(runs));
    let mut names = cluster.pod_names().await;
    names.sort();
    assert_eq!(names, ["ran-a1", "runs-a1"], "no attempt placed anew");
}

#[tokio::test]
async fn controller_killed_mid_flight_and_restarted_places_nothing_twice() {
    let cluster = TestCluster::new("restart").await;
    cluster
        .add_gpu_node("n1", &[("H100-80GB", 80 * GIB), ("H100-80GB", 80 * GIB)])
        .await;
    let controller = cluster.start_controller();
    for i in 0..6 {
        cluster
            .apply_job(mlp_job(&format!("j{i}"), 64, 8, 1, Some("30Gi")))
            .await;
    }
    // Kill it while it is placing.
    cluster.wait_phase("j0", Phase::Placed).await;
    controller.kill();
    let _controller = cluster.start_controller();
    for i in 0..6 {
        cluster
            .wait_job(&format!("j{i}"), "a decision", |j| {
                j.status.as_ref().is_some_and(|s| {
                    s.placement.is_some()
                        || s.message.as_deref().is_some_and(|m| m.contains("waiting"))
                })
            })
            .await;
    }
    // Let the restarted controller settle, then check the ledger.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let jobs = cluster
        .jobs()
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut per_gpu: BTreeMap<u32, u64> = BTreeMap::new();
    let mut placed = 0;
    for job in &jobs {
        if let Some(p) = job.status.as_ref().and_then(|s| s.placement.as_ref()) {
            placed += 1;
            *per_gpu.entry(p.gpus[0].index).or_default() += p.budget_bytes;
        }
    }
    assert_eq!(placed, 4, "two 30 GiB jobs per 80 GiB GPU: {per_gpu:?}");
    assert!(
        per_gpu.values().all(|&b| b <= 80 * GIB),
        "overcommitted: {per_gpu:?}"
    );
    let pods = cluster.pod_names().await;
    assert_eq!(pods.len(), 4, "one pod per placed job: {pods:?}");
}

#[tokio::test]
async fn schema_valid_but_impossible_specs_get_an_invalid_condition() {
    let cluster = TestCluster::new("invalid").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    // (A model_type the analytic path does not know is profiled
    // automatically instead: an_auto_job_is_profiled_...)
    let mut untyped = mlp_job("untyped", 64, 8, 1, None);
    untyped["spec"]["model"] = json!({"huggingFace": {"seqLen": 512, "config": {"d_model": 512}}});
    cluster.apply_job(untyped).await;
    let mut profiled = mlp_job("profiled", 64, 8, 1, None);
    profiled["spec"]["model"] =
        json!({"profile": {"configMapRef": {"name": "missing", "key": "profile.json"}}});
    cluster.apply_job(profiled).await;
    let mut garbage = mlp_job("badprofile", 64, 8, 1, None);
    garbage["spec"]["model"] =
        json!({"profile": {"configMapRef": {"name": "garbage", "key": "profile.json"}}});
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let cm = serde_json::from_value(
        json!({"metadata": {"name": "garbage"}, "data": {"profile.json": "{not json"}}),
    )
    .unwrap();
    let _ = config_maps.create(&PostParams::default(), &cm).await;
    cluster.apply_job(garbage).await;
    // vramfit chooses the node and assigns the GPUs; a template that does
    // either itself is refused, naming the field.
    let mut gpus = mlp_job("devicegpus", 64, 8, 1, None);
    gpus["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] =
        json!({"nvidia.com/gpu": 1});
    cluster.apply_job(gpus).await;
    let mut pinned = mlp_job("pinned", 64, 8, 1, None);
    pinned["spec"]["template"]["spec"]["nodeName"] = json!("n1");
    cluster.apply_job(pinned).await;

    for (name, expected) in [
        ("untyped", "huggingFace.config.model_type"),
        ("profiled", "ConfigMap missing does not exist"),
        ("badprofile", "profile"),
        (
            "devicegpus",
            "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu: must not be set",
        ),
        ("pinned", "spec.template.spec.nodeName: must not be set"),
    ] {
        let job = cluster.wait_phase(name, Phase::Failed).await;
        let status = job.status.unwrap();
        let invalid = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Invalid")
            .expect("Invalid condition");
        assert_eq!(invalid.status, "True");
        assert!(
            invalid.message.contains(expected),
            "{name}: {}",
            invalid.message
        );
        assert_eq!(invalid.observed_generation, Some(1));
    }
}

#[tokio::test]
async fn measured_peak_reaches_status_and_corrects_the_next_prediction_of_the_same_model() {
    let cluster = TestCluster::new("learn").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster.apply_job(mlp_job("first", 64, 8, 1, None)).await;
    let first = cluster.wait_phase("first", Phase::Placed).await;
    let predicted = first.status.unwrap().predicted_bytes.unwrap();
    cluster.wait_pod("first-a1").await;
    cluster.kubelet_running("first-a1").await;
    let measured = predicted + 3 * GIB / 2;
    cluster
        .agent_reports_process(&node, 0, "first-a1", measured - GIB, measured)
        .await;
    let job = cluster
        .wait_job("first", "the measured peak", |j| {
            j.status.as_ref().and_then(|s| s.measured_peak_bytes) == Some(measured)
        })
        .await;
    assert!(job.status.unwrap().measured.is_some());
    cluster.kubelet_exit("first-a1", 0, "").await;
    cluster.wait_phase("first", Phase::Succeeded).await;

    cluster.apply_job(mlp_job("second", 64, 8, 1, None)).await;
    let second = cluster.wait_phase("second", Phase::Placed).await;
    let status = second.status.unwrap();
    assert_eq!(status.prediction_source.as_deref(), Some("measured"));
    assert_eq!(status.predicted_bytes, Some(measured));
}

#[tokio::test]
async fn an_oom_absorbed_in_process_reaches_status_and_starts_the_next_job_of_the_model_smaller() {
    let cluster = TestCluster::new("absorb").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster.apply_job(mlp_job("first", 64, 16, 1, None)).await;
    cluster.wait_phase("first", Phase::Placed).await;
    cluster.wait_pod("first-a1").await;
    cluster.kubelet_running("first-a1").await;
    cluster
        .agent_reports_shape(&node, 0, "first-a1", (8, 8), &[(16, 8, 4, 8)])
        .await;
    let job = cluster
        .wait_job("first", "the absorbed shape", |j| {
            j.status.as_ref().and_then(|s| s.micro_batch) == Some(8)
        })
        .await;
    let status = job.status.unwrap();
    assert_eq!(status.grad_accum, Some(8));
    assert_eq!(status.batch_shape.as_deref(), Some("8x8"));
    assert_eq!(status.attempt, 1, "no restart: the same attempt goes on");
    assert_eq!(status.absorbed_ooms.len(), 1);
    assert_eq!(status.absorbed_ooms[0].from_micro, 16);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let notes = loop {
        let notes = cluster.event_notes("first", "OomAbsorbed").await;
        if !notes.is_empty() || std::time::Instant::now() > deadline {
            break notes;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(
        notes,
        ["OOM absorbed in-process: micro 16 -> 8, accumulation 4 -> 8"]
    );
    cluster.kubelet_exit("first-a1", 0, "").await;
    let done = cluster.wait_phase("first", Phase::Succeeded).await;
    assert_eq!(
        done.status.unwrap().absorbed_ooms.len(),
        1,
        "the record stays"
    );

    // The next job of the same model starts at the shape the first one found.
    cluster.apply_job(mlp_job("second", 64, 16, 1, None)).await;
    let second = cluster.wait_phase("second", Phase::Placed).await;
    let status = second.status.unwrap();
    assert_eq!(status.micro_batch, Some(8));
    assert_eq!(status.grad_accum, Some(8));
    cluster.wait_pod("second-a1").await;
    let pod = cluster.pods().get("second-a1").await.unwrap();
    let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
    let micro = env
        .iter()
        .find(|e| e.name == "VRAMFIT_MICRO_BATCH")
        .unwrap();
    assert_eq!(micro.value.as_deref(), Some("8"));
    // Another model is not affected.
    let mut other = mlp_job("third", 64, 16, 1, None);
    other["spec"]["model"]["mlp"]["layers"] = serde_json::json!(6);
    cluster.apply_job(other).await;
    let third = cluster.wait_phase("third", Phase::Placed).await;
    assert_eq!(third.status.unwrap().micro_batch, Some(16));
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_the_other_takes_over_when_it_dies() {
    let cluster = TestCluster::new("leader").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let first = cluster.start_replica("vramfit-test");
    let second = cluster.start_replica("vramfit-test");
    cluster
        .apply_job(mlp_job("before", 64, 8, 1, Some("10Gi")))
        .await;
    cluster.wait_phase("before", Phase::Placed).await;

    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let lease = leases.get("vramfit-test").await.expect("the Lease exists");
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .expect("a holder");
    let (leader, follower) = if holder == format!("vramfit-{}", first.id()) {
        (first, second)
    } else {
        assert_eq!(
            holder,
            format!("vramfit-{}", second.id()),
            "the holder is one of the replicas"
        );
        (second, first)
    };
    leader.kill();
    cluster
        .apply_job(mlp_job("after", 64, 8, 1, Some("10Gi")))
        .await;
    // The Lease lasts 15 s after its last renewal.
    let job = cluster
        .wait_job("after", "placement by the new leader", |j| {
            phase(j) == Phase::Placed
        })
        .await;
    assert_eq!(job.status.unwrap().placement.unwrap().gpus[0].index, 0);
    let lease = leases.get("vramfit-test").await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        Some(format!("vramfit-{}", follower.id()))
    );
}

#[tokio::test]
async fn a_waiting_job_is_predicted_again_when_its_spec_changes() {
    let cluster = TestCluster::new("respec").await;
    cluster.add_gpu_node("n1", &[("L4", 24 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster
        .apply_job(mlp_job("shrink", 64, 8, 1, Some("40Gi")))
        .await;
    cluster.wait_message("shrink", "bigger than any GPU").await;
    cluster
        .apply_job(mlp_job("shrink", 64, 8, 1, Some("16Gi")))
        .await;
    let job = cluster.wait_phase("shrink", Phase::Placed).await;
    let status = job.status.unwrap();
    assert_eq!(status.budget_bytes, Some(16 * GIB));
    assert_eq!(status.observed_generation, Some(2));
}

#[tokio::test]
async fn an_invalid_job_starts_over_once_its_spec_is_fixed() {
    let cluster = TestCluster::new("fixspec").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    let mut broken = mlp_job("fixme", 64, 8, 1, None);
    broken["spec"]["model"] =
        json!({"huggingFace": {"seqLen": 512, "config": {"model_type": "gpt2", "n_head": 5}}});
    cluster.apply_job(broken).await;
    cluster.wait_phase("fixme", Phase::Failed).await;

    cluster.apply_job(mlp_job("fixme", 64, 8, 1, None)).await;
    let job = cluster.wait_phase("fixme", Phase::Placed).await;
    let status = job.status.unwrap();
    let invalid = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Invalid")
        .unwrap();
    assert_eq!(
        (invalid.status.as_str(), invalid.observed_generation),
        ("False", Some(2))
    );
    cluster.wait_pod("fixme-a1").await;
}

#[tokio::test]
async fn an_oom_the_agent_reports_backs_the_job_off_like_an_exit_42() {
    let cluster = TestCluster::new("agentoom").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    cluster.apply_job(mlp_job("over", 64, 8, 1, None)).await;
    let first = cluster.wait_phase("over", Phase::Placed).await;
    let budget = first.status.unwrap().budget_bytes.unwrap();
    cluster.wait_pod("over-a1").await;
    cluster.kubelet_running("over-a1").await;
    cluster.wait_phase("over", Phase::Running).await;
    // The agent stopped the pod for exceeding its budget; the pod itself
    // still shows Running when the report lands.
    cluster
        .agent_reports_oom(&node, "over-a1", budget + GIB, budget)
        .await;
    let job = cluster
        .wait_job("over", "attempt 2", |j| {
            j.status.as_ref().is_some_and(|s| s.attempt == 2)
        })
        .await;
    let status = job.status.unwrap();
    assert_eq!((status.micro_batch, status.grad_accum), (Some(4), Some(16)));
    assert_eq!(status.history[0].outcome, "OutOfMemory");
    assert!(
        status.history[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("node agent")),
        "{:?}",
        status.history[0]
    );
    cluster.wait_pod("over-a2").await;
}

/// A GPT-2-small-shaped job whose micro-batch the controller chooses.
fn auto_micro_job(name: &str, global: u32, micro: u32, min_micro: u32) -> serde_json::Value {
    TrainingJob::test(name)
        .batch(global, micro)
        .min_micro(min_micro)
        .auto_micro(true)
        .model(json!({"transformer": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257,
                                      "seqLen": 1024}, "precision": "amp-bf16", "optimizer": "adamw"}))
        .template_spec(trainer_template())
        .manifest()
}

#[tokio::test]
async fn auto_micro_and_the_budget_follow_the_gpu_model_the_job_lands_on() {
    let cluster = TestCluster::new("permodel").await;
    let big = cluster.add_gpu_node("big", &[("H200", 141 * GIB)]).await;
    let small = cluster.add_gpu_node("small", &[("L4", 24 * GIB)]).await;
    let _controller = cluster.start_controller();

    // Fits the L4 at a smaller micro-batch: it goes there, with the L4's choice.
    cluster
        .apply_job(auto_micro_job("fits-l4", 64, 32, 1))
        .await;
    let job = cluster.wait_phase("fits-l4", Phase::Placed).await;
    let status = job.status.unwrap();
    let by_model = |model: &str| {
        status
            .gpu_model_budgets
            .iter()
            .find(|b| b.gpu_model == model)
            .unwrap_or_else(|| panic!("no {model} budget: {:?}", status.gpu_model_budgets))
            .clone()
    };
    let (h200, l4) = (by_model("H200"), by_model("L4"));
    assert!(l4.micro_batch < h200.micro_batch, "{l4:?} {h200:?}");
    assert!(l4.budget_bytes <= 24 * GIB);
    let placement = status.placement.clone().unwrap();
    assert_eq!(placement.node, small);
    assert_eq!(placement.gpu_model.as_deref(), Some("L4"));
    assert_eq!(placement.budget_bytes, l4.budget_bytes);
    assert_eq!(status.budget_bytes, Some(l4.budget_bytes));
    assert_eq!(status.micro_batch, Some(l4.micro_batch));
    let pod = cluster.wait_pod("fits-l4-a1").await;
    let env = env_of(&pod);
    assert_eq!(env["VRAMFIT_MICRO_BATCH"], l4.micro_batch.to_string());
    assert_eq!(env["VRAMFIT_GRAD_ACCUM"], (64 / l4.micro_batch).to_string());

    // Needs micro-batch 32 at least: only the H200 holds it, with the H200's budget.
    cluster
        .apply_job(auto_micro_job("needs-h200", 64, 32, 32))
        .await;
    let job = cluster.wait_phase("needs-h200", Phase::Placed).await;
    let status = job.status.unwrap();
    let placement = status.placement.clone().unwrap();
    assert_eq!(placement.node, big);
    assert_eq!(placement.gpu_model.as_deref(), Some("H200"));
    let h200 = status
        .gpu_model_budgets
        .iter()
        .find(|b| b.gpu_model == "H200")
        .unwrap();
    assert_eq!(
        status.gpu_model_budgets.len(),
        1,
        "no micro-batch fits the L4"
    );
    assert_eq!(
        (placement.budget_bytes, status.micro_batch),
        (h200.budget_bytes, Some(32))
    );
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_at_once_and_exits() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    let cluster = TestCluster::new("lease-lost").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let mut leader = cluster.start_logged_controller(
        &[
            "--lease-namespace",
            &cluster.namespace,
            "--lease-name",
            "taken",
            "--log-format",
            "json",
        ],
        "127.0.0.1:0",
    );
    cluster
        .apply_job(mlp_job("before", 64, 8, 1, Some("10Gi")))
        .await;
    cluster.wait_phase("before", Phase::Placed).await;

    // Another holder writes itself into the Lease, as a replica that saw it
    // expire during a partition would.
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    leases
        .patch(
            "taken",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "holderIdentity": "intruder",
                "leaseDurationSeconds": 600,
                "acquireTime": now,
                "renewTime": now,
            }})),
        )
        .await
        .expect("the Lease is taken over");
    // It notices at its next renewal (every 10 s) and exits with an error.
    let code = leader.wait_exit(Duration::from_secs(40)).await;
    assert_eq!(code, Some(1), "log:\n{}", leader.log_text());
    let log = leader.log_text();
    assert!(log.contains("lost leadership"), "{log}");
    // The log is JSON, one decision a line; what follows the last one is
    // the process's final error.
    let (log_lines, exit_error) = log.split_at(log.find("\nError: ").unwrap_or(log.len()));
    assert!(exit_error.contains("lost leadership"), "{log}");
    let lines: Vec<serde_json::Value> = log_lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let placed = lines
        .iter()
        .find(|l| l["message"] == "decision" && l["decision"] == "placed" && l["job"] == "before")
        .unwrap_or_else(|| panic!("no placement decision in {log}"));
    assert_eq!(placed["node"], cluster.node_name("n1"));
    assert_eq!(placed["gpus"], "0");
    assert!(
        lines
            .iter()
            .any(|l| l["level"] == "ERROR" && l["message"] == "controller stopping"),
        "{log}"
    );
    // The intruder's hold stands: the stopped leader did not release it.
    let lease = leases.get("taken").await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("intruder")
    );
}

#[tokio::test]
async fn a_metrics_address_in_use_fails_the_start_with_a_clear_error() {
    let cluster = TestCluster::new("metrics-taken").await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut controller = cluster.start_logged_controller(&["--no-leader-election"], &addr);
    let code = controller.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(code, Some(1));
    let log = controller.log_text();
    assert!(log.contains(&format!("--metrics-addr {addr}")), "{log}");
}

/// Labels the test's namespace to enforce Pod Security `level`.
async fn enforce_pod_security(cluster: &TestCluster, level: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(cluster.client.clone());
    let patch = json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}});
    namespaces
        .patch(
            &cluster.namespace,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("labelling the namespace");
}

#[tokio::test]
async fn a_pod_the_namespace_refuses_fails_the_job_frees_its_gpu_and_waits_for_a_change() {
    let cluster = TestCluster::new("podsec").await;
    enforce_pod_security(&cluster, "baseline").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();

    let mut host = mlp_job("host", 64, 8, 1, Some("60Gi"));
    host["spec"]["template"]["spec"]["volumes"] =
        json!([{"name": "data", "hostPath": {"path": "/srv/data"}}]);
    cluster.apply_job(host.clone()).await;
    let failed = cluster.wait_phase("host", Phase::Failed).await;
    let status = failed.status.unwrap();
    let rejected = status
        .conditions
        .iter()
        .find(|c| c.type_ == "PodRejected")
        .expect("a PodRejected condition");
    assert_eq!(
        (rejected.status.as_str(), rejected.reason.as_str()),
        ("True", "Forbidden")
    );
    assert!(
        rejected.message.contains("hostPath"),
        "the API server's words: {}",
        rejected.message
    );
    assert!(cluster.pod_names().await.is_empty());

    // Its 60 GiB are free at once: a job that needs them is placed, and the
    // controller's own pod (stats in an emptyDir) passes baseline.
    cluster
        .apply_job(mlp_job("plain", 64, 8, 1, Some("60Gi")))
        .await;
    cluster.wait_phase("plain", Phase::Placed).await;
    cluster.wait_pod("plain-a1").await;

    // Not tried again while the job is unchanged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cluster.event_notes("host", "PodRejected").await.len(), 1);
    assert_eq!(cluster.pod_names().await, vec!["plain-a1".to_string()]);

    // Fixed, it starts over, and waits for room behind the job that took its place.
    host["spec"]["template"]["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    cluster.apply_job(host).await;
    let waiting = cluster.wait_message("host", "waiting for room").await;
    let status = waiting.status.unwrap();
    assert_eq!(status.phase, Phase::Pending);
    let rejected = status
        .conditions
        .iter()
        .find(|c| c.type_ == "PodRejected")
        .unwrap();
    assert_eq!(rejected.status, "False");
}

#[tokio::test]
async fn a_template_that_meets_restricted_gets_its_pod_in_a_restricted_namespace() {
    let cluster = TestCluster::new("restricted").await;
    enforce_pod_security(&cluster, "restricted").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    let mut job = mlp_job("tight", 64, 8, 1, None);
    job["spec"]["template"]["spec"]["securityContext"] =
        json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"] = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]}
    });
    cluster.apply_job(job).await;
    // Everything the controller adds (the stats emptyDir, variables, the
    // termination message policy) passes restricted.
    cluster.wait_pod("tight-a1").await;
    let placed = cluster.wait_phase("tight", Phase::Placed).await;
    assert!(
        placed
            .status
            .unwrap()
            .conditions
            .iter()
            .all(|c| c.type_ != "PodRejected")
    );
}

#[tokio::test]
async fn status_reads_the_cluster_named_by_kubeconfig_and_context() {
    let cluster = TestCluster::new("statuscfg").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let kubeconfig = crate::controlplane::kubeconfig();
    let status = |extra: &[&str]| {
        std::process::Command::new(crate::driver::vramfit_bin())
            .args([
                "status",
                "-o",
                "json",
                "-n",
                &cluster.namespace,
                "--kubeconfig",
            ])
            .arg(kubeconfig)
            .args(extra)
            .env_remove("KUBECONFIG")
            .env("HOME", "/nonexistent")
            .output()
            .expect("running vramfit status")
    };
    let out = status(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"statuscfg-n1\""), "{text}");
    // A context the file lacks is an error that names it.
    let out = status(&["--context", "elsewhere"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("elsewhere"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The helper's line for a profile (docs/profile-format.md, "Automatic
/// profiling"): `vramfit-profile: ` and the base64 of its gzip.
fn profile_line(json: &str) -> String {
    use base64::Engine;
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(json.as_bytes()).unwrap();
    format!(
        "vramfit-profile: {}",
        base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap())
    )
}

/// A job whose model the analytic path does not describe (`model.auto`)
/// goes through `Profiling`: its own template runs once without a GPU with
/// `VRAMFIT_PHASE=profile`, the line its helper leaves in the termination
/// message becomes a ConfigMap owned by the job, and the job is predicted
/// from it and placed. A second job of the same kind finds the ConfigMap and
/// skips the phase; a capture that fails fails its job with the helper's words.
#[tokio::test]
async fn an_auto_job_is_profiled_on_a_cpu_then_placed_and_the_next_of_its_kind_skips_the_phase() {
    let cluster = TestCluster::new("autoprof").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_controller();
    let auto = |name: &str| {
        let mut job = mlp_job(name, 64, 8, 1, None);
        job["spec"]["model"] = json!({"auto": {}, "precision": "fp32", "optimizer": "adamw"});
        job
    };
    cluster.apply_job(auto("first")).await;
    let job = cluster.wait_phase("first", Phase::Profiling).await;
    assert!(
        job.status
            .unwrap()
            .message
            .unwrap()
            .contains("first-profile-g1"),
        "the status names the pod"
    );
    let pod = cluster.wait_pod("first-profile-g1").await;
    let env = env_of(&pod);
    assert_eq!(
        env.get("VRAMFIT_PHASE").map(String::as_str),
        Some("profile")
    );
    assert_eq!(
        env.get("VRAMFIT_MICRO_BATCH").map(String::as_str),
        Some("8")
    );
    let spec = pod.spec.unwrap();
    assert_eq!(spec.node_name, None);
    assert_eq!(
        spec.containers[0].resources.as_ref().unwrap().requests,
        None
    );
    assert!(
        pod.metadata
            .annotations
            .unwrap_or_default()
            .keys()
            .all(|k| !k.starts_with("cdi-devices.") && !k.starts_with("vramfit.dev/"))
    );
    // 6 GiB of weights alive to the end and a 2 GiB activation: the
    // prediction is the profile's, not any model's.
    let profile = r#"{"format":"vramfit.profile/v1","microBatch":8,"sizes":[6442450944,2147483648],"events":[0,1,-2]}"#;
    cluster
        .kubelet_exit("first-profile-g1", 0, &profile_line(profile))
        .await;
    let job = cluster.wait_phase("first", Phase::Placed).await;
    let status = job.status.unwrap();
    assert_eq!(status.prediction_source.as_deref(), Some("profile"));
    let predicted = status.predicted_bytes.unwrap();
    assert!(
        (8 * GIB..10 * GIB).contains(&predicted),
        "the profile's 8 GiB plus the context: {predicted}"
    );
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let stored = maps
        .list(&kube::api::ListParams::default().labels("vramfit.dev/kind=allocation-profile"))
        .await
        .unwrap();
    assert_eq!(stored.items.len(), 1);
    assert_eq!(
        stored.items[0].data.as_ref().unwrap()["profile.json"],
        profile
    );
    assert_eq!(
        stored.items[0].metadata.owner_references.as_ref().unwrap()[0].name,
        "first"
    );
    cluster.kubelet_removes_deleted("first-profile-g1").await;

    // The same kind again: no profiling pod, the same prediction.
    cluster.apply_job(auto("second")).await;
    let second = cluster.wait_phase("second", Phase::Placed).await;
    assert_eq!(second.status.unwrap().predicted_bytes, Some(predicted));
    assert!(
        !cluster
            .pod_names()
            .await
            .iter()
            .any(|p| p.starts_with("second-profile")),
        "{:?}",
        cluster.pod_names().await
    );

    // Another kind whose capture fails: Failed with the helper's words.
    let mut third = auto("third");
    third["spec"]["batch"]["micro"] = json!(4);
    cluster.apply_job(third).await;
    cluster.wait_pod("third-profile-g1").await;
    cluster
        .kubelet_exit(
            "third-profile-g1",
            3,
            "vramfit-profile-error: no vramfit.Step in the script",
        )
        .await;
    let failed = cluster.wait_phase("third", Phase::Failed).await;
    let message = failed.status.unwrap().message.unwrap();
    assert!(
        message.contains(
            "automatic profiling failed: the capture failed: no vramfit.Step in the script"
        ),
        "{message}"
    );
}

/// A GPT-2 job of global batch 64 at 16x4 (31.9 GiB per GPU on an
/// H100-80GB; 8x8 needs 16.8 GiB), `spec.batch.elastic` as given.
fn gpt2_job(name: &str, elastic: Option<bool>) -> serde_json::Value {
    let job = TrainingJob::test(name)
        .batch(64, 16)
        .model(
            json!({"huggingFace": {"seqLen": 1024, "config": {"model_type": "gpt2"}},
            "precision": "amp-bf16", "optimizer": "adamw"}),
        )
        .template_spec(trainer_template());
    match elastic {
        Some(elastic) => job.elastic(elastic),
        None => job,
    }
    .manifest()
}

/// The jobs' (micro-batch, accumulation) from status, whether placed
/// elastically, by name.
fn shapes_of(jobs: &[TrainingJob]) -> Vec<(String, Option<String>, bool)> {
    jobs.iter()
        .map(|j| {
            let s = j.status.as_ref().unwrap();
            (
                j.metadata.name.clone().unwrap(),
                s.batch_shape.clone(),
                s.placement.as_ref().is_some_and(|p| p.elastic.is_some()),
            )
        })
        .collect()
}

#[tokio::test]
async fn elastic_jobs_start_together_with_a_smaller_shape_where_plain_ones_run_one_after_the_other()
{
    // One 56 GiB GPU: one 16x4 (31.9 GiB) fits, two do not; 16x4 and 8x8
    // (16.8 GiB) do.
    let gpu = [("H100-80GB", 56 * GIB)];
    let elastic = TestCluster::new("elastic-on").await;
    elastic.add_gpu_node("n1", &gpu).await;
    // `a` says elastic itself, `b` takes the controller's default.
    let _controller = elastic.start_logged_controller(
        &["--no-leader-election", "--elastic-default"],
        "127.0.0.1:0",
    );
    elastic.apply_job(gpt2_job("a", Some(true))).await;
    elastic.apply_job(gpt2_job("b", None)).await;
    let a = elastic.wait_phase("a", Phase::Placed).await;
    let b = elastic.wait_phase("b", Phase::Placed).await;
    // Whichever the cycle placed first took 16x4, the other 8x8.
    let mut shapes = shapes_of(&[a.clone(), b.clone()]);
    shapes.sort_by_key(|(_, shape, _)| shape.clone());
    assert_eq!(
        shapes
            .iter()
            .map(|(_, shape, elastic)| (shape.as_deref(), *elastic))
            .collect::<Vec<_>>(),
        [(Some("16x4"), false), (Some("8x8"), true)],
        "{shapes:?}"
    );
    let smaller = if shapes[1].0 == "a" { a } else { b };
    let name = smaller.metadata.name.clone().unwrap();
    let status = smaller.status.unwrap();
    let placement = status.placement.clone().unwrap();
    let figures = placement.elastic.clone().unwrap();
    assert_eq!(
        (
            status.micro_batch,
            status.grad_accum,
            status.preferred_micro_batch
        ),
        (Some(8), Some(8), Some(16))
    );
    assert_eq!(placement.micro_batch, Some(8));
    assert_eq!(
        (figures.preferred_micro_batch, figures.preferred_grad_accum),
        (16, 4)
    );
    assert!(figures.preferred_budget_bytes > 28 * GIB && placement.budget_bytes < 28 * GIB);
    assert_eq!(status.budget_bytes, Some(placement.budget_bytes));
    assert_eq!(figures.expected_wait_seconds, None);
    // The event with the figures.
    let mut notes = Vec::new();
    for _ in 0..50 {
        notes = elastic.event_notes(&name, "ElasticShape").await;
        if !notes.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(notes.len(), 1, "{notes:?}");
    let want = format!(
        "preferred 16x4 needs {} per GPU, placed 8x8 in {}, predicted {:.2}x step time, no expected end",
        vramfit::quantity::human_bytes(figures.preferred_budget_bytes),
        vramfit::quantity::human_bytes(placement.budget_bytes),
        figures.relative_step_time
    );
    assert_eq!(notes[0], want);
    assert!(figures.relative_step_time > 1.0);
    // The pod runs the smaller micro-batch with more accumulation, the
    // global batch kept.
    let pod = elastic.wait_pod(&format!("{name}-a1")).await;
    let env = env_of(&pod);
    assert_eq!(
        (
            env["VRAMFIT_MICRO_BATCH"].as_str(),
            env["VRAMFIT_GRAD_ACCUM"].as_str(),
            env["VRAMFIT_GLOBAL_BATCH"].as_str()
        ),
        ("8", "8", "64")
    );

    // The same two jobs, not elastic: one runs, the other waits for it.
    let plain = TestCluster::new("elastic-off").await;
    plain.add_gpu_node("n1", &gpu).await;
    let _controller = plain.start_controller();
    plain.apply_job(gpt2_job("a", None)).await;
    plain.apply_job(gpt2_job("b", Some(false))).await;
    let (placed, waiting) = loop {
        let a = plain.jobs().get("a").await.unwrap();
        let b = plain.jobs().get("b").await.unwrap();
        let phases = (phase(&a), phase(&b));
        let waits = |j: &TrainingJob| {
            j.status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.contains("waiting for room"))
        };
        match phases {
            (Phase::Placed, Phase::Pending) if waits(&b) => break (a, b),
            (Phase::Pending, Phase::Placed) if waits(&a) => break (b, a),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert_eq!(
        shapes_of(std::slice::from_ref(&placed))[0].1.as_deref(),
        Some("16x4")
    );
    let placed_name = placed.metadata.name.clone().unwrap();
    let waiting_name = waiting.metadata.name.clone().unwrap();
    // A few cycles later the second still waits, with no smaller shape.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = plain.jobs().get(&waiting_name).await.unwrap();
    assert_eq!(phase(&still), Phase::Pending);
    assert!(still.status.unwrap().elastic_shapes.is_empty());
    assert!(
        plain
            .event_notes(&waiting_name, "ElasticShape")
            .await
            .is_empty()
    );
    // The first ends; the second runs after it, at its own shape.
    let pod = format!("{placed_name}-a1");
    plain.wait_pod(&pod).await;
    plain.kubelet_running(&pod).await;
    plain.kubelet_exit(&pod, 0, "").await;
    plain.wait_phase(&placed_name, Phase::Succeeded).await;
    let second = plain.wait_phase(&waiting_name, Phase::Placed).await;
    let status = second.status.unwrap();
    assert_eq!(status.batch_shape.as_deref(), Some("16x4"));
    assert!(status.placement.unwrap().elastic.is_none());
    let env = env_of(&plain.wait_pod(&format!("{waiting_name}-a1")).await);
    assert_eq!(
        (
            env["VRAMFIT_MICRO_BATCH"].as_str(),
            env["VRAMFIT_GRAD_ACCUM"].as_str()
        ),
        ("16", "4")
    );
}

/// The helper's progress report of a process, counted now.
fn progress_now(steps: u64, total: u64, seconds_per_step: f64) -> vramfit::api::ReportedProgress {
    vramfit::api::ReportedProgress {
        steps,
        total_steps: Some(total),
        seconds_per_step: Some(seconds_per_step),
        time: k8s_openapi::jiff::Timestamp::now().to_string(),
    }
}

#[tokio::test]
async fn an_elastic_job_waits_for_a_running_job_that_ends_soon_and_starts_smaller_when_its_end_is_far()
 {
    // One 56 GiB GPU: a running 16x4 (31.9 GiB) leaves room for 8x8
    // (16.8 GiB), not for another 16x4.
    let cluster = TestCluster::new("elastic-wait").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 56 * GIB)]).await;
    let _controller = cluster.start_logged_controller(&["--no-leader-election"], "127.0.0.1:0");
    // An expected duration the API server does not accept.
    let mut bad = gpt2_job("bad", Some(true));
    bad["spec"]["expectedDuration"] = json!("90 minutes");
    let refused = cluster
        .jobs()
        .create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 422 && e.message.contains("expectedDuration")),
        "{refused:?}"
    );

    cluster.apply_job(gpt2_job("running", Some(false))).await;
    cluster.wait_phase("running", Phase::Placed).await;
    cluster.wait_pod("running-a1").await;
    cluster.kubelet_running("running-a1").await;
    // Its process reports 10 steps of 3 s left: it ends in 30 s.
    cluster
        .agent_reports_progress(
            &node,
            0,
            "running-a1",
            (16, 4),
            progress_now(990, 1000, 3.0),
        )
        .await;
    let running = cluster
        .wait_job("running", "its progress", |j| {
            j.status
                .as_ref()
                .and_then(|s| s.progress.as_ref())
                .is_some_and(|p| p.expected_end.is_some())
        })
        .await;
    let progress = running.status.unwrap().progress.unwrap();
    assert_eq!(
        (
            progress.attempt,
            progress.done.as_deref(),
            progress.seconds_per_step,
            progress.source.as_deref()
        ),
        (1, Some("990/1000"), Some(3.0), Some("progress"))
    );
    let end =
        vramfit::controller::progress::unix_seconds(progress.expected_end.as_deref().unwrap())
            .unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond() as f64 / 1000.0;
    assert!((end - now - 30.0).abs() < 10.0, "ends in {} s", end - now);

    // Two hours of work at 16x4: running 8x8 slower costs more than 30 s of
    // waiting, so the job waits for the preferred shape.
    let mut waiting = gpt2_job("waiting", Some(true));
    waiting["spec"]["expectedDuration"] = json!("2h");
    cluster.apply_job(waiting).await;
    let job = cluster
        .wait_job("waiting", "waiting for room", |j| {
            j.status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.contains("waiting for room"))
        })
        .await;
    let status = job.status.unwrap();
    let smaller = status
        .elastic_shapes
        .iter()
        .find(|s| s.micro_batch == 8)
        .expect("the 8x8 shape");
    assert!(
        7200.0 * (smaller.relative_step_time - 1.0) > 40.0,
        "the premise: 8x8 costs more than the wait ({})",
        smaller.relative_step_time
    );
    // A few cycles later it still waits.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let still = cluster.jobs().get("waiting").await.unwrap();
    assert_eq!(phase(&still), Phase::Pending, "{:?}", still.status);

    // The running job's process now reports a run of days: 8x8 now wins.
    cluster
        .agent_reports_progress(
            &node,
            0,
            "running-a1",
            (16, 4),
            progress_now(10, 100_000, 3.0),
        )
        .await;
    let placed = cluster.wait_phase("waiting", Phase::Placed).await;
    let status = placed.status.unwrap();
    assert_eq!(status.batch_shape.as_deref(), Some("8x8"));
    let figures = status.placement.unwrap().elastic.unwrap();
    let wait = figures.expected_wait_seconds.expect("a known wait");
    assert!(wait > 100_000.0, "expected wait {wait}");
    let running = cluster.jobs().get("running").await.unwrap();
    let progress = running.status.unwrap().progress.unwrap();
    assert_eq!(progress.done.as_deref(), Some("10/100000"));
}
