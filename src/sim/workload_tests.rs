use super::*;
use crate::predict::gpu_profile;
use crate::sim::kinds::{H200_STEP_TIMES, parse_kinds};

fn kinds() -> Vec<ModelKind> {
    parse_kinds(H200_STEP_TIMES, gpu_profile("H200").unwrap()).unwrap()
}

const CAP: u64 = 140 * GIB;

fn pods() -> Vec<JobRequest> {
    vec![
        JobRequest::new("half", 1, 500, 4000, GIB),
        JobRequest::new("tenth", 1, 100, 4000, GIB),
        JobRequest::new("whole2", 2, 1000, 8000, GIB),
        JobRequest::new("cpu", 0, 0, 1000, GIB),
    ]
}

#[test]
fn jobs_are_reproducible_from_the_seed_and_differ_across_seeds() {
    let k = kinds();
    let opts = WorkloadOptions::default();
    let a = draw_jobs(&pods(), 8, CAP, &k, &opts).unwrap();
    let b = draw_jobs(&pods(), 8, CAP, &k, &opts).unwrap();
    assert_eq!(a, b);
    let c = draw_jobs(&pods(), 8, CAP, &k, &WorkloadOptions { seed: 7, ..opts }).unwrap();
    assert_ne!(a, c);
}

#[test]
fn each_job_gets_the_largest_measured_micro_batch_within_its_share_and_no_cpu_pod_is_kept() {
    let k = kinds();
    let jobs = draw_jobs(&pods(), 8, CAP, &k, &WorkloadOptions::default()).unwrap();
    assert!(!jobs.is_empty());
    for j in &jobs {
        assert!(j.gpus >= 1, "{}", j.id);
        let kind = &k[j.kind];
        let room = (j.share * CAP as f64) as u64;
        let peak = kind.peak_at(j.micro).unwrap();
        let smallest = kind.micros().next().unwrap();
        assert!(
            peak <= room || j.micro == smallest,
            "{}: {peak} > {room}",
            j.id
        );
        if let Some(next) = kind.micros().find(|&m| m > j.micro) {
            assert!(
                kind.peak_at(next).unwrap() > room,
                "{}: micro {next} fits too",
                j.id
            );
        }
        assert!(j.guess % GIB == 0 && j.guess <= CAP && j.guess >= GIB);
        assert!((0.0..0.5).contains(&j.oom_point));
        assert!(j.work > 0.0);
    }
    assert!(jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
}

#[test]
fn the_arrival_rate_offers_the_asked_load() {
    let k = kinds();
    let many: Vec<JobRequest> = (0..50)
        .map(|i| JobRequest::new(format!("p{i}"), 1, 500, 1000, GIB))
        .collect();
    let opts = WorkloadOptions {
        tune: 20.0,
        ..WorkloadOptions::default()
    };
    let jobs = draw_jobs(&many, 64, CAP, &k, &opts).unwrap();
    let span = jobs.last().unwrap().arrival - jobs[0].arrival;
    let work: f64 = jobs.iter().map(|j| f64::from(j.gpus) * j.work).sum();
    let offered = work / span / 64.0;
    assert!((offered - 1.5).abs() < 0.45, "offered load {offered}");
    let twice = draw_jobs(&many, 64, CAP, &k, &WorkloadOptions { load: 3.0, ..opts }).unwrap();
    let span2 = twice.last().unwrap().arrival - twice[0].arrival;
    assert!(
        (span / span2 - 2.0).abs() < 1e-6,
        "double the load, half the span"
    );
}

#[test]
fn bad_options_and_empty_lists_are_refused() {
    let k = kinds();
    for bad in [
        WorkloadOptions {
            load: 0.0,
            ..Default::default()
        },
        WorkloadOptions {
            tune: f64::NAN,
            ..Default::default()
        },
        WorkloadOptions {
            guess_sigma: -1.0,
            ..Default::default()
        },
        WorkloadOptions {
            median_hours: -2.0,
            ..Default::default()
        },
    ] {
        assert!(draw_jobs(&pods(), 8, CAP, &k, &bad).is_err(), "{bad:?}");
    }
    let cpu_only = vec![JobRequest::new("cpu", 0, 0, 1000, GIB)];
    assert!(
        draw_jobs(&cpu_only, 8, CAP, &k, &WorkloadOptions::default())
            .unwrap_err()
            .contains("no pod that asks for a GPU")
    );
    assert!(draw_jobs(&pods(), 8, CAP, &[], &WorkloadOptions::default()).is_err());
}
