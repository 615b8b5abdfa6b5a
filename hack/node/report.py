#!/usr/bin/env python3
"""Summarizes a GPU node demo run (hack/gpunode.sh demo): per job its phase,
attempts, prediction, budget and measured peak; the times from `kubectl apply`
to each job's first training step and from each OOM to the next attempt's
first step; the GpuNode's per-process measurements and OOM reports; and
checks of the outcome. Writes everything as one JSON document (--out) and a
short text summary on stdout; exits 1 when a check fails.

Times come from the training program's `vramfit-train:` events in the pod
logs (the kubelet's files under /var/log/pods), in milliseconds of the same
clock as --apply-ms.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

MARK = "vramfit-train: "
#: The capability a privileged container has and a default one lacks.
CAP_SYS_ADMIN = 21
#: What every budget error of vramfit's allocator says (python/vramfit/allocator.py).
BUDGET_MARKER = "vramfit budget exceeded"


def parse_events(text: str) -> List[dict]:
    """The training program's events in a CRI log file (`<time> <stream> <tag> <line>`)."""
    events = []
    for line in text.splitlines():
        at = line.find(MARK)
        if at < 0:
            continue
        try:
            events.append(json.loads(line[at + len(MARK):]))
        except ValueError:
            continue
    return events


def pod_events(logs_root: Path, namespace: str, pod: str, uid: str) -> List[dict]:
    folder = logs_root / f"{namespace}_{pod}_{uid}"
    events: List[dict] = []
    if folder.is_dir():
        for f in sorted(folder.glob("*/*.log")):
            events.extend(parse_events(f.read_text(errors="replace")))
    return events


def kept_pod_events(logs_root: Path, namespace: str, pod: str) -> Optional[List[dict]]:
    """The events of a pod that is gone (the controller deletes an attempt's
    pod when it starts the next), from the copy of its log folder the demo
    kept; None when there is none."""
    folders = sorted(logs_root.glob(f"{namespace}_{pod}_*"))
    if not folders:
        return None
    events: List[dict] = []
    for folder in folders:
        for f in sorted(folder.glob("*/*.log")):
            events.extend(parse_events(f.read_text(errors="replace")))
    return events


def oom_event_ms(k8s_events: Optional[dict], job: str) -> Dict[int, int]:
    """attempt -> time of the controller's OutOfMemory event for it
    ("attempt N at micro-batch ..."), in ms (the event's second resolution)."""
    out: Dict[int, int] = {}
    for e in (k8s_events or {}).get("items", []):
        obj = e.get("involvedObject") or {}
        if obj.get("kind") != "TrainingJob" or obj.get("name") != job or e.get("reason") != "OutOfMemory":
            continue
        m = re.match(r"attempt (\d+) ", e.get("message") or "")
        t = rfc3339_ms(e.get("firstTimestamp") or e.get("eventTime") or e.get("lastTimestamp"))
        if m and t:
            out.setdefault(int(m.group(1)), t)
    return out


