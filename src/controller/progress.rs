//! A running attempt's progress and expected end, and the running jobs'
//! expected ends that elastic placement weighs a wait with.
//!
//! The training helper reports optimizer steps done, the total when the
//! script knows it and a smoothed step time (docs/node-protocol.md); the
//! node agent carries them into the GpuNode, and [`follow_progress`] copies
//! them into the job's `status.progress` with the attempt's expected end:
//! from the report when it has a total and a step time, else the pod's start
//! plus `spec.expectedDuration` (times the relative step time of an elastic
//! placement), else unknown. The cycle reads those ends back
//! ([`expected_ends`]) and gives an elastic waiting job its remaining work
//! from its own `expectedDuration` ([`remaining_seconds`]).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::cluster_view::recorded_placement;
use super::scheduler::{ExpectedEnds, recorded};
use crate::api::{
    JobProgress, PlacementStatus, ReportedProgress, TrainingJob, TrainingJobSpec, TrainingJobStatus,
};

/// `status.progress.source` of an end computed from the reported progress.
pub const FROM_PROGRESS: &str = "progress";
/// `status.progress.source` of an end computed from `spec.expectedDuration`.
pub const FROM_DURATION: &str = "expectedDuration";

/// Shortest time between two reports written to status while only the step
/// count (and the end it gives) moves: the helper reports every few seconds,
/// and a status write per report and job would load the API server for a
/// figure the cycle needs to the minute.
pub const REWRITE_SECONDS: f64 = 30.0;

/// How far past its expected end a running job still counts as about to end.
/// Later than that the estimate proved wrong, so the job's end is unknown
/// (it makes no room that can be counted on) until a new report moves it.
pub const OVERDUE_SECONDS: f64 = 300.0;

/// Seconds of a duration such as `2h`, `90m` or `1d12h` (whole numbers with
/// units `d`, `h`, `m`, `s`, summed). `None` when malformed or zero: the CRD
/// refuses those (`crate::api::schema::DURATION_PATTERN`).
pub fn parse_duration(text: &str) -> Option<f64> {
    let mut total = 0u64;
    let mut number: Option<u64> = None;
    for c in text.chars() {
        if let Some(digit) = c.to_digit(10) {
            number = Some(
                number
                    .unwrap_or(0)
                    .checked_mul(10)?
                    .checked_add(digit.into())?,
            );
            continue;
        }
        let unit = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        total = total.checked_add(number.take()?.checked_mul(unit)?)?;
    }
    (number.is_none() && total > 0).then_some(total as f64)
}

/// The job's `spec.expectedDuration` in seconds, when it has a valid one.
pub fn expected_duration(spec: &TrainingJobSpec) -> Option<f64> {
    spec.expected_duration.as_deref().and_then(parse_duration)
}

/// The work an elastic waiting job has left at its preferred shape, in
/// seconds: its `expectedDuration`, or infinity when it has none (so any
/// known wait beats a slower start, `crate::place::elastic::start_smaller_now`).
pub fn remaining_seconds(job: &TrainingJob) -> f64 {
    expected_duration(&job.spec).unwrap_or(f64::INFINITY)
}

/// Unix seconds of an RFC 3339 time.
pub fn unix_seconds(rfc3339: &str) -> Option<f64> {
    rfc3339
        .parse::<Timestamp>()
        .ok()
        .map(|t| t.as_millisecond() as f64 / 1000.0)
}

fn rfc3339(unix_seconds: f64) -> Option<String> {
    if !unix_seconds.is_finite() {
        return None;
    }
    Timestamp::from_millisecond((unix_seconds * 1000.0).round() as i64)
        .ok()
        .map(|t| format!("{t:.0}"))
}

/// When an attempt is expected to end (Unix seconds) and from what: its
/// reported progress when that has a total and a step time (the report's
/// time plus the steps left at that step time), else its start (`started`,
/// Unix seconds) plus the expected duration (`duration`, seconds at the
/// preferred shape) times `relative_step_time`, else unknown.
pub fn expected_end(
    reported: Option<&ReportedProgress>,
    started: Option<f64>,
    duration: Option<f64>,
    relative_step_time: f64,
) -> Option<(f64, &'static str)> {
    if let Some(p) = reported
        && let (Some(total), Some(per_step), Some(at)) =
            (p.total_steps, p.seconds_per_step, unix_seconds(&p.time))
    {
        let left = total.saturating_sub(p.steps) as f64;
        return Some((at + left * per_step, FROM_PROGRESS));
    }
    let relative = if relative_step_time.is_finite() && relative_step_time > 0.0 {
        relative_step_time
    } else {
        1.0
    };
    Some((started? + duration? * relative, FROM_DURATION))
}

