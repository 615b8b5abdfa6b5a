//! The model description inside a `TrainingJob`: what the predictor needs to know
//! to estimate a training step's peak GPU memory.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Numeric precision of weights, gradients, optimizer state and maths, in the words
/// PyTorch users use.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// fp32 weights and maths.
    #[default]
    #[serde(rename = "fp32")]
    Fp32,
    /// Weights, gradients and optimizer state all in bfloat16.
    #[serde(rename = "bf16")]
    Bf16,
    /// Weights, gradients and optimizer state all in float16.
    #[serde(rename = "fp16")]
    Fp16,
    /// fp32 weights under `torch.autocast(dtype=torch.bfloat16)`.
    #[serde(rename = "amp-bf16")]
    AmpBf16,
    /// fp32 weights under `torch.autocast(dtype=torch.float16)` with a GradScaler.
    #[serde(rename = "amp-fp16")]
    AmpFp16,
}

/// The optimizer; it decides how much state is kept per parameter.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Optimizer {
    /// Plain SGD: no state.
    #[serde(rename = "sgd")]
    Sgd,
    /// SGD with momentum: one buffer per parameter.
    #[serde(rename = "sgd-momentum")]
    SgdMomentum,
    /// Adam: two moments per parameter.
    #[serde(rename = "adam")]
    Adam,
    /// AdamW: two moments per parameter.
    #[default]
    #[serde(rename = "adamw")]
    AdamW,
    /// Adagrad: one sum of squares per parameter.
    #[serde(rename = "adagrad")]
    Adagrad,
    /// Adafactor: factored second moments (a row and a column vector per matrix).
    #[serde(rename = "adafactor")]
    Adafactor,
    /// 8-bit AdamW (bitsandbytes): two 8-bit moments plus block-wise scales.
    #[serde(rename = "adamw-8bit")]
    AdamW8bit,
}

/// How attention scores are computed; eager attention materialises the
/// sequence-by-sequence score matrix, the fused kernels do not.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// `torch.nn.functional.scaled_dot_product_attention` (fused, memory-efficient).
    #[default]
    Sdpa,
    /// FlashAttention kernels.
    Flash,
    /// Explicit softmax(QK^T)V, with the seq x seq scores kept for backward.
    Eager,
}

/// Decoder (causal LM head) or encoder (BERT-style masked LM head).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum TransformerKind {
    /// GPT/LLaMA-style causal language model.
    #[default]
    Decoder,
    /// BERT-style encoder with a masked-LM head.
    Encoder,
}

/// The feed-forward block of each transformer layer.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum MlpKind {
    /// Two projections with a GELU between them.
    #[default]
    Gelu,
    /// Gated SwiGLU: three projections (gate, up, down).
    Swiglu,
}

/// The normalisation layer.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    /// LayerNorm with weight and bias.
    #[default]
    Layernorm,
    /// RMSNorm with a weight only.
    Rmsnorm,
}

/// Position encoding.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum PositionalKind {
    /// A learned position-embedding table of seqLen x hidden.
    #[default]
    Learned,
    /// Rotary embeddings (no parameters).
    Rotary,
}

/// A transformer described by its shape.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.hidden % self.heads == 0").message("transformer.hidden must be divisible by transformer.heads").field_path(".hidden"))]
#[x_kube(validation = Rule::new("!has(self.kvHeads) || self.heads % self.kvHeads == 0").message("transformer.heads must be divisible by transformer.kvHeads").field_path(".kvHeads"))]
pub struct TransformerSpec {
    /// `decoder` (causal LM) or `encoder` (BERT-style masked LM).
    #[serde(default)]
    pub kind: TransformerKind,
    /// Number of transformer blocks.
    #[schemars(range(min = 1, max = 1024))]
    pub layers: u32,
    /// Model (residual stream) width.
    #[schemars(range(min = 1, max = 1048576))]
    pub hidden: u32,
    /// Number of attention (query) heads; must divide `hidden`.
    #[schemars(range(min = 1, max = 4096))]
    pub heads: u32,
    /// Number of key/value heads; smaller than `heads` means grouped-query
    /// attention. Defaults to `heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub kv_heads: Option<u32>,
    /// Width of the feed-forward block. Defaults to 4 x `hidden`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4194304))]
    pub ffn: Option<u32>,
    /// Vocabulary size (rows of the embedding and columns of the logits).
    #[schemars(range(min = 1, max = 16777216))]
    pub vocab: u32,
    /// Tokens per sample.
    #[schemars(range(min = 1, max = 16777216))]
    pub seq_len: u32,
    /// Feed-forward kind: `gelu` or `swiglu`.
    #[serde(default)]
    pub mlp: MlpKind,
    /// Normalisation: `layernorm` or `rmsnorm`.
    #[serde(default)]
    pub norm: NormKind,
    /// Positions: `learned` or `rotary`.
    #[serde(default)]
    pub positional: PositionalKind,
    /// Whether the output projection shares the input embedding's weights.
    #[serde(default = "default_true")]
    pub tied_embeddings: bool,
}

