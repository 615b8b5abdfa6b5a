//! One training run's tensor allocations and frees, generated from the model
//! description: model build, then [`STEPS_GENERATED`] optimizer steps (the
//! first creates the optimizer state, the later ones are the steady state).
//! Replaying the sequence through an allocator model gives the reserved peak
//! and what is alive then.
//!
//! The generator is split by idea: the model build and the pieces every
//! step shares (here), a transformer micro-step (`transformer.rs`) and its
//! blocks (`block.rs`), an MLP micro-step (`mlp.rs`) and the optimizer step
//! (`optimizer.rs`).

mod block;
mod hf;
mod mlp;
mod optimizer;
mod transformer;
mod zero;

use std::collections::{BTreeMap, HashSet};

use crate::api::{Attention, Optimizer, PositionalKind, Precision, TransformerKind};

use super::arch::{Arch, ParamTensor};
use super::reduce::{ReduceDevice, column_sum_staging};

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
    /// A captured profile's allocations that outlive the profiled step
    /// (weights, gradients, optimizer state: the profile does not say which).
    Persistent,
}

/// The CUDA stream a tensor is allocated on. The caching allocator keeps the
/// free blocks of each stream in their own pool: a block cached for one
/// stream is never handed to a request of another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The default stream: the model's compute, autograd, the optimizer.
    #[default]
    Default,
    /// FSDP's all-gather copy-in stream, where each unit's flat all-gather
    /// output (whose slice is the all-gather input) is allocated.
    AllGather,
    /// FSDP's reduce-scatter stream, where each unit's flat reduce-scatter
    /// output (the sharded gradients) is allocated.
    ReduceScatter,
}

impl Stream {
    /// The allocator's stream id.
    pub fn id(self) -> u64 {
        match self {
            Stream::Default => 0,
            Stream::AllGather => 1,
            Stream::ReduceScatter => 2,
        }
    }
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
        /// Stream it is allocated on.
        stream: Stream,
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
    /// The GPU's figures for the reduction kernel's staging buffers; `None`
    /// leaves them out.
    pub reduce: Option<ReduceDevice>,
}

/// Builds event sequences with fresh ids.
#[derive(Default)]
pub struct Trace {
    /// The sequence so far.
    pub events: Vec<TensorEvent>,
    next: u32,
    /// Requested bytes by id.
    sizes: Vec<u64>,
}

