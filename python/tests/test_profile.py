"""Profile capture on the CPU under FakeTensorMode (vramfit.profile)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from vramfit import profile  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

HERE = Path(__file__).resolve().parent
MLP = "profile_models:mlp"


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def sizes_in_order(p: dict) -> list:
    return [p["sizes"][e] for e in p["events"] if e >= 0]


def run(model: str = MLP, **kw: object) -> dict:
    args = dict(config={}, batch=4, precision="fp32", optimizer="adamw", input_shape=(256,))
    args.update(kw)
    return profile.capture(model, **args)  # type: ignore[arg-type]


def mlp_param_sizes(width: int = 256, classes: int = 10, depth: int = 2, elem: int = 4) -> list:
    out = []
    for _ in range(depth):
        out += [width * width * elem, width * elem]
    return out + [classes * width * elem, classes * elem]


def test_parameters_are_allocated_first_in_to_device_order() -> None:
    p = run()
    assert p["format"] == "vramfit.profile/v1" and p["microBatch"] == 4
    assert sizes_in_order(p)[:6] == mlp_param_sizes()


def test_pure_bf16_halves_the_parameters() -> None:
    p = run(precision="bf16")
    assert sizes_in_order(p)[:6] == mlp_param_sizes(elem=2)


def test_adamw_state_exists_after_the_first_step() -> None:
    params = sum(mlp_param_sizes())
    sgd = run(optimizer="sgd")
    adamw = run(optimizer="adamw")
    # two moments of every parameter more at the peak
    assert adamw["capture"]["peakLiveBytes"] - sgd["capture"]["peakLiveBytes"] >= 2 * params


def test_autocast_keeps_low_precision_copies_of_the_weights() -> None:
    p = run(precision="amp-bf16")
    seq = sizes_in_order(p)
    # the bf16 copy of the first weight is made after the parameters
    assert 256 * 256 * 2 in seq[6:]


def test_dropout_keeps_a_one_byte_mask_as_cuda_does() -> None:
    with_dropout = sizes_in_order(run(config={"dropout": 0.5}, batch=8))
    assert 8 * 256 in with_dropout  # bool mask of the (8, 256) activation
    assert 8 * 256 not in sizes_in_order(run(batch=8))


def test_fused_attention_keeps_no_sequence_by_sequence_matrix() -> None:
    b, s, heads = 2, 128, 4
    p = run("profile_models:attn", batch=b, input_shape=(s, 64), precision="fp32")
    assert max(p["sizes"]) < b * heads * s * s * 4
    # output and log-sum-exp of the fused kernel
    assert b * heads * s * 4 in p["sizes"]


def test_cublas_workspace_positions_for_forward_and_backward() -> None:
    p = run()
    at = p["cublasWorkspaceAt"]
    assert len(at) == 2 and 0 < at[0] < at[1] <= len(p["events"])


def test_a_cnn_is_captured_with_its_batch_norm_and_conv_shapes() -> None:
    p = run("profile_models:cnn", batch=2, input_shape=(3, 32, 32), optimizer="sgd-momentum")
    seq = sizes_in_order(p)
    assert 2 * 16 * 32 * 32 * 4 in seq  # the first conv's output
    assert p["capture"]["zeroGrad"] == "before-backward"


def test_convolutions_are_written_where_cudnn_takes_their_workspaces() -> None:
    p = run("profile_models:cnn", batch=2, input_shape=(3, 32, 32), optimizer="sgd-momentum",
            steps=1)
    calls = p["convolutions"]
    # two convolutions: both forwards, then backward the second's input and
    # weight gradients and the first's weight gradient (its input needs none)
    assert [(c["kind"], c["weight"][:2]) for c in calls] == [
        ("forward", [16, 3]), ("forward", [32, 16]),
        ("input", [32, 16]), ("weight", [32, 16]), ("weight", [16, 3])]
    first = calls[0]
    assert first["input"] == [2, 3, 32, 32] and first["stride"] == [1, 1]
    assert first["padding"] == [1, 1] and first["groups"] == 1
    assert first["dtype"] == "float32" and not first["channelsLast"]
    sizes = [p["sizes"][e] if e >= 0 else None for e in p["events"]]
    # each forward's workspace comes right after its output
    assert sizes[first["at"] - 1] == 2 * 16 * 32 * 32 * 4
    # the weight gradient's workspace right after that gradient
    assert sizes[calls[3]["at"] - 1] == 32 * 16 * 3 * 3 * 4
    assert all(0 < c["at"] <= len(p["events"]) for c in calls)


def test_bias_gradients_are_written_as_column_sums() -> None:
    p = run(batch=64, optimizer="sgd", steps=1)
    # the MLP's three biases, each summed over the 64 rows of its gradient
    sums = p["reductions"]
    assert sorted(r["outputs"] for r in sums) == [10, 256, 256]
    assert {r["rows"] for r in sums} == {64}
    sizes = [p["sizes"][e] if e >= 0 else None for e in p["events"]]
    # recorded right after the sum's output
    assert all(sizes[r["at"] - 1] == r["outputs"] * 4 for r in sums)


def test_only_sums_of_leading_dimensions_of_contiguous_tensors_are_column_sums() -> None:
    x = torch.zeros(4, 8, 16)
    assert profile._column_sum(x, [0, 1]) == (32, 16)
    assert profile._column_sum(x, [0]) == (4, 128)
    assert profile._column_sum(x, [-3]) == (4, 128)
    assert profile._column_sum(x, 0) == (4, 128)
    for dims in ([1], [2], [0, 2], [0, 1, 2], []):
        assert profile._column_sum(x, dims) is None, dims
    assert profile._column_sum(x.transpose(0, 1), [0]) is None
    assert profile._column_sum(torch.zeros(8), [0]) is None


def test_a_permuted_input_is_written_as_channels_last() -> None:
    p = run("profile_models:channels_last_block", batch=2, input_shape=(3, 16, 16),
            optimizer="sgd", steps=1)
    layouts = {(c["kind"], c["groups"]): c["channelsLast"] for c in p["convolutions"]}
    assert layouts[("forward", 8)] and layouts[("weight", 8)]
    assert not layouts[("forward", 1)]


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(profile.CaptureError, match="--model"):
        run("no_such_module_xyz:f")
    with pytest.raises(profile.CaptureError, match="--input"):
        profile.parse_input("3xAx2")
    with pytest.raises(profile.CaptureError, match="--input"):
        run(input_shape=None)
    with pytest.raises(profile.CaptureError, match="--precision"):
        run(precision="fp8")


def test_the_command_line_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    r = subprocess.run(
        [sys.executable, "-m", "vramfit.profile", "--model", MLP, "--config", '{"width": 64}',
         "--input", "64", "--batch", "2", "--precision", "amp-fp16", "--optimizer", "adagrad",
         "-o", str(out)],
        capture_output=True, text=True, cwd=HERE.parent,
        env={**__import__("os").environ, "PYTHONPATH": f"{HERE}:{HERE.parent}"})
    assert r.returncode == 0, r.stderr
    p = json.loads(out.read_text())
    assert p["capture"]["precision"] == "amp-fp16" and p["events"]
    assert "captured" in r.stderr
    bad = subprocess.run([sys.executable, "-m", "vramfit.profile", "--model", "x", "--input", "3",
                          "--batch", "1"], capture_output=True, text=True, cwd=HERE.parent)
    assert bad.returncode == 2 and "MODULE:CALLABLE" in bad.stderr


def test_fp32_grouped_query_attention_takes_the_math_path_as_on_cuda() -> None:
    b, s, heads = 2, 128, 4
    scores = b * heads * s * s * 4
    fp32 = run("profile_models:gqa_attn", batch=b, input_shape=(s, 64), precision="fp32")
    assert scores in fp32["sizes"]
    bf16 = run("profile_models:gqa_attn", batch=b, input_shape=(s, 64), precision="bf16")
    assert max(bf16["sizes"]) < scores // 2


def test_checkpointed_recomputation_follows_cuda_behaviour_too() -> None:
    p = run("profile_models:checkpointed_mlp", batch=8, checkpointing=True)
    seq = sizes_in_order(p)
    # a 1-byte dropout mask in the forward and again in the recomputation
    assert seq.count(8 * 256) >= 2 * p["capture"]["steps"]
    assert p["capture"]["checkpointing"] is True


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_scripts_own_checkpoint_recomputes_under_cuda_behaviour(reentrant: bool) -> None:
    # A script that checkpoints with torch.utils.checkpoint itself (not the
    # library's gradient_checkpointing_enable): the recomputation in backward
    # runs where no function mode is active. It must still run attention as
    # CUDA does (a non-reentrant checkpoint otherwise finds its recomputed
    # tensors unlike the forward's and fails), and the backward of the
    # recomputed bf16 attention take the fused kernel's workspace.
    b, h, s, d = 2, 4, 128, 16

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(h * d, 3 * h * d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).view(b, s, 3, h, d).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return y.transpose(1, 2).reshape(b, s, h * d)

    with torch.device("meta"):
        model = Attention()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(m: Any) -> None:
        x = torch.randn(b, s, h * d, device="cuda", requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = torch.utils.checkpoint.checkpoint(m, x, use_reentrant=reentrant)
        y.float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    p = profile.capture_step(model, step, micro_batch=b, steps=2, optimizers=[opt])
    seq = sizes_in_order(p)
    assert seq.count(b * h * s * (d + 1) * 4) == 2, "one fused backward workspace a step"
    assert max(seq) < b * h * s * s * 2, "no score matrix, in the forward or the recomputation"


@pytest.mark.parametrize("make", [
    lambda params, foreach: torch.optim.AdamW(params, foreach=foreach),
    lambda params, foreach: torch.optim.Adagrad(params, foreach=foreach),
])
def test_an_optimizer_left_to_choose_steps_as_on_a_gpu(make: Any) -> None:
    # PyTorch picks the multi-tensor (foreach) step for parameters on a GPU
    # when the script leaves `foreach` unset; the capture's parameters are
    # fake CPU tensors, which would get the one-tensor loop.
    def sizes(foreach: Any) -> list:
        with torch.device("meta"):
            model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
        opt = make(model.parameters(), foreach)

        def step(m: Any) -> None:
            m(torch.randn(4, 256, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return sizes_in_order(profile.capture_step(model, step, micro_batch=4, steps=2,
                                                   optimizers=[opt]))

    assert sizes(True) != sizes(False), "the two implementations allocate alike"
    assert sizes(None) == sizes(True)


def test_fused_attention_output_is_transposed_back_without_a_copy() -> None:
    q, k, v = (torch.zeros(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    with profile._function_mode():
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    # laid out (batch, seq, heads, dim) as the CUDA kernels write it
    assert y.shape == (2, 4, 16, 8) and y.transpose(1, 2).is_contiguous()


def allocations_made(fn: Any) -> list:
    """The sizes of the storages `fn` makes under the capture's fake tensors
    and CUDA behaviour, in order."""
    rec = profile._Recorder()
    with FakeTensorMode(allow_non_fake_inputs=True), profile._dispatch_mode(rec), \
            profile._function_mode():
        fn()
    return [n for kind, n in rec.events if kind == "a"]


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_half_precision_fused_attention_backward_takes_one_workspace(kv_heads: int) -> None:
    # The recorded H200 runs (GPT-2, LLaMA, Mistral in bf16 and fp16): after
    # the gradients of q, k and v, one buffer of the queries' gradient in fp32
    # plus the softmax row sums, and with grouped heads the keys' and values'
    # gradients at every query head; fp32 (the memory-efficient kernel) takes
    # none of that size.
    b, h, s, d = 2, 4, 64, 16

    def sizes(dtype: torch.dtype) -> list:
        q = torch.zeros(b, h, s, d, dtype=dtype, requires_grad=True)
        k, v = (torch.zeros(b, kv_heads, s, d, dtype=dtype, requires_grad=True) for _ in range(2))

        def attend() -> None:
            y = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, enable_gqa=kv_heads != h)
            y.sum().backward()

        return allocations_made(attend)

    workspace = b * h * s * (d + 1) * 4
    if kv_heads != h:
        workspace += b * h * s * 2 * d * 2
    assert workspace in sizes(torch.bfloat16)
    assert workspace in sizes(torch.float16)
    assert workspace not in sizes(torch.float32)


def test_rms_norm_runs_fused_as_on_cuda() -> None:
    # F.rms_norm (torch.nn.RMSNorm) on CUDA is one kernel: the output and an
    # fp32 inverse RMS per row, the bf16 input kept as it is; the CPU's
    # composite path would keep an fp32 copy of the input.
    rows, h = 256, 512

    def normalize() -> None:
        x = torch.zeros(rows, h, dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(h, dtype=torch.bfloat16, requires_grad=True)
        torch.nn.functional.rms_norm(x, [h], w, 1e-6).sum().backward()

    made = allocations_made(normalize)
    assert rows * 4 in made, "the inverse RMS of each row"
    assert rows * h * 4 not in made, "no fp32 copy of the input"
    assert made.count(rows * h * 2) == 3, "the input, the output and the input's gradient"


def test_autocast_casts_attentions_inputs_last_argument_first() -> None:
    # CUDA autocast's wrapper evaluates its arguments right to left: the
    # H200's recorded Mistral autocast runs cast the (fp32) keys and values
    # before the queries.
    b, s = 2, 64
    q = torch.zeros(b, 4, s, 16, requires_grad=True)
    k = torch.zeros(b, 2, s, 16, requires_grad=True)
    v = torch.zeros(b, 2, s, 8, requires_grad=True)

    def attend() -> None:
        with profile._autocast_on_cpu(), torch.autocast("cuda", dtype=torch.bfloat16):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    made = allocations_made(attend)
    assert made[:3] == [v.numel() * 2, k.numel() * 2, q.numel() * 2]


def test_cross_entropy_of_low_precision_logits_runs_cudas_composite() -> None:
    b, c = 8, 3000
    amp = run("profile_models:mlp", config={"classes": c}, batch=b, precision="amp-bf16")
    seq = sizes_in_order(amp)
    steps = amp["capture"]["steps"]
    # CrossEntropyLoss's composite under CUDA autocast: log_softmax in the
    # logits' dtype, nll_loss (autocast's fp32 list) on an fp32 copy; bf16:
    # the logits, the log-probabilities, the nll gradient cast back and the
    # log-softmax gradient; fp32: the copy and the nll gradient
    assert seq.count(b * c * 2) == 4 * steps
    assert seq.count(b * c * 4) == 2 * steps


def test_an_fp16_softmax_into_fp32_makes_no_upcast_copy_and_a_bf16_one_does() -> None:
    # ATen's softmax(x, dim, dtype=float32) runs CUDA's fused half_to_float
    # kernel for fp16 only; a bf16 input is converted to fp32 first (the
    # H200's recorded bf16 LLaMA and DeBERTa-v3 runs allocate that copy).
    b, c = 8, 3000
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, c))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def capture(dtype: torch.dtype) -> list:
        def step(m: torch.nn.Module) -> None:
            with torch.autocast("cuda", dtype=dtype):
                logp = torch.nn.functional.log_softmax(m(torch.randn(b, 32).cuda()), -1,
                                                       dtype=torch.float32)
            logp[:, 0].sum().backward()
            optimizer.step()
            optimizer.zero_grad()

        p = profile.capture_step(model, step, micro_batch=b, optimizers=[optimizer])
        return [p["sizes"][e] for e in p["events"] if e >= 0]

    # fp16: the log-softmax (half_to_float) and its gradient, in fp32; the
    # logits and the gradient the fused backward writes, in fp16
    steps = profile.STEPS
    fp16 = capture(torch.float16)
    assert fp16.count(b * c * 4) == steps * 2
    assert fp16.count(b * c * 2) == steps * 2
    # bf16: besides, the fp32 copy of the logits and the fp32 gradient of
    # that copy, which the copy's backward casts back to bf16
    bf16 = capture(torch.bfloat16)
    assert bf16.count(b * c * 4) == steps * 4
    assert bf16.count(b * c * 2) == steps * 2


@pytest.mark.parametrize("op", ["cat", "stack"])
def test_joining_a_fp32_and_a_bf16_tensor_under_autocast_copies_nothing(op: str) -> None:
    # CPU autocast casts cat's and stack's inputs to the widest dtype first;
    # CUDA autocast leaves them alone and the kernel promotes as it writes (the
    # H200's recorded LLaMA autocast runs: a fp32 cache grown by a bf16 value,
    # no copy of the value).
    b, d = 8, 1000
    model = torch.nn.Linear(d, d)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(m: torch.nn.Module) -> None:
        x = torch.randn(b, d).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = m(x)  # bf16
            joined = getattr(torch, op)([x, low])  # fp32
        joined.float().sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    seq = sizes_in_order(profile.capture_step(model, step, micro_batch=b,
                                              optimizers=[optimizer]))
    # each step: the input, the joined tensor (two rows of it); no fp32 copy
    # of the bf16 output
    assert seq.count(b * d * 4) == profile.STEPS
    assert seq.count(2 * b * d * 4) == profile.STEPS


# ------------------------------------------------ models that failed or fell short

transformers = pytest.importorskip("transformers")


def test_a_checkpointed_decoder_builds_no_causal_mask_as_on_cuda() -> None:
    # Without a cache or an attention mask transformers looks for packed
    # sequences in the position ids, and takes a fake tensor for tracing: the
    # capture then built the full causal mask and, with grouped-query heads,
    # repeated the keys and values for SDPA; the H200's recorded runs have
    # neither (one sequence per row: SDPA applies causality itself).
    b, s, heads, kv_heads, head_dim = 2, 384, 8, 2, 32
    cfg = {"hidden_size": heads * head_dim, "intermediate_size": 512,
           "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "head_dim": head_dim, "num_hidden_layers": 2, "vocab_size": 512,
           "max_position_embeddings": s}
    p = profile.capture("transformers:LlamaForCausalLM", cfg, batch=b, precision="bf16",
                        optimizer="adamw", seq_len=s, steps=1, attention="sdpa",
                        checkpointing=True)
    # no mask (b x 1 x s x s booleans; with one, transformers also repeats
    # the grouped keys and values for SDPA)
    assert b * s * s not in sizes_in_order(p)


def test_a_value_fake_tensors_lack_takes_the_steps_usual_value() -> None:
    # OPT's LayerDrop compares a random number with the drop rate in Python
    # (transformers up to 5.17 draws it in every training forward, later ones
    # when layerdrop > 0): fake tensors have no value to compare.
    layers, steps = 2, 2
    cfg = {"num_hidden_layers": layers, "hidden_size": 64, "ffn_dim": 128, "num_attention_heads": 4,
           "vocab_size": 512, "word_embed_proj_dim": 64, "max_position_embeddings": 64,
           "layerdrop": 0.5}
    p = profile.capture("transformers:OPTForCausalLM", cfg, batch=2, precision="amp-bf16",
                        optimizer="adamw", seq_len=16, steps=steps)
    assert p["capture"]["dataDependentReads"] == layers * steps
    # no layer was dropped: every layer's fc1 output (2 x 16 x 128 bf16) is there
    assert sizes_in_order(p).count(2 * 16 * 128 * 2) >= layers * steps


def test_grouped_matrix_products_run_in_fp32_as_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    # PyTorch up to 2.11 checks for bf16 in the fake kernel of _grouped_mm,
    # while CUDA's runs fp32 too, which Mixtral's experts get under autocast
    # (transformers casts the tokens to the fp32 master weights).
    import torch._meta_registrations as meta

    common = meta._meta_grouped_mm_common

    def bf16_only(mat_a, mat_b, *args, **kwargs):  # type: ignore[no-untyped-def]
        torch._check(mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16,
                     lambda: f"Expected inputs of BF16 type but got mat_a.dtype={mat_a.dtype}")
        return common(mat_a, mat_b, *args, **kwargs)

    monkeypatch.setattr(meta, "_meta_grouped_mm_common", bf16_only)
    b, s, topk, inter = 2, 16, 2, 128
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": inter,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
           "num_experts_per_tok": topk, "vocab_size": 512}
    p = profile.capture("transformers:MixtralForCausalLM", cfg, batch=b, precision="amp-bf16",
                        optimizer="adamw", seq_len=s)
    # the experts' gate/up product of every routed token, in fp32
    assert b * s * topk * 2 * inter * 4 in sizes_in_order(p)


def test_a_constructor_that_computes_with_tensors_is_built() -> None:
    # torchvision's RegNet: "Cannot copy out of meta tensor; no data!"
    p = run("profile_models:staged", batch=2, input_shape=(3, 16, 16), optimizer="sgd-momentum")
    seq = sizes_in_order(p)
    assert seq[0] == 16 * 3 * 3 * 3 * 4  # the first conv's weight, first, as .to() moves it
    assert 2 * 16 * 16 * 16 * 4 in seq  # its output


def test_t5_trains_with_the_bias_gradient_of_cudas_attention_kernel() -> None:
    # T5's relative-position bias is SDPA's mask and needs a gradient: cuDNN
    # and flash cannot run it, the memory-efficient kernel does and writes
    # the bias's gradient at (batch, heads, q, keys padded to 16).
    b, s, heads = 2, 40, 4
    cfg = {"num_layers": 1, "num_decoder_layers": 1, "d_model": 64, "d_ff": 128, "d_kv": 16,
           "num_heads": heads, "vocab_size": 512, "dropout_rate": 0.1}
    p = profile.capture("transformers:T5ForConditionalGeneration", cfg, batch=b,
                        precision="amp-bf16", optimizer="adamw", seq_len=s)
    assert b * heads * s * 48 * 2 in p["sizes"]


def test_attention_with_a_mask_cuda_cannot_fuse_takes_the_math_path_in_fp32() -> None:
    # T5 as transformers up to 5.17 ran it: the mask's last dimension is not
    # contiguous, so no fused kernel takes it and the math fallback runs,
    # which upcasts bf16 to fp32: scores, softmax and dropout materialised.
    b, s, heads = 2, 128, 4
    scores = b * heads * s * s
    math_path = sizes_in_order(run("profile_models:bias_attn", batch=b, input_shape=(s, 64),
                                   precision="amp-bf16"))
    assert math_path.count(scores * 4) >= 3 and scores in math_path  # fp32 x3, the dropout mask
    fused = sizes_in_order(run("profile_models:bias_attn", config={"contiguous": True}, batch=b,
                               input_shape=(s, 64), precision="amp-bf16"))
    assert scores * 4 not in fused
    assert scores * 2 in fused  # the bias's gradient, bf16, from the memory-efficient kernel


def test_sdpa_backend_follows_cudas_choice() -> None:
    def t(*shape: int, dtype: torch.dtype = torch.bfloat16, grad: bool = False) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, requires_grad=grad)

    q = t(2, 8, 64, 64)
    assert profile._sdpa_backend(q, q, q, None, True) == "cudnn"
    assert profile._sdpa_backend(q, q, q, t(1, 8, 64, 64), False) == "cudnn"
    assert profile._sdpa_backend(q, q, q, t(1, 8, 64, 64, grad=True), False) == "efficient"
    permuted = t(64, 64, 8, grad=True).permute(2, 0, 1).unsqueeze(0)
    assert profile._sdpa_backend(q, q, q, permuted, False) == "math"
    big = t(2, 8, 64, 192)
    assert profile._sdpa_backend(big, big, big, None, False) == "flash"
    f = t(2, 8, 64, 64, dtype=torch.float32)
    assert profile._sdpa_backend(f, f, f, None, True) == "efficient"
    assert profile._sdpa_backend(f, t(2, 2, 64, 64, dtype=torch.float32),
                                 t(2, 2, 64, 64, dtype=torch.float32), None, True) == "math"


def test_the_capture_reports_its_time_and_peak_host_memory() -> None:
    c = run()["capture"]
    assert c["seconds"] > 0 and c["peakHostBytes"] > 10 * 2**20
    assert "peak host memory" in profile.summary(run())


# ---------------------------------------------------------- a script's own step


def test_capture_step_records_a_plain_scripts_step() -> None:
    # an optimizer built before the call, .cuda() and torch.autocast("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []

    def step(m: torch.nn.Module) -> None:
        x = torch.randn(8, 32).cuda()  # stays on the CPU under the capture
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x.to("cuda")).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seen.append(loss.dtype)

    p = profile.capture_step(model, step, micro_batch=8, optimizers=[optimizer])
    seq = [p["sizes"][e] for e in p["events"] if e >= 0]
    assert seq[:2] == [32 * 32 * 4, 32 * 4]  # the parameters, first, in .to() order
    assert 8 * 32 * 2 in seq  # a bf16 activation: torch.autocast("cuda") became CPU autocast
    assert seq.count(32 * 32 * 4) >= 3  # weight, its gradient, its momentum buffer
    assert p["microBatch"] == 8 and len(seen) == profile.STEPS


def test_a_data_loaders_shuffle_draws_real_indices_and_is_not_recorded() -> None:
    g = torch.Generator().manual_seed(0)
    with profile.Capture() as cap:
        order = list(torch.utils.data.RandomSampler(range(10), generator=g))
    assert sorted(order) == list(range(10)) and cap.rec.count == 0


def test_an_image_classifier_from_transformers_trains_on_pixels_and_class_labels() -> None:
    # ViTForImageClassification takes pixel_values and one label per image,
    # not token ids: the patch embedding's output and the logits are there.
    b, side, patch, hidden, labels = 2, 32, 8, 64, 10
    cfg = {"num_hidden_layers": 1, "hidden_size": hidden, "num_attention_heads": 4,
           "intermediate_size": 128, "image_size": side, "patch_size": patch,
           "num_labels": labels}
    p = profile.capture("transformers:ViTForImageClassification", cfg, batch=b,
                        precision="fp32", optimizer="adamw")
    seq = sizes_in_order(p)
    assert b * 3 * side * side * 4 in seq  # the pixels
    assert b * hidden * (side // patch) ** 2 * 4 in seq  # the patch embedding's output
    assert b * labels * 4 in seq  # the logits


@pytest.mark.parametrize("autocast", [True, False])
def test_a_tied_tables_two_gradients_are_added_as_on_cuda(autocast: bool) -> None:
    # The word table is read twice (embedding and head). On CUDA autograd
    # adds the second gradient into the first when it holds the only
    # reference to it and its storage: under autocast the head's gradient
    # is the cast's fresh copy, so the sum is made in place; without, it is
    # the transposed view of the matrix product, which keeps its base, so
    # the sum is a new tensor (the H200's recorded runs). Fake tensors are a
    # tensor subclass, for which autograd always makes a new sum, so the
    # capture turns the in-place case back into the first gradient.
    vocab, dim = 1000, 48  # a table of a size no activation has
    table = vocab * dim * 4

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, dim)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            # a head as transformers writes it: the weight cast, then used
            return torch.nn.functional.linear(self.emb(ids), self.emb.weight)

    model = Tied()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(m: torch.nn.Module) -> None:
        ids = torch.randint(0, vocab, (4, 16))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = m(ids)
        logits.float().logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    p = profile.capture_step(model, step, micro_batch=4, optimizers=[optimizer])
    seq = sizes_in_order(p)
    # the weight; each step the head's gradient and the embedding's dense
    # one, added into the head's (kept as .grad) or into a new sum
    per_step = 2 if autocast else 3
    assert seq.count(table) == 1 + per_step * profile.STEPS
    live, most, alive = {}, 0, 0
    for e in p["events"]:
        if e >= 0:
            live[len(live)] = p["sizes"][e]
            alive += p["sizes"][e] == table
            most = max(most, alive)
        else:
            alive -= live[-e - 1] == table
    # the weight and the two gradients, and a new sum beside them
    assert most == 1 + per_step


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoints_recomputation_makes_its_sums_anew_as_cuda_does(reentrant: bool) -> None:
    # A checkpointed block's forward runs again inside backward, under grad
    # mode; a sum of two fresh same-sized tensors there (a rotary
    # embedding's q * cos + rotate_half(q) * sin) is a new tensor as in the
    # forward, not autograd's accumulation of two gradients, which CUDA
    # makes in place (the H200's recorded Llama-3-8B run with
    # checkpointing: the capture's replay was 4.2 GiB short while it merged
    # them).
    b, w = 8, 384
    act = b * w * 4

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(w, w)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            z = (y * 2.0) + (y * 3.0)
            return z * z  # keeps z: backward recomputes it

    def allocations(checkpointed: bool) -> int:
        model = Block()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(m: torch.nn.Module) -> None:
            x = torch.randn(b, w, requires_grad=True)
            if checkpointed:
                y = torch.utils.checkpoint.checkpoint(m, x, use_reentrant=reentrant)
            else:
                y = m(x)
            # z's two gradients meet in backward: added in place either way
            y.sum().backward()
            optimizer.step()
            optimizer.zero_grad()

        p = profile.capture_step(model, step, micro_batch=b, steps=2, optimizers=[optimizer])
        return sizes_in_order(p).count(act)

    # the recomputation's: the linear's output, both products and their sum
    # (a non-reentrant checkpoint stops there, at the last tensor backward
    # reads; a reentrant one runs the whole function again, z * z too)
    recomputed = 5 if reentrant else 4
    assert allocations(True) - allocations(False) == recomputed * 2


def test_a_capture_records_the_versions_of_the_modelling_libraries_it_ran() -> None:
    cfg = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 16, "vocab_size": 64}
    p = profile.capture("transformers:GPT2LMHeadModel", cfg, batch=2, precision="fp32",
                        optimizer="adamw", seq_len=16)
    assert p["capture"]["libraries"]["transformers"] == transformers.__version__


def test_an_auto_class_builds_the_model_its_configs_model_type_names() -> None:
    # Any causal LM transformers knows, without a class named for it: the
    # config's model_type picks OLMo 2 here (a family vramfit has no analytic
    # description of), whose logits the capture sees.
    b, seq, vocab = 2, 16, 500
    cfg = {"model_type": "olmo2", "num_hidden_layers": 1, "hidden_size": 64,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": vocab}
    p = profile.capture("transformers:AutoModelForCausalLM", cfg, batch=b, precision="fp32",
                        optimizer="adamw", seq_len=seq)
    assert b * seq * vocab * 4 in sizes_in_order(p)
    with pytest.raises(profile.CaptureError, match="model_type"):
        profile.capture("transformers:AutoModelForCausalLM", {"hidden_size": 64}, batch=b,
                        precision="fp32", optimizer="adamw", seq_len=seq)


def transients(p: dict) -> list:
    """Sizes of the allocations freed right after they are made."""
    ev, sizes, out, count = p["events"], p["sizes"], [], 0
    for here, after in zip(ev, ev[1:]):
        if here >= 0:
            if after == -count - 1:
                out.append(sizes[here])
            count += 1
    return out


def test_softmax_backward_and_the_safe_softmax_take_cudas_temporaries() -> None:
    # CUDA's softmax backward multiplies the gradient by the output into a
    # temporary of its size; the math attention's softmax (_safe_softmax)
    # finds fully masked rows through a boolean of the scores' shape. The CPU
    # kernels take neither; the capture adds both, each given back at once.
    b, c = 8, 3000
    model = torch.nn.Linear(32, c)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(m: torch.nn.Module) -> None:
        logits = m(torch.randn(b, 32))
        p1 = torch.softmax(logits, -1)
        p2 = torch.ops.aten._safe_softmax.default(logits, -1)
        (p1[:, 0].sum() + p2[:, 1].sum()).backward()
        optimizer.step()
        optimizer.zero_grad()

    p = profile.capture_step(model, step, micro_batch=b, optimizers=[optimizer])
    seen = transients(p)
    # each step: two softmax backwards' temporaries, one boolean
    assert seen.count(b * c * 4) == 2 * profile.STEPS
    assert seen.count(b * c) == profile.STEPS
