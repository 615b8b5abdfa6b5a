use super::*;
use crate::place::inventory::NodeSpec;
use crate::predict::step_time::StepTimeCurve;

const CAP: u64 = 100 * GIB;

/// A kind whose peak at micro m is 10*m GiB (m = 1, 2, 4), step time
/// 1.0 / 1.2 / 2.0 relative at micro 4 / 2 / 1.
fn kind() -> ModelKind {
    ModelKind {
        name: "k".into(),
        global: 16,
        curve: StepTimeCurve::new(vec![(1, 2.0), (2, 1.2), (4, 1.0)]).unwrap(),
        peak: vec![(1, 10 * GIB), (2, 20 * GIB), (4, 40 * GIB)],
        spec: None,
    }
}

fn inventory(gpus: usize) -> Inventory {
    Inventory {
        nodes: vec![NodeSpec {
            name: "n".into(),
            cpu_milli: 64_000,
            memory_bytes: 512 * GIB,
            taints: Vec::new(),
            gpus: (0..gpus)
                .map(|_| GpuSpec {
                    model: "H200".into(),
                    capacity: CAP,
                })
                .collect(),
        }],
    }
}

fn job(id: &str, arrival: f64, micro: u32, work: f64, guess_gib: u64) -> SimJob {
    SimJob {
        id: id.into(),
        arrival,
        gpus: 1,
        cpu_milli: 1000,
        memory_bytes: GIB,
        share: 0.5,
        kind: 0,
        micro,
        work,
        guess: guess_gib * GIB,
        oom_point: 0.25,
    }
}

/// `job` asking for `share` of a GPU's compute.
fn shared(job: SimJob, share: f64) -> SimJob {
    SimJob { share, ..job }
}

/// Budgets equal to the true peaks times `factor`.
fn budgets(factor: f64) -> Budgets {
    Budgets {
        by_kind: vec![
            kind()
                .peak
                .iter()
                .map(|&(m, p)| (m, (p as f64 * factor) as u64))
                .collect(),
        ],
    }
}

fn has(values: &[f64], want: f64) -> bool {
    values.iter().any(|v| (v - want).abs() < 1e-9)
}

/// A run of `policy` in which sharing costs nothing (the placement tests).
fn simulate(
    policy: ClusterPolicy,
    gpus: usize,
    jobs: &[SimJob],
    budgets: &Budgets,
    window: usize,
) -> PolicyReport {
    simulate_with(policy, gpus, jobs, budgets, window, false)
}

fn simulate_with(
    policy: ClusterPolicy,
    gpus: usize,
    jobs: &[SimJob],
    budgets: &Budgets,
    window: usize,
    contention: bool,
) -> PolicyReport {
    // Memory alone decides who shares a GPU here: these cases are about
    // budgets, OOMs and the pace of shared runs.
    let opts = ClusterOptions {
        window,
        contention,
        compute_shares: false,
        ..ClusterOptions::default()
    };
    run_sim(policy, gpus, jobs, budgets, &opts)
}

fn run_sim(
    policy: ClusterPolicy,
    gpus: usize,
    jobs: &[SimJob],
    budgets: &Budgets,
    opts: &ClusterOptions,
) -> PolicyReport {
    let kinds = [kind()];
    Sim::new(&inventory(gpus), jobs, &kinds, budgets, policy, opts)
        .unwrap()
        .run(&mut |_| {})
        .unwrap()
}

#[test]
fn exclusive_gpus_run_two_small_jobs_one_after_the_other_and_vramfit_side_by_side() {
    // c arrives at 200 s and closes the window utilization is averaged over.
    let jobs = [
        job("a", 0.0, 4, 100.0, 50),
        job("b", 0.0, 4, 100.0, 50),
        job("c", 200.0, 1, 1.0, 50),
    ];
    let b = budgets(1.05);
    let exclusive = simulate(ClusterPolicy::Exclusive, 1, &jobs, &b, 64);
    assert_eq!(exclusive.finished, 3);
    assert_eq!(exclusive.jct, vec![100.0, 200.0, 1.0]);
    assert!((exclusive.mean_queue_seconds - 100.0 / 3.0).abs() < 1e-9);
    // A whole GPU committed for the 200 s; 40 GiB of 100 used.
    assert!((exclusive.committed_utilization - 1.0).abs() < 1e-9);
    assert!((exclusive.memory_utilization - 0.4).abs() < 1e-9);
    assert_eq!(exclusive.makespan_seconds, 201.0);
    let vramfit = simulate(ClusterPolicy::Vramfit, 1, &jobs, &b, 64);
    assert_eq!(vramfit.jct, vec![100.0, 100.0, 1.0]);
    assert_eq!(vramfit.mean_queue_seconds, 0.0);
    // 80 GiB for the first 100 s, nothing for the next 100.
    assert!((vramfit.memory_utilization - 0.4).abs() < 1e-9);
    assert!((vramfit.committed_utilization - 0.42).abs() < 1e-9);
    assert_eq!(vramfit.oom_restarts + vramfit.ooms_absorbed, 0);
}

