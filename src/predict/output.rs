//! The fixed output shapes of `vramfit predict`: JSON and a table.

use serde_json::{Value, json};

use super::Prediction;

/// `{"peakBytes", "reservedBytes", "breakdown", "microBatch", "gradAccum", ...}`.
pub fn prediction_json(p: &Prediction) -> Value {
    json!({
        "peakBytes": p.peak_bytes,
        "reservedBytes": p.reserved_bytes,
        "breakdown": p.breakdown,
        "microBatch": p.micro_batch,
        "gradAccum": p.grad_accum,
        "allocatedBytes": p.allocated_bytes,
        "parameters": p.parameters,
        "gpu": p.gpu,
    })
}

/// The breakdown as a table for `-o table`.
pub fn prediction_table(p: &Prediction) -> String {
    let b = &p.breakdown;
    // A profile records sizes, not causes: its allocations that outlive the
    // step are one line, the step's transient ones another.
    let profiled = b.persistent > 0;
    let rows: Vec<(&str, u64)> = if profiled {
        vec![
            ("persistent state", b.persistent),
            ("step transients", b.activations),
            ("workspace", b.workspace),
            ("context", b.context),
            ("allocator overhead", b.allocator_overhead),
        ]
    } else {
        vec![
            ("parameters", b.parameters),
            ("gradients", b.gradients),
            ("optimizer", b.optimizer),
            ("activations", b.activations),
            ("workspace", b.workspace),
            ("context", b.context),
            ("allocator overhead", b.allocator_overhead),
        ]
    };
    let mut s = format!("{:<20} {:>12} {:>16}\n", "PART", "GiB", "BYTES");
    for (name, v) in rows {
        s += &format!(
            "{name:<20} {:>12.3} {v:>16}\n",
            v as f64 / f64::from(1u32 << 30)
        );
    }
    s += &format!(
        "{:<20} {:>12.3} {:>16}\n",
        "peak (process)",
        p.peak_bytes as f64 / f64::from(1u32 << 30),
        p.peak_bytes
    );
    s += &format!(
        "{:<20} {:>12.3} {:>16}\n",
        "reserved (allocator)",
        p.reserved_bytes as f64 / f64::from(1u32 << 30),
        p.reserved_bytes
    );
    s += &format!(
        "micro-batch {} x accumulation {} on {}\n",
        p.micro_batch, p.grad_accum, p.gpu
    );
    s
}

#[cfg(test)]
mod tests {
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
}
