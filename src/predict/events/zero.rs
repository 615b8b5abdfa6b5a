//! Data-parallel memory beyond the per-GPU shards: DistributedDataParallel's
//! gradient buckets (ZeRO stages 0 and 1) and FSDP's gathered parameters and
//! reduce-scatter buffers (stages 2 and 3).
//!
//! Stages 0 and 1 are DDP (stage 1 with the optimizer state partitioned, as
//! `ZeroRedundancyOptimizer` does): DDP keeps one flat copy of every gradient
//! in buckets of 25 MiB (the first 1 MiB), in the parameters' dtype, from its
//! construction on. Stages 2 and 3 are FSDP2 `fully_shard` on every block and
//! on the root (stage 2: `reshard_after_forward=False`). Parameters are
//! sharded; a unit's full parameters are gathered before its forward (the
//! root's at the first one) and freed after its forward (stage 3, gathered
//! again for backward, with the next unit prefetched) or after its backward
//! (stage 2, and the root always). Its gradients are computed at full size and
//! reduce-scattered into one flat shard; the reduce-scatter input lives until
//! the next unit's reduce-scatter.

use super::{Category, Gen};

/// DDP's default bucket cap, and the smaller cap of its first bucket.
const BUCKET_BYTES: u64 = 25 << 20;
const FIRST_BUCKET_BYTES: u64 = 1 << 20;

impl Gen<'_> {
    /// Whether the job is data parallel over more than one GPU.
    pub(super) fn data_parallel(&self) -> bool {
        self.run.gpus > 1
    }

    /// Whether parameters are sharded FSDP-style (stages 2 and 3 on > 1 GPU).
    pub(super) fn fsdp(&self) -> bool {
        self.data_parallel() && self.run.zero_stage >= 2
    }

    /// DDP's flat gradient buckets, filled in reverse parameter order.
    pub(super) fn ddp_buckets(&mut self) {
        if !self.data_parallel() || self.fsdp() {
            return;
        }
        let w = self.d.weight;
        let sizes: Vec<u64> = self.params.iter().rev().map(|p| p.numel() * w).collect();
        let (mut cap, mut acc) = (FIRST_BUCKET_BYTES, 0);
        for b in sizes {
            acc += b;
            if acc >= cap {
                self.t.alloc(acc, Category::Gradients);
                acc = 0;
                cap = BUCKET_BYTES;
            }
        }
        if acc > 0 {
            self.t.alloc(acc, Category::Gradients);
        }
    }

    /// Parameter indices of an FSDP unit: a block (`Some(layer)`) or the root
    /// (`None`: everything outside the blocks; for an MLP, the whole model).
    fn unit_params(&self, unit: Option<u32>) -> Vec<usize> {
        let mlp = matches!(self.arch, super::Arch::Mlp { .. });
        (0..self.params.len())
            .filter(|&i| {
                if mlp {
                    unit.is_none()
                } else {
                    self.params[i].layer == unit
                }
            })
            .collect()
    }

    /// All-gathers a unit's parameters unless they are gathered: the flat
    /// input (this GPU's shards) and output, copied out into one tensor per
    /// parameter that lives until the unit reshards.
    pub(super) fn fsdp_gather(&mut self, unit: Option<u32>) {
        if !self.fsdp() || self.gathered.contains_key(&unit) {
            return;
        }
        let idx = self.unit_params(unit);
        if idx.is_empty() {
            return;
        }
        let w = self.d.weight;
        let full: Vec<u64> = idx.iter().map(|&i| self.params[i].numel() * w).collect();
        let shards: u64 = idx
            .iter()
            .map(|&i| self.params[i].numel().div_ceil(self.run.gpus) * w)
            .sum();
        let input = self.t.alloc(shards, Category::Parameters);
        let flat = self.t.alloc(shards * self.run.gpus, Category::Parameters);
        self.t.free(input);
        let ids: Vec<u32> = full
            .into_iter()
            .map(|b| self.t.alloc(b, Category::Parameters))
            .collect();
        self.t.free(flat);
        self.gathered.insert(unit, ids);
    }

    /// Frees a unit's gathered parameters.
    fn fsdp_reshard(&mut self, unit: Option<u32>) {
        if let Some(mut ids) = self.gathered.remove(&unit) {
            self.t.free_all(&mut ids);
        }
    }

    /// After a block's forward: stage 3 reshards it.
    pub(super) fn fsdp_post_forward(&mut self, unit: Option<u32>) {
        if self.fsdp() && self.run.zero_stage >= 3 && unit.is_some() {
            self.fsdp_reshard(unit);
        }
    }

    /// Before a block's backward: gather it (stage 3) and prefetch the block
    /// whose backward comes next.
    pub(super) fn fsdp_pre_backward(&mut self, layer: u32) {
        if !self.fsdp() {
            return;
        }
        self.fsdp_gather(Some(layer));
        if self.run.zero_stage >= 3 && layer > 0 {
            self.fsdp_gather(Some(layer - 1));
        }
    }

    /// A full-size gradient of parameter `i`, held until its unit's
    /// reduce-scatter.
    pub(super) fn fsdp_unsharded_grad(&mut self, i: usize, bytes: u64) {
        let unit = if matches!(self.arch, super::Arch::Mlp { .. }) {
            None
        } else {
            self.params[i].layer
        };
        let id = self.t.alloc(bytes, Category::Gradients);
        self.unsharded_grads.entry(unit).or_default().push(id);
    }

    /// After a unit's backward: reduce-scatter its gradients into the flat
    /// sharded gradient (created at the first micro-step, added into later),
    /// and reshard its parameters.
    pub(super) fn fsdp_post_backward(&mut self, unit: Option<u32>) {
        if !self.fsdp() {
            return;
        }
        if let Some(mut grads) = self.unsharded_grads.remove(&unit) {
            let idx = self.unit_params(unit);
            let w = self.d.weight;
            let shards: u64 = idx
                .iter()
                .map(|&i| self.params[i].numel().div_ceil(self.run.gpus) * w)
                .sum();
            let input = self.t.alloc(shards * self.run.gpus, Category::Gradients);
            self.t.free_all(&mut grads);
            if let Some(prev) = self.rs_input.replace(input) {
                self.t.free(prev);
            }
            let out = self.t.alloc(shards, Category::Gradients);
            match idx.first().map(|&i| self.grad_ids[i]) {
                Some(None) => self.grad_ids[idx[0]] = Some(out),
                _ => self.t.free(out),
            }
        }
        self.fsdp_reshard(unit);
    }

    /// End of backward: the last reduce-scatter input is released.
    pub(super) fn fsdp_end_backward(&mut self) {
        if let Some(prev) = self.rs_input.take() {
            self.t.free(prev);
        }
    }
}