#[test]
fn an_under_guessed_limit_is_killed_at_its_oom_point_and_resubmitted_higher() {
    // True peak 40 GiB, guessed 30: killed 25 s into a 100 s run, then 45 GiB.
    let jobs = [job("a", 0.0, 4, 100.0, 30)];
    let r = simulate(ClusterPolicy::Guessed, 1, &jobs, &budgets(1.05), 64);
    assert_eq!(r.oom_restarts, 1);
    assert_eq!(r.finished, 1);
    assert_eq!(r.jct, vec![125.0], "25 s lost, then the whole 100 s again");
    assert!((r.wasted_gpu_hours - 25.0 / 3600.0).abs() < 1e-12);
    // An over-guess fits and runs once.
    let r = simulate(
        ClusterPolicy::Guessed,
        1,
        &[job("a", 0.0, 4, 100.0, 60)],
        &budgets(1.05),
        64,
    );
    assert_eq!((r.oom_restarts, r.jct.clone()), (0, vec![100.0]));
}

#[test]
fn guessed_limits_pack_by_the_guess() {
    // Two 60 GiB guesses do not share a 100 GiB GPU; two 45 GiB ones do.
    let high = [job("a", 0.0, 4, 100.0, 60), job("b", 0.0, 4, 100.0, 60)];
    assert_eq!(
        simulate(ClusterPolicy::Guessed, 1, &high, &budgets(1.05), 64).jct,
        vec![100.0, 200.0]
    );
    let low = [job("a", 0.0, 4, 100.0, 45), job("b", 0.0, 4, 100.0, 45)];
    assert_eq!(
        simulate(ClusterPolicy::Guessed, 1, &low, &budgets(1.05), 64).jct,
        vec![100.0, 100.0]
    );
}

#[test]
fn an_under_prediction_is_absorbed_in_the_process_at_a_smaller_micro_batch() {
    // Budgets 0.9x the true peaks: micro 4 (40 GiB) gets 36 GiB, so at
    // 25 s it halves to micro 2 (20 GiB fits) and the remaining 75 s of
    // work run 1.2x slower: 25 + 90 = 115 s. Nothing restarts.
    let r = simulate(
        ClusterPolicy::Vramfit,
        1,
        &[job("a", 0.0, 4, 100.0, 0)],
        &budgets(0.9),
        64,
    );
    assert_eq!(r.ooms_absorbed, 1);
    assert_eq!(r.oom_restarts, 0);
    assert_eq!(r.wasted_gpu_hours, 0.0);
    assert_eq!(r.jct.len(), 1);
    assert!((r.jct[0] - 115.0).abs() < 1e-9, "{:?}", r.jct);
    assert!((r.mean_slowdown - 115.0 / 100.0).abs() < 1e-9);
}

#[test]
fn an_elastic_job_starts_smaller_when_the_wait_is_long_and_waits_when_it_is_short() {
    // A long job holds 70 GiB (budget 70: micro 4 of a kind with 70 GiB... use
    // a 40 GiB job twice): two running jobs leave 20 GiB free; the third
    // job's preferred 40 GiB does not fit, micro 2 (20 GiB) does.
    let long = [
        job("a", 0.0, 4, 10_000.0, 0),
        job("b", 0.0, 4, 10_000.0, 0),
        job("c", 1.0, 4, 100.0, 0),
    ];
    let b = budgets(1.0);
    let fixed = simulate(ClusterPolicy::Vramfit, 1, &long, &b, 64);
    let elastic = simulate(ClusterPolicy::VramfitElastic, 1, &long, &b, 64);
    assert_eq!(fixed.elastic_starts, 0);
    assert_eq!(elastic.elastic_starts, 1);
    // Fixed: c waits until 10,000 s, then 100 s. Elastic: starts at 1 s at
    // micro 2, 1.2x slower.
    assert!(has(&fixed.jct, 10_000.0 - 1.0 + 100.0), "{:?}", fixed.jct);
    assert!(has(&elastic.jct, 120.0), "{:?}", elastic.jct);
    // When the running jobs end soon, waiting is better than 1.2x slower.
    let short = [
        job("a", 0.0, 4, 10.0, 0),
        job("b", 0.0, 4, 10.0, 0),
        job("c", 1.0, 4, 100.0, 0),
    ];
    let elastic = simulate(ClusterPolicy::VramfitElastic, 1, &short, &b, 64);
    assert_eq!(elastic.elastic_starts, 0);
    assert!(has(&elastic.jct, 109.0), "{:?}", elastic.jct);
}

