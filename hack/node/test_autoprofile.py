"""Tests of the chart demo's automatically profiled job: train.py's OPT and
its profile phase (VRAMFIT_PHASE=profile), the job nodecfg.py makes, and
report.py's watch of the run and its checks. Run: python3 -m pytest -q hack/node"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import nodecfg  # noqa: E402
import report  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "hack/node/train.py"


# --- the job -----------------------------------------------------------------------


def test_the_chart_demo_has_one_job_profiled_automatically():
    jobs = nodecfg.demo_jobs(str(REPO), "/opt/torch/.venv/bin/python", [], 30, gpu=True,
                             image="localhost/vramfit/train-venv:dev", namespaces=["team-a", "team-b"])
    auto = [j for j in jobs if "auto" in j["spec"]["model"]]
    assert [j["metadata"]["name"] for j in auto] == [nodecfg.AUTO_JOB]
    spec = auto[0]["spec"]
    # Nothing but auto describes the model (the CRD wants exactly one way), no memory.request.
    assert spec["model"] == {"auto": {}, "precision": "amp-bf16", "optimizer": "adamw"}
    assert "request" not in (spec.get("memory") or {})
    cmd = spec["template"]["spec"]["containers"][0]["command"]
    assert cmd[:2] == ["/opt/torch/.venv/bin/python", nodecfg.IMAGE_TRAIN_PATH]
    assert cmd[cmd.index("--model") + 1] == "opt" and cmd[cmd.index("--seq-len") + 1] == str(nodecfg.AUTO_SEQ_LEN)
    assert spec["batch"]["global"] % spec["batch"]["micro"] == 0
    # Bob's first job stays the attack's target (attacks.py --other-job).
    assert next(j for j in jobs if j["metadata"]["namespace"] == "team-b")["metadata"]["name"] == "gpt2-small"
    # Not in the host-process demo, nor without a GPU.
    for other in (nodecfg.demo_jobs(str(REPO), "/p", [], 30, gpu=True),
                  nodecfg.demo_jobs(str(REPO), "/p", [], 3, gpu=False, image="i", namespaces=["team-a", "team-b"])):
        assert all("auto" not in j["spec"]["model"] for j in other)


# --- train.py ------------------------------------------------------------------------


def run_train(tmp_path, args, phase=None):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMFIT_")}
    env.update(PYTHONPATH=str(REPO / "python"), VRAMFIT_TERMINATION_LOG=str(tmp_path / "termination-log"),
               OMP_NUM_THREADS="1")
    if phase:
        # What the controller's profiling pod gets (src/controller/autoprofile.rs).
        env.update(VRAMFIT_PHASE=phase, VRAMFIT_MICRO_BATCH="2", VRAMFIT_GRAD_ACCUM="2", VRAMFIT_GLOBAL_BATCH="4",
                   NVIDIA_VISIBLE_DEVICES="void")
    (tmp_path / "termination-log").write_text("")
    proc = subprocess.run([sys.executable, str(TRAIN)] + args, env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    events = report.parse_events(proc.stdout)
    return proc, events


def decode(stdout):
    sys.path.insert(0, str(REPO / "python"))
    from vramfit.profile import decode_profile_line

    [line] = [ln for ln in stdout.splitlines() if ln.startswith("vramfit-profile: ")]
    return decode_profile_line(line)


@pytest.mark.parametrize("model, api", [("opt", "vramfit.Step"), ("gpt2", "capture_step")])
def test_train_py_in_the_profile_phase_prints_the_profile_and_exits_0(tmp_path, model, api):
    # No --device: the pod's command says cuda; the profile phase uses none.
    proc, events = run_train(tmp_path, ["--model", model, "--tiny", "--seq-len", "16", "--steps", "5"], phase="profile")
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = report.first(events, "start")
    assert start["phase"] == "profile" and start["micro"] == 2 and start["enforcement"] == "none"
    assert report.first(events, "profile-capture")["api"] == api
    assert not report.first(events, "step") and not report.first(events, "done")
    prof = decode(proc.stdout)
    assert prof["format"] == "vramfit.profile/v1" and prof["microBatch"] == 2 and prof["events"]
    assert "vramfit: captured" in proc.stderr


def test_train_py_trains_opt_through_vramfit_step(tmp_path):
    proc, events = run_train(tmp_path, ["--model", "opt", "--device", "cpu", "--tiny", "--seq-len", "16", "--steps", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report.first(events, "start")["phase"] == "train"
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    assert report.first(events, "done") and "vramfit-profile" not in proc.stdout


# --- report.py: the watch ------------------------------------------------------------------

TJ = {"apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
      "metadata": {"name": "auto-opt", "namespace": "team-b", "uid": "u-job"},
      "spec": {"model": {"auto": {}, "precision": "amp-bf16"}}, "status": {"phase": "Profiling"}}
PROFILE = {"format": "vramfit.profile/v1", "microBatch": 4, "gradAccum": 2, "sizes": [512, 1024], "events": [0, 1, -1],
           "capture": {"peakLiveBytes": 3 << 30, "seconds": 3.5, "peakHostBytes": 800 << 20, "torch": "2.11.0"}}


def profile_pod(phase="Running", exit_code=None, **env_over):
    env = {"VRAMFIT_PHASE": "profile", "VRAMFIT_MICRO_BATCH": "4", "VRAMFIT_GRAD_ACCUM": "16",
           "VRAMFIT_GLOBAL_BATCH": "64", "NVIDIA_VISIBLE_DEVICES": "void"}
    env.update(env_over)
    status = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": exit_code, "message": ""}}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "auto-opt-profile-g1", "namespace": "team-b", "uid": "u-pod",
                         "labels": {report.PROFILE_OF: "auto-opt"}, "annotations": {}},
            "spec": {"nodeName": "vm", "containers": [{"name": "train", "env": [
                {"name": k, "value": v} for k, v in env.items() if v is not None] + [{"name": "OTHER", "value": "x"}]}]},
            "status": status}


def profile_map(owner="auto-opt", uid="u-job"):
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "vramfit-profile-0123456789abcdef", "namespace": "team-b",
                         "labels": {report.PROFILE_OF: "auto-opt", "vramfit.dev/kind": "allocation-profile",
                                    "vramfit.dev/profile-key": "0123456789abcdef"},
                         "ownerReferences": [{"apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob", "name": owner,
                                              "uid": uid, "controller": True}]},
            "data": {"profile.json": json.dumps(PROFILE)}}


def test_json_stream_reads_kubectls_indented_and_compact_documents():
    stream = report.JsonStream()
    text = ("No resources found\n" + json.dumps({"type": "ADDED", "object": TJ}, indent=4) + "\n"
            + json.dumps({"type": "DELETED", "object": profile_pod()}) + "\n")
    docs = [d for line in text.splitlines(keepends=True) for d in stream.feed(line)]
    assert [d["type"] for d in docs] == ["ADDED", "DELETED"]
    assert docs[0]["object"]["metadata"]["name"] == "auto-opt"


def test_watch_records_keep_what_the_checks_read():
    job = report.watch_record({"type": "MODIFIED", "object": TJ}, 5)
    assert (job["kind"], job["phase"], job["auto"], job["ms"], job["type"]) == ("TrainingJob", "Profiling", True, 5, "MODIFIED")
    pod = report.watch_record({"type": "MODIFIED", "object": profile_pod("Succeeded", 0)}, 6)
    assert pod["profileOf"] == "auto-opt" and pod["nodeName"] == "vm" and pod["exitCode"] == 0
    assert pod["env"]["NVIDIA_VISIBLE_DEVICES"] == "void" and "OTHER" not in pod["env"]
    assert pod["cdiAnnotations"] == [] and pod["requests"] is False
    cm = report.watch_record({"type": "ADDED", "object": profile_map()}, 7)
    assert cm["owners"] == [{"kind": "TrainingJob", "name": "auto-opt", "uid": "u-job", "controller": True}]
    assert cm["profile"]["events"] == 3 and cm["profile"]["format"] == "vramfit.profile/v1"
    assert "data" not in cm  # the profile's figures only
    assert report.watch_record({"type": "ADDED", "object": {"kind": "Event"}}, 8) is None


def test_watch_follows_kubectl_and_stops(tmp_path):
    # A stand-in kubectl: the documents of its resource, then it waits as a watch does.
    docs = {"trainingjobs.vramfit.dev": [json.dumps({"type": "ADDED", "object": TJ}, indent=4)],
            "pods": [json.dumps({"type": "ADDED", "object": profile_pod()})],
            "configmaps": [json.dumps({"type": "ADDED", "object": profile_map()})]}
    for resource, texts in docs.items():
        (tmp_path / resource).write_text("\n".join(texts) + "\n")
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$@" >>{tmp_path}/args\ncat {tmp_path}/"$2"\nexec sleep 30\n')
    kubectl.chmod(0o755)
    out = tmp_path / "watch.jsonl"
    assert report.main(["watch", "--out", str(out), "--kubectl", str(kubectl), "--seconds", "1.5"]) == 0
    records = report.read_watch(str(out))
    assert any(r["type"] == "WATCHING" for r in records)
    # Pods twice: the stand-in answers both pod watches (profiling pods, training pods) alike.
    assert sorted(r["kind"] for r in records if r.get("kind")) == ["ConfigMap", "Pod", "Pod", "TrainingJob"]
    args = (tmp_path / "args").read_text()
    assert "pods -A --watch --output-watch-events -o json -l vramfit.dev/profile-of" in args
    assert "pods -A --watch --output-watch-events -o json -l vramfit.dev/training-job" in args
    assert "trainingjobs.vramfit.dev -A --watch --output-watch-events -o json\n" in args


# --- report.py: the checks --------------------------------------------------------------


def run_records(pod_env=None, cm_owner="auto-opt", phases=("Pending", "Profiling", "Placed", "Running", "Succeeded"),
                deleted=True):
    """What the watch of a good run records, apply at 1000 ms."""
    recs = []
    t = 1000
    for ph in phases:
        t += 1000
        obj = json.loads(json.dumps(TJ))
        obj["status"] = {"phase": ph}
        if ph in ("Placed", "Running", "Succeeded"):
            obj["status"].update(gpu="0", predictionSource="profile")
        recs.append(report.watch_record({"type": "MODIFIED", "object": obj}, t))
        if ph == "Profiling":
            pod_args = pod_env or {}
            recs.append(report.watch_record({"type": "ADDED", "object": profile_pod("Pending", **pod_args)}, t + 100))
            recs.append(report.watch_record({"type": "MODIFIED", "object": profile_pod("Succeeded", 0, **pod_args)}, t + 500))
            recs.append(report.watch_record({"type": "ADDED", "object": profile_map(cm_owner)}, t + 600))
            if deleted:
                recs.append(report.watch_record({"type": "DELETED", "object": profile_pod("Succeeded", 0, **pod_args)}, t + 700))
    return recs


def auto_summary(tmp_path, records, status=None, gpu=True, with_log=True):
    st = {"phase": "Succeeded", "attempt": 1, "gpu": "0", "predictionSource": "profile",
          "predictedBytes": 5 << 30, "budgetBytes": int(5.25 * 2**30), "measuredPeakBytes": int(5.03 * 2**30),
          "history": [{"attempt": 1, "microBatch": 4, "outcome": "Succeeded"}]}
    st.update(status or {})
    jobs = {"items": [
        {"metadata": {"name": "auto-opt", "namespace": "team-b", "uid": "u-job"}, "spec": TJ["spec"], "status": st},
        {"metadata": {"name": "gpt2-small", "namespace": "team-b", "uid": "u2"}, "spec": {"model": {"huggingFace": {}}},
         "status": {"phase": "Succeeded", "attempt": 1, "gpu": "0", "predictionSource": "model"}},
    ]}
    if with_log:
        d = tmp_path / "team-b_auto-opt-profile-g1_u-pod" / "train"
        d.mkdir(parents=True, exist_ok=True)
        (d / "0.log").write_text(
            "2026-12-01T08:00:00.0Z stdout F vramfit-train: "
            + json.dumps({"event": "start", "phase": "profile", "devices": [], "unixMs": 1})
            + "\n2026-12-01T08:00:01.0Z stdout P vramfit-profile: H4sIAAAA\n2026-12-01T08:00:01.0Z stdout F AAAA\n")
    gpt2 = [report.watch_record({"type": "MODIFIED", "object": {
        "kind": "TrainingJob", "metadata": {"name": "gpt2-small", "namespace": "team-b"},
        "status": {"phase": ph, **({"gpu": "0"} if ph != "Pending" else {})}}}, ms)
        for ph, ms in (("Pending", 1100), ("Placed", 1500), ("Succeeded", 9000))]
    return report.summarize(jobs, {"items": []}, {"status": {}}, apply_ms=1000, logs_root=tmp_path,
                            watch=records + gpt2)


PROFILED = "auto-opt: phase Profiling, its pod run once without a GPU, then placed"
STORED = "auto-opt: the captured profile in a ConfigMap vramfit-profile-<key> owned by the job"
SOURCE = "auto-opt: predicted from its profile (status.predictionSource profile)"
BUDGET = "auto-opt: trained within the budget predicted from its profile (measured peak, no OOM)"


def results(summary, gpu=True):
    return {n: (ok, d) for n, ok, d in report.checks(summary, gpu=gpu) if n.startswith("auto-opt: ")
            and "CDI" not in n}


def test_a_job_profiled_automatically_passes_its_checks(tmp_path):
    s = auto_summary(tmp_path, run_records())
    r = results(s)
    assert set(r) == {PROFILED, STORED, SOURCE, BUDGET}
    for name, (ok, detail) in r.items():
        assert ok, (name, detail)
    assert "Pending -> Profiling -> Placed -> Running -> Succeeded" in r[PROFILED][1]
    assert "NVIDIA_VISIBLE_DEVICES=void" in r[PROFILED][1] and "profile line in its log" in r[PROFILED][1]
    assert "vramfit-profile-0123456789abcdef" in r[STORED][1] and "3 events" in r[STORED][1]
    job = next(j for j in s["jobs"] if j["name"] == "auto-opt")
    # Profiling seen at 3000 ms, Placed at 4000 ms; the apply at 1000 ms.
    assert job["times"]["applyToPlacementMs"] == 3000 and job["times"]["profilingMs"] == 1000
    [line] = report.placement_lines(s)
    assert line.startswith("TIME: auto-opt (model.auto): apply to placement 3.0 s, of which 1.0 s in phase Profiling")
    assert "the other jobs: apply to placement 0.5 s (gpt2-small)" in line
    # Without a GPU nothing measures the peak: a skip, the rest judged.
    r = results(s, gpu=False)
    assert r[BUDGET][0] is None and r[PROFILED][0] and r[STORED][0] and r[SOURCE][0]


def test_a_job_profiled_automatically_fails_what_did_not_happen(tmp_path):
    def failing(**kw):
        status = kw.pop("status", None)
        s = auto_summary(tmp_path, run_records(**kw), status=status)
        return {n for n, (ok, _) in results(s).items() if not ok}

    assert failing(phases=("Pending", "Placed", "Running", "Succeeded")) == {PROFILED, STORED}
    assert failing(pod_env={"NVIDIA_VISIBLE_DEVICES": None}) == {PROFILED}
    assert failing(pod_env={"VRAMFIT_PHASE": None}) == {PROFILED}
    assert failing(deleted=False) == {PROFILED}
    assert failing(cm_owner="someone-else") == {STORED}
    assert failing(status={"predictionSource": "model"}) == {SOURCE}
    assert failing(status={"measuredPeakBytes": 6 << 30}) == {BUDGET}
    assert failing(status={"measuredPeakBytes": None}) == {BUDGET}
    assert failing(status={"absorbedOoms": [{"fromMicro": 4, "toMicro": 2}]}) == {BUDGET}
    assert failing(status={"attempt": 2, "history": [{"attempt": 1, "outcome": "OutOfMemory"},
                                                     {"attempt": 2, "outcome": "Succeeded"}]}) == {BUDGET}
    # The profiling pod's process saw a GPU's device node.
    d = tmp_path / "team-b_auto-opt-profile-g1_u-pod" / "train" / "0.log"
    d.parent.mkdir(parents=True, exist_ok=True)
    d.write_text("x stdout F vramfit-train: " + json.dumps({"event": "start", "devices": ["nvidia0", "nvidiactl"]}) + "\n")
    s = auto_summary(tmp_path, run_records(), with_log=False)
    assert not results(s)[PROFILED][0]
    # No watch at all (report.py without --watch): judged failed, not skipped.
    s = report.summarize({"items": [{"metadata": {"name": "auto-opt"}, "spec": TJ["spec"], "status": {"phase": "Succeeded"}}]},
                         {"items": []}, {"status": {}}, apply_ms=0, logs_root=tmp_path)
    r = results(s)
    assert r[PROFILED][0] is False and r[STORED][0] is False


def test_watch_jobs_orders_phases_and_finds_the_placement():
    recs = run_records()
    seen = report.watch_jobs(list(reversed(recs)))["team-b/auto-opt"]
    assert [p["phase"] for p in seen["phases"]] == ["Pending", "Profiling", "Placed", "Running", "Succeeded"]
    assert seen["placedMs"] == 4000 and seen["profilingMs"] == 1000
    pod = seen["profilePods"]["auto-opt-profile-g1"]
    assert pod["phases"] == ["Pending", "Succeeded"] and pod["deletedMs"] == 3700 and pod["nodeName"] == "vm"
    assert list(seen["profileMaps"]) == ["vramfit-profile-0123456789abcdef"]
