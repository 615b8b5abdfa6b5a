use super::*;
use crate::api::AssignedGpu;
use crate::controller::pod::training_pod;
use crate::controller::scheduler::{Assignments, Verdict};
use crate::job::backoff::BatchShape;
use serde_json::json;
use std::collections::BTreeMap;

const GIB: u64 = 1 << 30;

fn placement(attempt: u32, gpu: u32) -> PlacementStatus {
    PlacementStatus {
        compute_percent: None,
        node: "n1".into(),
        gpus: vec![AssignedGpu {
            index: gpu,
            uuid: format!("GPU-{gpu}"),
        }],
        budget_bytes: 10 * GIB,
        memory_fraction: 0.1,
        attempt,
        gpu_model: None,
        micro_batch: None,
        elastic: None,
    }
}

fn template() -> serde_json::Value {
    json!({"containers": [{"name": "t", "image": "i",
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]})
}

/// A predicted job waiting for room (attempt `attempt`).
fn waiting(name: &str, attempt: u32) -> TrainingJob {
    TrainingJob::test(name)
        .template_spec(template())
        .status_fields(
            json!({"phase": if attempt > 1 { "Retrying" } else { "Pending" },
            "attempt": attempt, "budgetBytes": 10 * GIB}),
        )
        .build()
}

/// A job whose status records attempt `attempt` on GPU `gpu`.
fn running(name: &str, attempt: u32, gpu: u32) -> TrainingJob {
    TrainingJob::test(name)
        .template_spec(template())
        .status_fields(
            json!({"phase": "Running", "attempt": attempt, "budgetBytes": 10 * GIB,
            "placement": serde_json::to_value(placement(attempt, gpu)).unwrap()}),
        )
        .build()
}

fn finished(name: &str) -> TrainingJob {
    TrainingJob::test(name)
        .template_spec(template())
        .status_fields(
            json!({"phase": "Succeeded", "attempt": 1, "budgetBytes": 10 * GIB,
            "placement": serde_json::to_value(placement(1, 0)).unwrap()}),
        )
        .build()
}

/// The pod of `job`'s attempt on GPU `gpu`, with a UID.
fn pod(job: &TrainingJob, attempt: u32, gpu: u32) -> Pod {
    let shape = BatchShape { micro: 8, accum: 1 };
    let mut pod = training_pod(job, &placement(attempt, gpu), shape, attempt).unwrap();
    pod.metadata.uid = Some(format!("pod-{}", pod.metadata.name.as_deref().unwrap()));
    pod
}

fn ended(mut pod: Pod) -> Pod {
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    pod
}

fn deleting(mut pod: Pod) -> Pod {
    pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-12-04T00:00:00Z".parse().unwrap(),
    ));
    pod
}

