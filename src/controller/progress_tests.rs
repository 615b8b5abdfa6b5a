use super::*;
use crate::api::{AssignedGpu, ElasticPlacement, ObservedShape, Phase};
use crate::controller::transition::{PodFacts, follow};
use crate::job::exit::PodOutcome;
use serde_json::json;

const GIB: u64 = 1 << 30;
/// 2026-01-01T00:00:00Z.
const T0: f64 = 1_767_225_600.0;

fn placement(attempt: u32, relative: Option<f64>) -> PlacementStatus {
    PlacementStatus {
        compute_percent: None,
        node: "n1".into(),
        gpus: vec![AssignedGpu {
            index: 0,
            uuid: "GPU-0".into(),
        }],
        budget_bytes: 10 * GIB,
        memory_fraction: 0.1,
        attempt,
        gpu_model: None,
        micro_batch: None,
        elastic: relative.map(|r| ElasticPlacement {
            preferred_micro_batch: 8,
            preferred_grad_accum: 1,
            preferred_budget_bytes: 20 * GIB,
            relative_step_time: r,
            expected_wait_seconds: None,
        }),
    }
}

fn report(steps: u64, total: Option<u64>, per_step: Option<f64>, at: f64) -> ReportedProgress {
    ReportedProgress {
        steps,
        total_steps: total,
        seconds_per_step: per_step,
        time: rfc3339(at).unwrap(),
    }
}

fn job(duration: Option<&str>, status: Option<TrainingJobStatus>) -> TrainingJob {
    let spec = match duration {
        Some(d) => json!({"expectedDuration": d}),
        None => json!({}),
    };
    let mut job = TrainingJob::test("j").spec(spec).build();
    job.status = status;
    job
}

#[test]
fn durations_are_whole_numbers_with_units_summed() {
    let cases = [
        ("2h", Some(7200.0)),
        ("90m", Some(5400.0)),
        ("1d12h", Some(129_600.0)),
        ("1h30m15s", Some(5415.0)),
        ("45s", Some(45.0)),
        ("0s", None),
        ("", None),
        ("2", None),
        ("h", None),
        ("1.5h", None),
        ("2 h", None),
        ("2H", None),
        ("-1h", None),
        ("99999999999999999999h", None),
    ];
    for (text, seconds) in cases {
        assert_eq!(parse_duration(text), seconds, "{text:?}");
    }
}

#[test]
fn the_crd_pattern_accepts_what_the_parser_reads() {
    let pattern = accepted_by_crd();
    for text in ["2h", "90m", "1d12h", "1h30m15s", "45s", "1h0m"] {
        assert!(pattern(text), "{text}");
        assert!(parse_duration(text).is_some(), "{text}");
    }
    for text in ["0s", "0h30m", "", "2", "1.5h", "2 h", "1h2m3s4s5s"] {
        assert!(!pattern(text), "{text}");
    }
}

/// The CRD's pattern checked through the same validator as `vramfit
/// predict -f` (the jsonschema crate), on a whole document.
fn accepted_by_crd() -> impl Fn(&str) -> bool {
    |text: &str| {
        let mut doc = serde_json::to_value(TrainingJob::test("j").build()).unwrap();
        doc["spec"]["expectedDuration"] = json!(text);
        crate::api::validate::validate_training_job(&doc).is_ok()
    }
}

#[test]
fn the_expected_end_comes_from_progress_else_the_start_and_duration_else_none() {
    let started = Some(T0);
    let hour = Some(3600.0);
    // (report, start, duration, relative step time, expected end from T0 and source)
    let cases = [
        // 400 steps left at 0.5 s, counted 100 s after T0
        (
            Some(report(600, Some(1000), Some(0.5), T0 + 100.0)),
            started,
            hour,
            1.0,
            Some((300.0, FROM_PROGRESS)),
        ),
        // the progress wins over the duration even when elastic
        (
            Some(report(600, Some(1000), Some(0.5), T0 + 100.0)),
            started,
            hour,
            1.5,
            Some((300.0, FROM_PROGRESS)),
        ),
        // steps past the total: ends at the report
        (
            Some(report(1200, Some(1000), Some(0.5), T0 + 100.0)),
            started,
            hour,
            1.0,
            Some((100.0, FROM_PROGRESS)),
        ),
        // no total: the duration from the start
        (
            Some(report(600, None, Some(0.5), T0 + 100.0)),
            started,
            hour,
            1.0,
            Some((3600.0, FROM_DURATION)),
        ),
        // no step time yet: the duration
        (
            Some(report(1, Some(1000), None, T0 + 100.0)),
            started,
            hour,
            1.0,
            Some((3600.0, FROM_DURATION)),
        ),
        // elastic placement 1.5x slower: the duration scaled
        (None, started, hour, 1.5, Some((5400.0, FROM_DURATION))),
        // a nonsense relative step time counts as 1
        (None, started, hour, f64::NAN, Some((3600.0, FROM_DURATION))),
        // no duration, or no start: unknown
        (None, started, None, 1.0, None),
        (None, None, hour, 1.0, None),
        (
            Some(report(5, None, Some(0.5), T0)),
            started,
            None,
            1.0,
            None,
        ),
    ];
    for (i, (reported, started, duration, relative, want)) in cases.into_iter().enumerate() {
        let got = expected_end(reported.as_ref(), started, duration, relative)
            .map(|(end, source)| (end - T0, source));
        assert_eq!(got, want, "case {i}");
    }
}

