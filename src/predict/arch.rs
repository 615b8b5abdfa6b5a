//! The predictor's own description of a model: every shape that decides memory,
//! resolved from a `transformer`, `huggingFace` or `mlp` spec.

use crate::api::{MlpKind, NormKind, PositionalKind, TransformerKind, TransformerSpec};

use super::PredictError;

/// A transformer with every default resolved. Richer than [`TransformerSpec`]
/// (biases, token types) so Hugging Face families map onto it exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerArch {
    /// Family name for messages (`transformer`, `gpt2`, `llama`, ...).
    pub family: String,
    /// Decoder (pre-norm, causal) or encoder (BERT-style, masked-LM head).
    pub kind: TransformerKind,
    /// Number of blocks.
    pub layers: u64,
    /// Residual width.
    pub hidden: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: u64,
    /// Width of one head.
    pub head_dim: u64,
    /// Feed-forward width.
    pub ffn: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Tokens per sample in training.
    pub seq_len: u64,
    /// Rows of the learned position table (0: none, as with rotary or
    /// relative positions).
    pub positions: u64,
    /// Feed-forward kind.
    pub mlp: MlpKind,
    /// Normalisation kind.
    pub norm: NormKind,
    /// Position encoding.
    pub positional: PositionalKind,
    /// Output projection shares the embedding.
    pub tied: bool,
    /// Biases on the attention output and feed-forward projections.
    pub linear_bias: bool,
    /// Biases on the query/key/value projection.
    pub qkv_bias: bool,
    /// Rows of the token-type table (BERT: 2).
    pub token_types: u64,
    /// The Hugging Face implementation the model is built by (`None`: the
    /// repository's own reference transformer of scripts/gpu/calibrate_predictor.py).
    pub library: Option<HfImpl>,
    /// What a Hugging Face family adds to the common shape (nothing for a
    /// `transformer` spec and for GPT-2, LLaMA and BERT).
    pub layout: Layout,
}

