use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;

use vramfit::api::{AgentInfo, AllocatorStats, GpuDevice, GpuProcess, OomReport, ProbeStatus};

use super::*;
use crate::node::watchdog::Owner;

const GIB: u64 = 1 << 30;

fn agent(health: GpuHealth) -> Option<AgentInfo> {
    Some(AgentInfo {
        version: "0.1.0".into(),
        mode: "nvml".into(),
        health,
        message: None,
    })
}

fn gpu(index: u32, used: u64, processes: Vec<GpuProcess>) -> GpuDevice {
    GpuDevice {
        index,
        uuid: format!("GPU-{index}"),
        model: "H200".into(),
        total_bytes: 141 * GIB,
        used_bytes: used,
        context_overhead_bytes: GIB / 2,
        processes,
        health: GpuHealth::Healthy,
        probe: None,
    }
}

fn process(pid: u32, used: u64, peak: u64, pod: &str) -> GpuProcess {
    GpuProcess {
        pid,
        used_bytes: used,
        peak_bytes: peak,
        pod_namespace: Some("ml".into()),
        pod_name: Some(pod.into()),
        training_job: None,
        pod_uid: Some(format!("uid-{pod}")),
        container: None,
        allocator: None,
        shape: None,
    }
}

fn owner(namespace: &str, name: &str) -> Owner {
    Owner {
        uid: format!("uid-{name}"),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn usage(
    pod: &str,
    gpu: u32,
    used: u64,
    budget: Option<u64>,
    given: bool,
    pids: &[u32],
) -> PodGpuUsage {
    PodGpuUsage {
        owner: owner("ml", pod),
        gpu: format!("GPU-{gpu}"),
        budget_bytes: budget,
        given,
        used_bytes: used,
        pids: pids.to_vec(),
    }
}

fn order(pod: &str, gpu: u32, used: u64, budget: u64) -> StopOrder {
    StopOrder {
        owner: owner("ml", pod),
        gpu: format!("GPU-{gpu}"),
        used_bytes: used,
        budget_bytes: budget,
        pids: vec![],
        reason: "test".into(),
    }
}

fn status(health: GpuHealth, gpus: Vec<GpuDevice>) -> GpuNodeStatus {
    GpuNodeStatus {
        gpu_count: gpus.len() as u32,
        gpus,
        agent: agent(health),
        ..GpuNodeStatus::default()
    }
}

/// `name{b="1",a="2"}` as `name{a="2",b="1"}`.
fn sorted(series: &str) -> String {
    match series.split_once('{') {
        Some((name, labels)) => {
            let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
            labels.sort_unstable();
            format!("{name}{{{}}}", labels.join(","))
        }
        None => series.to_string(),
    }
}

/// The samples of an exposition: `name{label="value",...}` with the labels
/// sorted, to its value; comments checked for HELP and TYPE of each family.
fn samples(text: &str) -> BTreeMap<String, f64> {
    assert!(text.ends_with("# EOF\n"), "not OpenMetrics: {text}");
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect(line);
        let key = sorted(series);
        let value = match value {
            "NaN" => f64::NAN,
            v => v.parse().expect(line),
        };
        assert!(out.insert(key, value).is_none(), "a series twice: {line}");
    }
    out
}

fn scrape(metrics: &AgentMetrics) -> BTreeMap<String, f64> {
    samples(&metrics.shared().encode())
}

fn pass(
    metrics: &mut AgentMetrics,
    status: &GpuNodeStatus,
    usage: &[PodGpuUsage],
    orders: &[StopOrder],
) {
    metrics.observe_pass(
        status,
        usage,
        orders,
        Duration::from_millis(3),
        Instant::now(),
        1_700_000_000.5,
    );
}

/// Which series an exposition must hold (with their values) and which not.
struct Row {
    what: &'static str,
    status: GpuNodeStatus,
    usage: Vec<PodGpuUsage>,
    orders: Vec<StopOrder>,
    has: Vec<(&'static str, f64)>,
    lacks: Vec<&'static str>,
}

#[test]
fn the_encoding_follows_the_state_of_each_pass() {
    let n = |s: &str| sorted(&s.replace("NODE", "node=\"n1\""));
    let mut probed = gpu(1, 2 * GIB, vec![]);
    probed.health = GpuHealth::Degraded;
    probed.probe = Some(ProbeStatus {
        ok: false,
        bandwidth_gbps: 812.5,
        tested_bytes: 2 * GIB,
        errors: 0,
        time: None,
        message: None,
    });
    let mut with_allocator = process(11, 30 * GIB, 33 * GIB, "train-0");
    with_allocator.allocator = Some(AllocatorStats {
        num_ooms: 2,
        ..AllocatorStats::default()
    });
    let mut killed = status(
        GpuHealth::Healthy,
        vec![gpu(
            0,
            50 * GIB,
            vec![
                process(21, 45 * GIB, 45 * GIB, "greedy"),
                process(22, GIB, GIB, "stray"),
            ],
        )],
    );
    killed.oom_reports = vec![OomReport {
        pod_namespace: "ml".into(),
        pod_name: "greedy".into(),
        used_bytes: 45 * GIB,
        budget_bytes: 40 * GIB,
        time: "2026-01-01T00:00:00Z".into(),
        pod_uid: None,
        reason: None,
    }];
    let rows = vec![
        Row {
            what: "a node without GPUs (no NVML): the agent's own series only",
            status: status(GpuHealth::Degraded, vec![]),
            usage: vec![],
            orders: vec![],
            has: vec![
                ("vramfit_agent_health{NODE}", 1.0),
                ("vramfit_agent_gpus{NODE}", 0.0),
                (
                    "vramfit_agent_build_info{NODE,mode=\"nvml\",version=\"0.1.0\"}",
                    1.0,
                ),
                ("vramfit_agent_passes_total{NODE}", 1.0),
                (
                    "vramfit_agent_kills_total{NODE,reason=\"over_budget\"}",
                    0.0,
                ),
                (
                    "vramfit_agent_kills_total{NODE,reason=\"gpu_not_given\"}",
                    0.0,
                ),
                ("vramfit_agent_status_writes_total{NODE,result=\"ok\"}", 0.0),
                ("vramfit_agent_oom_reports{NODE}", 0.0),
                (
                    "vramfit_agent_last_pass_timestamp_seconds{NODE}",
                    1_700_000_000.5,
                ),
            ],
            lacks: vec![
                "vramfit_agent_gpu_",
                "vramfit_agent_pod_",
                "last_status_write",
            ],
        },
        Row {
            what: "two GPUs, a pod with its allocator's counters, a probe below expectation",
            status: status(
                GpuHealth::Healthy,
                vec![gpu(0, 31 * GIB, vec![with_allocator]), probed],
            ),
            usage: vec![usage("train-0", 0, 30 * GIB, Some(40 * GIB), true, &[11])],
            orders: vec![],
            has: vec![
                ("vramfit_agent_health{NODE}", 0.0),
                ("vramfit_agent_gpus{NODE}", 2.0),
                (
                    "vramfit_agent_gpu_memory_total_bytes{NODE,gpu=\"GPU-0\",index=\"0\",model=\"H200\"}",
                    (141 * GIB) as f64,
                ),
                (
                    "vramfit_agent_gpu_memory_used_bytes{NODE,gpu=\"GPU-0\",index=\"0\"}",
                    (31 * GIB) as f64,
                ),
                (
                    "vramfit_agent_gpu_budget_bytes{NODE,gpu=\"GPU-0\",index=\"0\"}",
                    (40 * GIB) as f64,
                ),
                (
                    "vramfit_agent_gpu_budget_bytes{NODE,gpu=\"GPU-1\",index=\"1\"}",
                    0.0,
                ),
                (
                    "vramfit_agent_gpu_context_overhead_bytes{NODE,gpu=\"GPU-1\",index=\"1\"}",
                    (GIB / 2) as f64,
                ),
                (
                    "vramfit_agent_gpu_processes{NODE,gpu=\"GPU-0\",index=\"0\"}",
                    1.0,
                ),
                (
                    "vramfit_agent_gpu_health{NODE,gpu=\"GPU-0\",index=\"0\"}",
                    0.0,
                ),
                (
                    "vramfit_agent_gpu_health{NODE,gpu=\"GPU-1\",index=\"1\"}",
                    1.0,
                ),
                (
                    "vramfit_agent_gpu_probe_ok{NODE,gpu=\"GPU-1\",index=\"1\"}",
                    0.0,
                ),
                (
                    "vramfit_agent_gpu_probe_bandwidth_gbps{NODE,gpu=\"GPU-1\",index=\"1\"}",
                    812.5,
                ),
                (
                    "vramfit_agent_gpu_probe_errors{NODE,gpu=\"GPU-1\",index=\"1\"}",
                    0.0,
                ),
                (
                    "vramfit_agent_gpu_probe_tested_bytes{NODE,gpu=\"GPU-1\",index=\"1\"}",
                    (2 * GIB) as f64,
                ),
                (
                    "vramfit_agent_pod_memory_used_bytes{NODE,gpu=\"GPU-0\",namespace=\"ml\",pod=\"train-0\"}",
                    (30 * GIB) as f64,
                ),
                (
                    "vramfit_agent_pod_budget_bytes{NODE,gpu=\"GPU-0\",namespace=\"ml\",pod=\"train-0\"}",
                    (40 * GIB) as f64,
                ),
                // The process's peak (from before a restart of the agent) is above its use now.
                (
                    "vramfit_agent_pod_peak_bytes{NODE,gpu=\"GPU-0\",namespace=\"ml\",pod=\"train-0\"}",
                    (33 * GIB) as f64,
                ),
                (
                    "vramfit_agent_pod_allocator_ooms_total{NODE,gpu=\"GPU-0\",namespace=\"ml\",pod=\"train-0\"}",
                    2.0,
                ),
            ],
            // No probe ran on GPU 0.
            lacks: vec!["vramfit_agent_gpu_probe_ok{gpu=\"GPU-0\""],
        },
        Row {
            what: "a pod stopped over its budget, another on a GPU it was not given",
            status: killed,
            usage: vec![
                usage("greedy", 0, 45 * GIB, Some(40 * GIB), true, &[21]),
                usage("stray", 0, GIB, Some(10 * GIB), false, &[22]),
            ],
            orders: vec![
                order("greedy", 0, 45 * GIB, 40 * GIB),
                order("stray", 0, GIB, 0),
            ],
            has: vec![
                (
                    "vramfit_agent_kills_total{NODE,reason=\"over_budget\"}",
                    1.0,
                ),
                (
                    "vramfit_agent_kills_total{NODE,reason=\"gpu_not_given\"}",
                    1.0,
                ),
                ("vramfit_agent_oom_reports{NODE}", 1.0),
                // A GPU not given: its budget there is 0, and the GPU's sum leaves it out.
                (
                    "vramfit_agent_pod_budget_bytes{NODE,gpu=\"GPU-0\",namespace=\"ml\",pod=\"stray\"}",
                    0.0,
                ),
                (
                    "vramfit_agent_gpu_budget_bytes{NODE,gpu=\"GPU-0\",index=\"0\"}",
                    (40 * GIB) as f64,
                ),
                (
                    "vramfit_agent_gpu_processes{NODE,gpu=\"GPU-0\",index=\"0\"}",
                    2.0,
                ),
            ],
            lacks: vec!["vramfit_agent_pod_allocator_ooms"],
        },
    ];
    for row in rows {
        let mut metrics = AgentMetrics::new("n1", "nvml", Duration::from_secs(1));
        pass(&mut metrics, &row.status, &row.usage, &row.orders);
        let text = metrics.shared().encode();
        let got = samples(&text);
        for (series, value) in &row.has {
            let series = n(series);
            assert_eq!(
                got.get(&series),
                Some(value),
                "{}: {series} in\n{text}",
                row.what
            );
        }
        for part in &row.lacks {
            let part = n(part);
            assert!(
                !got.keys().any(|k| k.contains(&part)),
                "{}: {part} in\n{text}",
                row.what
            );
        }
        // Every family has its help and type, and the histogram of the loop is there.
        assert!(
            text.contains("# TYPE vramfit_agent_kills counter"),
            "{text}"
        );
        assert!(text.contains("# HELP vramfit_agent_kills "), "{text}");
        assert_eq!(
            got.get(&n("vramfit_agent_loop_duration_seconds_count{NODE}")),
            Some(&1.0),
            "{}",
            row.what
        );
    }
}

#[test]
fn before_the_first_pass_only_the_counters_and_build_are_shown() {
    let metrics = AgentMetrics::new("n1", "simulated", Duration::from_secs(1));
    let got = scrape(&metrics);
    assert_eq!(
        got.get("vramfit_agent_passes_total{node=\"n1\"}"),
        Some(&0.0)
    );
    assert_eq!(
        got.get("vramfit_agent_build_info{mode=\"simulated\",node=\"n1\",version=\"0.1.0\"}"),
        Some(&1.0)
    );
    assert!(
        !got.keys().any(|k| k.starts_with("vramfit_agent_health")),
        "{got:?}"
    );
    assert!(
        !got.keys().any(|k| k.starts_with("vramfit_agent_last_pass")),
        "{got:?}"
    );
}

#[test]
fn the_series_of_a_pod_that_went_go_away() {
    let mut metrics = AgentMetrics::new("n1", "nvml", Duration::from_secs(1));
    let both = status(
        GpuHealth::Healthy,
        vec![gpu(
            0,
            20 * GIB,
            vec![
                process(1, 8 * GIB, 8 * GIB, "a"),
                process(2, 9 * GIB, 9 * GIB, "b"),
            ],
        )],
    );
    pass(
        &mut metrics,
        &both,
        &[
            usage("a", 0, 8 * GIB, Some(10 * GIB), true, &[1]),
            usage("b", 0, 9 * GIB, Some(10 * GIB), true, &[2]),
        ],
        &[],
    );
    let pod_series = |got: &BTreeMap<String, f64>, pod: &str| {
        got.keys()
            .filter(|k| {
                k.starts_with("vramfit_agent_pod_") && k.contains(&format!("pod=\"{pod}\""))
            })
            .count()
    };
    let got = scrape(&metrics);
    assert_eq!(pod_series(&got, "a"), 3, "{got:?}");
    assert_eq!(pod_series(&got, "b"), 3, "{got:?}");

    // Pod a ended: its series are gone, b's stay.
    let only_b = status(
        GpuHealth::Healthy,
        vec![gpu(0, 9 * GIB, vec![process(2, 9 * GIB, 9 * GIB, "b")])],
    );
    pass(
        &mut metrics,
        &only_b,
        &[usage("b", 0, 9 * GIB, Some(10 * GIB), true, &[2])],
        &[],
    );
    let got = scrape(&metrics);
    assert_eq!(pod_series(&got, "a"), 0, "{got:?}");
    assert_eq!(pod_series(&got, "b"), 3, "{got:?}");
    assert_eq!(
        got.get("vramfit_agent_gpu_budget_bytes{gpu=\"GPU-0\",index=\"0\",node=\"n1\"}"),
        Some(&((10 * GIB) as f64))
    );

    // A GPU gone (lost and dropped, or NVML gone): its series go too.
    pass(&mut metrics, &status(GpuHealth::Degraded, vec![]), &[], &[]);
    let got = scrape(&metrics);
    assert!(
        !got.keys()
            .any(|k| k.starts_with("vramfit_agent_pod_") || k.starts_with("vramfit_agent_gpu_")),
        "{got:?}"
    );
    assert!(
        metrics.peaks.is_empty(),
        "peaks kept for pods gone: {:?}",
        metrics.peaks
    );
    // The counters stay.
    assert_eq!(
        got.get("vramfit_agent_passes_total{node=\"n1\"}"),
        Some(&3.0)
    );
}

#[test]
fn a_pods_peak_is_the_most_seen_and_starts_over_for_a_pod_seen_again() {
    let mut metrics = AgentMetrics::new("n1", "nvml", Duration::from_secs(1));
    let peak = |m: &AgentMetrics| m.snapshot().pods.first().map(|p| p.peak_bytes);
    // Two processes of one pod on one GPU: together above each one's peak.
    let two = status(
        GpuHealth::Healthy,
        vec![gpu(
            0,
            12 * GIB,
            vec![
                process(1, 6 * GIB, 6 * GIB, "a"),
                process(2, 6 * GIB, 7 * GIB, "a"),
            ],
        )],
    );
    pass(
        &mut metrics,
        &two,
        &[usage("a", 0, 12 * GIB, Some(20 * GIB), true, &[1, 2])],
        &[],
    );
    assert_eq!(peak(&metrics), Some(12 * GIB));
    let lower = status(
        GpuHealth::Healthy,
        vec![gpu(0, 4 * GIB, vec![process(1, 4 * GIB, 6 * GIB, "a")])],
    );
    pass(
        &mut metrics,
        &lower,
        &[usage("a", 0, 4 * GIB, Some(20 * GIB), true, &[1])],
        &[],
    );
    assert_eq!(
        peak(&metrics),
        Some(12 * GIB),
        "a peak stays while the pod does"
    );
    pass(
        &mut metrics,
        &status(GpuHealth::Healthy, vec![gpu(0, 0, vec![])]),
        &[],
        &[],
    );
    assert_eq!(peak(&metrics), None);
    pass(
        &mut metrics,
        &lower,
        &[usage("a", 0, 4 * GIB, Some(20 * GIB), true, &[1])],
        &[],
    );
    assert_eq!(
        peak(&metrics),
        Some(6 * GIB),
        "the process's own peak, not the pod's earlier one"
    );
}

#[test]
fn kills_and_writes_count_up_across_passes() {
    let mut metrics = AgentMetrics::new("n1", "nvml", Duration::from_secs(1));
    let s = status(
        GpuHealth::Healthy,
        vec![gpu(0, 50 * GIB, vec![process(1, 45 * GIB, 45 * GIB, "a")])],
    );
    let u = [usage("a", 0, 45 * GIB, Some(40 * GIB), true, &[1])];
    for _ in 0..3 {
        pass(&mut metrics, &s, &u, &[order("a", 0, 45 * GIB, 40 * GIB)]);
    }
    metrics.observe_write(true, 1_700_000_001.0);
    metrics.observe_write(false, 1_700_000_002.0);
    metrics.observe_write(true, 1_700_000_003.0);
    metrics.observe_write(false, 1_700_000_004.0);
    let got = scrape(&metrics);
    assert_eq!(
        got.get("vramfit_agent_kills_total{node=\"n1\",reason=\"over_budget\"}"),
        Some(&3.0)
    );
    assert_eq!(
        got.get("vramfit_agent_kills_total{node=\"n1\",reason=\"gpu_not_given\"}"),
        Some(&0.0)
    );
    assert_eq!(
        got.get("vramfit_agent_status_writes_total{node=\"n1\",result=\"ok\"}"),
        Some(&2.0)
    );
    assert_eq!(
        got.get("vramfit_agent_status_writes_total{node=\"n1\",result=\"error\"}"),
        Some(&2.0)
    );
    // The last write that went through.
    assert_eq!(
        got.get("vramfit_agent_last_status_write_timestamp_seconds{node=\"n1\"}"),
        Some(&1_700_000_003.0)
    );
    assert_eq!(
        got.get("vramfit_agent_loop_duration_seconds_count{node=\"n1\"}"),
        Some(&3.0)
    );
}

#[test]
fn healthz_fails_when_the_loop_stalls_or_never_starts() {
    let t0 = Instant::now();
    let bound = stall_bound(Duration::from_secs(1));
    assert_eq!(bound, STALL_MIN);
    assert_eq!(
        stall_bound(Duration::from_secs(10)),
        Duration::from_secs(300)
    );
    let s = |secs: u64| Duration::from_secs(secs);
    let table = [
        (None, t0 + s(5), true),
        (None, t0 + STARTUP_BOUND, true),
        (None, t0 + STARTUP_BOUND + s(1), false),
        (Some(t0 + s(700)), t0 + s(701), true),
        (Some(t0 + s(700)), t0 + s(700) + bound, true),
        (Some(t0 + s(700)), t0 + s(701) + bound, false),
    ];
    for (last, now, ok) in table {
        let got = liveness(last, t0, now, bound);
        assert_eq!(got.is_ok(), ok, "{last:?} at {now:?}: {got:?}");
    }
}

#[test]
fn metrics_addresses_parse_and_empty_is_none() {
    assert_eq!(parse_addr(""), Ok(None));
    assert_eq!(parse_addr("  "), Ok(None));
    assert_eq!(
        parse_addr("0.0.0.0:9465"),
        Ok(Some("0.0.0.0:9465".parse().unwrap()))
    );
    assert_eq!(
        parse_addr("[::]:9465"),
        Ok(Some("[::]:9465".parse().unwrap()))
    );
    for bad in ["9465", "localhost", "0.0.0.0:x"] {
        let error = parse_addr(bad).unwrap_err();
        assert!(error.contains("--metrics-addr"), "{error}");
    }
}

/// One HTTP/1.0 request: status code, headers and body.
fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, head.to_lowercase(), body.to_string())
}