#[test]
fn the_window_limits_backfilling_behind_a_blocked_head() {
    // a holds 40 GiB of a 50 GiB GPU... b (40) waits; c (10, micro 1)
    // may pass it only when it is inside the window.
    let jobs = [
        job("a", 0.0, 4, 100.0, 0),
        job("b", 1.0, 4, 100.0, 0),
        job("c", 2.0, 1, 100.0, 0),
    ];
    let mut b = budgets(1.0);
    // Make the GPU hold a and c only: a budget of 55 GiB for micro 4.
    b.by_kind[0][2].1 = 55 * GIB;
    let wide = simulate(ClusterPolicy::Vramfit, 1, &jobs, &b, 64);
    let narrow = simulate(ClusterPolicy::Vramfit, 1, &jobs, &b, 1);
    // Wide: c starts at 2 s (backfilled). Narrow: c waits behind b.
    let c_wide = wide.jct.iter().copied().fold(f64::INFINITY, f64::min);
    assert!((c_wide - 100.0).abs() < 1e-9, "{:?}", wide.jct);
    assert!(
        narrow.mean_jct_seconds > wide.mean_jct_seconds,
        "{narrow:?}"
    );
}

#[test]
fn a_job_no_gpu_can_hold_never_starts_and_is_counted() {
    let mut b = budgets(1.0);
    for entry in &mut b.by_kind[0] {
        entry.1 = 2 * CAP;
    }
    let r = simulate(
        ClusterPolicy::Vramfit,
        1,
        &[job("a", 0.0, 4, 100.0, 0)],
        &b,
        64,
    );
    assert_eq!((r.finished, r.never_fit), (0, 1));
}

#[test]
fn policy_names_parse_back() {
    for p in ClusterPolicy::ALL {
        assert_eq!(p.name().parse::<ClusterPolicy>().unwrap(), p);
    }
    assert!(
        "fifo"
            .parse::<ClusterPolicy>()
            .unwrap_err()
            .contains("exclusive, guessed")
    );
}

#[test]
fn the_openb_run_reports_every_policy_with_the_fixed_fields() {
    let nodes = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,V100\nn1,64000,262144,2,T4\n";
    let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,4000,8192,1,500,\np1,4000,8192,1,250,\np2,8000,16384,2,1000,\np3,4000,8192,1,1000,\n";
    let mut lines = Vec::new();
    let report = run_cluster_bench(
        nodes,
        pods,
        kinds::H200_STEP_TIMES,
        &ClusterOptions::default(),
        &mut |l| lines.push(l.to_string()),
    )
    .unwrap();
    assert_eq!(report.gpus, 4);
    let names: Vec<&str> = report.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["exclusive", "guessed", "vramfit", "vramfit-elastic"]
    );
    for p in &report.policies {
        assert_eq!(p.finished + p.never_fit, p.jobs, "{}", p.name);
    }
    let json = serde_json::to_value(&report).unwrap();
    for key in [
        "name",
        "jobs",
        "finished",
        "meanJctSeconds",
        "p95JctSeconds",
        "meanQueueSeconds",
        "memoryUtilization",
        "oomRestarts",
        "wastedGpuHours",
    ] {
        assert!(json["policies"][0].get(key).is_some(), "{key}");
    }
    assert!(
        lines.iter().any(|l| l.starts_with("exclusive:")),
        "{lines:?}"
    );
    assert!(table(&report).contains("vramfit-elastic"));
    let gain = jct_gain(&report, "vramfit", "exclusive").unwrap();
    assert!(
        gain >= 0.0,
        "vramfit is never slower than exclusive here: {gain}"
    );
}

#[test]
fn the_contention_factor_is_the_gpus_shares_at_least_one_times_the_switching_cost() {
    let cases: [(&[f64], f64); 6] = [
        (&[], 1.0),
        (&[1.0], 1.0),
        (&[0.3], 1.0),
        (&[0.5, 0.5], 1.1),
        (&[0.2, 0.3], 1.1),
        (&[1.0, 1.0], 2.2),
    ];
    for (shares, want) in cases {
        assert!(
            (contention_factor(shares) - want).abs() < 1e-12,
            "{shares:?}"
        );
    }
    // the H200's four compute-bound copies: 4.4x each
    assert!((contention_factor(&[1.0; 4]) - 4.4).abs() < 1e-12);
}

