//! Hugging Face `config.json` -> [`TransformerArch`], for the families whose
//! memory the analytic model describes.

use serde_json::{Map, Value};

use crate::api::{HuggingFaceSpec, MlpKind, NormKind, PositionalKind, TransformerKind};

use super::PredictError;
use super::arch::{HfFamily, HfImpl, TransformerArch};

/// `model_type` values the predictor understands.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "bert", "roberta",
];

/// The largest value of each config key, as the `transformer` description's
/// schema bounds them: a config is free-form, and a huge count would make the
/// predictor allocate per layer until the controller dies.
fn max_of(key: &str) -> u64 {
    match key {
        "n_layer" | "num_hidden_layers" => 1024,
        "n_head" | "num_attention_heads" | "num_key_value_heads" => 4096,
        "n_embd" | "hidden_size" | "head_dim" => 1 << 20,
        "n_inner" | "intermediate_size" => 1 << 22,
        "type_vocab_size" => 1 << 16,
        _ => 1 << 24,
    }
}

/// Reads a present field that must be a positive integer, at most [`max_of`] the key.
fn int(cfg: &Map<String, Value>, key: &str) -> Result<u64, PredictError> {
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
fn int_or(cfg: &Map<String, Value>, key: &str, default: u64) -> Result<u64, PredictError> {
    Ok(opt_int(cfg, key)?.unwrap_or(default))
}

/// The defaults of transformers' `*Config` classes (5.x) for the keys each
/// family reads; a family's defaults are a row here, not code.
struct Defaults {
    vocab: u64,
    hidden: u64,
    layers: u64,
    heads: u64,
    /// `None`: one key/value head per query head.
    kv_heads: Option<u64>,
    /// `None`: four times the hidden size.
    ffn: Option<u64>,
}

fn defaults(model_type: &str) -> Defaults {
    let (vocab, hidden, layers, heads, kv_heads, ffn) = match model_type {
        "gpt2" => (50257, 768, 12, 12, None, None),
        "llama" => (32000, 4096, 32, 32, None, Some(11008)),
        "mistral" => (32000, 4096, 32, 32, Some(8), Some(14336)),
        "qwen2" | "qwen3" => (151936, 4096, 32, 32, None, Some(22016)),
        "phi3" => (32064, 3072, 32, 32, None, Some(8192)),
        "roberta" => (50265, 768, 12, 12, None, Some(3072)),
        // bert
        _ => (30522, 768, 12, 12, None, Some(3072)),
    };
    Defaults {
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        ffn,
    }
}

/// Reads an optional positive integer (absent or null -> `None`).
fn opt_int(cfg: &Map<String, Value>, key: &str) -> Result<Option<u64>, PredictError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => int(cfg, key).map(Some),
    }
}

fn flag(cfg: &Map<String, Value>, key: &str, default: bool) -> Result<bool, PredictError> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(key, "a boolean")),
    }
}

