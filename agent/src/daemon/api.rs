//! The agent's writes to the API server: its `GpuNode` (created on first
//! contact, status by server-side apply under the field manager
//! `vramfit-agent`) and the clearing of a probe request.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use vramfit::api::{GpuNode, GpuNodeStatus};

/// The agent's field manager.
pub const FIELD_MANAGER: &str = "vramfit-agent";

/// Annotation that asks the agent to probe its GPUs again; the agent removes
/// it once the probe ran.
pub const PROBE_ANNOTATION: &str = "vramfit.dev/probe-requested";

/// Writes one node's `GpuNode`. Clones share whether the object exists.
#[derive(Clone)]
pub struct GpuNodeWriter {
    api: Api<GpuNode>,
    name: String,
    labels: BTreeMap<String, String>,
    exists: Arc<AtomicBool>,
}

impl GpuNodeWriter {
    /// A writer of the `GpuNode` named `name`, carrying `labels`.
    pub fn new(client: Client, name: &str, labels: BTreeMap<String, String>) -> Self {
        Self {
            api: Api::all(client),
            name: name.into(),
            labels,
            exists: Arc::default(),
        }
    }

    fn params() -> PatchParams {
        // The agent is the only writer of the status: it takes the fields
        // even from a manager that wrote them before (a test driver, an older
        // agent).
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Creates the object (or updates the agent's labels on it).
    pub async fn ensure(&self) -> kube::Result<GpuNode> {
        let object = json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": self.name, "labels": self.labels},
            // Required by the schema; an empty object claims none of its
            // fields (`cordoned` stays the admins').
            "spec": {},
        });
        let node = self
            .api
            .patch(&self.name, &Self::params(), &Patch::Apply(&object))
            .await?;
        self.exists.store(true, Ordering::Relaxed);
        Ok(node)
    }

    /// The status an earlier agent on this node left (OOM reports, peaks),
    /// so a restart keeps them.
    pub async fn previous_status(&self) -> kube::Result<Option<GpuNodeStatus>> {
        Ok(self.api.get_opt(&self.name).await?.and_then(|n| n.status))
    }

    /// Writes the status; returns the object as the API server now has it.
    pub async fn write(&self, status: &GpuNodeStatus) -> kube::Result<GpuNode> {
        if !self.exists.load(Ordering::Relaxed) {
            self.ensure().await?;
        }
        let patch = json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "GpuNode",
            "status": status,
        });
        match self
            .api
            .patch_status(&self.name, &Self::params(), &Patch::Apply(&patch))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 => {
                // Deleted under us: create it again on the next write.
                self.exists.store(false, Ordering::Relaxed);
                Err(kube::Error::Api(e))
            }
            other => other,
        }
    }

    /// Removes the probe request once the probe ran.
    pub async fn clear_probe_request(&self) -> kube::Result<()> {
        let patch = json!({"metadata": {"annotations": {PROBE_ANNOTATION: null}}});
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

/// True when the object asks for a probe.
pub fn probe_requested(node: &GpuNode) -> bool {
    node.annotations().contains_key(PROBE_ANNOTATION)
}

/// Reports a stats file the agent skipped as a Warning event on its pod
/// (`BadStatsFile`), once per file for the agent's life; a failure to
/// publish is logged.
pub async fn publish_bad_file(
    client: kube::Client,
    node: String,
    bad: crate::node::report::BadStatsFile,
) {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "vramfit-agent".into(),
            instance: Some(node),
        },
    );
    let pod = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(bad.owner.namespace.clone()),
        name: Some(bad.owner.name.clone()),
        uid: Some(bad.owner.uid.clone()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: BAD_STATS_FILE.into(),
        note: Some(bad_file_note(&bad)),
        action: "ReadStats".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &pod).await {
        tracing::warn!(pod = %bad.owner.name, "cannot publish the BadStatsFile event: {e}");
    }
}

/// The reason of the event on a pod whose stats file was skipped.
pub const BAD_STATS_FILE: &str = "BadStatsFile";

/// The event's text: which file, why, and what it costs the pod.
pub fn bad_file_note(bad: &crate::node::report::BadStatsFile) -> String {
    format!(
        "vramfit-agent skipped the stats file {} ({}): its counters are not reported \
         (docs/node-protocol.md says what the helper writes there)",
        bad.file, bad.error
    )
}
