use super::*;

const NOW: i64 = 1_764_547_200_000;

fn alloc_json(updated: i64) -> String {
    format!(
        r#"{{"version": 1, "pid": 1, "device": 0, "policy": "vramfit",
               "budgetBytes": 100, "allocatedBytes": 10, "reservedBytes": 20,
               "peakAllocatedBytes": 30, "peakReservedBytes": 40, "numOoms": 2,
               "updatedUnixMs": {updated}}}"#
    )
}

#[test]
fn allocator_counters_are_read_unless_stale_or_of_another_version() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("alloc-1-0.json"), alloc_json(NOW - 1000)).unwrap();
    let stats = read_allocator(dir.path(), 1, 0, NOW, &mut Vec::new()).unwrap();
    assert_eq!(
        (
            stats.reserved_bytes,
            stats.peak_reserved_bytes,
            stats.num_ooms
        ),
        (20, 40, 2)
    );
    assert_eq!(stats.policy, "vramfit");
    assert!(stats.updated.unwrap().starts_with("2025-11-30T23:59:59"));
    assert_eq!(
        read_allocator(dir.path(), 1, 1, NOW, &mut Vec::new()),
        None,
        "another device"
    );
    assert_eq!(
        read_allocator(dir.path(), 2, 0, NOW, &mut Vec::new()),
        None,
        "another pid"
    );
    assert_eq!(
        read_allocator(
            dir.path(),
            1,
            0,
            NOW + STALE_AFTER_MS + 1001,
            &mut Vec::new()
        ),
        None,
        "stale"
    );
    std::fs::write(
        dir.path().join("alloc-1-0.json"),
        alloc_json(NOW).replace("\"version\": 1", "\"version\": 2"),
    )
    .unwrap();
    assert_eq!(
        read_allocator(dir.path(), 1, 0, NOW, &mut Vec::new()),
        None,
        "version 2"
    );
    std::fs::write(dir.path().join("alloc-1-0.json"), "{\"vers").unwrap();
    assert_eq!(
        read_allocator(dir.path(), 1, 0, NOW, &mut Vec::new()),
        None,
        "half a file"
    );
}

#[test]
fn shape_files_carry_absorbed_ooms() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("shape-7.json"),
        r#"{"version": 1, "pid": 7, "microBatch": 8, "gradAccum": 8, "globalBatch": 64,
               "attempt": 1, "absorbedOoms": [{"fromMicro": 16, "toMicro": 8, "fromAccum": 4,
               "toAccum": 8, "unixMs": 1764547200000}]}"#,
    )
    .unwrap();
    let shape = read_shape(dir.path(), 7, &mut Vec::new()).unwrap();
    assert_eq!((shape.micro_batch, shape.grad_accum), (8, 8));
    assert_eq!(shape.absorbed_ooms.len(), 1);
    assert_eq!(shape.absorbed_ooms[0].from_micro, 16);
    assert_eq!(shape.absorbed_ooms[0].time, "2025-12-01T00:00:00Z");
    assert_eq!(read_shape(dir.path(), 8, &mut Vec::new()), None);
}

#[test]
fn shape_files_carry_progress_and_older_ones_none() {
    let dir = tempfile::tempdir().unwrap();
    let old = r#"{"version": 1, "pid": 7, "microBatch": 8, "gradAccum": 8, "globalBatch": 64,
               "attempt": 1, "absorbedOoms": [], "updatedUnixMs": 1764547200000}"#;
    std::fs::write(dir.path().join("shape-7.json"), old).unwrap();
    let shape = read_shape(dir.path(), 7, &mut Vec::new()).unwrap();
    assert_eq!((shape.micro_batch, shape.progress), (8, None));
    let new = old.replace(
        "\"absorbedOoms\": [],",
        r#""absorbedOoms": [], "progress": {"steps": 120, "totalSteps": 1000,
               "secondsPerStep": 0.84, "unixMs": 1764547200000},"#,
    );
    std::fs::write(dir.path().join("shape-7.json"), new).unwrap();
    let mut bad = Vec::new();
    let progress = read_shape(dir.path(), 7, &mut bad)
        .unwrap()
        .progress
        .unwrap();
    assert!(bad.is_empty());
    assert_eq!(
        (
            progress.steps,
            progress.total_steps,
            progress.seconds_per_step
        ),
        (120, Some(1000), Some(0.84))
    );
    assert_eq!(progress.time, "2025-12-01T00:00:00Z");
}

#[test]
fn hostile_files_are_skipped_without_blocking_or_reading_them_whole() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("alloc-1-0.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("shape-1.json")).unwrap();
    let fifo = std::ffi::CString::new(
        dir.path()
            .join("shape-2.json")
            .as_os_str()
            .as_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let d = dir.path().to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bad = Vec::new();
        let read = (
            read_allocator(&d, 1, 0, NOW, &mut bad),
            read_shape(&d, 1, &mut bad),
            read_shape(&d, 2, &mut bad),
            // Missing is not bad: the process has not published yet.
            read_shape(&d, 3, &mut bad),
        );
        tx.send((read, bad)).unwrap()
    });
    let (got, bad) = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("a stats read blocked");
    assert_eq!(got, (None, None, None, None));
    let names: Vec<(String, String)> = bad
        .iter()
        .map(|(p, e)| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                e.clone(),
            )
        })
        .collect();
    let not_regular = "not a regular file".to_string();
    assert_eq!(
        names,
        [
            ("alloc-1-0.json".to_string(), not_regular.clone()),
            ("shape-1.json".to_string(), not_regular.clone()),
            ("shape-2.json".to_string(), not_regular),
        ]
    );
}
