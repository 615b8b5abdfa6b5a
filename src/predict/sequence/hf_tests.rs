//! The generated sequence of tiny Hugging Face models (GPT-2, LLaMA, BERT),
//! tensor by tensor as the library's modelling code makes them (see the
//! module comment of `hf.rs` for where each comes from).
//!
//! Each block is written down once as what its forward allocates, in order,
//! and which of those tensors autograd keeps for backward, in the order they
//! were kept; its backward then allocates one gradient of each kept tensor's
//! size, newest first (two or three for a kept softmax), and the gradient of
//! the block input. 15 tokens (3 x 5), hidden 24, 3 heads, FFN 40,
//! vocabulary 1000.

use super::tests::count;
use super::*;
use crate::api::{Attention, HuggingFaceSpec, ModelSpec, Precision};
use crate::predict::resolve_arch;

const MICRO: u64 = 3;
const SEQ: u64 = 5;
const N: u64 = MICRO * SEQ;
const H: u64 = 24;
const HEADS: u64 = 3;
const HD: u64 = H / HEADS;
const V: u64 = 1000;
const F: u64 = 40;

fn config(model_type: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut c = match model_type {
        "gpt2" => serde_json::json!({"model_type": "gpt2", "n_layer": 2, "n_embd": H,
            "n_head": HEADS, "n_positions": SEQ, "n_inner": F, "vocab_size": V}),
        "llama" => serde_json::json!({"model_type": "llama", "num_hidden_layers": 2,
            "hidden_size": H, "num_attention_heads": HEADS, "intermediate_size": F,
            "vocab_size": V}),
        _ => serde_json::json!({"model_type": "bert", "num_hidden_layers": 2, "hidden_size": H,
            "num_attention_heads": HEADS, "intermediate_size": F, "vocab_size": V}),
    };
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c
}

fn run(precision: Precision, attention: Attention) -> RunShape {
    RunShape {
        attention,
        ..super::tests::run(precision)
    }
}

fn events(config: &serde_json::Value, run: &RunShape) -> Vec<TensorEvent> {
    let model = ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: config.as_object().unwrap().clone(),
            seq_len: SEQ as u32,
        }),
        ..ModelSpec::default()
    };
    training_events(&resolve_arch(&model).unwrap(), run)
}

/// Sizes of the activations, in order.
fn acts(evs: &[TensorEvent]) -> Vec<u64> {
    super::tests::sizes(evs, Category::Activations)
}

/// Element widths: weights, matmul outputs, the residual stream and the
/// elementwise ops autocast runs in fp32.
#[derive(Clone, Copy, Debug)]
struct Wd {
    w: u64,
    c: u64,
    r: u64,
    e: u64,
    amp: bool,
}

fn widths(p: Precision) -> Wd {
    match p {
        Precision::Fp32 => Wd {
            w: 4,
            c: 4,
            r: 4,
            e: 4,
            amp: false,
        },
        Precision::AmpBf16 | Precision::AmpFp16 => Wd {
            w: 4,
            c: 2,
            r: 4,
            e: 4,
            amp: true,
        },
        Precision::Bf16 | Precision::Fp16 => Wd {
            w: 2,
            c: 2,
            r: 2,
            e: 2,
            amp: false,
        },
    }
}

/// Elements of the attention scores of one micro-batch.
const S2: u64 = MICRO * HEADS * SEQ * SEQ;
/// SDPA's log-sum-exp (fp32).
const LSE: u64 = MICRO * HEADS * SEQ * 4;

#[derive(Clone, Copy, Debug)]
enum Kept {
    Tensor(u64),
    /// A softmax output: its backward writes the gradient of the output,
    /// then of the scores (`scores_w` bytes an element), and eager's
    /// scaling one more.
    Softmax {
        bytes: u64,
        scores_w: u64,
        scaled: bool,
    },
    /// An RMSNorm's fp32 input copy (low precision only), inverse RMS and
    /// normalised tensor (`r` bytes an element, as the residual): its
    /// backward is [`rmsnorm_backward`].
    RmsNorm {
        r: u64,
    },
    /// The flash kernel's log-sum-exp (half precision, GPT-2's fused
    /// projection): its backward writes the output's gradient (`out`
    /// bytes), the three projections' gradients, its buffer, under autocast
    /// copies of the values' and keys', then their concatenation.
    Flash {
        out: u64,
        grads: [u64; 3],
        amp: bool,
    },
}

/// The flash kernel's backward buffer for the tiny models: the queries'
/// gradient in fp32 padded to 128 tokens and 32 dimensions, and the row
/// sums.
const FLASH_BUFFER: u64 = MICRO * 128 * HEADS * 32 * 4 + MICRO * HEADS * 128 * 4;

/// An RMSNorm's backward after the gradient of its normalised tensor: that
/// gradient in fp32 (low precision), the product's two gradients (the
/// inverse RMS's summed from a temporary), the mean's, pow's two
/// temporaries and its gradient, then the input's cast back (low precision).
fn rmsnorm_backward(w: Wd) -> Vec<u64> {
    let mut v = vec![N * H * 4; 6];
    if w.r != 4 {
        v.push(N * H * 4);
        v.push(N * H * w.r);
    }
    v
}

/// One block: what its forward allocates, what autograd keeps (with the
/// position in `fwd` of the tensor kept) and where its matmuls run (the
/// length of `fwd` then, and the weight's elements).
#[derive(Default)]
struct Block {
    fwd: Vec<u64>,
    kept: Vec<(usize, Kept)>,
    matmuls: Vec<(usize, u64)>,
}

impl Block {
    fn tmp(&mut self, bytes: u64) {
        self.fwd.push(bytes);
    }
    fn keep(&mut self, bytes: u64) {
        self.fwd.push(bytes);
        self.kept.push((self.fwd.len() - 1, Kept::Tensor(bytes)));
    }
    /// Keeps the latest tensor of `bytes` allocated earlier.
    fn keep_earlier(&mut self, bytes: u64) {
        let at = self.fwd.iter().rposition(|&b| b == bytes).unwrap();
        self.kept.push((at, Kept::Tensor(bytes)));
    }
    fn keep_softmax(&mut self, bytes: u64, scores_w: u64, scaled: bool) {
        self.fwd.push(bytes);
        self.kept.push((
            self.fwd.len() - 1,
            Kept::Softmax {
                bytes,
                scores_w,
                scaled,
            },
        ));
    }
    /// A matmul with a weight of `elems` elements runs next.
    fn matmul(&mut self, elems: u64) {
        self.matmuls.push((self.fwd.len(), elems));
    }
    /// Dropout on a branch: its one-byte mask (kept), then the output.
    fn dropout(&mut self, on: bool, bytes: u64) {
        if on {
            self.keep(N * H);
            self.tmp(bytes);
        }
    }
    /// Eager attention's scores: the product, its scaling and the causal
    /// mask (`masked`: in the embeddings' dtype, fp32 under autocast; BERT
    /// trains without one), the softmax (after a conversion of a narrower
    /// input), its low-precision copy and dropout on the probabilities (its
    /// mask first).
    fn eager_scores(
        &mut self,
        w: Wd,
        masked: bool,
        cast_first: bool,
        softmax_fp32: bool,
        dropout: bool,
    ) {
        self.tmp(S2 * w.c);
        self.tmp(S2 * w.c);
        let mw = if masked { w.c.max(w.w) } else { w.c };
        if masked {
            self.tmp(S2 * mw);
        }
        let pw = if softmax_fp32 { 4 } else { w.e };
        if pw > mw {
            self.tmp(S2 * pw);
        }
        self.keep_softmax(S2 * pw, pw, true);
        let cast = pw != w.c && (cast_first || !dropout);
        if cast {
            self.tmp(S2 * w.c);
        }
        if dropout {
            let width = if cast { w.c } else { pw };
            self.keep(S2);
            if width == w.c {
                self.keep(S2 * width);
            } else {
                self.tmp(S2 * width);
                self.keep(S2 * w.c);
            }
        } else if cast {
            self.keep_earlier(S2 * w.c);
        }
    }
    /// `transpose(1, 2).contiguous()` of a (batch, heads, seq, dim) product.
    fn contiguous_output(&mut self, w: Wd) {
        self.tmp(N * H * w.c);
        self.keep(N * H * w.c);
    }
    /// Backward: one gradient per kept tensor, newest first, then the block
    /// input's. A matmul's node makes its weight's gradient (an activation
    /// under autocast: the low-precision one) before that of the first kept
    /// tensor older than the matmul; the rest before the block input's.
    fn backward(&self, w: Wd) -> Vec<u64> {
        let mut out = Vec::new();
        let mut matmuls = self.matmuls.clone();
        let mut weight_grads = |out: &mut Vec<u64>, older_than: usize| {
            while let Some(&(at, elems)) = matmuls.last()
                && older_than < at
            {
                matmuls.pop();
                if w.amp {
                    out.push(elems * w.c);
                }
            }
        };
        for &(at, k) in self.kept.iter().rev() {
            weight_grads(&mut out, at);
            match k {
                Kept::Tensor(b) => out.push(b),
                Kept::RmsNorm { .. } => {
                    out.push(N * H * w.r);
                    out.extend(rmsnorm_backward(w));
                }
                Kept::Flash {
                    out: bytes,
                    grads,
                    amp,
                } => {
                    out.push(bytes);
                    out.extend(grads);
                    out.push(FLASH_BUFFER);
                    if amp {
                        out.extend([grads[2], grads[1]]);
                    }
                    out.push(grads.iter().sum());
                }
                Kept::Softmax {
                    bytes,
                    scores_w,
                    scaled,
                } => {
                    // the output's gradient, the scores' and softmax
                    // backward's temporary; a wider softmax's gradient cast
                    // back to the scores' width; the scaling's
                    out.extend([bytes, S2 * scores_w, S2 * scores_w]);
                    let width = scores_w.min(w.c);
                    if scores_w > w.c {
                        out.push(S2 * width);
                    }
                    if scaled {
                        out.push(S2 * width);
                    }
                }
            }
        }
        weight_grads(&mut out, 0);
        out.push(N * H * w.r);
        out
    }
}

/// What the run varies besides the precision.
#[derive(Clone, Copy, Debug)]
struct Opt {
    eager: bool,
    cache: bool,
    dropout: bool,
    gelu_new: bool,
    /// Key/value width (LLaMA's grouped-query heads).
    kvd: u64,
}

const DEFAULTS: Opt = Opt {
    eager: false,
    cache: true,
    dropout: true,
    gelu_new: true,
    kvd: H,
};

impl Opt {
    fn attention(self) -> Attention {
        if self.eager {
            Attention::Eager
        } else {
            Attention::Sdpa
        }
    }
}

fn gpt2_block(w: Wd, o: Opt) -> Block {
    let mut b = Block::default();
    b.keep(N * 8); // ln_1's mean and rstd
    if w.amp {
        b.tmp(N * H * w.r);
        b.keep(N * H * w.c); // its cast for c_attn
    } else {
        b.keep(N * H * w.r);
    }
    let qkv = N * 3 * H * w.c;
    b.matmul(3 * H * H); // c_attn
    // in half precision SDPA runs the flash kernel, which keeps the fused
    // projection, its output and the log-sum-exp for a backward of its own
    let flash = !o.eager && w.c == 2;
    if (o.eager && o.cache) || flash {
        b.tmp(qkv); // eager: the query view is copied for the batched matmul below
    } else {
        b.keep(qkv);
    }
    if o.cache {
        b.tmp(N * H * w.c); // the DynamicCache's keys
        b.tmp(N * H * w.c); // and values
    }
    if o.eager {
        if o.cache {
            b.keep(N * H * w.c);
        }
        b.eager_scores(w, true, true, false, o.dropout);
        b.contiguous_output(w);
    } else if flash {
        b.tmp(N * H * w.c); // the kernel's output, already contiguous
        b.fwd.push(LSE);
        let at = b.fwd.len() - 1;
        b.kept.push((
            at,
            Kept::Flash {
                out: N * H * w.c,
                grads: [N * H * w.c; 3],
                amp: w.amp,
            },
        ));
    } else {
        b.keep(N * H * w.c); // SDPA's output, already contiguous
        b.keep(LSE);
    }
    b.matmul(H * H);
    b.tmp(N * H * w.c); // c_proj
    b.dropout(o.dropout, N * H * w.c);
    b.keep(N * H * w.r); // the residual sum
    b.keep(N * 8); // ln_2's statistics
    if w.amp {
        b.tmp(N * H * w.r);
        b.keep(N * H * w.c);
    } else {
        b.keep(N * H * w.r);
    }
    let nf = N * F;
    b.matmul(F * H); // c_fc
    if o.gelu_new {
        // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3))))
        if w.amp {
            b.tmp(nf * w.c); // c_fc
            b.keep(nf * w.c); // 0.5 * x
            b.keep(nf * 4); // x.float() for pow
        } else {
            b.keep(nf * w.c);
            b.keep(nf * w.c);
        }
        for _ in 0..4 {
            b.tmp(nf * w.e); // pow, * 0.044715, x +, * sqrt(2 / pi)
        }
        b.keep(nf * w.e); // tanh
        b.keep(nf * w.e); // 1 + tanh
        if w.amp {
            b.tmp(nf * w.e);
            b.keep(nf * w.c); // cast for the second matmul
        } else {
            b.keep(nf * w.e);
        }
    } else {
        b.keep(nf * w.c);
        b.keep(nf * w.c);
    }
    b.matmul(H * F);
    b.tmp(N * H * w.c); // mlp c_proj
    b.dropout(o.dropout, N * H * w.c);
    b.tmp(N * H * w.r); // the block's output
    b
}