/// The structure a family adds to the common shape, as data: every field's
/// default is "absent", so the original families leave it at
/// `Layout::default()` and a new family is a row of values (predict/hf.rs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Layout {
    /// Width of the word table when the model projects it to the hidden
    /// size and back (OPT's `word_embed_proj_dim`; 0: the hidden size):
    /// `project_in` and `project_out`, without biases.
    pub embed_dim: u64,
    /// Bias of the attention's output projection when it differs from
    /// `linear_bias` (LLaMA's and Gemma's `attention_bias`; GPT-NeoX's
    /// feed-forward always has biases, its `dense` follows `attention_bias`).
    pub out_bias: Option<bool>,
    /// Rows of the learned position table before position 0 (OPT: 2).
    pub position_offset: u64,
    /// No final norm before the head (OPT with post-norm blocks).
    pub no_final_norm: bool,
    /// Norms of the attention and feed-forward outputs as well as of their
    /// inputs (Gemma 2 and 3): two more per block.
    pub sandwich_norms: bool,
    /// The RMSNorms multiply the fp32 normalised input by the weight in fp32
    /// (Gemma's by `1 + weight`, OLMo 2's by the weight) and cast the product
    /// back: in low precision autograd keeps the normalised input in fp32,
    /// where LLaMA's keeps its cast.
    pub offset_norms: bool,
    /// The blocks norm the attention's and the feed-forward's outputs and
    /// not their inputs (OLMo 2): the projections read the residual stream.
    pub post_norms_only: bool,
    /// The query and key norms span each projection whole, not each head
    /// (OLMo 2's `q_norm` over heads x head_dim).
    pub whole_qk_norms: bool,
    /// The rotary embedding casts the rotated queries and keys back to the
    /// projections' dtype (OLMo 2's `q_embed.to(q_type)`).
    pub rope_cast_back: bool,
    /// The embeddings are multiplied by sqrt(hidden) (Gemma): one more
    /// activation of the embeddings' size.
    pub embed_scale: bool,
    /// Tanh softcapping of the attention scores (Gemma 2): `scores / cap`,
    /// `tanh`, `* cap` in eager attention, the tanh kept; the library runs
    /// such a model with eager attention only.
    pub attn_softcap: bool,
    /// Tanh softcapping of the logits (Gemma 2): two more vocabulary-sized
    /// tensors, the tanh kept for backward.
    pub final_softcap: bool,
    /// Attention and feed-forward read the same block input and are added
    /// together (GPT-NeoX's `use_parallel_residual`).
    pub parallel_residual: bool,
    /// Width of each head's rotated part when only part of it is rotated
    /// (GPT-NeoX's partial rotary; 0: all of `head_dim`).
    pub rotary_dims: u64,
    /// Under autocast, each of the query, key and value `Linear`s casts the
    /// norm's output itself (OPT, ViT), where the rest of the LayerNorm
    /// family's sequence casts it once. (Which weights are fused is
    /// `fused_qkv`.)
    pub separate_qkv: bool,
    /// Query, key and value weights as one tensor (GPT-2's `c_attn`,
    /// GPT-NeoX's `query_key_value`, Phi-3's `qkv_proj`); the other
    /// families' are three `Linear`s.
    pub fused_qkv: bool,
    /// The gated feed-forward's gate and up projections as one `Linear` of
    /// twice the width whose output is chunked (Phi-3's `gate_up_proj`).
    pub fused_gate_up: bool,
    /// The rotary embedding concatenates the rotated part of each head with
    /// the rest (Phi-3's `apply_rotary_pos_emb`): one more copy of the
    /// queries and of the keys, even when the rest is empty.
    pub rotary_cat: bool,
    /// The gated feed-forward's activation is `gelu_new`, composed of
    /// elementwise ops (T5's `gated-gelu`), followed by T5's dropout.
    pub gate_gelu_new: bool,
    /// ReLU feed-forward (OPT, T5 v1.0): autograd keeps only its output.
    pub relu: bool,
    /// Eager attention asks for its softmax in fp32 (`softmax(...,
    /// dtype=torch.float32).to(query.dtype)`: OPT, GPT-NeoX, ViT; the
    /// LLaMA family always, see [`TransformerArch::eager_softmax_fp32`]),
    /// which autograd keeps beside its low-precision copy; GPT-2's, BERT's
    /// and T5's run in the scores' dtype.
    pub softmax_fp32: bool,
    /// Mixture-of-experts feed-forward (Mixtral, Qwen2-MoE).
    pub moe: Option<Moe>,
    /// The loss is `CrossEntropyLoss` on the logits as the model returns them
    /// (T5's; BERT's family always): no `logits.float()` of its own.
    pub loss_on_logits: bool,
    /// Encoder-decoder (T5): the last `decoder_layers` of the `layers`
    /// blocks are decoder blocks, each with a cross-attention.
    pub decoder_layers: u64,
    /// T5's relative attention bias: `buckets x heads` in the first block of
    /// each stack, added to the scores.
    pub rel_buckets: u64,
    /// T5 with `tie_word_embeddings` (v1.0): its head reads the decoder's
    /// output rescaled by 1/sqrt(d_model), a tensor of its own.
    pub decoder_output_scaled: bool,
    /// DeBERTa-v2's disentangled attention.
    pub disentangled: Option<Disentangled>,
    /// The encoder collects every block's output (and the embeddings') until
    /// it returns, whatever the caller asked (DeBERTa-v2 calls its encoder
    /// with `output_hidden_states=True`): under autocast, where a block keeps
    /// only casts of its input, the inputs outlive the blocks.
    pub keeps_hidden_states: bool,
    /// Granite: each residual branch is multiplied by `residual_multiplier`
    /// before its add (a new tensor, even at 1.0).
    pub residual_scale: bool,
    /// Granite: the logits are divided by `logits_scaling` (a new tensor of
    /// their size, even at 1.0).
    pub logits_scaled: bool,
    /// DeBERTa-v2's own self-attention, with or without relative positions:
    /// eager only; each projection copied to heads-first layout, the keys
    /// scaled before their product; the encoder's `[batch, 1, seq, seq]`
    /// integer mask filled into the scores; and no probabilities returned
    /// unless asked, so its locals (the key copy, the filled scores, the
    /// probabilities, the mask's bool view) die when it returns, where other
    /// encoders hand the probabilities to the layer, which holds them.
    pub own_attention: bool,
    /// An image model (ViT): patches in, a classifier out.
    pub image: Option<Image>,
    /// Sliding-window attention: the blocks in `sliding_layers` attend to
    /// the last `sliding_window` tokens only (0: no window). Once the
    /// sequence reaches the window the library builds a boolean mask for
    /// them, which SDPA takes in place of its causal flag
    /// ([`TransformerArch::windowed_block`]).
    pub sliding_window: u64,
    /// The blocks that attend through the window (0-based).
    pub sliding_layers: Vec<u64>,
}

