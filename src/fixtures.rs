//! Test fixtures: one builder of TrainingJobs and one of GpuNodes for every
//! test (unit tests, the integration tests, the benchmarks), so a test says
//! only what matters to it.
//!
//! ```ignore
//! let job = TrainingJob::test("gpt2").gpus(2).micro(16).request("20Gi").build();
//! let manifest = TrainingJob::test("gpt2").min_micro(2).manifest(); // to apply
//! let node = GpuNode::test("n1").heartbeat(NOW).gpu("H200", 140 << 30).used(0).build();
//! ```
//!
//! The default job is `ml/<name>` (uid `uid-<name>`, generation 1): an MLP of
//! two layers of 64, global batch 8 at micro-batch 8, one GPU, a template with
//! one container and no status. [`JobBuilder::build`] gives that TrainingJob
//! as the controller's cache holds it; [`JobBuilder::manifest`] gives what a
//! user applies: the same spec, and in its metadata only the name and what
//! the test set (no namespace, uid or generation unless set).
//!
//! The default GpuNode has its name, an empty spec and no status; each
//! status setter adds its field only.
//!
//! Built into unit tests (`cfg(test)`) and, through the `testing` feature
//! (the crate's dev-dependency on itself turns it on), into the integration
//! tests and benchmarks; never into the shipped binary.

use serde_json::{Map, Value, json};

use crate::api::{GpuNode, Phase, TrainingJob, TrainingJobStatus};

/// Sets each key of `patch` in `target` (an object; made one if it is not).
fn merge(target: &mut Value, patch: Value) {
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in patch.as_object().cloned().unwrap_or_default() {
        target[key] = value;
    }
}

/// The metadata: `defaults` overlaid with `set`; keys set to `null` removed.
fn metadata(defaults: Value, set: &Map<String, Value>) -> Value {
    let mut metadata = defaults;
    merge(&mut metadata, Value::Object(set.clone()));
    metadata
        .as_object_mut()
        .expect("metadata is an object")
        .retain(|_, v| !v.is_null());
    metadata
}

impl TrainingJob {
    /// A test TrainingJob named `name`; see the module's documentation.
    pub fn test(name: &str) -> JobBuilder {
        let mut set = Map::new();
        set.insert("name".into(), json!(name));
        JobBuilder {
            name: name.into(),
            metadata: set,
            spec: json!({
                "batch": {"global": 8, "micro": 8},
                "model": {"mlp": {"layers": 2, "hidden": 64}},
                "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}
            }),
            status: None,
            status_fields: None,
        }
    }
}

/// A TrainingJob being built; see the module's documentation.
#[derive(Debug, Clone)]
pub struct JobBuilder {
    name: String,
    /// Metadata the test set (the name at least).
    metadata: Map<String, Value>,
    spec: Value,
    status: Option<TrainingJobStatus>,
    /// Status fields set as JSON, laid over `status`.
    status_fields: Option<Value>,
}

impl JobBuilder {
    /// Sets a metadata field (`uid`, `resourceVersion`, `creationTimestamp`,
    /// `finalizers`, ...) to `value`; `null` removes it (a default too).
    pub fn meta(mut self, key: &str, value: Value) -> Self {
        self.metadata.insert(key.into(), value);
        self
    }

    /// The namespace.
    pub fn namespace(self, namespace: &str) -> Self {
        self.meta("namespace", json!(namespace))
    }

    /// The uid.
    pub fn uid(self, uid: &str) -> Self {
        self.meta("uid", json!(uid))
    }

    /// The resource version.
    pub fn resource_version(self, version: &str) -> Self {
        self.meta("resourceVersion", json!(version))
    }

    /// The creation time (RFC 3339).
    pub fn created(self, time: &str) -> Self {
        self.meta("creationTimestamp", json!(time))
    }

