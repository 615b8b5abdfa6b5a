//! `vramfit-agent run` as a process: the simulated `--once` status (with the
//! `sim` feature; without it `--simulate` is refused), the daemon without
//! NVML, and bad flags.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn agent() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vramfit-agent"));
    // Never reach a cluster from these tests.
    command
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST");
    command
}

#[cfg(feature = "sim")]
#[test]
fn simulate_once_prints_the_gpu_node_status_without_an_api_server() {
    let output = agent()
        .args([
            "run",
            "--simulate",
            "2xH200",
            "--node",
            "demo",
            "--once",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status["gpuCount"], 2);
    assert_eq!(status["model"], "H200");
    assert_eq!(status["gpus"][1]["uuid"], "GPU-demo-1");
    assert_eq!(status["gpus"][0]["totalBytes"], 143_771u64 << 20);
    assert_eq!(status["gpus"][0]["health"], "Healthy");
    assert_eq!(status["agent"]["mode"], "simulated");
    assert!(status["heartbeat"].is_string());
}

#[test]
fn without_nvml_the_agent_runs_degraded_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("status.json");
    let mut child = standalone_agent(&file, &[], &[]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent keeps running"
    );
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    if status["agent"]["health"] == "Healthy" {
        // A machine with NVML (the GPU machine): the GPUs are there.
        assert!(status["gpuCount"].as_u64().unwrap() > 0, "{status}");
    } else {
        assert_eq!(status["agent"]["health"], "Degraded", "{status}");
        let message = status["agent"]["message"].as_str().unwrap();
        assert!(message.contains("NVML unavailable"), "{message}");
    }
    // SAFETY: kill(2) with the child's PID and a signal number.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}");
}

/// The shipped agent (no `sim` feature) has no simulated node: `--simulate`
/// and `bench agents` are refused with a message that names the build that
/// has them, and neither is in the help.
#[cfg(not(feature = "sim"))]
#[test]
fn without_the_sim_feature_the_simulated_node_is_refused_and_not_offered() {
    for args in [
        &["run", "--node", "n", "--once", "--simulate", "2xH200"][..],
        &["bench", "agents", "--agents", "3", "--simulate", "8xH200"][..],
    ] {
        let output = agent()
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("built without the simulated node (the `sim` feature)"),
            "{args:?}: {stderr}"
        );
    }
    for args in [&["run", "--help"][..], &["bench", "--help"][..]] {
        let help = agent().args(args).output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(
            !help.contains("simulate") && !help.contains("agents"),
            "{help}"
        );
    }
}

