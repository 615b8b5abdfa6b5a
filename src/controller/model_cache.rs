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
#[path = "model_cache_tests.rs"]
mod tests;