#[test]
fn the_status_progress_shows_steps_and_the_end_of_the_attempt() {
    let spec = job(Some("1h"), None).spec;
    let p = attempt_progress(
        &spec,
        &placement(2, None),
        Some(&report(600, Some(1000), Some(0.5), T0 + 100.0)),
        Some(T0),
    )
    .unwrap();
    assert_eq!(p.attempt, 2);
    assert_eq!(
        (p.steps, p.total_steps, p.seconds_per_step),
        (Some(600), Some(1000), Some(0.5))
    );
    assert_eq!(p.done.as_deref(), Some("600/1000"));
    assert_eq!(p.reported.as_deref(), Some("2026-01-01T00:01:40Z"));
    assert_eq!(p.expected_end.as_deref(), Some("2026-01-01T00:05:00Z"));
    assert_eq!(p.source.as_deref(), Some(FROM_PROGRESS));
    // Steps without a total, no duration: the steps, no end.
    let bare = job(None, None).spec;
    let p = attempt_progress(
        &bare,
        &placement(1, None),
        Some(&report(7, None, None, T0)),
        Some(T0),
    )
    .unwrap();
    assert_eq!(
        (p.done.as_deref(), p.expected_end, p.source),
        (Some("7"), None, None)
    );
    // No report: the end from the duration, scaled for an elastic placement.
    let p = attempt_progress(&spec, &placement(1, Some(2.0)), None, Some(T0)).unwrap();
    assert_eq!(
        (
            p.steps,
            p.done,
            p.expected_end.as_deref(),
            p.source.as_deref()
        ),
        (
            None,
            None,
            Some("2026-01-01T02:00:00Z"),
            Some(FROM_DURATION)
        )
    );
    // Nothing to say.
    assert_eq!(
        attempt_progress(&bare, &placement(1, None), None, Some(T0)),
        None
    );
}

#[test]
fn moving_steps_are_rewritten_at_most_every_thirty_seconds() {
    let spec = job(Some("1h"), None).spec;
    let at = |steps: u64, total: Option<u64>, seconds: f64| {
        attempt_progress(
            &spec,
            &placement(1, None),
            Some(&report(steps, total, Some(0.5), T0 + seconds)),
            Some(T0),
        )
        .unwrap()
    };
    let written = at(100, Some(1000), 0.0);
    let cases = [
        ("first report", None, at(100, Some(1000), 0.0), true),
        ("the same", Some(written.clone()), written.clone(), false),
        (
            "steps moved 10 s later",
            Some(written.clone()),
            at(120, Some(1000), 10.0),
            false,
        ),
        (
            "steps moved 30 s later",
            Some(written.clone()),
            at(160, Some(1000), 30.0),
            true,
        ),
        (
            "the total changed",
            Some(written.clone()),
            at(101, Some(2000), 1.0),
            true,
        ),
        (
            "the total went away",
            Some(written.clone()),
            at(101, None, 1.0),
            true,
        ),
        (
            "another attempt",
            Some(written.clone()),
            JobProgress {
                attempt: 2,
                ..written.clone()
            },
            true,
        ),
        (
            "a report after the duration alone",
            attempt_progress(&spec, &placement(1, None), None, Some(T0)),
            at(1, Some(1000), 0.0),
            true,
        ),
    ];
    for (what, previous, next, write) in cases {
        assert_eq!(worth_writing(previous.as_ref(), &next), write, "{what}");
    }
}

