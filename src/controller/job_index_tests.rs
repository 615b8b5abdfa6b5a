use super::*;
use crate::api::{AbsorbedOom, TrainingJobSpec, TrainingJobStatus};
use crate::controller::absorbed::{learned_start_micro, start_micro_below};
use crate::job::signature::model_signature;
use serde_json::json;

fn spec(global: u32, micro: u32, layers: u32) -> TrainingJobSpec {
    TrainingJob::test("j")
        .batch(global, micro)
        .model(json!({"mlp": {"layers": layers, "hidden": 1024}}))
        .template(json!({}))
        .build()
        .spec
}

fn job(uid: &str, spec: TrainingJobSpec, status: TrainingJobStatus) -> TrainingJob {
    let mut job = TrainingJob::test(&format!("job-{uid}"))
        .uid(uid)
        .meta("generation", serde_json::Value::Null)
        .status(status)
        .build();
    job.spec = spec;
    job
}

/// A job of signature `signature` in `phase` with a measured peak.
fn finished(uid: &str, phase: Phase, signature: &str, peak: u64) -> TrainingJob {
    job(
        uid,
        spec(64, 16, 4),
        TrainingJobStatus {
            phase,
            model_signature: Some(signature.into()),
            measured_peak_bytes: Some(peak),
            ..TrainingJobStatus::default()
        },
    )
}

/// A job of `layers` layers at micro 16 whose process backed off to `to`.
fn absorbed(uid: &str, layers: u32, to: u32) -> TrainingJob {
    job(
        uid,
        spec(64, 16, layers),
        TrainingJobStatus {
            absorbed_ooms: vec![AbsorbedOom {
                from_micro: 16,
                to_micro: to,
                from_accum: 4,
                to_accum: 64 / to,
                time: "t".into(),
            }],
            ..TrainingJobStatus::default()
        },
    )
}