    /// Sets each top-level key of `fields` in the spec (replacing it).
    pub fn spec(mut self, fields: Value) -> Self {
        merge(&mut self.spec, fields);
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

    /// Global batch and micro-batch (the whole `spec.batch`).
    pub fn batch(self, global: u32, micro: u32) -> Self {
        self.spec(json!({"batch": {"global": global, "micro": micro}}))
    }

    /// Sets each key of `fields` in `spec.batch`, the rest kept.
    fn batch_fields(mut self, fields: Value) -> Self {
        merge(&mut self.spec["batch"], fields);
        self
    }

    /// The micro-batch (`spec.batch.micro`).
    pub fn micro(self, micro: u32) -> Self {
        self.batch_fields(json!({ "micro": micro }))
    }

    /// The smallest micro-batch (`spec.batch.minMicro`).
    pub fn min_micro(self, min_micro: u32) -> Self {
        self.batch_fields(json!({ "minMicro": min_micro }))
    }

    /// Whether the controller picks the micro-batch (`spec.batch.autoMicro`).
    pub fn auto_micro(self, auto: bool) -> Self {
        self.batch_fields(json!({ "autoMicro": auto }))
    }

    /// Memory-elastic placement (`spec.batch.elastic`).
    pub fn elastic(self, elastic: bool) -> Self {
        self.batch_fields(json!({ "elastic": elastic }))
    }

    /// The user's estimate of the run time (`spec.expectedDuration`).
    pub fn expected_duration(self, duration: &str) -> Self {
        self.spec(json!({ "expectedDuration": duration }))
    }

    /// The model description (`spec.model`).
    pub fn model(self, model: Value) -> Self {
        self.spec(json!({ "model": model }))
    }

    /// The memory request (`spec.memory.request`, a quantity: `20Gi`).
    pub fn request(self, request: &str) -> Self {
        self.spec(json!({"memory": {"request": request}}))
    }

    /// `spec.maxOOMRetries`.
    pub fn max_oom_retries(self, retries: u32) -> Self {
        self.spec(json!({ "maxOOMRetries": retries }))
    }

    /// The whole pod template (`spec.template`).
    pub fn template(self, template: Value) -> Self {
        self.spec(json!({ "template": template }))
    }

    /// The pod template's `spec`.
    pub fn template_spec(self, spec: Value) -> Self {
        self.template(json!({ "spec": spec }))
    }

    /// The status as given.
    pub fn status(mut self, status: TrainingJobStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets each key of `fields` in the status (JSON, as the API server
    /// stores it), over what was set before.
    pub fn status_fields(mut self, fields: Value) -> Self {
        merge(self.status_fields.get_or_insert_with(|| json!({})), fields);
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

    /// Running on `node`'s GPUs `gpus` (uuids `GPU-<index>`) with a budget
    /// of `budget_bytes` a GPU, placed for the status's attempt (1 if none).
    pub fn placed(self, node: &str, gpus: &[u32], budget_bytes: u64) -> Self {
        let attempt = self.status_json().and_then(|s| s["attempt"].as_u64());
        let assigned: Vec<Value> = gpus
            .iter()
            .map(|i| json!({"index": i, "uuid": format!("GPU-{i}")}))
            .collect();
        self.status_fields(json!({"phase": "Running", "placement": {
            "node": node, "gpus": assigned, "budgetBytes": budget_bytes,
            "memoryFraction": 0.1, "attempt": attempt.unwrap_or(1)}}))
    }

    /// The status so far as JSON (`None`: no status).
    fn status_json(&self) -> Option<Value> {
        let mut status = match &self.status {
            Some(typed) => serde_json::to_value(typed).expect("a status serializes"),
            None => self.status_fields.as_ref()?.clone(),
        };
        if self.status.is_some()
            && let Some(fields) = &self.status_fields
        {
            merge(&mut status, fields.clone());
        }
        Some(status)
    }

    /// The manifest a user applies: `apiVersion`, `kind`, the metadata the
    /// test set and the spec (no status).
    pub fn manifest(&self) -> Value {
        json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": metadata(json!({}), &self.metadata), "spec": self.spec
        })
    }

    /// The job, as the controller's cache holds it (namespace `ml`, uid
    /// `uid-<name>`, generation 1 unless set).
    pub fn build(self) -> TrainingJob {
        let defaults = json!({"namespace": "ml", "uid": format!("uid-{}", self.name),
                              "generation": 1});
        let mut job: TrainingJob = serde_json::from_value(json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": metadata(defaults, &self.metadata), "spec": self.spec
        }))
        .expect("the fixture builds a valid TrainingJob");
        job.status = match (&self.status, &self.status_fields) {
            (status, None) => status.clone(),
            _ => Some(
                serde_json::from_value(self.status_json().expect("a status"))
                    .expect("the fixture builds a valid status"),
            ),
        };
        job
    }
}