/// One change the caches or the cycle see.
enum Step {
    /// A job added or changed (a new version).
    Job(Box<TrainingJob>),
    /// The same job object again, under a new `Arc` with nothing changed.
    Touch(&'static str),
    DeleteJob(&'static str),
    Pod(Box<Pod>),
    DeletePod(String),
    /// The cycle places the job's attempt.
    Assign(&'static str, u32, u32),
    /// A reconcile forgets the job's assignments.
    Forget(&'static str),
    /// This process wrote a status of the job's attempt (the cache lags it).
    Written(&'static str, u32),
}

/// The caches, the assignments and the ledger that follows them.
#[derive(Default)]
struct World {
    jobs: BTreeMap<String, Arc<TrainingJob>>,
    pods: BTreeMap<String, Arc<Pod>>,
    assignments: Assignments,
    ledger: Ledger,
}

impl World {
    fn apply(&mut self, step: Step) {
        match step {
            Step::Job(job) => {
                self.jobs
                    .insert(job.metadata.name.clone().unwrap(), Arc::new(*job));
            }
            Step::Touch(name) => {
                let copy = (*self.jobs[name]).clone();
                self.jobs.insert(name.into(), Arc::new(copy));
            }
            Step::DeleteJob(name) => {
                self.jobs.remove(name);
            }
            Step::Pod(pod) => {
                self.pods
                    .insert(pod.metadata.name.clone().unwrap(), Arc::new(*pod));
            }
            Step::DeletePod(name) => {
                self.pods.remove(&name);
            }
            Step::Assign(name, attempt, gpu) => {
                self.assignments.record(
                    &format!("uid-{name}"),
                    attempt,
                    Verdict::Place(placement(attempt, gpu)),
                );
            }
            Step::Forget(name) => self.assignments.forget(&format!("uid-{name}")),
            Step::Written(name, attempt) => self
                .assignments
                .forget_before(&format!("uid-{name}"), attempt),
        }
    }

    /// Syncs the ledger and checks it against a full rebuild.
    fn sync(&mut self) -> Snapshot {
        let jobs: Vec<Arc<TrainingJob>> = self.jobs.values().cloned().collect();
        let pods: Vec<Arc<Pod>> = self.pods.values().cloned().collect();
        let mut locked = self.assignments.lock();
        self.ledger.sync(&jobs, &pods, &mut locked);
        let job_refs: Vec<&TrainingJob> = jobs.iter().map(|j| j.as_ref()).collect();
        let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        let full = full_rebuild(&job_refs, &pod_refs, &locked);
        let kept = self.ledger.snapshot();
        assert_eq!(kept, full, "the kept ledger differs from a full rebuild");
        let committed: u64 = full.placements.iter().map(held_bytes).sum();
        assert_eq!(self.ledger.committed_bytes(), committed);
        let waiting: Vec<String> = self
            .ledger
            .waiting(&jobs)
            .iter()
            .map(|j| job_id(j))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(waiting, full.waiting);
        kept
    }
}

/// What one snapshot shows, in short: the placement ids, the waiting jobs,
/// the unrecorded pods' jobs and the pods to delete.
fn short(snapshot: &Snapshot) -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
    (
        snapshot
            .placements
            .iter()
            .map(|p| p.job_id.clone())
            .collect(),
        snapshot.waiting.clone(),
        snapshot
            .unrecorded
            .iter()
            .map(|(uid, attempt, _)| format!("{uid}#{attempt}"))
            .collect(),
        snapshot.to_delete.iter().map(|p| p.pod.clone()).collect(),
    )
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

type Expected = (
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
);

/// Runs `rounds` (each a list of steps, then a sync) and compares each
/// sync with the full rebuild and with what the table expects.
fn run(rounds: Vec<(Vec<Step>, Expected)>) {
    let mut world = World::default();
    for (i, (steps, (placed, waiting, unrecorded, to_delete))) in rounds.into_iter().enumerate() {
        for step in steps {
            world.apply(step);
        }
        let snapshot = world.sync();
        assert_eq!(
            short(&snapshot),
            (
                names(placed),
                names(waiting),
                names(unrecorded),
                names(to_delete)
            ),
            "round {i}"
        );
    }
}

#[test]
fn a_job_waits_then_its_assignment_then_its_status_holds_its_room() {
    run(vec![
        (
            vec![Step::Job(Box::new(waiting("a", 1)))],
            (&[], &["uid-a"], &[], &[]),
        ),
        (vec![Step::Assign("a", 1, 0)], (&["ml/a"], &[], &[], &[])),
        // The status write lands: the assignment is dropped, the status holds.
        (
            vec![Step::Job(Box::new(running("a", 1, 0)))],
            (&["ml/a"], &[], &[], &[]),
        ),
        // Unchanged objects under new `Arc`s change nothing.
        (vec![Step::Touch("a")], (&["ml/a"], &[], &[], &[])),
        (
            vec![Step::Job(Box::new(finished("a")))],
            (&[], &[], &[], &[]),
        ),
    ]);
}

#[test]
fn an_assignment_goes_when_the_job_moves_to_its_next_attempt_or_is_forgotten() {
    run(vec![
        (
            vec![
                Step::Job(Box::new(waiting("a", 1))),
                Step::Assign("a", 1, 0),
            ],
            (&["ml/a"], &[], &[], &[]),
        ),
        // The attempt ran out of memory before its status was written.
        (
            vec![Step::Job(Box::new(waiting("a", 2)))],
            (&[], &["uid-a"], &[], &[]),
        ),
        (vec![Step::Assign("a", 2, 1)], (&["ml/a"], &[], &[], &[])),
        (vec![Step::Forget("a")], (&[], &["uid-a"], &[], &[])),
    ]);
}

#[test]
fn a_deleted_jobs_pod_holds_its_room_until_it_ends_and_is_deleted() {
    let job = running("a", 1, 0);
    let pod_a = pod(&job, 1, 0);
    let pod_name = pod_a.metadata.name.clone().unwrap();
    const GONE: &str = "ml/a-a1 (pod of a deleted job)";
    run(vec![
        (
            vec![Step::Job(Box::new(job)), Step::Pod(Box::new(pod_a.clone()))],
            (&["ml/a"], &[], &[], &[]),
        ),
        (vec![Step::DeleteJob("a")], (&[GONE], &[], &[], &["a-a1"])),
        (
            vec![Step::Pod(Box::new(deleting(pod_a.clone())))],
            (&[GONE], &[], &[], &[]),
        ),
        (
            vec![Step::Pod(Box::new(ended(deleting(pod_a))))],
            (&[], &[], &[], &[]),
        ),
        (vec![Step::DeletePod(pod_name)], (&[], &[], &[], &[])),
    ]);
}

#[test]
fn a_new_job_of_a_deleted_jobs_name_sits_beside_its_pod() {
    let old = running("a", 1, 0);
    let pod_a = pod(&old, 1, 0);
    let mut new = waiting("a", 1);
    new.metadata.uid = Some("uid-a2".into());
    run(vec![
        (
            vec![Step::Job(Box::new(old)), Step::Pod(Box::new(pod_a))],
            (&["ml/a"], &[], &[], &[]),
        ),
        (
            vec![Step::Job(Box::new(new))],
            (
                &["ml/a-a1 (pod of a deleted job)"],
                &["uid-a2"],
                &[],
                &["a-a1"],
            ),
        ),
    ]);
}

#[test]
fn a_pod_no_status_records_is_listed_until_the_cycle_assigns_it() {
    // A restart: every job and pod at once, one pod created before the
    // stop whose placement the status does not show.
    let a = waiting("a", 1);
    let b = running("b", 1, 1);
    let pods = vec![
        Step::Pod(Box::new(pod(&a, 1, 0))),
        Step::Pod(Box::new(pod(&b, 1, 1))),
    ];
    let mut restart = vec![Step::Job(Box::new(a)), Step::Job(Box::new(b))];
    restart.extend(pods);
    run(vec![
        (restart, (&["ml/b"], &["uid-a"], &["uid-a#1"], &[])),
        (
            vec![Step::Assign("a", 1, 0)],
            (&["ml/a", "ml/b"], &[], &[], &[]),
        ),
    ]);
}

#[test]
fn an_older_attempts_pod_is_not_unrecorded_and_the_current_ones_is_even_ended() {
    let a = waiting("a", 2);
    run(vec![
        (
            vec![
                Step::Job(Box::new(a.clone())),
                Step::Pod(Box::new(pod(&a, 1, 0))),
            ],
            (&[], &["uid-a"], &[], &[]),
        ),
        // The pod of the current attempt, ended before the status recorded
        // it: its attempt ran, the job follows it rather than run it again.
        (
            vec![Step::Pod(Box::new(ended(pod(&a, 2, 0))))],
            (&[], &["uid-a"], &["uid-a#2"], &[]),
        ),
    ]);
    let b = waiting("b", 2);
    run(vec![(
        vec![
            Step::Job(Box::new(b.clone())),
            Step::Pod(Box::new(pod(&b, 2, 0))),
        ],
        (&[], &["uid-b"], &["uid-b#2"], &[]),
    )]);
}

#[test]
fn an_attempt_this_process_moved_past_or_whose_pod_is_being_deleted_is_not_unrecorded() {
    // After an OOM the reconcile writes attempt 2 and deletes attempt 1's
    // pod; until the cache shows that write the cached job still shows
    // attempt 1 without a recorded placement. Taking attempt 1's ended pod
    // then would make it again.
    let a = waiting("a", 1);
    run(vec![
        (
            vec![
                Step::Job(Box::new(a.clone())),
                Step::Pod(Box::new(ended(pod(&a, 1, 0)))),
            ],
            (&[], &["uid-a"], &["uid-a#1"], &[]),
        ),
        (vec![Step::Written("a", 2)], (&[], &[], &[], &[])),
    ]);
    let b = waiting("b", 1);
    run(vec![(
        vec![
            Step::Job(Box::new(b.clone())),
            Step::Pod(Box::new(deleting(pod(&b, 1, 0)))),
        ],
        (&[], &["uid-b"], &[], &[]),
    )]);
}

#[test]
fn removed_entries_are_reported_as_changed_once() {
    let mut world = World::default();
    world.apply(Step::Job(Box::new(running("a", 1, 0))));
    world.sync();
    assert_eq!(
        world.ledger.take_changed(),
        vec![EntryKey::Recorded("uid-a".into())]
    );
    world.apply(Step::Touch("a"));
    world.sync();
    assert!(world.ledger.take_changed().is_empty(), "nothing changed");
    world.apply(Step::DeleteJob("a"));
    world.sync();
    assert_eq!(
        world.ledger.take_changed(),
        vec![EntryKey::Recorded("uid-a".into())]
    );
    assert_eq!(world.ledger.committed_bytes(), 0);
}

#[test]
fn phases_are_counted_as_jobs_come_change_and_go() {
    let mut world = World::default();
    world.apply(Step::Job(Box::new(waiting("a", 1))));
    world.apply(Step::Job(Box::new(waiting("b", 1))));
    world.sync();
    assert_eq!(world.ledger.phase_counts().get(&Phase::Pending), Some(&2));
    world.apply(Step::Job(Box::new(running("a", 1, 0))));
    world.apply(Step::DeleteJob("b"));
    world.sync();
    assert_eq!(world.ledger.phase_counts().get(&Phase::Pending), Some(&0));
    assert_eq!(world.ledger.phase_counts().get(&Phase::Running), Some(&1));
}