impl Trace {
    /// Records an allocation on the default stream and returns its id.
    /// Zero-byte requests still get an id.
    pub fn alloc(&mut self, bytes: u64, category: Category) -> u32 {
        self.alloc_on(bytes, category, Stream::Default)
    }
    /// Records an allocation on `stream` and returns its id.
    pub fn alloc_on(&mut self, bytes: u64, category: Category, stream: Stream) -> u32 {
        let id = self.next;
        self.next += 1;
        self.sizes.push(bytes);
        self.events.push(TensorEvent::Alloc {
            id,
            bytes,
            category,
            stream,
        });
        id
    }
    /// Requested bytes of the allocation with this id.
    pub fn bytes(&self, id: u32) -> u64 {
        self.sizes[id as usize]
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

/// Micro-steps generated per optimizer step, at most. From the second
/// micro-step of an accumulation on, every micro-step starts from the same
/// live tensors (weights, accumulated gradients, optimizer state, the last
/// outputs) and allocates the same requests, so more of them cannot raise the
/// peak; generating all of a large accumulation (thousands) made a prediction
/// take minutes and gigabytes.
pub const MICRO_STEPS_GENERATED: u64 = 3;

/// Optimizer steps generated. The caching allocator's reserve can still grow
/// in the third step: on the H200, LLaMA and Mistral amp with eager attention
/// took one more segment for the third step's fp32 logits, where the first two
/// steps' sequences matched the recorded ones (predicted from two steps they
/// were -6.6 % and -5.4 %, from three -0.2 % each); the runs measure three.
pub const STEPS_GENERATED: u64 = 3;

/// Generates the allocation sequence of building the model and running
/// [`STEPS_GENERATED`] optimizer steps, each of at most
/// [`MICRO_STEPS_GENERATED`] micro-steps.
pub fn training_events(arch: &Arch, run: &RunShape) -> Vec<TensorEvent> {
    let mut g = Gen::new(arch, run);
    g.build();
    for step in 0..STEPS_GENERATED {
        for _ in 0..run.grad_accum.clamp(1, MICRO_STEPS_GENERATED) {
            g.micro_step();
        }
        g.optimizer_step(step == 0);
    }
    g.t.events
}

/// The blocks' matmul weights (parameter indices) that one micro-step's
/// forward left unmarked (see [`Gen::weight_cast`]): none when each block's
/// forward runs a matmul for each of its matmul weights.
#[cfg(test)]
fn matmul_weights_left(arch: &Arch, run: &RunShape) -> Vec<usize> {
    let mut g = Gen::new(arch, run);
    g.build();
    g.micro_step();
    g.matmuls_left
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
    /// FSDP: each gathered unit's full parameters.
    gathered: BTreeMap<Option<u32>, Vec<u32>>,
    /// FSDP: all-gathers issued and not yet copied out (prefetches), by unit:
    /// the flat all-gather output.
    issued: BTreeMap<Option<u32>, u32>,
    /// FSDP: the flat all-gather output of the last unit gathered in forward,
    /// freed at the next copy-out in forward (or at the end of the forward).
    deferred_flat: Option<u32>,
    /// FSDP: each unit's full-size gradients awaiting the reduce-scatter.
    unsharded_grads: BTreeMap<Option<u32>, Vec<u32>>,
    /// FSDP: the last reduce-scatter input, freed at the next one.
    rs_input: Option<u32>,
    /// Hugging Face: what the last forward returned and the docs' loop keeps
    /// in `outputs` until the next forward returns (logits, key/value cache).
    outputs: Vec<u32>,
    /// Hugging Face: the key/value cache of the forward being generated.
    cache: Vec<u32>,
    /// Hugging Face: what the encoder holds until it returns: DeBERTa's
    /// integer attention mask and the block inputs its list of hidden states
    /// keeps (`Layout::keeps_hidden_states`).
    encoder_locals: Vec<u32>,
    /// Tensors already released (a block input freed in forward by the
    /// library's code, which the backward loop would free again).
    released: HashSet<u32>,
    /// Hugging Face: kept softmax outputs of eager and math-path attention:
    /// their elements, the width of the scores they were computed from and
    /// whether the scores were scaled after the product (eager).
    softmax: BTreeMap<u32, (u64, u64, bool)>,
    /// Hugging Face: RMSNorms kept for backward, by the last tensor each
    /// kept (what the weight's product reads): see [`RmsSaved`].
    rmsnorms: BTreeMap<u32, RmsSaved>,
    /// Hugging Face: the RMSNorms multiply by the weight in fp32 and cast the
    /// product back (Gemma's `1 + weight`, OLMo 2's), rather than cast before
    /// LLaMA's weight.
    offset_norms: bool,
    /// Hugging Face: windowed attention's log-sum-exp kept for backward, with
    /// the block's additive mask, the kernel's output and the bytes of the
    /// memory-efficient kernel's backward buffer.
    windowed: BTreeMap<u32, (u32, u32, u64)>,
    /// Hugging Face: the log-sum-exp the flash kernel keeps for backward,
    /// with what its backward reads and writes ([`FlashSaved`]).
    flash: BTreeMap<u32, FlashSaved>,
    /// Hugging Face: the first forward of a checkpointed block runs without
    /// autograd keeping anything; each tensor dies when the modelling code
    /// drops it.
    no_grad: bool,
    /// Under `no_grad`: autocast's casts of activations for the kernel
    /// running now, freed once its output exists.
    kernel_casts: Vec<u32>,
    /// Under autocast: the sizes of the block's weight casts not made yet,
    /// in the order its matmuls first use them (autocast casts a weight on
    /// its first use and caches the cast).
    pending_casts: std::collections::VecDeque<u64>,
    /// The weight casts made so far in the block.
    made_casts: Vec<u32>,
    /// The block's matmul weights (parameter indices) not reached yet by
    /// its forward, in the order its matmuls run; empty where the weight
    /// gradients are made after the block's backward (see
    /// [`Self::grads_at_matmuls`]).
    pending_matmuls: std::collections::VecDeque<usize>,
    /// Per block: where each matmul ran in its latest forward (the id the
    /// next tensor got, so that every tensor the matmul read is older) and
    /// its weight. Backward makes the weight's gradient at the matmul's
    /// node, when it first reaches a kept tensor older than the mark.
    matmul_marks: BTreeMap<u64, Vec<(u32, usize)>>,
    /// Matmul weights (parameter indices) of the blocks that their forward
    /// never reached (a forward out of step with the parameters' order
    /// leaves some).
    matmuls_left: Vec<usize>,
}

/// What autograd keeps of one RMSNorm for its backward: the fp32 copy of
/// a low-precision input (`None`: the input was fp32 and is kept as
/// itself), the inverse RMS, and the normalised tensor the weight's product
/// reads (`y`: its low-precision cast, or the fp32 tensor itself); `elems`
/// is the input's element count.
#[derive(Clone, Copy)]
struct RmsSaved {
    /// The fp32 copy of a narrower input, and that input's width.
    x32: Option<u32>,
    width: u64,
    rs: u32,
    y: u32,
    elems: u64,
}

impl RmsSaved {
    /// Whether `id` is one of the tensors this norm kept.
    fn holds(&self, id: u32) -> bool {
        id == self.y || id == self.rs || Some(id) == self.x32
    }
}

/// What the flash kernel's backward reads and writes for one attention
/// whose queries, keys and values are views of one fused projection
/// (GPT-2's `c_attn`): its output and that projection (kept), the
/// gradients it writes for the queries, keys and values (bytes each), and
/// its fp32 buffer for the queries' gradient and the softmax's row sums;
/// `amp`: the projection ran under autocast.
#[derive(Clone, Copy)]
struct FlashSaved {
    out: u32,
    qkv: u32,
    grads: [u64; 3],
    buffer: u64,
    amp: bool,
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
            gathered: BTreeMap::new(),
            issued: BTreeMap::new(),
            deferred_flat: None,
            unsharded_grads: BTreeMap::new(),
            rs_input: None,
            outputs: Vec::new(),
            cache: Vec::new(),
            encoder_locals: Vec::new(),
            released: HashSet::new(),
            no_grad: false,
            kernel_casts: Vec::new(),
            pending_casts: std::collections::VecDeque::new(),
            made_casts: Vec::new(),
            pending_matmuls: std::collections::VecDeque::new(),
            matmul_marks: BTreeMap::new(),
            matmuls_left: Vec::new(),
            softmax: BTreeMap::new(),
            rmsnorms: BTreeMap::new(),
            offset_norms: false,
            windowed: BTreeMap::new(),
            flash: BTreeMap::new(),
        }
    }