fn default_true() -> bool {
    true
}

/// A Hugging Face model given by its `config.json`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HuggingFaceSpec {
    /// The model's `config.json` as an object (`model_type` selects the family:
    /// gpt2, llama, mistral, qwen2, qwen3, phi3, bert, roberta, gemma2,
    /// gemma3_text, mixtral, qwen2_moe, granite, qwen3_moe, starcoder2, olmo2,
    /// gpt_neox, opt, t5, deberta-v2, vit; for vit, seqLen is the tokens of one
    /// image and the batch counts images).
    #[schemars(schema_with = "crate::api::schema::free_form_object")]
    #[serde(deserialize_with = "crate::api::free_form::deserialize")]
    pub config: serde_json::Map<String, serde_json::Value>,
    /// Tokens per sample used in training.
    #[schemars(range(min = 1, max = 16777216))]
    pub seq_len: u32,
}

/// A plain multi-layer perceptron: `layers` x (Linear(hidden, hidden) + ReLU) on
/// inputs of width `hidden`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MlpSpec {
    /// Number of Linear + ReLU layers.
    #[schemars(range(min = 1, max = 4096))]
    pub layers: u32,
    /// Width of every layer and of the input.
    #[schemars(range(min = 1, max = 1048576))]
    pub hidden: u32,
}

/// A key of a ConfigMap in the job's namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// Name of the ConfigMap.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the ConfigMap that holds the profile.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A captured allocation profile of one training step.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProfileSpec {
    /// Where the profile is stored.
    pub config_map_ref: ConfigMapKeyRef,
}

/// Automatic profiling: the controller runs the job's own pod once without a
/// GPU (`VRAMFIT_PHASE=profile`), where the Python helper captures one
/// training step's allocations on the CPU, and predicts from that profile
/// (docs/profile-format.md, "Automatic profiling").
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AutoProfileSpec {
    /// Seconds the profiling pod may run before the capture counts as
    /// failed (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 7200))]
    pub deadline_seconds: Option<u32>,
}

/// The model and how it is trained. Exactly one of `transformer`, `huggingFace`,
/// `mlp`, `profile` or `auto` describes the model.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.transformer), has(self.huggingFace), has(self.mlp), has(self.profile), has(self.auto)].filter(x, x).size() == 1").message("exactly one of model.transformer, model.huggingFace, model.mlp, model.profile or model.auto must be set"))]
pub struct ModelSpec {
    /// A transformer given by its shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformer: Option<TransformerSpec>,
    /// A Hugging Face model given by its config.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugging_face: Option<HuggingFaceSpec>,
    /// A plain MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp: Option<MlpSpec>,
    /// A captured allocation profile stored in a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileSpec>,
    /// A profile captured automatically from the job's own pod, on a CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoProfileSpec>,
    /// Overrides the parameter count derived from the model description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parameters: Option<u64>,
    /// `fp32`, `bf16`, `fp16`, `amp-bf16` or `amp-fp16` (default `fp32`).
    #[serde(default)]
    pub precision: Precision,
    /// `sgd`, `sgd-momentum`, `adam`, `adamw`, `adagrad`, `adafactor` or
    /// `adamw-8bit` (default `adamw`).
    #[serde(default)]
    pub optimizer: Optimizer,
    /// Recompute activations in backward instead of keeping them.
    #[serde(default)]
    pub gradient_checkpointing: bool,
    /// `sdpa`, `flash` or `eager` (default `sdpa`).
    #[serde(default)]
    pub attention: Attention,
    /// DeepSpeed/FSDP ZeRO stage 0..3; sharding is over the job's `gpus`.
    #[serde(default)]
    #[schemars(range(min = 0, max = 3))]
    pub zero_stage: u8,
}

/// Peak GPU memory of one training process, by cause. All values in bytes.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MemoryBreakdown {
    /// Weights (including low-precision copies that autocast caches).
    pub parameters: u64,
    /// Gradients alive at the peak.
    pub gradients: u64,
    /// Optimizer state (moments, master weights, GradScaler).
    pub optimizer: u64,
    /// Activations and temporaries alive at the peak (logits and loss included).
    pub activations: u64,
    /// cuBLAS/cuDNN workspaces.
    pub workspace: u64,
    /// CUDA context, kernels and libraries (outside the caching allocator).
    pub context: u64,
    /// Caching-allocator rounding and fragmentation.
    pub allocator_overhead: u64,
    /// For a prediction from a captured allocation profile: the allocations
    /// that outlive the profiled step (weights, gradients, optimizer state; a
    /// profile does not record which is which). `activations` then holds the
    /// step's transient allocations. Absent for model-based predictions.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub persistent: u64,
    /// For a model-based prediction: memory kept beyond the replayed reserve
    /// for where a later step's tensors land among the cached blocks, which
    /// a generated sequence cannot place to the MiB. Absent for predictions
    /// from a captured profile.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub margin: u64,
}

fn is_zero(bytes: &u64) -> bool {
    *bytes == 0
}
