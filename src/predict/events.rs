//! One training run's tensor allocations and frees, generated from the model
//! description: model build, then two optimizer steps (the first creates the
//! optimizer state, the second is the steady state). Replaying the sequence
//! through an allocator model gives the reserved peak and what is alive then.

use crate::api::{
    Attention, MlpKind, NormKind, Optimizer, PositionalKind, Precision, TransformerKind,
};

use super::arch::{Arch, ParamTensor, TransformerArch};

/// What a tensor is for; the breakdown reports live bytes by category.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    /// Weights and autocast's low-precision copies of them.
    Parameters,
    /// `.grad` tensors.
    Gradients,
    /// Optimizer state and its step temporaries.
    Optimizer,
    /// Saved activations, logits, loss and backward temporaries.
    Activations,
    /// cuBLAS workspaces.
    Workspace,
}

/// One allocator request or release. Ids are unique within a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorEvent {
    /// A tensor of `bytes` bytes is created.
    Alloc {
        /// Tensor id.
        id: u32,
        /// Requested size.
        bytes: u64,
        /// What it is for.
        category: Category,
    },
    /// The tensor with this id is released.
    Free {
        /// Tensor id.
        id: u32,
    },
}

/// Everything about the run that decides memory, besides the model's shape.
#[derive(Clone, Debug)]
pub struct RunShape {
    /// Samples per micro-step on one GPU.
    pub micro_batch: u64,
    /// Micro-steps per optimizer step.
    pub grad_accum: u64,
    /// Numeric precision mode.
    pub precision: Precision,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// Activation checkpointing per block.
    pub checkpointing: bool,
    /// Attention implementation.
    pub attention: Attention,
    /// ZeRO stage (0..3).
    pub zero_stage: u8,
    /// GPUs the ZeRO shards spread over.
    pub gpus: u64,
    /// Bytes of one cuBLAS workspace (one per stream and thread that runs matmuls).
    pub cublas_workspace: u64,
}

/// Builds event sequences with fresh ids.
#[derive(Default)]
pub struct Trace {
    /// The sequence so far.
    pub events: Vec<TensorEvent>,
    next: u32,
}

impl Trace {
    /// Records an allocation and returns its id. Zero-byte requests still get an id.
    pub fn alloc(&mut self, bytes: u64, category: Category) -> u32 {
        let id = self.next;
        self.next += 1;
        self.events.push(TensorEvent::Alloc {
            id,
            bytes,
            category,
        });
        id
    }
    fn act(&mut self, bytes: u64) -> u32 {
        self.alloc(bytes, Category::Activations)
    }
    /// Records a release.
    pub fn free(&mut self, id: u32) {
        self.events.push(TensorEvent::Free { id });
    }
    fn free_all(&mut self, ids: &mut Vec<u32>) {
        for id in ids.drain(..) {
            self.free(id);
        }
    }
}

/// Bytes per element of weights, matmul outputs and the residual stream.
struct Dtypes {
    weight: u64,
    compute: u64,
    residual: u64,
    amp: bool,
}

impl Dtypes {
    fn of(p: Precision) -> Self {
        match p {
            Precision::Fp32 => Dtypes {
                weight: 4,
                compute: 4,
                residual: 4,
                amp: false,
            },
            Precision::Bf16 | Precision::Fp16 => Dtypes {
                weight: 2,
                compute: 2,
                residual: 2,
                amp: false,
            },
            Precision::AmpBf16 | Precision::AmpFp16 => Dtypes {
                weight: 4,
                compute: 2,
                residual: 4,
                amp: true,
            },
        }
    }
}

/// Generates the allocation sequence of building the model and running two
/// optimizer steps.
pub fn training_events(arch: &Arch, run: &RunShape) -> Vec<TensorEvent> {
    let mut g = Gen::new(arch, run);
    g.build();
    for step in 0..2 {
        for micro in 0..run.grad_accum.max(1) {
            g.micro_step(micro == 0 && step == 0, micro == 0);
        }
        g.optimizer_step(step == 0);
    }
    g.t.events
}

