#!/usr/bin/env python3
"""Parameter counts of Hugging Face models built by transformers from configs,
the fixture the predictor's parameter count is checked against
(src/predict/hf_tests.rs reads it).

Each row is a config as a user pastes it: `model_type` and some keys; every
key left out takes the default of transformers' `*Config` class. The model is
built on the meta device (no memory, no weights) with the head class the
analytic predictor models: causal LM for decoders, masked LM for encoders,
seq2seq LM for T5, image classification for ViT.

Usage:
    python3 hack/hf_param_counts.py --write   # rewrite the fixture
    python3 hack/hf_param_counts.py --check   # exit 1 if the fixture is stale
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "data", "hf-param-counts.json")

# The shape every small row shares: hidden 64, 2 layers, 4 heads, vocabulary 1000.
SMALL = {
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128),
    "llama": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=96, vocab_size=1000),
    "mistral": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=96, vocab_size=1000),
    "qwen2": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=96, vocab_size=1000),
    "qwen3": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=96, vocab_size=1000),
    # Phi-3's pad_token_id (32000) must be inside the table: its default vocabulary.
    "phi3": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=96),
    "bert": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=96, vocab_size=1000),
    "roberta": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=96, vocab_size=1000),
    "gemma2": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=1000),
    "gemma3_text": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=96,
                        vocab_size=1000),
    "gpt_neox": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=96, vocab_size=1000),
    "opt": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=96,
                vocab_size=1000),
    "mixtral": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=96, vocab_size=1000,
                    num_local_experts=4),
    "qwen2_moe": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, vocab_size=1000,
                      num_experts=4, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48),
    "granite": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=96, vocab_size=1000),
    # the hub's key for the experts (transformers 5 writes num_local_experts)
    "qwen3_moe": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, vocab_size=1000,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "starcoder2": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=96, vocab_size=1000),
    "olmo2": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=96, vocab_size=1000),
    "t5": dict(d_model=64, num_layers=2, num_heads=4, d_kv=16, d_ff=96, vocab_size=1000),
    "deberta-v2": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=96, vocab_size=1000),
    "vit": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=96, image_size=32, patch_size=8),
}

# Configs that rely on the library's defaults for everything except the layer
# count (and the vocabulary, where the default table alone is huge).
DEFAULTS = {
    "gpt2": dict(n_layer=1),
    "llama": dict(num_hidden_layers=1),
    "mistral": dict(num_hidden_layers=1),
    "qwen2": dict(num_hidden_layers=1),
    "qwen3": dict(num_hidden_layers=1),
    "phi3": dict(num_hidden_layers=1),
    "bert": dict(num_hidden_layers=1),
    "roberta": dict(num_hidden_layers=1),
    "gemma2": dict(num_hidden_layers=1),
    "gemma3_text": dict(num_hidden_layers=1),
    "gpt_neox": dict(num_hidden_layers=1),
    "opt": dict(num_hidden_layers=1),
    "mixtral": dict(num_hidden_layers=1),
    "qwen2_moe": dict(num_hidden_layers=1),
    "qwen3_moe": dict(num_hidden_layers=1),
    "granite": dict(num_hidden_layers=1),
    "olmo2": dict(num_hidden_layers=1),
    "starcoder2": dict(num_hidden_layers=1),
    "t5": dict(num_layers=1),
    "deberta-v2": dict(num_hidden_layers=1),
    "vit": dict(num_hidden_layers=1),
}

# Keys whose non-default values change the structure.
VARIANTS = [
    # head_dim x heads != hidden: q_proj is 2048 wide, o_proj reads 2048.
    ("qwen2-head-dim", "qwen2", dict(hidden_size=1024, num_hidden_layers=28,
                                     num_attention_heads=16, num_key_value_heads=8,
                                     head_dim=128, intermediate_size=3072,
                                     vocab_size=151936, tie_word_embeddings=True)),
    ("gpt2-n-inner-untied", "gpt2", dict(SMALL["gpt2"], n_inner=100,
                                         tie_word_embeddings=False)),
    ("llama-attention-bias", "llama", dict(SMALL["llama"], attention_bias=True)),
    ("llama-mlp-bias", "llama", dict(SMALL["llama"], mlp_bias=True)),
    ("llama-head-dim", "llama", dict(SMALL["llama"], head_dim=32)),
    ("qwen3-attention-bias", "qwen3", dict(SMALL["qwen3"], attention_bias=True)),
    ("bert-type-vocab", "bert", dict(SMALL["bert"], type_vocab_size=5,
                                     max_position_embeddings=256)),
    ("gemma2-attention-bias", "gemma2", dict(SMALL["gemma2"], attention_bias=True,
                                             tie_word_embeddings=False)),
    # head_dim left out: 256, not hidden / heads.
    ("gemma3-default-head-dim", "gemma3_text",
     {k: v for k, v in SMALL["gemma3_text"].items() if k != "head_dim"}),
    ("gpt-neox-sequential-tied", "gpt_neox", dict(SMALL["gpt_neox"], use_parallel_residual=False,
                                                  tie_word_embeddings=True)),
    ("gpt-neox-no-attention-bias", "gpt_neox", dict(SMALL["gpt_neox"], attention_bias=False)),
    # OLMo 2's query/key norms span the projections: grouped keys narrow k_norm
    ("olmo2-attention-bias", "olmo2", dict(SMALL["olmo2"], attention_bias=True)),
    ("starcoder2-no-bias", "starcoder2", dict(SMALL["starcoder2"], use_bias=False,
                                              tie_word_embeddings=False)),
    ("opt-projected", "opt", dict(SMALL["opt"], word_embed_proj_dim=32,
                                  max_position_embeddings=512)),
    ("opt-post-norm", "opt", dict(SMALL["opt"], do_layer_norm_before=False)),
    ("opt-no-bias-untied", "opt", dict(SMALL["opt"], enable_bias=False,
                                       tie_word_embeddings=False)),
    ("mixtral-top1-head-dim", "mixtral", dict(SMALL["mixtral"], num_experts_per_tok=1,
                                              head_dim=32)),
    ("qwen2-moe-sparse-step", "qwen2_moe", dict(SMALL["qwen2_moe"], num_hidden_layers=4,
                                                decoder_sparse_step=2, mlp_only_layers=[0],
                                                qkv_bias=False)),
    ("qwen3-moe-local-experts-sparse-step", "qwen3_moe",
     dict({k: v for k, v in SMALL["qwen3_moe"].items() if k != "num_experts"},
          num_local_experts=6, num_hidden_layers=4, decoder_sparse_step=2,
          mlp_only_layers=[0], head_dim=24)),
    ("granite-multipliers-biases", "granite",
     dict(SMALL["granite"], embedding_multiplier=12.0, residual_multiplier=0.22,
          logits_scaling=8.0, attention_multiplier=0.015625, attention_bias=True,
          mlp_bias=True, tie_word_embeddings=True)),
    ("t5-v1.1", "t5", dict(SMALL["t5"], feed_forward_proj="gated-gelu",
                           tie_word_embeddings=False, num_decoder_layers=3,
                           relative_attention_num_buckets=16)),
    ("deberta-v3", "deberta-v2", dict(SMALL["deberta-v2"], relative_attention=True,
                                      position_buckets=32, pos_att_type=["p2c", "c2p"],
                                      norm_rel_ebd="layer_norm", share_att_key=True,
                                      position_biased_input=False)),
    ("deberta-v2-own-position-keys", "deberta-v2",
     dict(SMALL["deberta-v2"], relative_attention=True, max_relative_positions=-1,
          pos_att_type="c2p|p2c", share_att_key=False, type_vocab_size=2)),
    ("deberta-v2-c2p-only", "deberta-v2",
     dict(SMALL["deberta-v2"], relative_attention=True, max_relative_positions=64,
          pos_att_type=["c2p"], share_att_key=False)),
    ("vit-10-labels", "vit", dict(SMALL["vit"], num_labels=10, num_channels=1,
                                  qkv_bias=False)),
]


def rows():
    out = []
    for mt, kw in SMALL.items():
        out.append((f"{mt}-small", mt, kw))
    for mt, kw in DEFAULTS.items():
        out.append((f"{mt}-defaults", mt, kw))
    out.extend(VARIANTS)
    return out


def head_class(model_type):
    import transformers
    return {
        "bert": transformers.AutoModelForMaskedLM,
        "roberta": transformers.AutoModelForMaskedLM,
        "deberta-v2": transformers.AutoModelForMaskedLM,
        "t5": transformers.AutoModelForSeq2SeqLM,
        "vit": transformers.AutoModelForImageClassification,
    }.get(model_type, transformers.AutoModelForCausalLM)


def seq_len(cfg):
    """A sequence the predictor accepts: ViT's tokens of one image, else 8."""
    if cfg.model_type == "vit":
        return (cfg.image_size // cfg.patch_size) ** 2 + 1
    return 8


def count(name, model_type, kw):
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type, **kw)
    with torch.device("meta"):
        model = head_class(model_type).from_config(cfg)
    config = dict(kw, model_type=model_type)
    config = {k: v for k, v in config.items() if v is not None}
    # A vit config as saved carries id2label, not num_labels.
    if "num_labels" in config:
        n = config.pop("num_labels")
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(n)}
    return {"name": name, "config": config, "seqLen": seq_len(cfg),
            "modelClass": type(model).__name__,
            "params": sum(p.numel() for p in model.parameters())}


def build():
    import transformers
    return {"transformers": transformers.__version__,
            "rows": [count(*r) for r in rows()]}


def main():
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    fresh = build()
    if args.write:
        with open(FIXTURE, "w") as f:
            json.dump(fresh, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"{len(fresh['rows'])} rows -> {os.path.relpath(FIXTURE)}")
        return
    with open(FIXTURE) as f:
        old = json.load(f)
    stale = [r["name"] for r, o in zip(fresh["rows"], old["rows"]) if r != o]
    if len(old["rows"]) != len(fresh["rows"]):
        stale.append(f"{len(old['rows'])} rows, {len(fresh['rows'])} expected")
    if stale:
        print("stale rows (run hack/hf_param_counts.py --write):", ", ".join(stale))
        sys.exit(1)
    print(f"{len(fresh['rows'])} rows current (transformers {fresh['transformers']})")


if __name__ == "__main__":
    main()
