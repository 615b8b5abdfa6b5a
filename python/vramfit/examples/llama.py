"""Hugging Face causal LM: a Llama from its configuration, random weights.

Without ``--config`` it is TinyLlama-1.1B's architecture (the model of
``examples/llama-1b-hf.yaml``); ``--config FILE`` takes any Llama ``config.json``.
"""

from __future__ import annotations

from .causal_lm import main

#: TinyLlama-1.1B's architecture.
TINYLLAMA_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1.0e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

if __name__ == "__main__":
    main(description=__doc__ or "", default_config=TINYLLAMA_1B)
