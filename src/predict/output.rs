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
            ("margin", b.margin),
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
#[path = "output_tests.rs"]
mod tests;
