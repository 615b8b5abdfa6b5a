#!/usr/bin/env python3
"""Measure real training-step peaks on a GPU to calibrate and check `vramfit predict`.

Pure PyTorch: every model is defined here (GPT-2-, LLaMA-, Qwen2- and BERT-style
transformers and plain MLPs), nothing is downloaded and no Hugging Face package is
needed. Each configuration of the zoo runs in a fresh child process (forked after
`import torch`, before CUDA is initialised) so that its CUDA context and its NVML
per-process figure are its own.

For each configuration the child trains a few optimizer steps (so optimizer state
exists and the steady state is reached) and reports PyTorch's
`max_memory_reserved()` / `max_memory_allocated()`. The parent samples NVML's
per-process used memory of the child every ~2 ms while it runs and once more after
the child has synchronised at the end. Because PyTorch's caching allocator never
returns segments during training (no `empty_cache`), the process's usage only grows,
so the end reading is the peak; `nvmlPeakBytes` is the larger of the sampled maximum
and the end reading.

Usage:
    python3 scripts/gpu/calibrate_predictor.py --out DIR [--deadline SECONDS]
    python3 scripts/gpu/calibrate_predictor.py --dry-run      # list the zoo, no GPU

Output: DIR/h200.jsonl, one line per configuration:
    {"name", "split": "fit"|"holdout", "spec": {gpus, batch, model} (TrainingJob spec
     form), "measured": {...}, "snapshot": bool}
and, for configurations marked `snapshot`, DIR/<name>.profile.json (converted with
scripts/snapshot_to_profile.py) and the raw snapshot pickles in DIR/snapshots.tar.gz.
"""

import argparse
import json
import math
import os
import select
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

# --------------------------------------------------------------------------- zoo


def gpt2(layers, hidden, heads, seq, **kw):
    return dict(family="gpt2", kind="decoder", layers=layers, hidden=hidden, heads=heads,
                kv_heads=heads, ffn=4 * hidden, vocab=50257, seq=seq, mlp="gelu",
                norm="layernorm", positional="learned", tied=True, bias=True,
                qkv_bias=True, **kw)


def llama(layers, hidden, heads, kv, ffn, seq, vocab=32000, **kw):
    return dict(family="llama", kind="decoder", layers=layers, hidden=hidden, heads=heads,
                kv_heads=kv, ffn=ffn, vocab=vocab, seq=seq, mlp="swiglu", norm="rmsnorm",
                positional="rotary", tied=False, bias=False, qkv_bias=False, **kw)


def qwen2(layers, hidden, heads, kv, ffn, seq, **kw):
    return dict(family="qwen2", kind="decoder", layers=layers, hidden=hidden, heads=heads,
                kv_heads=kv, ffn=ffn, vocab=151936, seq=seq, mlp="swiglu", norm="rmsnorm",
                positional="rotary", tied=True, bias=False, qkv_bias=True, **kw)


def bert(layers, hidden, heads, seq, **kw):
    return dict(family="bert", kind="encoder", layers=layers, hidden=hidden, heads=heads,
                kv_heads=heads, ffn=4 * hidden, vocab=30522, seq=seq, mlp="gelu",
                norm="layernorm", positional="learned", tied=True, bias=True,
                qkv_bias=True, **kw)


def mlp(layers, hidden):
    return dict(family="mlp", layers=layers, hidden=hidden)