struct Gen<'a> {
    arch: &'a Arch,
    run: &'a RunShape,
    d: Dtypes,
    t: Trace,
    params: Vec<ParamTensor>,
    param_ids: Vec<u32>,
    grad_ids: Vec<Option<u32>>,
    state_ids: Vec<u32>,
    workspaces: u32,
}

impl<'a> Gen<'a> {
    fn new(arch: &'a Arch, run: &'a RunShape) -> Self {
        let params = arch.param_tensors();
        let n = params.len();
        Gen {
            arch,
            run,
            d: Dtypes::of(run.precision),
            t: Trace::default(),
            params,
            param_ids: Vec::new(),
            grad_ids: vec![None; n],
            state_ids: Vec::new(),
            workspaces: 0,
        }
    }

    /// Elements of a tensor held by this GPU under ZeRO sharding at `stage`.
    fn shard(&self, numel: u64, stage: u8) -> u64 {
        if self.run.zero_stage >= stage && self.run.gpus > 1 {
            numel.div_ceil(self.run.gpus)
        } else {
            numel
        }
    }

    fn build(&mut self) {
        for i in 0..self.params.len() {
            let n = self.shard(self.params[i].numel(), 3);
            let id = self.t.alloc(n * self.d.weight, Category::Parameters);
            self.param_ids.push(id);
        }
        if let Arch::Transformer(t) = self.arch {
            if t.positional == PositionalKind::Rotary {
                // cos and sin tables (seq x head_dim), fp32 or the pure dtype
                for _ in 0..2 {
                    self.t
                        .alloc(t.seq_len * t.head_dim * self.d.weight, Category::Parameters);
                }
            }
            if self.run.attention == Attention::Eager && t.kind == TransformerKind::Decoder {
                self.t.alloc(t.seq_len * t.seq_len, Category::Activations);
            }
        }
        if self.run.optimizer == Optimizer::Adagrad {
            // Adagrad creates its sums in the constructor.
            self.create_state();
        }
    }

    /// A cuBLAS workspace appears at the first matmul of each thread (forward
    /// and the autograd thread), and stays.
    fn workspace(&mut self, which: u32) {
        if self.workspaces <= which && self.run.cublas_workspace > 0 {
            self.t.alloc(self.run.cublas_workspace, Category::Workspace);
            self.workspaces = which + 1;
        }
    }

    /// Weight gradient of parameter `i`: autocast produces it in low precision
    /// and AccumulateGrad converts; later micro-steps add into the existing grad.
    fn weight_grad(&mut self, i: usize) {
        let n = self.shard(self.params[i].numel(), 2);
        let full = self.params[i].numel();
        let lowp = self.d.amp && self.params[i].matmul_weight;
        match self.grad_ids[i] {
            None => {
                let tmp = lowp.then(|| self.t.act(full * self.d.compute));
                self.grad_ids[i] = Some(self.t.alloc(n * self.d.weight, Category::Gradients));
                if let Some(tmp) = tmp {
                    self.t.free(tmp);
                }
            }
            Some(_) => {
                let tmp = self
                    .t
                    .act(full * if lowp { self.d.compute } else { self.d.weight });
                let tmp2 = lowp.then(|| self.t.act(full * self.d.weight));
                if let Some(t2) = tmp2 {
                    self.t.free(t2);
                }
                self.t.free(tmp);
            }
        }
    }

    /// Autocast's low-precision copies of a layer's matmul weights.
    fn cast_weights(&mut self, layer: Option<u32>) -> Vec<u32> {
        if !self.d.amp {
            return Vec::new();
        }
        let sizes: Vec<u64> = self
            .params
            .iter()
            .filter(|p| p.layer == layer && p.matmul_weight)
            .map(|p| p.numel() * self.d.compute)
            .collect();
        sizes
            .into_iter()
            .map(|b| self.t.alloc(b, Category::Parameters))
            .collect()
    }

