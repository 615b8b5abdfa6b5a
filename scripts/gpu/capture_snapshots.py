"""Capture PyTorch memory snapshots of a few short training runs.

Usage: python3 capture_snapshots.py OUT_DIR [--steps 3] [--only NAME]

Each model trains for a few steps in its own process (so that every run
starts from an empty allocator and PyTorch's peak counters are its own),
with torch.cuda.memory._record_memory_history(max_entries=...) on from the
first allocation. The snapshot is written with _dump_snapshot() and
gzip-compressed; OUT_DIR/pytorch_reported.json collects what PyTorch
reported for each run (max_memory_reserved, max_memory_allocated, ...).
Models are defined here, randomly initialised: nothing is downloaded.
"""

import argparse
import gzip
import json
import math
import os
import subprocess
import sys

MAX_ENTRIES = 2_000_000


def build(name, torch):
    nn = torch.nn
    F = torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    def rotary(x):
        # x: (batch, heads, seq, head_dim)
        seq, dim = x.shape[-2], x.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=x.device).float() / dim))
        freqs = torch.outer(torch.arange(seq, device=x.device).float(), inv)
        cos, sin = freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    class Block(nn.Module):
        def __init__(self, d, heads, ffn, llama, causal, kv_heads=None):
            super().__init__()
            self.heads, self.kv_heads, self.llama, self.causal = heads, kv_heads or heads, llama, causal
            self.head_dim = d // heads
            norm = RMSNorm if llama else nn.LayerNorm
            self.n1, self.n2 = norm(d), norm(d)
            self.q = nn.Linear(d, d, bias=not llama)
            self.kv = nn.Linear(d, 2 * self.kv_heads * self.head_dim, bias=not llama)
            self.o = nn.Linear(d, d, bias=not llama)
            if llama:
                self.gate = nn.Linear(d, ffn, bias=False)
                self.up = nn.Linear(d, ffn, bias=False)
                self.down = nn.Linear(ffn, d, bias=False)
            else:
                self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

        def forward(self, x):
            b, t, d = x.shape
            h = self.n1(x)
            q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            if self.llama:
                q, k = rotary(q), rotary(k)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.kv_heads != self.heads)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            h = self.n2(x)
            if self.llama:
                return x + self.down(F.silu(self.gate(h)) * self.up(h))
            return x + self.fc2(F.gelu(self.fc1(h)))

    class Transformer(nn.Module):
        def __init__(self, vocab, d, layers, heads, ffn, seq, llama=False, causal=True, kv_heads=None, checkpoint=False):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = None if llama else nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block(d, heads, ffn, llama, causal, kv_heads) for _ in range(layers))
            self.norm = RMSNorm(d) if llama else nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            if not llama:
                self.head.weight = self.tok.weight
            self.checkpoint = checkpoint

        def forward(self, ids):
            x = self.tok(ids)
            if self.pos is not None:
                x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                if self.checkpoint:
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return self.head(self.norm(x))

    dev = "cuda"
    if name == "gpt2_amp":
        model = Transformer(50257, 768, 12, 12, 3072, 1024).to(dev)
        batch, seq, vocab, amp, opt = 8, 1024, 50257, torch.bfloat16, "adamw"
    elif name == "gpt2_checkpointing":
        model = Transformer(50257, 768, 12, 12, 3072, 1024, checkpoint=True).to(dev)
        batch, seq, vocab, amp, opt = 16, 1024, 50257, torch.bfloat16, "adamw"
    elif name == "llama_swiglu":
        model = Transformer(32000, 1024, 12, 16, 2816, 2048, llama=True, kv_heads=4).to(dev)
        batch, seq, vocab, amp, opt = 4, 2048, 32000, torch.bfloat16, "adamw"
    elif name == "bert_mlm":
        model = Transformer(30522, 768, 12, 12, 3072, 512, causal=False).to(dev)
        batch, seq, vocab, amp, opt = 32, 512, 30522, torch.float16, "adam"
    elif name == "mlp":
        layers = []
        for _ in range(8):
            layers += [nn.Linear(8192, 8192), nn.ReLU()]
        model = nn.Sequential(*layers).to(dev)
        batch, seq, vocab, amp, opt = 1024, None, None, None, "sgd_momentum"
    else:
        raise SystemExit(f"unknown model {name}")
    return model, batch, seq, vocab, amp, opt


def run_one(name, out_dir, steps):
    import torch

    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES)
    model, batch, seq, vocab, amp, opt_name = build(name, torch)
    params = list(model.parameters())
    if opt_name == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-4)
    elif opt_name == "adam":
        opt = torch.optim.Adam(params, lr=1e-4)
    else:
        opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
    for _ in range(steps):
        if seq is None:
            x = torch.randn(batch, 8192, device="cuda")
            loss_fn = lambda: model(x).float().pow(2).mean()  # noqa: E731
        else:
            ids = torch.randint(0, vocab, (batch, seq), device="cuda")
            loss_fn = lambda: torch.nn.functional.cross_entropy(  # noqa: E731
                model(ids).float().view(-1, vocab), ids.view(-1)
            )
        if amp is not None:
            with torch.autocast("cuda", dtype=amp):
                loss = loss_fn()
        else:
            loss = loss_fn()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    raw = os.path.join(out_dir, f"{name}.pickle")
    torch.cuda.memory._dump_snapshot(raw)
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb", compresslevel=9) as dst:
        dst.write(src.read())
    os.remove(raw)
    stats = torch.cuda.memory_stats()
    report = {
        "maxMemoryReserved": torch.cuda.max_memory_reserved(),
        "maxMemoryAllocated": torch.cuda.max_memory_allocated(),
        "numAllocRetries": stats.get("num_alloc_retries", 0),
        "numOoms": stats.get("num_ooms", 0),
        "steps": steps,
        "parameters": sum(p.numel() for p in params),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    print(json.dumps({name: report}))


MODELS = ["gpt2_amp", "llama_swiglu", "bert_mlm", "mlp", "gpt2_checkpointing"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.only:
        run_one(args.only, args.out_dir, args.steps)
        return
    reported = {}
    for name in MODELS:
        done = subprocess.run(
            [sys.executable, __file__, args.out_dir, "--steps", str(args.steps), "--only", name],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            print(f"{name} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        reported.update(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{name}: {reported[name]}", file=sys.stderr)
    with open(os.path.join(args.out_dir, "pytorch_reported.json"), "w") as f:
        json.dump(reported, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
