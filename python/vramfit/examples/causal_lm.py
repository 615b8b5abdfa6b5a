"""Hugging Face causal LM from a configuration (GPT-2 small by default), random weights.

``--config FILE`` takes any causal-LM ``config.json`` (for example Llama's);
tokens are uniform random ids, every sample the full sequence length, so the
token-mean loss of a micro-batch weights every sample alike.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

from . import common


def main(description: str = __doc__ or "", default_config: Optional[Dict[str, Any]] = None) -> None:
    p = common.parser(description, micro=8, global_batch=64, lr=3e-4)
    p.add_argument("--config", help="a Hugging Face config.json (default: GPT-2 small)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sample (default: the model's context)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in backward")
    args = p.parse_args()

    import transformers

    if args.config:
        with open(args.config, encoding="utf-8") as f:
            config = transformers.AutoConfig.for_model(**json.load(f))
    elif default_config is not None:
        config = transformers.AutoConfig.for_model(**default_config)
    else:
        config = transformers.GPT2Config()
    common.set_dropout(config, args.dropout)
    seq_len = args.seq_len or getattr(config, "n_positions", None) or config.max_position_embeddings
    vocab = config.vocab_size

    def build() -> Any:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        return model

    def make_batch(generator: Any, samples: int) -> common.Batch:
        import torch

        return {"input_ids": torch.randint(0, vocab, (samples, seq_len), generator=generator)}

    def loss_fn(model: Any, batch: common.Batch) -> Any:
        return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss

    common.run(args, build_model=build, make_batch=make_batch, loss_fn=loss_fn)


if __name__ == "__main__":
    main()
