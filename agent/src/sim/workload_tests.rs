use super::*;

const G: u64 = 1 << 30;

fn workload(peak: u64, budget: Option<u64>) -> Workload {
    Workload {
        started: Instant::now(),
        run_for: Duration::from_secs(20),
        context_bytes: G,
        true_peak_bytes: peak,
        budget_bytes: budget,
    }
}

#[test]
fn a_process_within_its_budget_ramps_to_its_peak_and_succeeds() {
    let w = workload(11 * G, Some(20 * G));
    let at = |s: u64| w.started + Duration::from_secs(s);
    assert_eq!(w.used_at(at(0)), G);
    assert_eq!(w.used_at(at(5)), 6 * G);
    assert_eq!(w.used_at(at(10)), 11 * G);
    assert_eq!(w.used_at(at(15)), 11 * G);
    assert_eq!(w.exit_at(at(19)), None);
    assert_eq!(w.exit_at(at(20)).unwrap().code, 0);
}

#[test]
fn a_process_over_its_budget_fails_with_the_oom_protocol_when_it_crosses_it() {
    let w = workload(21 * G, Some(11 * G));
    let at = |s: u64| w.started + Duration::from_secs(s);
    // It reaches 11 GiB after half its ramp (5 s) and never exceeds it.
    assert_eq!(w.exit_at(at(4)), None);
    assert_eq!(w.used_at(at(9)), 11 * G);
    let exit = w.exit_at(at(5)).unwrap();
    assert_eq!((exit.code, exit.phase()), (42, "Failed"));
    assert!(
        exit.message.contains("CUDA out of memory"),
        "{}",
        exit.message
    );
}

#[test]
fn without_a_budget_nothing_stops_it() {
    let w = workload(200 * G, None);
    assert_eq!(w.used_at(w.started + Duration::from_secs(10)), 200 * G);
    assert_eq!(
        w.exit_at(w.started + Duration::from_secs(20)).unwrap().code,
        0
    );
}

#[test]
fn peak_annotations_give_fixed_or_per_sample_peaks() {
    assert_eq!(peak_from_annotation("30Gi", 8), Some(30 * G));
    assert_eq!(peak_from_annotation("10Gi+2Gi", 8), Some(26 * G));
    assert_eq!(peak_from_annotation("10Gi + 2Gi", 4), Some(18 * G));
    assert_eq!(peak_from_annotation("lots", 8), None);
    assert_eq!(peak_from_annotation("10Gi+x", 8), None);
}