#[test]
fn the_server_answers_from_the_latest_pass_and_never_holds_the_loop() {
    let mut metrics = AgentMetrics::new("n1", "nvml", Duration::from_secs(1));
    let server = serve("127.0.0.1:0".parse().unwrap(), metrics.shared()).unwrap();
    let addr = server.local_addr();

    let (code, head, body) = get(addr, "/healthz");
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("ok: starting"), "{body}");

    let s = status(
        GpuHealth::Healthy,
        vec![gpu(0, 10 * GIB, vec![process(1, 8 * GIB, 8 * GIB, "a")])],
    );
    let u = [usage("a", 0, 8 * GIB, Some(10 * GIB), true, &[1])];
    pass(&mut metrics, &s, &u, &[]);
    let (code, head2, body) = get(addr, "/metrics");
    assert_eq!(code, 200);
    assert!(
        head2.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head2}"
    );
    let got = samples(&body);
    assert_eq!(
        got.get("vramfit_agent_pod_memory_used_bytes{gpu=\"GPU-0\",namespace=\"ml\",node=\"n1\",pod=\"a\"}"),
        Some(&((8 * GIB) as f64))
    );
    assert!(
        head.starts_with("http/1.0 200") || head.starts_with("http/1.1 200"),
        "{head}"
    );
    let (code, _, body) = get(addr, "/healthz");
    assert_eq!(
        (code, body.starts_with("ok: last pass")),
        (200, true),
        "{body}"
    );
    assert_eq!(get(addr, "/nothing").0, 404);

    // Clients that hold connections open half-way through a request, and
    // others scraping all along: the passes go on at their own pace.
    let stuck: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ").unwrap();
            s
        })
        .collect();
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicUsize::new(0));
    let scrapers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, scrapes) = (stop.clone(), scrapes.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(get(addr, "/metrics").0, 200);
                    scrapes.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut passes = 1;
    let deadline = Instant::now() + Duration::from_secs(20);
    while passes < 300 || scrapes.load(Ordering::Relaxed) < 50 {
        assert!(Instant::now() < deadline, "no 50 scrapes within 20 s");
        let t = Instant::now();
        pass(&mut metrics, &s, &u, &[]);
        slowest = slowest.max(t.elapsed());
        passes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for scraper in scrapers {
        scraper.join().unwrap();
    }
    // A pass's share of the metrics is a copy and a pointer swap: far below
    // a millisecond; the bound only guards against waiting on the server.
    assert!(
        slowest < Duration::from_millis(200),
        "a pass took {slowest:?}"
    );
    let got = samples(&get(addr, "/metrics").2);
    assert_eq!(
        got.get("vramfit_agent_passes_total{node=\"n1\"}"),
        Some(&(passes as f64))
    );
    drop(stuck);

    // Dropped with the loop: the port is let go.
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the server still listens after it was dropped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_port_in_use_is_refused_at_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let metrics = AgentMetrics::new("n1", "nvml", Duration::from_secs(1));
    let error = serve(addr, metrics.shared()).unwrap_err();
    assert!(format!("{error:#}").contains("--metrics-addr"), "{error:#}");
}

/// A node of one GPU whose one process (of pod `ml/greedy`) uses 3 GiB
/// against a budget of 1 GiB.
struct OverBudgetNode {
    stopped: Arc<std::sync::atomic::AtomicUsize>,
}

struct GreedyOwner;

impl crate::node::report::OwnerLookup for GreedyOwner {
    fn owner_of(&self, _: u32) -> Option<crate::node::report::ProcessOwner> {
        Some(crate::node::report::ProcessOwner {
            owner: owner("ml", "greedy"),
            training_job: None,
            container: None,
            budget_bytes: Some(GIB),
            gpus: Some(vec!["GPU-0".into()]),
            stats_dir: None,
            namespace_pid: None,
        })
    }
    fn is_running(&self, _: u32) -> bool {
        true
    }
}

impl super::super::NodeBackend for OverBudgetNode {
    fn mode(&self) -> &'static str {
        "simulated"
    }
    fn read(&mut self, _: Instant) -> crate::gpu::Reading {
        crate::gpu::Reading {
            gpus: vec![crate::gpu::GpuReading {
                index: 0,
                uuid: "GPU-0".into(),
                model: "H200".into(),
                total_bytes: 141 * GIB,
                used_bytes: 3 * GIB,
                processes: vec![crate::gpu::ProcessSample {
                    pid: 4242,
                    used_bytes: 3 * GIB,
                }],
                health: GpuHealth::Healthy,
                problem: None,
            }],
            ..Default::default()
        }
    }
    fn owners(&self) -> Box<dyn crate::node::report::OwnerLookup + '_> {
        Box::new(GreedyOwner)
    }
    fn stop(&mut self, _: &StopOrder) {
        self.stopped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn context_overhead(&mut self, _: &crate::gpu::Reading) -> HashMap<String, u64> {
        HashMap::new()
    }
    fn probe(&mut self, _: &crate::gpu::Reading) -> HashMap<String, ProbeStatus> {
        HashMap::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_serves_what_each_pass_saw() {
    // A free port (bound, read, let go: the loop binds it again).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut options = super::super::RunOptions::new("n1");
    options.interval = Duration::from_millis(50);
    options.probe_at_start = false;
    options.measure_context_overhead = false;
    options.watchdog.grace = Duration::ZERO;
    options.metrics_addr = Some(addr);
    let stopped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let backend = Box::new(OverBudgetNode {
        stopped: stopped.clone(),
    });
    let (quit, quitting) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(super::super::run_loop(options, backend, None, async {
        let _ = quitting.await;
    }));
    let scraped = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if TcpStream::connect(addr).is_ok() {
                let (_, _, body) = get(addr, "/metrics");
                let got = samples(&body);
                if got
                    .get("vramfit_agent_kills_total{node=\"n1\",reason=\"over_budget\"}")
                    .is_some_and(|k| *k >= 2.0)
                {
                    return got;
                }
            }
            assert!(Instant::now() < deadline, "no two kills served within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap();
    let _ = quit.send(());
    agent.await.unwrap().unwrap();
    assert!(stopped.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    let series = |s: &str| scraped.get(s).copied();
    assert_eq!(series("vramfit_agent_health{node=\"n1\"}"), Some(0.0));
    assert_eq!(
        series("vramfit_agent_gpu_memory_used_bytes{gpu=\"GPU-0\",index=\"0\",node=\"n1\"}"),
        Some((3 * GIB) as f64)
    );
    assert_eq!(
        series(
            "vramfit_agent_pod_budget_bytes{gpu=\"GPU-0\",namespace=\"ml\",node=\"n1\",pod=\"greedy\"}"
        ),
        Some(GIB as f64)
    );
    assert_eq!(
        series(
            "vramfit_agent_pod_peak_bytes{gpu=\"GPU-0\",namespace=\"ml\",node=\"n1\",pod=\"greedy\"}"
        ),
        Some((3 * GIB) as f64)
    );
    assert!(series("vramfit_agent_oom_reports{node=\"n1\"}").unwrap() >= 2.0);
    // Standalone: each status published counts as written.
    assert!(series("vramfit_agent_status_writes_total{node=\"n1\",result=\"ok\"}").unwrap() >= 1.0);
    // The loop ended: so did its server.
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).is_ok() {
        assert!(Instant::now() < deadline, "the server outlived the loop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every agent series, as a scrape names them (counters with `_total`,
/// histograms with their three), from a pass where each has a value.
fn exported_series() -> Vec<String> {
    let mut metrics = AgentMetrics::new("n1", "nvml", Duration::from_secs(1));
    let mut probed = gpu(0, 10 * GIB, vec![process(1, 8 * GIB, 8 * GIB, "a")]);
    probed.probe = Some(ProbeStatus::default());
    probed.processes[0].allocator = Some(AllocatorStats::default());
    let s = status(GpuHealth::Healthy, vec![probed]);
    pass(
        &mut metrics,
        &s,
        &[usage("a", 0, 8 * GIB, Some(GIB), true, &[1])],
        &[],
    );
    metrics.observe_write(true, 1.0);
    let text = metrics.shared().encode();
    let mut names = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => names.push(format!("{name}_total")),
            "info" => names.push(format!("{name}_info")),
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.push(format!("{name}{suffix}"));
                }
            }
            _ => names.push(name.to_string()),
        }
    }
    names
}

fn dashboard() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/vramfit/dashboards/vramfit.json"
    );
    std::fs::read_to_string(path).expect("the chart's dashboard exists")
}

