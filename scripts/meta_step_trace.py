"""Allocation events of real training steps, recorded on the CPU without a GPU.

Usage: python3 scripts/meta_step_trace.py MODEL STEPS OUT.json.gz
       MODEL: llama | gpt2 | bert (the configurations of scripts/gpu/alloc_checks.py)

The model is built on PyTorch's "meta" device (shapes, no data, no compute),
so a LLaMA step costs seconds on a laptop. A TorchDispatchMode sees every
tensor an operator returns; a storage is allocated when the first tensor on
it appears and freed when the last one is gone (autograd's saved tensors
included). Parameters come first, then the steps (forward, backward,
AdamW, zero_grad(set_to_none=True)), each ended by a {"op": "step"} marker.
The events are vramfit.alloc's AllocEvent JSON. What the GPU adds and this
cannot see: autocast's bf16 copies (the model runs in fp32 here), cuBLAS
workspaces, and PyTorch's own allocator's rounding (ours rounds).
"""

import gzip
import json
import sys
import weakref

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def build(name):
    if name == "llama":
        config = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
        )
        return transformers.LlamaForCausalLM(config), (4, 2048), 32000
    if name == "gpt2":
        config = transformers.GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12)
        return transformers.GPT2LMHeadModel(config), (8, 1024), config.vocab_size
    if name == "bert":
        config = transformers.BertConfig()
        return transformers.BertForMaskedLM(config), (32, 512), config.vocab_size
    raise SystemExit(f"unknown model {name!r}: llama, gpt2 or bert")


def main():
    name, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    events, live, next_id = [], {}, [0]

    def gone(key):
        entry = live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            events.append({"op": "free", "id": entry[0]})
            del live[key]

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            for t in tree_flatten(result)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "meta":
                    key = t.untyped_storage()._cdata
                    if key not in live:
                        live[key] = [next_id[0], 0]
                        nbytes = max(t.untyped_storage().nbytes(), 1)
                        events.append({"op": "alloc", "id": next_id[0], "bytes": nbytes, "stream": 0})
                        next_id[0] += 1
                    live[key][1] += 1
                    weakref.finalize(t, gone, key)
            return result

    with torch.device("meta"):
        model, shape, vocab = build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    with Track():
        for _ in range(steps):
            ids = torch.randint(0, vocab, shape, device="meta")
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, ids
            events.append({"op": "step"})
    params = [{"op": "alloc", "id": (1 << 40) + i, "bytes": p.untyped_storage().nbytes(), "stream": 0}
              for i, p in enumerate(model.parameters())]
    with gzip.open(out, "wt") as f:
        json.dump({"model": name, "steps": steps, "torch": torch.__version__,
                   "transformers": transformers.__version__, "events": params + events}, f, separators=(",", ":"))
    print(f"{out}: {len(params) + len(events)} events, {steps} steps")


if __name__ == "__main__":
    main()
