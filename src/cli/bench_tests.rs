use super::*;

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
        n0,96000,786432,8,V100M32\n\
        n1,96000,786432,2,T4\n";
const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
        p0,4000,16384,1,500,,BE,Running,0,0,0\n\
        p1,8000,32768,2,1000,,LS,Running,0,0,0\n\
        p2,2000,8192,0,0,,BE,Running,0,0,0\n\
        p3,16000,65536,1,1000,V100M32,LS,Running,0,0,0\n";

/// A file of its own for each call: the tests run in parallel, and a path shared
/// between them lets one test read a file another is rewriting.
fn write(text: &str) -> tempfile::TempPath {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    file.into_temp_path()
}

fn pack(output: OutputFormat, seeds: Option<(u64, u64)>) -> String {
    let (nodes, pods) = (write(NODES), write(PODS));
    let args = PackArgs {
        nodes: Some(nodes.to_path_buf()),
        pods: Some(pods.to_path_buf()),
        tune: 1.3,
        seed: 42,
        seeds,
        policy: PolicyKind::Vramfit,
        synthetic: None,
        jobs: 0,
        output,
    };
    run(&BenchCommand::Pack(args)).unwrap()
}

#[test]
fn bench_pack_prints_a_table_when_asked() {
    let table = pack(OutputFormat::Table, None);
    assert!(table.starts_with("policy vramfit, seed 42:"), "{table}");
    assert!(table.contains("ARRIVED  ALLOCATED"));
    assert!(table.contains("   130%"));
    assert!(serde_json::from_str::<serde_json::Value>(&table).is_err());
    let json: serde_json::Value = serde_json::from_str(&pack(OutputFormat::Json, None)).unwrap();
    assert_eq!(json["seed"], 42);
}

#[test]
fn a_seed_sweep_table_has_one_row_per_seed() {
    let table = pack(OutputFormat::Table, Some((42, 44)));
    assert!(table.contains("mean over seeds 42..44 (3 runs)"), "{table}");
    for seed in ["42  ", "43  ", "44  "] {
        assert!(
            table.lines().any(|l| l.starts_with(seed)),
            "no row for {seed}: {table}"
        );
    }
}

#[test]
fn a_capture_is_read_plain_or_gzipped_and_the_plain_one_first() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let gz = |text: &str| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    std::fs::write(dir.join("a.profile.json.gz"), gz("{\"gz\":1}")).unwrap();
    std::fs::write(dir.join("b.profile.json"), "{\"plain\":1}").unwrap();
    std::fs::write(dir.join("b.profile.json.gz"), gz("{\"gz\":2}")).unwrap();
    std::fs::write(dir.join("c.profile.json.gz"), b"not gzip").unwrap();
    assert_eq!(captured_profile(dir, "a").as_deref(), Some("{\"gz\":1}"));
    assert_eq!(captured_profile(dir, "b").as_deref(), Some("{\"plain\":1}"));
    assert_eq!(captured_profile(dir, "c"), None);
    assert_eq!(captured_profile(dir, "missing"), None);
}
