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
        for l in 0..t.layers {
            self.fsdp_gather(Some(l as u32));
            let casts = self.cast_weights(Some(l as u32));
            self.workspace(0);
            let (saved, out) = self.block_forward(t, n, x);
            self.fsdp_post_forward(Some(l as u32));
            if self.run.checkpointing {
                // Only the block input is kept; everything else is recomputed.
                let mut s = saved;
                let input = s.remove(0);
                self.t.free_all(&mut s);
                let mut casts = casts;
                self.t.free_all(&mut casts);
                layer_saved.push(vec![input]);
                layer_casts.push(Vec::new());
            } else {
                layer_saved.push(saved);
                layer_casts.push(casts);
            }
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
        let lsm_in = if c != 4 {
            let f = self.t.act(n * v * 4);
            self.t.free(logits);
            f
        } else {
            logits
        };
        let lsm = self.t.act(n * v * 4);
        self.t.free(lsm_in);
        let loss = self.t.act(512);
        self.fsdp_end_forward();
        // backward through the loss
        self.fsdp_root_pre_backward(t.layers.checked_sub(1).map(|l| l as u32));
        self.workspace(1);
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
        let g_head = self.t.act(n * h * c);
        self.grads_of_layer(None);
        self.t.free(g_logits);
        let mut g = self.t.act(n * h * r);
        self.t.free(g_head);
        let mut head_casts = head_casts;
        self.t.free_all(&mut head_casts);
        let x_last = head_saved.remove(0);
        self.t.free_all(&mut head_saved);
        let mut x_in_of_next = x_last;
        for l in (0..t.layers).rev() {
            let mut saved = layer_saved.pop().expect("saved per layer");
            let mut casts = layer_casts.pop().expect("casts per layer");
            self.fsdp_pre_backward(l as u32);
            if self.run.checkpointing {
                casts = self.cast_weights(Some(l as u32));
                let (s, out) = self.block_forward(t, n, saved[0]);
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
        // embedding backward: dense gradient of the table, accumulated into .grad
        let table = self.t.act(t.vocab * h * self.d.weight);
        self.t.free(g);
        self.t.free(table);
        self.fsdp_post_backward(None);
        self.fsdp_end_backward();
        for id in [idx, tgt, loss] {
            self.t.free(id);
        }
    }
}
