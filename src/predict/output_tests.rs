use super::*;
use crate::api::MemoryBreakdown;

fn prediction(breakdown: MemoryBreakdown) -> Prediction {
    Prediction {
        peak_bytes: 3 << 30,
        reserved_bytes: 2 << 30,
        allocated_bytes: 1 << 30,
        breakdown,
        micro_batch: 4,
        grad_accum: 2,
        parameters: 7,
        gpu: "h200",
    }
}

#[test]
fn a_model_prediction_is_shown_by_cause_and_a_profile_by_lifetime() {
    let analytic = prediction_table(&prediction(MemoryBreakdown {
        parameters: 1 << 30,
        gradients: 512 << 20,
        ..Default::default()
    }));
    let lines: Vec<&str> = analytic.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["PART", "GiB", "BYTES"]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["parameters", "1.000", "1073741824"]
    );
    assert_eq!(
        lines[2].split_whitespace().collect::<Vec<_>>(),
        ["gradients", "0.500", "536870912"]
    );
    assert!(!analytic.contains("persistent state"), "{analytic}");
    let peak = lines
        .iter()
        .find(|l| l.starts_with("peak (process)"))
        .unwrap();
    assert_eq!(
        peak.split_whitespace().collect::<Vec<_>>(),
        ["peak", "(process)", "3.000", "3221225472"]
    );
    assert!(
        analytic.ends_with("micro-batch 4 x accumulation 2 on h200\n"),
        "{analytic}"
    );

    // One persistent byte makes it a profile's breakdown.
    let profiled = prediction_table(&prediction(MemoryBreakdown {
        persistent: 1,
        ..Default::default()
    }));
    assert!(profiled.contains("persistent state"), "{profiled}");
    assert!(!profiled.contains("parameters"), "{profiled}");
}

#[test]
fn the_json_keeps_its_field_names() {
    let v = prediction_json(&prediction(MemoryBreakdown::default()));
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "allocatedBytes",
            "breakdown",
            "gpu",
            "gradAccum",
            "microBatch",
            "parameters",
            "peakBytes",
            "reservedBytes"
        ]
    );
    assert_eq!(v["peakBytes"], 3u64 << 30);
    assert_eq!(v["gradAccum"], 2);
}