#[test]
fn jobs_sharing_a_gpu_slow_each_other_and_speed_up_when_one_ends() {
    // Two jobs of share 0.75 on one GPU: 1.5 x 1.1 = 1.65x slower while
    // both run. b's 50 s of work end at 82.5 s; a has done 50 of its 100 s
    // then and runs the other 50 alone: it ends at 132.5 s.
    let mut a = job("a", 0.0, 4, 100.0, 50);
    let mut b = job("b", 0.0, 4, 50.0, 50);
    a.share = 0.75;
    b.share = 0.75;
    let r = simulate_with(ClusterPolicy::Vramfit, 1, &[a, b], &budgets(1.05), 64, true);
    assert_eq!(r.finished, 2);
    let jct: Vec<f64> = r
        .jct
        .iter()
        .map(|t| (t * 1000.0).round() / 1000.0)
        .collect();
    assert_eq!(jct, vec![82.5, 132.5]);
    // Exclusive GPUs never share: the same jobs take 100 s and then 50 s.
    let a = shared(job("a", 0.0, 4, 100.0, 50), 0.75);
    let b = shared(job("b", 0.0, 4, 50.0, 50), 0.75);
    let r = simulate_with(
        ClusterPolicy::Exclusive,
        1,
        &[a, b],
        &budgets(1.05),
        64,
        true,
    );
    assert_eq!(r.jct, vec![100.0, 150.0]);
    // Sharing is reported in the slowdown: 132.5 + 82.5 s run for 150 s of work.
    let a = shared(job("a", 0.0, 4, 100.0, 50), 0.75);
    let b = shared(job("b", 0.0, 4, 50.0, 50), 0.75);
    let r = simulate_with(ClusterPolicy::Vramfit, 1, &[a, b], &budgets(1.05), 64, true);
    assert!(
        (r.mean_slowdown - 215.0 / 150.0).abs() < 1e-9,
        "{}",
        r.mean_slowdown
    );
}

#[test]
fn an_oom_point_moves_with_the_pace_of_a_shared_run() {
    // Under a guessed limit, a's OOM comes after a quarter of its work (25
    // s alone). Sharing the GPU with b (shares 0.75: 1.65x) it comes at 41.25
    // s; b then runs alone.
    let a = shared(job("a", 0.0, 4, 100.0, 30), 0.75);
    let b = shared(job("b", 0.0, 4, 200.0, 50), 0.75);
    let r = simulate_with(ClusterPolicy::Guessed, 1, &[a, b], &budgets(1.05), 64, true);
    assert_eq!(r.oom_restarts, 1);
    assert!(
        (r.wasted_gpu_hours - 41.25 / 3600.0).abs() < 1e-9,
        "{}",
        r.wasted_gpu_hours
    );
}

#[test]
fn with_compute_shares_jobs_share_a_gpu_only_while_their_shares_fit_it() {
    // Three jobs of 20 GiB each (micro 2): memory lets all three onto the
    // GPU. Shares 0.5, 0.5 and 0.25: the first two share it (1.1x each, the
    // switching cost), the third waits for one of them although its memory
    // fits; without compute shares all three run at once, 1.25 x 1.1 slower.
    let mut jobs = [
        job("a", 0.0, 2, 100.0, 50),
        job("b", 0.0, 2, 100.0, 50),
        job("c", 0.0, 2, 100.0, 50),
    ];
    jobs[2].share = 0.25;
    let b = budgets(1.0);
    let shares = ClusterOptions {
        contention: true,
        ..ClusterOptions::default()
    };
    let r = run_sim(ClusterPolicy::Vramfit, 1, &jobs, &b, &shares);
    let round =
        |v: &[f64]| -> Vec<f64> { v.iter().map(|t| (t * 1000.0).round() / 1000.0).collect() };
    // a and b end at 110 s; c starts then and runs alone: 210 s.
    assert_eq!(round(&r.jct), vec![110.0, 110.0, 210.0]);
    // Where the time went: c waited 110 s; the runs took 110, 110 and 100 s
    // for 100 s of work each; a completion time is wait plus run.
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(r.mean_queue_seconds, 110.0 / 3.0), "{r:?}");
    assert!(close(r.mean_run_seconds, 320.0 / 3.0), "{r:?}");
    assert!(close(r.mean_work_seconds, 100.0), "{r:?}");
    assert!(close(
        r.mean_queue_seconds + r.mean_run_seconds,
        r.mean_jct_seconds
    ));
    let memory_only = ClusterOptions {
        compute_shares: false,
        ..shares.clone()
    };
    let r = run_sim(ClusterPolicy::Vramfit, 1, &jobs, &b, &memory_only);
    assert_eq!(round(&r.jct), vec![137.5, 137.5, 137.5]);
    // The guessed limits keep the shares too.
    let r = run_sim(ClusterPolicy::Guessed, 1, &jobs, &b, &shares);
    assert_eq!(round(&r.jct), vec![110.0, 110.0, 210.0]);
}