/// LLaMA's RMSNorm: the fp32 upcast, `pow(2).mean`, `rsqrt`, `x * rsqrt`,
/// the cast back and the weight's product (the output, returned unkept).
fn rmsnorm(b: &mut Block, w: Wd) {
    if w.r == 4 {
        b.tmp(N * H * 4);
        b.tmp(N * 4);
        b.tmp(N * 4);
        b.tmp(N * H * 4);
    } else {
        b.tmp(N * H * 4); // the fp32 copy of the input
        b.tmp(N * H * 4);
        b.tmp(N * 4);
        b.tmp(N * 4);
        b.tmp(N * H * 4);
        b.tmp(N * H * w.r);
    }
    // keyed by the normalised tensor, the last of its kept ones
    b.kept.push((b.fwd.len() - 1, Kept::RmsNorm { r: w.r }));
    b.tmp(N * H * w.w);
}

/// `x * cos + rotate_half(x) * sin` over `elems` elements.
fn rope(b: &mut Block, w: Wd, elems: u64) {
    b.tmp(elems * w.e);
    b.tmp(elems / 2 * w.c);
    b.tmp(elems * w.c);
    b.tmp(elems * w.e);
    b.tmp(elems * w.e);
}

/// An op's input of `bytes` (`elems` elements) as autocast keeps it: a
/// low-precision copy when it is wider, else itself when the op owns it.
fn autocast_input(b: &mut Block, w: Wd, bytes: u64, elems: u64, owned: bool) {
    if w.amp && bytes > elems * w.c {
        b.keep(elems * w.c);
    } else if owned {
        b.keep_earlier(bytes);
    }
}

fn llama_block(w: Wd, o: Opt) -> Block {
    llama_block_pass(w, o, false)
}

/// The block with autograd, or (`no_grad`) as a checkpointed block's first
/// forward allocates it: under autocast each projection's cast of the
/// norm's output is made right before it (nothing keeps it).
fn llama_block_pass(w: Wd, o: Opt, no_grad: bool) -> Block {
    let mut b = Block::default();
    let kvd = o.kvd;
    let lazy = w.amp && no_grad;
    rmsnorm(&mut b, w);
    if w.amp && !no_grad {
        for _ in 0..3 {
            b.keep(N * H * w.c); // q_proj's, k_proj's and v_proj's casts
        }
    } else if !w.amp {
        b.keep_earlier(N * H * w.w);
    }
    for out in [N * H, N * kvd, N * kvd] {
        b.matmul(out / N * H);
        if lazy {
            b.tmp(N * H * w.c);
        }
        b.tmp(out * w.c);
    }
    rope(&mut b, w, N * H);
    rope(&mut b, w, N * kvd);
    let (keys, values) = if o.cache {
        b.tmp(N * kvd * w.e);
        b.tmp(N * kvd * w.e);
        (N * kvd * w.e, N * kvd * w.e)
    } else {
        (N * kvd * w.e, N * kvd * w.c)
    };
    let owned = !o.cache;
    let gqa = kvd < H;
    if o.eager {
        autocast_input(&mut b, w, N * H * w.e, N * H, true);
        for (i, bytes) in [keys, values].into_iter().enumerate() {
            if i == 1 {
                b.eager_scores(w, true, false, true, o.dropout);
            }
            if gqa {
                // repeat_kv: a full-width copy in the same dtype
                let wide = N * H * (bytes / (N * kvd));
                b.tmp(wide);
                autocast_input(&mut b, w, wide, N * H, true);
            } else {
                autocast_input(&mut b, w, bytes, N * H, owned);
            }
        }
        b.contiguous_output(w);
    } else if w.c == 4 && gqa {
        // fp32 with grouped-query heads: SDPA's math path
        b.keep_earlier(N * H * w.e);
        b.keep(N * H * 4);
        b.keep(N * H * 4);
        b.tmp(S2 * 4);
        b.keep_softmax(S2 * 4, 4, false);
        b.contiguous_output(w);
    } else {
        autocast_input(&mut b, w, N * H * w.e, N * H, true);
        autocast_input(&mut b, w, keys, N * kvd, owned);
        autocast_input(&mut b, w, values, N * kvd, owned);
        b.keep(N * H * w.c);
        b.keep(LSE);
    }
    b.matmul(H * H);
    b.tmp(N * H * w.c); // o_proj
    if w.r == 4 {
        b.keep(N * H * w.r); // the residual sum, the next norm's input
    } else {
        b.tmp(N * H * w.r);
    }
    rmsnorm(&mut b, w);
    if w.amp && !no_grad {
        b.keep(N * H * w.c); // gate_proj's and up_proj's casts
        b.keep(N * H * w.c);
    } else if !w.amp {
        b.keep_earlier(N * H * w.w);
    }
    for i in 0..4 {
        if i % 2 == 0 {
            b.matmul(F * H);
        }
        if lazy && i % 2 == 0 {
            b.tmp(N * H * w.c);
        }
        b.keep(N * F * w.c); // gate, silu(gate), up, silu(gate) * up
    }
    b.matmul(H * F);
    b.tmp(N * H * w.c); // down_proj
    b.tmp(N * H * w.r);
    b
}

fn bert_block(w: Wd, o: Opt) -> Block {
    let mut b = Block::default();
    if w.amp {
        for _ in 0..3 {
            b.keep(N * H * w.c); // the query's, key's and value's input casts
        }
    }
    if o.eager {
        b.matmul(H * H);
        b.keep(N * H * w.c);
        b.matmul(H * H);
        b.keep(N * H * w.c);
        b.matmul(H * H);
        b.tmp(N * H * w.c);
        b.eager_scores(w, false, false, false, o.dropout);
        b.keep_earlier(N * H * w.c); // the values
        b.contiguous_output(w);
    } else {
        for _ in 0..3 {
            b.matmul(H * H);
            b.keep(N * H * w.c);
        }
        b.keep(N * H * w.c);
        b.keep(LSE);
    }
    b.matmul(H * H);
    b.tmp(N * H * w.c); // attention.output.dense
    b.dropout(o.dropout, N * H * w.c);
    b.keep(N * H * w.r); // the residual sum, LayerNorm's input
    b.keep(N * 8);
    if w.amp {
        b.tmp(N * H * w.r);
        b.keep(N * H * w.c);
    } else {
        b.keep(N * H * w.r);
    }
    b.matmul(F * H);
    b.keep(N * F * w.c); // intermediate.dense
    b.keep(N * F * w.c); // its GELU
    b.matmul(H * F);
    b.tmp(N * H * w.c); // output.dense
    b.dropout(o.dropout, N * H * w.c);
    b.keep(N * H * w.r);
    b.keep(N * 8);
    b.tmp(N * H * w.r);
    b
}

/// The step's inputs (ids, labels) and the embeddings.
fn embeddings(family: &str, w: Wd, o: Opt) -> Vec<u64> {
    let mut v = vec![N * 8, N * 8];
    match family {
        "gpt2" => {
            v.extend([N * H * w.w, SEQ * H * w.w, N * H * w.w]);
            if o.dropout {
                v.extend([N * H, N * H * w.w]);
            }
        }
        "llama" => v.extend([N * H * w.w, SEQ * HD * w.w, SEQ * HD * w.w]),
        _ => {
            // word + token types, + positions, LayerNorm (input, statistics)
            v.extend([N * H * w.w; 3]);
            v.extend([SEQ * H * w.w, N * H * w.w, N * 8, N * H * w.r]);
            if o.dropout {
                v.extend([N * H, N * H * w.r]);
            }
        }
    }
    v
}

/// The head's forward and the loss.
fn head(family: &str, w: Wd) -> Vec<u64> {
    let mut v = Vec::new();
    match family {
        "gpt2" => v.extend([N * 8, N * H * w.r]),
        "llama" => {
            let mut b = Block::default();
            rmsnorm(&mut b, w);
            v = b.fwd;
        }
        _ => {
            if w.amp {
                v.push(N * H * w.c);
            }
            v.extend([N * H * w.c, N * H * w.c]); // transform.dense, its GELU
            if w.amp {
                v.push(N * H * 4);
            }
            v.extend([N * 8, N * H * w.r]);
        }
    }
    if w.amp {
        v.push(N * H * w.c);
    }
    v.push(N * V * w.c); // the logits
    let upcast = family != "bert";
    if upcast && w.c != 4 {
        v.extend([N * V * 4, N * V * 4]); // logits.float(), log-softmax
    } else {
        v.push(N * V * if upcast { 4 } else { w.c });
    }
    if !upcast && w.amp {
        v.push(N * V * 4); // autocast's fp32 copy for nll_loss
    }
    v.push(512);
    v
}

/// The loss's and the head's backward, up to the residual gradient.
fn head_backward(family: &str, w: Wd) -> Vec<u64> {
    let upcast = family != "bert";
    let nll_copy = !upcast && w.amp;
    let mut v = vec![N * V * if upcast || nll_copy { 4 } else { w.c }];
    if nll_copy {
        v.push(N * V * w.c); // the fp32 gradient cast back
    }
    v.push(N * V * if upcast { 4 } else { w.c });
    if upcast && w.c != 4 {
        v.push(N * V * w.c);
    }
    // The head's matmul node: its weight's gradient first (the untied
    // head's bf16 one under autocast; the tied head's contribution, waiting
    // in autograd's buffer), then its input's.
    if family == "llama" && w.amp {
        v.push(V * H * w.c);
    }
    if family != "llama" {
        v.push(V * H * w.c);
    }
    v.push(N * H * w.c);
    if w.amp && family == "bert" {
        v.push(H * H * w.c); // the bf16 gradient of the head's transform
    }
    v.push(N * H * w.r);
    if family == "llama" {
        v.extend(rmsnorm_backward(w));
    }
    v
}

fn block_of(family: &str, w: Wd, o: Opt) -> Block {
    match family {
        "gpt2" => gpt2_block(w, o),
        "llama" => llama_block(w, o),
        _ => bert_block(w, o),
    }
}

/// The first micro-step's activations: its forward up to the loss, and its
/// backward.
fn first_micro_step(evs: &[TensorEvent]) -> (Vec<u64>, Vec<u64>) {
    let a = acts(evs);
    let start = a.iter().position(|&b| b == N * 8).unwrap();
    let loss = a.iter().position(|&b| b == 512).unwrap();
    let next = start
        + 1
        + a[start + 1..]
            .windows(2)
            .position(|p| p == [N * 8, N * 8])
            .unwrap();
    (a[start..=loss].to_vec(), a[loss + 1..next].to_vec())
}

fn expected(family: &str, p: Precision, o: Opt) -> (Vec<u64>, Vec<u64>) {
    let w = widths(p);
    let block = block_of(family, w, o);
    let mut fwd = embeddings(family, w, o);
    for _ in 0..2 {
        fwd.extend(&block.fwd);
    }
    fwd.extend(head(family, w));
    let mut bwd = head_backward(family, w);
    for _ in 0..2 {
        bwd.extend(block.backward(w));
    }
    if family != "llama" {
        bwd.push(V * H * w.w); // the word table's dense gradient
    }
    (fwd, bwd)
}

