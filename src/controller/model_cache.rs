//! The cluster's GPU models with the largest capacity of each, as every
//! prediction reads them. Computed from the GpuNode cache once, then kept
//! until a GpuNode's GPUs change: heartbeats, which are most GpuNode events,
//! leave it as it is, so a prediction no longer scans every GPU of the
//! cluster.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::api::GpuNode;

/// A GPU model and the largest capacity a GPU of that model reports, bytes.
pub type GpuModel = (String, u64);

/// The cached GPU models, dropped when the GpuNodes' GPUs change.
#[derive(Default)]
pub struct GpuModelCache(Mutex<Cached>);

#[derive(Default)]
struct Cached {
    /// Counts the changes; a computation started before one is not kept.
    generation: u64,
    models: Option<Vec<GpuModel>>,
    /// The GPUs (model, capacity) each node had when last seen.
    seen: HashMap<String, Vec<GpuModel>>,
}

fn gpus_of(node: &GpuNode) -> Vec<GpuModel> {
    node.status
        .iter()
        .flat_map(|s| s.gpus.iter())
        .map(|g| (g.model.clone(), g.total_bytes))
        .collect()
}

impl GpuModelCache {
    /// Follows one event of the GpuNode watch (after the reflector stored it).
    pub fn observe(&self, event: &Event<GpuNode>) {
        let mut cached = self.0.lock().expect("GPU model cache lock");
        let changed = match event {
            Event::Apply(node) | Event::InitApply(node) => {
                let gpus = gpus_of(node);
                cached.seen.insert(node.name_any(), gpus.clone()) != Some(gpus)
            }
            Event::Delete(node) => {
                cached.seen.remove(&node.name_any());
                true
            }
            Event::Init | Event::InitDone => true,
        };
        if changed {
            cached.generation += 1;
            cached.models = None;
        }
    }

    /// The cached models, or those `compute` gives (kept unless the GpuNodes
    /// changed while it ran).
    pub fn get_or_compute(&self, compute: impl FnOnce() -> Vec<GpuModel>) -> Vec<GpuModel> {
        let generation = {
            let cached = self.0.lock().expect("GPU model cache lock");
            if let Some(models) = &cached.models {
                return models.clone();
            }
            cached.generation
        };
        let models = compute();
        let mut cached = self.0.lock().expect("GPU model cache lock");
        if cached.generation == generation {
            cached.models = Some(models.clone());
        }
        models
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::Cell;

    fn node(name: &str, gpus: &[(&str, u64)], heartbeat: &str) -> GpuNode {
        let gpus: Vec<_> = gpus
            .iter()
            .enumerate()
            .map(|(i, (model, total))| {
                json!({"index": i, "uuid": format!("GPU-{i}"), "model": model, "totalBytes": total})
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "vramfit.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": name},
            "spec": {},
            "status": {"heartbeat": heartbeat, "gpus": gpus}
        }))
        .unwrap()
    }

    /// How many times each event sequence, followed by two lookups, computes
    /// the models: 1 when the second lookup is served from the cache.
    #[test]
    fn only_a_change_of_the_gpus_drops_the_cached_models() {
        let a = |heartbeat| node("a", &[("H100", 80)], heartbeat);
        let cases: Vec<(&str, Vec<Event<GpuNode>>, u32)> = vec![
            ("a heartbeat keeps them", vec![Event::Apply(a("t2"))], 1),
            (
                "another capacity drops them",
                vec![Event::Apply(node("a", &[("H100", 94)], "t2"))],
                2,
            ),
            (
                "another model drops them",
                vec![Event::Apply(node("a", &[("H200", 80)], "t2"))],
                2,
            ),
            (
                "a new node drops them",
                vec![Event::Apply(node("b", &[("H100", 80)], "t1"))],
                2,
            ),
            ("a deleted node drops them", vec![Event::Delete(a("t1"))], 2),
            ("a relist drops them", vec![Event::Init], 2),
            ("the end of a relist drops them", vec![Event::InitDone], 2),
        ];
        for (name, events, want) in cases {
            let cache = GpuModelCache::default();
            cache.observe(&Event::Apply(a("t1")));
            let computed = Cell::new(0);
            let compute = || {
                computed.set(computed.get() + 1);
                vec![("H100".to_string(), 80)]
            };
            assert_eq!(cache.get_or_compute(compute), [("H100".to_string(), 80)]);
            for event in &events {
                cache.observe(event);
            }
            cache.get_or_compute(compute);
            assert_eq!(computed.get(), want, "{name}");
        }
    }

    #[test]
    fn models_computed_across_a_change_are_not_kept() {
        let cache = GpuModelCache::default();
        let old = cache.get_or_compute(|| {
            // The GpuNodes change while the old models are computed.
            cache.observe(&Event::Apply(node("a", &[("H200", 141)], "t1")));
            vec![("H100".to_string(), 80)]
        });
        assert_eq!(old, [("H100".to_string(), 80)]);
        let now = cache.get_or_compute(|| vec![("H200".to_string(), 141)]);
        assert_eq!(now, [("H200".to_string(), 141)]);
    }
}
