//! Hugging Face `config.json` -> [`TransformerArch`], for the families whose
//! memory the analytic model describes.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::api::{HuggingFaceSpec, MlpKind, NormKind, PositionalKind, TransformerKind};

use super::PredictError;
use super::arch::{Disentangled, HfFamily, HfImpl, Image, Layout, Moe, TransformerArch};

/// How a family reads one of the common shape's keys: the key and the
/// default of its transformers 5.x `*Config` class.
#[derive(Clone, Copy)]
struct Key {
    name: &'static str,
    default: Fallback,
}

/// A key's default when the config leaves it out.
#[derive(Clone, Copy)]
enum Fallback {
    /// A number.
    Of(u64),
    /// Four times the hidden size (GPT-2's `n_inner`, OPT has its own).
    FourHidden,
    /// The hidden size over the heads.
    HiddenPerHead,
    /// The query heads (one key/value head per query head).
    Heads,
    /// The value of the `layers` key (T5's `num_decoder_layers`).
    Layers,
}

const fn key(name: &'static str, default: u64) -> Key {
    Key {
        name,
        default: Fallback::Of(default),
    }
}

/// A family: the keys it reads, their defaults, and its structure as data.
/// Adding a family is adding a row (and its tests).
#[derive(Clone, Copy)]
struct Row {
    model_type: &'static str,
    /// Which modelling code the tensors follow (sequence/hf.rs).
    arm: HfFamily,
    kind: TransformerKind,
    layers: Key,
    hidden: Key,
    heads: Key,
    kv_heads: Key,
    /// `None`: hidden / heads, and no key is read.
    head_dim: Option<Key>,
    ffn: Key,
    vocab: Key,
    /// The learned position table's key (`None`: no table).
    positions: Option<Key>,
    mlp: MlpKind,
    norm: NormKind,
    tied: bool,
    /// Query/key/value biases: a key and its default, or a constant.
    qkv_bias: Flag,
    /// Biases of the feed-forward projections, and of the attention's
    /// output unless `out_bias` says otherwise.
    linear_bias: Flag,
    out_bias: Option<Flag>,
    /// Dropout probability keys and defaults: any above 0 keeps masks.
    dropout: &'static [(&'static str, f64)],
    /// The forward returns a key/value cache when `use_cache` (default true).
    cache: bool,
    qk_norm: bool,
    /// What the family adds, as data.
    features: &'static [Feature],
}