/// A mixture-of-experts feed-forward.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Moe {
    /// Routed experts per block.
    pub experts: u64,
    /// Experts each token is routed to.
    pub top_k: u64,
    /// Feed-forward width of one expert (gated: gate, up, down).
    pub expert_ffn: u64,
    /// Width of the shared expert every token also goes through, with its
    /// one-output sigmoid gate (Qwen2-MoE; 0: none).
    pub shared_ffn: u64,
    /// Blocks with a dense feed-forward of `ffn` instead (Qwen2-MoE's
    /// `mlp_only_layers` and `decoder_sparse_step`).
    pub dense_layers: Vec<u64>,
}

/// DeBERTa-v2's relative position embeddings and disentangled attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Disentangled {
    /// Rows of the relative position table (`position_buckets x 2`, or
    /// `max_relative_positions x 2`).
    pub rel_rows: u64,
    /// A LayerNorm over the relative table (`norm_rel_ebd` has `layer_norm`).
    pub rel_norm: bool,
    /// Content-to-position scores (`c2p` in `pos_att_type`).
    pub c2p: bool,
    /// Position-to-content scores (`p2c` in `pos_att_type`).
    pub p2c: bool,
    /// The position projections reuse the content's (`share_att_key`);
    /// otherwise `pos_key_proj` (c2p) and `pos_query_proj` (p2c) of their own.
    pub share_att_key: bool,
}

/// An image classifier's input and head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Image {
    /// Side of a square patch (the patch embedding is a convolution with
    /// this kernel and stride).
    pub patch: u64,
    /// Input channels.
    pub channels: u64,
    /// Classes of the classifier (`num_labels`).
    pub labels: u64,
}

/// Which `transformers` modelling code builds the model: the tensors its
/// forward keeps differ by family (events/hf.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfFamily {
    /// `GPT2LMHeadModel`: fused `c_attn` (Conv1D), LayerNorm, learned
    /// positions. Also the pre-norm LayerNorm families that differ from it
    /// by [`Layout`] data: GPT-NeoX, OPT, ViT.
    Gpt2,
    /// `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`: separate
    /// q/k/v projections, RMSNorm with an fp32 upcast, rotary, SwiGLU. Also
    /// the RMSNorm families that differ from it by [`Layout`] data: Gemma 2/3,
    /// Mixtral, Qwen2-MoE, T5.
    Llama,
    /// `BertForMaskedLM`: post-norm encoder with a transform + decoder head;
    /// also DeBERTa-v2 (disentangled attention as [`Layout`] data).
    Bert,
}

/// The library-specific parts of a Hugging Face model that decide memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HfImpl {
    /// Modelling code family.
    pub family: HfFamily,
    /// Dropout with p > 0 on embeddings, residual branches and attention
    /// probabilities (GPT-2 and BERT default to 0.1): each keeps a one-byte
    /// mask per element for backward.
    pub dropout: bool,
    /// Dropout with p > 0 on the attention probabilities (eager attention
    /// keeps its mask and output): the family's attention key
    /// (`attn_pdrop`, `attention_dropout`, `attention_probs_dropout_prob`),
    /// which may be 0 while the hidden dropout is not (OPT: `dropout` 0.1,
    /// `attention_dropout` 0.0), or the one rate of a family that has one
    /// (T5's `dropout_rate`).
    pub attn_dropout: bool,
    /// GPT-2's `gelu_new`, built from elementwise ops (pow, tanh, mul, add)
    /// whose intermediates autograd keeps; `false`: one fused activation.
    pub gelu_new: bool,
    /// `use_cache` (the config's default `true` for decoders): the forward
    /// returns a `DynamicCache` holding a copy of every layer's keys and
    /// values, which the docs' loop keeps in `outputs` until the next
    /// forward returns. `gradient_checkpointing_enable()` turns it off.
    pub use_cache: bool,
    /// Qwen3's RMSNorm over each head's queries and keys (a `head_dim`
    /// weight each per layer; autograd keeps their fp32 inputs and outputs).
    pub qk_norm: bool,
}

