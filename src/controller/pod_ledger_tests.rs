use super::*;
use crate::api::{AssignedGpu, Phase};
use crate::controller::pod::training_pod;
use crate::job::backoff::BatchShape;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

const GIB: u64 = 1 << 30;

fn job(name: &str) -> TrainingJob {
    TrainingJob::test(name)
        .template_spec(json!({"containers": [
            {"name": "t", "image": "i",
             "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}},
            {"name": "side", "image": "i",
             "resources": {"requests": {"cpu": "0.5"}}}]}))
        .budget(20 * GIB)
        .build()
}

fn placement(attempt: u32) -> PlacementStatus {
    PlacementStatus {
        compute_percent: None,
        node: "n1".into(),
        gpus: vec![
            AssignedGpu {
                index: 3,
                uuid: "GPU-3".into(),
            },
            AssignedGpu {
                index: 1,
                uuid: "GPU-1".into(),
            },
        ],
        budget_bytes: 20 * GIB,
        memory_fraction: 0.14,
        attempt,
        gpu_model: Some("H200".into()),
        micro_batch: Some(4),
        elastic: None,
    }
}

/// The pod the controller creates for `job`'s `attempt`, as the API server
/// returns it (with a UID).
fn pod_of(job: &TrainingJob, attempt: u32) -> Pod {
    let shape = BatchShape { micro: 8, accum: 1 };
    let mut pod = training_pod(job, &placement(attempt), shape, attempt).unwrap();
    pod.metadata.uid = Some(format!("pod-{}", pod.metadata.name.as_deref().unwrap()));
    pod
}

fn ended(mut pod: Pod, phase: &str) -> Pod {
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    pod
}

fn deleting(mut pod: Pod) -> Pod {
    pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    pod
}

fn read(jobs: &[TrainingJob], pods: &[Pod], assigned: &[(&str, u32)]) -> PodLedger {
    let jobs: Vec<&TrainingJob> = jobs.iter().collect();
    let pods: Vec<&Pod> = pods.iter().collect();
    read_pods(&jobs, &pods, |uid, attempt| {
        assigned.iter().any(|(u, a)| *u == uid && *a == attempt)
    })
}

#[test]
fn a_training_pod_carries_its_placement_owner_attempt_and_requests() {
    let job = job("gpt2");
    let read = pod_placement(&pod_of(&job, 2)).expect("a training pod has a placement");
    assert_eq!(read.placement, placement(2));
    assert_eq!(
        (
            read.namespace.as_str(),
            read.pod.as_str(),
            read.job.as_str(),
            read.job_uid.as_str()
        ),
        ("ml", "gpt2-a2", "gpt2", "uid-gpt2")
    );
    assert_eq!(read.attempt, 2);
    assert_eq!(read.requests, (2000, 2 * GIB));
    assert!(!read.ended && !read.deleting);
    assert!(
        pod_placement(&ended(pod_of(&job, 1), "Succeeded"))
            .unwrap()
            .ended
    );
    assert!(
        pod_placement(&ended(pod_of(&job, 1), "Failed"))
            .unwrap()
            .ended
    );
    assert!(
        !pod_placement(&ended(pod_of(&job, 1), "Running"))
            .unwrap()
            .ended
    );
    assert!(pod_placement(&deleting(pod_of(&job, 1))).unwrap().deleting);
}

#[test]
fn a_pod_without_placement_attempt_or_owning_job_is_not_read() {
    let job = job("gpt2");
    type Change = fn(&mut Pod);
    let cases: [(&str, Change); 5] = [
        ("no placement annotation", |p| {
            p.metadata
                .annotations
                .as_mut()
                .unwrap()
                .remove(PLACEMENT_ANNOTATION);
        }),
        ("a placement that is not JSON", |p| {
            p.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(PLACEMENT_ANNOTATION.into(), "{".into());
        }),
        ("no attempt label", |p| {
            p.metadata.labels.as_mut().unwrap().remove(ATTEMPT_LABEL);
        }),
        ("owned by something else", |p| {
            p.metadata.owner_references.as_mut().unwrap()[0].kind = "Job".into();
        }),
        ("not the controller owner", |p| {
            p.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
        }),
    ];
    for (case, change) in cases {
        let mut pod = pod_of(&job, 1);
        change(&mut pod);
        assert_eq!(pod_placement(&pod), None, "{case}");
    }
}

#[test]
fn the_current_attempts_pod_running_or_ended_is_unrecorded_only_while_status_and_cycle_lack_it() {
    let live = job("a");
    let pod = pod_of(&live, 1);
    let unrecorded = vec![("uid-a".to_string(), 1, placement(1))];
    assert_eq!(
        read(std::slice::from_ref(&live), std::slice::from_ref(&pod), &[]).unrecorded,
        unrecorded
    );

    let mut placed = live.clone();
    placed.status.as_mut().unwrap().placement = Some(placement(1));
    let mut finished = live.clone();
    finished.status.as_mut().unwrap().phase = Phase::Succeeded;
    let mut moved_on = live.clone();
    moved_on.status.as_mut().unwrap().attempt = 2;
    let mut being_deleted = live.clone();
    being_deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let cases = [
        ("status records it", placed, pod.clone(), vec![]),
        ("the job finished", finished, pod.clone(), vec![]),
        ("an earlier attempt's pod", moved_on, pod.clone(), vec![]),
        (
            "the job is being deleted",
            being_deleted,
            pod.clone(),
            vec![],
        ),
        // Its attempt ran: the job follows the pod to its end rather than
        // wait for room to run the attempt again.
        (
            "the pod failed",
            live.clone(),
            ended(pod.clone(), "Failed"),
            unrecorded.clone(),
        ),
        (
            "the pod succeeded",
            live.clone(),
            ended(pod.clone(), "Succeeded"),
            unrecorded.clone(),
        ),
        // The controller ended the attempt and moved past it.
        (
            "the pod's deletion was asked for",
            live.clone(),
            deleting(pod.clone()),
            vec![],
        ),
    ];
    for (case, job, pod, expected) in cases {
        let ledger = read(&[job], &[pod], &[]);
        assert_eq!(ledger.unrecorded, expected, "{case}");
        assert!(
            ledger.orphaned.is_empty() && ledger.to_delete.is_empty(),
            "{case}"
        );
    }
    let ledger = read(&[live], &[pod], &[("uid-a", 1)]);
    assert!(
        ledger.unrecorded.is_empty(),
        "the cycle holds it, or this process wrote a later attempt"
    );
}

#[test]
fn a_gone_jobs_pod_holds_its_memory_until_it_ends_and_is_deleted_once() {
    let gone = job("gone");
    let pod = pod_of(&gone, 1);
    let held = Placement {
        gpu_compute: 0,
        job_id: "ml/gone-a1 (pod of a deleted job)".into(),
        node: "n1".into(),
        gpu_indices: vec![1, 3],
        gpu_budget: 20 * GIB,
        cpu_milli: 2000,
        memory_bytes: 2 * GIB,
    };
    let orphan = OrphanPod {
        namespace: "ml".into(),
        pod: "gone-a1".into(),
        pod_uid: "pod-gone-a1".into(),
        job: "gone".into(),
        job_uid: "uid-gone".into(),
    };
    // A live job of the same name is another job: the pod is still orphaned.
    let mut same_name = job("gone");
    same_name.metadata.uid = Some("uid-new".into());
    let cases = [
        (
            "running",
            vec![],
            pod.clone(),
            vec![held.clone()],
            vec![orphan.clone()],
        ),
        (
            "a new job of the same name",
            vec![same_name],
            pod.clone(),
            vec![held.clone()],
            vec![orphan.clone()],
        ),
        (
            "being deleted",
            vec![],
            deleting(pod.clone()),
            vec![held],
            vec![],
        ),
        (
            "ended",
            vec![],
            ended(pod.clone(), "Succeeded"),
            vec![],
            vec![orphan],
        ),
    ];
    for (case, jobs, pod, orphaned, to_delete) in cases {
        let ledger = read(&jobs, &[pod], &[]);
        assert_eq!(ledger.orphaned, orphaned, "{case}");
        assert_eq!(ledger.to_delete, to_delete, "{case}");
        assert!(ledger.unrecorded.is_empty(), "{case}");
    }
}

/// A create that finds the attempt's pod already there (made by a controller
/// stopped with its create in flight) adopts the pod's placement when it is
/// another one; the same placement, another attempt's pod, or a pod without
/// a placement leaves nothing to adopt.
#[test]
fn an_existing_pod_of_another_placement_is_adopted_on_create() {
    let job = job("gpt2");
    let existing = pod_of(&job, 1);
    assert_eq!(other_placement(&existing, &placement(1)), None, "the same");
    let mut ours = placement(1);
    ours.gpus.truncate(1);
    ours.node = "n2".into();
    assert_eq!(other_placement(&existing, &ours), Some(placement(1)));
    let mut other_attempt = ours.clone();
    other_attempt.attempt = 2;
    assert_eq!(other_placement(&existing, &other_attempt), None);
    let mut bare = existing.clone();
    bare.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(PLACEMENT_ANNOTATION);
    assert_eq!(other_placement(&bare, &ours), None);
}

#[test]
fn the_cached_pod_keeps_what_the_controller_reads_and_drops_the_rest() {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    let job = job("j");
    let mut full = pod_of(&job, 2);
    let started = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
    full.status = Some(PodStatus {
        phase: Some("Failed".into()),
        start_time: Some(started.clone()),
        container_statuses: Some(vec![ContainerStatus {
            name: "t".into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 42,
                    message: Some("CUDA out of memory".into()),
                    started_at: Some(started),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let mut slim = full.clone();
    slim_for_cache(&mut slim);
    // What the cache's readers take from a pod is the same.
    assert_eq!(pod_placement(&slim), pod_placement(&full));
    assert_eq!(pod_placement(&slim).unwrap().requests, (2000, 2 * GIB));
    assert_eq!(
        crate::job::exit::pod_outcome(&slim),
        crate::job::exit::pod_outcome(&full)
    );
    assert_eq!(
        crate::controller::progress::pod_started(&slim),
        crate::controller::progress::pod_started(&full)
    );
    assert_eq!(slim.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));
    // The environment, volumes, commands and images are not kept.
    let full_spec = full.spec.as_ref().unwrap();
    assert!(full_spec.volumes.is_some() && full_spec.containers[0].env.is_some());
    let spec = slim.spec.as_ref().unwrap();
    assert!(spec.volumes.is_none());
    assert!(
        spec.containers
            .iter()
            .all(|c| c.env.is_none() && c.image.is_none() && c.volume_mounts.is_none())
    );
    let size = |p: &Pod| serde_json::to_string(p).unwrap().len();
    assert!(
        size(&slim) * 2 < size(&full),
        "{} of {}",
        size(&slim),
        size(&full)
    );
}
