use super::*;
use serde_json::json;

fn spec(global: u32, micro: u32, min_micro: u32, layers: u32) -> TrainingJobSpec {
    TrainingJob::test("j")
        .batch(global, micro)
        .min_micro(min_micro)
        .model(json!({"mlp": {"layers": layers, "hidden": 1024}}))
        .template(json!({}))
        .build()
        .spec
}

fn oom(from: u32, to: u32, from_accum: u32, to_accum: u32, time: &str) -> AbsorbedOom {
    AbsorbedOom {
        from_micro: from,
        to_micro: to,
        from_accum,
        to_accum,
        time: time.into(),
    }
}

fn observed(micro: u32, accum: u32, ooms: Vec<AbsorbedOom>) -> ObservedShape {
    ObservedShape {
        micro_batch: micro,
        grad_accum: accum,
        absorbed_ooms: ooms,
        progress: None,
    }
}

fn job(name: &str, spec: TrainingJobSpec, absorbed: Vec<AbsorbedOom>) -> TrainingJob {
    let mut job = TrainingJob::test(name)
        .meta("namespace", serde_json::Value::Null)
        .meta("uid", serde_json::Value::Null)
        .meta("generation", serde_json::Value::Null)
        .status(TrainingJobStatus {
            absorbed_ooms: absorbed,
            ..TrainingJobStatus::default()
        })
        .build();
    job.spec = spec;
    job
}

#[test]
fn a_new_absorbed_oom_changes_the_shape_once() {
    let s = spec(64, 16, 1, 4);
    let mut status = TrainingJobStatus {
        micro_batch: Some(16),
        grad_accum: Some(4),
        ..TrainingJobStatus::default()
    };
    let first = oom(16, 8, 4, 8, "t1");
    let update = newly_absorbed(&s, &status, &observed(8, 8, vec![first.clone()])).unwrap();
    assert_eq!(update.shape, BatchShape { micro: 8, accum: 8 });
    assert_eq!(update.new, std::slice::from_ref(&first));
    assert_eq!(
        absorbed_message(&update.new[0]),
        "OOM absorbed in-process: micro 16 -> 8, accumulation 4 -> 8"
    );
    // Recorded: the same report again changes nothing.
    status.absorbed_ooms.push(first.clone());
    status.micro_batch = Some(8);
    status.grad_accum = Some(8);
    assert_eq!(
        newly_absorbed(&s, &status, &observed(8, 8, vec![first.clone()])),
        None
    );
    // A second one is new.
    let second = oom(8, 4, 8, 16, "t2");
    let update = newly_absorbed(&s, &status, &observed(4, 16, vec![first, second.clone()]));
    assert_eq!(update.unwrap().new, [second]);
}

/// A 64 / 16 job at micro-batch 8 in status, and a report of one OOM
/// absorbed from 16 to 8.
fn at_micro_8_after_one_oom() -> (TrainingJobSpec, TrainingJobStatus, Vec<AbsorbedOom>) {
    let status = TrainingJobStatus {
        micro_batch: Some(8),
        ..TrainingJobStatus::default()
    };
    (spec(64, 16, 1, 4), status, vec![oom(16, 8, 4, 8, "t")])
}

#[test]
fn a_report_that_cannot_be_the_jobs_is_ignored() {
    let (s, status, o) = at_micro_8_after_one_oom();
    // 6 does not divide 64; 8x4 is not the global batch; 16 is not smaller.
    assert_eq!(
        newly_absorbed(&s, &status, &observed(6, 10, o.clone())),
        None
    );
    assert_eq!(
        newly_absorbed(&s, &status, &observed(8, 4, o.clone())),
        None
    );
    assert_eq!(newly_absorbed(&s, &status, &observed(16, 4, o)), None);
    // No absorbed OOM: nothing to record.
    assert_eq!(newly_absorbed(&s, &status, &observed(4, 16, vec![])), None);
}

#[test]
fn the_next_job_of_the_same_model_starts_where_the_last_one_backed_off_to() {
    let this = spec(64, 16, 1, 4);
    let jobs = [
        job("same", spec(64, 16, 1, 4), vec![oom(16, 8, 4, 8, "t")]),
        job(
            "other-model",
            spec(64, 16, 1, 6),
            vec![oom(16, 2, 4, 32, "t")],
        ),
        job(
            "other-start",
            spec(64, 32, 1, 4),
            vec![oom(32, 4, 2, 16, "t")],
        ),
        job("nothing-absorbed", spec(64, 16, 1, 4), vec![]),
    ];
    assert_eq!(
        learned_start_micro("", &this, &jobs),
        Some((8, "same".into()))
    );
    let g48 = spec(48, 16, 1, 4);
    assert_eq!(
        learned_start_micro("", &g48, &jobs),
        Some((8, "same".into()))
    );
    // Another global batch of the same model takes the largest valid
    // micro-batch not above the learned one: 4 does not divide 18, 3 does.
    let nine = [job("nine", spec(36, 9, 1, 4), vec![oom(9, 4, 4, 9, "t")])];
    assert_eq!(
        learned_start_micro("", &spec(18, 9, 1, 4), &nine),
        Some((3, "nine".into()))
    );
    // The floor wins over what was learned.
    assert_eq!(learned_start_micro("", &spec(64, 16, 16, 4), &jobs), None);
    assert_eq!(learned_start_micro("", &this, &jobs[1..]), None);
}

/// One tenant's back-off never sets where another tenant's job starts: the
/// lesson is keyed by namespace too.
#[test]
fn a_lesson_stays_in_its_namespace() {
    let this = spec(64, 16, 1, 4);
    let mut theirs = job("theirs", spec(64, 16, 1, 4), vec![oom(16, 2, 4, 32, "t")]);
    theirs.metadata.namespace = Some("team-a".into());
    let jobs = [theirs];
    assert_eq!(
        learned_start_micro("team-a", &this, &jobs),
        Some((2, "theirs".into()))
    );
    assert_eq!(learned_start_micro("team-b", &this, &jobs), None);
    assert_eq!(learned_start_micro("", &this, &jobs), None);
}

#[test]
fn a_report_at_the_micro_batch_in_status_records_nothing() {
    // Only a smaller micro-batch than the status's is an absorbed OOM;
    // the same one again (with an OOM status does not list) is not.
    let (s, status, o) = at_micro_8_after_one_oom();
    assert_eq!(
        newly_absorbed(&s, &status, &observed(8, 8, o.clone())),
        None
    );
    assert!(newly_absorbed(&s, &status, &observed(4, 16, o)).is_some());
}
