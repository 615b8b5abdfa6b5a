"""Hugging Face masked LM: BERT base from its configuration, random weights.

Every sample masks the same number of positions (15% of the sequence), so the
token-mean loss of a micro-batch weights every sample alike and the
micro-batched gradient equals the full batch's.
"""

from __future__ import annotations

from typing import Any

from . import common


def main() -> None:
    p = common.parser(__doc__ or "", micro=32, global_batch=256, lr=1e-4)
    p.add_argument("--seq-len", type=int, default=512)
    args = p.parse_args()

    import transformers

    config = transformers.BertConfig()
    common.set_dropout(config, args.dropout)
    seq_len, vocab = args.seq_len, config.vocab_size
    masked = max(1, int(seq_len * 0.15))

    def build() -> Any:
        return transformers.BertForMaskedLM(config)

    def make_batch(generator: Any, samples: int) -> common.Batch:
        import torch

        ids = torch.randint(1000, vocab, (samples, seq_len), generator=generator)
        positions = torch.rand(samples, seq_len, generator=generator).argsort(dim=1)[:, :masked]
        labels = torch.full_like(ids, -100)
        labels.scatter_(1, positions, ids.gather(1, positions))
        inputs = ids.scatter(1, positions, 103)  # [MASK]
        return {"input_ids": inputs, "labels": labels}

    def loss_fn(model: Any, batch: common.Batch) -> Any:
        return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

    common.run(args, build_model=build, make_batch=make_batch, loss_fn=loss_fn)


if __name__ == "__main__":
    main()
