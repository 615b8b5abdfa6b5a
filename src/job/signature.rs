//! Model signatures: jobs that train the same model the same way share what the
//! agents measured.

use crate::api::{TrainingJob, TrainingJobSpec};

/// A stable hash (FNV-1a over the canonical JSON) of what decides a job's
/// memory, the model section, the micro-batch and the GPU count, and of its
/// namespace: what one tenant's jobs measured or backed off to never sets
/// another tenant's budget. Stable across builds and restarts, unlike
/// `std`'s hasher, because it is stored in status.
pub fn model_signature(namespace: &str, spec: &TrainingJobSpec, micro: u32) -> String {
    let canonical = serde_json::json!({
        "namespace": namespace,
        "model": spec.model,
        "micro": micro,
        "gpus": spec.gpus,
    })
    .to_string();
    stable_hash(&canonical)
}

/// FNV-1a (64 bits) of `text` as 16 hex digits: the same on every build and
/// machine, unlike `std`'s hasher, so it can be stored and compared later.
pub fn stable_hash(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// [`model_signature`] of `job` (its namespace and spec) at `micro`.
pub fn job_signature(job: &TrainingJob, micro: u32) -> String {
    model_signature(
        job.metadata.namespace.as_deref().unwrap_or_default(),
        &job.spec,
        micro,
    )
}

#[cfg(test)]
#[path = "signature_tests.rs"]
mod tests;
