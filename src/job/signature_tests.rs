use super::*;

fn spec(layers: u32, gpus: u32) -> TrainingJobSpec {
    TrainingJob::test("j")
        .gpus(gpus)
        .batch(64, 8)
        .model(serde_json::json!({"mlp": {"layers": layers, "hidden": 1024}}))
        .template(serde_json::json!({}))
        .build()
        .spec
}

#[test]
fn the_signature_is_a_fixed_hash_of_model_micro_batch_and_gpus() {
    // Stored in status and compared across restarts and builds: the value
    // for a given namespace and spec must never change. (It changed once,
    // when the namespace joined it: lessons learned before are not reused.)
    assert_eq!(model_signature("ml", &spec(4, 1), 8), "4c7d382ee714dfff");
}

#[test]
fn model_micro_batch_and_gpu_count_each_change_the_signature() {
    let base = model_signature("ml", &spec(4, 1), 8);
    assert_ne!(base, model_signature("ml", &spec(4, 1), 4), "micro-batch");
    assert_ne!(base, model_signature("ml", &spec(5, 1), 8), "model");
    assert_ne!(base, model_signature("ml", &spec(4, 2), 8), "GPU count");
    assert_ne!(base, model_signature("team-b", &spec(4, 1), 8), "namespace");
}

#[test]
fn what_does_not_decide_memory_leaves_the_signature_alone() {
    let base = model_signature("ml", &spec(4, 1), 8);
    let mut other = spec(4, 1);
    other.priority = 7;
    other.batch.global = 128;
    other.max_oom_retries = 1;
    other
        .template
        .insert("metadata".into(), serde_json::json!({"labels": {"a": "b"}}));
    assert_eq!(base, model_signature("ml", &other, 8));
}

/// FNV-1a's published test vectors: the hash stored in status and in the
/// profiles' ConfigMap names stays what it was.
#[test]
fn the_stable_hash_is_fnv1a_64() {
    assert_eq!(stable_hash(""), "cbf29ce484222325");
    assert_eq!(stable_hash("a"), "af63dc4c8601ec8c");
    assert_eq!(stable_hash("foobar"), "85944171f73967e8");
}
