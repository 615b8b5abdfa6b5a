"""CPU test of alloc_checks.py's orchestration: every case's process is
replaced by a function of its arguments, so what is run with which batch and
budget, and the summary, are checked without a GPU.

    python3 -m pytest -q scripts/gpu/test_alloc_checks.py
"""

import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alloc_checks  # noqa: E402

MIB = alloc_checks.MIB
# Bytes a model's vramfit-policy runs report in vramfit.planRaisedBytes.
RAISED = {}


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    for flag in ("--alloc", "--model", "--barrier", "--name"):
        p.add_argument(flag, default="")
    for flag in ("--budget", "--steps", "--warmup", "--keep-mib", "--parties", "--trace-steps", "--batch"):
        p.add_argument(flag, type=int, default=0)
    p.add_argument("--deterministic", action="store_true")
    return p.parse_args(argv)


def fake_result(argv):
    """What a worker would report: native reserves 100 MiB per batch
    element, the vramfit policy 15% less; an over-budget run fails in
    step 0, a run that keeps memory fails in step 3."""
    a = parse(argv)
    if a.mode == "worker-correctness":
        return {"rc": 0, "checks": {"memory_allocated counts a 64 MiB tensor": {"ok": True}},
                "recordStream": {"ok": True, "afterFree": {"heldBackFrees": 1}}}
    if a.mode == "worker-record-stream":
        return {"rc": 0, "recordStream": {"ok": True}}
    if a.mode == "worker-selftest":
        return {"rc": 0, "ok": True, "env": "yes"}
    need = 100 * MIB * a.batch * (1.0 if a.alloc in ("native", "pytorch") else 0.85)
    if a.budget and (need > a.budget or a.keep_mib):
        return {"rc": 42, "oom": {"step": 3 if a.keep_mib else 0, "budget": True, "type": "OutOfMemoryError",
                                  "message": "CUDA out of memory: vramfit budget exceeded"}}
    return {"rc": 0, "model": a.model, "batch": a.batch, "alloc": a.alloc, "stepMsMedian": 100.0 + a.batch / 100,
            "stepMs": [100.0] * a.steps, "losses": [1.0] * a.steps, "maxReserved": int(need),
            "maxAllocated": int(need * 0.95),
            "reservedEnd": int(need), "smiEndMib": int(need / MIB) + 600,
            "deviceCallsPerStep": [5] + [0] * (a.steps - 1),
            "vramfit": ({"vramfit.planActive": True, "vramfit.planRaisedBytes": RAISED.get(a.model, 0)}
                        if a.alloc == "vramfit" else None)}


def orchestrate(tmp_path, monkeypatch, capsys, trace=False):
    started = []
    pid = iter(range(1000, 100000))

    class FakeSampler:
        mode = "fake"
        peaks = {}  # filled by finish()

        def start(self):
            pass

        def stop(self):
            pass

    def start(self, argv, extra=None):
        started.append(argv)
        return argv

    def finish(self, proc, label, timeout):
        r = fake_result(proc)
        r["pid"] = next(pid)
        if "maxReserved" in r:
            # nvidia-smi: reserved plus a 600 MiB context
            FakeSampler.peaks[r["pid"]] = r["maxReserved"] // MIB + 600
        return r

    monkeypatch.setattr(alloc_checks, "SmiSampler", FakeSampler)
    monkeypatch.setattr(alloc_checks.Runner, "start", start)
    monkeypatch.setattr(alloc_checks.Runner, "finish", finish)
    args = argparse.Namespace(out_dir=str(tmp_path), lib="lib.so", agent=None, quick=False, no_zygote=True,
                              trace=trace)
    rc = alloc_checks.orchestrate(args)
    return rc, [parse(a) for a in started], capsys.readouterr().out


@pytest.fixture
def orchestrated(tmp_path, monkeypatch, capsys):
    return orchestrate(tmp_path, monkeypatch, capsys)


def test_timed_runs_use_the_sizes_that_fill_the_chip(orchestrated):
    _, runs, _ = orchestrated
    by_model = {}
    for r in runs:
        if r.mode == "worker-train" and r.name == f"{r.model}-{r.alloc}":
            by_model.setdefault(r.model, set()).add(r.batch)
    assert by_model == {m: {b} for m, b in alloc_checks.BATCHES.items()}
    assert by_model["gpt2"] == {32} and by_model["llama"] == {16} and by_model["bert"] == {128}
    assert by_model["vit"] == {256} and by_model["resnet50"] == {128}


def test_budget_and_pair_cases_keep_the_small_gpt2_and_its_budgets(orchestrated):
    _, runs, _ = orchestrated
    small = [r for r in runs if r.mode == "worker-train" and r.name not in {f"{m}-{a}" for m in alloc_checks.BATCHES
                                                                           for a in ("native", "pytorch", "vramfit")}]
    assert small and all(r.model == "gpt2" and r.batch == alloc_checks.SMALL_GPT2_BATCH for r in small)
    need = 100 * MIB * alloc_checks.SMALL_GPT2_BATCH
    budget = alloc_checks.round_up(int(need * 1.15) + 256 * MIB)
    oom = [r for r in small if r.steps == 2]
    assert [r.budget for r in oom] == [alloc_checks.round_up(int(need * 0.4))] * 2
    pair_a = next(r for r in small if r.name == "a")
    pair_b = next(r for r in small if r.name == "b")
    assert pair_a.budget == budget and pair_b.budget == alloc_checks.round_up(need + 2 * alloc_checks.GIB)
    # The timed runs' budgets derive from their own (big) native run.
    big = next(r for r in runs if r.name == "gpt2-vramfit")
    assert big.budget == alloc_checks.round_up(int(100 * MIB * 32 * 1.15) + 256 * MIB)


def test_five_rounds_at_most_and_the_summary_names_each_batch(orchestrated):
    rc, runs, out = orchestrated
    natives = [r for r in runs if r.name == "gpt2-native"]
    vramfit = [r for r in runs if r.name == "gpt2-vramfit"]
    pytorch = [r for r in runs if r.name == "gpt2-pytorch"]
    assert (len(natives), len(vramfit), len(pytorch)) == (5, 5, 3)
    for label in ("32x1024", "16x2048", "128x512", "resnet50  128 ", "vit       256 "):
        assert label in out, label
    assert "budget below the need and the pair: gpt2 8x1024" in out
    assert "PASS  pair: its losses equal the solo run's" in out
    assert "PASS  budget below need[vramfit] fails in step 0 with the budget OOM" in out
    assert "PASS  train[llama] vramfit: no plan raised the reserved peak" in out
    # native's allocated peak (95% of its reserved here) is the floor
    assert "(allocated peak 1292, native's 1520)" in out
    assert rc == 0, out


def test_a_plan_that_raised_the_peak_fails_its_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(RAISED, "llama", 96 * MIB)
    rc, _, out = orchestrate(tmp_path, monkeypatch, capsys)
    assert "FAIL  train[llama] vramfit: no plan raised the reserved peak  [planRaisedBytes 96 MiB" in out
    assert "PASS  train[gpt2] vramfit: no plan raised the reserved peak" in out
    assert "raised 96 MiB;" in out
    assert rc == 1


def test_with_trace_every_models_first_native_run_records_steps(tmp_path, monkeypatch, capsys):
    rc, runs, _ = orchestrate(tmp_path, monkeypatch, capsys, trace=True)
    traced = sorted(r.model for r in runs if r.mode == "worker-train" and r.trace_steps)
    assert traced == sorted(alloc_checks.BATCHES)
