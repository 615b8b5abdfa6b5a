use super::*;

#[test]
fn gpus_and_memory_are_read_from_nvidia_smi_csv() {
    let gpus = parse_gpus("0, GPU-aaaa, 143771\n1, GPU-bbbb, 143771\n").unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[1].uuid, "GPU-bbbb");
    assert_eq!(gpus[0].total_bytes, 143_771 * MIB);
    assert!(parse_gpus("0, GPU-a").is_err());

    let apps = parse_compute_apps("4242, 1024\n4242, 512\n77, [N/A]\nNo running processes found\n");
    assert_eq!(apps[&4242], 1536 * MIB);
    assert_eq!(apps[&77], 0);
    assert_eq!(parse_device_used("0, 100\n1, 7\n")[&1], 7 * MIB);
}

#[test]
fn the_process_tree_follows_parents() {
    assert_eq!(parse_ppid("123 (python3 -c (x)) S 45 123 ..."), Some(45));
    let pairs = [(2, 1), (3, 2), (4, 9), (5, 3)];
    assert_eq!(descendants(1, &pairs), BTreeSet::from([1, 2, 3, 5]));
}
