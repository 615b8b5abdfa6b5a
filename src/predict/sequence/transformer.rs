//! One micro-step of a transformer: embeddings, the blocks, the head, the
//! logits and loss, then backward in reverse (recomputing checkpointed
//! blocks) and the embedding gradient.

use crate::api::{PositionalKind, TransformerKind};
use crate::predict::arch::TransformerArch;

use super::Gen;

impl Gen<'_> {
    pub(super) fn transformer_micro_step(&mut self, t: &TransformerArch) {
        let n = self.run.micro_batch * t.seq_len; // tokens
        let (h, r, c) = (t.hidden, self.d.residual, self.d.compute);
        let idx = self.t.act(n * 8);
        let tgt = self.t.act(n * 8);
        self.fsdp_gather(None);
        // embeddings: gather, then add positions (and token types + norm for BERT)
        let emb = self.t.act(n * h * self.d.weight);
        let mut x = emb;
        let mut emb_saved = Vec::new();
        if t.positional == PositionalKind::Learned {
            let y = self.t.act(n * h * r);
            self.t.free(x);
            x = y;
        }
        if t.kind == TransformerKind::Encoder {
            let y = self.t.act(n * h * r);
            self.t.free(x);
            emb_saved.push(y);
            emb_saved.push(self.t.act(n * 8));
            x = self.t.act(n * h * r);
        }
        let mut layer_saved: Vec<Vec<u32>> = Vec::new();
        let mut layer_casts: Vec<Vec<u32>> = Vec::new();
        let mut forward_casts: Vec<u32> = Vec::new();
        for l in 0..t.layers {
            self.fsdp_gather(Some(l as u32));
            // the first forward of a checkpointed block makes autocast's
            // casts at their matmuls
            let lazy = self.run.checkpointing;
            let eager_casts = if lazy {
                self.start_lazy_casts(Some(l as u32));
                Vec::new()
            } else {
                self.cast_weights(Some(l as u32))
            };
            self.workspace(0);
            // Only a checkpointed block's input is kept; the rest is
            // recomputed in backward.
            let (saved, out) = if self.run.checkpointing {
                (vec![x], self.block_forward_no_grad(t, n))
            } else {
                self.block_forward(t, n, x)
            };
            let casts = if lazy {
                self.end_lazy_casts()
            } else {
                eager_casts
            };
            self.fsdp_post_forward(Some(l as u32));
            if self.run.checkpointing {
                // autocast's cache holds the weights' casts until the
                // forward leaves its context, after the loss
                forward_casts.extend(casts);
                layer_casts.push(Vec::new());
            } else {
                layer_casts.push(casts);
            }
            layer_saved.push(saved);
            x = out;
        }
        // head: final norm (decoder) or dense+gelu+norm (encoder), then logits and loss
        let head_casts = self.cast_weights(None);
        let mut head_saved = vec![x];
        head_saved.push(self.t.act(n * 8));
        if t.kind == TransformerKind::Encoder {
            let dense = self.t.act(n * h * c);
            let gelu = self.t.act(n * h * c);
            head_saved.extend([dense, gelu]);
        }
        let normed = self.t.act(n * h * r);
        if self.d.amp {
            let cast = self.t.act(n * h * c);
            self.t.free(normed);
            head_saved.push(cast);
        } else {
            head_saved.push(normed);
        }
        let v = t.vocab;
        let logits = self.t.act(n * v * c);
        // `logits.float()`; the logits stay in the forward's variable until
        // it returns with the loss
        let lsm_in = if c != 4 {
            self.t.act(n * v * 4)
        } else {
            logits
        };
        let lsm = self.t.act(n * v * 4);
        self.t.free(lsm_in);
        let loss = self.t.act(512);
        if c != 4 {
            self.t.free(logits);
        }
        self.t.free_all(&mut forward_casts);
        self.fsdp_end_forward();
        // backward through the loss
        self.fsdp_root_pre_backward(t.layers.checked_sub(1).map(|l| l as u32));
        let g_lsm = self.t.act(n * v * 4);
        let g_logits = self.t.act(n * v * 4);
        self.t.free(g_lsm);
        self.t.free(lsm);
        let g_logits = if c != 4 {
            let g = self.t.act(n * v * c);
            self.t.free(g_logits);
            g
        } else {
            g_logits
        };
        let first_layer = self
            .params
            .iter()
            .position(|p| p.layer.is_some())
            .unwrap_or(self.params.len());
        let mut g = if self.fsdp() {
            self.workspace(1);
            let g_head = self.t.act(n * h * c);
            self.grads_of_layer(None);
            self.t.free(g_logits);
            let g = self.t.act(n * h * r);
            self.t.free(g_head);
            let mut head_casts = head_casts;
            self.t.free_all(&mut head_casts);
            g
        } else {
            self.head_grads(t, first_layer, g_logits, head_casts, n)
        };
        if t.kind == TransformerKind::Decoder && !self.fsdp() {
            // the final norm's backward: its input's gradient, the buffer
            // the blocks' residual gradients are then added into
            let g_norm = self.t.act(n * h * r);
            self.t.free(g);
            g = g_norm;
        }
        let x_last = head_saved.remove(0);
        self.t.free_all(&mut head_saved);
        let mut x_in_of_next = x_last;
        for l in (0..t.layers).rev() {
            let mut saved = layer_saved.pop().expect("saved per layer");
            let mut casts = layer_casts.pop().expect("casts per layer");
            self.fsdp_pre_backward(l as u32);
            if self.run.checkpointing {
                // autocast casts each weight at its matmul again
                self.start_lazy_casts(Some(l as u32));
                let (s, out) = self.block_forward(t, n, saved[0]);
                casts = self.end_lazy_casts();
                self.t.free(out);
                saved = s;
            }
            g = self.block_backward(t, n, g, &mut saved);
            self.grads_of_layer(Some(l as u32));
            self.t.free_all(&mut casts);
            self.fsdp_post_backward(Some(l as u32));
            self.t.free(x_in_of_next);
            x_in_of_next = saved.pop().unwrap_or(u32::MAX);
            debug_assert!(saved.is_empty());
        }
        self.t.free(x_in_of_next);
        self.t.free_all(&mut emb_saved);
        if self.fsdp() {
            // embedding backward: dense gradient of the table, accumulated into .grad
            let table = self.t.act(t.vocab * h * self.d.weight);
            self.t.free(g);
            self.t.free(table);
        } else {
            // the embeddings' gradients (a tied table's added into the
            // `.grad` its head made)
            for i in (0..first_layer).rev() {
                self.weight_grad(i);
            }
            self.t.free(g);
        }
        self.fsdp_post_backward(None);
        self.fsdp_end_backward();
        for id in [idx, tgt, loss] {
            self.t.free(id);
        }
    }

    /// The head's backward at the loss, as the H200 recorded it for the
    /// reference GPT-2: the matmul's weight gradient (in its precision),
    /// cuBLAS's workspace of the backward thread (its first use), the
    /// input's gradient, `g_logits` and autocast's casts of the head's
    /// weights released as the node returns; the residual's gradient, then
    /// under autocast the weight's cast back to its fp32 `.grad`; the other
    /// head-side parameters after. Returns the residual's gradient.
    fn head_grads(
        &mut self,
        t: &TransformerArch,
        first_layer: usize,
        g_logits: u32,
        mut casts: Vec<u32>,
        n: u64,
    ) -> u32 {
        let (h, r, c) = (t.hidden, self.d.residual, self.d.compute);
        let head_side: Vec<usize> = (first_layer..self.params.len())
            .filter(|&i| self.params[i].layer.is_none())
            .collect();
        let head = if t.tied {
            0
        } else {
            head_side
                .iter()
                .rev()
                .copied()
                .find(|&i| self.params[i].matmul_weight)
                .expect("the head's weight")
        };
        let g_head = std::cell::Cell::new(None);
        let g = std::cell::Cell::new(None);
        self.weight_grad_then(
            head,
            |g2: &mut Self| {
                g2.workspace(1);
                g_head.set(Some(g2.t.act(n * h * c)));
                g2.t.free(g_logits);
                g2.t.free_all(&mut casts);
            },
            |tr| {
                g.set(Some(tr.act(n * h * r)));
                tr.free(g_head.take().expect("the head's node returned"));
            },
        );
        let g = g.take().unwrap_or_else(|| {
            let g = self.t.act(n * h * r);
            self.t
                .free(g_head.take().expect("the head's node returned"));
            g
        });
        for i in head_side.into_iter().rev().filter(|&i| i != head) {
            self.weight_grad(i);
        }
        g
    }
}
