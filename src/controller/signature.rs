//! Model signatures: jobs that train the same model the same way share what the
//! agents measured.

use crate::api::TrainingJobSpec;

/// A stable hash (FNV-1a over the canonical JSON) of what decides a job's
/// memory: the model section, the micro-batch and the GPU count. Stable across
/// builds and restarts, unlike `std`'s hasher, because it is stored in status.
pub fn model_signature(spec: &TrainingJobSpec, micro: u32) -> String {
    let canonical = serde_json::json!({
        "model": spec.model,
        "micro": micro,
        "gpus": spec.gpus,
    })
    .to_string();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(layers: u32) -> TrainingJobSpec {
        serde_json::from_value(serde_json::json!({
            "batch": {"global": 64, "micro": 8},
            "model": {"mlp": {"layers": layers, "hidden": 1024}},
            "template": {}
        }))
        .unwrap()
    }

    #[test]
    fn same_model_and_micro_batch_share_a_signature() {
        assert_eq!(model_signature(&spec(4), 8), model_signature(&spec(4), 8));
        assert_ne!(model_signature(&spec(4), 8), model_signature(&spec(4), 4));
        assert_ne!(model_signature(&spec(4), 8), model_signature(&spec(5), 8));
        assert_eq!(model_signature(&spec(4), 8).len(), 16);
    }
}