impl GpuNode {
    /// A test GpuNode named `name`; see the module's documentation.
    pub fn test(name: &str) -> GpuNodeBuilder {
        GpuNodeBuilder {
            metadata: json!({ "name": name }),
            status: None,
        }
    }
}

/// A GpuNode being built; see the module's documentation.
#[derive(Debug, Clone)]
pub struct GpuNodeBuilder {
    metadata: Value,
    status: Option<Value>,
}

impl GpuNodeBuilder {
    /// A label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.metadata["labels"][key] = json!(value);
        self
    }

    /// Sets each key of `fields` in the status.
    pub fn status_fields(mut self, fields: Value) -> Self {
        merge(self.status.get_or_insert_with(|| json!({})), fields);
        self
    }

    /// The agent's heartbeat (RFC 3339).
    pub fn heartbeat(self, time: &str) -> Self {
        self.status_fields(json!({ "heartbeat": time }))
    }

    /// The GPUs as given (`status.gpus`, a JSON array of devices).
    pub fn gpus(self, gpus: Value) -> Self {
        self.status_fields(json!({ "gpus": gpus }))
    }

    /// Adds a GPU of `model` with `total_bytes`: the next index, uuid
    /// `GPU-<index>`; [`used`](Self::used), [`health`](Self::health) and
    /// [`uuid`](Self::uuid) then set its other fields.
    pub fn gpu(self, model: &str, total_bytes: u64) -> Self {
        let mut gpus = self
            .status
            .as_ref()
            .and_then(|s| s["gpus"].as_array().cloned())
            .unwrap_or_default();
        let index = gpus.len();
        gpus.push(
            json!({"index": index, "uuid": format!("GPU-{index}"), "model": model,
                         "totalBytes": total_bytes}),
        );
        self.gpus(Value::Array(gpus))
    }

    /// Sets `field` of the GPU added last.
    fn last_gpu(mut self, field: &str, value: Value) -> Self {
        let gpu = self
            .status
            .as_mut()
            .and_then(|s| s["gpus"].as_array_mut())
            .and_then(|gpus| gpus.last_mut())
            .expect("a GPU added first (GpuNodeBuilder::gpu)");
        gpu[field] = value;
        self
    }

    /// The memory in use on the GPU added last.
    pub fn used(self, bytes: u64) -> Self {
        self.last_gpu("usedBytes", json!(bytes))
    }

    /// The health of the GPU added last (`Healthy`, `Faulty`, ...).
    pub fn health(self, health: &str) -> Self {
        self.last_gpu("health", json!(health))
    }

    /// The uuid of the GPU added last.
    pub fn uuid(self, uuid: &str) -> Self {
        self.last_gpu("uuid", json!(uuid))
    }

    /// The manifest (`apiVersion`, `kind`, metadata, an empty spec, the
    /// status if any was set).
    pub fn manifest(&self) -> Value {
        let mut node = json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "GpuNode",
            "metadata": self.metadata, "spec": {}
        });
        if let Some(status) = &self.status {
            node["status"] = status.clone();
        }
        node
    }

    /// The GpuNode.
    pub fn build(self) -> GpuNode {
        serde_json::from_value(self.manifest()).expect("the fixture builds a valid GpuNode")
    }
}

#[cfg(test)]
#[path = "fixtures_tests.rs"]
mod tests;
