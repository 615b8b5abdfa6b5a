use super::*;

#[test]
fn local_budgets_parse_with_and_without_suffixes() {
    assert_eq!(parse_local_budget("4242=1073741824"), Ok((4242, 1 << 30)));
    assert_eq!(parse_local_budget("7=20Gi"), Ok((7, 20 << 30)));
    assert_eq!(parse_local_budget("7=1.5Gi"), Ok((7, 3 << 29)));
    for bad in ["7", "x=1", "7=lots", "7=-1"] {
        let error = parse_local_budget(bad).unwrap_err();
        assert!(error.contains(bad), "{error}");
    }
}

#[test]
fn only_watched_processes_have_owners() {
    let owners = LocalOwners::new(ProcFs::default(), BTreeMap::from([(10, 5)]));
    assert_eq!(owners.owner_of(10).unwrap().budget_bytes, Some(5));
    assert_eq!(owners.owner_of(11), None);
}

#[test]
fn a_watched_process_owns_its_descendants_and_nothing_else() {
    // The shell stays (two commands), with `sleep` as its child.
    let mut shell = std::process::Command::new("sh")
        .args(["-c", "sleep 30; true"])
        .spawn()
        .unwrap();
    let shell_pid = shell.id();
    let proc = ProcFs::default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let sleep_pid = loop {
        let child = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|&p| proc.parent_of(p) == Some(shell_pid));
        if let Some(child) = child {
            break child;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no child of the shell"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let owners = LocalOwners::new(proc.clone(), BTreeMap::from([(shell_pid, 7)]));
    let owner = owners.owner_of(sleep_pid).expect("the child is owned");
    assert_eq!(owner.owner.uid, format!("local-{shell_pid}"));
    assert_eq!(owner.budget_bytes, Some(7));
    // This test process is the shell's parent: not owned.
    assert_eq!(owners.owner_of(std::process::id()), None);
    let _ = shell.kill();
    let _ = shell.wait();
    let _ = std::process::Command::new("kill")
        .arg(sleep_pid.to_string())
        .status();
}

#[test]
fn the_watchdog_kill_stops_a_real_process_and_ignores_one_already_gone() {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id();
    let order = StopOrder {
        owner: LocalOwners::new(ProcFs::default(), BTreeMap::from([(pid, 1)]))
            .owner_of(pid)
            .unwrap()
            .owner,
        gpu: "GPU-0".into(),
        used_bytes: 2,
        budget_bytes: 1,
        pids: vec![pid],
        reason: "over".into(),
    };
    // Not seen in a reading: a descriptor is opened for the kill.
    assert!(
        kill_processes(&order, &PidFds::default())
            .iter()
            .all(|(_, r)| r.is_ok())
    );
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    // Reaped: the PID no longer exists.
    assert!(
        kill_processes(&order, &PidFds::default())
            .iter()
            .all(|(_, r)| r.is_ok())
    );
}

/// The descriptor opened when a process was seen names that process only:
/// once it has exited and been reaped, a kill through it reaches nothing,
/// where kill(2) of its PID would reach whichever process got the PID next.
#[test]
fn a_kill_goes_to_the_process_seen_not_to_its_pid() {
    use std::collections::HashSet;
    use std::os::unix::process::ExitStatusExt;
    let spawn = || {
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap()
    };
    let (mut first, mut second) = (spawn(), spawn());
    let mut fds = PidFds::default();
    fds.track(&HashSet::from([first.id(), second.id()]));
    assert!(fds.tracks(first.id()) && fds.tracks(second.id()));
    // The next reading sees only the second: the first's descriptor closes.
    fds.track(&HashSet::from([second.id()]));
    assert!(!fds.tracks(first.id()));
    assert!(fds.tracks(second.id()));
    fds.kill(second.id()).unwrap();
    assert_eq!(second.wait().unwrap().signal(), Some(libc::SIGKILL));
    // The second is gone and reaped while its descriptor is still held:
    // the kill reaches nothing and is not an error.
    fds.kill(second.id()).unwrap();
    // The first, not signalled by any of this, still runs.
    assert!(first.try_wait().unwrap().is_none());
    first.kill().unwrap();
    first.wait().unwrap();
}

mod duration {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10").unwrap_err().contains("unit"));
        assert!(parse_duration("xs").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