/// A boolean of the structure: constant, or a key with its default.
#[derive(Clone, Copy)]
enum Flag {
    Is(bool),
    Key(&'static str, bool),
}

/// A structural feature of a family, with the keys it reads.
#[derive(Clone, Copy)]
enum Feature {
    /// RoBERTa: positions count from `pad_token_id` + 1 (default 1), so
    /// that many rows of the position table are never reached.
    Roberta,
    /// OPT: `word_embed_proj_dim` (default: hidden), learned positions
    /// offset by 2, `do_layer_norm_before` (false: no final norm), ReLU
    /// unless `activation_function` says otherwise.
    Opt,
    /// Gemma: (1 + w) RMSNorm, sqrt(hidden) embedding scale, post-attention
    /// and post-feed-forward norms, GeGLU, and the softcapping keys with
    /// these defaults (`None`: off).
    Gemma {
        attn_softcap: Option<f64>,
        final_softcap: Option<f64>,
    },
    /// GPT-NeoX: `use_parallel_residual` (default true) and the rotated
    /// fraction of each head (`rotary_pct`, or `partial_rotary_factor` in
    /// `rope_parameters`; default 0.25).
    NeoX,
    /// Separate query/key/value projections in a LayerNorm family.
    SeparateQkv,
    /// Query, key and value weights as one tensor (GPT-2, GPT-NeoX, Phi-3).
    FusedQkv,
    /// Phi-3: the gated feed-forward's gate and up projections as one
    /// `gate_up_proj` (one weight of twice the width, one output chunked).
    FusedGateUp,
    /// Phi-3: the rotated queries and keys are concatenated with their
    /// unrotated rest, a copy.
    RotaryCat,
    /// Mixture of experts: the experts' key and default, `num_experts_per_tok`'s
    /// default, the expert width key (`None`: the `ffn` key) and default,
    /// the shared expert's key and default (Qwen2-MoE), and whether
    /// `decoder_sparse_step` and `mlp_only_layers` choose the dense blocks
    /// (Qwen's mixtures; Mixtral reads neither: every block is sparse). The
    /// experts' other name, read when the key is absent: transformers 5 maps
    /// `num_experts` to `num_local_experts` for Mixtral and Qwen3-MoE and
    /// writes the latter, while the hub's configs have either.
    Moe {
        experts: Key,
        experts_alias: Option<&'static str>,
        top_k: u64,
        expert_ffn: Option<Key>,
        shared_ffn: Option<Key>,
        sparse_step: bool,
    },
    /// T5: `num_decoder_layers`, `relative_attention_num_buckets`,
    /// `feed_forward_proj` (relu, gelu, gated-gelu, gated-silu...).
    T5,
    /// DeBERTa-v2: `relative_attention`, `position_buckets`,
    /// `max_relative_positions`, `pos_att_type`, `norm_rel_ebd`,
    /// `share_att_key`, `position_biased_input`.
    Deberta,
    /// Granite: LLaMA whose embeddings, residual branches and logits are
    /// each scaled by a constant of the config (a new tensor each, whatever
    /// the constant).
    Granite,
    /// ViT: `image_size`, `patch_size`, `num_channels`, `num_labels`.
    Vit,
    /// StarCoder2: LLaMA's attention with LayerNorms and a plain GELU
    /// feed-forward; its residual and embedding dropouts (the released
    /// models' 0.1) are not described.
    Starcoder2,
    /// OLMo 2: norms of the attention's and feed-forward's outputs only,
    /// query/key norms over each whole projection, the product with the
    /// norm's weight in fp32, the rotated queries and keys cast back.
    Olmo2,
    /// Sliding-window attention: `sliding_window` (this default when the
    /// key is absent; null: none) over the blocks `layers` names, unless
    /// the config lists each block's attention in `layer_types`, as
    /// transformers 5 writes it.
    Sliding {
        window: Option<u64>,
        layers: Windowed,
    },
}

/// Which blocks of a family attend through its sliding window.
#[derive(Clone, Copy)]
enum Windowed {
    /// Every block (Mistral, Mixtral, Phi-3).
    All,
    /// Every block but each `every`-th, counted from 1 (Gemma 2: every
    /// second; Gemma 3: `sliding_window_pattern`, default 6).
    AllBut {
        key: Option<&'static str>,
        every: u64,
    },
    /// Only with `use_sliding_window` (default false), the blocks from
    /// `max_window_layers` (default `first`) on (Qwen2, Qwen3).
    Gated { first: u64 },
}

const LLAMA: Row = Row {
    model_type: "llama",
    arm: HfFamily::Llama,
    kind: TransformerKind::Decoder,
    layers: key("num_hidden_layers", 32),
    hidden: key("hidden_size", 4096),
    heads: key("num_attention_heads", 32),
    kv_heads: Key {
        name: "num_key_value_heads",
        default: Fallback::Heads,
    },
    head_dim: Some(Key {
        name: "head_dim",
        default: Fallback::HiddenPerHead,
    }),
    ffn: key("intermediate_size", 11008),
    vocab: key("vocab_size", 32000),
    positions: None,
    mlp: MlpKind::Swiglu,
    norm: NormKind::Rmsnorm,
    tied: false,
    qkv_bias: Flag::Key("attention_bias", false),
    linear_bias: Flag::Key("mlp_bias", false),
    out_bias: Some(Flag::Key("attention_bias", false)),
    dropout: &[("attention_dropout", 0.0)],
    cache: true,
    qk_norm: false,
    features: &[],
};

const GPT2: Row = Row {
    model_type: "gpt2",
    arm: HfFamily::Gpt2,
    kind: TransformerKind::Decoder,
    layers: key("n_layer", 12),
    hidden: key("n_embd", 768),
    heads: key("n_head", 12),
    kv_heads: Key {
        name: "",
        default: Fallback::Heads,
    },
    head_dim: None,
    ffn: Key {
        name: "n_inner",
        default: Fallback::FourHidden,
    },
    vocab: key("vocab_size", 50257),
    positions: Some(key("n_positions", 1024)),
    mlp: MlpKind::Gelu,
    norm: NormKind::Layernorm,
    tied: true,
    qkv_bias: Flag::Is(true),
    linear_bias: Flag::Is(true),
    out_bias: None,
    dropout: &[
        ("resid_pdrop", 0.1),
        ("embd_pdrop", 0.1),
        ("attn_pdrop", 0.1),
    ],
    cache: true,
    qk_norm: false,
    features: &[Feature::FusedQkv],
};

const BERT: Row = Row {
    model_type: "bert",
    arm: HfFamily::Bert,
    kind: TransformerKind::Encoder,
    layers: key("num_hidden_layers", 12),
    hidden: key("hidden_size", 768),
    heads: key("num_attention_heads", 12),
    kv_heads: Key {
        name: "",
        default: Fallback::Heads,
    },
    head_dim: None,
    ffn: key("intermediate_size", 3072),
    vocab: key("vocab_size", 30522),
    positions: Some(key("max_position_embeddings", 512)),
    mlp: MlpKind::Gelu,
    norm: NormKind::Layernorm,
    tied: true,
    qkv_bias: Flag::Is(true),
    linear_bias: Flag::Is(true),
    out_bias: None,
    dropout: &[
        ("hidden_dropout_prob", 0.1),
        ("attention_probs_dropout_prob", 0.1),
    ],
    cache: false,
    qk_norm: false,
    features: &[],
};

/// The families, with the defaults of their transformers 5.x `*Config`
/// classes. Phi-3's fused qkv_proj and gate_up_proj hold the same weights as
/// LLaMA's separate ones, in fewer and larger tensors; RoBERTa's modules are
/// BERT's (its position ids are counted from the padding token, a few small
/// integer tensors).
const FAMILIES: &[Row] = &[
    GPT2,
    LLAMA,
    Row {
        model_type: "mistral",
        kv_heads: key("num_key_value_heads", 8),
        ffn: key("intermediate_size", 14336),
        qkv_bias: Flag::Is(false),
        linear_bias: Flag::Is(false),
        out_bias: None,
        features: &[Feature::Sliding {
            window: Some(4096),
            layers: Windowed::All,
        }],
        ..LLAMA
    },
    Row {
        model_type: "qwen2",
        ffn: key("intermediate_size", 22016),
        vocab: key("vocab_size", 151936),
        // Qwen2 always has query/key/value biases, never an output bias.
        qkv_bias: Flag::Is(true),
        linear_bias: Flag::Is(false),
        out_bias: None,
        features: &[Feature::Sliding {
            window: Some(4096),
            layers: Windowed::Gated { first: 28 },
        }],
        ..LLAMA
    },
    Row {
        model_type: "qwen3",
        head_dim: Some(key("head_dim", 128)),
        ffn: key("intermediate_size", 22016),
        vocab: key("vocab_size", 151936),
        linear_bias: Flag::Is(false),
        qk_norm: true,
        features: &[Feature::Sliding {
            window: Some(4096),
            layers: Windowed::Gated { first: 28 },
        }],
        ..LLAMA
    },
    Row {
        model_type: "phi3",
        hidden: key("hidden_size", 3072),
        ffn: key("intermediate_size", 8192),
        vocab: key("vocab_size", 32064),
        qkv_bias: Flag::Is(false),
        linear_bias: Flag::Is(false),
        out_bias: None,
        features: &[
            Feature::FusedQkv,
            Feature::FusedGateUp,
            Feature::RotaryCat,
            Feature::Sliding {
                window: None,
                layers: Windowed::All,
            },
        ],
        ..LLAMA
    },
    BERT,
    Row {
        model_type: "roberta",
        vocab: key("vocab_size", 50265),
        features: &[Feature::Roberta],
        ..BERT
    },
    Row {
        model_type: "gemma2",
        layers: key("num_hidden_layers", 26),
        hidden: key("hidden_size", 2304),
        heads: key("num_attention_heads", 8),
        kv_heads: key("num_key_value_heads", 4),
        head_dim: Some(key("head_dim", 256)),
        ffn: key("intermediate_size", 9216),
        vocab: key("vocab_size", 256000),
        tied: true,
        linear_bias: Flag::Is(false),
        features: &[
            Feature::Gemma {
                attn_softcap: Some(50.0),
                final_softcap: Some(30.0),
            },
            Feature::Sliding {
                window: Some(4096),
                layers: Windowed::AllBut {
                    key: None,
                    every: 2,
                },
            },
        ],
        ..LLAMA
    },
    Row {
        model_type: "gemma3_text",
        layers: key("num_hidden_layers", 26),
        hidden: key("hidden_size", 2304),
        heads: key("num_attention_heads", 8),
        kv_heads: key("num_key_value_heads", 4),
        head_dim: Some(key("head_dim", 256)),
        ffn: key("intermediate_size", 9216),
        vocab: key("vocab_size", 262208),
        tied: true,
        linear_bias: Flag::Is(false),
        qk_norm: true,
        features: &[
            Feature::Gemma {
                attn_softcap: None,
                final_softcap: None,
            },
            Feature::Sliding {
                window: Some(4096),
                layers: Windowed::AllBut {
                    key: Some("sliding_window_pattern"),
                    every: 6,
                },
            },
        ],
        ..LLAMA
    },
    Row {
        model_type: "mixtral",
        kv_heads: key("num_key_value_heads", 8),
        ffn: key("intermediate_size", 14336),
        qkv_bias: Flag::Is(false),
        linear_bias: Flag::Is(false),
        out_bias: None,
        features: &[
            Feature::Moe {
                experts: key("num_local_experts", 8),
                experts_alias: Some("num_experts"),
                top_k: 2,
                expert_ffn: None,
                shared_ffn: None,
                sparse_step: false,
            },
            Feature::Sliding {
                window: None,
                layers: Windowed::All,
            },
        ],
        ..LLAMA
    },
    Row {
        model_type: "qwen2_moe",
        layers: key("num_hidden_layers", 24),
        hidden: key("hidden_size", 2048),
        heads: key("num_attention_heads", 16),
        kv_heads: key("num_key_value_heads", 16),
        ffn: key("intermediate_size", 5632),
        vocab: key("vocab_size", 151936),
        qkv_bias: Flag::Key("qkv_bias", true),
        linear_bias: Flag::Is(false),
        out_bias: None,
        features: &[Feature::Moe {
            experts: key("num_experts", 60),
            experts_alias: None,
            top_k: 4,
            expert_ffn: Some(key("moe_intermediate_size", 1408)),
            shared_ffn: Some(key("shared_expert_intermediate_size", 5632)),
            sparse_step: true,
        }],
        ..LLAMA
    },
    Row {
        model_type: "granite",
        features: &[Feature::Granite],
        ..LLAMA
    },
    Row {
        model_type: "qwen3_moe",
        layers: key("num_hidden_layers", 24),
        hidden: key("hidden_size", 2048),
        heads: key("num_attention_heads", 32),
        kv_heads: key("num_key_value_heads", 4),
        ffn: key("intermediate_size", 6144),
        vocab: key("vocab_size", 151936),
        linear_bias: Flag::Is(false),
        qk_norm: true,
        features: &[Feature::Moe {
            experts: key("num_experts", 128),
            experts_alias: Some("num_local_experts"),
            top_k: 8,
            expert_ffn: Some(key("moe_intermediate_size", 768)),
            shared_ffn: None,
            sparse_step: true,
        }],
        ..LLAMA
    },
    Row {
        model_type: "starcoder2",
        layers: key("num_hidden_layers", 30),
        hidden: key("hidden_size", 3072),
        heads: key("num_attention_heads", 24),
        kv_heads: key("num_key_value_heads", 2),
        ffn: key("intermediate_size", 12288),
        vocab: key("vocab_size", 49152),
        mlp: MlpKind::Gelu,
        norm: NormKind::Layernorm,
        tied: true,
        qkv_bias: Flag::Key("use_bias", true),
        linear_bias: Flag::Key("use_bias", true),
        out_bias: None,
        features: &[
            Feature::Starcoder2,
            Feature::Sliding {
                window: None,
                layers: Windowed::All,
            },
        ],
        ..LLAMA
    },
    Row {
        model_type: "olmo2",
        ffn: key("intermediate_size", 11008),
        vocab: key("vocab_size", 50304),
        linear_bias: Flag::Is(false),
        qk_norm: true,
        features: &[Feature::Olmo2],
        ..LLAMA
    },
    Row {
        model_type: "gpt_neox",
        layers: key("num_hidden_layers", 44),
        hidden: key("hidden_size", 6144),
        heads: key("num_attention_heads", 64),
        ffn: key("intermediate_size", 24576),
        vocab: key("vocab_size", 50432),
        positions: None,
        tied: false,
        qkv_bias: Flag::Key("attention_bias", true),
        linear_bias: Flag::Is(true),
        out_bias: Some(Flag::Key("attention_bias", true)),
        dropout: &[("attention_dropout", 0.0), ("hidden_dropout", 0.0)],
        features: &[Feature::NeoX, Feature::FusedQkv],
        ..GPT2
    },
    Row {
        model_type: "opt",
        layers: key("num_hidden_layers", 12),
        hidden: key("hidden_size", 768),
        heads: key("num_attention_heads", 12),
        ffn: key("ffn_dim", 3072),
        vocab: key("vocab_size", 50272),
        positions: Some(key("max_position_embeddings", 2048)),
        qkv_bias: Flag::Key("enable_bias", true),
        linear_bias: Flag::Key("enable_bias", true),
        out_bias: None,
        dropout: &[("dropout", 0.1), ("attention_dropout", 0.0)],
        features: &[Feature::Opt, Feature::SeparateQkv],
        ..GPT2
    },
    Row {
        model_type: "t5",
        layers: key("num_layers", 6),
        hidden: key("d_model", 512),
        heads: key("num_heads", 8),
        kv_heads: Key {
            name: "",
            default: Fallback::Heads,
        },
        head_dim: Some(key("d_kv", 64)),
        ffn: key("d_ff", 2048),
        vocab: key("vocab_size", 32128),
        mlp: MlpKind::Gelu,
        tied: true,
        qkv_bias: Flag::Is(false),
        linear_bias: Flag::Is(false),
        out_bias: None,
        dropout: &[("dropout_rate", 0.1)],
        features: &[Feature::T5],
        ..LLAMA
    },
    Row {
        model_type: "deberta-v2",
        layers: key("num_hidden_layers", 24),
        hidden: key("hidden_size", 1536),
        heads: key("num_attention_heads", 24),
        ffn: key("intermediate_size", 6144),
        vocab: key("vocab_size", 128100),
        features: &[Feature::Deberta],
        ..BERT
    },
    Row {
        model_type: "vit",
        vocab: key("", 0),
        positions: None,
        qkv_bias: Flag::Key("qkv_bias", true),
        dropout: &[
            ("hidden_dropout_prob", 0.0),
            ("attention_probs_dropout_prob", 0.0),
        ],
        features: &[Feature::Vit, Feature::SeparateQkv],
        ..BERT
    },
];

/// `model_type` values the predictor understands.
pub fn supported_model_types() -> Vec<&'static str> {
    FAMILIES.iter().map(|r| r.model_type).collect()
}