/// A model the analytic predictor can handle.
// One value per prediction: the size of the transformer variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Arch {
    /// A transformer language model.
    Transformer(TransformerArch),
    /// `layers` x (Linear(hidden, hidden) + ReLU) with an MSE loss.
    Mlp {
        /// Number of Linear + ReLU layers.
        layers: u64,
        /// Width of every layer.
        hidden: u64,
    },
}

/// One parameter tensor: its shape as (rows, cols), cols = 0 for a vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamTensor {
    /// Rows (or length of a vector).
    pub rows: u64,
    /// Columns, 0 for a vector.
    pub cols: u64,
    /// Block the tensor belongs to (`None` for embeddings and the head).
    pub layer: Option<u32>,
    /// A matrix that autocast casts to low precision for a matmul.
    pub matmul_weight: bool,
    /// For a vector whose gradient the reduction kernel sums from a larger
    /// one (a Linear's bias, the weight of a norm written in Python: RMSNorm),
    /// the rows it sums per sample (the tokens; times the heads for a per-head
    /// norm): the kernel stages partial sums in the caching allocator
    /// ([`super::reduce`]). 0 otherwise, a LayerNorm's among them (its kernel
    /// sums its own).
    pub sum_rows: u64,
}

impl ParamTensor {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        if self.cols == 0 {
            self.rows
        } else {
            self.rows * self.cols
        }
    }
}