GPT2_S = dict(layers=12, hidden=768, heads=12)
GPT2_M = dict(layers=24, hidden=1024, heads=16)
GPT2_L = dict(layers=36, hidden=1280, heads=20)
LLAMA_T = dict(layers=8, hidden=1024, heads=16, kv=16, ffn=2816)
LLAMA_T_GQA = dict(layers=8, hidden=1024, heads=16, kv=4, ffn=2816)
LLAMA_1B = dict(layers=16, hidden=2048, heads=32, kv=8, ffn=5632)
# For 4 and 8 GPUs (calibrate_zero.py): GPT-2 XL (1.56B), a Llama-3.2-3B-like
# shape with a 32k vocabulary (3.2B) and Llama-2-7B's shape (6.7B).
GPT2_XL = dict(layers=48, hidden=1600, heads=25)
LLAMA_3B = dict(layers=28, hidden=3072, heads=24, kv=8, ffn=8192)
LLAMA_7B = dict(layers=32, hidden=4096, heads=32, kv=32, ffn=11008)
QWEN2_05B = dict(layers=24, hidden=896, heads=14, kv=2, ffn=4864)
BERT_B = dict(layers=12, hidden=768, heads=12)
BERT_L = dict(layers=24, hidden=1024, heads=16)


def C(name, arch, micro, precision, optimizer, attention="sdpa", ckpt=False, accum=1,
      split="fit", hf=False, snapshot=False, steps=3):
    return dict(name=name, arch=arch, micro=micro, accum=accum, precision=precision,
                optimizer=optimizer, attention=attention, ckpt=ckpt, split=split, hf=hf,
                snapshot=snapshot, steps=steps)


