//! The optimizer: its state (created at the first step, or in the
//! constructor for Adagrad), its step temporaries and `zero_grad`.

use crate::api::Optimizer;

use super::{Category, Gen};

impl Gen<'_> {
    pub(super) fn create_state(&mut self) {
        let w = self.d.weight;
        let params = self.params.clone();
        for p in &params {
            let n = self.shard(p.numel(), 1);
            let bytes: Vec<u64> = match self.run.optimizer {
                Optimizer::Sgd => vec![],
                Optimizer::SgdMomentum | Optimizer::Adagrad => vec![n * w],
                Optimizer::Adam | Optimizer::AdamW => vec![n * w, n * w],
                Optimizer::Adafactor => {
                    if p.cols == 0 {
                        vec![n * w]
                    } else {
                        vec![self.shard(p.rows, 1) * w, self.shard(p.cols, 1) * w]
                    }
                }
                // bitsandbytes keeps tensors under 4096 elements in 32-bit state.
                Optimizer::AdamW8bit if p.numel() < 4096 => vec![n * 4, n * 4],
                Optimizer::AdamW8bit => vec![n, n, n.div_ceil(256) * 4, n.div_ceil(256) * 4],
            };
            for b in bytes {
                let id = self.t.alloc(b, Category::Optimizer);
                self.state_ids.push(id);
            }
        }
    }

    pub(super) fn optimizer_step(&mut self, first: bool) {
        if first && self.run.optimizer != Optimizer::Adagrad {
            self.create_state();
        }
        // foreach implementations allocate one full-size temporary per parameter
        // (Adam's sqrt of the second moment, Adagrad's std, Adafactor's estimate).
        let temp = matches!(
            self.run.optimizer,
            Optimizer::Adam | Optimizer::AdamW | Optimizer::Adagrad
        );
        if self.run.optimizer == Optimizer::Adafactor {
            // torch.optim.Adafactor works one parameter at a time: its full-size
            // variance estimate lives only while that parameter is updated.
            for i in 0..self.params.len() {
                let b = self.shard(self.params[i].numel(), 1) * 4;
                let id = self.t.alloc(b, Category::Optimizer);
                self.t.free(id);
            }
        }
        if temp {
            let sizes: Vec<u64> = self
                .params
                .iter()
                .map(|p| self.shard(p.numel(), 1) * self.d.weight)
                .collect();
            let ids: Vec<u32> = sizes
                .into_iter()
                .map(|b| self.t.alloc(b, Category::Optimizer))
                .collect();
            for id in ids {
                self.t.free(id);
            }
        }
        // zero_grad(set_to_none=True)
        for i in 0..self.grad_ids.len() {
            if let Some(id) = self.grad_ids[i].take() {
                self.t.free(id);
            }
        }
    }
}
