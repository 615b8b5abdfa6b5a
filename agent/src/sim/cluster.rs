//! What a kubelet does for its node that a simulated node must do itself:
//! register the `Node` (untainted, Ready, with allocatable resources).
//! Also used by the controller's integration tests and benchmarks.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The resources a simulated node offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeResources {
    /// CPU (a quantity: `64`).
    pub cpu: String,
    /// Memory (a quantity: `512Gi`).
    pub memory: String,
    /// Pods.
    pub pods: String,
}

impl Default for NodeResources {
    fn default() -> Self {
        Self {
            cpu: "64".into(),
            memory: "512Gi".into(),
            pods: "110".into(),
        }
    }
}

/// Creates (or keeps) the `Node` `name` with `labels`, lifts the not-ready
/// taint the API server puts on new nodes, and reports it Ready with
/// `resources`, as a kubelet would.
pub async fn register_node(
    client: &Client,
    name: &str,
    labels: &BTreeMap<String, String>,
    resources: &NodeResources,
) -> kube::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
    }))
    .expect("a Node from a name and labels");
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": null}})),
        )
        .await?;
    let amounts = json!({"cpu": resources.cpu, "memory": resources.memory, "pods": resources.pods});
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {
                "allocatable": amounts, "capacity": amounts,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "simulated by vramfit-agent"}],
            }})),
        )
        .await?;
    Ok(())
}
