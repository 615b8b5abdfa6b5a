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
    /// Rows of the learned position table (0 for rotary).
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
}

/// Which `transformers` modelling code builds the model: the tensors its
/// forward keeps differ by family (events/hf.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfFamily {
    /// `GPT2LMHeadModel`: fused `c_attn` (Conv1D), LayerNorm, learned positions.
    Gpt2,
    /// `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`: separate
    /// q/k/v projections, RMSNorm with an fp32 upcast, rotary, SwiGLU.
    Llama,
    /// `BertForMaskedLM`: post-norm encoder with a transform + decoder head.
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
        if self.positional == PositionalKind::Learned && self.seq_len > self.positions {
            return Err(PredictError::Invalid(format!(
                "{}: seqLen {} exceeds the {} learned positions",
                self.family, self.seq_len, self.positions
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
        out.push(vector(self.hidden, layer));
        if self.norm == NormKind::Layernorm {
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
        });
        if bias {
            out.push(vector(out_f, layer));
        }
    }

    /// Parameter tensors in the order a PyTorch module creates them.
    pub fn param_tensors(&self) -> Vec<ParamTensor> {
        let mut p = Vec::new();
        let h = self.hidden;
        p.push(ParamTensor {
            rows: self.vocab,
            cols: h,
            layer: None,
            matmul_weight: self.tied,
        });
        if self.positional == PositionalKind::Learned {
            p.push(ParamTensor {
                rows: self.positions,
                cols: h,
                layer: None,
                matmul_weight: false,
            });
        }
        if self.kind == TransformerKind::Encoder {
            p.push(ParamTensor {
                rows: self.token_types.max(1),
                cols: h,
                layer: None,
                matmul_weight: false,
            });
            self.norm_params(None, &mut p);
        }
        for l in 0..self.layers {
            let layer = Some(l as u32);
            self.norm_params(layer, &mut p);
            self.linear(
                self.q_dim() + 2 * self.kv_dim(),
                h,
                self.qkv_bias,
                layer,
                &mut p,
            );
            self.linear(h, self.q_dim(), self.linear_bias, layer, &mut p);
            if self.library.is_some_and(|l| l.qk_norm) {
                p.push(vector(self.head_dim, layer));
                p.push(vector(self.head_dim, layer));
            }
            self.norm_params(layer, &mut p);
            if self.mlp == MlpKind::Swiglu {
                self.linear(self.ffn, h, self.linear_bias, layer, &mut p);
            }
            self.linear(self.ffn, h, self.linear_bias, layer, &mut p);
            self.linear(h, self.ffn, self.linear_bias, layer, &mut p);
        }
        match self.kind {
            TransformerKind::Decoder => self.norm_params(None, &mut p),
            TransformerKind::Encoder => {
                self.linear(h, h, true, None, &mut p);
                self.norm_params(None, &mut p);
            }
        }
        if !self.tied {
            p.push(ParamTensor {
                rows: self.vocab,
                cols: h,
                layer: None,
                matmul_weight: true,
            });
        }
        if self.kind == TransformerKind::Encoder {
            p.push(vector(self.vocab, None));
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
                        },
                        vector(*hidden, layer),
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
