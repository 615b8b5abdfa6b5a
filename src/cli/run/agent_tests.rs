use super::*;
use crate::api::OomReport;

#[test]
fn the_agent_watches_the_attempt_standalone_without_touching_the_gpu_at_start() {
    let args = agent_args(
        4242,
        20 << 30,
        Duration::from_millis(500),
        Path::new("/w/a/s.json"),
    );
    let joined = args.join(" ");
    assert!(
        joined.starts_with("run --node local --standalone"),
        "{joined}"
    );
    for part in [
        "--no-probe",
        "--no-context-overhead",
        "--interval 500ms",
        "--local-budget 4242=21474836480",
        "--status-file /w/a/s.json",
    ] {
        assert!(joined.contains(part), "{part}: {joined}");
    }
}

#[test]
fn only_a_report_for_the_attempts_process_stops_it() {
    let report = |uid: &str, reason: Option<&str>| OomReport {
        pod_namespace: String::new(),
        pod_name: uid.replace("local-", "pid-"),
        used_bytes: 30,
        budget_bytes: 20,
        time: "t".into(),
        pod_uid: Some(uid.into()),
        reason: reason.map(Into::into),
    };
    let mut status = GpuNodeStatus::default();
    assert_eq!(stop_reason(&status, 7), None);
    status.oom_reports = vec![report("local-8", Some("other"))];
    assert_eq!(stop_reason(&status, 7), None);
    status
        .oom_reports
        .push(report("local-7", Some("over budget")));
    assert_eq!(stop_reason(&status, 7).as_deref(), Some("over budget"));
    status.oom_reports = vec![report("local-7", None)];
    assert_eq!(
        stop_reason(&status, 7).as_deref(),
        Some("30 bytes over a budget of 20")
    );
}

#[test]
fn an_agent_given_explicitly_must_exist() {
    let error = find_agent(Some(Path::new("/nonexistent/vramfit-agent"))).unwrap_err();
    assert!(error.to_string().contains("no such file"), "{error}");
    let here = std::env::current_exe().unwrap();
    assert_eq!(find_agent(Some(&here)).unwrap(), here);
}