#[test]
fn a_running_pod_s_report_reaches_the_job_status() {
    let placed = TrainingJobStatus {
        phase: Phase::Running,
        attempt: 1,
        budget_bytes: Some(10 * GIB),
        micro_batch: Some(8),
        grad_accum: Some(1),
        placement: Some(placement(1, None)),
        ..Default::default()
    };
    let j = job(Some("1h"), Some(placed.clone()));
    let facts = |outcome: PodOutcome, steps: u64, seconds: f64| PodFacts {
        outcome,
        observed_shape: Some(ObservedShape {
            micro_batch: 8,
            grad_accum: 1,
            progress: Some(report(steps, Some(1000), Some(0.5), T0 + seconds)),
            ..Default::default()
        }),
        started: Some(T0),
        ..Default::default()
    };
    let t = follow(
        &j,
        placed.clone(),
        &placement(1, None),
        facts(PodOutcome::Running, 600, 100.0),
    );
    let p = t.status.progress.clone().expect("progress written");
    assert_eq!(p.done.as_deref(), Some("600/1000"));
    assert_eq!(p.expected_end.as_deref(), Some("2026-01-01T00:05:00Z"));
    // A report 5 s later is not worth a write; one 40 s later is.
    let again = follow(
        &j,
        t.status.clone(),
        &placement(1, None),
        facts(PodOutcome::Running, 610, 105.0),
    );
    assert_eq!(again.status.progress, Some(p.clone()));
    let later = follow(
        &j,
        t.status.clone(),
        &placement(1, None),
        facts(PodOutcome::Running, 680, 140.0),
    );
    assert_eq!(
        later.status.progress.unwrap().done.as_deref(),
        Some("680/1000")
    );
    // A pod not running yet writes none.
    let waiting = follow(
        &j,
        placed,
        &placement(1, None),
        facts(PodOutcome::Waiting, 0, 0.0),
    );
    assert_eq!(waiting.status.progress, None);
}

#[test]
fn the_training_starts_when_its_first_container_runs() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "status": {
            "startTime": "2026-01-01T00:00:00Z",
            "containerStatuses": [
                {"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-01-01T00:02:00Z"}}},
                {"name": "b", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-01-01T00:01:00Z"}}}
            ]
        }
    }))
    .unwrap();
    assert_eq!(pod_started(&pod), Some(T0 + 60.0));
    let pulling: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "status": {"startTime": "2026-01-01T00:00:00Z", "containerStatuses": [
            {"name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    }))
    .unwrap();
    assert_eq!(pod_started(&pulling), Some(T0));
    assert_eq!(pod_started(&Pod::default()), None);
}

/// A live job placed on GPU 0 of n1 for `attempt`, with `progress`.
fn running(
    name: &str,
    duration: Option<&str>,
    progress: Option<JobProgress>,
    relative: Option<f64>,
) -> TrainingJob {
    let mut j = job(
        duration,
        Some(TrainingJobStatus {
            phase: Phase::Running,
            attempt: 1,
            budget_bytes: Some(10 * GIB),
            placement: Some(placement(1, relative)),
            progress,
            ..Default::default()
        }),
    );
    j.metadata.name = Some(name.into());
    j
}

fn ends_at(end: f64, attempt: u32) -> Option<JobProgress> {
    Some(JobProgress {
        attempt,
        expected_end: rfc3339(end),
        ..Default::default()
    })
}

#[test]
fn the_cycle_counts_each_live_placement_with_its_expected_end() {
    let now = T0 + 1000.0;
    // (job, its expected end from now; None: left out)
    let cases = [
        (
            "reported",
            running("a", None, ends_at(now + 30.0, 1), None),
            Some(30.0),
        ),
        // the progress of an earlier attempt does not count: the duration
        // from now (the attempt has not started as far as status says)
        (
            "earlier attempt",
            running("b", Some("10m"), ends_at(now + 30.0, 0), None),
            Some(600.0),
        ),
        (
            "duration, elastic",
            running("c", Some("10m"), None, Some(1.5)),
            Some(900.0),
        ),
        ("nothing known", running("d", None, None, None), None),
        // just past: about to end
        (
            "just overdue",
            running("e", None, ends_at(now - 60.0, 1), None),
            Some(-60.0),
        ),
        // long past: the estimate proved wrong
        (
            "long overdue",
            running("f", None, ends_at(now - 301.0, 1), None),
            None,
        ),
    ];
    for (what, j, want) in &cases {
        let got = job_expected_end(j, recorded(j).unwrap(), now).map(|e| e - now);
        assert_eq!(got, *want, "{what}");
    }
    let mut finished = running("g", Some("10m"), ends_at(now + 30.0, 1), None);
    finished.status.as_mut().unwrap().phase = Phase::Succeeded;
    let mut jobs: Vec<&TrainingJob> = cases.iter().map(|(_, j, _)| j).collect();
    jobs.push(&finished);
    let ends = expected_ends(&jobs, Timestamp::from_second(now as i64).unwrap());
    assert_eq!(ends.now, now);
    let got: Vec<(String, f64)> = ends
        .ends
        .iter()
        .map(|(end, p)| (p.job_id.clone(), end - now))
        .collect();
    assert_eq!(
        got,
        [
            ("ml/a".to_string(), 30.0),
            ("ml/b".to_string(), 600.0),
            ("ml/c".to_string(), 900.0),
            ("ml/e".to_string(), -60.0),
        ]
    );
    assert_eq!(ends.ends[0].1.gpu_budget, 10 * GIB);
}

#[test]
fn an_elastic_job_s_remaining_work_is_its_expected_duration() {
    assert_eq!(remaining_seconds(&job(Some("2h"), None)), 7200.0);
    assert_eq!(remaining_seconds(&job(None, None)), f64::INFINITY);
}