H = "holdout"
# Ordered so that a deadline cuts the least useful ones; the `holdout` split is
# fixed here and never used to fit a constant.
ZOO = [
    C("gpt2s-s1024-b8-ampbf16-adamw", gpt2(**GPT2_S, seq=1024), 8, "amp-bf16", "adamw", snapshot=True),
    C("llama1b-s2048-b4-bf16-adamw", llama(**LLAMA_1B, seq=2048), 4, "bf16", "adamw", hf=True, snapshot=True),
    C("bertb-s512-b16-fp32-adamw", bert(**BERT_B, seq=512), 16, "fp32", "adamw"),
    C("gpt2s-s1024-b8-fp32-adamw", gpt2(**GPT2_S, seq=1024), 8, "fp32", "adamw"),
    C("gpt2s-s1024-b8-ampfp16-adamw", gpt2(**GPT2_S, seq=1024), 8, "amp-fp16", "adamw", split=H),
    C("gpt2s-s1024-b8-bf16-adamw", gpt2(**GPT2_S, seq=1024), 8, "bf16", "adamw"),
    C("gpt2s-s1024-b4-fp32-adamw-eager", gpt2(**GPT2_S, seq=1024), 4, "fp32", "adamw", "eager"),
    C("gpt2s-s1024-b8-ampbf16-adamw-eager", gpt2(**GPT2_S, seq=1024), 8, "amp-bf16", "adamw", "eager", split=H),
    C("gpt2s-s1024-b16-ampbf16-adamw-ckpt", gpt2(**GPT2_S, seq=1024), 16, "amp-bf16", "adamw", ckpt=True),
    C("gpt2s-s512-b16-fp32-sgd", gpt2(**GPT2_S, seq=512), 16, "fp32", "sgd"),
    C("gpt2s-s1024-b8-ampbf16-sgdm", gpt2(**GPT2_S, seq=1024), 8, "amp-bf16", "sgd-momentum", split=H),
    C("gpt2s-s1024-b8-ampbf16-adagrad", gpt2(**GPT2_S, seq=1024), 8, "amp-bf16", "adagrad"),
    C("gpt2s-s1024-b8-ampbf16-adafactor", gpt2(**GPT2_S, seq=1024), 8, "amp-bf16", "adafactor"),
    C("gpt2m-s1024-b8-ampbf16-adamw", gpt2(**GPT2_M, seq=1024), 8, "amp-bf16", "adamw", hf=True),
    C("gpt2m-s1024-b4-fp32-adam-eager-ckpt", gpt2(**GPT2_M, seq=1024), 4, "fp32", "adam", "eager", ckpt=True, split=H),
    C("gpt2m-s1024-b8-fp16-sgdm", gpt2(**GPT2_M, seq=1024), 8, "fp16", "sgd-momentum"),
    C("gpt2l-s1024-b4-ampbf16-adamw-ckpt", gpt2(**GPT2_L, seq=1024), 4, "amp-bf16", "adamw", ckpt=True),
    C("gpt2s-s2048-b4-ampbf16-adamw-accum4", gpt2(**GPT2_S, seq=2048), 4, "amp-bf16", "adamw", accum=4, split=H),
    C("gpt2s-s1024-b8-ampbf16-adamw-accum2", gpt2(**GPT2_S, seq=1024), 8, "amp-bf16", "adamw", accum=2),
    C("llamat-s2048-b4-ampbf16-adamw", llama(**LLAMA_T, seq=2048), 4, "amp-bf16", "adamw"),
    C("llamat-s2048-b4-bf16-adamw", llama(**LLAMA_T, seq=2048), 4, "bf16", "adamw"),
    C("llamatgqa-s2048-b4-fp32-adamw", llama(**LLAMA_T_GQA, seq=2048), 4, "fp32", "adamw", split=H),
    C("llamatgqa-s1024-b4-ampbf16-adamw-eager", llama(**LLAMA_T_GQA, seq=1024), 4, "amp-bf16", "adamw", "eager"),
    C("llamat-s2048-b8-ampfp16-adam", llama(**LLAMA_T, seq=2048), 8, "amp-fp16", "adam"),
    C("llamat-s512-b16-fp32-adagrad-eager-ckpt", llama(**LLAMA_T, seq=512), 16, "fp32", "adagrad", "eager", ckpt=True, split=H),
    C("llamat-s4096-b2-ampbf16-adamw-flash", llama(**LLAMA_T, seq=4096), 2, "amp-bf16", "adamw", "flash"),
    C("llamat-s2048-b4-ampbf16-sgdm-ckpt-accum4", llama(**LLAMA_T, seq=2048), 4, "amp-bf16", "sgd-momentum", ckpt=True, accum=4, split=H),
    C("llama1b-s2048-b8-bf16-adamw-ckpt", llama(**LLAMA_1B, seq=2048), 8, "bf16", "adamw", ckpt=True, hf=True),
    C("llama1b-s1024-b4-ampbf16-adamw", llama(**LLAMA_1B, seq=1024), 4, "amp-bf16", "adamw", hf=True, split=H),
    C("llama1b-s2048-b2-ampbf16-adafactor-ckpt", llama(**LLAMA_1B, seq=2048), 2, "amp-bf16", "adafactor", ckpt=True),
    C("llama1b-s2048-b4-bf16-sgd-flash", llama(**LLAMA_1B, seq=2048), 4, "bf16", "sgd", "flash", split=H),
    C("qwen2-s1024-b4-ampbf16-adamw", qwen2(**QWEN2_05B, seq=1024), 4, "amp-bf16", "adamw", hf=True),
    C("qwen2-s2048-b2-bf16-adamw-ckpt", qwen2(**QWEN2_05B, seq=2048), 2, "bf16", "adamw", ckpt=True, hf=True, split=H),
    C("bertb-s512-b32-ampbf16-adamw", bert(**BERT_B, seq=512), 32, "amp-bf16", "adamw", hf=True),
    C("bertb-s512-b16-ampfp16-adamw-eager", bert(**BERT_B, seq=512), 16, "amp-fp16", "adamw", "eager", split=H),
    C("bertl-s512-b8-ampbf16-adamw-ckpt", bert(**BERT_L, seq=512), 8, "amp-bf16", "adamw", ckpt=True),
    C("bertb-s128-b64-bf16-sgdm", bert(**BERT_B, seq=128), 64, "bf16", "sgd-momentum"),
    C("mlp8x8192-b1024-fp32-adamw", mlp(8, 8192), 1024, "fp32", "adamw"),
    C("mlp16x4096-b4096-ampbf16-sgd", mlp(16, 4096), 4096, "amp-bf16", "sgd", split=H),
    C("mlp4x16384-b256-bf16-adam", mlp(4, 16384), 256, "bf16", "adam"),
    C("gpt2s-s1024-b8-ampbf16-adamw8bit", gpt2(**GPT2_S, seq=1024), 8, "amp-bf16", "adamw-8bit"),
]


