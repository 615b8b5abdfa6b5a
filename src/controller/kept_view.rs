//! The inventory view ([`ClusterView`]) kept from one cycle to the next.
//!
//! [`cluster_view`] reads every `GpuNode` and `Node` (quantities, taints,
//! GPUs, UUIDs) and builds thousands of small strings and vectors; at 5,000
//! nodes that cost 16-50 ms a cycle although nearly every cycle finds the
//! same view. [`KeptView`] holds each node's part of the view
//! ([`NodePart`]) with the objects it was read from, and reads a node again
//! only when its `GpuNode` or its `Node` is a new object (the watch caches
//! hand out the same `Arc` until the object changes). A heartbeat changes
//! the `GpuNode` but seldom its part. The view itself is assembled again
//! only when a node's part changed, a node came or went, or a heartbeat
//! crossed the TTL (checked every cycle, against each node's parsed
//! heartbeat); otherwise the cycle gets the same `Arc` as the last one.
//!
//! Everything here is pure; the tests and debug builds compare the kept
//! view with [`cluster_view`] over the same objects.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::cluster_view::{
    ClusterView, NodePart, cluster_view, gpu_node_is_live, heartbeat, node_part,
};
use crate::api::GpuNode;

struct KeptGpuNode {
    gpu_node: Arc<GpuNode>,
    /// The pass that last saw it.
    seen: u64,
    heartbeat: Option<Timestamp>,
    /// Its part, with the `Node` of its name as it was read.
    part: Option<NodePart>,
    /// In the view now.
    included: bool,
}

struct KeptNode {
    node: Arc<Node>,
    seen: u64,
}

/// The kept view (see the module's documentation).
#[derive(Default)]
pub struct KeptView {
    passes: u64,
    gpu_nodes: BTreeMap<String, KeptGpuNode>,
    nodes: HashMap<String, KeptNode>,
    view: Option<Arc<ClusterView>>,
    /// Times the view was assembled (for the tests).
    assembled: u64,
}

impl KeptView {
    /// The view of these objects at `now`: what [`cluster_view`] gives for
    /// them, the same `Arc` as the last call when it did not change.
    pub fn update(
        &mut self,
        gpu_nodes: &[Arc<GpuNode>],
        nodes: &[Arc<Node>],
        now: Timestamp,
        ttl: SignedDuration,
    ) -> Arc<ClusterView> {
        self.passes += 1;
        let pass = self.passes;
        let node_changed = self.follow_nodes(nodes, pass);
        let mut changed = self.view.is_none();
        let mut seen = 0;
        for gpu_node in gpu_nodes {
            let Some(name) = gpu_node.metadata.name.as_deref() else {
                continue;
            };
            let kept = match self.gpu_nodes.get_mut(name) {
                // Two GpuNodes of one name (never from a watch cache): the
                // view holds both, which the kept parts cannot say.
                Some(kept) if kept.seen == pass => return self.rebuild(gpu_nodes, nodes, now, ttl),
                Some(kept) => {
                    kept.seen = pass;
                    if !Arc::ptr_eq(&kept.gpu_node, gpu_node)
                        || (!node_changed.is_empty() && node_changed.contains(name))
                    {
                        kept.gpu_node = gpu_node.clone();
                        kept.heartbeat = heartbeat(gpu_node);
                        let part = self
                            .nodes
                            .get(name)
                            .and_then(|n| node_part(gpu_node, &n.node));
                        if part != kept.part {
                            kept.part = part;
                            changed |= kept.included;
                        }
                    }
                    kept
                }
                None => {
                    let part = self
                        .nodes
                        .get(name)
                        .and_then(|n| node_part(gpu_node, &n.node));
                    self.gpu_nodes
                        .entry(name.to_string())
                        .or_insert(KeptGpuNode {
                            gpu_node: gpu_node.clone(),
                            seen: pass,
                            heartbeat: heartbeat(gpu_node),
                            part,
                            included: false,
                        })
                }
            };
            seen += 1;
            let included = kept.part.is_some()
                && gpu_node_is_live(&kept.gpu_node, kept.heartbeat.as_ref(), now, ttl);
            if included != kept.included {
                kept.included = included;
                changed = true;
            }
        }
        if self.gpu_nodes.len() > seen {
            self.gpu_nodes.retain(|_, kept| {
                changed |= kept.seen != pass && kept.included;
                kept.seen == pass
            });
        }
        if changed {
            let mut view = ClusterView::default();
            for kept in self.gpu_nodes.values().filter(|k| k.included) {
                if let Some(part) = &kept.part {
                    view.push(part);
                }
            }
            self.assembled += 1;
            if self.view.as_deref() != Some(&view) {
                self.view = Some(Arc::new(view));
            }
        }
        self.view.clone().unwrap_or_default()
    }

    /// Follows the `Node`s; returns the names whose `Node` changed, came or
    /// went. Of two `Node`s of one name the later counts, as in
    /// [`cluster_view`].
    fn follow_nodes(&mut self, nodes: &[Arc<Node>], pass: u64) -> HashSet<String> {
        let mut changed = HashSet::new();
        let mut seen = 0;
        for node in nodes {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            match self.nodes.get_mut(name) {
                Some(kept) if Arc::ptr_eq(&kept.node, node) => {
                    if kept.seen != pass {
                        seen += 1;
                    }
                    kept.seen = pass;
                }
                Some(kept) => {
                    if kept.seen != pass {
                        seen += 1;
                    }
                    kept.node = node.clone();
                    kept.seen = pass;
                    changed.insert(name.to_string());
                }
                None => {
                    seen += 1;
                    self.nodes.insert(
                        name.to_string(),
                        KeptNode {
                            node: node.clone(),
                            seen: pass,
                        },
                    );
                    changed.insert(name.to_string());
                }
            }
        }
        if self.nodes.len() > seen {
            self.nodes.retain(|name, kept| {
                if kept.seen != pass {
                    changed.insert(name.clone());
                }
                kept.seen == pass
            });
        }
        changed
    }

    /// Forgets everything and returns the full rebuild's view; the next
    /// call reads every node again.
    fn rebuild(
        &mut self,
        gpu_nodes: &[Arc<GpuNode>],
        nodes: &[Arc<Node>],
        now: Timestamp,
        ttl: SignedDuration,
    ) -> Arc<ClusterView> {
        *self = Self {
            passes: self.passes,
            assembled: self.assembled + 1,
            ..Self::default()
        };
        let gpu_nodes: Vec<&GpuNode> = gpu_nodes.iter().map(|n| n.as_ref()).collect();
        let nodes: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        Arc::new(cluster_view(&gpu_nodes, &nodes, now, ttl))
    }

    /// Times the view was assembled or rebuilt.
    pub fn assembled(&self) -> u64 {
        self.assembled
    }
}

#[cfg(test)]
#[path = "kept_view_tests.rs"]
mod tests;
