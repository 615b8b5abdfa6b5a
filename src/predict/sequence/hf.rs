//! One micro-step of a Hugging Face `transformers` model as the library's
//! modelling code runs it, trained the way its docs show (`labels=`, the
//! `outputs` of a step kept by the loop until the next forward returns).
//!
//! What differs from the reference transformer (`transformer.rs`, `block.rs`)
//! and decides memory, read from the library's code and checked against CPU
//! captures of the real models (`python -m vramfit.profile`):
//!
//! - the logits are returned in `outputs`, so they live through backward and
//!   into the next forward; the loss upcasts them to fp32 (a copy under
//!   autocast and in pure low precision) before its log-softmax;
//! - `use_cache` (on by default for decoders, off under
//!   `gradient_checkpointing_enable()`): each layer's keys and values are
//!   copied into a `DynamicCache` (`torch.cat` onto an empty tensor, in the
//!   keys' dtype) that `outputs` keeps, and attention reads the copies;
//! - attention outputs are transposed back with `.contiguous()`, a copy the
//!   output projection keeps;
//! - under autocast every `Linear` casts its (fp32) input separately, so
//!   LLaMA's q/k/v and gate/up projections and BERT's q/k/v each keep a
//!   low-precision copy of the same activation;
//! - dropout (GPT-2, BERT: p = 0.1 by default) keeps a one-byte mask per
//!   element on the embeddings and on both residual branches, and in eager
//!   attention on the probabilities (the fused SDPA kernels draw theirs);
//! - GPT-2's `gelu_new` is composed of elementwise ops: autograd keeps
//!   `0.5 * x`, the input of `pow` (an fp32 copy under autocast, where `pow`
//!   runs in fp32 and so does everything after it), `tanh` and `1 + tanh`;
//! - LLaMA's RMSNorm upcasts to fp32 and keeps the fp32 input and the
//!   normalised fp32 tensor (its low-precision copy in pure bf16/fp16);
//!   rotary embedding's products run in the cos/sin dtype, fp32 under
//!   autocast, so queries and keys come out in fp32 there;
//! - eager attention's softmax is in fp32 (LLaMA, OPT, GPT-NeoX and ViT ask
//!   for it; GPT-2, BERT and T5 get it from autocast only, and in pure
//!   bf16/fp16 theirs stays in the scores' dtype) and its low-precision copy
//!   is what the value product keeps; grouped-query keys and values are repeated (`repeat_kv`)
//!   into full-width copies; fp32 SDPA with grouped-query heads has no fused
//!   kernel and runs PyTorch's math path, which keeps the repeated keys and
//!   values and the fp32 probabilities.
//!
//! Backward frees each block's saved tensors newest first, with one gradient
//! of each saved tensor's size alive at a time beside the residual gradient,
//! except where the H200's recorded runs show more: softmax's and RMSNorm's
//! backward (`hf_rmsnorm_backward`) allocate as autograd runs them.

use crate::api::{Attention, MlpKind, NormKind, PositionalKind, Precision, TransformerKind};
use crate::predict::arch::{HfFamily, HfImpl, TransformerArch};

use super::{FlashSaved, Gen, RmsSaved, Trace};

/// Element widths of one run.
#[derive(Clone, Copy)]
struct W {
    /// Matmul outputs.
    c: u64,
    /// Residual stream and norm outputs (fp32 under autocast).
    r: u64,
    /// Parameters.
    w: u64,
    /// Elementwise ops that autocast runs in fp32 (`pow`, softmax, products
    /// with fp32 rotary tables): 4 under autocast, else `c`.
    e: u64,
    amp: bool,
}

/// Whether block `l`'s weight casts are made at the matmuls that first use
/// them ([`Gen::weight_cast`]) rather than all at the block's start. In the
/// recorded H200 sequences both the checkpointed first forward and the
/// others make them lazily; only the first is modelled so (`first_ckpt`):
/// made lazily in the others too, the held-out set's p90 went from 4.3 % to
/// 5.9 %, the other rules of those forwards being fitted to the eager
/// order. Mixture-of-experts, disentangled, cross-attention and image
/// blocks keep the eager order (their matmuls do not call for the casts).
fn lazy_casts(t: &TransformerArch, l: u64, first_ckpt: bool) -> bool {
    first_ckpt && matmuls_in_order(t) && !t.is_cross_block(l) && t.layout.image.is_none()
}

/// Whether the blocks' forward calls [`Gen::weight_cast`] at each of their
/// matmuls in the order of their parameters: not in mixture-of-experts
/// and disentangled blocks, whose router and relative projections do not.
fn matmuls_in_order(t: &TransformerArch) -> bool {
    t.layout.moe.is_none() && t.layout.disentangled.is_none()
}

