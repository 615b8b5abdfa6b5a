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
        let qkv = self.t.act(n * (h + 2 * kvd) * c);
        saved.push(qkv);
        if t.positional == PositionalKind::Rotary {
            for width in [h, kvd] {
                let t1 = self.t.act(n * width * c);
                let t2 = self.t.act(n * width * c);
                let t3 = self.t.act(n * width * c);
                let out = self.t.act(n * width * c);
                for id in [t1, t2, t3] {
                    self.t.free(id);
                }
                saved.push(out);
            }
        }
        if t.kv_heads < t.heads {
            saved.push(self.t.act(n * h * c));
            saved.push(self.t.act(n * h * c));
        }
        let heads_s2 = self.run.micro_batch * t.heads * t.seq_len * t.seq_len;
        let y = match self.run.attention {
            Attention::Eager => {
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
                saved.push(self.t.act(n * f * c));
                saved.push(self.t.act(n * f * c));
            }
            MlpKind::Swiglu => {
                for _ in 0..4 {
                    saved.push(self.t.act(n * f * c));
                }
            }
        }
        let down = self.t.act(n * h * c);
        let out = self.t.act(n * h * r);
        self.t.free(down);
        // the block input goes last so that the caller pops it after backward
        let input = saved.remove(0);
        saved.push(input);
        (saved, out)
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
        let g_x1 = self.t.act(n * h * r);
        self.t.free(g_n2);
        let x1 = saved.pop().expect("residual");
        self.t.free(x1);
        let g_sum = self.t.act(n * h * r);
        self.t.free(g_x1);
        self.t.free(g);
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
        // pop everything down to the qkv projection output
        let keep_from_rope = usize::from(t.positional == PositionalKind::Rotary) * 2;
        let eager_extra = if self.run.attention == Attention::Eager {
            1 + usize::from(self.d.amp)
        } else {
            1
        };
        let gqa = if t.kv_heads < t.heads { 2 } else { 0 };
        for _ in 0..(eager_extra + gqa + keep_from_rope) {
            let s = saved.pop().expect("attention saved");
            self.t.free(s);
        }
        let g_qkv = self.t.act(n * (h + 2 * kvd) * c);
        self.t.free_all(&mut grads);
        let qkv = saved.pop().expect("qkv");
        let g_n1 = self.t.act(n * h * c);
        self.t.free(g_qkv);
        self.t.free(qkv);
        let a_in = saved.pop().expect("attention input");
        self.t.free(a_in);
        let stats = saved.pop().expect("norm stats");
        self.t.free(stats);
        let g_x = self.t.act(n * h * r);
        self.t.free(g_n1);
        let g_in = self.t.act(n * h * r);
        self.t.free(g_x);
        self.t.free(g_sum);
        saved.push(input);
        g_in
    }
}