    /// Elements of a tensor held by this GPU under ZeRO sharding at `stage`.
    fn shard(&self, numel: u64, stage: u8) -> u64 {
        if self.run.zero_stage >= stage {
            numel.div_ceil(self.run.gpus.max(1))
        } else {
            numel
        }
    }

    fn build(&mut self) {
        // The repository's reference modules (scripts/gpu/calibrate_predictor.py,
        // and calibrate_zero.py without FSDP, which makes them on the meta
        // device) are made on the GPU in fp32 and then converted with
        // `model.to(dtype)`: each tensor's copy is made before its fp32
        // original goes.
        let reference = match self.arch {
            Arch::Transformer(t) => t.library.is_none().then_some(t),
            Arch::Mlp { .. } => None,
        };
        let made_on_gpu = self.run.zero_stage <= 1
            && (reference.is_some() || matches!(self.arch, Arch::Mlp { .. }));
        let made_in_fp32 = made_on_gpu && self.d.weight < 4;
        let made = if made_in_fp32 { 4 } else { self.d.weight };
        for i in 0..self.params.len() {
            // FSDP (stages 2 and 3) keeps only this GPU's shard.
            let n = self.shard(self.params[i].numel(), 2);
            let id = self.t.alloc(n * made, Category::Parameters);
            self.param_ids.push(id);
        }
        let mut buffers = Vec::new();
        if let Some(t) = reference {
            if t.tied && made_on_gpu {
                // nn.Linear makes the head's own weight before the tie replaces it
                let own = self.t.alloc(t.vocab * t.hidden * 4, Category::Parameters);
                self.t.free(own);
            }
            if t.positional == PositionalKind::Rotary {
                // cos and sin tables (seq x head_dim), fp32 or the pure dtype
                for _ in 0..2 {
                    buffers.push(
                        self.t
                            .alloc(t.seq_len * t.head_dim * made, Category::Parameters),
                    );
                }
            }
            if self.run.attention == Attention::Eager && t.kind == TransformerKind::Decoder {
                self.t.alloc(t.seq_len * t.seq_len, Category::Activations);
            }
        }
        if made_in_fp32 {
            for id in self.param_ids.iter_mut().chain(buffers.iter_mut()) {
                let bytes = self.t.bytes(*id) / 4 * self.d.weight;
                let copy = self.t.alloc(bytes, Category::Parameters);
                self.t.free(*id);
                *id = copy;
            }
        }
        self.ddp_buckets();
        if self.run.optimizer == Optimizer::Adagrad {
            // Adagrad creates its sums in the constructor.
            self.create_state();
        }
    }