#[test]
fn bad_flags_are_refused_with_a_clear_message() {
    for (args, says) in [
        #[cfg(feature = "sim")]
        (vec!["--simulate", "4xB300"], "the predictor knows"),
        (vec!["--local-budget", "x=1Gi"], "not a PID"),
        (vec!["--interval", "10"], "give a unit"),
        (vec!["--label", "novalue"], "KEY=VALUE"),
    ] {
        let output = agent()
            .args(["run", "--node", "n", "--once"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// Built with the `cuda` feature on a machine without the CUDA driver (CI,
/// the development machine): cudarc would panic on its first call, so the
/// agent must check first, start, and say why it is Degraded.
#[cfg(feature = "cuda")]
#[test]
fn without_libcuda_the_cuda_build_starts_degraded_and_the_probe_fails_cleanly() {
    if vramfit_agent::cuda::require_driver().is_ok() {
        eprintln!("skipped: this machine has the CUDA driver library");
        return;
    }
    // The probe at start and the context measurement both need CUDA.
    let output = agent()
        .args([
            "run",
            "--node",
            "n",
            "--once",
            "-o",
            "json",
            "--probe-gib",
            "1",
        ])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for line in [
        "CUDA context overhead not measured: the CUDA driver library libcuda.so not found",
        "GPUs not probed: the CUDA driver library libcuda.so not found",
    ] {
        assert!(
            stderr.contains(&format!("{line} by the dynamic loader")),
            "{line}: {stderr}"
        );
    }
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status["agent"]["health"], "Degraded", "{status}");
    let message = status["agent"]["message"].as_str().unwrap();
    assert!(message.contains("GPUs not probed"), "{message}");

    let output = agent()
        .args(["probe"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("libcuda.so not found by the dynamic loader"),
        "{stderr}"
    );
}

/// `vramfit run --local` starts this binary beside each attempt with
/// `agent_args`: the real agent must accept them, run beside the process,
/// write its status file and stop on the SIGTERM `finish` sends.
#[test]
fn the_agent_vramfit_run_local_starts_accepts_its_flags_and_stops_cleanly() {
    use vramfit::cli::run::agent::AttemptWatchdog;
    let dir = tempfile::tempdir().unwrap();
    let mut training = Command::new("sleep").arg("30").spawn().unwrap();
    let watchdog = AttemptWatchdog::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_vramfit-agent")),
        training.id(),
        20 << 30,
        Duration::from_millis(100),
        dir.path(),
    )
    .unwrap();
    let status_file = dir.path().join("agent-status.json");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !status_file.exists() {
        assert!(Instant::now() < deadline, "no status written");
        std::thread::sleep(Duration::from_millis(50));
    }
    training.kill().unwrap();
    training.wait().unwrap();
    // Nothing over budget here (no GPU, or a sleeping process): no report.
    let stopped = watchdog.finish().unwrap_or_else(|e| {
        let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
        panic!("{e}: {log}")
    });
    assert_eq!(stopped, None);
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
    assert!(log.contains("agent stops"), "{log}");
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status_file).unwrap()).unwrap();
    assert_eq!(status["agent"]["mode"], "nvml");

    // An agent that ends on its own is an error that names its log. The
    // stand-in marks that it ran before it exits: on a loaded machine its
    // start can take longer than any fixed wait.
    let marker = dir.path().join("ran");
    let agent = dir.path().join("failing-agent");
    std::fs::write(
        &agent,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let early =
        AttemptWatchdog::start(&agent, 1, 1, Duration::from_millis(100), dir.path()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the stand-in never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let error = early.finish().unwrap_err().to_string();
    assert!(
        error.contains("ended early") && error.contains("agent.log"),
        "{error}"
    );
}

/// The agent must not outlive a `vramfit run --local` that dies: it gets
/// SIGTERM when the thread that started it ends (PR_SET_PDEATHSIG).
#[test]
fn the_agent_of_a_local_run_stops_when_its_parent_goes() {
    use vramfit::cli::run::agent::AttemptWatchdog;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let status_file = dir.path().join("agent-status.json");
    // The parent: a thread that starts the agent, leaks the handle (no
    // Drop, as when vramfit is killed) and ends.
    std::thread::spawn(move || {
        let watchdog = AttemptWatchdog::start(
            std::path::Path::new(env!("CARGO_BIN_EXE_vramfit-agent")),
            std::process::id(),
            1 << 40,
            Duration::from_millis(100),
            &path,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !status_file.exists() {
            assert!(Instant::now() < deadline, "no status written");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::mem::forget(watchdog);
    })
    .join()
    .unwrap();
    let log = dir.path().join("agent.log");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("agent stops") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent kept running without its parent: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a standalone agent (no probe, a status every 100 ms into `file`)
/// with `extra` arguments and `envs`, standard error piped, and waits for its
/// first status.
fn standalone_agent(file: &std::path::Path, extra: &[&str], envs: &[(&str, &str)]) -> Child {
    let child = agent()
        .args([
            "run",
            "--node",
            "n",
            "--standalone",
            "--no-probe",
            "--interval",
            "100ms",
        ])
        .args(extra)
        .envs(envs.iter().copied())
        .arg("--status-file")
        .arg(file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !file.exists() {
        assert!(Instant::now() < deadline, "no status written");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// Runs a standalone agent for a moment with `extra` arguments and returns
/// what it logged on standard error (a pipe, not a terminal).
fn logged_by_a_short_run(extra: &[&str], envs: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("status.json");
    let envs: Vec<(&str, &str)> = [("RUST_LOG", "debug")]
        .into_iter()
        .chain(envs.iter().copied())
        .collect();
    let child = standalone_agent(&file, extra, &envs);
    // SAFETY: kill(2) with the child's PID and a signal number.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{:?}", output.status);
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn log_format_json_writes_one_object_a_line_and_text_has_no_colour_off_a_terminal() {
    for (extra, envs) in [
        (&["--log-format", "json"][..], &[][..]),
        (&[][..], &[("VRAMFIT_LOG_FORMAT", "json")][..]),
    ] {
        let log = logged_by_a_short_run(extra, envs);
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(!lines.is_empty(), "nothing logged");
        for line in lines {
            let object: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{extra:?} {envs:?}: not JSON ({e}): {line}"));
            assert!(object["level"].is_string(), "{line}");
            assert!(object["timestamp"].is_string(), "{line}");
            assert!(
                object.get("message").is_some() || object.get("target").is_some(),
                "{line}"
            );
        }
        assert!(!log.contains('\u{1b}'), "{log:?}");
    }
    let text = logged_by_a_short_run(&[], &[]);
    assert!(!text.trim().is_empty(), "nothing logged");
    assert!(
        serde_json::from_str::<serde_json::Value>(text.lines().next().unwrap()).is_err(),
        "text by default: {text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "colour codes off a terminal: {text:?}"
    );
    let refused = agent()
        .args(["run", "--node", "n", "--once", "--log-format", "yaml"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--log-format"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