#[test]
fn the_dashboard_queries_only_series_the_agent_exports() {
    let dashboard = dashboard();
    let exported = exported_series();
    let mut queried = 0;
    for (start, _) in dashboard.match_indices("vramfit_agent_") {
        let name: String = dashboard[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(
            exported.contains(&name),
            "the dashboard queries {name}, which the agent does not export (exported: {exported:?})"
        );
        queried += 1;
    }
    assert!(
        queried >= 10,
        "the dashboard queries {queried} agent series"
    );
}

#[test]
fn every_agent_metric_has_a_dashboard_panel() {
    let dashboard = dashboard();
    let exported = exported_series();
    assert!(exported.len() >= 20, "{exported:?}");
    // Families a panel needs no series of: what the agent is (the dashboard's
    // node list reads build_info), and figures of a GPU shown elsewhere.
    let beside = [
        "vramfit_agent_passes_total",
        "vramfit_agent_last_status_write_timestamp_seconds",
        "vramfit_agent_gpu_context_overhead_bytes",
        "vramfit_agent_gpu_processes",
        "vramfit_agent_gpu_probe_ok",
        "vramfit_agent_gpu_probe_tested_bytes",
        "vramfit_agent_loop_duration_seconds_sum",
        "vramfit_agent_loop_duration_seconds_count",
    ];
    for name in &exported {
        assert!(
            dashboard.contains(name.as_str()) || beside.contains(&name.as_str()),
            "{name} is exported but on no dashboard panel"
        );
    }
}