    fn grads_of_layer(&mut self, layer: Option<u32>) {
        let idx: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].layer == layer)
            .collect();
        for i in idx.into_iter().rev() {
            self.weight_grad(i);
        }
    }

    fn micro_step(&mut self, first_ever: bool, _first_of_step: bool) {
        let _ = first_ever;
        match self.arch {
            Arch::Mlp { layers, hidden } => self.mlp_micro_step(*layers, *hidden),
            Arch::Transformer(t) => {
                let t = t.clone();
                self.transformer_micro_step(&t);
            }
        }
    }

    fn mlp_micro_step(&mut self, layers: u64, hidden: u64) {
        let b = self.run.micro_batch;
        let d = &self.d;
        let (c, inb) = (d.compute, if d.amp { 4 } else { d.weight });
        let x = self.t.act(b * hidden * inb);
        let y = self.t.act(b * hidden * 4);
        let mut saved = vec![x];
        let mut casts = Vec::new();
        let mut input_cast = None;
        for l in 0..layers {
            casts.push(self.cast_weights(Some(l as u32)));
            if l == 0 && self.d.amp {
                input_cast = Some(self.t.act(b * hidden * c));
            }
            self.workspace(0);
            let lin = self.t.act(b * hidden * c);
            let relu = self.t.act(b * hidden * c);
            self.t.free(lin);
            saved.push(relu);
        }
        let out_f = (c != 4).then(|| self.t.act(b * hidden * 4));
        let loss = self.t.act(512);
        // backward
        let mut grad = self.t.act(b * hidden * 4);
        if let Some(o) = out_f {
            let g = self.t.act(b * hidden * c);
            self.t.free(grad);
            self.t.free(o);
            grad = g;
        }
        for l in (0..layers).rev() {
            self.workspace(1);
            let relu = saved.pop().expect("one saved output per layer");
            let g_lin = self.t.act(b * hidden * c);
            self.t.free(grad);
            self.grads_of_layer(Some(l as u32));
            for id in casts.pop().unwrap_or_default() {
                self.t.free(id);
            }
            let g_in = (l > 0).then(|| self.t.act(b * hidden * c));
            self.t.free(g_lin);
            self.t.free(relu);
            grad = g_in.unwrap_or(u32::MAX);
        }
        if let Some(ic) = input_cast {
            self.t.free(ic);
        }
        for id in [x, y, loss] {
            self.t.free(id);
        }
    }

    fn transformer_micro_step(&mut self, t: &TransformerArch) {
        let n = self.run.micro_batch * t.seq_len; // tokens
        let (h, r, c) = (t.hidden, self.d.residual, self.d.compute);
        let idx = self.t.act(n * 8);
        let tgt = self.t.act(n * 8);
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
            let casts = self.cast_weights(Some(l as u32));
            self.workspace(0);
            let (saved, out) = self.block_forward(t, n, x);
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
        // backward through the loss
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
            if self.run.checkpointing {
                casts = self.cast_weights(Some(l as u32));
                let (s, out) = self.block_forward(t, n, saved[0]);
                self.t.free(out);
                saved = s;
            }
            g = self.block_backward(t, n, g, &mut saved);
            self.grads_of_layer(Some(l as u32));
            self.t.free_all(&mut casts);
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
        for id in [idx, tgt, loss] {
            self.t.free(id);
        }
    }

    /// Forward of one block; returns the tensors kept for backward (the block
    /// input first, last popped) and the output.
    fn block_forward(&mut self, t: &TransformerArch, n: u64, x: u32) -> (Vec<u32>, u32) {
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
    fn block_backward(&mut self, t: &TransformerArch, n: u64, g: u32, saved: &mut Vec<u32>) -> u32 {
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

    fn create_state(&mut self) {
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

    fn optimizer_step(&mut self, first: bool) {
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
