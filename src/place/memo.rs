//! Memo of node measures by node state.
//!
//! Many nodes of a cluster are the same kind and pass through the same states
//! (all empty at first, then the same few partial fillings), so a measure is
//! computed once per distinct state and target workload, not once per node.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::fragmentation::TargetWorkload;
use super::state::NodeView;

/// Entries kept before the memo is dropped and refilled; bounds memory at a
/// few tens of MiB whatever the cluster size.
const MAX_ENTRIES: usize = 1 << 18;

/// Node measure values keyed by (node class, free CPU, free memory, sorted
/// (model, free units, free compute) per GPU) for one target workload version.
#[derive(Debug, Clone, Default)]
pub(crate) struct MeasureMemo {
    values: HashMap<Box<[u64]>, f64, BuildHasherDefault<WordHasher>>,
    workload_version: u64,
    key: Vec<u64>,
    /// (model, free units, free compute) per GPU, sorted: the key's part.
    gpus: Vec<(u8, u64, u64)>,
}

impl MeasureMemo {
    /// The measure of `view` (a node of class `class`), computed by `compute`
    /// only when this state was not seen under `workload_version`.
    pub(crate) fn get_or_compute(
        &mut self,
        class: u32,
        view: &NodeView,
        target: &TargetWorkload,
        workload_version: u64,
        compute: impl Fn(&NodeView, &TargetWorkload) -> f64,
    ) -> f64 {
        if workload_version != self.workload_version || self.values.len() >= MAX_ENTRIES {
            self.values.clear();
            self.workload_version = workload_version;
        }
        // The measures sum over GPUs, so GPU order does not matter: sorting
        // makes GPU-permuted states share an entry.
        self.gpus.clear();
        self.gpus.extend((0..view.gpu_free.len()).map(|g| {
            (
                view.gpu_model[g],
                view.gpu_free[g],
                view.gpu_compute_free[g],
            )
        }));
        self.gpus.sort_unstable();
        self.key.clear();
        self.key
            .extend([u64::from(class), view.cpu_free, view.mem_free]);
        for &(model, free, compute) in &self.gpus {
            self.key.extend([u64::from(model), free, compute]);
        }
        if let Some(&value) = self.values.get(self.key.as_slice()) {
            return value;
        }
        let value = compute(view, target);
        self.values
            .insert(self.key.clone().into_boxed_slice(), value);
        value
    }
}

/// Multiply-rotate hasher over 64-bit words (the rustc "Fx" scheme): the keys
/// are short integer slices built by this module, not attacker input, so
/// SipHash's flood resistance buys nothing and costs a fifth of the run.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