impl TransformerArch {
    /// Resolves a `transformer` spec (biases follow the norm: LayerNorm models
    /// are GPT-2/BERT-like with biases, RMSNorm models LLaMA-like without).
    pub fn from_spec(t: &TransformerSpec) -> Result<Self, PredictError> {
        let heads = u64::from(t.heads);
        let hidden = u64::from(t.hidden);
        let kv_heads = u64::from(t.kv_heads.unwrap_or(t.heads));
        if heads == 0 || hidden % heads != 0 {
            return Err(PredictError::Invalid(format!(
                "transformer.hidden ({hidden}) must be divisible by transformer.heads ({heads})"
            )));
        }
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(PredictError::Invalid(format!(
                "transformer.heads ({heads}) must be divisible by transformer.kvHeads ({kv_heads})"
            )));
        }
        let bias = t.norm == NormKind::Layernorm;
        let arch = TransformerArch {
            family: "transformer".into(),
            kind: t.kind,
            layers: u64::from(t.layers),
            hidden,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            ffn: u64::from(t.ffn.unwrap_or(4 * t.hidden)),
            vocab: u64::from(t.vocab),
            seq_len: u64::from(t.seq_len),
            positions: if t.positional == PositionalKind::Learned {
                u64::from(t.seq_len)
            } else {
                0
            },
            mlp: t.mlp,
            norm: t.norm,
            positional: t.positional,
            tied: t.tied_embeddings,
            linear_bias: bias,
            qkv_bias: bias,
            token_types: if t.kind == TransformerKind::Encoder {
                2
            } else {
                0
            },
            library: None,
            layout: Layout::default(),
        };
        arch.check()?;
        Ok(arch)
    }

    /// Rejects shapes that would silently predict nonsense.
    pub fn check(&self) -> Result<(), PredictError> {
        for (name, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("vocab", self.vocab),
            ("seqLen", self.seq_len),
            ("ffn", self.ffn),
        ] {
            if v == 0 {
                return Err(PredictError::Invalid(format!(
                    "{}: {name} must be at least 1",
                    self.family
                )));
            }
        }
        let usable = self.positions.saturating_sub(self.layout.position_offset);
        if self.positional == PositionalKind::Learned && self.positions > 0 && self.seq_len > usable
        {
            let offset = match self.layout.position_offset {
                0 => String::new(),
                o => format!(
                    " ({} rows, the first {o} never reached: raise max_position_embeddings)",
                    self.positions
                ),
            };
            return Err(PredictError::Invalid(format!(
                "{}: seqLen {} exceeds the {usable} learned positions{offset}",
                self.family, self.seq_len
            )));
        }
        Ok(())
    }

    /// Width of the query projection and of the attention output:
    /// `heads × head_dim`, which a config's own `head_dim` makes differ
    /// from the hidden size (Qwen2/3 and Mistral-Nemo shapes, Gemma).
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Width of the key (or value) projection.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Norm parameters: weight (+ bias for LayerNorm).
    fn norm_params(&self, layer: Option<u32>, out: &mut Vec<ParamTensor>) {
        // Hugging Face writes RMSNorm in Python (weight * normalized), and
        // LayerNorm is torch's kernel.
        let python = self.norm != NormKind::Layernorm;
        out.push(ParamTensor {
            sum_rows: if python { self.seq_len } else { 0 },
            ..vector(self.hidden, layer)
        });
        if !python {
            out.push(vector(self.hidden, layer));
        }
    }

    fn linear(
        &self,
        out_f: u64,
        in_f: u64,
        bias: bool,
        layer: Option<u32>,
        out: &mut Vec<ParamTensor>,
    ) {
        out.push(ParamTensor {
            rows: out_f,
            cols: in_f,
            layer,
            matmul_weight: true,
            sum_rows: 0,
        });
        if bias {
            out.push(ParamTensor {
                sum_rows: self.seq_len,
                ..vector(out_f, layer)
            });
        }
    }

    /// The width of the word table: the hidden size unless the family
    /// projects it ([`Layout::embed_dim`]).
    pub fn embed_dim(&self) -> u64 {
        match self.layout.embed_dim {
            0 => self.hidden,
            e => e,
        }
    }

    /// Whether a library model's loss upcasts the logits itself
    /// (`logits.float()` in transformers' causal-LM loss) before its
    /// log-softmax. BERT's and T5's `CrossEntropyLoss` take them as they
    /// are: under autocast its composite runs log-softmax in the logits'
    /// dtype and `nll_loss` (autocast's fp32 list) on an fp32 copy of it.
    pub fn loss_upcasts_logits(&self) -> bool {
        self.library
            .is_some_and(|lib| lib.family != HfFamily::Bert && !self.layout.loss_on_logits)
    }

    /// Whether eager attention keeps an fp32 softmax beside its cast: the
    /// families whose code asks for one (`softmax(..., dtype=torch.float32)`:
    /// [`Layout::softmax_fp32`], and the LLaMA family's code but T5's, which
    /// shares it here and takes the scores' dtype).
    pub fn eager_softmax_fp32(&self) -> bool {
        let llama = self
            .library
            .is_some_and(|l| l.family == HfFamily::Llama && self.layout.rel_buckets == 0);
        self.layout.softmax_fp32 || llama
    }

    /// Whether block `l` is a decoder block of an encoder-decoder.
    pub fn is_cross_block(&self, l: u64) -> bool {
        l + self.layout.decoder_layers >= self.layers && self.layout.decoder_layers > 0
    }

    /// Whether block `l` attends through a sliding-window mask: a window
    /// block once the sequence reaches the window (transformers skips the
    /// mask for shorter sequences, where the window changes nothing).
    pub fn windowed_block(&self, l: u64) -> bool {
        self.layout.sliding_window > 0
            && self.seq_len >= self.layout.sliding_window
            && self.layout.sliding_layers.contains(&l)
    }

    /// Whether block `l` has the mixture-of-experts feed-forward.
    pub fn is_moe_block(&self, l: u64) -> bool {
        self.layout
            .moe
            .as_ref()
            .is_some_and(|m| !m.dense_layers.contains(&l))
    }

    /// The attention's projections of block `l` (query, key, value, output;
    /// `cross`: of the cross-attention).
    fn attention_params(&self, layer: Option<u32>, out: &mut Vec<ParamTensor>) {
        let h = self.hidden;
        if self.library.is_none() || self.layout.fused_qkv {
            self.linear(
                self.q_dim() + 2 * self.kv_dim(),
                h,
                self.qkv_bias,
                layer,
                out,
            );
        } else {
            for rows in [self.q_dim(), self.kv_dim(), self.kv_dim()] {
                self.linear(rows, h, self.qkv_bias, layer, out);
            }
        }
        let out_bias = self.layout.out_bias.unwrap_or(self.linear_bias);
        self.linear(h, self.q_dim(), out_bias, layer, out);
    }

    /// A feed-forward of width `ffn` (gated: three matrices).
    fn ffn_params(&self, ffn: u64, layer: Option<u32>, out: &mut Vec<ParamTensor>) {
        let h = self.hidden;
        if self.mlp == MlpKind::Swiglu && self.layout.fused_gate_up {
            self.linear(2 * ffn, h, self.linear_bias, layer, out);
        } else {
            if self.mlp == MlpKind::Swiglu {
                self.linear(ffn, h, self.linear_bias, layer, out);
            }
            self.linear(ffn, h, self.linear_bias, layer, out);
        }
        self.linear(h, ffn, self.linear_bias, layer, out);
    }

    /// Parameter tensors in the order a PyTorch module creates them.
    pub fn param_tensors(&self) -> Vec<ParamTensor> {
        let mut p = Vec::new();
        let h = self.hidden;
        let lay = &self.layout;
        if let Some(img) = lay.image {
            // cls token, positions, the patch convolution (+ bias)
            p.push(vector(h, None));
            p.push(ParamTensor {
                rows: self.positions,
                cols: h,
                layer: None,
                matmul_weight: false,
                sum_rows: 0,
            });
            p.push(ParamTensor {
                rows: h,
                cols: img.channels * img.patch * img.patch,
                layer: None,
                matmul_weight: true,
                sum_rows: 0,
            });
            p.push(vector(h, None));
        } else {
            p.push(ParamTensor {
                rows: self.vocab,
                cols: self.embed_dim(),
                layer: None,
                matmul_weight: self.tied,
                sum_rows: 0,
            });
        }
        if self.positional == PositionalKind::Learned && self.positions > 0 && lay.image.is_none() {
            p.push(ParamTensor {
                rows: self.positions,
                cols: h,
                layer: None,
                matmul_weight: false,
                sum_rows: 0,
            });
        }
        if self.embed_dim() != h {
            // project_out, project_in
            self.linear(self.embed_dim(), h, false, None, &mut p);
            self.linear(h, self.embed_dim(), false, None, &mut p);
        }
        if self.kind == TransformerKind::Encoder && lay.image.is_none() {
            if self.token_types > 0 {
                p.push(ParamTensor {
                    rows: self.token_types,
                    cols: h,
                    layer: None,
                    matmul_weight: false,
                    sum_rows: 0,
                });
            }
            self.norm_params(None, &mut p);
        }
        if let Some(d) = lay.disentangled {
            p.push(ParamTensor {
                rows: d.rel_rows,
                cols: h,
                layer: None,
                matmul_weight: false,
                sum_rows: 0,
            });
            if d.rel_norm {
                self.norm_params(None, &mut p);
            }
        }
        let encoder_layers = self.layers - lay.decoder_layers;
        for l in 0..self.layers {
            let layer = Some(l as u32);
            self.norm_params(layer, &mut p);
            self.attention_params(layer, &mut p);
            if lay.rel_buckets > 0 && (l == 0 || l == encoder_layers) {
                p.push(ParamTensor {
                    rows: lay.rel_buckets,
                    cols: self.heads,
                    layer,
                    matmul_weight: false,
                    sum_rows: 0,
                });
            }
            if let Some(d) = lay.disentangled
                && !d.share_att_key
            {
                for on in [d.c2p, d.p2c] {
                    if on {
                        self.linear(self.q_dim(), h, true, layer, &mut p);
                    }
                }
            }
            if self.library.is_some_and(|l| l.qk_norm) {
                // per head: the queries' heads, then the keys'; or each
                // projection whole (OLMo 2)
                for heads in [self.heads, self.kv_heads] {
                    p.push(if lay.whole_qk_norms {
                        ParamTensor {
                            sum_rows: self.seq_len,
                            ..vector(heads * self.head_dim, layer)
                        }
                    } else {
                        ParamTensor {
                            sum_rows: self.seq_len * heads,
                            ..vector(self.head_dim, layer)
                        }
                    });
                }
            }
            if self.is_cross_block(u64::from(l as u32)) {
                self.norm_params(layer, &mut p);
                self.attention_params(layer, &mut p);
            }
            self.norm_params(layer, &mut p);
            if lay.sandwich_norms {
                self.norm_params(layer, &mut p);
                self.norm_params(layer, &mut p);
            }
            match &lay.moe {
                Some(m) if self.is_moe_block(l) => {
                    // router, then the experts' fused gate/up and down
                    self.linear(m.experts, h, false, layer, &mut p);
                    if self.library.is_some() {
                        // transformers stacks the experts: one gate_up
                        // (experts, 2 x ffn, hidden) and one down (experts,
                        // hidden, ffn) parameter; a matmul reads an expert's
                        // slice, not a leaf, so autocast caches no cast of it
                        for (rows, cols) in [
                            (m.experts * 2 * m.expert_ffn, h),
                            (m.experts * h, m.expert_ffn),
                        ] {
                            p.push(ParamTensor {
                                rows,
                                cols,
                                layer,
                                matmul_weight: false,
                                sum_rows: 0,
                            });
                        }
                    } else {
                        for _ in 0..m.experts {
                            self.ffn_params(m.expert_ffn, layer, &mut p);
                        }
                    }
                    if m.shared_ffn > 0 {
                        self.ffn_params(m.shared_ffn, layer, &mut p);
                        self.linear(1, h, false, layer, &mut p);
                    }
                }
                _ => self.ffn_params(self.ffn, layer, &mut p),
            }
        }
        if lay.decoder_layers > 0 {
            // the encoder's final norm
            self.norm_params(None, &mut p);
        }
        match self.kind {
            TransformerKind::Decoder if lay.no_final_norm => {}
            TransformerKind::Decoder => self.norm_params(None, &mut p),
            TransformerKind::Encoder if lay.image.is_some() => self.norm_params(None, &mut p),
            TransformerKind::Encoder => {
                self.linear(h, h, true, None, &mut p);
                self.norm_params(None, &mut p);
            }
        }
        if let Some(img) = lay.image {
            // the classifier reads the class token alone: one row a sample
            self.linear(img.labels, h, true, None, &mut p);
            if let Some(bias) = p.last_mut() {
                bias.sum_rows = 1;
            }
            return p;
        }
        if !self.tied {
            p.push(ParamTensor {
                rows: self.vocab,
                cols: self.embed_dim(),
                layer: None,
                matmul_weight: true,
                sum_rows: 0,
            });
        }
        if self.kind == TransformerKind::Encoder {
            // the decoder's vocabulary bias, summed over every token
            p.push(ParamTensor {
                sum_rows: self.seq_len,
                ..vector(self.vocab, None)
            });
        }
        p
    }
}

