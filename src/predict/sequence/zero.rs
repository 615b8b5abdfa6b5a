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
//! the next unit's reduce-scatter. As in FSDP2, the flat all-gather outputs
//! are allocated on the all-gather stream and the reduce-scatter outputs (the
//! sharded gradients) on the reduce-scatter stream, each with its own pool in
//! the caching allocator; everything else is on the default stream.

use super::{Category, Gen, Stream};

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

    /// Bytes of a unit's flat shard: this GPU's share of every parameter.
    fn unit_shard_bytes(&self, idx: &[usize]) -> u64 {
        idx.iter()
            .map(|&i| self.params[i].numel().div_ceil(self.run.gpus) * self.d.weight)
            .sum()
    }

    /// Forward pre-hook of a unit: all-gathers its parameters unless they are
    /// gathered, and copies them out.
    pub(super) fn fsdp_gather(&mut self, unit: Option<u32>) {
        self.fsdp_issue_gather(unit);
        self.fsdp_copy_out(unit, true);
    }

    /// Issues a unit's all-gather unless it is gathered or issued: the flat
    /// output (`gpus` shards; this GPU's slice of it is the all-gather
    /// input, no separate tensor) is allocated on the all-gather stream.
    fn fsdp_issue_gather(&mut self, unit: Option<u32>) {
        if !self.fsdp() || self.gathered.contains_key(&unit) || self.issued.contains_key(&unit) {
            return;
        }
        let idx = self.unit_params(unit);
        if idx.is_empty() {
            return;
        }
        let flat = self.unit_shard_bytes(&idx) * self.run.gpus;
        let id = self
            .t
            .alloc_on(flat, Category::Parameters, Stream::AllGather);
        self.issued.insert(unit, id);
    }

    /// Copies an issued all-gather out into one tensor per parameter (on the
    /// default stream), which lives until the unit reshards. In forward the
    /// flat output is kept until the next unit's copy-out (or the end of the
    /// forward) so that the next all-gather cannot reuse it while the copy
    /// runs; in backward it is freed at once.
    fn fsdp_copy_out(&mut self, unit: Option<u32>, forward: bool) {
        let Some(flat) = self.issued.remove(&unit) else {
            return;
        };
        if forward && let Some(prev) = self.deferred_flat.take() {
            self.t.free(prev);
        }
        let w = self.d.weight;
        let full: Vec<u64> = self
            .unit_params(unit)
            .iter()
            .map(|&i| self.params[i].numel() * w)
            .collect();
        let ids: Vec<u32> = full
            .into_iter()
            .map(|b| self.t.alloc(b, Category::Parameters))
            .collect();
        if forward {
            self.deferred_flat = Some(flat);
        } else {
            self.t.free(flat);
        }
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

    /// After the root's forward (the loss included): the last flat
    /// all-gather output kept in forward is freed.
    pub(super) fn fsdp_end_forward(&mut self) {
        if let Some(flat) = self.deferred_flat.take() {
            self.t.free(flat);
        }
    }

    /// The root's pre-backward hook, before the loss's backward: it prefetches
    /// the unit whose forward ended last (`last`, the last block), which is
    /// still gathered at stage 2.
    pub(super) fn fsdp_root_pre_backward(&mut self, last: Option<u32>) {
        if self.fsdp() {
            self.fsdp_issue_gather(last);
        }
    }

    /// Before a block's backward: gather it unless it is gathered or
    /// prefetched, copy it out, and prefetch the block whose backward comes
    /// next (stage 3; at stage 2 every block is still gathered).
    pub(super) fn fsdp_pre_backward(&mut self, layer: u32) {
        if !self.fsdp() {
            return;
        }
        self.fsdp_issue_gather(Some(layer));
        self.fsdp_copy_out(Some(layer), false);
        if layer > 0 {
            self.fsdp_issue_gather(Some(layer - 1));
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

    /// After a unit's backward: reshard its parameters, then reduce-scatter
    /// its gradients. The previous unit's reduce-scatter input is released
    /// first; the input (one flat copy of the full gradients) is allocated on
    /// the default stream, the gradients are freed, and the output, one flat
    /// shard that becomes the sharded gradients (or is added into them on
    /// later accumulation micro-steps), is allocated on the reduce-scatter
    /// stream.
    pub(super) fn fsdp_post_backward(&mut self, unit: Option<u32>) {
        if !self.fsdp() {
            return;
        }
        self.fsdp_reshard(unit);
        if let Some(mut grads) = self.unsharded_grads.remove(&unit) {
            let idx = self.unit_params(unit);
            let shards = self.unit_shard_bytes(&idx);
            if let Some(prev) = self.rs_input.take() {
                self.t.free(prev);
            }
            let input = self.t.alloc(shards * self.run.gpus, Category::Gradients);
            self.t.free_all(&mut grads);
            self.rs_input = Some(input);
            let out = self
                .t
                .alloc_on(shards, Category::Gradients, Stream::ReduceScatter);
            match idx.first().map(|&i| self.grad_ids[i]) {
                Some(None) => self.grad_ids[idx[0]] = Some(out),
                _ => self.t.free(out),
            }
        }
    }

    /// End of backward: the last reduce-scatter input is released.
    pub(super) fn fsdp_end_backward(&mut self) {
        if let Some(prev) = self.rs_input.take() {
            self.t.free(prev);
        }
    }
}