    /// A cuBLAS workspace appears at the first matmul of each thread (forward
    /// and the autograd thread), and stays.
    fn workspace(&mut self, which: u32) {
        if let Some(bytes) = self.first_workspace(which) {
            self.t.alloc(bytes, Category::Workspace);
        }
    }

    /// The size of cuBLAS's workspace `which` (0: the forward thread's, 1:
    /// the backward thread's) when this is its first use, marked made; for
    /// a caller that allocates it at a point of its own.
    fn first_workspace(&mut self, which: u32) -> Option<u64> {
        (self.workspaces <= which && self.run.cublas_workspace > 0).then(|| {
            self.workspaces = which + 1;
            self.run.cublas_workspace
        })
    }

    /// Weight gradient of parameter `i`: autocast produces it in low precision
    /// and AccumulateGrad converts; later micro-steps add into the existing grad.
    fn weight_grad(&mut self, i: usize) {
        self.weight_grad_releasing(i, None);
    }

    /// [`Self::weight_grad`] of a matmul weight whose backward node held
    /// `grad_output`: autograd releases it when that node returns, after the
    /// weight's gradient in the matmul's precision and before autocast's cast
    /// back to the fp32 master weight (a node of its own) runs.
    fn weight_grad_releasing(&mut self, i: usize, grad_output: Option<u32>) {
        self.weight_grad_then(
            i,
            |g| {
                if let Some(go) = grad_output {
                    g.t.free(go);
                }
            },
            |_| {},
        );
    }

    /// [`Self::weight_grad`], running `node_return` once where the matmul's
    /// backward node returns (after the weight's gradient in the matmul's
    /// precision) and, under autocast, `cast_back` once right before
    /// autocast's cast back to the fp32 master weight (a node of its own)
    /// makes its copy; without a cast back `cast_back` is not run.
    fn weight_grad_then(
        &mut self,
        i: usize,
        node_return: impl FnOnce(&mut Self),
        cast_back: impl FnOnce(&mut Trace),
    ) {
        let mut node_return = Some(node_return);
        let mut release = |g: &mut Self| {
            if let Some(f) = node_return.take() {
                f(g);
            }
        };
        let n = self.shard(self.params[i].numel(), 2);
        let full = self.params[i].numel();
        let lowp = self.d.amp && self.params[i].matmul_weight;
        if self.params[i].sum_rows > 0 {
            self.column_sum_staging(full, self.run.micro_batch * self.params[i].sum_rows);
        }
        let mut cast_back = lowp.then_some(cast_back);
        let mut before_cast = |t: &mut Trace| {
            if let Some(f) = cast_back.take() {
                f(t);
            }
        };
        if self.fsdp() {
            // Full-size until the unit's reduce-scatter (zero.rs).
            let tmp = lowp.then(|| self.t.act(full * self.d.compute));
            release(self);
            before_cast(&mut self.t);
            self.fsdp_unsharded_grad(i, full * self.d.weight);
            if let Some(tmp) = tmp {
                self.t.free(tmp);
            }
            return;
        }
        match self.grad_ids[i] {
            None => {
                let tmp = lowp.then(|| self.t.act(full * self.d.compute));
                if lowp {
                    release(self);
                    before_cast(&mut self.t);
                }
                self.grad_ids[i] = Some(self.t.alloc(n * self.d.weight, Category::Gradients));
                release(self);
                if let Some(tmp) = tmp {
                    self.t.free(tmp);
                }
            }
            Some(_) => {
                let tmp = self
                    .t
                    .act(full * if lowp { self.d.compute } else { self.d.weight });
                release(self);
                before_cast(&mut self.t);
                let tmp2 = lowp.then(|| self.t.act(full * self.d.weight));
                if let Some(t2) = tmp2 {
                    self.t.free(t2);
                }
                self.t.free(tmp);
            }
        }
    }