impl Gen<'_> {
    fn widths(&self) -> W {
        W {
            c: self.d.compute,
            r: self.d.residual,
            w: self.d.weight,
            e: if self.d.amp { 4 } else { self.d.compute },
            amp: self.d.amp,
        }
    }

    /// Frees `id` unless it was released already.
    fn release(&mut self, id: u32) {
        if self.released.insert(id) {
            self.t.free(id);
        }
    }

    /// Under `no_grad` nothing is kept for backward: what went into `saved`
    /// from `from` on dies here, where the modelling code drops it (a
    /// function returns, a variable is rebound), except `keep`, the block
    /// input the checkpoint holds. With autograd this does nothing.
    fn drop_unsaved(&mut self, saved: &mut Vec<u32>, from: usize, keep: u32) {
        if !self.no_grad {
            return;
        }
        self.free_kernel_casts();
        let ids: Vec<u32> = saved.drain(from.min(saved.len())..).collect();
        for id in ids {
            if id == keep {
                saved.push(id);
            } else {
                self.release(id);
            }
        }
    }

    /// Under `no_grad`, frees the local (a norm's output the block holds) that
    /// the modelling code drops here; with autograd the block frees it later.
    fn drop_local(&mut self, local: &mut Option<u32>) {
        if self.no_grad
            && let Some(id) = local.take()
        {
            self.t.free(id);
        }
    }

    /// Frees the casts made for the kernel whose output was just allocated.
    fn free_kernel_casts(&mut self) {
        let mut casts = std::mem::take(&mut self.kernel_casts);
        self.t.free_all(&mut casts);
    }

    /// The input `id` (`elems` elements) of an op that keeps it: under
    /// autocast, a copy in the compute width when it is wider (then `id` is
    /// freed if `owned`); otherwise `id` itself when `owned` (a tensor not
    /// owned, such as a cache entry, stays alive anyway).
    fn autocast_input(&mut self, id: u32, elems: u64, owned: bool, saved: &mut Vec<u32>) {
        let wd = self.widths();
        if wd.amp && self.t.bytes(id) > elems * wd.c && self.no_grad {
            // nothing keeps the cast; the input lives on in its variable
            let cast = self.t.act(elems * wd.c);
            self.kernel_casts.push(cast);
            if owned {
                saved.push(id);
            }
        } else if wd.amp && self.t.bytes(id) > elems * wd.c {
            saved.push(self.t.act(elems * wd.c));
            if owned {
                self.release(id);
            }
        } else if owned {
            saved.push(id);
        }
    }

    pub(super) fn hf_micro_step(&mut self, t: &TransformerArch, lib: HfImpl) {
        let wd = self.widths();
        self.offset_norms = t.layout.offset_norms;
        let (b, s, h, v) = (self.run.micro_batch, t.seq_len, t.hidden, t.vocab);
        let n = b * s;
        let idx = self.t.act(n * 8);
        let tgt = self.t.act(n * 8);
        self.fsdp_gather(None);
        // Tensors the model's forward holds as locals until it returns.
        let mut locals: Vec<u32> = Vec::new();
        let mut emb_saved: Vec<u32> = Vec::new();
        // T5: the stack's embeddings, a local until the stack returns
        let mut stack_local: Option<u32> = None;
        let mut boundary: Option<T5Boundary> = None;
        let x = match lib.family {
            HfFamily::Gpt2 => {
                let e = t.embed_dim();
                let mut tok = self.t.act(n * e * wd.w);
                if e != h {
                    // OPT's project_in keeps its input (a low-precision copy under autocast)
                    self.autocast_input(tok, n * e, true, &mut emb_saved);
                    tok = self.t.act(n * h * wd.c);
                }
                let pos = self.t.act(s * h * wd.w);
                locals.extend([tok, pos]);
                let sum = self.t.act(n * h * wd.w);
                self.hf_dropout(lib, sum, n * h, wd.w, &mut emb_saved)
            }
            HfFamily::Llama => {
                let mut tok = self.t.act(n * h * wd.w);
                if t.layout.embed_scale {
                    // Gemma: `hidden_states * normalizer` (sqrt(hidden));
                    // Granite: `* embedding_multiplier`
                    tok = self.hf_scaled(tok);
                }
                if t.positional == PositionalKind::Rotary {
                    // rotary cos and sin for the positions, in the embeddings' dtype
                    for _ in 0..2 {
                        locals.push(self.t.act(s * t.head_dim * wd.w));
                    }
                } else if t.layout.rel_buckets > 0 {
                    // T5: the embeddings' dropout (the embeddings live on as
                    // the encoder stack's local), then each stack's position
                    // bias (1, heads, seq, seq), reused by every block of the
                    // stack and kept for backward
                    let dropped = self.hf_dropout_beside(lib, tok, n * h, wd.w, &mut emb_saved);
                    if dropped != tok {
                        stack_local = Some(tok);
                        tok = dropped;
                    }
                    for _ in 0..2 {
                        emb_saved.push(self.t.act(t.heads * s * s * wd.e));
                    }
                }
                tok
            }
            HfFamily::Bert => {
                let word = self.t.act(n * h * wd.w);
                let types = self.t.act(n * h * wd.w);
                let s1 = self.t.act(n * h * wd.w);
                self.t.free(word);
                self.t.free(types);
                let pos = self.t.act(s * h * wd.w);
                let s2 = self.t.act(n * h * wd.w);
                self.t.free(s1);
                self.t.free(pos);
                // LayerNorm keeps its input and statistics
                emb_saved.push(s2);
                emb_saved.push(self.t.act(n * 8));
                let ln = self.t.act(n * h * wd.r);
                self.hf_dropout(lib, ln, n * h, wd.r, &mut emb_saved)
            }
        };
        let mut x = x;
        if self.hf_attention(t) != Attention::Eager && (0..t.layers).any(|l| t.windowed_block(l)) {
            // The window's mask lives until the model returns; a checkpoint
            // keeps it as an input of every block until backward (the
            // recorded Mistral runs at 6k and 8k tokens).
            let mask = self.hf_window_mask(s);
            if self.run.checkpointing {
                emb_saved.push(mask);
            } else {
                self.encoder_locals.push(mask);
            }
        }
        if t.layout.own_attention {
            // DeBERTa's encoder builds the `[batch, 1, seq, seq]` mask from
            // the tokenizer's int64 one; a checkpoint keeps it as an input
            let mask = self.t.act(b * s * s * 8);
            if self.run.checkpointing {
                emb_saved.push(mask);
            } else {
                self.encoder_locals.push(mask);
            }
        }
        let mut layer_saved: Vec<Vec<u32>> = Vec::new();
        let mut layer_casts: Vec<Vec<u32>> = Vec::new();
        let mut forward_casts: Vec<u32> = Vec::new();
        for l in 0..t.layers {
            if t.layout.decoder_layers > 0 && l + t.layout.decoder_layers == t.layers {
                let (b, decoder_input) = self.t5_stacks_meet(lib, n, h, x, stack_local.take());
                stack_local = Some(b.decoder_embeddings);
                if wd.amp {
                    // the projections keep their casts: the encoder's
                    // output lives on as the forward's local
                    locals.push(b.encoder_output);
                }
                boundary = Some(b);
                x = decoder_input;
            }
            self.fsdp_gather(Some(l as u32));
            let lazy = lazy_casts(t, l, self.run.checkpointing);
            let eager_casts = if lazy {
                self.start_lazy_casts(Some(l as u32));
                Vec::new()
            } else {
                self.cast_weights(Some(l as u32))
            };
            self.workspace(0);
            self.no_grad = self.run.checkpointing;
            let (saved, out) = self.hf_block_forward(t, lib, l, n, x);
            self.no_grad = false;
            let casts = if lazy {
                self.end_lazy_casts()
            } else {
                eager_casts
            };
            self.fsdp_post_forward(Some(l as u32));
            if self.run.checkpointing {
                // Only the block input is kept; everything else is recomputed.
                let mut saved = saved;
                let input = saved.pop().expect("block input");
                for id in saved {
                    self.release(id);
                }
                // autocast's cache holds the weights' casts until the
                // forward leaves its context, after the loss
                forward_casts.extend(casts);
                layer_saved.push(vec![input]);
                layer_casts.push(Vec::new());
            } else {
                layer_saved.push(saved);
                layer_casts.push(casts);
            }
            x = out;
        }
        // the encoder returns: its mask and list of hidden states go
        for id in std::mem::take(&mut self.encoder_locals) {
            self.release(id);
        }
        // head
        let head_casts = self.cast_weights(None);
        let mut head_saved = vec![x];
        let mut dead_at_return = None;
        let head_in = match lib.family {
            HfFamily::Gpt2 => {
                head_saved.push(self.t.act(n * 8));
                self.t.act(n * h * wd.r)
            }
            HfFamily::Llama if boundary.is_some() => {
                // T5's decoder stack ends with its norm and dropout (its
                // output held by the returned outputs to the forward's
                // end), and returns; v1.0's head reads it rescaled by
                // 1/sqrt(d_model)
                let nrm = self.hf_input_norm(t, n, h, &mut head_saved);
                let out = self.hf_dropout(lib, nrm, n * h, wd.w, &mut head_saved);
                if let Some(id) = stack_local.take() {
                    self.t.free(id);
                }
                if t.layout.decoder_output_scaled {
                    locals.push(out);
                    self.t.act(n * h * wd.w)
                } else {
                    out
                }
            }
            HfFamily::Llama => self.hf_input_norm(t, n, h, &mut head_saved),
            HfFamily::Bert => {
                // transform: dense, gelu, LayerNorm (fp32 under autocast).
                // Under autocast the dense keeps its cast of the encoder's
                // output, which lives on only as the forward's local. (The
                // image classifier shares this head's sequence; its five
                // measured runs fit the output kept, so it stays.)
                if wd.amp {
                    head_saved.push(self.t.act(n * h * wd.c));
                    if t.layout.image.is_none() {
                        dead_at_return = Some(x);
                    }
                }
                let dense = self.t.act(n * h * wd.c);
                head_saved.push(dense);
                let gelu = self.t.act(n * h * wd.c);
                if wd.amp {
                    head_saved.push(self.t.act(n * h * 4));
                    self.t.free(gelu);
                } else {
                    head_saved.push(gelu);
                }
                head_saved.push(self.t.act(n * 8));
                self.t.act(n * h * wd.r)
            }
        };
        // An image classifier's head reads each image's first (class) token;
        // OPT's project_out narrows the tokens to the word table's width.
        let (rows, hw) = match t.layout.image {
            Some(_) => (b, h),
            None => (n, t.embed_dim()),
        };
        let head_in = if hw != h {
            self.autocast_input(head_in, n * h, true, &mut head_saved);
            self.t.act(n * hw * wd.c)
        } else {
            head_in
        };
        // Under autocast the head's matmul keeps its own low-precision copy;
        // a head that reads some rows only (ViT's class token) keeps them.
        if wd.amp || rows != n {
            head_saved.push(self.t.act(rows * hw * wd.c));
            locals.push(head_in);
        } else {
            head_saved.push(head_in);
        }
        // logits: returned in `outputs`. The causal-LM loss upcasts them
        // (`logits.float()`, a copy in low precision) before its
        // log-softmax; BERT's and T5's `CrossEntropyLoss` takes them as they
        // are. Its composite calls log_softmax with the logits' own dtype,
        // which autocast keeps, and then nll_loss, on autocast's fp32 list:
        // under autocast the low-precision log-probabilities and an fp32
        // copy of them are both kept for backward; in pure bf16/fp16
        // everything stays in that precision.
        let mut logits = self.t.act(rows * v * wd.c);
        if t.layout.logits_scaled {
            // Granite: `logits / logits_scaling`
            logits = self.hf_scaled(logits);
        }
        let mut softcap_tanh = None;
        if t.layout.final_softcap {
            // Gemma 2: logits / cap, tanh (kept), * cap
            let div = self.t.act(rows * v * wd.c);
            self.t.free(logits);
            let tanh = self.t.act(rows * v * wd.c);
            self.t.free(div);
            softcap_tanh = Some(tanh);
            logits = self.t.act(rows * v * wd.c);
        }
        let upcast = t.loss_upcasts_logits();
        let lsm = if upcast && wd.c != 4 {
            let up = self.t.act(rows * v * 4);
            let lsm = self.t.act(rows * v * 4);
            self.t.free(up);
            lsm
        } else {
            self.t.act(rows * v * if upcast { 4 } else { wd.c })
        };
        // autocast's fp32 copy of the log-probabilities for nll_loss
        let nll_copy = (!upcast && wd.amp && wd.c != 4).then(|| self.t.act(rows * v * 4));
        let loss = self.t.act(512);
        self.t.free_all(&mut locals);
        if let Some(id) = dead_at_return {
            self.release(id);
        }
        self.t.free_all(&mut forward_casts);
        // the previous step's outputs are released when this forward returns
        let mut previous = std::mem::take(&mut self.outputs);
        self.t.free_all(&mut previous);
        self.fsdp_end_forward();
        // backward through the loss
        self.fsdp_root_pre_backward(t.layers.checked_sub(1).map(|l| l as u32));
        let mut g_nll = self.t.act(
            rows * v
                * if upcast || nll_copy.is_some() {
                    4
                } else {
                    wd.c
                },
        );
        if let Some(copy) = nll_copy {
            // the copy's backward casts the fp32 gradient back
            self.t.free(copy);
            let g = self.t.act(rows * v * wd.c);
            self.t.free(g_nll);
            g_nll = g;
        }
        let g_lsm = self.t.act(rows * v * if upcast { 4 } else { wd.c });
        self.t.free(g_nll);
        self.t.free(lsm);
        let mut g_logits = if upcast && wd.c != 4 {
            let g = self.t.act(rows * v * wd.c);
            self.t.free(g_lsm);
            g
        } else {
            g_lsm
        };
        if let Some(tanh) = softcap_tanh {
            // the softcap's backward, each gradient in the logits' width:
            // `* cap`'s, tanh's (its kept output goes after it), `/ cap`'s
            // (the recorded Gemma 2 autocast runs)
            for step in 0..3 {
                let g = self.t.act(rows * v * wd.c);
                self.t.free(g_logits);
                if step == 1 {
                    self.t.free(tanh);
                }
                g_logits = g;
            }
        }
        // The head's matmul node is the first of backward's to run, after the
        // loss's large blocks were freed: the weight's gradient, then cuBLAS's
        // workspace of the backward thread (on its first use), then the
        // input's gradient; `g_logits` and autocast's copy of the weight go
        // when the node returns.
        let (tied_contribution, mut g) =
            self.hf_head_grads(t, g_logits, rows * hw * wd.c, head_casts, n * h * wd.r);
        let x_last = head_saved.remove(0);
        // The final RMSNorm's backward runs after the head's (whose kept
        // input goes first).
        let norm = self.release_all_but_a_norm(&head_saved);
        if boundary.is_some() {
            // the rescale's and the dropout's gradients
            for _ in 0..if t.layout.decoder_output_scaled { 2 } else { 1 } {
                let g_in = self.t.act(n * h * wd.r);
                self.t.free(g);
                g = g_in;
            }
        }
        if let Some(norm) = norm {
            g = self.hf_rmsnorm_backward(norm, g);
        }
        let mut x_in_of_next = x_last;
        let mut shared_dense = None;
        for l in (0..t.layers).rev() {
            let mut saved = layer_saved.pop().expect("saved per layer");
            let mut casts = layer_casts.pop().expect("casts per layer");
            self.fsdp_pre_backward(l as u32);
            if self.run.checkpointing {
                casts = self.cast_weights(Some(l as u32));
                let input = saved[0];
                let (sv, out) = self.hf_block_forward(t, lib, l, n, input);
                self.release(out);
                saved = sv;
            }
            let made;
            (g, made) = self.hf_block_backward(t, l, n, g, &mut saved);
            self.grads_of_layer_but(Some(l as u32), &made);
            self.t.free_all(&mut casts);
            self.fsdp_post_backward(Some(l as u32));
            self.release(x_in_of_next);
            x_in_of_next = saved.pop().expect("block input");
            if l + t.layout.decoder_layers == t.layers
                && let Some(b) = boundary.take()
            {
                self.release(x_in_of_next);
                let dense;
                (g, dense, x_in_of_next) = self.t5_stacks_meet_backward(t, n, b, g);
                shared_dense = Some(dense);
            }
        }
        self.release(x_in_of_next);
        for id in emb_saved {
            self.release(id);
        }
        self.hf_embedding_grads(t, tied_contribution, g);
        if let Some(id) = shared_dense {
            // the decoder's gradient of the shared table, waiting in
            // autograd's buffer, is summed with the encoder's
            self.t.free(id);
        }
        self.fsdp_post_backward(None);
        self.fsdp_end_backward();
        for id in [idx, tgt, loss] {
            self.t.free(id);
        }
        self.outputs.push(logits);
        self.outputs.append(&mut self.cache);
    }

    /// Indices of the embedding tables (word, positions, token types): their
    /// gradients come from the embedding backward, at the end.
    fn hf_embedding_tables(&self, t: &TransformerArch) -> Vec<usize> {
        let mut tables = vec![0];
        if t.positions > 0 {
            tables.push(1);
        }
        if t.token_types > 0 {
            tables.push(tables.len());
        }
        tables
    }

    /// The head's backward at the loss: its matmul's weight gradient, cuBLAS's
    /// workspace, the input's gradient (`input_bytes`), then
    /// `g_logits` (the matmul's grad_output) and `casts` (autocast's copies
    /// of the head-side weights, saved for it) released as the node returns
    /// (the order of the H200's recorded runs, tied heads and untied, in
    /// every precision); the other head-side weights' gradients after, and the
    /// residual's gradient (`residual_bytes`, returned second; under autocast
    /// before the untied weight's cast back). With a tied head the word
    /// embedding's gradient from the head waits in autograd's input buffer
    /// (returned first) until the embedding's own contribution arrives;
    /// under autocast the weight's cast back makes it fp32 after the
    /// residual's gradient, and the low-precision one goes (the recorded
    /// GPT-2 and Gemma 2 autocast runs).
    fn hf_head_grads(
        &mut self,
        t: &TransformerArch,
        g_logits: u32,
        input_bytes: u64,
        mut casts: Vec<u32>,
        residual_bytes: u64,
    ) -> (Option<u32>, u32) {
        if self.fsdp() {
            let g_head = self.t.act(input_bytes);
            self.workspace(1);
            self.grads_of_layer(None);
            self.t.free(g_logits);
            self.t.free_all(&mut casts);
            let g = self.t.act(residual_bytes);
            self.t.free(g_head);
            return (None, g);
        }
        let tables = self.hf_embedding_tables(t);
        let idx: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].layer.is_none() && !tables.contains(&i))
            .collect();
        // An untied head's own matmul weight is the last of them.
        let head = idx
            .last()
            .copied()
            .filter(|&i| !t.tied && self.params[i].matmul_weight);
        let workspace = self.first_workspace(1);
        let g_head = std::cell::Cell::new(None);
        let g = std::cell::Cell::new(None);
        let mut node_return = |g: &mut Self| {
            let tr = &mut g.t;
            if let Some(bytes) = workspace {
                tr.alloc(bytes, super::Category::Workspace);
            }
            g_head.set(Some(tr.act(input_bytes)));
            tr.free(g_logits);
            tr.free_all(&mut casts);
        };
        // Under autocast the residual's gradient (the cast back of the
        // head's input) comes before the weight's cast back.
        let residual = |tr: &mut Trace| {
            g.set(Some(tr.act(residual_bytes)));
            if let Some(h) = g_head.take() {
                tr.free(h);
            }
        };
        let tied = if let Some(i) = head {
            self.weight_grad_then(i, node_return, residual);
            None
        } else {
            let tied = t
                .tied
                .then(|| self.t.act(self.params[0].numel() * self.widths().c));
            node_return(self);
            tied
        };
        for i in idx.into_iter().rev().filter(|&i| Some(i) != head) {
            self.weight_grad(i);
        }
        let g = g.take().unwrap_or_else(|| {
            let g = self.t.act(residual_bytes);
            self.t
                .free(g_head.take().expect("the head's node returned"));
            g
        });
        let tied = tied.map(|low| {
            if !self.widths().amp {
                return low;
            }
            // the first micro-step's becomes `.grad` (see
            // `hf_embedding_grads`)
            let category = if self.grad_ids[0].is_none() {
                super::Category::Gradients
            } else {
                super::Category::Activations
            };
            let up = self
                .t
                .alloc(self.params[0].numel() * self.widths().w, category);
            self.t.free(low);
            up
        });
        (tied, g)
    }

    /// The embedding backward: a dense gradient of each table; with a tied
    /// head the word table's two contributions are summed into a new tensor,
    /// which becomes `.grad` (added into it on later accumulation steps).
    /// Under autocast the head's (fp32, the weight cast's backward) is not a
    /// view: autograd adds the embedding's into it in place, and it is the
    /// `.grad` (the recorded runs free the dense gradient there and keep the
    /// head's to the next step's `zero_grad`).
    /// The word table's backward runs last and frees `g`, the embeddings'
    /// gradient, as it returns, before autograd sums the tied contributions.
    /// Over 3,072 token ids CUDA's kernel sorts them and sums per-segment
    /// partials in fp32: a buffer sized for its bound on the partial segments
    /// (ids plus a tenth, each a row of the table), freed before it returns
    /// (the recorded runs: 17.6 MiB for 4,096 ids of GPT-2 medium's 1,024).
    fn hf_embedding_grads(&mut self, t: &TransformerArch, tied: Option<u32>, g: u32) {
        if self.fsdp() {
            let table = self.t.act(self.params[0].numel() * self.widths().w);
            self.t.free(table);
            self.release(g);
            return;
        }
        let w = self.widths().w;
        let ids = self.run.micro_batch * t.seq_len;
        for i in self.hf_embedding_tables(t).into_iter().rev() {
            if i != 0 || tied.is_none() {
                self.weight_grad(i);
                if i == 0 {
                    self.embedding_partials(ids, t.hidden);
                    self.release(g);
                }
                continue;
            }
            let numel = self.params[0].numel();
            let dense = self.t.act(numel * w);
            self.embedding_partials(ids, t.hidden);
            self.release(g);
            if let Some(c) = tied.filter(|_| self.widths().amp) {
                match self.grad_ids[0] {
                    None => self.grad_ids[0] = Some(c),
                    Some(_) => self.t.free(c),
                }
                self.t.free(dense);
                continue;
            }
            match self.grad_ids[0] {
                None => {
                    let sum = self.t.alloc(numel * w, super::Category::Gradients);
                    self.grad_ids[0] = Some(sum);
                }
                Some(_) => {
                    let sum = self.t.act(numel * w);
                    self.t.free(sum);
                }
            }
            if let Some(c) = tied {
                self.t.free(c);
            }
            self.t.free(dense);
        }
    }

    /// RMSNorm as LLaMA's modelling code writes it: `x.to(float32)`,
    /// `pow(2).mean`, `rsqrt`, `x * rsqrt`, then `weight * y.to(input_dtype)`.
    /// Gemma's and OLMo 2's (`offset_norms`) multiply the fp32 `y` by
    /// `1 + weight` or the weight and cast the product: autograd keeps `y` in
    /// fp32 instead of its cast.
    /// Pushes what autograd keeps (besides a fp32 input itself) and returns the
    /// output. The input is the residual stream's width.
    fn hf_rmsnorm(&mut self, n: u64, h: u64, saved: &mut Vec<u32>) -> u32 {
        let r = self.widths().r;
        self.hf_rmsnorm_of(n, h, r, saved)
    }

    /// The fp32 product of an `offset_norms` RMSNorm's weight and its `elems`
    /// normalised values, cast to the input's `width`; `dead`, the
    /// normalised tensor when nothing keeps it, goes after the product.
    fn hf_weight_product(&mut self, elems: u64, width: u64, dead: Option<u32>) -> u32 {
        let product = self.t.act(elems * 4);
        if let Some(y) = dead {
            self.t.free(y);
        }
        let out = self.t.act(elems * width);
        self.t.free(product);
        out
    }

    /// The norm of a block's input in the LLaMA family's code: RMSNorm, or
    /// (StarCoder2) torch's LayerNorm, which keeps its input and per-row
    /// statistics and runs in fp32 under autocast.
    fn hf_input_norm(&mut self, t: &TransformerArch, n: u64, h: u64, saved: &mut Vec<u32>) -> u32 {
        if t.norm == NormKind::Layernorm {
            saved.push(self.t.act(n * 8));
            let r = self.widths().r;
            self.t.act(n * h * r)
        } else {
            self.hf_rmsnorm(n, h, saved)
        }
    }

    /// [`Self::hf_rmsnorm`] of an input `width` bytes wide: Gemma's norms of
    /// the attention's and the feed-forward's outputs read them in the
    /// matmuls' width, which under autocast is not the residual stream's.
    fn hf_rmsnorm_of(&mut self, n: u64, h: u64, width: u64, saved: &mut Vec<u32>) -> u32 {
        let wd = self.widths();
        if width == 4 {
            // fp32 input: the upcast is a no-op and the input itself is kept
            let sq = self.t.act(n * h * 4);
            let var = self.t.act(n * 4);
            self.t.free(sq);
            let rs = self.t.act(n * 4);
            saved.push(rs);
            self.t.free(var);
            let y = self.t.act(n * h * 4);
            let out = self.t.act(n * h * wd.w);
            if self.no_grad {
                self.t.free(y);
            } else {
                saved.push(y);
                self.rmsnorms.insert(
                    y,
                    RmsSaved {
                        x32: None,
                        width,
                        rs,
                        y,
                        elems: n * h,
                    },
                );
            }
            out
        } else if self.no_grad {
            // each temporary dies as its variable is rebound: the fp32 copy
            // at `x * rsqrt`, the cast after the weight's product
            let x32 = self.t.act(n * h * 4);
            let sq = self.t.act(n * h * 4);
            let var = self.t.act(n * 4);
            self.t.free(sq);
            let rs = self.t.act(n * 4);
            self.t.free(var);
            let y = self.t.act(n * h * 4);
            self.t.free(x32);
            self.t.free(rs);
            if self.offset_norms {
                return self.hf_weight_product(n * h, width, Some(y));
            }
            let cast = self.t.act(n * h * width);
            let out = self.t.act(n * h * wd.w);
            self.t.free(cast);
            self.t.free(y);
            out
        } else {
            let x32 = self.t.act(n * h * 4);
            saved.push(x32);
            let sq = self.t.act(n * h * 4);
            let var = self.t.act(n * 4);
            self.t.free(sq);
            let rs = self.t.act(n * 4);
            saved.push(rs);
            self.t.free(var);
            let y32 = self.t.act(n * h * 4);
            // the product's input autograd keeps: Gemma's fp32 `y`, or
            // LLaMA's cast of it
            let y = if self.offset_norms {
                y32
            } else {
                let y = self.t.act(n * h * width);
                self.t.free(y32);
                y
            };
            saved.push(y);
            self.rmsnorms.insert(
                y,
                RmsSaved {
                    x32: Some(x32),
                    width,
                    rs,
                    y,
                    elems: n * h,
                },
            );
            if self.offset_norms {
                return self.hf_weight_product(n * h, width, None);
            }
            self.t.act(n * h * wd.w)
        }
    }

    /// RMSNorm's backward as autograd runs it, from `g_y`, the gradient of
    /// the normalised tensor the weight multiplied (the weight's own
    /// gradient is the parameters' business): the cast back to fp32 of a
    /// low-precision `g_y`; the product `x * rsqrt`'s two gradients (the
    /// inverse RMS's, `x * g` summed over each row, and the input's);
    /// `mean`'s gradient spread over the row and `pow`'s (`x * 2`, times it);
    /// the second input gradient summed into the first in place, then cast
    /// to the input's width. Each kept tensor is released when the last
    /// node reading it has run. Returns the input's gradient.
    fn hf_rmsnorm_backward(&mut self, norm: RmsSaved, g_y: u32) -> u32 {
        let e = norm.elems;
        let g_y32 = if norm.x32.is_some() && self.offset_norms {
            // Gemma, OLMo 2: the cast's gradient back to fp32, then the product's
            // (the weight's, over the rows, and `y`'s)
            let g = self.t.act(e * 4);
            self.t.free(g_y);
            let rows = self.t.act(e * 4);
            self.t.free(rows);
            let g_y = self.t.act(e * 4);
            self.t.free(g);
            self.release(norm.y);
            g_y
        } else if norm.x32.is_some() {
            self.release(norm.y);
            let g = self.t.act(e * 4);
            self.t.free(g_y);
            g
        } else {
            self.release(norm.y);
            g_y
        };
        let row_product = self.t.act(e * 4);
        let g_x = self.t.act(e * 4);
        self.t.free(row_product);
        self.t.free(g_y32);
        self.release(norm.rs);
        let g_sq = self.t.act(e * 4);
        let twice = self.t.act(e * 4);
        let times = self.t.act(e * 4);
        let g_x2 = self.t.act(e * 4);
        self.t.free(times);
        self.t.free(twice);
        self.t.free(g_sq);
        if let Some(x32) = norm.x32 {
            self.release(x32);
        }
        self.t.free(g_x2);
        if norm.x32.is_some() {
            let g = self.t.act(e * norm.width);
            self.t.free(g_x);
            g
        } else {
            g_x
        }
    }

    /// Qwen3's RMSNorm of each head (`rows` vectors of `width`) of a
    /// projection `src` in the compute dtype: as [`Self::hf_rmsnorm`], the
    /// fp32 input (or the input itself when it is fp32), the inverse RMS and
    /// the normalised tensor are kept; `src` is consumed.
    fn hf_head_rmsnorm(&mut self, rows: u64, width: u64, src: u32, saved: &mut Vec<u32>) -> u32 {
        let wd = self.widths();
        let elems = rows * width;
        if wd.c == 4 {
            let sq = self.t.act(elems * 4);
            let var = self.t.act(rows * 4);
            self.t.free(sq);
            saved.push(self.t.act(rows * 4));
            self.t.free(var);
            saved.push(src);
            let normed = self.t.act(elems * 4);
            saved.push(normed);
            self.t.act(elems * 4)
        } else {
            // the input, the norm's argument, lives until the norm returns
            saved.push(self.t.act(elems * 4));
            let sq = self.t.act(elems * 4);
            let var = self.t.act(rows * 4);
            self.t.free(sq);
            saved.push(self.t.act(rows * 4));
            self.t.free(var);
            let y = self.t.act(elems * 4);
            let out = if self.offset_norms {
                // Gemma 3, OLMo 2: `y` kept in fp32, the weight's product cast
                saved.push(y);
                self.hf_weight_product(elems, wd.c, None)
            } else {
                saved.push(self.t.act(elems * wd.c));
                self.t.free(y);
                self.t.act(elems * wd.c)
            };
            self.t.free(src);
            out
        }
    }

    /// Rotary embedding of `elems` elements: `x * cos + rotate_half(x) * sin`;
    /// `src`, the input, is freed after it (`None`: a view of a fused
    /// projection, which stays). `cat`: the sum is concatenated with the
    /// unrotated rest (Phi-3), a copy.
    fn hf_rope(&mut self, elems: u64, src: Option<u32>, cat: bool) -> u32 {
        let wd = self.widths();
        let t1 = self.t.act(elems * wd.e);
        let neg = self.t.act(elems / 2 * wd.c);
        let half = self.t.act(elems * wd.c);
        self.t.free(neg);
        let t2 = self.t.act(elems * wd.e);
        self.t.free(half);
        let mut out = self.t.act(elems * wd.e);
        self.t.free(t1);
        self.t.free(t2);
        if cat {
            let joined = self.t.act(elems * wd.e);
            self.t.free(out);
            out = joined;
        }
        if let Some(src) = src {
            self.t.free(src);
        }
        out
    }

    /// Where T5's encoder stack meets its decoder: the encoder's final norm
    /// and dropout (the encoder's output), the encoder's embeddings freed as
    /// it returns, then the decoder's embeddings and their dropout, whose
    /// output is returned as the first decoder block's input.
    fn t5_stacks_meet(
        &mut self,
        lib: HfImpl,
        n: u64,
        h: u64,
        encoder_last: u32,
        encoder_embeddings: Option<u32>,
    ) -> (T5Boundary, u32) {
        let mut encoder_end = Vec::new();
        let nrm = self.hf_rmsnorm(n, h, &mut encoder_end);
        let w = self.widths().w;
        let encoder_output = self.hf_dropout(lib, nrm, n * h, w, &mut encoder_end);
        if let Some(id) = encoder_embeddings {
            self.t.free(id);
        }
        // the decoder's embeddings live on as its stack's local
        let decoder_embeddings = self.t.act(n * h * w);
        let mut decoder_mask = Vec::new();
        let decoder_input =
            self.hf_dropout_beside(lib, decoder_embeddings, n * h, w, &mut decoder_mask);
        let boundary = T5Boundary {
            encoder_last,
            encoder_end,
            encoder_output,
            decoder_mask,
            decoder_embeddings,
        };
        (boundary, decoder_input)
    }

    /// The backward of [`Self::t5_stacks_meet`], from `g`, the gradient of the
    /// first decoder block's input: the decoder embeddings' dropout, then
    /// their dense gradient of the shared table (kept in autograd's buffer
    /// until the encoder's is summed with it: returned second); then the
    /// gradient of the encoder's output, summed from the cross-attentions'
    /// projections, through its dropout and the final norm. Returns the
    /// encoder's last block output's gradient and that output, third.
    fn t5_stacks_meet_backward(
        &mut self,
        t: &TransformerArch,
        n: u64,
        b: T5Boundary,
        g: u32,
    ) -> (u32, u32, u32) {
        let wd = self.widths();
        let h = t.hidden;
        let g_emb = self.t.act(n * h * wd.w);
        self.t.free(g);
        for id in b.decoder_mask {
            self.release(id);
        }
        let dense = self.t.act(t.vocab * h * wd.w);
        self.embedding_partials(n, h);
        self.t.free(g_emb);
        let g_out = self.t.act(n * h * wd.w);
        let g_in = self.t.act(n * h * wd.w);
        self.t.free(g_out);
        if !wd.amp {
            self.release(b.encoder_output);
        }
        let g = match self.release_all_but_a_norm(&b.encoder_end) {
            Some(m) => self.hf_rmsnorm_backward(m, g_in),
            None => g_in,
        };
        (g, dense, b.encoder_last)
    }

    /// Over [`EMBEDDING_DIRECT_IDS`] token ids CUDA's embedding backward
    /// sums per-segment partials in fp32: a buffer sized for its bound on the
    /// partial segments (ids plus a tenth, each a row of `hidden`), freed
    /// before it returns.
    fn embedding_partials(&mut self, ids: u64, hidden: u64) {
        if ids > EMBEDDING_DIRECT_IDS {
            let buffer = self.t.act((ids + ids / 10) * hidden * 4);
            self.t.free(buffer);
        }
    }

    /// Releases the kept tensors `saved` but those of the RMSNorm among
    /// them, whose kept state is returned for its backward.
    fn release_all_but_a_norm(&mut self, saved: &[u32]) -> Option<RmsSaved> {
        let norm = saved.iter().find_map(|id| self.rmsnorms.remove(id));
        for &id in saved {
            if norm.as_ref().is_none_or(|m| !m.holds(id)) {
                self.release(id);
            }
        }
        norm
    }

    /// Dropout of an `elems`-element activation of width `bytes_per`: keeps
    /// the mask, frees the input, returns the output (or the input without
    /// dropout).
    fn hf_dropout(
        &mut self,
        lib: HfImpl,
        x: u32,
        elems: u64,
        bytes_per: u64,
        saved: &mut Vec<u32>,
    ) -> u32 {
        let out = self.hf_dropout_beside(lib, x, elems, bytes_per, saved);
        if out != x {
            self.t.free(x);
        }
        out
    }

    /// [`Self::hf_dropout`] leaving its input alone. CUDA's kernel takes the
    /// mask first, then the output; without autograd nothing keeps the mask.
    fn hf_dropout_beside(
        &mut self,
        lib: HfImpl,
        x: u32,
        elems: u64,
        bytes_per: u64,
        saved: &mut Vec<u32>,
    ) -> u32 {
        if !lib.dropout {
            return x;
        }
        let mask = self.t.act(elems);
        let out = self.t.act(elems * bytes_per);
        if self.no_grad {
            self.t.free(mask);
        } else {
            saved.push(mask);
        }
        out
    }

    /// Forward of one block; returns the tensors kept for backward (the block
    /// input last) and the output.
    fn hf_block_forward(
        &mut self,
        t: &TransformerArch,
        lib: HfImpl,
        l: u64,
        n: u64,
        x: u32,
    ) -> (Vec<u32>, u32) {
        // T5's learned relative bias is SDPA's attention mask and needs its
        // gradient: no fused kernel takes it, and SDPA runs PyTorch's math
        // path, which keeps the whole scores (on the H200, T5 under SDPA
        // predicted as fused was 22-30 % under).
        let attention = self.hf_attention(t);
        let windowed = attention != Attention::Eager && t.windowed_block(l);
        let math_bias = t.layout.rel_buckets > 0 && attention != Attention::Eager;
        let wd = self.widths();
        let (h, f, kvd) = (t.hidden, t.ffn, t.kv_dim());
        let b = self.run.micro_batch;
        let s2 = b * t.heads * t.seq_len * t.seq_len;
        let lse = b * t.heads * t.seq_len * 4;
        // an encoder-decoder's encoder keeps no cache
        let cache = lib.use_cache
            && !self.run.checkpointing
            && (t.layout.decoder_layers == 0 || t.is_cross_block(l));
        let mut saved: Vec<u32> = Vec::new();
        let mut locals_of_block: Vec<u32> = Vec::new();
        let ckpt = self.run.checkpointing;
        self.matmul_marks.remove(&l);
        if !self.fsdp() && matmuls_in_order(t) {
            let layer = Some(l as u32);
            self.pending_matmuls = (0..self.params.len())
                .filter(|&i| self.params[i].layer == layer && self.params[i].matmul_weight)
                .collect();
        }
        let out = match lib.family {
            HfFamily::Gpt2 => {
                saved.push(self.t.act(n * 8)); // LayerNorm statistics
                let ln1 = self.t.act(n * h * wd.r);
                let mut ln1_local = if wd.amp {
                    saved.push(self.t.act(n * h * wd.c));
                    Some(ln1)
                } else {
                    saved.push(ln1);
                    None
                };
                if wd.amp && t.layout.separate_qkv {
                    // OPT, ViT: each projection casts the norm's output
                    for _ in 0..2 {
                        saved.push(self.t.act(n * h * wd.c));
                    }
                }
                for _ in 0..if t.layout.separate_qkv { 3 } else { 1 } {
                    self.weight_cast();
                }
                // OPT with the cache: the queries are scaled into a tensor of
                // their own (`q_proj(x) * scaling`), the keys' and values'
                // projections die once the cache has copied them, and
                // attention reads the copies: of the three projections only
                // the scaled queries are kept (the H100's recorded runs).
                let apart = cache && t.layout.separate_qkv;
                let (qkv, projections) = if apart {
                    let q = self.t.act(n * h * wd.c);
                    let scaled = self.t.act(n * h * wd.c);
                    self.t.free(q);
                    let kv = [kvd, kvd].map(|d| self.t.act(n * d * wd.c));
                    (scaled, kv.to_vec())
                } else {
                    (self.t.act(n * (h + 2 * kvd) * wd.c), Vec::new())
                };
                if t.layout.rotary_dims > 0 {
                    // GPT-NeoX: the rotated part of the queries and keys,
                    // concatenated with the rest
                    for _ in 0..2 {
                        let part = self.t.act(n * t.heads * t.layout.rotary_dims * wd.c);
                        let r = self.hf_rope(n * t.heads * t.layout.rotary_dims, Some(part), false);
                        saved.push(self.t.act(n * h * wd.e));
                        self.t.free(r);
                    }
                }
                // GPT-NeoX with the cache: attention reads the cache's copies
                // of the rotated keys and of the values, so neither the keys
                // nor the fused output (the values' storage) is kept; the
                // output lives in its variable until the attention returns.
                // (GPT-2's queries stay a view of it.)
                // Under autocast the rotated tensors and the copies are fp32,
                // and SDPA keeps its low-precision casts of the queries and
                // both copies instead (the H200's recorded run).
                let cache_copies = cache && t.layout.rotary_dims > 0;
                let mut attention_locals = Vec::new();
                if cache {
                    let width = if cache_copies { wd.e } else { wd.c };
                    let kc = self.t.act(n * kvd * width);
                    let vc = self.t.act(n * kvd * width);
                    self.cache.extend([kc, vc]);
                    if cache_copies && let Some(keys) = saved.pop() {
                        self.t.free(keys);
                    }
                }
                for id in projections {
                    self.t.free(id);
                }
                let o = match attention {
                    Attention::Sdpa | Attention::Flash => {
                        if cache_copies {
                            attention_locals.push(qkv);
                            if wd.amp
                                && let Some(queries) = saved.pop()
                            {
                                attention_locals.push(queries);
                                for _ in 0..3 {
                                    saved.push(self.t.act(n * h * wd.c));
                                }
                            }
                        } else {
                            saved.push(qkv);
                        }
                        let out = self.t.act(n * h * wd.c);
                        saved.push(out);
                        let lse_id = self.t.act(lse);
                        saved.push(lse_id);
                        // half precision without a mask: the flash kernel,
                        // whose backward writes the three gradients apart
                        if wd.c == 2
                            && !self.no_grad
                            && !windowed
                            && !math_bias
                            && !cache_copies
                            && !t.layout.separate_qkv
                        {
                            let buffer = flash_backward_buffer(b, t.seq_len, t.heads, t.head_dim);
                            self.flash.insert(
                                lse_id,
                                FlashSaved {
                                    out,
                                    qkv,
                                    grads: [n * h * wd.c, n * kvd * wd.c, n * kvd * wd.c],
                                    buffer,
                                    amp: wd.amp,
                                },
                            );
                        }
                        false
                    }
                    Attention::Eager => {
                        if cache {
                            // the query view is copied for the batched matmul
                            saved.push(self.t.act(n * h * wd.c));
                            self.t.free(qkv);
                        } else {
                            saved.push(qkv);
                        }
                        let score = self.hf_score_extras(t, s2, &mut saved);
                        let weights = self.hf_eager_scores(
                            lib,
                            s2,
                            true,
                            t.eager_softmax_fp32(),
                            score_mask(t),
                            &mut saved,
                        );
                        locals_of_block.extend(weights);
                        locals_of_block.extend(score);
                        true
                    }
                };
                self.hf_attention_output(o, n * h, &mut saved);
                self.weight_cast();
                let proj = self.t.act(n * h * wd.c);
                self.t.free_all(&mut attention_locals);
                self.drop_unsaved(&mut saved, 0, x);
                self.drop_local(&mut ln1_local);
                let br = self.hf_dropout(lib, proj, n * h, wd.c, &mut saved);
                let x1 = self.t.act(n * h * wd.r);
                self.t.free(br);
                if let Some(l) = ln1_local {
                    self.t.free(l);
                }
                if t.layout.parallel_residual {
                    // GPT-NeoX: the feed-forward reads the block input; the
                    // attention's sum is added at the end
                    locals_of_block.push(x1);
                } else {
                    saved.push(x1);
                }
                let ffn_mark = saved.len();
                saved.push(self.t.act(n * 8));
                let ln2 = self.t.act(n * h * wd.r);
                let mut ln2_local = if wd.amp {
                    saved.push(self.t.act(n * h * wd.c));
                    Some(ln2)
                } else {
                    saved.push(ln2);
                    None
                };
                self.weight_cast();
                let fc = self.t.act(n * f * wd.c);
                // the activation's fp32 output under autocast: its name holds
                // it until c_proj (which reads its cast) returns
                let mut act_out = None;
                if lib.gelu_new {
                    let nf = n * f;
                    let y = self.hf_gelu_new(nf, fc, &mut saved);
                    if wd.amp {
                        // c_proj's cast
                        saved.push(self.t.act(nf * wd.c));
                        act_out = Some(y);
                    } else {
                        saved.push(y);
                    }
                } else if t.layout.relu {
                    // ReLU keeps its output only
                    saved.push(self.t.act(n * f * wd.c));
                    self.t.free(fc);
                } else {
                    saved.push(fc);
                    saved.push(self.t.act(n * f * wd.c));
                }
                self.weight_cast();
                let p2 = self.t.act(n * h * wd.c);
                self.drop_unsaved(&mut saved, ffn_mark, x);
                if let Some(y) = act_out {
                    self.t.free(y);
                }
                self.drop_local(&mut ln2_local);
                let br = self.hf_dropout(lib, p2, n * h, wd.c, &mut saved);
                let out = self.t.act(n * h * wd.r);
                self.t.free(br);
                if let Some(l) = ln2_local {
                    self.t.free(l);
                }
                out
            }
            HfFamily::Llama => {
                let qd = t.q_dim();
                let attn_mark = saved.len();
                // OLMo 2 norms no input: the projections read the block's
                let post_only = t.layout.post_norms_only;
                let nrm = if post_only {
                    x
                } else {
                    self.hf_input_norm(t, n, h, &mut saved)
                };
                // Phi-3's `qkv_proj` makes one tensor; its queries, keys and
                // values are views that keep it alive.
                let fused = t.layout.fused_qkv;
                // Under autocast each projection casts the norm's output;
                // autograd keeps the casts, without it each dies after its
                // matmul.
                let transient_casts = wd.amp && self.no_grad;
                let mut nrm_local = if wd.amp {
                    if !transient_casts {
                        for _ in 0..if fused { 1 } else { 3 } {
                            saved.push(self.t.act(n * h * wd.c));
                        }
                    }
                    (!post_only).then_some(nrm)
                } else {
                    if !post_only {
                        saved.push(nrm);
                    }
                    None
                };
                let (mut q, mut k, v) = if fused {
                    let qkv = self.hf_projection(n * (qd + 2 * kvd), n * h, transient_casts);
                    (qkv, qkv, qkv)
                } else {
                    let q = self.hf_projection(n * qd, n * h, transient_casts);
                    let k = self.hf_projection(n * kvd, n * h, transient_casts);
                    (q, k, self.hf_projection(n * kvd, n * h, transient_casts))
                };
                if lib.qk_norm && t.layout.whole_qk_norms {
                    q = self.hf_head_rmsnorm(n, qd, q, &mut saved);
                    k = self.hf_head_rmsnorm(n, kvd, k, &mut saved);
                } else if lib.qk_norm {
                    q = self.hf_head_rmsnorm(n * t.heads, t.head_dim, q, &mut saved);
                    k = self.hf_head_rmsnorm(n * t.kv_heads, t.head_dim, k, &mut saved);
                }
                let (qe, ke) = if t.positional == PositionalKind::Rotary {
                    let cat = t.layout.rotary_cat;
                    let view = |id: u32| (!fused).then_some(id);
                    let qe = self.hf_rope(n * qd, view(q), cat);
                    let ke = self.hf_rope(n * kvd, view(k), cat);
                    if t.layout.rope_cast_back && wd.e > wd.c {
                        // OLMo 2: `q_embed.to(q_type)`, the projections' dtype
                        let qc = self.t.act(n * qd * wd.c);
                        self.t.free(qe);
                        let kc = self.t.act(n * kvd * wd.c);
                        self.t.free(ke);
                        (qc, kc)
                    } else {
                        (qe, ke)
                    }
                } else {
                    (q, k)
                };
                let (keys, values, owned) = if cache {
                    // the cache's copies, as wide as the rotated keys
                    let rotated =
                        t.positional == PositionalKind::Rotary && !t.layout.rope_cast_back;
                    let width = if rotated { wd.e } else { wd.c };
                    let kc = self.t.act(n * kvd * width);
                    self.t.free(ke);
                    let vc = self.t.act(n * kvd * width);
                    self.t.free(v);
                    self.cache.extend([kc, vc]);
                    (kc, vc, false)
                } else {
                    (ke, v, true)
                };
                let gqa = t.kv_heads < t.heads;
                let o = match attention {
                    Attention::Sdpa | Attention::Flash if windowed => {
                        self.hf_windowed_sdpa(t, n, [qe, keys, values], owned, &mut saved);
                        false
                    }
                    Attention::Sdpa | Attention::Flash if math_bias => {
                        let (kept, output) = self.hf_math_attention(
                            lib,
                            [n, qd, kvd, s2],
                            [qe, keys, values],
                            owned,
                        );
                        saved.extend(kept);
                        saved.push(output);
                        false
                    }
                    Attention::Sdpa | Attention::Flash if !(wd.c == 4 && gqa) => {
                        self.autocast_input(qe, n * qd, true, &mut saved);
                        self.autocast_input(keys, n * kvd, owned, &mut saved);
                        self.autocast_input(values, n * kvd, owned, &mut saved);
                        saved.push(self.t.act(n * qd * wd.c));
                        self.free_kernel_casts();
                        saved.push(self.t.act(lse));
                        false
                    }
                    Attention::Sdpa | Attention::Flash => {
                        // fp32 with grouped-query heads: the math path
                        saved.push(qe);
                        saved.push(self.t.act(n * qd * 4));
                        saved.push(self.t.act(n * qd * 4));
                        if owned {
                            self.t.free(keys);
                            self.t.free(values);
                        }
                        let sc = self.t.act(s2 * 4);
                        let p = self.t.act(s2 * 4);
                        self.softmax.insert(p, (s2, 4, false));
                        saved.push(p);
                        self.t.free(sc);
                        true
                    }
                    Attention::Eager => {
                        self.autocast_input(qe, n * qd, true, &mut saved);
                        self.hf_repeat_kv(gqa, keys, n * kvd, n * qd, owned, &mut saved);
                        let score = self.hf_score_extras(t, s2, &mut saved);
                        let weights = self.hf_eager_scores(
                            lib,
                            s2,
                            false,
                            t.eager_softmax_fp32(),
                            score_mask(t),
                            &mut saved,
                        );
                        locals_of_block.extend(weights);
                        locals_of_block.extend(score);
                        self.hf_repeat_kv(gqa, values, n * kvd, n * qd, owned, &mut saved);
                        true
                    }
                };
                self.hf_attention_output(o, n * qd, &mut saved);
                self.weight_cast();
                let mut proj = self.t.act(n * h * wd.c);
                // the attention returns: its locals and the norm's output die
                self.drop_unsaved(&mut saved, attn_mark, x);
                self.drop_local(&mut nrm_local);
                if t.layout.sandwich_norms || post_only {
                    // Gemma 2/3, OLMo 2: post_attention_layernorm of the output
                    let normed = self.hf_rmsnorm_of(n, h, wd.c, &mut saved);
                    self.t.free(proj);
                    proj = normed;
                }
                if t.layout.residual_scale {
                    proj = self.hf_scaled(proj);
                }
                if t.layout.rel_buckets > 0 {
                    // T5's dropout of the residual branch
                    proj = self.hf_dropout(lib, proj, n * h, wd.c, &mut saved);
                }
                let x1 = self.t.act(n * h * wd.r);
                self.t.free(proj);
                if let Some(l) = nrm_local {
                    self.t.free(l);
                }
                // Whether what reads the residual stream keeps it: an fp32
                // RMSNorm or a LayerNorm does, and so does T5's norm in any
                // width (it multiplies its input itself by the inverse RMS);
                // LLaMA's low-precision RMSNorm keeps an fp32 copy instead;
                // OLMo 2's matmuls keep it without autocast and their casts
                // under it. Otherwise the block input dies at the residual
                // add and the sum is not kept.
                let x1_kept = if post_only {
                    !wd.amp
                } else {
                    wd.r == 4 || t.norm == NormKind::Layernorm || t.layout.rel_buckets > 0
                };
                if !x1_kept && !ckpt {
                    self.release(x);
                }
                if x1_kept {
                    saved.push(x1);
                }
                let x1 = if t.is_cross_block(l) {
                    // Its bias is zeros, which need no gradient unless a
                    // checkpoint asks for one: SDPA then runs fused as
                    // requested (the H200's recorded runs, fp32 and under
                    // autocast).
                    let cross = if self.run.checkpointing {
                        Attention::Eager
                    } else {
                        attention
                    };
                    self.hf_cross_attention(t, lib, cross, cache, n, &mut saved)
                } else {
                    x1
                };
                let ffn_mark = saved.len();
                let nrm2 = if post_only {
                    x1
                } else {
                    self.hf_input_norm(t, n, h, &mut saved)
                };
                let chain = self.no_grad
                    && t.mlp == MlpKind::Swiglu
                    && !t.is_moe_block(l)
                    && !t.layout.gate_gelu_new;
                // Routed experts without a shared one (Mixtral): only the
                // router casts the norm's output (the experts read fp32
                // tokens), and their sum in token order is the block's
                // feed-forward output, with no projection after it (the
                // H200's recorded Mixtral autocast runs).
                let routed_only =
                    t.is_moe_block(l) && t.layout.moe.as_ref().is_some_and(|m| m.shared_ffn == 0);
                let mut nrm2_local = if wd.amp {
                    if !chain {
                        saved.push(self.t.act(n * h * wd.c));
                        // a gated feed-forward's gate and up projections
                        // each cast it; T5's ReLU one has a single input
                        // projection (its recorded autocast runs keep one
                        // cast per block). Phi-3's fused gate_up keeps two.
                        let one_input = !t.is_moe_block(l) && t.mlp != MlpKind::Swiglu;
                        if !routed_only && !one_input {
                            saved.push(self.t.act(n * h * wd.c));
                        }
                    }
                    (!post_only).then_some(nrm2)
                } else {
                    if !post_only {
                        saved.push(nrm2);
                    }
                    None
                };
                let routed = if chain {
                    self.hf_gated_chain(t, n, &mut saved);
                    None
                } else {
                    self.hf_ffn(t, lib, l, n, &mut saved)
                };
                let mut down = match routed {
                    Some(id) => id,
                    None => {
                        self.weight_cast();
                        self.t.act(n * h * wd.c)
                    }
                };
                // the feed-forward returns
                self.drop_unsaved(&mut saved, ffn_mark, x);
                self.drop_local(&mut nrm2_local);
                if t.layout.sandwich_norms || post_only {
                    // post_feedforward_layernorm
                    let normed = self.hf_rmsnorm_of(n, h, wd.c, &mut saved);
                    self.t.free(down);
                    down = normed;
                }
                if t.layout.residual_scale {
                    down = self.hf_scaled(down);
                }
                if t.layout.rel_buckets > 0 {
                    // T5LayerFF's dropout of the residual branch
                    down = self.hf_dropout(lib, down, n * h, wd.c, &mut saved);
                }
                let out = self.t.act(n * h * wd.r);
                self.t.free(down);
                if let Some(l) = nrm2_local {
                    self.t.free(l);
                }
                if !x1_kept {
                    self.t.free(x1);
                }
                out
            }
            HfFamily::Bert => {
                let own = t.layout.own_attention;
                if wd.amp && !own {
                    for _ in 0..3 {
                        saved.push(self.t.act(n * h * wd.c));
                    }
                }
                let mut qkv = [0; 3];
                for p in &mut qkv {
                    self.weight_cast();
                    if wd.amp && own {
                        saved.push(self.t.act(n * h * wd.c));
                    }
                    *p = self.t.act(n * h * wd.c);
                    if own {
                        // `transpose_for_scores`: a heads-first copy
                        let copy = self.t.act(n * h * wd.c);
                        self.t.free(*p);
                        *p = copy;
                    }
                }
                let [q, mut k, v] = qkv;
                let mut attention_locals = Vec::new();
                if own {
                    // the keys are scaled before the product, which keeps the
                    // scaled copy; the copy itself lives on in its variable
                    attention_locals.push(k);
                    k = self.t.act(n * h * wd.c);
                }
                let mut rel_score = None;
                let o = match attention {
                    Attention::Sdpa | Attention::Flash => {
                        saved.extend([q, k, v]);
                        saved.push(self.t.act(n * h * wd.c));
                        saved.push(self.t.act(lse));
                        false
                    }
                    Attention::Eager => {
                        saved.extend([q, k]);
                        rel_score = self.hf_score_extras(t, s2, &mut saved);
                        let weights = self.hf_eager_scores(
                            lib,
                            s2,
                            false,
                            t.eager_softmax_fp32(),
                            score_mask(t),
                            &mut saved,
                        );
                        if own {
                            attention_locals.extend(weights);
                        } else {
                            locals_of_block.extend(weights);
                        }
                        saved.push(v);
                        true
                    }
                };
                self.hf_attention_output(o, n * h, &mut saved);
                self.t.free_all(&mut attention_locals);
                if own && let Some(score) = rel_score.take() {
                    self.t.free(score);
                }
                self.weight_cast();
                let dense = self.t.act(n * h * wd.c);
                if let Some(score) = rel_score {
                    self.t.free(score);
                }
                self.drop_unsaved(&mut saved, 0, x);
                let br = self.hf_dropout(lib, dense, n * h, wd.c, &mut saved);
                let sum = self.t.act(n * h * wd.r);
                self.t.free(br);
                saved.push(sum);
                if wd.amp && !ckpt {
                    // only the casts of the input were kept: it dies at the
                    // add, or with the encoder's list of hidden states
                    if t.layout.keeps_hidden_states {
                        self.encoder_locals.push(x);
                    } else {
                        self.release(x);
                    }
                }
                saved.push(self.t.act(n * 8));
                let ln1 = self.t.act(n * h * wd.r);
                let ln1_local = if wd.amp {
                    saved.push(self.t.act(n * h * wd.c));
                    Some(ln1)
                } else {
                    saved.push(ln1);
                    None
                };
                // the feed-forward's input is also its residual: it outlives the mark
                let ffn_mark = saved.len();
                self.weight_cast();
                saved.push(self.t.act(n * f * wd.c));
                saved.push(self.t.act(n * f * wd.c));
                self.weight_cast();
                let d2 = self.t.act(n * h * wd.c);
                self.drop_unsaved(&mut saved, ffn_mark, x);
                let br = self.hf_dropout(lib, d2, n * h, wd.c, &mut saved);
                let sum2 = self.t.act(n * h * wd.r);
                self.t.free(br);
                if let Some(l) = ln1_local {
                    self.t.free(l);
                }
                saved.push(sum2);
                saved.push(self.t.act(n * 8));
                self.t.act(n * h * wd.r)
            }
        };
        self.drop_unsaved(&mut saved, 0, x);
        self.t.free_all(&mut locals_of_block);
        self.matmuls_left.extend(self.pending_matmuls.drain(..));
        // the block input goes last so that the caller pops it after backward
        saved.retain(|&id| id != x);
        saved.push(x);
        (saved, out)
    }

    /// The attention the blocks run: softcapped and disentangled scores
    /// exist only in eager attention (transformers refuses SDPA for
    /// Gemma 2; DeBERTa has no other).
    fn hf_attention(&self, t: &TransformerArch) -> Attention {
        if t.layout.attn_softcap || t.layout.own_attention {
            Attention::Eager
        } else {
            self.run.attention
        }
    }

    /// The boolean sliding-window mask the model builds once per forward
    /// (`seq x seq`, shared by the batch and the blocks): the causal and
    /// the window comparisons, their conjunction. Returns the mask.
    fn hf_window_mask(&mut self, s: u64) -> u32 {
        let causal = self.t.act(s * s);
        let window = self.t.act(s * s);
        self.t.free(causal);
        let both = self.t.act(s * s);
        self.t.free(window);
        let mask = self.t.act(s * s);
        self.t.free(both);
        mask
    }

    /// SDPA with the window's mask (`qkv`: the rotated queries and the keys
    /// and values it reads; `owned`: the keys and values are the block's,
    /// not the cache's). With a mask transformers asks for no grouped-query
    /// kernel, so `repeat_kv` copies the keys and values to every head (a
    /// view when one key/value head serves them all; autocast's cast of
    /// that view is full-size); SDPA turns the mask into an additive one
    /// of the batch's size in the query's dtype, and the memory-efficient
    /// kernel keeps it for backward with its inputs, output and
    /// log-sum-exp. The copies and the block's own keys and values die
    /// when the attention returns (the recorded Mistral and Gemma 3 runs
    /// with windows shorter than the sequence). Its backward is
    /// [`Self::hf_block_backward`]'s, from the log-sum-exp.
    fn hf_windowed_sdpa(
        &mut self,
        t: &TransformerArch,
        n: u64,
        qkv: [u32; 3],
        owned: bool,
        saved: &mut Vec<u32>,
    ) {
        let wd = self.widths();
        let (qd, kvd) = (t.q_dim(), t.kv_dim());
        let [q, keys, values] = qkv;
        let b = self.run.micro_batch;
        self.autocast_input(q, n * qd, true, saved);
        let copies = t.kv_heads > 1 && t.kv_heads < t.heads;
        let elems = if t.kv_heads < t.heads {
            n * qd
        } else {
            n * kvd
        };
        let mut locals = Vec::new();
        for src in [keys, values] {
            let width = self.t.bytes(src) / (n * kvd).max(1);
            let full = if copies {
                let c = self.t.act(n * qd * width);
                if owned {
                    locals.push(src);
                }
                c
            } else {
                src
            };
            if wd.amp && width > wd.c {
                saved.push(self.t.act(elems * wd.c));
                if copies || owned {
                    locals.push(full);
                }
            } else if copies || owned {
                saved.push(full);
            }
        }
        let mask = self.t.act(b * t.seq_len * t.seq_len * wd.c);
        saved.push(mask);
        let out = self.t.act(n * qd * wd.c);
        saved.push(out);
        self.free_kernel_casts();
        let lse_bytes = b * t.heads * t.seq_len * 4;
        let lse = self.t.act(lse_bytes);
        saved.push(lse);
        if !self.no_grad {
            self.windowed
                .insert(lse, (mask, out, n * qd * 4 + lse_bytes));
        }
        self.t.free_all(&mut locals);
    }

    /// `x` times a constant (Gemma's embedding normalizer, Granite's
    /// multipliers): a new tensor of its size; autograd keeps nothing and
    /// `x` dies.
    fn hf_scaled(&mut self, x: u32) -> u32 {
        let scaled = self.t.act(self.t.bytes(x));
        self.t.free(x);
        scaled
    }

    /// `gelu_new` (GPT-2's activation, T5's `gated-gelu`) of `x` (`nf`
    /// elements, the projection's output), composed of elementwise ops:
    /// autograd keeps `0.5 * x`, `pow`'s input (an fp32 copy under autocast,
    /// where `pow` runs in fp32 and the rest of the chain follows it), `tanh`
    /// and `1 + tanh`. Returns the output (fp32 under autocast), for the
    /// caller to keep or cast; under autocast `x` dies with it. Without
    /// autograd (a checkpointed first forward) each temporary dies once the
    /// next op has read it, `0.5 * x` (Python evaluates it first) at the
    /// last product, and `x` when the activation returns (the module rebinds
    /// its name), as the recorded runs show.
    fn hf_gelu_new(&mut self, nf: u64, x: u32, saved: &mut Vec<u32>) -> u32 {
        let wd = self.widths();
        if self.no_grad {
            let half = self.t.act(nf * wd.c);
            let upcast = wd.amp.then(|| self.t.act(nf * 4));
            let mut prev = self.t.act(nf * wd.e); // pow
            if let Some(upcast) = upcast {
                self.t.free(upcast);
            }
            // 0.044715 * cube, x + that, sqrt(2 / pi) * that, tanh, 1 + tanh
            for _ in 0..5 {
                let next = self.t.act(nf * wd.e);
                self.t.free(prev);
                prev = next;
            }
            let y = self.t.act(nf * wd.e);
            self.t.free(half);
            self.t.free(prev);
            self.t.free(x);
            return y;
        }
        if wd.amp {
            saved.push(self.t.act(nf * wd.c)); // 0.5 * x
            saved.push(self.t.act(nf * 4)); // x.float() for pow
        } else {
            saved.push(x);
            saved.push(self.t.act(nf * wd.c));
        }
        let cube = self.t.act(nf * wd.e);
        let t1 = self.t.act(nf * wd.e);
        self.t.free(cube);
        let t2 = self.t.act(nf * wd.e);
        self.t.free(t1);
        let t3 = self.t.act(nf * wd.e);
        self.t.free(t2);
        saved.push(self.t.act(nf * wd.e)); // tanh
        self.t.free(t3);
        saved.push(self.t.act(nf * wd.e)); // 1 + tanh
        let y = self.t.act(nf * wd.e);
        if wd.amp {
            self.t.free(x);
        }
        y
    }

    /// A projection's output of `elems` elements from an input of
    /// `in_elems`; with `cast`, autocast's low-precision copy of the input is
    /// made first and dies after the matmul (nothing keeps it).
    fn hf_projection(&mut self, elems: u64, in_elems: u64, cast: bool) -> u32 {
        let c = self.widths().c;
        self.weight_cast();
        let copy = cast.then(|| self.t.act(in_elems * c));
        let out = self.t.act(elems * c);
        if let Some(copy) = copy {
            self.t.free(copy);
        }
        out
    }

    /// A gated feed-forward without autograd, `down(act(gate(x)) * up(x))`:
    /// each temporary dies once the next one exists; the product (and
    /// Phi-3's fused `gate_up` output, whose chunks are views) goes into
    /// `saved` for the caller to drop after the down projection.
    fn hf_gated_chain(&mut self, t: &TransformerArch, n: u64, saved: &mut Vec<u32>) {
        let wd = self.widths();
        let (h, f) = (t.hidden, t.ffn);
        if t.layout.fused_gate_up {
            let both = self.hf_projection(n * 2 * f, n * h, wd.amp);
            let act = self.t.act(n * f * wd.c);
            let prod = self.t.act(n * f * wd.c);
            self.t.free(act);
            saved.extend([prod, both]);
        } else {
            let gate = self.hf_projection(n * f, n * h, wd.amp);
            let act = self.t.act(n * f * wd.c);
            self.t.free(gate);
            let up = self.hf_projection(n * f, n * h, wd.amp);
            let prod = self.t.act(n * f * wd.c);
            self.t.free(act);
            self.t.free(up);
            saved.push(prod);
        }
    }

    /// What eager scores keep besides the product, the scaling and the
    /// softmax: Gemma 2's softcapping (`/ cap`, `tanh` kept, `* cap`) and
    /// DeBERTa's content-to-position and position-to-content terms (the
    /// relative table projected per block and kept by its product, the
    /// `batch x heads x seq x rows` scores, kept by their `torch.gather`
    /// into the scores' shape, each gather divided by the scale and summed
    /// into `score`, in place after the first; the gathers die when the
    /// function returns). Returns DeBERTa's `score`, which lives until the
    /// attention returns.
    fn hf_score_extras(
        &mut self,
        t: &TransformerArch,
        s2: u64,
        saved: &mut Vec<u32>,
    ) -> Option<u32> {
        let wd = self.widths();
        if t.layout.attn_softcap {
            let div = self.t.act(s2 * wd.c);
            saved.push(self.t.act(s2 * wd.c));
            self.t.free(div);
        }
        let d = t.layout.disentangled?;
        let rows = d.rel_rows;
        let per_row = s2 / t.seq_len.max(1);
        let mut gathered = Vec::new();
        let mut score = None;
        for on in [d.c2p, d.p2c] {
            if on {
                saved.push(self.t.act(rows * t.q_dim() * wd.c));
                saved.push(self.t.act(per_row * rows * wd.c));
                gathered.push(self.t.act(s2 * wd.c));
                let div = self.t.act(s2 * wd.c);
                if score.is_none() {
                    score = Some(self.t.act(s2 * wd.c));
                }
                self.t.free(div);
            }
        }
        self.t.free_all(&mut gathered);
        score
    }

    /// The feed-forward of block `l` between its input's norm and its
    /// output projection: what autograd keeps.
    ///
    /// - gated (SwiGLU, GeGLU): gate, act(gate), up, act(gate) * up;
    /// - not gated: the first projection and its activation (ReLU: its
    ///   output only), then T5's dropout;
    /// - a mixture of experts: Qwen2-MoE's shared expert (every token, with
    ///   its sigmoid gate), the router's logits (`tokens x experts`), their
    ///   fp32 softmax and the top-k weights and indices, then the experts
    ///   grouped as transformers runs them on CUDA (below): `tokens x top_k`
    ///   routed tokens whatever the router's balance.
    ///
    /// Returns the routed experts' sum where it is the feed-forward's output
    /// (experts without a shared one).
    fn hf_ffn(
        &mut self,
        t: &TransformerArch,
        lib: HfImpl,
        l: u64,
        n: u64,
        saved: &mut Vec<u32>,
    ) -> Option<u32> {
        let wd = self.widths();
        let h = t.hidden;
        let gated = |g: &mut Self, rows: u64, f: u64, saved: &mut Vec<u32>| {
            // gate, act(gate), up, act(gate) * up
            for i in 0..4 {
                if i % 2 == 0 {
                    g.weight_cast();
                }
                saved.push(g.t.act(rows * f * wd.c));
            }
        };
        match &t.layout.moe {
            Some(m) if t.is_moe_block(l) => {
                // transformers 5 on CUDA: `grouped_mm_experts_forward`, every
                // routed token in one tensor sorted by expert and grouped
                // matrix products (fp32 under autocast: the tokens and the
                // stacked weights are); the shared expert runs first
                let ew = if wd.amp { 4 } else { wd.c };
                if m.shared_ffn > 0 {
                    gated(self, n, m.shared_ffn, saved);
                    saved.push(self.t.act(n * h * wd.c));
                }
                let logits = self.t.act(n * m.experts * wd.c);
                saved.push(self.t.act(n * m.experts * 4));
                self.t.free(logits);
                saved.push(self.t.act(n * m.top_k * 4));
                saved.push(self.t.act(n * m.top_k * 8));
                let s = n * m.top_k;
                let f = m.expert_ffn;
                saved.push(self.t.act(s * h * ew));
                // a grouped product's output, and the copy of it kept
                let grouped = |g: &mut Self, width: u64| {
                    let raw = g.t.act(s * width * ew);
                    let kept = g.t.act(s * width * ew);
                    g.t.free(raw);
                    kept
                };
                saved.push(grouped(self, 2 * f)); // gate_up
                // act(gate), act(gate) * up
                saved.push(self.t.act(s * f * ew));
                saved.push(self.t.act(s * f * ew));
                saved.push(grouped(self, h)); // down
                // weighted by the router, back in token order, summed over
                // the top-k
                let weighted = self.t.act(s * h * ew);
                let tokens = self.t.act(s * h * ew);
                self.t.free(weighted);
                let routed = self.t.act(n * h * ew);
                self.t.free(tokens);
                if m.shared_ffn == 0 {
                    return Some(routed);
                }
                // the shared expert's sigmoid gate and its product
                saved.push(self.t.act(n * wd.c));
                let product = self.t.act(n * h * wd.c);
                self.t.free(product);
                self.t.free(routed);
            }
            _ if t.mlp == MlpKind::Swiglu && t.layout.fused_gate_up => {
                // gate_up's output (its two chunks are views), act(gate), act(gate) * up
                self.weight_cast();
                saved.push(self.t.act(n * 2 * t.ffn * wd.c));
                saved.push(self.t.act(n * t.ffn * wd.c));
                saved.push(self.t.act(n * t.ffn * wd.c));
            }
            _ if t.mlp == MlpKind::Swiglu && t.layout.gate_gelu_new => {
                // T5's gated-gelu: gelu_new(wi_0(x)) * wi_1(x), dropout, and
                // wo's cast of it under autocast (the chain is fp32 there)
                let nf = n * t.ffn;
                self.weight_cast();
                let gate = self.t.act(nf * wd.c);
                let y = self.hf_gelu_new(nf, gate, saved);
                saved.push(y);
                self.weight_cast();
                saved.push(self.t.act(nf * wd.c)); // wi_1(x)
                let prod = self.t.act(nf * wd.e);
                let prod = self.hf_dropout(lib, prod, nf, wd.e, saved);
                if wd.amp {
                    saved.push(self.t.act(nf * wd.c));
                    self.t.free(prod);
                } else {
                    saved.push(prod);
                }
            }
            _ if t.mlp == MlpKind::Swiglu => gated(self, n, t.ffn, saved),
            _ => {
                let f = t.ffn;
                self.weight_cast();
                let first = self.t.act(n * f * wd.c);
                if t.layout.relu {
                    saved.push(self.t.act(n * f * wd.c));
                    self.t.free(first);
                } else {
                    saved.push(first);
                    saved.push(self.t.act(n * f * wd.c));
                }
                if t.layout.rel_buckets > 0 && lib.dropout {
                    saved.push(self.t.act(n * f));
                    saved.push(self.t.act(n * f * wd.c));
                }
            }
        }
        None
    }

    /// PyTorch's math path of SDPA with a mask that needs its gradient
    /// (T5's position bias) on `[queries, keys, values]`: half-precision
    /// inputs are copied to fp32 first, the queries and the transposed keys
    /// are each scaled by the root of the scale (both kept for the product),
    /// the mask is added in place, `_safe_softmax` keeps its fp32 output
    /// (with a one-byte temporary per score), dropout keeps its mask and
    /// output, which the value product keeps with the fp32 values; the
    /// probabilities' cast to the inputs' dtype is returned and dropped, and
    /// the fp32 output is cast back. Returns what is kept and the output;
    /// the fp32 copies and the inputs' variables die when it returns.
    fn hf_math_attention(
        &mut self,
        lib: HfImpl,
        [n, qd, kvd, s2]: [u64; 4],
        [q, k, v]: [u32; 3],
        owned: bool,
    ) -> (Vec<u32>, u32) {
        let wd = self.widths();
        let half = wd.c != 4;
        let mut saved = Vec::new();
        let mut locals = Vec::new();
        let (qa, ka, va) = if half {
            let copies = [n * qd, n * kvd, n * kvd].map(|e| self.t.act(e * 4));
            (Some(copies[0]), Some(copies[1]), copies[2])
        } else {
            (None, None, v)
        };
        // the scaled queries and transposed keys
        saved.push(self.t.act(n * qd * 4));
        saved.push(self.t.act(n * kvd * 4));
        locals.extend(qa);
        locals.extend(ka);
        let scores = self.t.act(s2 * 4);
        let p = self.t.act(s2 * 4);
        self.softmax.insert(p, (s2, 4, false));
        saved.push(p);
        let rows_done = self.t.act(s2);
        self.t.free(rows_done);
        self.t.free(scores);
        if lib.attn_dropout {
            saved.push(self.t.act(s2));
            saved.push(self.t.act(s2 * 4));
        }
        if half {
            // the probabilities cast to the inputs' dtype: returned, dropped
            locals.push(self.t.act(s2 * wd.c));
        }
        // the value product keeps its fp32 values (a cache entry stays
        // alive anyway)
        if half || owned {
            saved.push(va);
        }
        let mut output = self.t.act(n * qd * 4);
        if half {
            let cast = self.t.act(n * qd * wd.c);
            self.t.free(output);
            output = cast;
        }
        // the attention returns: its fp32 copies and its inputs' variables go
        self.t.free_all(&mut locals);
        if owned {
            self.t.free(k);
            if half {
                self.t.free(v);
            }
        }
        self.t.free(q);
        (saved, output)
    }

    /// A T5 decoder block's cross-attention over the encoder's output (of
    /// the same length as the decoder's, `seqLen`): its norm, the queries
    /// from the decoder and the keys and values projected from the encoder
    /// output (each projection keeping its own low-precision copy under
    /// autocast), the attention, the output projection and the residual
    /// sum, returned and kept (the next norm multiplies it itself; the
    /// sum's input is the caller's). With the `cache`, the keys and values
    /// are copied into the cross-attention cache (`EncoderDecoderCache`,
    /// `torch.cat` onto an empty tensor) that `outputs` keeps, their
    /// projections die and attention reads the copies.
    fn hf_cross_attention(
        &mut self,
        t: &TransformerArch,
        lib: HfImpl,
        attention: Attention,
        cache: bool,
        n: u64,
        saved: &mut Vec<u32>,
    ) -> u32 {
        let wd = self.widths();
        let (h, qd, kvd) = (t.hidden, t.q_dim(), t.kv_dim());
        let s2 = self.run.micro_batch * t.heads * t.seq_len * t.seq_len;
        let nrm = self.hf_rmsnorm(n, h, saved);
        self.autocast_input(nrm, n * h, true, saved);
        for _ in 0..2 {
            if wd.amp {
                saved.push(self.t.act(n * h * wd.c));
            }
        }
        let [q, mut k, mut v] = [qd, kvd, kvd].map(|d| {
            self.weight_cast();
            self.t.act(n * d * wd.c)
        });
        if cache {
            for kv in [&mut k, &mut v] {
                let copy = self.t.act(n * kvd * wd.c);
                self.t.free(*kv);
                self.cache.push(copy);
                *kv = copy;
            }
        }
        // what attention keeps of the keys and values: the cache's
        // entries live on anyway
        let kept = |ids: &[u32]| if cache { Vec::new() } else { ids.to_vec() };
        let o = match attention {
            Attention::Sdpa | Attention::Flash => {
                saved.push(q);
                saved.extend(kept(&[k, v]));
                saved.push(self.t.act(n * qd * wd.c));
                saved.push(self.t.act(self.run.micro_batch * t.heads * t.seq_len * 4));
                false
            }
            Attention::Eager => {
                saved.push(q);
                saved.extend(kept(&[k]));
                let mut weights =
                    self.hf_eager_scores(lib, s2, false, false, ScoreMask::Same, saved);
                self.t.free_all(&mut weights);
                saved.extend(kept(&[v]));
                true
            }
        };
        self.hf_attention_output(o, n * qd, saved);
        self.weight_cast();
        let proj = self.t.act(n * h * wd.c);
        let proj = self.hf_dropout(lib, proj, n * h, wd.c, saved);
        let sum = self.t.act(n * h * wd.r);
        self.t.free(proj);
        saved.push(sum);
        sum
    }

    /// The attention output as the output projection reads it,
    /// `attn_output.transpose(1, 2).contiguous()`. The fused SDPA kernels
    /// (flash, memory-efficient) write their output as (batch, seq, heads,
    /// head_dim) and return it transposed, so the transpose back is already
    /// contiguous and no copy is made (`matmul` = false); the product of eager
    /// attention and of the math path is (batch, heads, seq, head_dim) and is
    /// copied, the copy kept by the projection.
    fn hf_attention_output(&mut self, matmul: bool, elems: u64, saved: &mut Vec<u32>) {
        if matmul {
            let c = self.widths().c;
            let o = self.t.act(elems * c);
            saved.push(self.t.act(elems * c));
            self.t.free(o);
        }
    }

    /// `repeat_kv` for eager attention: grouped-query keys or values
    /// (`src`, `src_elems` elements) become a full-width copy (`full`
    /// elements, same dtype); then autocast's cast for the matmul.
    #[allow(clippy::too_many_arguments)]
    fn hf_repeat_kv(
        &mut self,
        gqa: bool,
        src: u32,
        src_elems: u64,
        full: u64,
        owned: bool,
        saved: &mut Vec<u32>,
    ) {
        if gqa {
            let per = self.t.bytes(src) / src_elems.max(1);
            let wide = self.t.act(full * per);
            if owned {
                self.t.free(src);
            }
            self.autocast_input(wide, full, true, saved);
        } else {
            self.autocast_input(src, full, owned, saved);
        }
    }

    /// Eager attention's scores (`s2` elements): the matmul, the scaling, the
    /// mask, softmax (kept: in fp32 under autocast, and always when
    /// `softmax_fp32`, as LLaMA asks for), its low-precision copy and dropout.
    /// `cast_first`: the probabilities are cast before dropout (GPT-2) rather
    /// than after (BERT). Returns the dropout's output when only its cast
    /// is kept: the attention returns it as its weights, and the layer holds
    /// them until it returns (the H200's recorded BERT runs).
    fn hf_eager_scores(
        &mut self,
        lib: HfImpl,
        s2: u64,
        cast_first: bool,
        softmax_fp32: bool,
        mask: ScoreMask,
        saved: &mut Vec<u32>,
    ) -> Vec<u32> {
        let wd = self.widths();
        let mut locals = Vec::new();
        let s1 = self.t.act(s2 * wd.c);
        let sc = match mask {
            // DeBERTa: the keys came scaled; a relative term is added
            ScoreMask::Filled { summed: false, .. } => s1,
            _ => {
                let sc = self.t.act(s2 * wd.c);
                self.t.free(s1);
                sc
            }
        };
        // The additive mask has the embeddings' dtype: under autocast the
        // fp32 weights' width, and the sum is promoted to it.
        let mw = if mask == ScoreMask::Float {
            wd.c.max(wd.w)
        } else {
            wd.c
        };
        let masked = match mask {
            ScoreMask::None => sc,
            ScoreMask::Filled { heads, .. } => {
                // `attention_mask.bool()` (a local) and its negation (what
                // `masked_fill` keeps); the filled scores live on in their
                // variable until the attention returns
                locals.push(self.t.act(s2 / heads.max(1)));
                saved.push(self.t.act(s2 / heads.max(1)));
                let m = self.t.act(s2 * mw);
                self.t.free(sc);
                locals.push(m);
                m
            }
            _ => {
                let m = self.t.act(s2 * mw);
                self.t.free(sc);
                m
            }
        };
        let filled = matches!(mask, ScoreMask::Filled { .. });
        let pw = if softmax_fp32 { 4 } else { wd.e };
        // A softmax wider than its input converts the input first (the
        // copy dies with the call) and its gradient is cast back; the sum
        // itself is rebound only after the probabilities' cast. ATen's
        // fused `half_to_float` kernel spares fp16 both (Half only: bf16 is
        // converted).
        let half = matches!(self.run.precision, Precision::Fp16 | Precision::AmpFp16);
        let widened = pw > mw && !half;
        let converted = widened.then(|| self.t.act(s2 * pw));
        let p = self.t.act(s2 * pw);
        self.softmax
            .insert(p, (s2, if pw > mw && half { mw } else { pw }, !filled));
        saved.push(p);
        if let Some(c) = converted {
            self.t.free(c);
        } else if !filled {
            self.t.free(masked);
        }
        let cast = (pw != wd.c && (cast_first || !lib.attn_dropout)).then(|| self.t.act(s2 * wd.c));
        if converted.is_some() && !filled {
            self.t.free(masked);
        }
        if lib.attn_dropout {
            // native_dropout makes its mask, then its output
            let width = if cast.is_some() { wd.c } else { pw };
            saved.push(self.t.act(s2));
            let d = self.t.act(s2 * width);
            if let Some(pc) = cast {
                self.t.free(pc);
            }
            if width != wd.c {
                saved.push(self.t.act(s2 * wd.c));
                locals.push(d);
                return locals;
            }
            saved.push(d);
        } else if let Some(pc) = cast {
            saved.push(pc);
        }
        locals
    }

    /// The flash kernel's backward (the recorded GPT-2 runs): the queries',
    /// keys' and values' gradients, its fp32 buffer (freed inside it), then
    /// its inputs go (in bf16 the output, the log-sum-exp, the fused
    /// projection and the output's gradient `g_out`; under autocast in the
    /// reverse order, and the values' and keys' gradients are copied before
    /// the concatenation) and the split's backward concatenates the three
    /// into the projection's gradient, returned.
    fn hf_flash_backward(
        &mut self,
        f: FlashSaved,
        lse: u32,
        g_out: Option<u32>,
        saved: &mut Vec<u32>,
    ) -> u32 {
        let mut grads: Vec<u32> = f.grads.iter().map(|&b| self.t.act(b)).collect();
        let buffer = self.t.act(f.buffer);
        self.t.free(buffer);
        saved.retain(|&s| s != f.qkv);
        let mut kept = [f.out, lse, f.qkv];
        if f.amp {
            kept.reverse();
            self.t.free_all(&mut g_out.into_iter().collect());
        }
        for id in kept {
            self.release(id);
        }
        if !f.amp {
            self.t.free_all(&mut g_out.into_iter().collect());
        }
        if f.amp {
            let mut copies = Vec::new();
            for k in [2, 1] {
                copies.push(self.t.act(f.grads[k]));
                self.t.free(grads[k]);
            }
            let cat = self.t.act(f.grads.iter().sum());
            self.t.free(grads[0]);
            copies.reverse();
            self.t.free_all(&mut copies);
            return cat;
        }
        let cat = self.t.act(f.grads.iter().sum());
        self.t.free_all(&mut grads);
        cat
    }

    /// Backward of block `l`: frees the saved tensors newest first, one
    /// gradient of each one's size alive at a time beside the residual
    /// gradient `g`; returns the gradient of the block input, which stays
    /// last in `saved`, and the weights whose gradients it made.
    ///
    /// Autograd makes a matmul weight's gradient at the matmul's node,
    /// before the gradient of the matmul's input (the H200's recorded
    /// runs): here, when the walk first reaches a kept tensor older than the
    /// matmul (its mark from the forward), the rest before the block
    /// input's gradient.
    fn hf_block_backward(
        &mut self,
        t: &TransformerArch,
        l: u64,
        n: u64,
        g: u32,
        saved: &mut Vec<u32>,
    ) -> (u32, Vec<usize>) {
        let wd = self.widths();
        let input = saved.pop().expect("block input");
        let mut marks = self.matmul_marks.remove(&l).unwrap_or_default();
        let made: Vec<usize> = marks.iter().map(|&(_, i)| i).collect();
        let mut tmp: Option<u32> = None;
        // a flash kernel's log-sum-exp, popped, waiting for its output
        let mut flash_pending: Option<(u32, FlashSaved)> = None;
        // a memory-efficient kernel's log-sum-exp, mask, output and fp32
        // buffer, likewise waiting for its output's gradient
        let mut windowed_pending: Option<(u32, u32, u32, u64)> = None;
        while let Some(id) = saved.pop() {
            let mut at_node = Vec::new();
            while let Some(&(mark, i)) = marks.last()
                && id < mark
            {
                marks.pop();
                at_node.push(i);
            }
            let mut reads = at_node.pop();
            for i in at_node {
                self.weight_grad(i);
            }
            if self.softmax.contains_key(&id) || self.rmsnorms.contains_key(&id) {
                // their backward is their own; the weight's gradient first
                if let Some(i) = reads.take() {
                    self.weight_grad(i);
                }
            }
            let bytes = self.t.bytes(id);
            if let Some((elems, scores_w, scaled)) = self.softmax.remove(&id) {
                // softmax backward reads the gradient of its output and
                // writes that of the scores (in the scores' width) while the
                // first is alive; eager's scaling of the scores writes one more.
                let g_out = self.t.act(bytes);
                if let Some(p) = tmp.take() {
                    self.t.free(p);
                }
                // softmax's backward writes the scores' gradient beside a
                // temporary of the same size; its own inputs go after it.
                let mut g_scores = self.t.act(elems * scores_w);
                let scratch = self.t.act(elems * scores_w);
                self.t.free(scratch);
                self.t.free(g_out);
                self.release(id);
                if scores_w > wd.c {
                    // A softmax run wider than the scaled scores (the mask's
                    // promotion, its own conversion): the gradient is cast
                    // back to their width.
                    let cast = self.t.act(elems * wd.c);
                    self.t.free(g_scores);
                    g_scores = cast;
                }
                let g = if scaled {
                    let g2 = self.t.act(self.t.bytes(g_scores));
                    self.t.free(g_scores);
                    g2
                } else {
                    g_scores
                };
                tmp = Some(g);
                self.release(id);
                continue;
            }
            if let Some(f) = self.flash.remove(&id) {
                // the log-sum-exp goes with the kernel's other inputs, once
                // the output's gradient (the next kept tensor's) exists; the
                // projection that read the output makes its weight's
                // gradient there
                if let Some(i) = reads.take() {
                    marks.push((id, i));
                }
                flash_pending = Some((id, f));
                continue;
            }
            if let Some((mask, out, buffer)) = self.windowed.remove(&id) {
                // the memory-efficient kernel runs once the gradient of its
                // output (the next kept tensor's) exists; the projection
                // that read the output makes its weight's gradient there
                if let Some(i) = reads.take() {
                    marks.push((id, i));
                }
                windowed_pending = Some((id, mask, out, buffer));
                continue;
            }
            if let Some(norm) = self.rmsnorms.remove(&id) {
                let g_y = self.t.act(bytes);
                if let Some(p) = tmp.take() {
                    self.t.free(p);
                }
                saved.retain(|&s| !norm.holds(s));
                tmp = Some(self.hf_rmsnorm_backward(norm, g_y));
                continue;
            }
            let flash = flash_pending.take_if(|(_, f)| f.out == id);
            let windowed = windowed_pending.take_if(|&mut (_, _, out, _)| out == id);
            // `id`'s gradient, then `id` goes; where a matmul read `id`,
            // inside its node: after the weight's gradient, before
            // autocast's cast back of it. The flash kernel's output stays
            // until the kernel has run.
            let mut gradient = |g: &mut Self| {
                let gt = g.t.act(bytes);
                if let Some(p) = tmp.replace(gt) {
                    g.t.free(p);
                }
                if flash.is_none() && windowed.is_none() {
                    g.release(id);
                }
            };
            match reads {
                Some(i) => self.weight_grad_then(i, gradient, |_| {}),
                None => gradient(self),
            }
            if let Some((lse, f)) = flash {
                tmp = Some(self.hf_flash_backward(f, lse, tmp.take(), saved));
            }
            if let Some((lse, mask, _, buffer)) = windowed {
                // its fp32 buffer for the queries' gradient and the
                // log-sum-exp's, then its inputs go; the mask has no gradient
                let scratch = self.t.act(buffer);
                self.t.free(scratch);
                self.release(id);
                self.release(lse);
                saved.retain(|&s| s != mask);
                self.release(mask);
            }
        }
        while let Some((_, i)) = marks.pop() {
            self.weight_grad(i);
        }
        let g_in = self.t.act(n * t.hidden * wd.r);
        if let Some(p) = tmp {
            self.t.free(p);
        }
        self.release(g);
        saved.push(input);
        (g_in, made)
    }
}

