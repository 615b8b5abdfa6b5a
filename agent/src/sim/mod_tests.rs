use super::*;

#[test]
fn simulate_specs_name_a_count_and_a_predictor_model() {
    let spec = parse_sim_spec("8xH200").unwrap();
    assert_eq!((spec.count, spec.profile.name), (8, "H200"));
    assert_eq!(
        parse_sim_spec("2xa100-80gb").unwrap().profile.name,
        "A100-80GB"
    );
    assert_eq!(parse_sim_spec("L4").unwrap().count, 1);
    let error = parse_sim_spec("4xB300").unwrap_err();
    assert!(error.contains("B300") && error.contains("H200"), "{error}");
    assert!(parse_sim_spec("0xH200").is_err());
}

#[test]
fn simulated_gpus_report_the_pods_processes_and_the_watchdog_kill_ends_them() {
    let spec = parse_sim_spec("2xH200").unwrap();
    let state = Arc::new(Mutex::new(SimState::new(
        "n",
        spec,
        Duration::from_secs(20),
    )));
    let now = Instant::now();
    state.lock().unwrap().pods.insert(
        "u1".into(),
        SimPod {
            owner: Owner {
                uid: "u1".into(),
                namespace: "ml".into(),
                name: "a-a1".into(),
            },
            training_job: Some("a".into()),
            containers: vec!["train".into()],
            budget_bytes: Some(20 << 30),
            gpus: vec!["GPU-n-1".into()],
            pid: 100_001,
            workload: Workload {
                started: now,
                run_for: Duration::from_secs(20),
                context_bytes: 1 << 30,
                true_peak_bytes: 11 << 30,
                budget_bytes: Some(20 << 30),
            },
            killed: false,
            reported_end: false,
        },
    );
    let mut node = SimNode::new(state.clone(), 1 << 30);
    let reading = node.read(now + Duration::from_secs(10));
    assert!(reading.gpus[0].processes.is_empty());
    assert_eq!(reading.gpus[1].processes[0].used_bytes, 11 << 30);
    assert_eq!(reading.gpus[1].model, "H200");
    let owner = node.owners().owner_of(100_001).unwrap();
    assert_eq!(owner.owner.name, "a-a1");
    node.stop(&StopOrder {
        owner: owner.owner,
        gpu: "GPU-n-1".into(),
        used_bytes: 0,
        budget_bytes: 0,
        pids: vec![100_001],
        reason: "test".into(),
    });
    let exit = state.lock().unwrap().pods["u1"].exit_at(now).unwrap();
    assert_eq!(exit.code, kubelet::SIGKILL_EXIT_CODE);
    assert!(node.read(now).gpus[1].processes.is_empty());
}