def hf_config(a):
    """The Hugging Face config.json that describes arch `a`."""
    if a["family"] == "gpt2":
        return {"model_type": "gpt2", "n_layer": a["layers"], "n_embd": a["hidden"],
                "n_head": a["heads"], "n_inner": None, "vocab_size": a["vocab"],
                "n_positions": a["seq"], "activation_function": "gelu_new",
                "tie_word_embeddings": True}
    if a["family"] in ("llama", "qwen2"):
        return {"model_type": a["family"], "num_hidden_layers": a["layers"],
                "hidden_size": a["hidden"], "num_attention_heads": a["heads"],
                "num_key_value_heads": a["kv_heads"], "intermediate_size": a["ffn"],
                "vocab_size": a["vocab"], "max_position_embeddings": max(a["seq"], 4096),
                "hidden_act": "silu", "rms_norm_eps": 1e-6,
                "tie_word_embeddings": a["tied"]}
    if a["family"] == "bert":
        return {"model_type": "bert", "num_hidden_layers": a["layers"],
                "hidden_size": a["hidden"], "num_attention_heads": a["heads"],
                "intermediate_size": a["ffn"], "vocab_size": a["vocab"],
                "max_position_embeddings": a["seq"], "type_vocab_size": 2,
                "hidden_act": "gelu"}
    raise ValueError(a["family"])


def job_spec(c):
    """The TrainingJob spec (gpus, batch, model) of configuration `c`, as JSON."""
    a = c["arch"]
    model = {"precision": c["precision"], "optimizer": c["optimizer"],
             "gradientCheckpointing": c["ckpt"], "attention": c["attention"], "zeroStage": 0}
    if a["family"] == "mlp":
        model["mlp"] = {"layers": a["layers"], "hidden": a["hidden"]}
    elif c["hf"]:
        model["huggingFace"] = {"config": hf_config(a), "seqLen": a["seq"]}
    else:
        model["transformer"] = {
            "kind": a["kind"], "layers": a["layers"], "hidden": a["hidden"],
            "heads": a["heads"], "kvHeads": a["kv_heads"], "ffn": a["ffn"],
            "vocab": a["vocab"], "seqLen": a["seq"], "mlp": a["mlp"], "norm": a["norm"],
            "positional": a["positional"], "tiedEmbeddings": a["tied"]}
    return {"gpus": 1,
            "batch": {"global": c["micro"] * c["accum"], "micro": c["micro"], "minMicro": 1},
            "model": model}


# ------------------------------------------------------------------- the models


