"""Profile capture on the CPU under FakeTensorMode (vramfit.profile)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from vramfit import profile  # noqa: E402

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


def test_fused_attention_output_is_transposed_back_without_a_copy() -> None:
    q, k, v = (torch.zeros(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    with profile._function_mode():
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    # laid out (batch, seq, heads, dim) as the CUDA kernels write it
    assert y.shape == (2, 4, 16, 8) and y.transpose(1, 2).is_contiguous()


def test_low_precision_softmax_into_fp32_makes_no_upcast_copy() -> None:
    b, c = 8, 3000
    amp = run("profile_models:mlp", config={"classes": c}, batch=b, precision="amp-bf16")
    seq = sizes_in_order(amp)
    steps = amp["capture"]["steps"]
    # fp32: log-softmax and the nll gradient; bf16: the logits and their
    # gradient, written by the fused backward; no fp32 copy of the logits
    assert seq.count(b * c * 4) == 2 * steps
    assert seq.count(b * c * 2) == 2 * steps