    /// The reduction kernel's buffers while it sums `rows` rows of a
    /// gradient to a vector of `width` (a bias's, a Python norm's weight):
    /// taken and given back around the kernel, the semaphores inside the
    /// buffer's life.
    fn column_sum_staging(&mut self, width: u64, rows: u64) {
        let Some(device) = self.run.reduce else {
            return;
        };
        let Some(staging) = column_sum_staging(width, rows, 4, device) else {
            return;
        };
        let buffer = self.t.act(staging.buffer);
        let semaphores = self.t.act(staging.semaphores);
        self.t.free(semaphores);
        self.t.free(buffer);
    }

    /// Autocast's low-precision copies of a layer's matmul weights.
    fn cast_weights(&mut self, layer: Option<u32>) -> Vec<u32> {
        let sizes = self.cast_sizes(layer);
        sizes
            .into_iter()
            .map(|b| self.t.alloc(b, Category::Parameters))
            .collect()
    }

    /// [`Self::cast_weights`] made one at a time, each at the matmul that
    /// first uses it ([`Self::weight_cast`]); [`Self::end_lazy_casts`] makes
    /// any left and returns them all.
    fn start_lazy_casts(&mut self, layer: Option<u32>) {
        self.pending_casts = self.cast_sizes(layer).into();
        self.made_casts.clear();
    }

    /// A matmul of the block runs: autocast's cast of the next weight it
    /// uses, if one is pending, and the matmul's mark for the backward.
    fn weight_cast(&mut self) {
        if let Some(b) = self.pending_casts.pop_front() {
            self.make_cast(b);
        }
        if let Some(i) = self.pending_matmuls.pop_front()
            && let Some(layer) = self.params[i].layer
        {
            let mark = self.t.next;
            self.matmul_marks
                .entry(u64::from(layer))
                .or_default()
                .push((mark, i));
        }
    }

    fn end_lazy_casts(&mut self) -> Vec<u32> {
        let left: Vec<u64> = self.pending_casts.drain(..).collect();
        for b in left {
            self.make_cast(b);
        }
        std::mem::take(&mut self.made_casts)
    }

    fn make_cast(&mut self, bytes: u64) {
        let id = self.t.alloc(bytes, Category::Parameters);
        self.made_casts.push(id);
    }

    fn cast_sizes(&self, layer: Option<u32>) -> Vec<u64> {
        if !self.d.amp {
            return Vec::new();
        }
        self.params
            .iter()
            .filter(|p| p.layer == layer && p.matmul_weight)
            .map(|p| p.numel() * self.d.compute)
            .collect()
    }

    fn grads_of_layer(&mut self, layer: Option<u32>) {
        self.grads_of_layer_but(layer, &[]);
    }

    /// [`Self::grads_of_layer`] but for the weights in `made` (whose
    /// gradients the block's backward made at their matmuls).
    fn grads_of_layer_but(&mut self, layer: Option<u32>, made: &[usize]) {
        let idx: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].layer == layer && !made.contains(&i))
            .collect();
        for i in idx.into_iter().rev() {
            self.weight_grad(i);
        }
    }

    fn micro_step(&mut self) {
        match self.arch {
            Arch::Mlp { layers, hidden } => self.mlp_micro_step(*layers, *hidden),
            Arch::Transformer(t) => {
                let t = t.clone();
                match t.library {
                    Some(lib) => self.hf_micro_step(&t, lib),
                    None => self.transformer_micro_step(&t),
                }
            }
        }
    }
}

#[cfg(test)]
mod hf_tests;
#[cfg(test)]
#[path = "mod_tests.rs"]
pub(super) mod tests;
