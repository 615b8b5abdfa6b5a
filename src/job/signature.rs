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

    fn spec(layers: u32, gpus: u32) -> TrainingJobSpec {
        serde_json::from_value(serde_json::json!({
            "gpus": gpus,
            "batch": {"global": 64, "micro": 8},
            "model": {"mlp": {"layers": layers, "hidden": 1024}},
            "template": {}
        }))
        .unwrap()
    }

    #[test]
    fn the_signature_is_a_fixed_hash_of_model_micro_batch_and_gpus() {
        // Stored in status and compared across restarts and builds: the value
        // for a given spec must never change.
        assert_eq!(model_signature(&spec(4, 1), 8), "c77e554bcc880a39");
    }

    #[test]
    fn model_micro_batch_and_gpu_count_each_change_the_signature() {
        let base = model_signature(&spec(4, 1), 8);
        assert_ne!(base, model_signature(&spec(4, 1), 4), "micro-batch");
        assert_ne!(base, model_signature(&spec(5, 1), 8), "model");
        assert_ne!(base, model_signature(&spec(4, 2), 8), "GPU count");
    }

    #[test]
    fn what_does_not_decide_memory_leaves_the_signature_alone() {
        let base = model_signature(&spec(4, 1), 8);
        let mut other = spec(4, 1);
        other.priority = 7;
        other.batch.global = 128;
        other.max_oom_retries = 1;
        other
            .template
            .insert("metadata".into(), serde_json::json!({"labels": {"a": "b"}}));
        assert_eq!(base, model_signature(&other, 8));
    }
}
