//! One transformer block: the tensors its forward keeps for backward, and
//! its backward, which releases them as autograd does.

use crate::api::{Attention, MlpKind, NormKind, PositionalKind, TransformerKind};
use crate::predict::arch::TransformerArch;

use super::Gen;

impl Gen<'_> {
    /// Forward of one block; returns the tensors kept for backward (the block
    /// input first, last popped) and the output.
    pub(super) fn block_forward(&mut self, t: &TransformerArch, n: u64, x: u32) -> (Vec<u32>, u32) {
        let (h, r, c) = (t.hidden, self.d.residual, self.d.compute);
        let kvd = t.kv_dim();
        let mut saved = vec![x];
        let stats = if t.norm == NormKind::Layernorm { 2 } else { 1 };
        // attention half
        let n1 = self.t.act(n * h * r);
        saved.push(self.t.act(n * 4 * stats));
        let a_in = if self.d.amp {
            let cast = self.t.act(n * h * c);
            self.t.free(n1);
            cast
        } else {
            n1
        };
        saved.push(a_in);
        self.weight_cast();
        let qkv = self.t.act(n * (h + 2 * kvd) * c);
        // q, k and v are views of the projection's output; the attention
        // keeps whichever it reads as they are, and with them the output.
        let kept = self.attention_inputs(t, n, qkv);
        saved.extend(kept);
        let heads_s2 = self.run.micro_batch * t.heads * t.seq_len * t.seq_len;
        let y = match self.run.attention {
            Attention::Eager => {
                let p = self.eager_softmax(t, heads_s2);
                saved.push(p);
                if self.d.amp {
                    saved.push(self.t.act(heads_s2 * c));
                }
                let o = self.t.act(n * h * c);
                let y = self.t.act(n * h * c);
                self.t.free(o);
                y
            }
            Attention::Sdpa | Attention::Flash => {
                saved.push(self.t.act(self.run.micro_batch * t.heads * t.seq_len * 4));
                self.t.act(n * h * c)
            }
        };
        saved.push(y);
        self.weight_cast();
        let proj = self.t.act(n * h * c);
        let x1 = self.t.act(n * h * r);
        self.t.free(proj);
        saved.push(x1);
        // feed-forward half
        let n2 = self.t.act(n * h * r);
        saved.push(self.t.act(n * 4 * stats));
        let m_in = if self.d.amp {
            let cast = self.t.act(n * h * c);
            self.t.free(n2);
            cast
        } else {
            n2
        };
        saved.push(m_in);
        let f = t.ffn;
        match t.mlp {
            MlpKind::Gelu => {
                self.weight_cast();
                saved.push(self.t.act(n * f * c));
                saved.push(self.t.act(n * f * c));
            }
            MlpKind::Swiglu => {
                // gate, its SiLU, up, the product
                for i in 0..4 {
                    if i % 2 == 0 {
                        self.weight_cast();
                    }
                    saved.push(self.t.act(n * f * c));
                }
            }
        }
        self.weight_cast();
        let down = self.t.act(n * h * c);
        let out = self.t.act(n * h * r);
        self.t.free(down);
        // the block input goes last so that the caller pops it after backward
        let input = saved.remove(0);
        saved.push(input);
        (saved, out)
    }

    /// A checkpointed block's first forward, without autograd: each tensor
    /// dies where the reference modules drop it (a call returns, a name is
    /// rebound), as the H200's recorded runs show; autocast's casts of an
    /// activation die with their matmul. Returns the output; the input stays
    /// (the checkpoint holds it).
    pub(super) fn block_forward_no_grad(&mut self, t: &TransformerArch, n: u64) -> u32 {
        let (h, r, c) = (t.hidden, self.d.residual, self.d.compute);
        let kvd = t.kv_dim();
        // attention half: ln1's output is Attn's argument until it returns
        let n1 = self.norm_no_grad(t, n * h * r);
        let qkv = self.matmul_no_grad(n1, n * h, n * (h + 2 * kvd) * c);
        // what the attention reads stays until Attn returns
        let mut locals = self.attention_inputs(t, n, qkv);
        let heads_s2 = self.run.micro_batch * t.heads * t.seq_len * t.seq_len;
        let y = match self.run.attention {
            Attention::Eager => {
                // the softmax, kept in `att` until return
                let p = self.eager_softmax(t, heads_s2);
                locals.push(p);
                let y = self.matmul_no_grad(p, heads_s2, n * h * c);
                // the heads put back side by side: a copy
                let o = self.t.act(n * h * c);
                self.t.free(y);
                o
            }
            Attention::Sdpa | Attention::Flash => {
                let y = self.t.act(n * h * c);
                let lse = self.t.act(self.run.micro_batch * t.heads * t.seq_len * 4);
                self.t.free(lse);
                y
            }
        };
        self.weight_cast();
        let proj = self.t.act(n * h * c);
        locals.push(y);
        locals.push(n1);
        self.t.free_all(&mut locals);
        let x1 = self.t.act(n * h * r);
        self.t.free(proj);
        // feed-forward half
        let n2 = self.norm_no_grad(t, n * h * r);
        let f = t.ffn;
        let hidden = match t.mlp {
            MlpKind::Gelu => {
                let up = self.matmul_no_grad(n2, n * h, n * f * c);
                let g = self.t.act(n * f * c);
                self.t.free(up);
                g
            }
            MlpKind::Swiglu => {
                let gate = self.matmul_no_grad(n2, n * h, n * f * c);
                let silu = self.t.act(n * f * c);
                self.t.free(gate);
                let up = self.matmul_no_grad(n2, n * h, n * f * c);
                let prod = self.t.act(n * f * c);
                self.t.free(silu);
                self.t.free(up);
                prod
            }
        };
        let down = self.matmul_no_grad(hidden, n * f, n * h * c);
        self.t.free(hidden);
        self.t.free(n2);
        let out = self.t.act(n * h * r);
        self.t.free(down);
        self.t.free(x1);
        out
    }

    /// The attention's inputs from the qkv projection's output `qkv`: q and
    /// k rotated (three temporaries and the result each) with rotary
    /// positions, k and v expanded to every head (copies) with grouped
    /// heads. Returns what the attention reads and so keeps: q, k and v are
    /// views of `qkv`, which stays with them, except with rotary positions
    /// and grouped heads, where the names rebound to the copies let go of it
    /// and of the rotated k (freed here).
    fn attention_inputs(&mut self, t: &TransformerArch, n: u64, qkv: u32) -> Vec<u32> {
        let (h, c) = (t.hidden, self.d.compute);
        let kvd = t.kv_dim();
        let rotary = t.positional == PositionalKind::Rotary;
        let grouped = t.kv_heads < t.heads;
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        if rotary && grouped {
            dropped.push(qkv);
        } else {
            kept.push(qkv);
        }
        if rotary {
            for width in [h, kvd] {
                let tmp: Vec<u32> = (0..3).map(|_| self.t.act(n * width * c)).collect();
                let out = self.t.act(n * width * c);
                for id in tmp {
                    self.t.free(id);
                }
                if grouped && width == kvd {
                    dropped.push(out);
                } else {
                    kept.push(out);
                }
            }
        }
        if grouped {
            kept.push(self.t.act(n * h * c));
            kept.push(self.t.act(n * h * c));
        }
        self.t.free_all(&mut dropped);
        kept
    }

    /// Eager attention's scores (`heads_s2` elements): q k^T, scaled,
    /// masked in a decoder, then the softmax (fp32 under autocast),
    /// returned; each intermediate dies at the next.
    fn eager_softmax(&mut self, t: &TransformerArch, heads_s2: u64) -> u32 {
        let c = self.d.compute;
        let s1 = self.t.act(heads_s2 * c);
        let s2 = self.t.act(heads_s2 * c);
        self.t.free(s1);
        let s3 = if t.kind == TransformerKind::Decoder {
            let s3 = self.t.act(heads_s2 * c);
            self.t.free(s2);
            s3
        } else {
            s2
        };
        let p = self.t.act(heads_s2 * if self.d.amp { 4 } else { c });
        self.t.free(s3);
        p
    }

    /// A norm without autograd: its output; its statistics die at once.
    fn norm_no_grad(&mut self, t: &TransformerArch, bytes: u64) -> u32 {
        let stats = if t.norm == NormKind::Layernorm { 2 } else { 1 };
        let rows = bytes / t.hidden / self.d.residual;
        let out = self.t.act(bytes);
        let s = self.t.act(rows * 4 * stats);
        self.t.free(s);
        out
    }

    /// A matmul without autograd reading `input` (`elems` elements): the
    /// weight's cast (if pending), under autocast the input's cast in the
    /// compute width when it is wider (dying with the matmul), the output.
    fn matmul_no_grad(&mut self, input: u32, elems: u64, out_bytes: u64) -> u32 {
        self.weight_cast();
        let c = self.d.compute;
        let cast = (self.d.amp && self.t.bytes(input) > elems * c).then(|| self.t.act(elems * c));
        let out = self.t.act(out_bytes);
        if let Some(cast) = cast {
            self.t.free(cast);
        }
        out
    }

    /// Backward of one block: frees saved tensors as autograd releases them and
    /// returns the gradient of the block input. Leaves the block input in `saved`.
    pub(super) fn block_backward(
        &mut self,
        t: &TransformerArch,
        n: u64,
        g: u32,
        saved: &mut Vec<u32>,
    ) -> u32 {
        let (h, r, c) = (t.hidden, self.d.residual, self.d.compute);
        let f = t.ffn;
        let input = saved.pop().expect("block input");
        // feed-forward half, newest saved first
        let g_mlp_out = self.t.act(n * f * c);
        let mut g_f = g_mlp_out;
        let k = if t.mlp == MlpKind::Swiglu { 4 } else { 2 };
        for _ in 0..k {
            let nf = self.t.act(n * f * c);
            self.t.free(g_f);
            g_f = nf;
            let s = saved.pop().expect("mlp saved");
            self.t.free(s);
        }
        let g_n2 = self.t.act(n * h * c);
        self.t.free(g_f);
        let m_in = saved.pop().expect("mlp input");
        self.t.free(m_in);
        let stats = saved.pop().expect("norm stats");
        self.t.free(stats);
        // A pre-norm decoder adds the norm's input gradient into the
        // residual's in place: autograd's buffer for it is `g` itself (the
        // sum passes its gradient on), one tensor through the whole
        // backward. A post-norm encoder's sums feed its norms: new tensors.
        let in_place = t.kind == TransformerKind::Decoder;
        let g_x1 = self.t.act(n * h * r);
        self.t.free(g_n2);
        let x1 = saved.pop().expect("residual");
        self.t.free(x1);
        let g_sum = if in_place {
            g
        } else {
            let g_sum = self.t.act(n * h * r);
            self.t.free(g);
            g_sum
        };
        self.t.free(g_x1);
        // attention half
        let y = saved.pop().expect("attention output");
        let g_y = self.t.act(n * h * c);
        self.t.free(y);
        let kvd = t.kv_dim();
        let heads_s2 = self.run.micro_batch * t.heads * t.seq_len * t.seq_len;
        let mut grads = vec![
            self.t.act(n * h * c),
            self.t.act(n * h * c),
            self.t.act(n * h * c),
        ];
        if self.run.attention == Attention::Eager {
            let gp = self.t.act(heads_s2 * 4);
            let gs = self.t.act(heads_s2 * 4);
            self.t.free(gp);
            self.t.free(gs);
        } else if self.run.attention == Attention::Flash || c != 4 {
            let acc = self.t.act(n * h * 4);
            self.t.free(acc);
        }
        self.t.free(g_y);
        // pop everything down to the qkv projection output (see the forward
        // for what is kept)
        let rotary = t.positional == PositionalKind::Rotary;
        let grouped = t.kv_heads < t.heads;
        let qkv_kept = !(rotary && grouped);
        let keep_from_rope = match (rotary, grouped) {
            (false, _) => 0,
            (true, false) => 2,
            (true, true) => 1,
        };
        let eager_extra = if self.run.attention == Attention::Eager {
            1 + usize::from(self.d.amp)
        } else {
            1
        };
        let gqa = if grouped { 2 } else { 0 };
        for _ in 0..(eager_extra + gqa + keep_from_rope) {
            let s = saved.pop().expect("attention saved");
            self.t.free(s);
        }
        let g_qkv = self.t.act(n * (h + 2 * kvd) * c);
        self.t.free_all(&mut grads);
        let qkv = qkv_kept.then(|| saved.pop().expect("qkv"));
        let g_n1 = self.t.act(n * h * c);
        self.t.free(g_qkv);
        if let Some(qkv) = qkv {
            self.t.free(qkv);
        }
        let a_in = saved.pop().expect("attention input");
        self.t.free(a_in);
        let stats = saved.pop().expect("norm stats");
        self.t.free(stats);
        let g_x = self.t.act(n * h * r);
        self.t.free(g_n1);
        let g_in = if in_place {
            g_sum
        } else {
            let g_in = self.t.act(n * h * r);
            self.t.free(g_sum);
            g_in
        };
        self.t.free(g_x);
        saved.push(input);
        g_in
    }
}