/// Reads an optional probability in [0, 1] (absent or null -> `default`).
fn prob(cfg: &Map<String, Value>, key: &str, default: f64) -> Result<f64, PredictError> {
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
    let d = defaults(model_type);
    let arch = match model_type {
        "gpt2" => {
            let hidden = int_or(cfg, "n_embd", d.hidden)?;
            let heads = int_or(cfg, "n_head", d.heads)?;
            TransformerArch {
                family: model_type.into(),
                kind: TransformerKind::Decoder,
                layers: int_or(cfg, "n_layer", d.layers)?,
                hidden,
                heads,
                kv_heads: heads,
                head_dim: divide(hidden, heads, "n_embd", "n_head")?,
                ffn: opt_int(cfg, "n_inner")?.unwrap_or(4 * hidden),
                vocab: int_or(cfg, "vocab_size", d.vocab)?,
                seq_len,
                positions: opt_int(cfg, "n_positions")?.unwrap_or(1024),
                mlp: MlpKind::Gelu,
                norm: NormKind::Layernorm,
                positional: PositionalKind::Learned,
                tied: flag(cfg, "tie_word_embeddings", true)?,
                linear_bias: true,
                qkv_bias: true,
                token_types: 0,
                library: Some(HfImpl {
                    family: HfFamily::Gpt2,
                    dropout: ["resid_pdrop", "embd_pdrop", "attn_pdrop"]
                        .iter()
                        .map(|k| prob(cfg, k, 0.1))
                        .collect::<Result<Vec<f64>, _>>()?
                        .iter()
                        .any(|p| *p > 0.0),
                    gelu_new: match cfg.get("activation_function") {
                        None | Some(Value::Null) => true,
                        Some(Value::String(a)) => a == "gelu_new",
                        Some(_) => return Err(bad("activation_function", "a string")),
                    },
                    use_cache: flag(cfg, "use_cache", true)?,
                    qk_norm: false,
                }),
            }
        }
        // Phi-3's fused qkv_proj and gate_up_proj hold the same weights as
        // LLaMA's separate ones; Qwen3 adds a norm of each head's queries
        // and keys and a head_dim of 128 unless the config says otherwise.
        "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" => {
            let hidden = int_or(cfg, "hidden_size", d.hidden)?;
            let heads = int_or(cfg, "num_attention_heads", d.heads)?;
            let kv_heads = int_or(cfg, "num_key_value_heads", d.kv_heads.unwrap_or(heads))?;
            if heads % kv_heads != 0 {
                return Err(PredictError::Invalid(format!(
                    "huggingFace.config.num_attention_heads ({heads}) must be divisible by num_key_value_heads ({kv_heads})"
                )));
            }
            let head_dim = match (opt_int(cfg, "head_dim")?, model_type) {
                (Some(d), _) => d,
                (None, "qwen3") => 128,
                (None, _) => divide(hidden, heads, "hidden_size", "num_attention_heads")?,
            };
            let attention_bias = flag(cfg, "attention_bias", false)?;
            TransformerArch {
                family: model_type.into(),
                kind: TransformerKind::Decoder,
                layers: int_or(cfg, "num_hidden_layers", d.layers)?,
                hidden,
                heads,
                kv_heads,
                head_dim,
                ffn: int_or(cfg, "intermediate_size", d.ffn.unwrap_or(4 * hidden))?,
                vocab: int_or(cfg, "vocab_size", d.vocab)?,
                seq_len,
                positions: 0,
                mlp: MlpKind::Swiglu,
                norm: NormKind::Rmsnorm,
                positional: PositionalKind::Rotary,
                tied: flag(cfg, "tie_word_embeddings", false)?,
                linear_bias: flag(cfg, "mlp_bias", false)?,
                // Qwen2 always has query/key/value biases.
                qkv_bias: model_type == "qwen2" || attention_bias,
                token_types: 0,
                library: Some(HfImpl {
                    family: HfFamily::Llama,
                    dropout: prob(cfg, "attention_dropout", 0.0)? > 0.0,
                    gelu_new: false,
                    use_cache: flag(cfg, "use_cache", true)?,
                    qk_norm: model_type == "qwen3",
                }),
            }
        }
        // RoBERTa's modules are BERT's (its position ids are counted from the
        // padding token, a few small integer tensors).
        "bert" | "roberta" => {
            let hidden = int_or(cfg, "hidden_size", d.hidden)?;
            let heads = int_or(cfg, "num_attention_heads", d.heads)?;
            TransformerArch {
                family: model_type.into(),
                kind: TransformerKind::Encoder,
                layers: int_or(cfg, "num_hidden_layers", d.layers)?,
                hidden,
                heads,
                kv_heads: heads,
                head_dim: divide(hidden, heads, "hidden_size", "num_attention_heads")?,
                ffn: int_or(cfg, "intermediate_size", d.ffn.unwrap_or(4 * hidden))?,
                vocab: int_or(cfg, "vocab_size", d.vocab)?,
                seq_len,
                positions: opt_int(cfg, "max_position_embeddings")?.unwrap_or(512),
                mlp: MlpKind::Gelu,
                norm: NormKind::Layernorm,
                positional: PositionalKind::Learned,
                tied: flag(cfg, "tie_word_embeddings", true)?,
                linear_bias: true,
                qkv_bias: true,
                token_types: opt_int(cfg, "type_vocab_size")?.unwrap_or(2),
                library: Some(HfImpl {
                    family: HfFamily::Bert,
                    dropout: prob(cfg, "hidden_dropout_prob", 0.1)? > 0.0
                        || prob(cfg, "attention_probs_dropout_prob", 0.1)? > 0.0,
                    gelu_new: false,
                    // An encoder returns no cache.
                    use_cache: false,
                    qk_norm: false,
                }),
            }
        }
        other => {
            return Err(PredictError::Unsupported(format!(
                "huggingFace.config.model_type '{other}' is not described analytically \
                 (supported: {}); the controller profiles such a job automatically on a CPU \
                 from its own pod (phase Profiling) unless spec.memory.request gives its budget; \
                 here, pass a captured profile with --profile FILE (python -m vramfit.profile)",
                SUPPORTED_MODEL_TYPES.join(", ")
            )));
        }
    };
    arch.check()?;
    Ok(arch)
}

fn divide(a: u64, b: u64, an: &str, bn: &str) -> Result<u64, PredictError> {
    if !a.is_multiple_of(b) {
        return Err(PredictError::Invalid(format!(
            "huggingFace.config.{an} ({a}) must be divisible by {bn} ({b})"
        )));
    }
    Ok(a / b)
}