/// The progress of the attempt `placement` runs, from what its process
/// reports and when its pod started (Unix seconds). `None` when there is
/// nothing to say (no report, no expected end).
pub fn attempt_progress(
    spec: &TrainingJobSpec,
    placement: &PlacementStatus,
    reported: Option<&ReportedProgress>,
    started: Option<f64>,
) -> Option<JobProgress> {
    let relative = placement
        .elastic
        .as_ref()
        .map_or(1.0, |e| e.relative_step_time);
    let end = expected_end(reported, started, expected_duration(spec), relative);
    if reported.is_none() && end.is_none() {
        return None;
    }
    Some(JobProgress {
        attempt: placement.attempt,
        steps: reported.map(|p| p.steps),
        total_steps: reported.and_then(|p| p.total_steps),
        seconds_per_step: reported.and_then(|p| p.seconds_per_step),
        reported: reported.map(|p| p.time.clone()),
        done: reported.map(|p| match p.total_steps {
            Some(total) => format!("{}/{total}", p.steps),
            None => p.steps.to_string(),
        }),
        expected_end: end.and_then(|(at, _)| rfc3339(at)),
        source: end.map(|(_, source)| source.to_string()),
    })
}

/// Whether `next` should replace `previous` in status: always when the
/// attempt, the total, the source of the end or whether there is a report
/// changed; while only the steps move, once the report is
/// [`REWRITE_SECONDS`] newer than the one written.
pub fn worth_writing(previous: Option<&JobProgress>, next: &JobProgress) -> bool {
    let Some(previous) = previous else {
        return true;
    };
    if previous == next {
        return false;
    }
    if previous.attempt != next.attempt
        || previous.total_steps != next.total_steps
        || previous.source != next.source
        || previous.reported.is_some() != next.reported.is_some()
    {
        return true;
    }
    match (
        previous.reported.as_deref().and_then(unix_seconds),
        next.reported.as_deref().and_then(unix_seconds),
    ) {
        (Some(before), Some(now)) => now - before >= REWRITE_SECONDS,
        // Without a report the end comes from the spec and the start: a
        // change of either is rare and worth its write.
        _ => true,
    }
}

/// Records the running attempt's progress in `status` when
/// [`worth_writing`] says so.
pub fn follow_progress(
    job: &TrainingJob,
    status: &mut TrainingJobStatus,
    placement: &PlacementStatus,
    reported: Option<&ReportedProgress>,
    started: Option<f64>,
) {
    let Some(next) = attempt_progress(&job.spec, placement, reported, started) else {
        return;
    };
    if worth_writing(status.progress.as_ref(), &next) {
        status.progress = Some(next);
    }
}

/// When the pod's training started (Unix seconds): the earliest start of a
/// running container, else the pod's own start time.
pub fn pod_started(pod: &Pod) -> Option<f64> {
    let status = pod.status.as_ref()?;
    let seconds = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        t.0.as_millisecond() as f64 / 1000.0
    };
    status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .map(seconds)
        .min_by(f64::total_cmp)
        .or_else(|| status.start_time.as_ref().map(seconds))
}

/// The expected end (Unix seconds) of a live job's recorded placement at
/// `now`: its `status.progress.expectedEnd` for the current attempt; for an
/// attempt without one (placed, its pod not started or not yet followed),
/// `now` plus its expected duration (scaled as [`expected_end`] scales it),
/// since it has not started; else unknown. An end more than
/// [`OVERDUE_SECONDS`] past is unknown too.
pub fn job_expected_end(job: &TrainingJob, placement: &PlacementStatus, now: f64) -> Option<f64> {
    let status = job.status.as_ref()?;
    let end = match status
        .progress
        .as_ref()
        .filter(|p| p.attempt == placement.attempt)
        .and_then(|p| p.expected_end.as_deref())
    {
        Some(end) => unix_seconds(end)?,
        None => {
            let relative = placement
                .elastic
                .as_ref()
                .map_or(1.0, |e| e.relative_step_time);
            expected_end(None, Some(now), expected_duration(&job.spec), relative)?.0
        }
    };
    (end >= now - OVERDUE_SECONDS).then_some(end)
}

/// The running jobs' expected ends at `now`, for the cycle
/// (`scheduler::plan_cycle_at`): every live job's recorded placement with
/// its [`job_expected_end`]; jobs without one are left out.
pub fn expected_ends(jobs: &[&TrainingJob], now: Timestamp) -> ExpectedEnds {
    let now = now.as_millisecond() as f64 / 1000.0;
    let ends = jobs
        .iter()
        .filter_map(|job| {
            let placement = recorded(job)?;
            let end = job_expected_end(job, placement, now)?;
            Some((end, recorded_placement(job, placement)))
        })
        .collect();
    ExpectedEnds { now, ends }
}

#[cfg(test)]
#[path = "progress_tests.rs"]
mod tests;