/// The runs the sequence tests cover: each family with its defaults and
/// with each library term turned off or on, fused and eager attention.
fn cases() -> Vec<(&'static str, serde_json::Value, Opt)> {
    let mut cases: Vec<(&str, serde_json::Value, Opt)> = Vec::new();
    for eager in [false, true] {
        let o = Opt { eager, ..DEFAULTS };
        cases.push(("gpt2", serde_json::json!({}), o));
        cases.push((
            "gpt2",
            serde_json::json!({"use_cache": false}),
            Opt { cache: false, ..o },
        ));
        cases.push((
            "gpt2",
            serde_json::json!({"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}),
            Opt {
                dropout: false,
                ..o
            },
        ));
        cases.push((
            "gpt2",
            serde_json::json!({"activation_function": "gelu"}),
            Opt {
                gelu_new: false,
                ..o
            },
        ));
        let llama = Opt {
            dropout: false,
            ..o
        };
        cases.push(("llama", serde_json::json!({}), llama));
        cases.push((
            "llama",
            serde_json::json!({"use_cache": false}),
            Opt {
                cache: false,
                ..llama
            },
        ));
        cases.push((
            "llama",
            serde_json::json!({"num_key_value_heads": 1}),
            Opt { kvd: HD, ..llama },
        ));
        cases.push((
            "llama",
            serde_json::json!({"num_key_value_heads": 1, "use_cache": false}),
            Opt {
                kvd: HD,
                cache: false,
                ..llama
            },
        ));
        cases.push((
            "llama",
            serde_json::json!({"attention_dropout": 0.1}),
            Opt {
                dropout: true,
                ..llama
            },
        ));
        let bert = Opt { cache: false, ..o };
        cases.push(("bert", serde_json::json!({}), bert));
        cases.push((
            "bert",
            serde_json::json!({"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}),
            Opt {
                dropout: false,
                ..bert
            },
        ));
    }
    cases
}

const PRECISIONS: [Precision; 3] = [Precision::Fp32, Precision::AmpBf16, Precision::Bf16];

#[test]
fn each_family_allocates_and_keeps_what_its_modelling_code_does() {
    for (family, extra, o) in cases() {
        for p in PRECISIONS {
            let a = o.attention();
            let evs = events(&config(family, extra.clone()), &run(p, a));
            let (fwd, bwd) = first_micro_step(&evs);
            let (want_fwd, want_bwd) = expected(family, p, o);
            assert_eq!(fwd, want_fwd, "forward: {family} {extra} {p:?} {o:?}");
            assert_eq!(bwd, want_bwd, "backward: {family} {extra} {p:?} {o:?}");
        }
    }
}

/// Replays `evs`: panics on a free of a tensor not alive; returns what is
/// alive at the end, by category, sizes sorted.
fn alive_at_end(evs: &[TensorEvent]) -> BTreeMap<&'static str, Vec<u64>> {
    let mut live: BTreeMap<u32, (u64, Category)> = BTreeMap::new();
    for e in evs {
        match *e {
            TensorEvent::Alloc {
                id,
                bytes,
                category,
                ..
            } => {
                assert!(live.insert(id, (bytes, category)).is_none());
            }
            TensorEvent::Free { id } => {
                assert!(live.remove(&id).is_some(), "tensor {id} freed twice");
            }
        }
    }
    let mut out: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    for (bytes, category) in live.into_values() {
        let name = match category {
            Category::Parameters => "parameters",
            Category::Gradients => "gradients",
            Category::Optimizer => "optimizer",
            Category::Activations => "activations",
            Category::Workspace => "workspace",
            Category::Persistent => "persistent",
        };
        out.entry(name).or_default().push(bytes);
    }
    for v in out.values_mut() {
        v.sort_unstable();
    }
    out
}

#[test]
fn a_run_frees_every_tensor_once_and_keeps_only_the_weights_and_the_last_outputs() {
    for family in ["gpt2", "llama", "bert"] {
        let cfg = config(family, serde_json::json!({"num_key_value_heads": 1}));
        let arch = resolve_arch(&ModelSpec {
            hugging_face: Some(HuggingFaceSpec {
                config: cfg.as_object().unwrap().clone(),
                seq_len: SEQ as u32,
            }),
            ..ModelSpec::default()
        })
        .unwrap();
        for p in [Precision::Fp32, Precision::AmpBf16, Precision::Bf16] {
            let w = widths(p);
            let mut weights: Vec<u64> = arch
                .param_tensors()
                .iter()
                .map(|t| t.numel() * w.w)
                .collect();
            weights.sort_unstable();
            for a in [Attention::Sdpa, Attention::Eager] {
                for checkpointing in [false, true] {
                    for grad_accum in [1, 3] {
                        for workspace in [0, 1 << 20] {
                            let shape = RunShape {
                                checkpointing,
                                grad_accum,
                                cublas_workspace: workspace,
                                ..run(p, a)
                            };
                            let case = format!(
                                "{family} {p:?} {a:?} ckpt {checkpointing} accum {grad_accum}"
                            );
                            let end = alive_at_end(&events(&cfg, &shape));
                            assert_eq!(end["parameters"], weights, "{case}");
                            assert!(!end.contains_key("gradients"), "{case}");
                            assert_eq!(
                                end.get("workspace").map_or(0, Vec::len),
                                if workspace > 0 { 2 } else { 0 },
                                "{case}"
                            );
                            // `outputs` of the last step: the logits and, for the
                            // decoders without checkpointing, each layer's cached
                            // keys and values.
                            let mut outputs = vec![N * V * w.c];
                            if family != "bert" && !checkpointing {
                                let kv = if family == "gpt2" {
                                    N * H * w.c
                                } else {
                                    N * HD * w.e
                                };
                                outputs.extend([kv; 4]);
                            }
                            outputs.sort_unstable();
                            assert_eq!(end["activations"], outputs, "{case}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn checkpointing_keeps_block_inputs_and_recomputes_each_block_before_its_backward() {
    for (family, extra, o) in cases() {
        for p in PRECISIONS {
            let w = widths(p);
            let a = o.attention();
            let shape = RunShape {
                checkpointing: true,
                ..run(p, a)
            };
            let evs = events(&config(family, extra.clone()), &shape);
            let (fwd, bwd) = first_micro_step(&evs);
            // gradient_checkpointing_enable() turns the cache off
            let o = Opt { cache: false, ..o };
            let first_pass = match family {
                "llama" => llama_block_pass(w, o, true).fwd,
                _ => block_of(family, w, o).fwd,
            };
            let mut want_fwd = embeddings(family, w, o);
            for _ in 0..2 {
                want_fwd.extend(&first_pass);
            }
            want_fwd.extend(head(family, w));
            assert_eq!(fwd, want_fwd, "forward: {family} {extra} {p:?}");
            let block = block_of(family, w, o);
            let mut want = head_backward(family, w);
            for _ in 0..2 {
                want.extend(&block.fwd);
                want.extend(block.backward(w));
            }
            if family != "llama" {
                want.push(V * H * w.w);
            }
            assert_eq!(bwd, want, "backward: {family} {extra} {p:?}");
        }
    }
}

/// The activations alive (id to bytes) when `stop`, asked at each
/// allocation before it is counted (with its bytes and category), first says
/// yes; `None` if it never does.
fn live_activations_until(
    evs: &[TensorEvent],
    mut stop: impl FnMut(u64, Category) -> bool,
) -> Option<BTreeMap<u32, u64>> {
    let mut live: BTreeMap<u32, u64> = BTreeMap::new();
    for e in evs {
        match *e {
            TensorEvent::Alloc {
                id,
                bytes,
                category,
                ..
            } => {
                if stop(bytes, category) {
                    return Some(live);
                }
                if category == Category::Activations {
                    live.insert(id, bytes);
                }
            }
            TensorEvent::Free { id } => {
                live.remove(&id);
            }
        }
    }
    None
}

/// Sizes of the activations alive just before backward's first allocation
/// in the first micro-step (the forward's locals freed), sorted.
fn alive_when_backward_starts(evs: &[TensorEvent]) -> Vec<u64> {
    let mut loss_seen = false;
    let live = live_activations_until(evs, |bytes, _| {
        let after_loss = loss_seen;
        loss_seen = bytes == 512;
        after_loss
    })
    .expect("an allocation after the loss");
    let mut v: Vec<u64> = live.into_values().collect();
    v.sort_unstable();
    v
}

fn kept_bytes(b: &Block) -> Vec<u64> {
    b.kept
        .iter()
        .flat_map(|&(_, k)| match k {
            Kept::Tensor(b) | Kept::Softmax { bytes: b, .. } => vec![b],
            Kept::RmsNorm { r: 4 } => vec![N * 4, N * H * 4],
            Kept::RmsNorm { r } => vec![N * H * 4, N * 4, N * H * r],
            // the fused projection, the output and the log-sum-exp
            Kept::Flash { out, grads, .. } => vec![grads.iter().sum(), out, LSE],
        })
        .collect()
}

#[test]
fn at_the_loss_each_block_holds_what_it_kept_and_the_inputs_it_did_not_free() {
    for (family, extra, o) in cases() {
        for p in PRECISIONS {
            let w = widths(p);
            let a = o.attention();
            let evs = events(&config(family, extra.clone()), &run(p, a));
            let mut want = vec![N * 8, N * 8];
            let emb_out = match family {
                "gpt2" => {
                    if o.dropout {
                        want.push(N * H);
                    }
                    N * H * w.w
                }
                "llama" => N * H * w.w,
                _ => {
                    // LayerNorm's input and statistics
                    want.extend([N * H * w.w, N * 8]);
                    if o.dropout {
                        want.push(N * H);
                    }
                    N * H * w.r
                }
            };
            // LLaMA in low precision keeps the norm's fp32 copy and BERT
            // under autocast the casts: the block input dies at the
            // residual add.
            let input_freed = (family == "llama" && w.r != 4) || (family == "bert" && w.amp);
            let block = block_of(family, w, o);
            for input in [emb_out, N * H * w.r] {
                want.extend(kept_bytes(&block));
                if !input_freed {
                    want.push(input);
                }
            }
            // the head: the last block's output (under autocast BERT's
            // transform keeps its cast: the output died with the forward)
            // and what the head keeps
            if !(family == "bert" && w.amp) {
                want.push(N * H * w.r);
            }
            match family {
                "gpt2" => want.extend([N * 8, if w.amp { N * H * w.c } else { N * H * w.r }]),
                "llama" => {
                    let mut b = Block::default();
                    rmsnorm(&mut b, w);
                    want.extend(kept_bytes(&b));
                    want.push(if w.amp { N * H * w.c } else { N * H * w.w });
                }
                _ => {
                    if w.amp {
                        want.extend([N * H * w.c, N * H * w.c, N * H * 4]);
                    } else {
                        want.extend([N * H * w.c, N * H * w.c]);
                    }
                    want.extend([N * 8, if w.amp { N * H * w.c } else { N * H * w.r }]);
                }
            }
            // the logits, the log-softmax, the loss and the cache
            let upcast = family != "bert";
            want.extend([N * V * w.c, N * V * if upcast { 4 } else { w.c }, 512]);
            if !upcast && w.amp {
                want.push(N * V * 4); // autocast's fp32 copy for nll_loss
            }
            if o.cache {
                let kv = if family == "gpt2" {
                    N * H * w.c
                } else {
                    N * o.kvd * w.e
                };
                want.extend([kv; 4]);
            }
            want.sort_unstable();
            assert_eq!(
                alive_when_backward_starts(&evs),
                want,
                "{family} {extra} {p:?} {o:?}"
            );
        }
    }
}

/// The activations of the backward of the micro-step that starts at the
/// `k`-th pair of input ids (from 0).
fn backward_of_micro_step(evs: &[TensorEvent], k: usize) -> Vec<u64> {
    let a = acts(evs);
    let starts: Vec<usize> = (0..a.len() - 1)
        .filter(|&i| a[i] == N * 8 && a[i + 1] == N * 8)
        .collect();
    let end = starts.get(k + 1).copied().unwrap_or(a.len());
    let loss = starts[k] + a[starts[k]..].iter().position(|&b| b == 512).unwrap();
    a[loss + 1..end].to_vec()
}

#[test]
fn a_tied_word_tables_gradient_is_summed_into_a_new_tensor_then_added_into_grad() {
    // Under autocast the head's contribution is the weight cast's backward,
    // fp32 and not a view: the dense table is added into it in place and the
    // first micro-step's is `.grad` (the recorded GPT-2 and Gemma 2 runs).
    for family in ["gpt2", "bert", "llama"] {
        for p in PRECISIONS {
            let w = widths(p);
            let shape = RunShape {
                grad_accum: 2,
                ..run(p, Attention::Sdpa)
            };
            let evs = events(&config(family, serde_json::json!({})), &shape);
            let grads = |evs: &[TensorEvent]| {
                evs.iter()
                    .filter(|e| {
                        matches!(
                            e,
                            TensorEvent::Alloc {
                                category: Category::Gradients,
                                ..
                            }
                        )
                    })
                    .count()
            };
            let first = backward_of_micro_step(&evs, 0);
            let second = backward_of_micro_step(&evs, 1);
            let table = V * H * w.w;
            if family == "llama" {
                // untied: the head's gradient (with autocast from its bf16
                // one) is made once and added into on the second micro-step
                assert!(!first.ends_with(&[table]), "{family} {p:?}");
                // (the head's node: its weight's gradient, then the input's
                // and the residual's; autocast's cast back after them)
                let head = if w.amp {
                    vec![V * H * w.c, N * H * w.c, N * H * w.r, V * H * w.w]
                } else {
                    vec![V * H * w.w, N * H * w.c]
                };
                assert!(
                    second.windows(head.len()).any(|x| x == head),
                    "{family} {p:?}: {second:?}"
                );
                // and the embedding's dense gradient is added at the end
                assert!(second.ends_with(&[table]), "{family} {p:?}");
            } else if w.amp {
                // the head's, cast back after the residual's gradient, then
                // the dense table, added into it: no sum
                for step in [&first, &second] {
                    let cast_back = [N * H * w.r, table];
                    assert!(
                        step.windows(2).any(|x| x == cast_back),
                        "{family} {p:?}: {step:?}"
                    );
                    assert!(step.ends_with(&[table]), "{family} {p:?}");
                    assert!(!step.ends_with(&[table, table]), "{family} {p:?}");
                }
            } else {
                // the dense table, then (first micro-step) the sum becomes
                // .grad, a gradient; later the sum is a temporary added in
                assert!(first.ends_with(&[table]), "{family} {p:?}");
                assert!(!first.ends_with(&[table, table]), "{family} {p:?}");
                assert!(second.ends_with(&[table, table]), "{family} {p:?}");
            }
            // every parameter's gradient once a step
            let params = resolve_arch(&ModelSpec {
                hugging_face: Some(HuggingFaceSpec {
                    config: config(family, serde_json::json!({}))
                        .as_object()
                        .unwrap()
                        .clone(),
                    seq_len: SEQ as u32,
                }),
                ..ModelSpec::default()
            })
            .unwrap()
            .param_tensors()
            .len();
            let steps = STEPS_GENERATED as usize;
            assert_eq!(grads(&evs), steps * params, "{family} {p:?}");
        }
    }
}

#[test]
fn under_fsdp_the_head_and_the_tables_make_full_size_gradients_for_the_reduce_scatter() {
    for family in ["gpt2", "llama", "bert"] {
        let p = Precision::AmpBf16;
        let w = widths(p);
        let shape = RunShape {
            zero_stage: 2,
            gpus: 2,
            ..run(p, Attention::Sdpa)
        };
        let evs = events(&config(family, serde_json::json!({})), &shape);
        let bwd = backward_of_micro_step(&evs, 0);
        // no tied contribution waits in autograd's buffer: the head's
        // gradients (the tied table's bf16 one included) go to the unit's
        // reduce-scatter at once
        let at = bwd.iter().position(|&b| b == N * H * w.c).unwrap();
        let head_temps = match family {
            "llama" => vec![V * H * w.c],
            "bert" => vec![H * H * w.c, V * H * w.c],
            _ => vec![V * H * w.c],
        };
        assert_eq!(
            bwd[at + 1..at + 1 + head_temps.len()],
            head_temps[..],
            "{family}"
        );
        // the embedding's backward writes one dense table, freed
        assert!(bwd.ends_with(&[V * H * w.w]), "{family}: {bwd:?}");
        let end = alive_at_end(&evs);
        assert!(!end.contains_key("gradients"), "{family}");
    }
}

#[test]
fn the_previous_steps_outputs_are_freed_when_the_next_forward_returns() {
    for family in ["gpt2", "llama", "bert"] {
        let p = Precision::AmpBf16;
        let w = widths(p);
        let evs = events(
            &config(family, serde_json::json!({})),
            &run(p, Attention::Sdpa),
        );
        let logits: Vec<u32> = evs
            .iter()
            .filter_map(|e| match *e {
                TensorEvent::Alloc { id, bytes, .. } if bytes == N * V * w.c => Some(id),
                _ => None,
            })
            .collect();
        let losses: Vec<usize> = evs
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, TensorEvent::Alloc { bytes: 512, .. }))
            .map(|(i, _)| i)
            .collect();
        let freed_at = |id: u32| evs.iter().position(|e| *e == TensorEvent::Free { id });
        // the first step's logits (the first tensor of that size) are freed
        // after the second step's loss and before its backward starts
        let first = freed_at(logits[0]).expect("freed");
        assert!(first > losses[1], "{family}");
        let next_alloc = losses[1]
            + 1
            + evs[losses[1] + 1..]
                .iter()
                .position(|e| matches!(e, TensorEvent::Alloc { .. }))
                .unwrap();
        assert!(first < next_alloc, "{family}");
    }
}

#[test]
fn the_embedding_tables_get_their_gradients_last_from_the_embedding_backward() {
    // The word, position and token-type tables' gradients come from the
    // embedding's backward, after every layer's; the head's come first.
    let gpt2_positions = SEQ * H * 4;
    let (bert_positions, bert_types) = (512 * H * 4, 2 * H * 4);
    for (family, tables) in [
        ("gpt2", vec![gpt2_positions, V * H * 4]),
        ("bert", vec![bert_types, bert_positions, V * H * 4]),
        ("llama", vec![V * H * 4]),
    ] {
        let evs = events(
            &config(family, serde_json::json!({})),
            &run(Precision::Fp32, Attention::Sdpa),
        );
        let grads: Vec<u64> = evs
            .iter()
            .filter_map(|e| match *e {
                TensorEvent::Alloc {
                    bytes,
                    category: Category::Gradients,
                    ..
                } => Some(bytes),
                _ => None,
            })
            .collect();
        let step = grads.len() / STEPS_GENERATED as usize;
        assert_eq!(grads[step - tables.len()..step], tables[..], "{family}");
        for t in &tables[..tables.len() - 1] {
            assert_eq!(count(&grads[..step], *t), 1, "{family}: {grads:?}");
        }
    }
}

/// The description of a tiny model of `model_type` (hidden 24, 3 heads, 2
/// blocks, vocabulary 1000) with `extra` keys.
fn family(model_type: &str, extra: serde_json::Value) -> crate::predict::arch::TransformerArch {
    let mut c = serde_json::json!({"model_type": model_type, "num_hidden_layers": 2,
        "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "intermediate_size": F, "ffn_dim": F, "vocab_size": V, "head_dim": HD,
        "num_layers": 1, "d_model": H, "num_heads": HEADS, "d_kv": HD, "d_ff": F,
        "num_local_experts": 4, "num_experts": 4, "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 32, "num_experts_per_tok": 2});
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let model = ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: c.as_object().unwrap().clone(),
            seq_len: SEQ as u32,
        }),
        ..ModelSpec::default()
    };
    match resolve_arch(&model).unwrap() {
        Arch::Transformer(t) => t,
        Arch::Mlp { .. } => unreachable!(),
    }
}

fn family_events(
    t: &crate::predict::arch::TransformerArch,
    p: Precision,
    a: Attention,
) -> Vec<TensorEvent> {
    training_events(&Arch::Transformer(t.clone()), &run(p, a))
}

/// The largest sum of live activations.
fn activation_peak(evs: &[TensorEvent]) -> u64 {
    let mut live = std::collections::HashMap::new();
    let (mut now, mut peak) = (0u64, 0u64);
    for e in evs {
        match *e {
            TensorEvent::Alloc {
                id,
                bytes,
                category: Category::Activations,
                ..
            } => {
                live.insert(id, bytes);
                now += bytes;
                peak = peak.max(now);
            }
            TensorEvent::Free { id } => now -= live.remove(&id).unwrap_or(0),
            TensorEvent::Alloc { .. } => {}
        }
    }
    peak
}

#[test]
fn each_family_decision_changes_the_tensors_it_describes() {
    use crate::predict::arch::{Disentangled, TransformerArch};
    type Undo = fn(&mut TransformerArch);
    let s2 = MICRO * HEADS * SEQ * SEQ;
    // (family, extra keys, the decision undone, a tensor size (bytes under
    // amp-bf16, SDPA requested) allocated more often with the decision;
    // 0: the activation peak is higher with it instead)
    let cases: Vec<(&str, serde_json::Value, Undo, u64)> = vec![
        (
            "gemma2",
            serde_json::json!({}),
            |t| t.layout.final_softcap = false,
            N * V * 2,
        ),
        // softcapping runs eager attention even when SDPA is asked for
        (
            "gemma2",
            serde_json::json!({}),
            |t| t.layout.attn_softcap = false,
            s2 * 2,
        ),
        (
            "gemma3_text",
            serde_json::json!({}),
            |t| t.layout.embed_scale = false,
            N * H * 4,
        ),
        // Granite's multiplied branches (the projections' bf16 outputs) and
        // divided logits
        (
            "granite",
            serde_json::json!({}),
            |t| t.layout.residual_scale = false,
            N * H * 2,
        ),
        (
            "granite",
            serde_json::json!({}),
            |t| t.layout.logits_scaled = false,
            N * V * 2,
        ),
        (
            "granite",
            serde_json::json!({}),
            |t| t.layout.embed_scale = false,
            N * H * 4,
        ),
        (
            "gemma3_text",
            serde_json::json!({}),
            |t| t.layout.sandwich_norms = false,
            N * 4,
        ),
        // router softmax in fp32, tokens x experts
        (
            "mixtral",
            serde_json::json!({}),
            |t| t.layout.moe = None,
            N * 4 * 4,
        ),
        // every routed token in one tensor sorted by expert (transformers'
        // grouped experts): 15 x 2 tokens, fp32 under autocast
        (
            "mixtral",
            serde_json::json!({}),
            |t| t.layout.moe = None,
            N * 2 * H * 4,
        ),
        (
            "qwen2_moe",
            serde_json::json!({}),
            |t| t.layout.moe.as_mut().unwrap().shared_ffn = 0,
            N * 32 * 2,
        ),
        // the stacks' position bias, heads x seq x seq in fp32
        (
            "t5",
            serde_json::json!({}),
            |t| t.layout.rel_buckets = 0,
            HEADS * SEQ * SEQ * 4,
        ),
        (
            "t5",
            serde_json::json!({}),
            |t| t.layout.decoder_layers = 0,
            0,
        ),
        (
            // CrossEntropyLoss on the bf16 logits: log-probabilities, the
            // nll gradient cast back and the log-softmax gradient in bf16
            "t5",
            serde_json::json!({}),
            |t| t.layout.loss_on_logits = false,
            N * V * 2,
        ),
        // T5's gated-gelu runs gelu_new: pow in fp32 under autocast and the
        // chain after it, the product and its dropout in fp32 too
        (
            "t5",
            serde_json::json!({"feed_forward_proj": "gated-gelu"}),
            |t| t.layout.gate_gelu_new = false,
            N * F * 4,
        ),
        (
            "gpt_neox",
            serde_json::json!({}),
            |t| t.layout.rotary_dims = 0,
            0,
        ),
        (
            "opt",
            serde_json::json!({}),
            |t| t.layout.separate_qkv = false,
            N * H * 2,
        ),
        (
            "opt",
            serde_json::json!({"word_embed_proj_dim": 12}),
            |t| t.layout.embed_dim = 0,
            N * 12 * 2,
        ),
        (
            "deberta-v2",
            serde_json::json!({"relative_attention": true, "position_buckets": 4,
                "pos_att_type": ["c2p", "p2c"], "share_att_key": true}),
            |t| t.layout.disentangled = None,
            s2 * 2,
        ),
        (
            "deberta-v2",
            serde_json::json!({"relative_attention": true, "position_buckets": 4,
                "pos_att_type": ["c2p", "p2c"], "share_att_key": true}),
            |t| {
                t.layout.disentangled = Some(Disentangled {
                    c2p: false,
                    ..t.layout.disentangled.unwrap()
                })
            },
            8 * HEADS * HD * 2,
        ),
    ];
    for (i, (model_type, extra, undo, size)) in cases.into_iter().enumerate() {
        let on = family(model_type, extra);
        let mut off = on.clone();
        undo(&mut off);
        let (a, b) = (
            family_events(&on, Precision::AmpBf16, Attention::Sdpa),
            family_events(&off, Precision::AmpBf16, Attention::Sdpa),
        );
        if size == 0 {
            assert!(
                activation_peak(&a) > activation_peak(&b),
                "case {i} ({model_type})"
            );
        } else {
            // OPT's separate projections: their casts are the forward's
            // (the fused one's backward runs the flash kernel's)
            let window = |evs: &[TensorEvent]| -> Vec<TensorEvent> {
                if model_type == "opt" && size == N * H * 2 {
                    first_blocks(evs).to_vec()
                } else {
                    evs.to_vec()
                }
            };
            let (ca, cb) = (
                count(&acts(&window(&a)), size),
                count(&acts(&window(&b)), size),
            );
            assert!(
                ca > cb,
                "case {i} ({model_type}): {ca} vs {cb} of {size} bytes"
            );
        }
    }
}

#[test]
fn decisions_that_lower_memory_lower_it() {
    use crate::predict::arch::TransformerArch;
    type Undo = fn(&mut TransformerArch);
    // (family, the decision undone): the peak of live activations is lower with it
    let cases: Vec<(&str, Undo)> = vec![
        ("opt", |t| t.layout.relu = false),
        ("gpt_neox", |t| t.layout.parallel_residual = false),
    ];
    for (model_type, undo) in cases {
        let on = family(model_type, serde_json::json!({}));
        let mut off = on.clone();
        undo(&mut off);
        let a = activation_peak(&family_events(&on, Precision::AmpBf16, Attention::Sdpa));
        let b = activation_peak(&family_events(&off, Precision::AmpBf16, Attention::Sdpa));
        assert!(a < b, "{model_type}: {a} vs {b}");
    }
}

#[test]
fn an_image_classifier_predicts_one_class_row_per_image_not_per_token() {
    // 2 x 2 patches + the class token: 5 tokens, the run's sequence
    let t = family(
        "vit",
        serde_json::json!({"image_size": 16, "patch_size": 8, "num_labels": 7}),
    );
    assert_eq!((t.seq_len, t.vocab), (SEQ, 7));
    let sizes = acts(&family_events(&t, Precision::Fp32, Attention::Sdpa));
    assert!(count(&sizes, MICRO * 7 * 4) > 0);
    assert_eq!(count(&sizes, N * 7 * 4), 0);
    // a sequence that is not the image's tokens is refused
    let mut c = serde_json::json!({"model_type": "vit", "image_size": 16, "patch_size": 8});
    let err = crate::predict::hf::arch_from_hugging_face(&HuggingFaceSpec {
        config: c.as_object_mut().unwrap().clone(),
        seq_len: 6,
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("seqLen must be 5"), "{err}");
}

/// The events of the first micro-step's forward, up to the loss.
fn first_forward(evs: &[TensorEvent]) -> &[TensorEvent] {
    let loss = evs
        .iter()
        .position(|e| matches!(e, TensorEvent::Alloc { bytes: 512, .. }))
        .expect("the loss");
    &evs[..=loss]
}

/// The events of the first micro-step's blocks: from the step's first event
/// to the first vocabulary-sized tensor (the head's logits).
fn first_blocks(evs: &[TensorEvent]) -> &[TensorEvent] {
    let logits = evs
        .iter()
        .position(|e| {
            matches!(e, TensorEvent::Alloc { bytes, category: Category::Activations, .. }
                if *bytes >= N * V)
        })
        .expect("the logits");
    &evs[..logits]
}

/// The most activations alive at once in `evs`.
fn most_live_activations(evs: &[TensorEvent]) -> usize {
    let mut live = std::collections::HashSet::new();
    let mut most = 0;
    for e in evs {
        match *e {
            TensorEvent::Alloc {
                id,
                category: Category::Activations,
                ..
            } => {
                live.insert(id);
                most = most.max(live.len());
            }
            TensorEvent::Free { id } => {
                live.remove(&id);
            }
            _ => {}
        }
    }
    most
}

#[test]
fn a_checkpointed_blocks_first_forward_keeps_nothing_for_backward() {
    // Without autograd every tensor dies when the modelling code drops it
    // (the norm's fp32 copy at `x * rsqrt`, the attention's when it
    // returns, the feed-forward's product after the down projection). With
    // autograd a block holds about twenty tensors at its end; the
    // checkpointed first forward holds the block inputs, the step's ids,
    // labels and rotary tables, and a few temporaries.
    for family in ["gpt2", "llama", "bert"] {
        for p in PRECISIONS {
            let cfg = config(family, serde_json::json!({}));
            let ckpt = RunShape {
                checkpointing: true,
                ..run(p, Attention::Sdpa)
            };
            let plain = run(p, Attention::Sdpa);
            let with_ckpt = most_live_activations(first_blocks(&events(&cfg, &ckpt)));
            let without = most_live_activations(first_blocks(&events(&cfg, &plain)));
            assert!(with_ckpt <= 18, "{family} {p:?}: {with_ckpt} alive at once");
            assert!(
                without >= 2 * with_ckpt,
                "{family} {p:?}: {without} / {with_ckpt}"
            );
        }
    }
}

#[test]
fn under_autocast_a_checkpointed_forward_casts_each_weight_at_its_matmul_and_keeps_the_casts_to_the_loss()
 {
    // Autocast casts a weight at the matmul that first uses it and keeps the
    // cast in its cache until the forward leaves the autocast context, after
    // the loss (the H200's recorded LLaMA and GPT-2 runs free every block's
    // casts together there); backward's recomputation casts again.
    for family in ["gpt2", "llama", "bert"] {
        let cfg = config(family, serde_json::json!({}));
        let shape = RunShape {
            checkpointing: true,
            ..run(Precision::AmpBf16, Attention::Sdpa)
        };
        let evs = events(&cfg, &shape);
        let blocks = first_blocks(&evs).len();
        let fwd = first_forward(&evs);
        // the model's own parameters come before the step's first activation
        let start = first_activation(fwd);
        let model = ModelSpec {
            hugging_face: Some(HuggingFaceSpec {
                config: cfg.as_object().unwrap().clone(),
                seq_len: SEQ as u32,
            }),
            ..ModelSpec::default()
        };
        let Arch::Transformer(t) = resolve_arch(&model).unwrap() else {
            panic!("a transformer")
        };
        let in_blocks = t
            .param_tensors()
            .iter()
            .filter(|p| p.layer.is_some() && p.matmul_weight)
            .count();
        // the blocks' casts (the head's are kept for the head's backward)
        let casts: Vec<u32> = fwd[start..]
            .iter()
            .filter_map(|e| match *e {
                TensorEvent::Alloc {
                    id,
                    category: Category::Parameters,
                    ..
                } => Some(id),
                _ => None,
            })
            .take(in_blocks)
            .collect();
        assert_eq!(casts.len(), in_blocks, "{family}");
        // made at the matmuls: never two casts in a row
        let mut seen = 0;
        for pair in fwd[start..blocks].windows(2) {
            if is_cast(&pair[0]) {
                seen += 1;
                if seen <= in_blocks {
                    assert!(!is_cast(&pair[1]), "{family}: two casts made together");
                }
            }
        }
        assert!(seen >= in_blocks, "{family}: {seen} casts of {in_blocks}");
        // none freed before the loss; all freed before backward allocates
        let freed_in_fwd = fwd
            .iter()
            .filter(|e| matches!(e, TensorEvent::Free { id } if casts.contains(id)))
            .count();
        assert_eq!(freed_in_fwd, 0, "{family}");
        let rest = &evs[fwd.len()..];
        let first_backward_alloc = rest
            .iter()
            .position(|e| matches!(e, TensorEvent::Alloc { bytes, .. } if *bytes != 512))
            .unwrap();
        for id in &casts {
            assert!(
                rest[..first_backward_alloc].contains(&TensorEvent::Free { id: *id }),
                "{family}: cast {id} outlives the forward"
            );
        }
    }
}

#[test]
fn phi3s_attention_projects_once_and_concatenates_its_rotary_embeddings() {
    // Phi-3's qkv_proj makes one output whose queries, keys and values are
    // views; apply_rotary_pos_emb concatenates the rotated queries and keys
    // with their (empty) unrotated rest, one more copy each.
    let cfg = serde_json::json!({"model_type": "phi3", "num_hidden_layers": 2,
        "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "intermediate_size": F, "vocab_size": V});
    let model = ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: cfg.as_object().unwrap().clone(),
            seq_len: SEQ as u32,
        }),
        ..ModelSpec::default()
    };
    let arch = resolve_arch(&model).unwrap();
    let shape = run(Precision::Bf16, Attention::Sdpa);
    let phi3 = training_events(&arch, &shape);
    let Arch::Transformer(mut t) = arch else {
        panic!("a transformer")
    };
    t.layout.rotary_cat = false;
    let no_cat = training_events(&Arch::Transformer(t.clone()), &shape);
    t.layout.fused_qkv = false;
    let three = training_events(&Arch::Transformer(t), &shape);
    let fwd = |evs: &[TensorEvent]| acts(first_forward(evs));
    // one qkv output per block (three separate projections: none)
    assert_eq!(count(&fwd(&phi3), N * 3 * H * 2), 2);
    assert_eq!(count(&fwd(&three), N * 3 * H * 2), 0);
    // the fused views are not separate tensors: three projections allocate
    // three more outputs per block
    assert_eq!(fwd(&three).len(), fwd(&no_cat).len() - 2 + 3 * 2);
    // two more copies (queries, keys) per block
    assert_eq!(fwd(&phi3).len(), fwd(&no_cat).len() + 2 * 2);
    assert_eq!(
        count(&fwd(&phi3), N * H * 2),
        count(&fwd(&no_cat), N * H * 2) + 2 * 2
    );
}

#[test]
fn with_autograd_a_blocks_weight_casts_are_made_together_at_its_start() {
    // Only the checkpointed first forward makes them at their matmuls (see
    // `lazy_casts`): made so in forwards with autograd too, the held-out
    // set's p90 went from 4.3 % to 5.9 %.
    for family in ["gpt2", "llama", "bert"] {
        let cfg = config(family, serde_json::json!({}));
        let evs = events(&cfg, &run(Precision::AmpBf16, Attention::Sdpa));
        let fwd = first_forward(&evs);
        let start = first_activation(fwd);
        let first = start + fwd[start..].iter().position(is_cast).unwrap();
        assert!(
            is_cast(&fwd[first + 1]),
            "{family}: the block's casts apart"
        );
    }
}

/// The longest run of weight casts made one after the other in `evs`.
fn longest_run_of_casts(evs: &[TensorEvent]) -> usize {
    let (mut run, mut longest) = (0, 0);
    for e in evs {
        if matches!(
            e,
            TensorEvent::Alloc {
                category: Category::Parameters,
                ..
            }
        ) {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    longest
}

#[test]
fn blocks_whose_matmuls_the_generator_does_not_walk_make_their_casts_at_their_start() {
    // A mixture of experts, DeBERTa's disentangled attention, T5's decoder
    // blocks (their cross-attention) and an image model's blocks ask for no
    // casts at their matmuls: even in a checkpointed first forward the
    // block's casts are made together at its start.
    let cases = [
        ("mixtral", serde_json::json!({}), 0),
        (
            "deberta-v2",
            serde_json::json!({"relative_attention": true, "position_buckets": 4,
                "pos_att_type": ["c2p", "p2c"], "share_att_key": true}),
            0,
        ),
        // one encoder block, then the decoder block
        ("t5", serde_json::json!({}), 1),
        (
            "vit",
            serde_json::json!({"image_size": 16, "patch_size": 8}),
            0,
        ),
    ];
    for (model_type, extra, block) in cases {
        let t = family(model_type, extra);
        let casts = t
            .param_tensors()
            .iter()
            .filter(|p| p.layer == Some(block) && p.matmul_weight)
            .count();
        let shape = RunShape {
            checkpointing: true,
            ..run(Precision::AmpBf16, Attention::Sdpa)
        };
        let evs = training_events(&Arch::Transformer(t), &shape);
        // the head's casts (one or two) come after the blocks
        let blocks = first_forward(&evs);
        let start = first_activation(blocks);
        assert!(casts >= 4, "{model_type}: {casts}");
        assert_eq!(
            longest_run_of_casts(&blocks[start..]),
            casts,
            "{model_type}"
        );
    }
}

#[test]
fn without_autograd_the_attentions_fp32_inputs_live_until_it_returns_and_its_casts_die_with_the_kernel()
 {
    // LLaMA under autocast: the rotary embeddings are fp32; SDPA runs on
    // their bf16 casts. Nothing keeps the casts once the kernel's output
    // exists, while the fp32 queries and keys stay in their variables until
    // the attention returns (after o_proj).
    let cfg = config("llama", serde_json::json!({}));
    let shape = RunShape {
        checkpointing: true,
        ..run(Precision::AmpBf16, Attention::Sdpa)
    };
    let evs = events(&cfg, &shape);
    let fwd = first_forward(&evs);
    let lse = MICRO * HEADS * SEQ * 4;
    let mut after_lse = false;
    let live = live_activations_until(fwd, |bytes, category| {
        if category != Category::Activations {
            return false;
        }
        let o_proj = after_lse && bytes == N * H * 2;
        after_lse |= bytes == lse;
        o_proj
    })
    .expect("no o_proj after the log-sum-exp");
    // o_proj's output. Alive in fp32: the block input, the norm's output,
    // the rotary queries and keys; in bf16 of this size: the values (bf16
    // already) and SDPA's output, not the casts of the queries and keys.
    let fp32 = live.values().filter(|&&b| b == N * H * 4).count();
    let bf16 = live.values().filter(|&&b| b == N * H * 2).count();
    assert_eq!(fp32, 4, "fp32 tensors alive at o_proj");
    assert_eq!(bf16, 2, "the kernel's casts outlived it");
}

#[test]
fn gpt_neox_with_its_cache_keeps_the_caches_copies_not_its_fused_output() {
    // With the cache, attention reads the cache's copies of the rotated keys
    // and of the values: nothing keeps the fused query/key/value output (the
    // values' storage) or the rotated keys for backward. Without it (as
    // under checkpointing) SDPA keeps the values, a view of that output.
    for p in [Precision::Fp32, Precision::AmpBf16] {
        let w = widths(p);
        let cached = family("gpt_neox", serde_json::json!({}));
        let uncached = family("gpt_neox", serde_json::json!({"use_cache": false}));
        let a = alive_when_backward_starts(&family_events(&cached, p, Attention::Sdpa));
        let b = alive_when_backward_starts(&family_events(&uncached, p, Attention::Sdpa));
        let qkv = N * 3 * H * w.c;
        assert_eq!(count(&a, qkv), 0, "{p:?}");
        assert_eq!(count(&b, qkv), 2, "{p:?}");
        // Per block, with the cache: its copies of the keys and values
        // replace the rotated keys; under autocast (where they and the
        // rotated queries are fp32, the same number) SDPA keeps three casts
        // of its own.
        let (e, c) = (N * H * w.e, N * H * w.c);
        if w.amp {
            assert_eq!(count(&a, e), count(&b, e), "{p:?}");
            assert_eq!(count(&a, c), count(&b, c) + 2 * 3, "{p:?}");
        } else {
            assert_eq!(count(&a, e), count(&b, e) + 2, "{p:?}");
        }
    }
}

#[test]
fn t5s_outputs_keep_both_caches_of_each_decoder_block_in_the_projections_width() {
    // T5's decoder fills an `EncoderDecoderCache`: each decoder block copies
    // its self-attention's keys and values and its cross-attention's (over
    // the encoder's output) into it, and `outputs` keeps the copies until
    // the next forward returns. Keys without rotary embedding are the
    // projections' output, in the compute width (bf16 under autocast); the
    // encoder keeps no cache.
    let t = family("t5", serde_json::json!({}));
    let decoder = t.layout.decoder_layers;
    assert!(decoder > 0 && decoder < t.layers);
    let uncached = family("t5", serde_json::json!({"use_cache": false}));
    for p in [Precision::Fp32, Precision::AmpBf16, Precision::Bf16] {
        let w = widths(p);
        let kv = N * HEADS * HD * w.c;
        for a in [Attention::Sdpa, Attention::Eager] {
            let end = alive_at_end(&family_events(&t, p, a));
            let mut outputs = vec![N * V * w.c];
            outputs.extend(std::iter::repeat_n(kv, 4 * decoder as usize));
            outputs.sort_unstable();
            assert_eq!(end["activations"], outputs, "{p:?} {a:?}");
            let end = alive_at_end(&family_events(&uncached, p, a));
            assert_eq!(end["activations"], vec![N * V * w.c], "{p:?} {a:?}");
        }
    }
}

#[test]
fn gemma2s_final_softcap_makes_three_logit_gradients_and_frees_its_tanh_after_the_second() {
    // `logits / cap`, tanh (kept), `* cap`; backward: the gradient of each
    // in the logits' width, the kept tanh going after tanh's own (the
    // recorded Gemma 2 autocast runs), all before the head's matmul node.
    for p in [Precision::AmpBf16, Precision::Bf16, Precision::Fp32] {
        let w = widths(p);
        let capped = family("gemma2", serde_json::json!({}));
        let plain = family(
            "gemma2",
            serde_json::json!({"final_logit_softcapping": null}),
        );
        assert!(capped.layout.final_softcap && !plain.layout.final_softcap);
        let logits = N * V * w.c;
        let after_loss = |t: &crate::predict::arch::TransformerArch| {
            let evs = family_events(t, p, Attention::Eager);
            let loss = evs
                .iter()
                .position(|e| matches!(e, TensorEvent::Alloc { bytes: 512, .. }))
                .unwrap();
            let size = |id: u32| {
                evs.iter().find_map(|e| match *e {
                    TensorEvent::Alloc { id: i, bytes, .. } if i == id => Some(bytes),
                    _ => None,
                })
            };
            // until the head's weight gradient (the table's size)
            evs[loss + 1..]
                .iter()
                .map(|e| match *e {
                    TensorEvent::Alloc { bytes, .. } => (true, bytes),
                    TensorEvent::Free { id } => (false, size(id).unwrap()),
                })
                .take_while(|&(alloc, bytes)| !(alloc && bytes == V * H * w.c))
                .collect::<Vec<_>>()
        };
        let (a, b) = (after_loss(&capped), after_loss(&plain));
        let made = |x: &[(bool, u64)]| x.iter().filter(|&&(al, by)| al && by == logits).count();
        assert_eq!(made(&a), made(&b) + 3, "{p:?}: {a:?}");
        // each gradient frees the one before it; the tanh goes after its own
        let (alloc, free) = ((true, logits), (false, logits));
        assert_eq!(
            a[a.len() - 7..],
            [alloc, free, alloc, free, free, alloc, free],
            "{p:?}"
        );
    }
}

#[test]
fn eager_attention_keeps_an_fp32_softmax_only_where_the_family_asks_for_one() {
    // OPT, GPT-NeoX and the LLaMA family call `softmax(..., dtype=float32)`
    // and cast the result back: in pure bf16 autograd keeps the fp32
    // probabilities (OPT-350m in bf16 was 33 % under without them). GPT-2,
    // BERT and T5 take the softmax in the scores' dtype (T5 in bf16 was
    // 14 % over with an fp32 one).
    for (model_type, fp32) in [
        ("opt", true),
        ("gpt_neox", true),
        ("llama", true),
        ("gpt2", false),
        ("bert", false),
        ("t5", false),
    ] {
        let t = family(model_type, serde_json::json!({"use_cache": false}));
        let probs32 = MICRO * t.heads * SEQ * SEQ * 4;
        let kept =
            alive_when_backward_starts(&family_events(&t, Precision::Bf16, Attention::Eager));
        let blocks = t.layers as usize;
        let cross = t.layout.decoder_layers as usize;
        assert_eq!(
            count(&kept, probs32),
            if fp32 { blocks + cross } else { 0 },
            "{model_type}: {kept:?}"
        );
    }
}

#[test]
fn debertas_gathers_keep_their_inputs_and_its_score_is_summed_in_place() {
    // disentangled_attention_bias: per term (c2p, p2c) the batch x heads x
    // seq x rows product, kept by `torch.gather`; the gather, divided by
    // the scale and summed into `score` (a new tensor for the first term,
    // in place for the second).
    let on = family(
        "deberta-v2",
        serde_json::json!({"relative_attention": true, "position_buckets": 7,
            "pos_att_type": ["c2p", "p2c"], "share_att_key": true}),
    );
    let mut off = on.clone();
    off.layout.disentangled = None;
    // 2 x 7 relative positions: a size no other tensor has
    let rows = on.layout.disentangled.unwrap().rel_rows;
    assert_eq!(rows, 14);
    let layers = on.layers;
    for p in [Precision::Fp32, Precision::AmpBf16] {
        let w = widths(p);
        let a = family_events(&on, p, Attention::Eager);
        let b = family_events(&off, p, Attention::Eager);
        let product = MICRO * HEADS * SEQ * rows * w.c;
        assert_eq!(
            count(&alive_when_backward_starts(&a), product),
            2 * layers as usize,
            "{p:?}"
        );
        // two gathers, two divisions and one score per block, and the
        // score's sum with the product; without the relative term the
        // product of the scaled keys is the scores
        let s2 = MICRO * HEADS * SEQ * SEQ * w.c;
        let fwd = |evs: &[TensorEvent]| count(&acts(first_forward(evs)), s2);
        assert_eq!(fwd(&a), fwd(&b) + 6 * layers as usize, "{p:?}");
    }
}

#[test]
fn debertas_encoder_holds_its_mask_and_under_autocast_every_block_input_until_it_returns() {
    // DebertaV2Model calls its encoder with `output_hidden_states=True`:
    // under autocast, where a block keeps only casts of its input, the
    // inputs live on in the encoder's list until it returns, beside the
    // `[batch, 1, seq, seq]` int64 mask it builds (kept to the backward by
    // a checkpoint, whose input it is).
    let on = family("deberta-v2", serde_json::json!({}));
    let mut off = on.clone();
    off.layout.keeps_hidden_states = false;
    let mask = MICRO * SEQ * SEQ * 8;
    let layers = on.layers as usize;
    for (p, ckpt) in [
        (Precision::AmpBf16, false),
        (Precision::Fp32, false),
        (Precision::AmpBf16, true),
    ] {
        let w = widths(p);
        let shape = RunShape {
            checkpointing: ckpt,
            ..run(p, Attention::Eager)
        };
        let evs = |t: &crate::predict::arch::TransformerArch| {
            training_events(&Arch::Transformer(t.clone()), &shape)
        };
        let (a, b) = (evs(&on), evs(&off));
        // alive at the last block's feed-forward product (each block makes
        // two tensors of its size: the product and the activation)
        let at_last_ffn = |evs: &[TensorEvent]| {
            let mut seen = 0;
            let live = live_activations_until(evs, |bytes, _| {
                seen += usize::from(bytes == N * F * w.c);
                seen == 2 * layers - 1
            })
            .expect("the last block's product");
            live.into_values().collect::<Vec<u64>>()
        };
        let at_logits = |evs: &[TensorEvent]| {
            let live =
                live_activations_until(evs, |bytes, _| bytes == N * V * w.c).expect("the logits");
            live.into_values().collect::<Vec<u64>>()
        };
        let inputs = |live: &[u64]| count(live, N * H * w.r);
        assert_eq!(count(&at_last_ffn(&a), mask), 1, "{p:?} ckpt {ckpt}");
        assert_eq!(
            count(&at_logits(&a), mask),
            usize::from(ckpt),
            "{p:?} ckpt {ckpt}"
        );
        let held = if w.amp && !ckpt { layers } else { 0 };
        assert_eq!(
            inputs(&at_last_ffn(&a)),
            inputs(&at_last_ffn(&b)) + held,
            "{p:?} ckpt {ckpt}"
        );
    }
}

#[test]
fn every_family_frees_each_tensor_once_and_starts_each_step_from_what_the_last_one_left() {
    // Whatever a family's modelling keeps or frees early (DeBERTa's encoder
    // and attention locals, T5's math-path attention), every free names a
    // live tensor and no step leaves more behind than the one before: every
    // supported family, DeBERTa's relative attention, T5's gated
    // feed-forward, and sliding windows the sequence reaches.
    let relative = serde_json::json!({"relative_attention": true, "position_buckets": 4,
        "pos_att_type": ["c2p", "p2c"]});
    // windows the sequence reaches: with grouped key/value heads, one, or
    // as many as the queries', fused projections, the key/value cache
    let window = |extra: serde_json::Value| {
        let mut w = serde_json::json!({"sliding_window": SEQ, "use_sliding_window": true,
            "max_window_layers": 1});
        w.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        w
    };
    let mut families = vec![
        ("deberta-v2", relative),
        ("t5", serde_json::json!({"feed_forward_proj": "gated-gelu"})),
        (
            "mistral",
            window(
                serde_json::json!({"num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8}),
            ),
        ),
        (
            "gemma3_text",
            window(serde_json::json!({"num_key_value_heads": 1})),
        ),
        ("phi3", window(serde_json::json!({}))),
        ("qwen2", window(serde_json::json!({"use_cache": false}))),
    ];
    for model_type in crate::predict::hf::supported_model_types() {
        // an image of 2 x 2 patches and its class token: the 5 tokens
        let extra = match model_type {
            "vit" => serde_json::json!({"image_size": 16, "patch_size": 8}),
            _ => serde_json::json!({}),
        };
        families.push((model_type, extra));
    }
    for (model_type, extra) in families {
        let t = family(model_type, extra.clone());
        for p in PRECISIONS {
            for a in [Attention::Sdpa, Attention::Eager] {
                for checkpointing in [false, true] {
                    let shape = RunShape {
                        checkpointing,
                        ..run(p, a)
                    };
                    let evs = training_events(&Arch::Transformer(t.clone()), &shape);
                    let case = format!("{model_type} {extra} {p:?} {a:?} ckpt {checkpointing}");
                    let mut live: BTreeMap<u32, u64> = BTreeMap::new();
                    // live activation bytes where each micro-step's input ids come
                    let mut at_starts = Vec::new();
                    let mut last_alloc = 0;
                    for e in &evs {
                        match *e {
                            TensorEvent::Alloc {
                                id,
                                bytes,
                                category,
                                ..
                            } => {
                                if category == Category::Activations {
                                    if bytes == N * 8 && last_alloc == N * 8 {
                                        at_starts.push(live.values().sum::<u64>() - N * 8);
                                    }
                                    last_alloc = bytes;
                                    live.insert(id, bytes);
                                }
                            }
                            TensorEvent::Free { id } => {
                                let known = live.remove(&id).is_some()
                                    || evs.iter().any(|x| {
                                        matches!(x, TensorEvent::Alloc { id: a, category, .. }
                                            if *a == id && *category != Category::Activations)
                                    });
                                assert!(known, "{case}: free of {id}, not live");
                            }
                        }
                    }
                    assert!(at_starts.len() >= 3, "{case}: {at_starts:?}");
                    assert_eq!(at_starts[1], at_starts[2], "{case}: {at_starts:?}");
                    // every parameter gets its gradient once a step, whatever
                    // kernel's backward read the matmul's output
                    let grads = super::tests::sizes(&evs, Category::Gradients);
                    assert_eq!(
                        grads.len(),
                        STEPS_GENERATED as usize * t.param_tensors().len(),
                        "{case}"
                    );
                }
            }
        }
    }
}

#[test]
fn debertas_attention_frees_its_locals_when_it_returns() {
    // It returns no probabilities: the key copy, the filled scores, the
    // fp32 probabilities and the mask's bool view die before the output
    // projection, where BERT's layer holds its probabilities to its end.
    let deberta = family("deberta-v2", serde_json::json!({}));
    let mut bert_like = deberta.clone();
    bert_like.layout.own_attention = false;
    let w = widths(Precision::AmpBf16);
    let at_ffn = |t: &crate::predict::arch::TransformerArch| {
        let evs = family_events(t, Precision::AmpBf16, Attention::Eager);
        let live = live_activations_until(&evs, |bytes, _| bytes == N * F * w.c)
            .expect("the first feed-forward product");
        live.into_values().collect::<Vec<u64>>()
    };
    // each projection's heads-first copy and the scaled keys: four more
    // tensors of the hidden width per block
    let made = |t: &crate::predict::arch::TransformerArch| {
        let evs = family_events(t, Precision::AmpBf16, Attention::Eager);
        count(&acts(first_blocks(&evs)), N * H * w.c)
    };
    assert_eq!(
        made(&deberta),
        made(&bert_like) + 4 * deberta.layers as usize
    );
    let (a, b) = (at_ffn(&deberta), at_ffn(&bert_like));
    // fp32 probabilities: kept as a local by BERT's layer only
    assert_eq!(count(&a, S2 * 4), 1, "the kept softmax output");
    assert_eq!(count(&b, S2 * 4), 2);
    // the filled scores and the mask's bool view are gone; its negation,
    // which masked_fill keeps, stays
    assert_eq!(count(&a, S2 * w.c), count(&b, S2 * w.c));
    assert_eq!(count(&a, MICRO * SEQ * SEQ), 1);
}

/// Where the step's first activation is allocated (the model's parameters
/// come before it).
fn first_activation(evs: &[TensorEvent]) -> usize {
    evs.iter()
        .position(|e| {
            matches!(
                e,
                TensorEvent::Alloc {
                    category: Category::Activations,
                    ..
                }
            )
        })
        .expect("an activation")
}

/// An autocast weight cast (a parameter-sized allocation in a step).
fn is_cast(e: &TensorEvent) -> bool {
    matches!(
        e,
        TensorEvent::Alloc {
            category: Category::Parameters,
            ..
        }
    )
}

#[test]
fn eager_scores_die_where_the_library_rebinds_them() {
    // LLaMA's eager attention: `softmax(scores, dtype=float32).to(dtype)`.
    // In bf16 the softmax converts its bf16 input first and the bf16 sum
    // is rebound only after the cast (the H200's bf16 LLaMA GQA run: -6.9 %
    // -> -0.1 % with both); under autocast the sum is already fp32 and
    // goes right after the softmax.
    for (p, mw, alive) in [(Precision::Bf16, 2, true), (Precision::AmpBf16, 4, false)] {
        let evs = events(
            &config("llama", serde_json::json!({})),
            &run(p, Attention::Eager),
        );
        let mut live = std::collections::BTreeMap::new();
        let mut masked = None;
        let mut softmax_seen = false;
        let mut checked = 0;
        // the first forward, up to the fp32 logits
        let loss = evs
            .iter()
            .position(|e| matches!(e, TensorEvent::Alloc { bytes, .. } if *bytes == N * V * 4))
            .unwrap();
        for e in &evs[..loss] {
            match *e {
                TensorEvent::Alloc { id, bytes, .. } => {
                    if bytes == S2 * 4 && masked.is_some() {
                        softmax_seen = true;
                    } else if bytes == S2 * mw && !softmax_seen {
                        masked = Some(id);
                    } else if bytes == S2 * 2 && softmax_seen {
                        // the probabilities' cast
                        let m = masked.take().unwrap();
                        assert_eq!(live.contains_key(&m), alive, "{p:?}");
                        softmax_seen = false;
                        checked += 1;
                    }
                    live.insert(id, bytes);
                }
                TensorEvent::Free { id } => {
                    live.remove(&id);
                }
            }
        }
        assert!(checked >= 2, "{p:?}: {checked}");
    }
}

#[test]
fn a_bf16_softmax_into_fp32_converts_its_input_and_an_fp16_one_does_not() {
    // ATen's softmax(x, dim, dtype=float32): CUDA's fused half_to_float
    // kernel for fp16 (no copy, the fp16 gradient written directly); a bf16
    // input is converted to fp32 first and its fp32 gradient cast back.
    let cfg = config("llama", serde_json::json!({}));
    let fp32_scores = |p: Precision| {
        let evs = events(&cfg, &run(p, Attention::Eager));
        let fwd = count(&acts(first_forward(&evs)), S2 * 4);
        let all = count(&acts(&evs), S2 * 4);
        (fwd, all)
    };
    let (bf16_fwd, bf16_all) = fp32_scores(Precision::Bf16);
    let (fp16_fwd, fp16_all) = fp32_scores(Precision::Fp16);
    // per block: the converted copy beside the probabilities (2 blocks)
    assert_eq!(bf16_fwd, fp16_fwd + 2, "{bf16_fwd} {fp16_fwd}");
    // and in backward the fp32 gradients that fp16 writes in fp16
    assert!(bf16_all > fp16_all + 2, "{bf16_all} {fp16_all}");
}

#[test]
fn a_librarys_experts_run_grouped_and_only_qwen2_moe_has_a_shared_expert() {
    // 15 tokens, top-2 of 4 experts: transformers sorts all 30 routed tokens
    // into one tensor (fp32 under autocast), not 8 a expert in a loop.
    for p in [Precision::Fp32, Precision::AmpBf16] {
        let w = widths(p);
        let ew = if w.amp { 4 } else { w.c };
        let mixtral = family("mixtral", serde_json::json!({}));
        let grouped = acts(first_forward(&family_events(&mixtral, p, Attention::Sdpa))).to_vec();
        let (sorted, per_expert) = (N * 2 * H * ew, 8 * H * w.c);
        assert!(
            count(&grouped, sorted) >= 2 && count(&grouped, per_expert) == 0,
            "{p:?}"
        );
        // Qwen2-MoE's shared expert: its sigmoid gate (a value a token) in
        // each of the 2 blocks; without it, no gate and nothing of no size
        let qwen = family("qwen2_moe", serde_json::json!({}));
        let mut unshared = qwen.clone();
        unshared.layout.moe.as_mut().unwrap().shared_ffn = 0;
        let with = acts(first_forward(&family_events(&qwen, p, Attention::Sdpa))).to_vec();
        let without = acts(first_forward(&family_events(&unshared, p, Attention::Sdpa))).to_vec();
        assert_eq!(count(&with, N * w.c), count(&without, N * w.c) + 2, "{p:?}");
        assert_eq!(count(&without, 0), 0, "{p:?}");
    }
}

#[test]
fn the_final_rmsnorms_fp32_input_lives_until_its_backward_has_read_it() {
    // In pure bf16 the final RMSNorm keeps an fp32 copy of its input, which
    // its backward (right after the head's) reads last, in pow's: five fp32
    // tensors of that size come while the copy is alive, the most backward
    // adds to what the loss left. The blocks' norms reach four beside it,
    // once the final norm's copy is gone.
    let evs = events(
        &config("llama", serde_json::json!({})),
        &run(Precision::Bf16, Attention::Sdpa),
    );
    let fp32 = N * H * 4;
    let at_start = alive_when_backward_starts(&evs)
        .iter()
        .filter(|&&b| b == fp32)
        .count();
    let mut live: BTreeMap<u32, u64> = BTreeMap::new();
    let (mut loss_seen, mut most) = (false, 0);
    for e in &evs {
        if let TensorEvent::Free { id } = *e {
            live.remove(&id);
        } else if let TensorEvent::Alloc {
            id,
            bytes,
            category,
            ..
        } = *e
            && category == Category::Activations
        {
            if loss_seen && bytes == N * 8 {
                break; // the next forward
            }
            loss_seen |= bytes == 512;
            live.insert(id, bytes);
        }
        if loss_seen {
            most = most.max(live.values().filter(|&&b| b == fp32).count());
        }
    }
    assert_eq!(most - at_start, 5);
}

#[test]
fn grouped_experts_keep_one_activation_and_one_product_whatever_their_width() {
    // The grouped experts keep gate_up's output, act(gate), act(gate) * up
    // and down's output: as many tensors when the experts' two projections
    // together are as wide as the hidden size as when they are not.
    let allocations = |moe_ffn: u64| {
        let t = family(
            "mixtral",
            serde_json::json!({"moe_intermediate_size": moe_ffn,
            "intermediate_size": moe_ffn}),
        );
        family_events(&t, Precision::AmpBf16, Attention::Sdpa)
            .iter()
            .filter(|e| matches!(e, TensorEvent::Alloc { .. }))
            .count()
    };
    assert_eq!(allocations(H / 2), allocations(H / 2 + 4));
}

#[test]
fn each_familys_forward_runs_a_matmul_for_each_weight_in_order() {
    // A block's weight gradients are made at its matmuls' nodes, found by
    // the forward's matmuls in the order of the parameters: a family whose
    // forward skips one (T5's cross-attention did) would give the rest the
    // wrong weights. Mixtures of experts and DeBERTa keep their gradients
    // after the block.
    for model_type in crate::predict::hf::supported_model_types() {
        let image = serde_json::json!({"image_size": 16, "patch_size": 8});
        let t = family(
            model_type,
            if model_type == "vit" {
                image
            } else {
                serde_json::json!({})
            },
        );
        for p in PRECISIONS {
            for checkpointing in [false, true] {
                let shape = RunShape {
                    checkpointing,
                    ..run(p, Attention::Sdpa)
                };
                let left = matmul_weights_left(&Arch::Transformer(t.clone()), &shape);
                assert_eq!(
                    left,
                    Vec::<usize>::new(),
                    "{model_type} {p:?} checkpointing {checkpointing}"
                );
            }
        }
    }
}

#[test]
fn a_matmuls_weight_gradient_comes_before_its_inputs_inside_the_blocks_backward() {
    // The H200's recorded Qwen2 bf16 run: down_proj's weight gradient, then
    // the gradient of the product it read, then the product is freed; the
    // rest of the block's backward follows. Made after the block instead,
    // the gradients left the freed loss segments' holes to the next step's
    // logits (-16.3 % on that run).
    let evs = events(
        &config("llama", serde_json::json!({})),
        &run(Precision::Bf16, Attention::Sdpa),
    );
    let loss = evs
        .iter()
        .position(|e| matches!(e, TensorEvent::Alloc { bytes: 512, .. }))
        .unwrap();
    let allocs: Vec<(u64, Category)> = evs[loss..]
        .iter()
        .filter_map(|e| match *e {
            TensorEvent::Alloc {
                bytes, category, ..
            } => Some((bytes, category)),
            TensorEvent::Free { .. } => None,
        })
        .collect();
    let down = allocs
        .iter()
        .position(|&(b, c)| c == Category::Gradients && b == H * F * 2)
        .unwrap();
    assert_eq!(allocs[down + 1], (N * F * 2, Category::Activations));
    // and the block's backward goes on after it, up to the attention
    // output projection's weight gradient
    let o_proj = allocs[down..]
        .iter()
        .position(|&(b, c)| c == Category::Gradients && b == H * H * 2)
        .unwrap();
    let before_o_proj = &allocs[down..down + o_proj];
    assert!(
        before_o_proj
            .iter()
            .filter(|&&(b, c)| c == Category::Activations && b == N * F * 2)
            .count()
            >= 3,
        "{before_o_proj:?}"
    );
}

#[test]
fn the_attention_weights_live_until_the_layer_returns() {
    // BERT under autocast, eager, with attention dropout: the fp32
    // softmax output (kept) and the fp32 dropout output, which the
    // attention returns as its weights and the layer holds until it
    // returns; only the dropout output's bf16 cast is kept. Both are alive
    // when the feed-forward's first product is made (the H200's recorded
    // BERT runs free the dropout output after the feed-forward).
    let evs = events(
        &config("bert", serde_json::json!({})),
        &run(Precision::AmpBf16, Attention::Eager),
    );
    let live = live_activations_until(&evs, |bytes, category| {
        category == Category::Activations && bytes == N * F * 2
    })
    .expect("the feed-forward's product");
    assert_eq!(live.values().filter(|&&b| b == S2 * 4).count(), 2);
}

#[test]
fn eager_scores_get_the_mask_each_family_builds() {
    // T5's position bias and DeBERTa's filled mask (with its relative
    // attention, as DeBERTa-v3's configs have it) are terms of the scores'
    // width; the causal decoders add a float mask; BERT, RoBERTa (trained
    // without an attention mask) and ViT add nothing.
    use super::hf::{ScoreMask, score_mask};
    let image = serde_json::json!({"image_size": 16, "patch_size": 8});
    let relative = serde_json::json!({"relative_attention": true, "position_buckets": 4,
        "pos_att_type": ["c2p", "p2c"]});
    for (model_type, want) in [
        ("t5", ScoreMask::Same),
        (
            "deberta-v2",
            ScoreMask::Filled {
                heads: HEADS,
                summed: true,
            },
        ),
        ("bert", ScoreMask::None),
        ("roberta", ScoreMask::None),
        ("vit", ScoreMask::None),
        ("llama", ScoreMask::Float),
        ("gpt2", ScoreMask::Float),
        ("opt", ScoreMask::Float),
    ] {
        let extra = match model_type {
            "vit" => image.clone(),
            "deberta-v2" => relative.clone(),
            _ => serde_json::json!({}),
        };
        assert_eq!(score_mask(&family(model_type, extra)), want, "{model_type}");
    }
}

#[test]
fn a_library_model_is_made_in_its_own_dtype() {
    // transformers makes the weights in the dtype it is asked for: no fp32
    // original to convert (the repository's reference modules have one).
    let evs = events(
        &config("llama", serde_json::json!({})),
        &run(Precision::Bf16, Attention::Sdpa),
    );
    let made: Vec<&TensorEvent> = evs
        .iter()
        .take_while(|e| {
            matches!(
                e,
                TensorEvent::Alloc {
                    category: Category::Parameters,
                    ..
                }
            )
        })
        .collect();
    assert!(!made.is_empty());
    assert!(
        !evs[..made.len() + 1]
            .iter()
            .any(|e| matches!(e, TensorEvent::Free { .. })),
        "nothing converted"
    );
    assert!(
        made.iter()
            .any(|e| matches!(e, TensorEvent::Alloc { bytes, .. } if *bytes == V * H * 2))
    );
}

#[test]
fn routed_experts_cast_the_norms_output_once_and_their_sum_is_the_blocks_output() {
    // Mixtral's experts read fp32 tokens under autocast, so only the router
    // casts the norm's output, and the routed sum in token order is what the
    // residual adds: no projection after it (the H200's recorded Mixtral
    // autocast runs). A dense block casts for gate and up and projects down:
    // two more hidden-sized low-precision tensors a block.
    let p = Precision::AmpBf16;
    let w = widths(p);
    let low = |t: &crate::predict::arch::TransformerArch| {
        count(
            &acts(first_forward(&family_events(t, p, Attention::Sdpa))),
            N * H * w.c,
        )
    };
    let (dense, routed) = (
        low(&family("llama", serde_json::json!({}))),
        low(&family("mixtral", serde_json::json!({}))),
    );
    assert_eq!(dense, routed + 2 * 2, "{dense} {routed}");
    // with a shared expert (Qwen2-MoE) the block keeps both casts and the
    // projection after the sum
    let qwen = family("qwen2_moe", serde_json::json!({}));
    let mut unshared = qwen.clone();
    unshared.layout.moe.as_mut().unwrap().shared_ffn = 0;
    assert!(
        low(&qwen) >= low(&unshared) + 2 * 2,
        "{} {}",
        low(&qwen),
        low(&unshared)
    );
}

/// Activations alive when the first backward starts, for `t` run as `shape`.
fn alive_at_backward(t: &crate::predict::arch::TransformerArch, shape: &RunShape) -> Vec<u64> {
    alive_when_backward_starts(&training_events(&Arch::Transformer(t.clone()), shape))
}

#[test]
fn a_window_reached_by_the_sequence_keeps_a_mask_per_block_and_repeated_keys_and_values() {
    // With a mask transformers asks SDPA for no grouped-query kernel:
    // `repeat_kv` copies the keys and values to every head (a view when one
    // key/value head serves them all), and the memory-efficient kernel keeps
    // each block's additive mask, batch x seq x seq in the query's dtype.
    // A window longer than the sequence changes nothing, nor does eager
    // attention's path.
    let shape = run(Precision::Bf16, Attention::Sdpa);
    let mask = MICRO * SEQ * SEQ * 2;
    for (kv_heads, copies) in [(2, true), (1, false)] {
        let mistral = |window: serde_json::Value| {
            family(
                "mistral",
                serde_json::json!({"num_attention_heads": 4, "num_key_value_heads": kv_heads,
                    "head_dim": 6, "use_cache": false, "sliding_window": window}),
            )
        };
        let (on, off, longer) = (
            mistral(SEQ.into()),
            mistral(serde_json::Value::Null),
            mistral((SEQ + 1).into()),
        );
        let (a, b) = (
            alive_at_backward(&on, &shape),
            alive_at_backward(&off, &shape),
        );
        assert_eq!(alive_at_backward(&longer, &shape), b, "kv heads {kv_heads}");
        assert_eq!(count(&a, mask), count(&b, mask) + 2, "kv heads {kv_heads}");
        let (kv, full) = (N * 6 * kv_heads * 2, N * 24 * 2);
        if copies {
            assert_eq!(count(&a, full), count(&b, full) + 4);
            assert_eq!(count(&a, kv) + 4, count(&b, kv));
        } else {
            assert_eq!(count(&a, kv), count(&b, kv));
            assert_eq!(count(&a, full), count(&b, full));
        }
        let eager = run(Precision::Bf16, Attention::Eager);
        assert_eq!(
            alive_at_backward(&on, &eager),
            alive_at_backward(&off, &eager),
            "kv heads {kv_heads}"
        );
        // the model's boolean mask: a checkpoint keeps it, an input of
        // every block, until backward
        let ckpt = RunShape {
            checkpointing: true,
            ..shape.clone()
        };
        let (a, b) = (
            alive_at_backward(&on, &ckpt),
            alive_at_backward(&off, &ckpt),
        );
        assert_eq!(count(&a, SEQ * SEQ), count(&b, SEQ * SEQ) + 1);
        // each windowed block's backward: the memory-efficient kernel's fp32
        // buffer of the queries' size and the log-sum-exp's
        let buffer = N * 24 * 4 + MICRO * 4 * SEQ * 4;
        let all = |t: &crate::predict::arch::TransformerArch| {
            acts(&training_events(&Arch::Transformer(t.clone()), &shape))
        };
        let extra = count(&all(&on), buffer) - count(&all(&off), buffer);
        assert!(
            extra > 0 && extra.is_multiple_of(2),
            "kv heads {kv_heads}: {extra}"
        );
    }
}

#[test]
fn a_head_norms_input_lives_until_the_norm_returns() {
    // `self.q_norm(query_states)`: the projection is the norm's argument
    // and its caller's variable, alive until the norm returns, while the
    // norm makes its fp32 copy, the squares, the normalised tensor (and
    // Gemma's weight product) and its output. Freed at the fp32 copy, the
    // H100's Gemma 3 with its window at 2,048 x 2 in bf16 replayed one 4 GiB
    // loss segment short (-14.7 %; -0.1 % with it).
    let qd = HEADS * 20;
    let (q, q32) = (N * qd * 2, N * qd * 4);
    for model_type in ["qwen3", "gemma3_text"] {
        let t = family(model_type, serde_json::json!({"head_dim": 20}));
        let evs = family_events(&t, Precision::Bf16, Attention::Sdpa);
        let projection = evs
            .iter()
            .find_map(|e| match *e {
                TensorEvent::Alloc { id, bytes, .. } if bytes == q => Some(id),
                _ => None,
            })
            .expect("the queries' projection");
        let made = evs
            .iter()
            .skip_while(|e| !matches!(**e, TensorEvent::Alloc { id, .. } if id == projection))
            .take_while(|e| !matches!(**e, TensorEvent::Free { id } if id == projection))
            .filter(|e| matches!(**e, TensorEvent::Alloc { bytes, .. } if bytes == q32))
            .count();
        let expected = if model_type == "gemma3_text" { 4 } else { 3 };
        assert_eq!(made, expected, "{model_type}");
    }
}

#[test]
fn the_memory_efficient_kernel_runs_once_its_outputs_gradient_exists() {
    // The output projection's backward node runs first: its weight's
    // gradient, then its input's (the kernel's output's gradient); then
    // the kernel takes its fp32 buffer, its output still alive as one of
    // its inputs.
    let t = family(
        "mistral",
        serde_json::json!({"num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "use_cache": false, "sliding_window": SEQ}),
    );
    let evs = family_events(&t, Precision::Bf16, Attention::Sdpa);
    let out = N * 32 * 2;
    let buffer = N * 32 * 4 + MICRO * 4 * SEQ * 4;
    let sizes: BTreeMap<u32, u64> = evs
        .iter()
        .filter_map(|e| match *e {
            TensorEvent::Alloc { id, bytes, .. } => Some((id, bytes)),
            TensorEvent::Free { .. } => None,
        })
        .collect();
    let at = evs
        .iter()
        .position(|e| matches!(*e, TensorEvent::Alloc { bytes, .. } if bytes == buffer))
        .expect("the kernel's buffer");
    let gradient = evs[..at]
        .iter()
        .rposition(|e| matches!(*e, TensorEvent::Alloc { .. }))
        .unwrap();
    assert!(
        matches!(evs[gradient], TensorEvent::Alloc { bytes, category: Category::Activations, .. } if bytes == out),
        "{:?}",
        evs[gradient]
    );
    assert!(matches!(
        evs[gradient - 1],
        TensorEvent::Alloc {
            category: Category::Gradients,
            ..
        }
    ));
    let freed_outputs = evs[gradient..at]
        .iter()
        .filter(|e| matches!(**e, TensorEvent::Free { id } if sizes[&id] == out))
        .count();
    assert_eq!(freed_outputs, 0);
}

#[test]
fn gemmas_norms_keep_their_normalised_input_in_fp32() {
    // `(x.float() * rsqrt) * (1 + weight.float())`, cast at the end: in low
    // precision autograd keeps the fp32 normalised tensor where LLaMA's norm
    // keeps its cast; under autocast the norms of the fp32 residual stream
    // run in fp32 either way, and only those of bf16 inputs change: the
    // query/key norms and the norms of the attention's and feed-forward's
    // outputs.
    let on = family("gemma3_text", serde_json::json!({}));
    let mut off = on.clone();
    off.layout.offset_norms = false;
    // per block: four norms of the residual stream, the query and key norms
    // (heads x head_dim = hidden here); and the final norm
    for (p, norms) in [(Precision::Bf16, 2 * 6 + 1), (Precision::AmpBf16, 2 * 4)] {
        let shape = run(p, Attention::Sdpa);
        let (a, b) = (
            alive_at_backward(&on, &shape),
            alive_at_backward(&off, &shape),
        );
        assert_eq!(count(&a, N * H * 4), count(&b, N * H * 4) + norms, "{p:?}");
        assert_eq!(count(&a, N * H * 2) + norms, count(&b, N * H * 2), "{p:?}");
    }
}

#[test]
fn under_autocast_gemmas_output_norms_copy_their_low_precision_inputs_to_fp32() {
    // The attention's and the feed-forward's outputs come out of bf16
    // matmuls: their norms' `x.float()` is a copy autograd keeps, beside the
    // fp32 normalised tensor, where a norm of the fp32 residual stream keeps
    // the input itself. Two such norms per block, two fp32 tensors each.
    let on = family("gemma3_text", serde_json::json!({}));
    let mut off = on.clone();
    off.layout.sandwich_norms = false;
    let shape = run(Precision::AmpBf16, Attention::Sdpa);
    let (a, b) = (
        alive_at_backward(&on, &shape),
        alive_at_backward(&off, &shape),
    );
    assert_eq!(count(&a, N * H * 4), count(&b, N * H * 4) + 2 * 2 * 2);
}

#[test]
fn olmo2s_blocks_norm_their_outputs_only_and_cast_the_rotated_keys_back() {
    // OLMo 2's blocks have no input norms: under autocast the projections
    // keep their casts of the block input and of the residual sum, so
    // neither fp32 tensor outlives the block's forward, where a block with
    // input norms (Gemma's layout, the same output norms) keeps both and
    // each input norm's fp32 normalised tensor. Its rotary embedding casts
    // the queries and keys back to bf16, so the key/value cache holds bf16
    // copies, which SDPA reads as they are, where LLaMA's holds fp32 ones
    // and SDPA keeps its casts of them.
    let olmo = family(
        "olmo2",
        serde_json::json!({"num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 6}),
    );
    let shape = run(Precision::AmpBf16, Attention::Sdpa);
    let mut inputs_normed = olmo.clone();
    inputs_normed.layout.post_norms_only = false;
    inputs_normed.layout.sandwich_norms = true;
    let (a, b) = (
        alive_at_backward(&olmo, &shape),
        alive_at_backward(&inputs_normed, &shape),
    );
    let blocks = 2;
    assert_eq!(count(&a, N * H * 4) + 4 * blocks, count(&b, N * H * 4));
    let mut fp32_rope = olmo.clone();
    fp32_rope.layout.rope_cast_back = false;
    let c = alive_at_backward(&fp32_rope, &shape);
    let (kv_c, kv_e) = (N * 6 * 2, N * 6 * 4);
    // the bf16 copies stand in for SDPA's casts of fp32 ones
    assert_eq!(count(&a, kv_c), count(&c, kv_c));
    assert_eq!(count(&a, kv_e) + 2 * blocks, count(&c, kv_e));
}

#[test]
fn starcoder2s_layer_norms_keep_their_inputs_and_statistics() {
    // LLaMA's attention with torch's LayerNorm: each norm keeps its input
    // and its per-row mean and inverse deviation (two fp32 per token), so
    // in bf16 the block input outlives the residual add, where an RMSNorm
    // keeps an fp32 copy of it instead.
    let coder = family("starcoder2", serde_json::json!({}));
    let mut rms = coder.clone();
    rms.norm = crate::api::NormKind::Rmsnorm;
    let shape = run(Precision::Bf16, Attention::Sdpa);
    let (a, b) = (
        alive_at_backward(&coder, &shape),
        alive_at_backward(&rms, &shape),
    );
    // two norms per block and the final one
    assert_eq!(count(&a, N * 8), count(&b, N * 8) + 2 * 2 + 1);
    // each RMSNorm's fp32 input copy, none for a LayerNorm
    assert_eq!(count(&a, N * H * 4) + 2 * 2 + 1, count(&b, N * H * 4));
}

#[test]
fn gpt2s_activation_without_autograd_frees_each_temporary_once_read() {
    // `gelu_new` is a Python expression: without autograd (a checkpointed
    // first forward) each elementwise result dies once the next op has read
    // it, `0.5 * x` at the last product and the projection's output when the
    // activation returns. When c_proj's output is made only the activation's
    // output is left (and under autocast the cast c_proj reads), as the
    // recorded GPT-2 runs show; with autograd the block keeps four more.
    for p in PRECISIONS {
        let w = widths(p);
        let inner = [N * F * w.c, N * F * 4];
        let ckpt = RunShape {
            checkpointing: true,
            ..run(p, Attention::Sdpa)
        };
        let evs = events(&config("gpt2", serde_json::json!({})), &ckpt);
        let mut live = std::collections::HashSet::new();
        let (mut most, mut at_proj) = (0, Vec::new());
        for e in first_blocks(&evs) {
            match *e {
                TensorEvent::Alloc { id, bytes, .. } if inner.contains(&bytes) => {
                    live.insert(id);
                    most = most.max(live.len());
                }
                TensorEvent::Alloc { bytes, .. } if bytes == N * H * w.c && !live.is_empty() => {
                    at_proj.push(live.len());
                }
                TensorEvent::Free { id } => {
                    live.remove(&id);
                }
                _ => {}
            }
        }
        assert_eq!(most, 4, "{p:?}: most alive at once");
        let left = if w.amp { 2 } else { 1 };
        assert_eq!(at_proj, vec![left; 2], "{p:?}: alive at each c_proj");
    }
}

#[test]
fn over_3072_token_ids_the_embedding_backward_sums_partials_in_a_buffer_of_its_own() {
    // CUDA's embedding backward sorts more than 3,072 ids and sums per-segment
    // partials in fp32, in a buffer sized for ids plus a tenth (each a row of
    // the table), after the table's dense gradient; the embeddings' gradient
    // goes as it returns, before the tied head's contribution is summed in.
    for (micro, ids) in [(MICRO, None), (700, Some(700 * SEQ))] {
        for p in PRECISIONS {
            let w = widths(p);
            let shape = RunShape {
                micro_batch: micro,
                ..run(p, Attention::Sdpa)
            };
            let evs = events(&config("gpt2", serde_json::json!({})), &shape);
            let n = micro * SEQ;
            let bytes_of = |id: u32| {
                evs.iter().find_map(|e| match *e {
                    TensorEvent::Alloc { id: i, bytes, .. } if i == id => Some(bytes),
                    _ => None,
                })
            };
            // the first step's tied sum: the word table's gradient (under
            // autocast the head's cast back, into which the dense table is
            // added before it is freed)
            let sum = evs
                .iter()
                .position(|e| {
                    matches!(e, TensorEvent::Alloc { bytes, category: Category::Gradients, .. }
                        if *bytes == V * H * w.w)
                })
                .unwrap();
            let table = |e: &TensorEvent| matches!(e, TensorEvent::Alloc { bytes, .. } if *bytes == V * H * w.w);
            let (dense, end) = if w.amp {
                let dense = sum + 1 + evs[sum + 1..].iter().position(table).unwrap();
                let TensorEvent::Alloc { id, .. } = evs[dense] else {
                    unreachable!()
                };
                let freed = evs.iter().position(|e| *e == TensorEvent::Free { id });
                (dense, freed.unwrap())
            } else {
                (evs[..sum].iter().rposition(table).unwrap(), sum)
            };
            let between: Vec<&TensorEvent> = evs[dense + 1..end].iter().collect();
            let partials = between.iter().find_map(|e| match **e {
                TensorEvent::Alloc { bytes, .. } => Some(bytes),
                _ => None,
            });
            assert_eq!(
                partials,
                ids.map(|k| (k + k / 10) * H * 4),
                "{p:?} micro {micro}"
            );
            let freed_grad = between.iter().any(|e| match **e {
                TensorEvent::Free { id } => bytes_of(id) == Some(n * H * w.r),
                _ => false,
            });
            assert!(freed_grad, "{p:?} micro {micro}: {between:?}");
        }
    }
}

#[test]
fn gpt2s_half_precision_attention_backward_writes_three_gradients_then_their_concatenation() {
    // In half precision without a mask SDPA runs the flash kernel: its
    // backward writes the queries', keys' and values' gradients apart and
    // takes an fp32 buffer (the queries' gradient padded to 128 tokens and
    // 32 dimensions, and the softmax's row sums); then its inputs go and the
    // split's backward concatenates the three (the recorded GPT-2 bf16 run).
    // fp32 runs the memory-efficient kernel, which writes one gradient of
    // the fused projection; eager attention has no kernel.
    let buffer = FLASH_BUFFER;
    for (p, attention, flash) in [
        (Precision::Bf16, Attention::Sdpa, true),
        (Precision::AmpBf16, Attention::Sdpa, true),
        (Precision::Fp32, Attention::Sdpa, false),
        (Precision::Bf16, Attention::Eager, false),
    ] {
        let w = widths(p);
        let evs = events(&config("gpt2", serde_json::json!({})), &run(p, attention));
        let bwd = backward_of_micro_step(&evs, 0);
        let at = bwd.iter().position(|&b| b == buffer);
        assert_eq!(at.is_some(), flash, "{p:?} {attention:?}");
        if let Some(at) = at {
            assert_eq!(bwd[at - 3..at], [N * H * w.c; 3], "{p:?}");
            // under autocast the values' and keys' gradients are copied
            // before the concatenation
            let copies = if w.amp { 2 } else { 0 };
            assert_eq!(
                bwd[at + 1..at + 2 + copies],
                [vec![N * H * w.c; copies], vec![3 * N * H * w.c]].concat()[..],
                "{p:?}: {bwd:?}"
            );
            assert_eq!(count(&bwd, buffer), 2, "one per layer");
        }
    }
}