/// A config as a family reads it: every key looked up is remembered, so that
/// a config of an unknown `model_type` is served by a family only when it
/// has every key that family reads.
struct Config<'a> {
    map: &'a Map<String, Value>,
    read: RefCell<BTreeSet<String>>,
}

impl<'a> Config<'a> {
    fn new(map: &'a Map<String, Value>) -> Self {
        Config {
            map,
            read: RefCell::default(),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.read.borrow_mut().insert(key.to_owned());
        self.map.get(key)
    }

    /// The keys read so far that the config does not have (a key set to
    /// null is there: transformers writes null for "the default").
    fn missing(&self) -> Vec<String> {
        self.read
            .borrow()
            .iter()
            .filter(|k| !self.map.contains_key(k.as_str()))
            .cloned()
            .collect()
    }
}

/// The largest value of each config key, as the `transformer` description's
/// schema bounds them: a config is free-form, and a huge count would make the
/// predictor allocate per layer until the controller dies.
fn max_of(key: &str) -> u64 {
    match key {
        "n_layer" | "num_hidden_layers" | "num_layers" | "num_decoder_layers" => 1024,
        "n_head" | "num_attention_heads" | "num_key_value_heads" | "num_heads" => 4096,
        "n_embd" | "hidden_size" | "head_dim" | "d_model" | "d_kv" | "word_embed_proj_dim" => {
            1 << 20
        }
        "n_inner"
        | "intermediate_size"
        | "ffn_dim"
        | "d_ff"
        | "moe_intermediate_size"
        | "shared_expert_intermediate_size" => 1 << 22,
        "type_vocab_size" => 1 << 16,
        "num_experts" | "num_local_experts" | "num_experts_per_tok" => 4096,
        "image_size" => 1 << 16,
        _ => 1 << 24,
    }
}

/// Reads a present field that must be a positive integer, at most [`max_of`] the key.
fn int(cfg: &Config<'_>, key: &str) -> Result<u64, PredictError> {
    let max = max_of(key);
    let want = || format!("a positive integer of at most {max}");
    match cfg.get(key) {
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|v| (1..=max).contains(v))
            .ok_or_else(|| bad(key, &want())),
        _ => Err(bad(key, &want())),
    }
}

