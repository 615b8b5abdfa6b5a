use super::*;

fn counters() -> AllocCounters {
    AllocCounters {
        device: 1,
        policy: "vramfit".into(),
        budget_bytes: 4 << 30,
        allocated_bytes: 1 << 30,
        reserved_bytes: 2 << 30,
        peak_allocated_bytes: 3 << 30,
        peak_reserved_bytes: 3 << 30,
        num_ooms: 0,
    }
}

#[test]
fn the_file_has_the_protocol_fields_and_replaces_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut stats = counters();
    write(dir.path(), 7, &stats, 1000).unwrap();
    stats.num_ooms = 1;
    write(dir.path(), 7, &stats, 2000).unwrap();
    let text = std::fs::read_to_string(dir.path().join("alloc-7-1.json")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort();
    let mut expected = vec![
        "version",
        "pid",
        "device",
        "policy",
        "budgetBytes",
        "allocatedBytes",
        "reservedBytes",
        "peakAllocatedBytes",
        "peakReservedBytes",
        "numOoms",
        "updatedUnixMs",
    ];
    expected.sort();
    assert_eq!(keys, expected);
    assert_eq!(value["numOoms"], 1);
    assert_eq!(value["updatedUnixMs"], 2000);
    assert_eq!(value["budgetBytes"], 4u64 << 30);
    // Only the final file is left: the temporary one was renamed.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("alloc-7-1.json")]);
}

#[test]
fn what_is_written_is_read_back() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 3, &counters(), 5).unwrap();
    let file = read(dir.path(), 3, 1).unwrap();
    assert_eq!(
        (file.version, file.pid, file.updated_unix_ms),
        (VERSION, 3, 5)
    );
    assert_eq!(file.counters, counters());
    assert!(matches!(read(dir.path(), 3, 0), Err(ReadError::Missing)));
    assert!(matches!(read(dir.path(), 4, 1), Err(ReadError::Missing)));
}

#[test]
fn another_version_or_no_json_is_a_format_error() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 3, &counters(), 5).unwrap();
    let path = path_for(dir.path(), 3, 1);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"version\":1", "\"version\":2")).unwrap();
    assert!(matches!(read(dir.path(), 3, 1), Err(ReadError::Format(_))));
    std::fs::write(&path, "[[[").unwrap();
    let err = read(dir.path(), 3, 1).unwrap_err();
    assert!(matches!(err, ReadError::Format(_)));
    assert!(err.is_bad_file());
    assert!(!ReadError::Missing.is_bad_file());
}

#[test]
fn a_symbolic_link_is_refused_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    // To a file of unbounded size: following it would read until memory ends.
    std::os::unix::fs::symlink("/dev/zero", path_for(dir.path(), 1, 0)).unwrap();
    assert!(matches!(read(dir.path(), 1, 0), Err(ReadError::NotRegular)));
    // Even to a valid stats file.
    write(dir.path(), 2, &counters(), 5).unwrap();
    std::os::unix::fs::symlink(path_for(dir.path(), 2, 1), path_for(dir.path(), 1, 1)).unwrap();
    assert!(matches!(read(dir.path(), 1, 1), Err(ReadError::NotRegular)));
}

#[test]
fn a_fifo_is_refused_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_for(dir.path(), 1, 0);
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    // Run it on another thread so a regression fails the test instead of
    // hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.path().to_owned();
    std::thread::spawn(move || tx.send(read(&d, 1, 0)).unwrap());
    let outcome = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("reading a FIFO blocked");
    assert!(matches!(outcome, Err(ReadError::NotRegular)));
}

#[test]
fn a_folder_or_an_oversized_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(path_for(dir.path(), 1, 0)).unwrap();
    assert!(matches!(read(dir.path(), 1, 0), Err(ReadError::NotRegular)));
    let big = path_for(dir.path(), 2, 0);
    std::fs::write(&big, vec![b' '; MAX_FILE_BYTES as usize + 1]).unwrap();
    assert!(matches!(
        read(dir.path(), 2, 0),
        Err(ReadError::TooLarge(_))
    ));
    // At the cap exactly, it is read (and then fails only as JSON).
    std::fs::write(&big, vec![b' '; MAX_FILE_BYTES as usize]).unwrap();
    assert!(matches!(read(dir.path(), 2, 0), Err(ReadError::Format(_))));
    assert_eq!(
        read_untrusted(&big, MAX_FILE_BYTES).unwrap().len() as u64,
        MAX_FILE_BYTES
    );
}