fn vector(n: u64, layer: Option<u32>) -> ParamTensor {
    ParamTensor {
        rows: n,
        cols: 0,
        layer,
        matmul_weight: false,
        sum_rows: 0,
    }
}

impl Arch {
    /// Parameter tensors in creation order.
    pub fn param_tensors(&self) -> Vec<ParamTensor> {
        match self {
            Arch::Transformer(t) => t.param_tensors(),
            Arch::Mlp { layers, hidden } => (0..*layers)
                .flat_map(|l| {
                    let layer = Some(l as u32);
                    [
                        ParamTensor {
                            rows: *hidden,
                            cols: *hidden,
                            layer,
                            matmul_weight: true,
                            sum_rows: 0,
                        },
                        // the bias, summed over the samples
                        ParamTensor {
                            sum_rows: 1,
                            ..vector(*hidden, layer)
                        },
                    ]
                })
                .collect(),
        }
    }

    /// Total parameter count.
    pub fn parameter_count(&self) -> u64 {
        self.param_tensors().iter().map(ParamTensor::numel).sum()
    }

    /// Number of blocks.
    pub fn layers(&self) -> u64 {
        match self {
            Arch::Transformer(t) => t.layers,
            Arch::Mlp { layers, .. } => *layers,
        }
    }
}