/// Reads a positive integer, `default` when absent or null: transformers'
/// own default for the key, so a config that leaves a key out is read as the
/// library reads it.
fn int_or(cfg: &Config<'_>, key: &str, default: u64) -> Result<u64, PredictError> {
    Ok(opt_int(cfg, key)?.unwrap_or(default))
}

/// Whether the attention probabilities get dropout: the family's attention
/// keys (`attn` or `attention` in the name) when it has any, else its one
/// rate (T5's `dropout_rate` applies to the probabilities too).
fn attention_dropout(probs: &[(&str, f64)]) -> bool {
    let attention: Vec<f64> = probs
        .iter()
        .filter(|(k, _)| k.contains("attn") || k.contains("attention"))
        .map(|(_, p)| *p)
        .collect();
    if attention.is_empty() {
        probs.iter().any(|(_, p)| *p > 0.0)
    } else {
        attention.iter().any(|p| *p > 0.0)
    }
}

/// `type_vocab_size`, which may be 0 (DeBERTa-v3 has no token-type table),
/// `default` when absent or null.
fn token_types(cfg: &Config<'_>, default: u64) -> Result<u64, PredictError> {
    count_or(cfg, "type_vocab_size", default)
}

/// A non-negative integer (a count or an id that may be 0), `default` when
/// absent or null.
fn count_or(cfg: &Config<'_>, key: &str, default: u64) -> Result<u64, PredictError> {
    match cfg.get(key) {
        Some(Value::Number(n)) if n.as_u64() == Some(0) => Ok(0),
        _ => int_or(cfg, key, default),
    }
}