def build_model(a, attention):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if a["family"] == "mlp":
        layers = []
        for _ in range(a["layers"]):
            layers += [nn.Linear(a["hidden"], a["hidden"]), nn.ReLU()]
        return nn.Sequential(*layers)

    Hd, nh, kv, S, V = a["hidden"], a["heads"], a["kv_heads"], a["seq"], a["vocab"]
    hd = Hd // nh
    causal = a["kind"] == "decoder"

    def norm():
        return nn.LayerNorm(Hd) if a["norm"] == "layernorm" else nn.RMSNorm(Hd, eps=1e-6)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(Hd, (nh + 2 * kv) * hd, bias=a["qkv_bias"])
            self.proj = nn.Linear(Hd, Hd, bias=a["bias"])

        def forward(self, x, rope):
            B, T, _ = x.shape
            q, k, v = self.qkv(x).split([nh * hd, kv * hd, kv * hd], dim=-1)
            q = q.view(B, T, nh, hd).transpose(1, 2)
            k = k.view(B, T, kv, hd).transpose(1, 2)
            v = v.view(B, T, kv, hd).transpose(1, 2)
            if rope is not None:
                cos, sin = rope
                cos, sin = cos[:T].to(q.dtype), sin[:T].to(q.dtype)
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if kv < nh:  # expand k/v to all heads, as Hugging Face's repeat_kv does
                k = k[:, :, None].expand(B, kv, nh // kv, T, hd).reshape(B, nh, T, hd)
                v = v[:, :, None].expand(B, kv, nh // kv, T, hd).reshape(B, nh, T, hd)
            if attention == "eager":
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
                if causal:
                    att = att.masked_fill(self.mask[:T, :T], float("-inf"))
                att = att.softmax(dim=-1)
                y = att @ v
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            y = y.transpose(1, 2).reshape(B, T, Hd)
            return self.proj(y)

    def rotate(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            if a["mlp"] == "swiglu":
                self.gate = nn.Linear(Hd, a["ffn"], bias=a["bias"])
                self.up = nn.Linear(Hd, a["ffn"], bias=a["bias"])
            else:
                self.up = nn.Linear(Hd, a["ffn"], bias=a["bias"])
            self.down = nn.Linear(a["ffn"], Hd, bias=a["bias"])

        def forward(self, x):
            if a["mlp"] == "swiglu":
                return self.down(F.silu(self.gate(x)) * self.up(x))
            return self.down(F.gelu(self.up(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = norm(), Attn(), norm(), Mlp()

        def forward(self, x, rope):
            if causal:  # pre-norm decoder (GPT-2, LLaMA)
                x = x + self.attn(self.ln1(x), rope)
                return x + self.mlp(self.ln2(x))
            x = self.ln1(x + self.attn(x, rope))  # post-norm encoder (BERT)
            return self.ln2(x + self.mlp(x))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, Hd)
            if a["positional"] == "learned":
                self.wpe = nn.Embedding(S, Hd)
            else:
                inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
                f = torch.outer(torch.arange(S).float(), inv)
                emb = torch.cat((f, f), dim=-1)
                self.register_buffer("cos", emb.cos(), persistent=False)
                self.register_buffer("sin", emb.sin(), persistent=False)
            if not causal:
                self.wtt = nn.Embedding(2, Hd)
                self.ln_emb = norm()
            self.blocks = nn.ModuleList(Block() for _ in range(a["layers"]))
            if causal:
                self.ln_f = norm()
            else:  # BERT masked-LM head transform
                self.head_dense = nn.Linear(Hd, Hd)
                self.head_ln = norm()
            self.lm_head = nn.Linear(Hd, V, bias=not causal)
            if a["tied"]:
                self.lm_head.weight = self.wte.weight
            if attention == "eager" and causal:
                m = torch.ones(S, S, dtype=torch.bool).triu(1)
                for b in self.blocks:
                    b.attn.register_buffer("mask", m, persistent=False)

        def forward(self, idx, targets, ckpt):
            T = idx.shape[1]
            x = self.wte(idx)
            rope = None
            if a["positional"] == "learned":
                x = x + self.wpe.weight[:T]
            else:
                rope = (self.cos, self.sin)
            if not causal:
                x = self.ln_emb(x + self.wtt.weight[0])
            for b in self.blocks:
                if ckpt:
                    x = torch.utils.checkpoint.checkpoint(b, x, rope, use_reentrant=False)
                else:
                    x = b(x, rope)
            if causal:
                x = self.ln_f(x)
            else:
                x = self.head_ln(F.gelu(self.head_dense(x), approximate="tanh"))
            logits = self.lm_head(x)
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    return LM()


def make_optimizer(name, params):
    import torch
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=1e-3)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3)
    if name == "adamw-8bit":
        import bitsandbytes as bnb  # absent on the calibration machine: config skipped
        return bnb.optim.AdamW8bit(params, lr=1e-4)
    raise ValueError(name)


def precisions(c):
    """(the model's dtype in pure low precision, autocast's dtype) of `c`."""
    import torch
    return ({"bf16": torch.bfloat16, "fp16": torch.float16}.get(c["precision"]),
            {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(c["precision"]))


def train_step(c, model, opt, scaler, gen=None, attn_ctx=None):
    """One optimizer step of configuration `c` (its micro-steps, backward,
    the step and clearing the gradients), as the GPU run trains and as
    capture_reference_profiles.py captures it on the CPU."""
    import contextlib
    import torch
    import torch.nn.functional as F

    a = c["arch"]
    pure, amp = precisions(c)
    B = c["micro"]
    attn_ctx = attn_ctx or contextlib.nullcontext
    for _ in range(c["accum"]):
        if a["family"] == "mlp":
            dt = pure or torch.float32
            x = torch.randn(B, a["hidden"], device="cuda", dtype=dt, generator=gen)
            y = torch.randn(B, a["hidden"], device="cuda", generator=gen)
            with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
                loss = F.mse_loss(model(x).float(), y) / c["accum"]
        else:
            idx = torch.randint(0, a["vocab"], (B, a["seq"]), device="cuda", generator=gen)
            tgt = torch.randint(0, a["vocab"], (B, a["seq"]), device="cuda", generator=gen)
            with torch.autocast("cuda", dtype=amp, enabled=amp is not None), attn_ctx():
                loss = model(idx, tgt, c["ckpt"]) / c["accum"]
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        del loss
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)


# ------------------------------------------------------------------- the child


def child(c, wfd, rfd, snapdir):
    """Trains configuration `c`; reports stages to the parent through a pipe and
    waits for the parent's NVML reading after each."""
    import contextlib
    import torch

    def stage(name, **kw):
        os.write(wfd, (json.dumps(dict(stage=name, **kw)) + "\n").encode())
        os.read(rfd, 1)

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    stage("context", reserved=torch.cuda.memory_reserved())
    if c["snapshot"]:
        torch.cuda.memory._record_memory_history(enabled="all", context=None,
                                                 stacks="python", max_entries=5_000_000)
    a = c["arch"]
    prec = c["precision"]
    pure, _ = precisions(c)
    with torch.device("cuda"):
        model = build_model(a, c["attention"])
    if pure is not None:
        model = model.to(pure)
    nparams = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(c["optimizer"], model.parameters())
    scaler = torch.amp.GradScaler("cuda") if prec == "amp-fp16" else None
    torch.cuda.synchronize()
    stage("built", reserved=torch.cuda.memory_reserved(),
          allocated=torch.cuda.memory_allocated(), params=nparams)

    gen = torch.Generator(device="cuda").manual_seed(0)
    if c["attention"] == "flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        attn_ctx = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)  # noqa: E731
    else:
        attn_ctx = contextlib.nullcontext
    t0 = time.time()
    for _ in range(c["steps"]):
        train_step(c, model, opt, scaler, gen, attn_ctx)
    torch.cuda.synchronize()
    secs = time.time() - t0
    if c["snapshot"]:
        torch.cuda.memory._dump_snapshot(os.path.join(snapdir, c["name"] + ".pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
    stage("end", reserved=torch.cuda.memory_reserved(),
          maxReserved=torch.cuda.max_memory_reserved(),
          maxAllocated=torch.cuda.max_memory_allocated(), seconds=secs,
          numAllocRetries=torch.cuda.memory_stats().get("num_alloc_retries", 0))


# ------------------------------------------------------------------- the parent


class Nvml:
    """Per-process and device-wide used memory through NVML (nvidia-ml-py), with
    nvidia-smi as a fallback."""

    def __init__(self):
        self.h = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.name = pynvml.nvmlDeviceGetName(self.h)
            self.total = pynvml.nvmlDeviceGetMemoryInfo(self.h).total
        except Exception as e:  # noqa: BLE001
            print("pynvml unavailable, using nvidia-smi:", e, flush=True)
            self.name, self.total = "unknown", 0

    def proc(self, pid):
        if self.h is not None:
            try:
                procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.h)
            except Exception:  # noqa: BLE001
                procs = []
            for p in procs:
                if p.pid == pid:
                    return p.usedGpuMemory or 0
            return None
        import subprocess
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            p, mib = [s.strip() for s in line.split(",")]
            if int(p) == pid:
                return int(mib) * 1024 * 1024
        return None

    def device_used(self):
        if self.h is None:
            return None
        return self.nv.nvmlDeviceGetMemoryInfo(self.h).used


def run_one(c, nvml, snapdir, timeout=120.0):
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r1)
        os.close(w2)
        code = 0
        try:
            child(c, w1, r2, snapdir)
        except BaseException as e:  # noqa: BLE001
            msg = json.dumps({"stage": "error", "error": f"{type(e).__name__}: {e}"[:2000]})
            try:
                os.write(w1, (msg + "\n").encode())
            except OSError:
                pass
            code = 1
        os._exit(code)
    os.close(w1)
    os.close(r2)
    stages, buf, sampled, dev_sampled = {}, b"", 0, 0
    base_dev = nvml.device_used()
    t0 = time.time()
    status = None
    while True:
        ready, _, _ = select.select([r1], [], [], 0.002)
        u = nvml.proc(pid)
        if u:
            sampled = max(sampled, u)
        d = nvml.device_used()
        if d:
            dev_sampled = max(dev_sampled, d)
        if ready:
            chunk = os.read(r1, 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if msg["stage"] != "error":
                    time.sleep(0.05)
                    readings = [nvml.proc(pid) or 0 for _ in range(3)]
                    msg["nvmlProc"] = max(readings)
                    msg["deviceUsed"] = nvml.device_used()
                    sampled = max(sampled, msg["nvmlProc"])
                    try:
                        os.write(w2, b"x")
                    except OSError:
                        pass
                stages[msg["stage"]] = msg
        if time.time() - t0 > timeout:
            os.kill(pid, 9)
            stages["error"] = {"error": f"timeout after {timeout}s"}
            break
    _, status = os.waitpid(pid, 0)
    os.close(r1)
    os.close(w2)
    return stages, sampled, dev_sampled, base_dev, status


def measured_record(c, stages, sampled, dev_sampled, base_dev):
    ctx, built, end = stages["context"], stages["built"], stages["end"]
    peak = max(sampled, end["nvmlProc"])
    return {
        "nvmlPeakBytes": peak,
        "nvmlEndBytes": end["nvmlProc"],
        "nvmlSampledMaxBytes": sampled,
        "maxReservedBytes": end["maxReserved"],
        "maxAllocatedBytes": end["maxAllocated"],
        "reservedEndBytes": end["reserved"],
        "contextBytes": ctx["nvmlProc"] - ctx["reserved"],
        "nonAllocatorBytes": end["nvmlProc"] - end["reserved"],
        "builtAllocatedBytes": built["allocated"],
        "deviceUsedPeakDeltaBytes": (dev_sampled - base_dev) if base_dev else None,
        "parameters": built["params"],
        "stepSeconds": end["seconds"] / c["steps"],
        "allocRetries": end["numAllocRetries"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--deadline", type=float, default=420.0,
                    help="seconds after which remaining configurations are skipped")
    ap.add_argument("--only", default="", help="comma-separated names to run")
    ap.add_argument("--dry-run", action="store_true", help="list the zoo without a GPU")
    ap.add_argument("--snapshots", action="store_true",
                    help="record every chosen configuration's allocation history; its profile "
                         "keeps the allocator's segments (`allocator`)")
    args = ap.parse_args()
    zoo = [c for c in ZOO if not args.only or c["name"] in args.only.split(",")]
    if args.snapshots:
        zoo = [dict(c, snapshot=True, allocator=True) for c in zoo]
    names = [c["name"] for c in zoo]
    assert len(names) == len(set(names)), "duplicate configuration names"
    if args.dry_run:
        for c in zoo:
            print(json.dumps({"name": c["name"], "split": c["split"], "spec": job_spec(c)}))
        print(f"{len(zoo)} configurations, "
              f"{sum(c['split'] == 'holdout' for c in zoo)} held out", file=sys.stderr)
        return

    import torch  # imported before forking so each child starts fast
    import snapshot_to_profile

    os.makedirs(args.out, exist_ok=True)
    snapdir = "/tmp/vramfit-snapshots"  # outside --out: only the tarball travels back
    os.makedirs(snapdir, exist_ok=True)
    nvml = Nvml()
    print(f"torch {torch.__version__} gpu {nvml.name} total {nvml.total}", flush=True)
    t_start = time.time()
    out_path = os.path.join(args.out, "h200.jsonl")
    with open(out_path, "w") as f:
        for i, c in enumerate(zoo):
            if time.time() - t_start > args.deadline:
                print(f"deadline: skipping {c['name']}", flush=True)
                continue
            t0 = time.time()
            stages, sampled, dev_sampled, base_dev, status = run_one(c, nvml, snapdir)
            line = {"name": c["name"], "split": c["split"], "spec": job_spec(c),
                    "gpu": nvml.name, "torch": torch.__version__, "snapshot": c["snapshot"]}
            if "end" in stages:
                line["measured"] = measured_record(c, stages, sampled, dev_sampled, base_dev)
                f.write(json.dumps(line) + "\n")
                f.flush()
                m = line["measured"]
                print(f"[{i + 1}/{len(zoo)}] {c['name']}: nvml {m['nvmlPeakBytes'] / 2**30:.3f} GiB "
                      f"reserved {m['maxReservedBytes'] / 2**30:.3f} allocated "
                      f"{m['maxAllocatedBytes'] / 2**30:.3f} nonalloc "
                      f"{m['nonAllocatorBytes'] / 2**20:.0f} MiB ({time.time() - t0:.1f}s)",
                      flush=True)
            else:
                err = stages.get("error", {}).get("error", f"exit status {status}")
                print(f"[{i + 1}/{len(zoo)}] {c['name']}: FAILED {err}", flush=True)
                line["error"] = err
                with open(os.path.join(args.out, "errors.jsonl"), "a") as ef:
                    ef.write(json.dumps(line) + "\n")
            if c["snapshot"] and "end" in stages:
                pk = os.path.join(snapdir, c["name"] + ".pickle")
                prof = snapshot_to_profile.convert_file(pk, micro_batch=c["micro"],
                                                        grad_accum=c["accum"],
                                                        source=c["name"],
                                                        with_allocator=c.get("allocator", False))
                if "measured" in line:
                    prof["measured"] = {k: line["measured"][k] for k in
                                        ("nvmlPeakBytes", "maxReservedBytes",
                                         "maxAllocatedBytes", "nonAllocatorBytes")}
                prof["spec"] = line["spec"]
                pp = os.path.join(args.out, c["name"] + ".profile.json")
                with open(pp, "w") as pf:
                    json.dump(prof, pf, separators=(",", ":"))
                print(f"  profile {pp}: {os.path.getsize(pp)} bytes, "
                      f"{len(prof['events'])} events, snapshot {os.path.getsize(pk)} bytes",
                      flush=True)
    with tarfile.open(os.path.join(args.out, "snapshots.tar.gz"), "w:gz") as tf:
        tf.add(snapdir, arcname="snapshots")
    print(f"done in {time.time() - t_start:.0f}s -> {out_path}", flush=True)


if __name__ == "__main__":
    main()
