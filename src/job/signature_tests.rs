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