/// Reads an optional positive integer (absent or null -> `None`).
fn opt_int(cfg: &Config<'_>, key: &str) -> Result<Option<u64>, PredictError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => int(cfg, key).map(Some),
    }
}

fn flag(cfg: &Config<'_>, key: &str, default: bool) -> Result<bool, PredictError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(key, "a boolean")),
    }
}

/// Reads an optional probability in [0, 1] (absent or null -> `default`).
fn prob(cfg: &Config<'_>, key: &str, default: f64) -> Result<f64, PredictError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|p| (0.0..=1.0).contains(p))
            .ok_or_else(|| bad(key, "a number in [0, 1]")),
        Some(_) => Err(bad(key, "a number in [0, 1]")),
    }
}

fn bad(key: &str, want: &str) -> PredictError {
    PredictError::Invalid(format!("huggingFace.config.{key} must be {want}"))
}

/// Reads an optional string (absent or null -> `default`).
fn string<'a>(cfg: &Config<'a>, key: &str, default: &'a str) -> Result<&'a str, PredictError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(bad(key, "a string")),
    }
}

/// Reads an optional number (absent -> `default`; null -> `None`, "off").
fn opt_number(
    cfg: &Config<'_>,
    key: &str,
    default: Option<f64>,
) -> Result<Option<f64>, PredictError> {
    match cfg.get(key) {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(bad(key, "a number or null")),
    }
}

/// Reads a key whose non-default values the analytic model does not describe.
fn only_default(cfg: &Config<'_>, key: &str, default: bool) -> Result<(), PredictError> {
    if flag(cfg, key, default)? != default {
        return Err(PredictError::Unsupported(format!(
            "huggingFace.config.{key} = {} is not described analytically; \
             the controller profiles such a job automatically",
            !default
        )));
    }
    Ok(())
}

impl Flag {
    fn read(self, cfg: &Config<'_>) -> Result<bool, PredictError> {
        match self {
            Flag::Is(b) => Ok(b),
            Flag::Key(k, d) => flag(cfg, k, d),
        }
    }
}

impl Key {
    /// The key's value; `hidden`, `heads` and `layers` resolve the defaults
    /// that depend on them.
    fn read(
        self,
        cfg: &Config<'_>,
        hidden: u64,
        heads: u64,
        layers: u64,
    ) -> Result<u64, PredictError> {
        let default = match self.default {
            Fallback::Of(v) => v,
            Fallback::FourHidden => 4 * hidden,
            Fallback::Heads => heads,
            Fallback::Layers => layers,
            Fallback::HiddenPerHead => {
                if self.name.is_empty() || opt_int(cfg, self.name)?.is_none() {
                    return divide(hidden, heads.max(1), "hidden_size", "num_attention_heads");
                }
                0
            }
        };
        if self.name.is_empty() {
            return Ok(default);
        }
        int_or(cfg, self.name, default)
    }
}

/// Maps a Hugging Face model onto the transformer description.
pub fn arch_from_hugging_face(spec: &HuggingFaceSpec) -> Result<TransformerArch, PredictError> {
    let cfg = &spec.config;
    if let Some(path) = crate::api::free_form::too_deep(cfg) {
        return Err(PredictError::Invalid(format!(
            "huggingFace.config.{path} is nested deeper than {} levels",
            crate::api::free_form::MAX_DEPTH
        )));
    }
    let model_type = match cfg.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(bad("model_type", "a string")),
        None => {
            return Err(PredictError::Missing(
                "huggingFace.config.model_type".into(),
            ));
        }
    };
    let seq_len = u64::from(spec.seq_len);
    let arch = match FAMILIES.iter().find(|r| r.model_type == model_type) {
        Some(row) => from_row(row, &Config::new(cfg), seq_len)?,
        None => by_keys(model_type, cfg, seq_len)?,
    };
    arch.check()?;
    Ok(arch)
}

