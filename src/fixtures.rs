//! Test fixtures: one builder of TrainingJobs for every unit test, so a test
//! says only what matters to it.
//!
//! ```ignore
//! let job = fixtures::job("gpt2").gpus(2).micro(16).budget(20 << 30).build();
//! ```
//!
//! The default job is `ml/j` (uid `uid-<name>`, generation 1): an MLP of two
//! layers of 64, global batch 8 at micro-batch 8, one GPU, a template with one
//! container and no status.

use serde_json::{Value, json};

use crate::api::{Phase, TrainingJob, TrainingJobStatus};

/// A TrainingJob being built; see the module's documentation.
#[derive(Debug, Clone)]
pub struct JobBuilder {
    metadata: Value,
    spec: Value,
    status: Option<TrainingJobStatus>,
}

/// A job named `name` in namespace `ml`.
pub fn job(name: &str) -> JobBuilder {
    JobBuilder {
        metadata: json!({"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "generation": 1}),
        spec: json!({
            "batch": {"global": 8, "micro": 8},
            "model": {"mlp": {"layers": 2, "hidden": 64}},
            "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}
        }),
        status: None,
    }
}

impl JobBuilder {
    /// Sets a metadata field (`uid`, `resourceVersion`, `creationTimestamp`,
    /// ...) to `value`; `null` removes it.
    pub fn meta(mut self, key: &str, value: Value) -> Self {
        if value.is_null() {
            self.metadata.as_object_mut().unwrap().remove(key);
        } else {
            self.metadata[key] = value;
        }
        self
    }

    /// The namespace.
    pub fn namespace(self, namespace: &str) -> Self {
        self.meta("namespace", json!(namespace))
    }

    /// The creation time (RFC 3339).
    pub fn created(self, time: &str) -> Self {
        self.meta("creationTimestamp", json!(time))
    }

    /// Sets each top-level key of `fields` in the spec (replacing it).
    pub fn spec(mut self, fields: Value) -> Self {
        for (key, value) in fields.as_object().cloned().unwrap_or_default() {
            self.spec[key] = value;
        }
        self
    }

    /// GPUs per job.
    pub fn gpus(self, gpus: u32) -> Self {
        self.spec(json!({"gpus": gpus}))
    }

    /// Scheduling priority.
    pub fn priority(self, priority: i32) -> Self {
        self.spec(json!({"priority": priority}))
    }

    /// Global batch and micro-batch.
    pub fn batch(self, global: u32, micro: u32) -> Self {
        self.spec(json!({"batch": {"global": global, "micro": micro}}))
    }

    /// The model description (`spec.model`).
    pub fn model(self, model: Value) -> Self {
        self.spec(json!({ "model": model }))
    }

    /// The pod template's `spec`.
    pub fn template_spec(self, spec: Value) -> Self {
        self.spec(json!({"template": {"spec": spec}}))
    }

    /// The status as given.
    pub fn status(mut self, status: TrainingJobStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// A status of attempt 1 with a predicted budget of `bytes`, waiting to
    /// be placed.
    pub fn budget(self, bytes: u64) -> Self {
        self.status(TrainingJobStatus {
            attempt: 1,
            budget_bytes: Some(bytes),
            ..Default::default()
        })
    }

    /// A status in `phase` and nothing else.
    pub fn phase(self, phase: Phase) -> Self {
        self.status(TrainingJobStatus {
            phase,
            ..Default::default()
        })
    }

    /// The job.
    pub fn build(self) -> TrainingJob {
        let mut job: TrainingJob = serde_json::from_value(json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": self.metadata, "spec": self.spec
        }))
        .expect("the fixture builds a valid TrainingJob");
        job.status = self.status;
        job
    }
}

#[cfg(test)]
#[path = "fixtures_tests.rs"]
mod tests;