def rfc3339_ms(value: Optional[str]) -> Optional[int]:
    if not value:
        return None
    return int(dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


def first(events: List[dict], kind: str, **match) -> Optional[dict]:
    for e in events:
        if e.get("event") == kind and all(e.get(k) == v for k, v in match.items()):
            return e
    return None


def pod_privileged(pod: dict) -> bool:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if ((c.get("securityContext") or {}).get("privileged")) is True:
            return True
    return False


def shapes_seen(samples: List[dict]) -> Dict[str, dict]:
    """Per pod, the batch shape its process published (the helper's
    shape-<pid>.json, `processes[].shape` in the GpuNode) as last seen, with
    the most absorbed OOMs any sample listed."""
    seen: Dict[str, dict] = {}
    for node in samples:
        for g in (node.get("status") or {}).get("gpus") or []:
            for proc in g.get("processes") or []:
                shape = proc.get("shape")
                pod = proc.get("podName")
                if not shape or not pod:
                    continue
                e = seen.setdefault(pod, {"samples": 0, "absorbedOoms": []})
                e["samples"] += 1
                e["microBatch"], e["gradAccum"] = shape.get("microBatch"), shape.get("gradAccum")
                if len(shape.get("absorbedOoms") or []) > len(e["absorbedOoms"]):
                    e["absorbedOoms"] = shape["absorbedOoms"]
    return seen


def allocator_seen(samples: List[dict]) -> Dict[str, dict]:
    """Per pod, the allocator's figures the agent put in the GpuNode
    (`status.gpus[].processes[].allocator`) over the run's samples: the
    largest peaks and OOM count seen, the budget and policy, and how many
    samples had them."""
    seen: Dict[str, dict] = {}
    for node in samples:
        for g in (node.get("status") or {}).get("gpus") or []:
            for proc in g.get("processes") or []:
                a = proc.get("allocator")
                pod = proc.get("podName")
                if not a or not pod:
                    continue
                e = seen.setdefault(pod, {"samples": 0, "gpu": g.get("index"), "policy": a.get("policy"),
                                          "budgetBytes": a.get("budgetBytes"), "peakAllocatedBytes": 0,
                                          "peakReservedBytes": 0, "numOoms": 0})
                e["samples"] += 1
                for k in ("peakAllocatedBytes", "peakReservedBytes", "numOoms"):
                    e[k] = max(e[k], a.get(k) or 0)
    return seen


def over_budget_seen(samples: List[dict], tolerance: float = 0.05) -> Dict[str, dict]:
    """Per pod, how long the GPU memory of its processes stayed over its
    budget (plus the watchdog's tolerance) in the samples: the heartbeats of
    the first and last samples over it, and the most it used. The budget is
    the allocator's figure for the pod where it reported one, else the one
    in the agent's OOM report for it."""
    budgets: Dict[str, int] = {}
    for node in samples:
        for r in (node.get("status") or {}).get("oomReports") or []:
            if r.get("podName") and r.get("budgetBytes"):
                budgets[r["podName"]] = r["budgetBytes"]
    seen: Dict[str, dict] = {}
    for node in samples:
        st = node.get("status") or {}
        at = rfc3339_ms(st.get("heartbeat"))
        used: Dict[str, int] = {}
        for g in st.get("gpus") or []:
            for proc in g.get("processes") or []:
                pod = proc.get("podName")
                if pod:
                    used[pod] = used.get(pod, 0) + (proc.get("usedBytes") or 0)
                    a = proc.get("allocator") or {}
                    if a.get("budgetBytes"):
                        budgets.setdefault(pod, a["budgetBytes"])
        for pod, u in used.items():
            budget = budgets.get(pod)
            e = seen.setdefault(pod, {"maxUsedBytes": 0, "budgetBytes": budget, "firstOverMs": None, "lastOverMs": None})
            e["maxUsedBytes"] = max(e["maxUsedBytes"], u)
            e["budgetBytes"] = budget or e["budgetBytes"]
            if budget and at and u > budget * (1 + tolerance):
                e["firstOverMs"] = e["firstOverMs"] or at
                e["lastOverMs"] = at
    for e in seen.values():
        e["overForMs"] = (e["lastOverMs"] - e["firstOverMs"]) if e["firstOverMs"] else 0
    return seen


def cdi_nodes(spec: Optional[dict]) -> Dict[str, List[str]]:
    """CDI device name -> the names under /dev its own edits add."""
    out: Dict[str, List[str]] = {}
    for d in (spec or {}).get("devices") or []:
        nodes = ((d.get("containerEdits") or {}).get("deviceNodes")) or []
        out[d["name"]] = [n["path"].rsplit("/", 1)[-1] for n in nodes]
    return out


def summarize(jobs: dict, pods: dict, gpu_node: dict, apply_ms: int, logs_root: Path,
              samples: Optional[List[dict]] = None, cdi: Optional[dict] = None,
              k8s_events: Optional[dict] = None) -> dict:
    pods_by_name = {p["metadata"]["name"]: p for p in pods.get("items", [])}
    out_jobs = []
    for j in sorted(jobs.get("items", []), key=lambda j: j["metadata"]["name"]):
        name = j["metadata"]["name"]
        st = j.get("status") or {}
        attempts = []
        ooms_at = oom_event_ms(k8s_events, name)
        for n in range(1, max(st.get("attempt") or 0, 1) + 1):
            pod = pods_by_name.get(f"{name}-a{n}")
            if pod is None:
                kept = kept_pod_events(logs_root, j["metadata"].get("namespace") or "ml", f"{name}-a{n}")
                if kept is None:
                    continue
                # Deleted by the controller; its log survived in the demo's copy.
                pod = {"metadata": {"name": f"{name}-a{n}"}, "deleted": True}
                events = kept
            else:
                events = pod_events(logs_root, pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"])
            term = None
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                term = (cs.get("state") or {}).get("terminated") or term
            step1 = first(events, "step", step=1)
            oom = first(events, "oom")
            attempts.append(
                {
                    "attempt": n,
                    "pod": pod["metadata"]["name"],
                    "phase": (pod.get("status") or {}).get("phase"),
                    "podDeleted": bool(pod.get("deleted")),
                    "privileged": pod_privileged(pod),
                    "exitCode": term.get("exitCode") if term else None,
                    "reason": term.get("reason") if term else None,
                    "finishedMs": rfc3339_ms(term.get("finishedAt")) if term else None,
                    "startEvent": first(events, "start"),
                    "firstStepMs": step1["unixMs"] if step1 else None,
                    "oomMs": oom["unixMs"] if oom else None,
                    "budgetOom": oom.get("budgetOom") if oom else None,
                    "oomEventMs": ooms_at.get(n),
                    "lastStep": next((e for e in reversed(events) if e.get("event") == "step"), None),
                    "done": first(events, "done"),
                    "bypass": first(events, "bypass"),
                    "bypassSurvived": first(events, "bypass-survived"),
                }
            )
        times = {}
        # Apply to the first training step: of attempt 1, else of the first
        # attempt that trained (after OOMs before any step), named so.
        stepped = next((a for a in attempts if a["firstStepMs"]), None)
        if stepped:
            key = "applyToFirstStepMs" if stepped["attempt"] == 1 else f"applyToFirstStepMs[a{stepped['attempt']}]"
            times[key] = stepped["firstStepMs"] - apply_ms
        for prev, nxt in zip(attempts, attempts[1:]):
            if nxt["attempt"] != prev["attempt"] + 1:
                continue
            # An OOM the process reported itself, else the end of a pod the
            # agent's watchdog stopped, else the controller's OutOfMemory event.
            ended = prev["oomMs"] or prev["finishedMs"] or prev["oomEventMs"]
            if ended and nxt["firstStepMs"]:
                times[f"oomToNextFirstStepMs[a{prev['attempt']}->a{nxt['attempt']}]"] = nxt["firstStepMs"] - ended
        out_jobs.append(
            {
                "name": name,
                "phase": st.get("phase"),
                "attempt": st.get("attempt"),
                "microBatch": st.get("microBatch"),
                "gradAccum": st.get("gradAccum"),
                "predictedBytes": st.get("predictedBytes"),
                "budgetBytes": st.get("budgetBytes"),
                "predictionSource": st.get("predictionSource"),
                "measuredPeakBytes": st.get("measuredPeakBytes"),
                "gpu": st.get("gpu"),
                "history": st.get("history") or [],
                "absorbedOoms": st.get("absorbedOoms") or [],
                "eventReasons": sorted({e.get("reason") for e in (k8s_events or {}).get("items", [])
                                        if (e.get("involvedObject") or {}).get("kind") == "TrainingJob"
                                        and (e.get("involvedObject") or {}).get("name") == name}),
                "message": st.get("message"),
                "times": times,
                "attempts": attempts,
            }
        )
    gstat = gpu_node.get("status") or {}
    uuid_of = {str(g.get("index")): g.get("uuid") for g in gstat.get("gpus") or []}
    nodes_of = cdi_nodes(cdi)
    for j in out_jobs:
        # What CDI should give the job's containers: the device nodes of the
        # CDI devices of its placed GPUs' UUIDs, from the node's spec.
        idx = [i.strip() for i in str(j.get("gpu") or "").split(",") if i.strip()]
        j["gpuUuids"] = [uuid_of.get(i) for i in idx]
        j["expectedDevices"] = sorted({n for u in j["gpuUuids"] if u for n in nodes_of.get(u, [])})
    return {"applyMs": apply_ms, "jobs": out_jobs, "gpuNode": gstat, "allocatorSeen": allocator_seen(samples or []),
            "shapesSeen": shapes_seen(samples or []), "overBudgetSeen": over_budget_seen(samples or []),
            "oomReportsSeen": {r["podName"]: r for node in (samples or []) + [gpu_node]
                               for r in (node.get("status") or {}).get("oomReports") or [] if r.get("podName")}}


#: The tenant's job that goes over its budget outside PyTorch on two attempts in a row.
TWICE = "overbudget-twice"
#: How long a process over its budget may last: the watchdog's grace (5 s),
#: its readings and the GpuNode's heartbeat, with room; the process itself
#: would hold its memory for 240 s.
OVER_BUDGET_BOUND_MS = 45_000


def overbudget_twice_checks(summary: dict, gpu: bool, expected: bool) -> List[tuple]:
    """Attack b: a tenant's process allocates past its budget through
    cuMemAlloc (outside PyTorch's allocator) on its first attempt and again
    on its second, after the watchdog's first stop. Each episode must be
    stopped: an OOM report of the agent for each attempt's pod, the controller
    counting both as OOMs, the third attempt training, and the pods' GPU
    memory over budget for a bounded time only. (None, ...) marks a skip."""
    name = "attack b: a job over its budget again after the watchdog's first stop is stopped again"
    job = next((j for j in summary["jobs"] if j["name"] == TWICE), None)
    if not gpu:
        return [(name, None, "no GPU here: nothing can allocate GPU memory past a budget (runs on the GPU node)")]
    if job is None:
        return [(name, not expected, f"no job {TWICE} in this run")] if expected else []
    pods = [f"{TWICE}-a{n}" for n in (1, 2)]
    reports = {p: r for p, r in (summary.get("oomReportsSeen") or {}).items() if p in pods}
    outcomes = [(h.get("attempt"), h.get("outcome")) for h in job["history"]]
    ooms = [a for a, o in outcomes if o == "OutOfMemory"]
    over = summary.get("overBudgetSeen") or {}
    survived = [a["pod"] for a in job["attempts"] if a.get("bypassSurvived")]
    problems = []
    if sorted(ooms)[:2] != [1, 2]:
        problems.append(f"attempts 1 and 2 not both OutOfMemory: {outcomes}")
    missing = [p for p in pods if p not in reports]
    if missing:
        problems.append(f"no agent OOM report for {missing}")
    if job["phase"] != "Succeeded":
        problems.append(f"phase {job['phase']}")
    if survived:
        problems.append(f"processes held their memory to the end: {survived}")
    long = {p: over[p]["overForMs"] for p in pods if p in over and over[p]["overForMs"] > OVER_BUDGET_BOUND_MS}
    if long:
        problems.append(f"over budget for longer than {OVER_BUDGET_BOUND_MS / 1000:.0f}s: {long}")
    held = [a.get("bypass", {}).get("heldBytes") if a.get("bypass") else None for a in job["attempts"][:2]]
    detail = (f"history {outcomes}; agent reports "
              + ", ".join(f"{p}: {gib(r.get('usedBytes'))} of {gib(r.get('budgetBytes'))} GiB ({r.get('reason') or ''})"
                          for p, r in sorted(reports.items()))
              + f"; allocated outside PyTorch {[gib(h) for h in held]} GiB; over budget for "
              + ", ".join(f"{p} {over.get(p, {}).get('overForMs', 0) / 1000:.0f}s (max {gib(over.get(p, {}).get('maxUsedBytes'))} GiB)"
                          for p in pods))
    return [(name, not problems, "; ".join(problems) or detail)]


def checks(summary: dict, gpu: bool) -> List[tuple]:
    """(name, ok, detail) for what the demo must show."""
    jobs = {j["name"]: j for j in summary["jobs"]}
    result = []
    ident = summary.get("kubeletIdentity")
    if ident is not None:
        # The kubelet's own credentials: user system:node:<node> in
        # system:nodes, which the Node authorizer keeps from cluster-wide writes.
        who = ident.get("userInfo") or {}
        node = summary.get("node")
        ok = (who.get("username") == f"system:node:{node}" and "system:nodes" in (who.get("groups") or [])
              and "system:masters" not in (who.get("groups") or []) and ident.get("canCreateNamespaces") == "no")
        result.append(("the kubelet runs as its node, not as the admin", ok,
                       f"user {who.get('username')}, groups {who.get('groups')}, "
                       f"can create namespaces: {ident.get('canCreateNamespaces')}"))
    for j in summary["jobs"]:
        result.append((f"{j['name']} Succeeded", j["phase"] == "Succeeded", f"phase {j['phase']}: {j.get('message') or ''}"))
    for j in summary["jobs"]:
        # The placed GPU reached the container through CDI: its own device
        # node (the one the node's CDI spec gives its UUID), nvidia-uvm, no
        # other GPU's node, and the container is not privileged (no
        # securityContext.privileged, no CAP_SYS_ADMIN in its capabilities).
        # Without a GPU the nodes are stand-ins and the simulated GPU's
        # variable names the UUID.
        last = j["attempts"][-1] if j["attempts"] else {}
        start = last.get("startEvent") or {}
        devices = start.get("devices") or []
        gpus_seen = sorted(d for d in devices if d[len("nvidia"):].isdigit())
        want = j.get("expectedDevices") or []
        problems = []
        if not want:
            problems.append("no CDI device for the placed GPU in the node's spec")
        if gpus_seen != want:
            problems.append(f"GPU nodes {gpus_seen}, want {want}")
        if "nvidia-uvm" not in devices:
            problems.append("no nvidia-uvm")
        cap = int(start.get("capEff") or "0", 16)
        if last.get("privileged") or cap & (1 << CAP_SYS_ADMIN):
            problems.append(f"privileged (pod {bool(last.get('privileged'))}, CapEff {start.get('capEff')})")
        if not start.get("capEff"):
            problems.append("no capabilities reported")
        if not gpu and start.get("simulatedGpu") not in j.get("gpuUuids", []):
            problems.append(f"container saw {start.get('simulatedGpu')}, placed on {j.get('gpuUuids')}")
        detail = "; ".join(problems) or f"{', '.join(devices)}; CapEff {start.get('capEff')}"
        result.append((f"{j['name']}: its GPU through CDI, not privileged", not problems, detail))
    if not gpu:
        return result
    placed = {j["gpu"] for j in summary["jobs"] if j.get("gpu")}
    result.append(("jobs share one GPU", len(summary["jobs"]) >= 4 and len(placed) == 1, f"GPUs used: {sorted(placed)}"))
    oom = jobs.get("gpt2-oom")
    if oom:
        h = oom["history"]
        ok = bool(h) and h[0].get("outcome") == "OutOfMemory" and (oom.get("microBatch") or 0) * 2 <= h[0].get("microBatch", 0)
        result.append(("gpt2-oom: CUDA OOM, micro halved, then success", ok and oom["phase"] == "Succeeded",
                       f"history {[(a.get('microBatch'), a.get('outcome')) for a in h]}, now micro {oom.get('microBatch')}"))
    by = jobs.get("bypass")
    if by:
        h = by["history"]
        reports = [r for r in summary["gpuNode"].get("oomReports") or [] if r.get("podName", "").startswith("bypass-")]
        ok = bool(h) and h[0].get("outcome") == "OutOfMemory" and bool(reports)
        result.append(("bypass: stopped by the agent's watchdog, treated as OOM", ok,
                       f"history {[(a.get('microBatch'), a.get('outcome')) for a in h]}, agent reports {len(reports)}"))
    # The in-process allocator: every job's last attempt ran under it, its
    # counters reached the GpuNode (through the stats folder the agent
    # reads), and the OOM job's OOM was its budget error.
    enf = {j["name"]: ((j["attempts"][-1].get("startEvent") or {}).get("enforcement") if j["attempts"] else None)
           for j in summary["jobs"]}
    result.append(("the allocator enforces every job's budget", all(v == "allocator" for v in enf.values()),
                   ", ".join(f"{k} {v}" for k, v in sorted(enf.items()))))
    seen = summary.get("allocatorSeen") or {}
    jobs_seen = sorted({pod.rsplit("-a", 1)[0] for pod in seen})
    result.append(("allocator figures reach the GpuNode", set(jobs_seen) >= set(jobs),
                   f"jobs with allocator figures: {jobs_seen}; pods: "
                   + ", ".join(f"{p} peak reserved {gib(e['peakReservedBytes'])} of {gib(e['budgetBytes'])} GiB"
                               for p, e in sorted(seen.items()))))
    if oom:
        # From the process (its oom event) and from the controller's record
        # (the termination message in status.history): both must say the
        # allocator's budget error (BUDGET_MARKER) where they are known.
        budget = [a["pod"] for a in oom["attempts"] if a.get("budgetOom")]
        ooms = [h for h in oom["history"] if h.get("outcome") == "OutOfMemory"]
        recorded = [h.get("attempt") for h in ooms if BUDGET_MARKER in (h.get("message") or "")]
        not_budget = [a["pod"] for a in oom["attempts"] if a.get("budgetOom") is False]
        ok = bool(ooms) and len(recorded) == len(ooms) and not not_budget
        result.append(("gpt2-oom: the OOM is the allocator's budget error", ok,
                       f"OOM attempts recorded with the allocator's message: {recorded} of "
                       f"{[h.get('attempt') for h in ooms]}; processes that said so: {budget}; "
                       f"that said otherwise: {not_budget}"))
    ab = jobs.get("gpt2-absorb")
    if ab:
        # Absorbed in the process: one attempt, the job's status lists the
        # absorbed OOMs and the controller said so (OomAbsorbed event); the
        # agent carried the process's new shape in the GpuNode.
        shape = (summary.get("shapesSeen") or {}).get("gpt2-absorb-a1") or {}
        ok = (ab["phase"] == "Succeeded" and ab.get("attempt") == 1 and bool(ab.get("absorbedOoms"))
              and "OomAbsorbed" in (ab.get("eventReasons") or []))
        result.append(("gpt2-absorb: OOMs absorbed in the process, recorded by the controller", ok,
                       f"attempt {ab.get('attempt')}, status.absorbedOoms "
                       f"{[(a.get('fromMicro'), a.get('toMicro')) for a in ab.get('absorbedOoms') or []]}, "
                       f"events {ab.get('eventReasons')}"))
        result.append(("gpt2-absorb: the GpuNode carried the process's shape", bool(shape.get("absorbedOoms")),
                       f"shape micro {shape.get('microBatch')} x {shape.get('gradAccum')}, absorbed "
                       f"{[(a.get('fromMicro'), a.get('toMicro')) for a in shape.get('absorbedOoms') or []]}"))
    measured = [j for j in summary["jobs"] if j.get("measuredPeakBytes")]
    result.append(("measured peaks reach job status", len(measured) == len(summary["jobs"]),
                   f"{len(measured)} of {len(summary['jobs'])} jobs"))
    return result


def gib(v) -> str:
    return f"{v / 2**30:.1f}" if isinstance(v, (int, float)) and v else "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--apply-ms", type=int, required=True)
    p.add_argument("--end-ms", type=int, required=True)
    p.add_argument("--gpu", type=int, default=1)
    p.add_argument("--jobs", required=True)
    p.add_argument("--pods", required=True)
    p.add_argument("--gpunode", required=True)
    p.add_argument("--logs", default="/var/log/pods")
    p.add_argument("--out", required=True)
    p.add_argument("--cdi", help="the node's CDI spec (what the containers' devices should be)")
    p.add_argument("--samples", help="GpuNode snapshots taken during the run, one JSON document a line")
    p.add_argument("--kubelet-identity", help="who the kubelet's kubeconfig is (auth whoami, can-i create namespaces)")
    p.add_argument("--node", help="the node's name")
    p.add_argument("--events", help="the namespace's events (kubectl get events -o json)")
    p.add_argument("--attacks", action="store_true", help=f"judge attack b (the job {TWICE}; a SKIP line without a GPU)")
    a = p.parse_args(argv)
    load = lambda f: json.loads(Path(f).read_text())  # noqa: E731
    samples = []
    if a.samples and Path(a.samples).is_file():
        for line in Path(a.samples).read_text().splitlines():
            try:
                samples.append(json.loads(line))
            except ValueError:
                continue
    cdi = load(a.cdi) if a.cdi and Path(a.cdi).is_file() else None
    events = load(a.events) if a.events and Path(a.events).is_file() else None
    summary = summarize(load(a.jobs), load(a.pods), load(a.gpunode), a.apply_ms, Path(a.logs), samples, cdi, events)
    summary["endMs"] = a.end_ms
    if a.kubelet_identity and Path(a.kubelet_identity).is_file():
        summary["kubeletIdentity"] = load(a.kubelet_identity)
        summary["node"] = a.node
    results = checks(summary, bool(a.gpu))
    if a.attacks:
        results += overbudget_twice_checks(summary, bool(a.gpu), expected=True)
    summary["checks"] = [{"check": n, "ok": ok, "detail": d} for n, ok, d in results]
    Path(a.out).write_text(json.dumps(summary, indent=1, sort_keys=True))

    print(f"demo: {len(summary['jobs'])} jobs, {(a.end_ms - a.apply_ms) / 1000:.1f} s from apply to the last one finished")
    print(f"{'job':<12} {'phase':<10} {'att':>3} {'micro':>5} {'pred GiB':>8} {'budget':>6} {'meas':>5}  times (s)")
    for j in summary["jobs"]:
        times = ", ".join(f"{k.replace('Ms', '')} {v / 1000:.1f}" for k, v in j["times"].items())
        print(f"{j['name']:<12} {str(j['phase']):<10} {j['attempt'] or 0:>3} {j['microBatch'] or 0:>5} "
              f"{gib(j['predictedBytes']):>8} {gib(j['budgetBytes']):>6} {gib(j['measuredPeakBytes']):>5}  {times}")
    failed = 0
    for n, ok, d in results:
        print(f"{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}  {n}  ({d})")
        failed += ok is False
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