/// The description of a config of an unknown `model_type`: served by the
/// family that reads only keys the config has (a copy of a known family's
/// config under another name), refused otherwise. Of several such families,
/// one that reads a strict subset of another's keys reads less of the config
/// and gives way to it; families left that describe the same model are one
/// match.
fn by_keys(
    model_type: &str,
    cfg: &Map<String, Value>,
    seq_len: u64,
) -> Result<TransformerArch, PredictError> {
    let mut fits: Vec<(&'static str, BTreeSet<String>, TransformerArch)> = Vec::new();
    for row in FAMILIES {
        let config = Config::new(cfg);
        if let Ok(arch) = from_row(row, &config, seq_len)
            && config.missing().is_empty()
        {
            fits.push((row.model_type, config.read.into_inner(), arch));
        }
    }
    let mut matches: Vec<(&'static str, TransformerArch)> = Vec::new();
    for (family, keys, arch) in &fits {
        let outread = fits
            .iter()
            .any(|(_, other, _)| keys.len() < other.len() && keys.is_subset(other));
        if !outread && !matches.iter().any(|(_, a)| same_model(a, arch)) {
            matches.push((family, arch.clone()));
        }
    }
    match matches.len() {
        1 => {
            let (family, mut arch) = matches.remove(0);
            arch.family = format!("{family} (by the keys of model_type '{model_type}')");
            Ok(arch)
        }
        0 => Err(PredictError::Unsupported(format!(
            "huggingFace.config.model_type '{model_type}' is not described analytically, and no \
             supported family reads only keys this config has (supported: {}); the controller \
             profiles such a job automatically on a CPU from its own pod (phase Profiling) \
             unless spec.memory.request gives its budget; here, pass a captured profile with \
             --profile FILE (python -m vramfit.profile)",
            supported_model_types().join(", ")
        ))),
        _ => Err(PredictError::Unsupported(format!(
            "huggingFace.config.model_type '{model_type}' is not described analytically, and \
             its keys fit several families that describe different models ({}); set \
             model_type to the one it is, or let the controller profile the job \
             automatically (phase Profiling)",
            matches
                .iter()
                .map(|(f, _)| *f)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Whether two descriptions are of the same model, whatever family named them.
fn same_model(a: &TransformerArch, b: &TransformerArch) -> bool {
    let unnamed = |t: &TransformerArch| TransformerArch {
        family: String::new(),
        ..t.clone()
    };
    unnamed(a) == unnamed(b)
}

/// The description of a config of the family `row`.
fn from_row(row: &Row, cfg: &Config<'_>, seq_len: u64) -> Result<TransformerArch, PredictError> {
    let hidden = row.hidden.read(cfg, 0, 0, 0)?;
    let heads = row.heads.read(cfg, 0, 0, 0)?;
    let layers = row.layers.read(cfg, 0, 0, 0)?;
    let kv_heads = row.kv_heads.read(cfg, hidden, heads, layers)?;
    if heads % kv_heads != 0 {
        return Err(PredictError::Invalid(format!(
            "huggingFace.config.{} ({heads}) must be divisible by {} ({kv_heads})",
            row.heads.name, row.kv_heads.name
        )));
    }
    let head_dim = match row.head_dim {
        Some(k) => k.read(cfg, hidden, heads, layers)?,
        None => divide(hidden, heads, row.hidden.name, row.heads.name)?,
    };
    let probs = row
        .dropout
        .iter()
        .map(|(k, d)| Ok((*k, prob(cfg, k, *d)?)))
        .collect::<Result<Vec<(&str, f64)>, PredictError>>()?;
    let dropout = probs.iter().any(|(_, p)| *p > 0.0);
    let attn_dropout = attention_dropout(&probs);
    let linear_bias = row.linear_bias.read(cfg)?;
    let out_bias = match row.out_bias {
        Some(f) => Some(f.read(cfg)?).filter(|b| *b != linear_bias),
        None => None,
    };
    let mut arch = TransformerArch {
        family: row.model_type.into(),
        kind: row.kind,
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        ffn: row.ffn.read(cfg, hidden, heads, layers)?,
        vocab: row.vocab.read(cfg, hidden, heads, layers)?,
        seq_len,
        positions: match row.positions {
            Some(k) => k.read(cfg, hidden, heads, layers)?,
            None => 0,
        },
        mlp: row.mlp,
        norm: row.norm,
        positional: match row.positions {
            Some(_) => PositionalKind::Learned,
            None => PositionalKind::Rotary,
        },
        tied: flag(cfg, "tie_word_embeddings", row.tied)?,
        linear_bias,
        qkv_bias: row.qkv_bias.read(cfg)?,
        token_types: match row.kind {
            // DeBERTa reads its own (0 allowed) below; BERT's table cannot be empty.
            TransformerKind::Encoder
                if row.features.iter().any(|f| matches!(f, Feature::Deberta)) =>
            {
                0
            }
            TransformerKind::Encoder => opt_int(cfg, "type_vocab_size")?.unwrap_or(2),
            TransformerKind::Decoder => 0,
        },
        library: Some(HfImpl {
            family: row.arm,
            dropout,
            attn_dropout,
            gelu_new: row.model_type == "gpt2"
                && match cfg.get("activation_function") {
                    None | Some(Value::Null) => true,
                    Some(Value::String(a)) => a == "gelu_new",
                    Some(_) => return Err(bad("activation_function", "a string")),
                },
            // An encoder returns no cache.
            use_cache: row.cache && flag(cfg, "use_cache", true)?,
            qk_norm: row.qk_norm,
        }),
        layout: Layout {
            out_bias,
            ..Layout::default()
        },
    };
    for f in row.features {
        apply(*f, cfg, &mut arch)?;
    }
    Ok(arch)
}

/// Reads what `feature` adds into `a`.
fn apply(feature: Feature, cfg: &Config<'_>, a: &mut TransformerArch) -> Result<(), PredictError> {
    let lay = &mut a.layout;
    match feature {
        Feature::Roberta => {
            lay.position_offset = count_or(cfg, "pad_token_id", 1)? + 1;
        }
        Feature::Opt => {
            lay.softmax_fp32 = true;
            lay.embed_dim = int_or(cfg, "word_embed_proj_dim", a.hidden)?;
            lay.position_offset = 2;
            a.positions += 2;
            lay.no_final_norm = !flag(cfg, "do_layer_norm_before", true)?
                || flag(cfg, "_remove_final_layer_norm", false)?;
            lay.relu = string(cfg, "activation_function", "relu")? == "relu";
            only_default(cfg, "layer_norm_elementwise_affine", true)?;
        }
        Feature::Gemma {
            attn_softcap,
            final_softcap,
        } => {
            lay.sandwich_norms = true;
            lay.offset_norms = true;
            lay.embed_scale = true;
            lay.attn_softcap = opt_number(cfg, "attn_logit_softcapping", attn_softcap)?.is_some();
            lay.final_softcap =
                opt_number(cfg, "final_logit_softcapping", final_softcap)?.is_some();
        }
        Feature::Granite => {
            // the constants do not change the memory, but a config that
            // has them is Granite's, not LLaMA's
            for key in [
                "embedding_multiplier",
                "residual_multiplier",
                "logits_scaling",
                "attention_multiplier",
            ] {
                opt_number(cfg, key, Some(1.0))?;
            }
            lay.embed_scale = true;
            lay.residual_scale = true;
            lay.logits_scaled = true;
        }
        Feature::NeoX => {
            lay.softmax_fp32 = true;
            lay.parallel_residual = flag(cfg, "use_parallel_residual", true)?;
            let nested = match cfg.get("rope_parameters") {
                Some(Value::Object(r)) => {
                    opt_number(&Config::new(r), "partial_rotary_factor", None)?
                }
                _ => None,
            };
            let pct = match opt_number(cfg, "rotary_pct", None)? {
                Some(p) => p,
                None => nested.unwrap_or(0.25),
            };
            if !(0.0..=1.0).contains(&pct) {
                return Err(bad("rotary_pct", "a number in [0, 1]"));
            }
            lay.rotary_dims = ((a.head_dim as f64) * pct) as u64;
        }
        Feature::SeparateQkv => lay.separate_qkv = true,
        Feature::FusedGateUp => lay.fused_gate_up = true,
        Feature::FusedQkv => lay.fused_qkv = true,
        Feature::RotaryCat => lay.rotary_cat = true,
        Feature::Moe {
            experts,
            experts_alias,
            top_k,
            expert_ffn,
            shared_ffn,
            sparse_step,
        } => {
            let n = match (opt_int(cfg, experts.name)?, experts_alias) {
                (None, Some(alias)) => match opt_int(cfg, alias)? {
                    Some(n) => n,
                    None => experts.read(cfg, 0, 0, 0)?,
                },
                _ => experts.read(cfg, 0, 0, 0)?,
            };
            let k = int_or(cfg, "num_experts_per_tok", top_k)?;
            if k > n {
                return Err(PredictError::Invalid(format!(
                    "huggingFace.config.num_experts_per_tok ({k}) must be at most {} ({n})",
                    experts.name
                )));
            }
            let dense_layers = if sparse_step {
                // Qwen's mixtures: their windows are not described
                only_default(cfg, "use_sliding_window", false)?;
                let step = int_or(cfg, "decoder_sparse_step", 1)?;
                if step == 0 {
                    return Err(bad("decoder_sparse_step", "at least 1"));
                }
                let only: Vec<u64> = match cfg.get("mlp_only_layers") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(v)) => v
                        .iter()
                        .map(|x| {
                            x.as_u64()
                                .ok_or_else(|| bad("mlp_only_layers", "a list of layer indices"))
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => return Err(bad("mlp_only_layers", "a list of layer indices")),
                };
                (0..a.layers)
                    .filter(|l| only.contains(l) || (l + 1) % step != 0)
                    .collect()
            } else {
                Vec::new()
            };
            lay.moe = Some(Moe {
                experts: n,
                top_k: k,
                expert_ffn: match expert_ffn {
                    Some(e) => e.read(cfg, 0, 0, 0)?,
                    None => a.ffn,
                },
                shared_ffn: match shared_ffn {
                    Some(e) => opt_int(cfg, e.name)?
                        .or(match e.default {
                            Fallback::Of(v) => Some(v),
                            _ => None,
                        })
                        .unwrap_or(0),
                    None => 0,
                },
                dense_layers,
            });
        }
        Feature::T5 => {
            let decoder = Key {
                name: "num_decoder_layers",
                default: Fallback::Layers,
            }
            .read(cfg, 0, 0, a.layers)?;
            lay.decoder_layers = decoder;
            lay.loss_on_logits = true;
            a.layers += decoder;
            lay.rel_buckets = int_or(cfg, "relative_attention_num_buckets", 32)?;
            // "gated-gelu" or "gelu", as transformers splits it
            let proj = string(cfg, "feed_forward_proj", "relu")?;
            let parts: Vec<&str> = proj.split('-').collect();
            let (gated, act) = match parts.as_slice() {
                [act] => (false, *act),
                ["gated", act] => (true, *act),
                _ => {
                    return Err(bad(
                        "feed_forward_proj",
                        "an activation or `gated-` and an activation",
                    ));
                }
            };
            a.mlp = if gated {
                MlpKind::Swiglu
            } else {
                MlpKind::Gelu
            };
            lay.relu = !gated && act == "relu";
            // transformers runs `gated-gelu` with gelu_new
            lay.gate_gelu_new = gated && act == "gelu";
            a.positional = PositionalKind::Learned;
            // transformers 5.x ties T5's head always: a config's `false`
            // only turns off the decoder output's scaling (v1.1).
            lay.decoder_output_scaled = flag(cfg, "tie_word_embeddings", true)?;
            a.tied = true;
        }
        Feature::Deberta => {
            a.token_types = token_types(cfg, 0)?;
            lay.keeps_hidden_states = true;
            lay.own_attention = true;
            if !flag(cfg, "position_biased_input", true)? {
                a.positions = 0;
            }
            if let Some(e) = opt_int(cfg, "embedding_size")?
                && e != a.hidden
            {
                return Err(PredictError::Unsupported(
                    "huggingFace.config.embedding_size different from hidden_size is not described analytically".into(),
                ));
            }
            if opt_int(cfg, "conv_kernel_size")?.is_some() {
                return Err(PredictError::Unsupported(
                    "huggingFace.config.conv_kernel_size (DeBERTa's convolution layer) is not described analytically".into(),
                ));
            }
            if flag(cfg, "relative_attention", false)? {
                let signed = |k: &str, d: i64| -> Result<i64, PredictError> {
                    match cfg.get(k) {
                        None | Some(Value::Null) => Ok(d),
                        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| bad(k, "an integer")),
                        Some(_) => Err(bad(k, "an integer")),
                    }
                };
                let buckets = signed("position_buckets", -1)?;
                let mut max_rel = signed("max_relative_positions", -1)?;
                if max_rel < 1 {
                    max_rel = a.positions.max(512) as i64;
                    if let Some(p) = opt_int(cfg, "max_position_embeddings")? {
                        max_rel = p as i64;
                    }
                }
                let rows = if buckets > 0 {
                    buckets * 2
                } else {
                    max_rel * 2
                };
                let types: Vec<String> = match cfg.get("pos_att_type") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::String(s)) => {
                        s.split('|').map(|t| t.trim().to_lowercase()).collect()
                    }
                    Some(Value::Array(v)) => v
                        .iter()
                        .map(|x| {
                            x.as_str()
                                .map(str::to_lowercase)
                                .ok_or_else(|| bad("pos_att_type", "a list of strings"))
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => return Err(bad("pos_att_type", "a list of strings")),
                };
                let norm = string(cfg, "norm_rel_ebd", "none")?;
                lay.disentangled = Some(Disentangled {
                    rel_rows: u64::try_from(rows).unwrap_or(0).min(1 << 24),
                    rel_norm: norm.split('|').any(|x| x.trim() == "layer_norm"),
                    c2p: types.iter().any(|t| t == "c2p"),
                    p2c: types.iter().any(|t| t == "p2c"),
                    share_att_key: flag(cfg, "share_att_key", false)?,
                });
            }
        }
        Feature::Vit => {
            lay.softmax_fp32 = true;
            let image = int_or(cfg, "image_size", 224)?;
            let patch = int_or(cfg, "patch_size", 16)?;
            let channels = int_or(cfg, "num_channels", 3)?;
            let labels = match (opt_int(cfg, "num_labels")?, cfg.get("id2label")) {
                (Some(n), _) => n,
                (None, Some(Value::Object(m))) if !m.is_empty() => m.len() as u64,
                _ => 2,
            };
            let side = image / patch;
            let tokens = side * side + 1;
            if a.seq_len != tokens {
                return Err(PredictError::Invalid(format!(
                    "huggingFace.seqLen must be {tokens} for this vit config: the tokens of one \
                     image, (image_size / patch_size)^2 + 1 = ({image} / {patch})^2 + 1 \
                     (the batch counts images)"
                )));
            }
            a.positions = tokens;
            a.positional = PositionalKind::Learned;
            a.vocab = labels;
            a.token_types = 0;
            lay.image = Some(Image {
                patch,
                channels,
                labels,
            });
        }
        Feature::Starcoder2 => {
            for key in ["residual_dropout", "embedding_dropout"] {
                if prob(cfg, key, 0.0)? > 0.0 {
                    return Err(PredictError::Unsupported(format!(
                        "huggingFace.config.{key} above 0 is not described analytically for \
                         starcoder2; the controller profiles such a job automatically"
                    )));
                }
            }
        }
        Feature::Olmo2 => {
            lay.post_norms_only = true;
            lay.whole_qk_norms = true;
            lay.offset_norms = true;
            lay.rope_cast_back = true;
        }
        Feature::Sliding { window, layers } => {
            let on = match layers {
                Windowed::Gated { .. } => flag(cfg, "use_sliding_window", false)?,
                _ => true,
            };
            let window = match cfg.get("sliding_window") {
                _ if !on => None,
                None => window,
                Some(Value::Null) => None,
                // Qwen's configs write 0 for "none"
                Some(Value::Number(n)) if n.as_u64() == Some(0) => None,
                Some(_) => Some(int(cfg, "sliding_window")?),
            };
            let Some(window) = window else {
                return Ok(());
            };
            lay.sliding_window = window;
            lay.sliding_layers = match listed_layer_types(cfg, a.layers)? {
                Some(sliding) => sliding,
                None => match layers {
                    Windowed::All => (0..a.layers).collect(),
                    Windowed::AllBut { key, every } => {
                        let every = match key {
                            Some(k) => int_or(cfg, k, every)?,
                            None => every,
                        };
                        (0..a.layers).filter(|l| (l + 1) % every != 0).collect()
                    }
                    Windowed::Gated { first } => {
                        let first = count_or(cfg, "max_window_layers", first)?;
                        (first..a.layers).collect()
                    }
                },
            };
        }
    }
    Ok(())
}

/// The blocks whose `layer_types` entry is `sliding_attention`, when the
/// config lists one entry per block (transformers 5 writes the list, and
/// its model follows it over the family's pattern). The list is read
/// without counting as a key the family needs: a config without it is
/// read by the pattern.
fn listed_layer_types(cfg: &Config<'_>, layers: u64) -> Result<Option<Vec<u64>>, PredictError> {
    let want = || bad("layer_types", "a list of one attention type per block");
    match cfg.map.get("layer_types") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(types)) if types.len() as u64 == layers => types
            .iter()
            .zip(0..)
            .filter_map(|(t, l)| match t.as_str() {
                Some("sliding_attention") => Some(Ok(l)),
                Some(_) => None,
                None => Some(Err(want())),
            })
            .collect::<Result<Vec<u64>, _>>()
            .map(Some),
        Some(_) => Err(want()),
    }
}

fn divide(a: u64, b: u64, an: &str, bn: &str) -> Result<u64, PredictError> {
    if !a.is_multiple_of(b) {
        return Err(PredictError::Invalid(format!(
            "huggingFace.config.{an} ({a}) must be divisible by {bn} ({b})"
        )));
    }
    Ok(a / b)
}

#[cfg(test)]
#[path = "hf_tests.rs"]
mod tests;
