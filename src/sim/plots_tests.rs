use super::*;
use crate::sim::{ClusterOptions, kinds::H200_STEP_TIMES, run_cluster_bench};

#[test]
fn both_charts_are_written_with_every_policy_in_the_legend() {
    let nodes = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,V100\n";
    let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,4000,8192,1,500,\np1,4000,8192,1,1000,\n";
    let report = run_cluster_bench(
        nodes,
        pods,
        H200_STEP_TIMES,
        &ClusterOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let written = write(&report, dir.path()).unwrap();
    assert_eq!(written.len(), 2);
    for path in written {
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", path.display());
        for policy in ["exclusive", "guessed", "vramfit-elastic"] {
            assert!(svg.contains(policy), "{} lacks {policy}", path.display());
        }
    }
}