/// A named case: the events the index follows, and what it should answer.
type Case<T> = (&'static str, Vec<Event<TrainingJob>>, T);

fn apply(job: TrainingJob) -> Event<TrainingJob> {
    Event::Apply(job)
}

fn indexed(events: Vec<Event<TrainingJob>>) -> JobIndex {
    let index = JobIndex::default();
    for event in &events {
        index.observe(event);
    }
    index
}

#[test]
fn the_measured_peak_is_the_highest_of_the_succeeded_jobs_of_the_signature() {
    use Phase::*;
    // (events, the peak the index gives for signature "a")
    let cases: Vec<Case<Option<u64>>> = vec![
        ("none", vec![], None),
        (
            "two succeeded: the higher",
            vec![
                apply(finished("1", Succeeded, "a", 5)),
                apply(finished("2", Succeeded, "a", 7)),
            ],
            Some(7),
        ),
        (
            "running and failed jobs do not count",
            vec![
                apply(finished("1", Running, "a", 9)),
                apply(finished("2", Failed, "a", 9)),
                apply(finished("3", Succeeded, "a", 4)),
            ],
            Some(4),
        ),
        (
            "another signature does not count",
            vec![apply(finished("1", Succeeded, "b", 9))],
            None,
        ),
        (
            "a job seen again replaces its old peak",
            vec![
                apply(finished("1", Succeeded, "a", 9)),
                apply(finished("1", Succeeded, "a", 3)),
            ],
            Some(3),
        ),
        (
            "a job seen again with another signature leaves the old one",
            vec![
                apply(finished("1", Succeeded, "a", 9)),
                apply(finished("1", Succeeded, "b", 9)),
            ],
            None,
        ),
        (
            "a deleted job no longer counts",
            vec![
                apply(finished("1", Succeeded, "a", 9)),
                apply(finished("2", Succeeded, "a", 2)),
                Event::Delete(finished("1", Succeeded, "a", 9)),
            ],
            Some(2),
        ),
        (
            "a relist keeps only the jobs it lists",
            vec![
                apply(finished("1", Succeeded, "a", 9)),
                Event::Init,
                Event::InitApply(finished("2", Succeeded, "a", 2)),
                Event::InitDone,
            ],
            Some(2),
        ),
        (
            "a relist that lists nothing empties the index",
            vec![
                apply(finished("1", Succeeded, "a", 9)),
                Event::Init,
                Event::InitDone,
            ],
            None,
        ),
        (
            "until the relist is done the old jobs count",
            vec![
                apply(finished("1", Succeeded, "a", 9)),
                Event::Init,
                Event::InitApply(finished("2", Succeeded, "a", 2)),
            ],
            Some(9),
        ),
    ];
    for (name, events, want) in cases {
        assert_eq!(indexed(events).measured_peak_for("a"), want, "{name}");
    }
}

#[test]
fn the_smallest_backoff_is_the_smallest_micro_batch_of_the_model_with_its_job() {
    let sig4 = model_signature("ml", &spec(64, 16, 4), 16);
    let cases: Vec<Case<Option<(u32, String)>>> = vec![
        ("none", vec![], None),
        (
            "the smallest of two",
            vec![apply(absorbed("1", 4, 8)), apply(absorbed("2", 4, 2))],
            Some((2, "job-2".into())),
        ),
        (
            "another model does not count",
            vec![apply(absorbed("1", 6, 2)), apply(absorbed("2", 4, 8))],
            Some((8, "job-2".into())),
        ),
        (
            "a tie goes to the first name",
            vec![apply(absorbed("2", 4, 4)), apply(absorbed("1", 4, 4))],
            Some((4, "job-1".into())),
        ),
        (
            "a job seen again without absorbed OOMs no longer counts",
            vec![
                apply(absorbed("1", 4, 2)),
                apply(job("1", spec(64, 16, 4), TrainingJobStatus::default())),
            ],
            None,
        ),
        (
            "a deleted job no longer counts",
            vec![
                apply(absorbed("1", 4, 2)),
                Event::Delete(absorbed("1", 4, 2)),
            ],
            None,
        ),
        (
            "a relist keeps only the jobs it lists",
            vec![
                apply(absorbed("1", 4, 2)),
                Event::Init,
                Event::InitApply(absorbed("2", 4, 8)),
                Event::InitDone,
            ],
            Some((8, "job-2".into())),
        ),
    ];
    for (name, events, want) in cases {
        assert_eq!(indexed(events).smallest_backoff(&sig4), want, "{name}");
    }
}

/// The index gives predictions what a scan of every job gives.
#[test]
fn the_index_answers_as_a_scan_of_every_job() {
    use Phase::*;
    let jobs = vec![
        absorbed("1", 4, 8),
        absorbed("2", 4, 4),
        absorbed("3", 6, 2),
        finished("4", Succeeded, "a", 5),
        finished("5", Succeeded, "a", 11),
        finished("6", Running, "a", 20),
        finished("7", Succeeded, "b", 3),
    ];
    let index = indexed(jobs.iter().cloned().map(apply).collect());
    for signature in ["a", "b", "c"] {
        let scanned = jobs
            .iter()
            .filter_map(measured_lesson)
            .filter(|(s, _)| s == signature)
            .map(|(_, peak)| peak)
            .max();
        assert_eq!(index.measured_peak_for(signature), scanned, "{signature}");
    }
    for new in [
        spec(64, 16, 4),
        spec(48, 16, 4),
        spec(64, 16, 6),
        spec(64, 32, 4),
    ] {
        let from_index = index
            .smallest_backoff(&model_signature("ml", &new, new.batch.micro))
            .and_then(|learned| start_micro_below(&new, learned));
        assert_eq!(from_index, learned_start_micro("ml", &new, &jobs));
    }
    assert_eq!(
        learned_start_micro("ml", &spec(64, 16, 4), &jobs),
        Some((4, "job-2".into()))
    );
}