/// The flash kernel's backward buffer: the queries' gradient accumulated
/// in fp32, `batch x seq x heads x head_dim`, and the softmax's row sums,
/// `batch x heads x seq`, with the sequence rounded up to 128 and the head
/// dimension to 32 (to 256 above 192), as FlashAttention-2 pads them (the
/// recorded GPT-2 runs: 16.25 MiB for 4 x 1,024 tokens of 16 heads of 64).
fn flash_backward_buffer(batch: u64, seq: u64, heads: u64, head_dim: u64) -> u64 {
    let s = seq.div_ceil(128) * 128;
    let d = if head_dim > 192 {
        256
    } else {
        head_dim.div_ceil(32) * 32
    };
    batch * s * heads * d * 4 + batch * heads * s * 4
}

/// Up to this many token ids CUDA's embedding backward adds each id's row
/// straight into the table's gradient; beyond, it sorts them first
/// (`embedding_dense_backward_cuda`).
const EMBEDDING_DIRECT_IDS: u64 = 3072;

/// What eager attention does to its scaled scores before the softmax.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ScoreMask {
    /// Nothing: an encoder trained without an attention mask (BERT and
    /// RoBERTa get none from transformers 5 when the batch has no padding
    /// mask; ViT has none), so the softmax reads the scaled scores.
    None,
    /// The causal mask the library builds in the embeddings' dtype, added
    /// (the sum is promoted to it).
    Float,
    /// A term in the scores' own width: T5 adds its position bias,
    /// cross-attention its zero bias.
    Same,
    /// DeBERTa fills the encoder's mask (`batch x seq x seq`, shared by the
    /// `heads`) into the scores of the scaled keys, with the relative term
    /// `summed` in first.
    Filled {
        /// Heads sharing one mask.
        heads: u64,
        /// A relative-position term was added to the product.
        summed: bool,
    },
}

pub(super) fn score_mask(t: &TransformerArch) -> ScoreMask {
    if t.layout.own_attention {
        ScoreMask::Filled {
            heads: t.heads,
            summed: t.layout.disentangled.is_some(),
        }
    } else if t.layout.rel_buckets > 0 {
        ScoreMask::Same
    } else if t.layout.image.is_some() || t.kind == TransformerKind::Encoder {
        ScoreMask::None
    } else {
        ScoreMask::Float
    }
}

/// Where T5's encoder stack meets its decoder ([`Trace::t5_stacks_meet`]).
struct T5Boundary {
    /// The encoder's last block output, which its final norm keeps.
    encoder_last: u32,
    /// What the encoder's final norm and dropout keep.
    encoder_end: Vec<u32>,
    /// The encoder's output, which the cross-attentions' projections keep
    /// (their casts under autocast).
    encoder_output: u32,
    /// The decoder embeddings' dropout mask.
    decoder_mask: Vec<u32>,
    /// The decoder's embeddings, the decoder stack's local.
    decoder_embeddings: u32,
}
