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

    report.py watch --out FILE     follows the run with `kubectl get --watch` until stopped

`watch` writes one JSON line per change the API server reports, stamped
with this clock: the TrainingJobs (phase, prediction source, GPU), the
controller's profiling pods and captured-profile ConfigMaps (label
vramfit.dev/profile-of). Given to the summary (--watch FILE) it yields the
phases each job went through, the time from apply to placement, and the
checks of a job profiled automatically (spec.model.auto).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

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
              k8s_events: Optional[dict] = None, watch: Optional[List[dict]] = None) -> dict:
    pods_by_name = {p["metadata"]["name"]: p for p in pods.get("items", [])}
    seen = watch_jobs(watch) if watch is not None else None
    out_jobs = []
    for j in sorted(jobs.get("items", []), key=lambda j: j["metadata"]["name"]):
        name = j["metadata"]["name"]
        namespace = j["metadata"].get("namespace")
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
        watched = None
        if seen is not None:
            watched = seen.get(f"{namespace or ''}/{name}") or {"phases": [], "profilePods": {}, "profileMaps": {}}
            if watched.get("placedMs"):
                times["applyToPlacementMs"] = watched["placedMs"] - apply_ms
            if watched.get("profilingMs"):
                times["profilingMs"] = watched["profilingMs"]
            for pod in watched["profilePods"].values():
                pod["log"] = profile_pod_log(logs_root, namespace or "ml", pod["name"])
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
                "namespace": namespace,
                "uid": j["metadata"].get("uid"),
                "modelAuto": "auto" in ((j.get("spec") or {}).get("model") or {}),
                "watch": watched,
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
    result += auto_profile_checks(summary, gpu)
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


# --- automatic profiling: the run's watch and its checks ------------------------

#: The label of the controller's profiling pods and captured-profile ConfigMaps (the job's name).
PROFILE_OF = "vramfit.dev/profile-of"
#: The label of every training pod the controller creates (the job's name), and of its attempt.
TRAINING_JOB = "vramfit.dev/training-job"
ATTEMPT = "vramfit.dev/attempt"
#: What `report.py watch` follows: (resource, label selector).
WATCHED = (("trainingjobs.vramfit.dev", None), ("pods", PROFILE_OF), ("pods", TRAINING_JOB),
           ("configmaps", PROFILE_OF))
#: The variables of a profiling pod the checks read.
PROFILE_ENV = ("VRAMFIT_PHASE", "VRAMFIT_MICRO_BATCH", "VRAMFIT_GRAD_ACCUM", "VRAMFIT_GLOBAL_BATCH",
               "NVIDIA_VISIBLE_DEVICES")
#: Annotations that would give a pod a GPU through CDI.
CDI_ANNOTATIONS = ("cdi.k8s.io/", "cdi-devices.noderesource.dev/")
#: Phases of a job that holds a placement (or held one).
PLACED_PHASES = ("Placed", "Running", "Retrying", "Succeeded")
PROFILE_LINE = "vramfit-profile: "


def now_ms() -> int:
    return int(time.time() * 1000)


def profile_figures(text: Optional[str]) -> Optional[dict]:
    """What a captured profile (the ConfigMap's profile.json) holds, in figures."""
    if text is None:
        return None
    try:
        prof = json.loads(text)
    except ValueError as exc:
        return {"bytes": len(text), "error": f"not JSON: {exc}"}
    cap = prof.get("capture") or {}
    return {"bytes": len(text), "format": prof.get("format"), "microBatch": prof.get("microBatch"),
            "gradAccum": prof.get("gradAccum"), "events": len(prof.get("events") or []),
            "sizes": len(prof.get("sizes") or []), "source": prof.get("source"),
            "peakLiveBytes": cap.get("peakLiveBytes"), "captureSeconds": cap.get("seconds"),
            "peakHostBytes": cap.get("peakHostBytes"), "torch": cap.get("torch")}


def watch_record(doc: dict, ms: int) -> Optional[dict]:
    """One line of the watch file from one document of `kubectl get --watch
    --output-watch-events -o json` (`{"type": ..., "object": ...}`, or a bare
    object): the change's type, the object's kind and name, and what the
    report reads of it, not the whole object."""
    obj = doc["object"] if isinstance(doc.get("object"), dict) and "type" in doc else doc
    kind = obj.get("kind")
    if kind not in ("TrainingJob", "Pod", "ConfigMap"):
        return None
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    rec = {"ms": ms, "type": doc.get("type") or "OBSERVED", "kind": kind, "namespace": meta.get("namespace"),
           "name": meta.get("name"), "uid": meta.get("uid")}
    if kind == "TrainingJob":
        st = obj.get("status") or {}
        rec.update({k: st.get(k) for k in ("phase", "predictionSource", "gpu", "attempt", "budgetBytes",
                                           "predictedBytes", "message")})
        rec["auto"] = "auto" in (((obj.get("spec") or {}).get("model")) or {})
    elif kind == "Pod":
        spec = obj.get("spec") or {}
        st = obj.get("status") or {}
        containers = spec.get("containers") or []
        term = None
        for cs in st.get("containerStatuses") or []:
            term = ((cs.get("state") or {}).get("terminated")) or term
        rec.update({
            "profileOf": labels.get(PROFILE_OF), "job": labels.get(TRAINING_JOB), "attempt": labels.get(ATTEMPT),
            "phase": st.get("phase"), "nodeName": spec.get("nodeName"),
            "env": {e["name"]: e.get("value") for c in containers for e in c.get("env") or []
                    if e.get("name") in PROFILE_ENV},
            "cdiAnnotations": sorted(k for k in (meta.get("annotations") or {}) if k.startswith(CDI_ANNOTATIONS)),
            "requests": any(((c.get("resources") or {}).get("requests")) for c in containers),
            "exitCode": term.get("exitCode") if term else None,
            "terminationMessageBytes": len(term.get("message") or "") if term else None,
            "deleting": bool(meta.get("deletionTimestamp")),
        })
    else:
        rec["labels"] = {k: v for k, v in labels.items() if k.startswith("vramfit.dev/")}
        rec["owners"] = [{k: o.get(k) for k in ("kind", "name", "uid", "controller")}
                         for o in meta.get("ownerReferences") or []]
        rec["profile"] = profile_figures((obj.get("data") or {}).get("profile.json"))
    return rec


class JsonStream:
    """JSON documents from text that holds them one after another, fed a
    line at a time (kubectl's watch output: each document indented over
    several lines); lines outside a document are skipped."""

    def __init__(self) -> None:
        self.buf = ""

    def feed(self, line: str) -> List[dict]:
        if not self.buf and not line.lstrip().startswith("{"):
            return []
        self.buf += line
        if not line.rstrip().endswith("}"):
            return []
        try:
            doc = json.loads(self.buf)
        except ValueError:
            return []
        self.buf = ""
        return [doc] if isinstance(doc, dict) else []


def watch(out: str, kubectl: str = "kubectl", stop_after: Optional[float] = None) -> int:
    """Follows WATCHED in every namespace (`kubectl get -A --watch
    --output-watch-events -o json`, one process each, started again when one
    ends) and writes one line per change to `out` until SIGTERM or SIGINT
    (or `stop_after` seconds). The first line, type WATCHING, is written once
    the kubectl processes are started."""
    import signal
    import subprocess
    import threading

    lock = threading.Lock()
    stopping = threading.Event()
    procs: Dict[tuple, "subprocess.Popen[str]"] = {}
    f = open(out, "w")

    def write(rec: dict) -> None:
        with lock:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()

    def follow(resource: str, selector: Optional[str], started: "threading.Event") -> None:
        cmd = [kubectl, "get", resource, "-A", "--watch", "--output-watch-events", "-o", "json"]
        if selector:
            cmd += ["-l", selector]
        while not stopping.is_set():
            try:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            except OSError as exc:
                write({"ms": now_ms(), "type": "ERROR", "resource": resource, "error": str(exc)})
                started.set()
                return
            procs[(resource, selector)] = proc
            started.set()
            stream = JsonStream()
            assert proc.stdout is not None
            for line in proc.stdout:
                for doc in stream.feed(line):
                    rec = watch_record(doc, now_ms())
                    if rec:
                        write(rec)
            proc.wait()
            if not stopping.is_set():
                write({"ms": now_ms(), "type": "RESTART", "resource": resource, "selector": selector,
                       "rc": proc.returncode})
                stopping.wait(1)

    def stop(*_args) -> None:
        stopping.set()
        for proc in list(procs.values()):
            if proc.poll() is None:
                proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threads = []
    for resource, selector in WATCHED:
        started = threading.Event()
        t = threading.Thread(target=follow, args=(resource, selector, started), daemon=True)
        t.start()
        started.wait(10)
        threads.append(t)
    write({"ms": now_ms(), "type": "WATCHING", "resources": [f"{r} -l {sel}" if sel else r for r, sel in WATCHED]})
    stopping.wait(stop_after)
    stop()
    for t in threads:
        t.join(5)
    f.close()
    return 0


def read_watch(path: str) -> List[dict]:
    """The watch file's records (a line cut short by a watcher still writing is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def watch_jobs(records: Sequence[dict]) -> Dict[str, dict]:
    """Per job (`namespace/name`), from the watch: its phases in order with
    the time each was first seen, when it was first placed (`placedMs`), how
    long it was in phase Profiling (`profilingMs`, to its next phase), and
    its profiling pods and captured-profile ConfigMaps as seen."""
    out: Dict[str, dict] = {}

    def job(key: str) -> dict:
        return out.setdefault(key, {"phases": [], "placedMs": None, "profilingMs": None,
                                    "profilePods": {}, "profileMaps": {}})

    for r in sorted((r for r in records if r.get("kind")), key=lambda r: r.get("ms") or 0):
        ns = r.get("namespace") or ""
        if r["kind"] == "TrainingJob":
            j = job(f"{ns}/{r.get('name')}")
            j["uid"] = r.get("uid") or j.get("uid")
            phase = r.get("phase")
            if phase and (not j["phases"] or j["phases"][-1]["phase"] != phase):
                j["phases"].append({"phase": phase, "ms": r["ms"]})
            if j["placedMs"] is None and (r.get("gpu") or phase in PLACED_PHASES):
                j["placedMs"] = r["ms"]
        elif r["kind"] == "Pod" and r.get("profileOf"):
            j = job(f"{ns}/{r['profileOf']}")
            p = j["profilePods"].setdefault(r["name"], {"name": r["name"], "firstMs": r["ms"], "phases": [],
                                                        "nodeName": None, "env": {}, "cdiAnnotations": [],
                                                        "requests": False, "exitCode": None,
                                                        "terminationMessageBytes": None, "deletedMs": None})
            if r.get("phase") and r["phase"] not in p["phases"]:
                p["phases"].append(r["phase"])
            p["nodeName"] = r.get("nodeName") or p["nodeName"]
            p["env"] = p["env"] or r.get("env") or {}
            p["cdiAnnotations"] = sorted(set(p["cdiAnnotations"]) | set(r.get("cdiAnnotations") or []))
            p["requests"] = p["requests"] or bool(r.get("requests"))
            if r.get("exitCode") is not None:
                p["exitCode"] = r["exitCode"]
                p["terminationMessageBytes"] = r.get("terminationMessageBytes")
            if r.get("type") == "DELETED":
                p["deletedMs"] = r["ms"]
        elif r["kind"] == "ConfigMap":
            of = (r.get("labels") or {}).get(PROFILE_OF)
            if not of:
                continue
            m = job(f"{ns}/{of}")["profileMaps"].setdefault(r["name"], {"name": r["name"], "addedMs": r["ms"],
                                                                       "deletedMs": None})
            m.update({k: r.get(k) for k in ("labels", "owners") if r.get(k) is not None})
            m["profile"] = r.get("profile") or m.get("profile")
            if r.get("type") == "DELETED":
                m["deletedMs"] = r["ms"]
    for j in out.values():
        phases = j["phases"]
        for i, ph in enumerate(phases):
            if ph["phase"] == "Profiling":
                end = phases[i + 1]["ms"] if i + 1 < len(phases) else None
                j["profilingMs"] = (end - ph["ms"]) if end else None
                break
    return out


def profile_pod_log(logs_root: Path, namespace: str, pod: str) -> Optional[dict]:
    """A profiling pod's process as its log shows it, where the demo kept a
    copy before the controller deleted the pod: its start event (the devices
    it saw), the step it captured, and whether the profile line is there."""
    folders = sorted(logs_root.glob(f"{namespace}_{pod}_*"))
    if not folders:
        return None
    text = "".join(f.read_text(errors="replace") for d in folders for f in sorted(d.glob("*/*.log")))
    events = parse_events(text)
    return {"start": first(events, "start"), "capture": first(events, "profile-capture"),
            "profileLine": PROFILE_LINE.strip() in text}


def auto_profile_checks(summary: dict, gpu: bool) -> List[tuple]:
    """A job profiled automatically (spec.model.auto): it went through phase
    Profiling, whose pod ran once without a GPU and was deleted after; the
    captured profile is a ConfigMap vramfit-profile-<key> owned by the job;
    the prediction came from it; and (with a GPU) the job trained within that
    budget: its measured peak at most the budget, no OOM."""
    result: List[tuple] = []
    for j in summary["jobs"]:
        if not j.get("modelAuto"):
            continue
        name = j["name"]
        w = j.get("watch")
        base = summary.get("applyMs") or 0
        at = lambda ms: f"{(ms - base) / 1000:.1f} s" if ms else "-"  # noqa: E731

        check = f"{name}: phase Profiling, its pod run once without a GPU, then placed"
        if w is None:
            result.append((check, False, "no record of the run's phases (report.py --watch)"))
        else:
            problems = []
            phases = [p["phase"] for p in w["phases"]]
            if "Profiling" not in phases:
                problems.append("never in phase Profiling")
            elif not w.get("placedMs") or w["placedMs"] < next(p["ms"] for p in w["phases"] if p["phase"] == "Profiling"):
                problems.append("not placed after Profiling")
            pods = list(w["profilePods"].values())
            if not pods:
                problems.append("no profiling pod seen")
            for p in pods:
                env = p.get("env") or {}
                if env.get("VRAMFIT_PHASE") != "profile":
                    problems.append(f"{p['name']}: VRAMFIT_PHASE {env.get('VRAMFIT_PHASE')}")
                if env.get("NVIDIA_VISIBLE_DEVICES") != "void" or p.get("cdiAnnotations"):
                    problems.append(f"{p['name']}: a GPU asked for (NVIDIA_VISIBLE_DEVICES "
                                    f"{env.get('NVIDIA_VISIBLE_DEVICES')}, {p.get('cdiAnnotations')})")
                if p.get("requests"):
                    problems.append(f"{p['name']}: resource requests kept")
                if "Succeeded" not in p["phases"] or p.get("exitCode") not in (0, None):
                    problems.append(f"{p['name']}: phases {p['phases']}, exit {p.get('exitCode')}")
                if not p.get("deletedMs"):
                    problems.append(f"{p['name']}: not deleted")
                saw = (((p.get("log") or {}).get("start")) or {}).get("devices")
                if saw and any(d[len("nvidia"):].isdigit() for d in saw):
                    problems.append(f"{p['name']}: its process saw GPU device nodes {saw}")
            pod_lines = []
            for p in pods:
                env = p.get("env") or {}
                log = p.get("log") or {}
                saw = (log.get("start") or {}).get("devices")
                pod_lines.append(
                    f"pod {p['name']} on {p.get('nodeName')} (VRAMFIT_PHASE={env.get('VRAMFIT_PHASE')}, micro "
                    f"{env.get('VRAMFIT_MICRO_BATCH')} x {env.get('VRAMFIT_GRAD_ACCUM')}, NVIDIA_VISIBLE_DEVICES="
                    f"{env.get('NVIDIA_VISIBLE_DEVICES')}, CDI annotations {p.get('cdiAnnotations') or 'none'}"
                    + (f", devices seen {saw or 'none'}" if log.get("start") else "")
                    + (", profile line in its log" if log.get("profileLine") else "")
                    + f"): {' -> '.join(p['phases'])}, exit {p.get('exitCode')}, created {at(p.get('firstMs'))}, "
                    f"deleted {at(p.get('deletedMs'))}")
            if problems:
                detail = "; ".join(problems)
            else:
                began = next(p["ms"] for p in w["phases"] if p["phase"] == "Profiling")
                detail = (f"phases {' -> '.join(phases)}; Profiling from {at(began)} to "
                          f"{at(began + (w.get('profilingMs') or 0))}, placed {at(w.get('placedMs'))} after the apply; "
                          + "; ".join(pod_lines))
            result.append((check, not problems, detail))

        check = f"{name}: the captured profile in a ConfigMap vramfit-profile-<key> owned by the job"
        maps = list((w or {}).get("profileMaps", {}).values())
        problems = []
        good = []
        for m in maps:
            why = []
            owners = [o for o in m.get("owners") or [] if o.get("kind") == "TrainingJob" and o.get("name") == name]
            if not m["name"].startswith("vramfit-profile-"):
                why.append("named otherwise")
            if (m.get("labels") or {}).get("vramfit.dev/kind") != "allocation-profile":
                why.append(f"labels {m.get('labels')}")
            if not owners or not owners[0].get("controller") or (j.get("uid") and owners[0].get("uid") != j["uid"]):
                why.append(f"owners {m.get('owners')}")
            prof = m.get("profile") or {}
            if prof.get("format") != "vramfit.profile/v1" or not prof.get("events"):
                why.append(f"profile {prof}")
            if m.get("deletedMs"):
                why.append(f"deleted {at(m['deletedMs'])}")
            if why:
                problems.append(f"{m['name']}: {', '.join(why)}")
            else:
                good.append(m)
        if w is None:
            result.append((check, False, "no record of the run (report.py --watch)"))
        elif not good:
            result.append((check, False, "; ".join(problems) or "no ConfigMap labelled vramfit.dev/profile-of=" + name))
        else:
            m = good[0]
            prof = m["profile"]
            result.append((check, True,
                           f"{m['name']} (created {at(m.get('addedMs'))}): {prof.get('bytes', 0) / 1000:.0f} kB, "
                           f"{prof.get('events')} events of {prof.get('sizes')} sizes, micro {prof.get('microBatch')} x "
                           f"{prof.get('gradAccum')}, live peak {gib(prof.get('peakLiveBytes'))} GiB, captured in "
                           f"{prof.get('captureSeconds')} s with {gib(prof.get('peakHostBytes'))} GiB of host memory "
                           f"(torch {prof.get('torch')}); owner TrainingJob {name}, controller"))

        result.append((f"{name}: predicted from its profile (status.predictionSource profile)",
                       j.get("predictionSource") == "profile",
                       f"predictionSource {j.get('predictionSource')}, predicted {gib(j.get('predictedBytes'))} GiB, "
                       f"budget {gib(j.get('budgetBytes'))} GiB"))

        check = f"{name}: trained within the budget predicted from its profile (measured peak, no OOM)"
        if not gpu:
            result.append((check, None, "no GPU here: nothing measures GPU memory (runs on the GPU node)"))
            continue
        measured, budget = j.get("measuredPeakBytes"), j.get("budgetBytes")
        ooms = [h.get("attempt") for h in j["history"] if h.get("outcome") == "OutOfMemory"]
        absorbed = [(a.get("fromMicro"), a.get("toMicro")) for a in j.get("absorbedOoms") or []]
        alloc = {p: e for p, e in (summary.get("allocatorSeen") or {}).items() if p.rsplit("-a", 1)[0] == name}
        ok = (j["phase"] == "Succeeded" and bool(measured) and bool(budget) and measured <= budget
              and not ooms and not absorbed)
        result.append((check, ok,
                       f"measured peak {gib(measured)} GiB ({measured} bytes) of a budget of {gib(budget)} GiB "
                       f"({budget} bytes), predicted {gib(j.get('predictedBytes'))} GiB; phase {j['phase']}, attempt "
                       f"{j.get('attempt')}, OOM attempts {ooms}, absorbed {absorbed}; allocator "
                       + (", ".join(f"{p} peak reserved {gib(e['peakReservedBytes'])} of {gib(e['budgetBytes'])} GiB"
                                    for p, e in sorted(alloc.items())) or "figures not seen")))
    return result

# --- operating the release while the jobs run (hack/node/chartdemo.sh) -----------

#: Phases in which a job holds its placement's budget on its GPUs.
HOLDING_PHASES = ("Placed", "Running", "Retrying")
TERMINAL_PHASES = ("Succeeded", "Failed")


def event_count(ev: dict) -> int:
    """How many times an Event happened (a repeated event is one object with a count)."""
    return max(int(ev.get("count") or 0), int(((ev.get("series") or {}).get("count")) or 0), 1)


def _ms(ops: dict, ms: Optional[int]) -> str:
    return f"{(ms - ops['applyMs']) / 1000:.1f} s" if ms is not None and ops.get("applyMs") is not None else "?"


#: The operations chartdemo.sh does, as the checks name them.
OPERATIONS = (("leader", "the leader's pod deleted"), ("agent", "the agent's pod deleted"),
              ("upgrade", "helm upgrade"))


def jobs_once_check(jobs: dict, records: Sequence[dict]) -> tuple:
    """Every job ended in its expected phase (Succeeded), and only once: once
    the watch saw it Succeeded or Failed, it saw no other phase of it."""
    bad, n = [], 0
    seen = watch_jobs(records)
    for j in jobs.get("items", []):
        n += 1
        key = f"{j['metadata'].get('namespace') or ''}/{j['metadata']['name']}"
        phase = (j.get("status") or {}).get("phase")
        phases = [p["phase"] for p in (seen.get(key) or {}).get("phases", [])]
        ends = [i for i, p in enumerate(phases) if p in TERMINAL_PHASES]
        if phase != "Succeeded":
            bad.append(f"{key} ended {phase}")
        elif not ends:
            bad.append(f"{key}: the watch never saw it end ({' -> '.join(phases) or 'no phase'})")
        elif ends[0] != len(phases) - 1:
            bad.append(f"{key}: {' -> '.join(phases)}")
    if not n:
        return False, "no job"
    return not bad, "; ".join(bad) or f"{n} jobs, each Succeeded once, nothing after"


def attempt_pods_check(jobs: dict, records: Sequence[dict]) -> tuple:
    """One pod per attempt: the training pods the watch saw, by job and
    attempt, each attempt one pod (one UID: a pod deleted and created again
    under the same name counts twice), and every job's attempts those of its
    status (1..status.attempt, none missing, none more)."""
    uids: Dict[tuple, set] = {}
    for r in records:
        if r.get("kind") == "Pod" and r.get("job") and r.get("attempt") and r.get("uid"):
            uids.setdefault((r.get("namespace") or "", r["job"], str(r["attempt"])), set()).add(r["uid"])
    bad, pods = [], 0
    for j in jobs.get("items", []):
        ns, name = j["metadata"].get("namespace") or "", j["metadata"]["name"]
        want = {str(a) for a in range(1, int((j.get("status") or {}).get("attempt") or 0) + 1)}
        have = {a for (n, job, a) in uids if n == ns and job == name}
        if have != want:
            bad.append(f"{ns}/{name}: pods of attempts {sorted(have) or 'none'}, status.attempt {len(want)}")
        history = [h.get("attempt") for h in (j.get("status") or {}).get("history") or []]
        if len(history) != len(set(history)):
            bad.append(f"{ns}/{name}: history attempts {history}")
    for (ns, job, attempt), u in sorted(uids.items()):
        pods += len(u)
        if len(u) > 1:
            bad.append(f"{ns}/{job} attempt {attempt}: {len(u)} pods")
    return not bad and bool(uids), "; ".join(bad) or f"{pods} training pods for {len(uids)} attempts, one each"


def committed_check(records: Sequence[dict], samples: Sequence[dict], gpu_node: dict) -> tuple:
    """The GpuNode's committed memory never over its capacity: in every
    sample the controller's `allocation.committedBytes` at most the GPUs'
    total, and, from the watch, the budgets of the jobs holding a placement
    at each moment, summed per GPU, at most that GPU's memory."""
    # The GPUs of the GpuNode at the end, else of the last sample that lists them.
    listed = [((gpu_node.get("status") or {}).get("gpus") or [])] + [
        (smp.get("status") or {}).get("gpus") or [] for smp in reversed(samples)]
    gpus = {str(g.get("index")): int(g.get("totalBytes") or 0) for g in next((g for g in listed if g), [])}
    capacity = sum(gpus.values())
    bad = []
    peak_committed = 0
    for smp in samples:
        st = smp.get("status") or {}
        cap = sum(int(g.get("totalBytes") or 0) for g in st.get("gpus") or []) or capacity
        committed = int(((st.get("allocation") or {}).get("committedBytes")) or 0)
        peak_committed = max(peak_committed, committed)
        if cap and committed > cap:
            bad.append(f"allocation.committedBytes {committed} > {cap} at heartbeat {st.get('heartbeat')}")
    state: Dict[str, tuple] = {}
    peak: Dict[str, tuple] = {}
    for r in sorted((r for r in records if r.get("kind") == "TrainingJob"), key=lambda r: r.get("ms") or 0):
        key = f"{r.get('namespace')}/{r.get('name')}"
        if r.get("type") == "DELETED":
            state.pop(key, None)
            continue
        state[key] = (r.get("phase"), r.get("gpu"), int(r.get("budgetBytes") or 0))
        per_gpu: Dict[str, int] = {}
        for phase, gpu, budget in state.values():
            if phase in HOLDING_PHASES and gpu:
                for i in str(gpu).split(","):
                    per_gpu[i.strip()] = per_gpu.get(i.strip(), 0) + budget
        for i, total in per_gpu.items():
            if total > peak.get(i, (0, 0))[0]:
                peak[i] = (total, r.get("ms"))
    for i, (total, ms) in sorted(peak.items()):
        if i in gpus and total > gpus[i]:
            bad.append(f"GPU {i}: budgets of the jobs holding it {gib(total)} GiB > {gib(gpus[i])} GiB")
    if not samples and not peak:
        return False, "no GpuNode sample and no placement seen"
    detail = (f"{len(samples)} GpuNode samples, committed at most {gib(peak_committed)} of {gib(capacity)} GiB; "
              + ", ".join(f"GPU {i}: at most {gib(t)} GiB of budgets at once (of {gib(gpus.get(i))})"
                          for i, (t, _) in sorted(peak.items())))
    return not bad, "; ".join(bad) or detail


def events_check(jobs: dict, events: Optional[dict]) -> tuple:
    """The jobs' Events: for each job one Succeeded, no Failed or
    PodRejected, and as many Placed as it had attempts (a controller that
    took over and placed or finished a job again would add one)."""
    if not events:
        return False, "no events recorded"
    counts: Dict[tuple, int] = {}
    for ev in events.get("items", []):
        inv = ev.get("involvedObject") or ev.get("regarding") or {}
        if inv.get("kind") != "TrainingJob":
            continue
        k = (inv.get("namespace") or "", inv.get("name"), ev.get("reason"))
        counts[k] = counts.get(k, 0) + event_count(ev)
    bad, summary = [], []
    for j in jobs.get("items", []):
        ns, name = j["metadata"].get("namespace") or "", j["metadata"]["name"]
        attempts = int((j.get("status") or {}).get("attempt") or 0)
        got = {reason: n for (n_, job, reason), n in counts.items() if n_ == ns and job == name}
        want = {"Succeeded": 1, "Placed": attempts}
        for reason, n in want.items():
            if got.get(reason, 0) != n:
                bad.append(f"{ns}/{name}: {got.get(reason, 0)} {reason} (want {n})")
        for reason in ("Failed", "PodRejected"):
            if got.get(reason):
                bad.append(f"{ns}/{name}: {got[reason]} {reason}")
        summary.append(f"{name} Placed x{got.get('Placed', 0)}, Succeeded x{got.get('Succeeded', 0)}")
    return not bad, "; ".join(bad) or ", ".join(summary)


def operations_checks(ops: dict, jobs: dict, records: Sequence[dict], samples: Sequence[dict],
                      gpu_node: dict, events: Optional[dict]) -> List[tuple]:
    """What operating the release while the jobs ran (ops: what was done and
    when, from chartdemo.sh) must not have cost: each a (name, ok, detail)."""
    done = [f"{words} at {_ms(ops, (ops.get(what) or {}).get('ms'))}" for what, words in OPERATIONS
            if (ops.get(what) or {}).get("ms")]
    across = f"across {', '.join(done)} after the apply" if done else "no operation was done"
    result = [
        (f"operations: every job ended once, Succeeded ({across})", *jobs_once_check(jobs, records)),
        ("operations: one pod per attempt, no attempt doubled or lost", *attempt_pods_check(jobs, records)),
        ("operations: the GpuNode's committed memory never over its capacity", *committed_check(records, samples, gpu_node)),
        ("operations: the jobs' events, each once (Placed per attempt, one Succeeded, no Failed or PodRejected)",
         *events_check(jobs, events)),
    ]
    if not done:
        result = [(n, False, f"{d}; {across}") for n, ok, d in result]
    return result


def peaks_kept(before: dict, after: dict) -> tuple:
    """The agent's replacement kept the peaks: every training process on a
    GPU in the GpuNode before the agent's pod was deleted (`before`) and
    still there in the new agent's first status (`after`) has a peak at
    least the one it had, and every job Running in both, at the same
    attempt, has a `measuredPeakBytes` at least the one it had (a new
    attempt starts its own peak). Each is {"gpunode": ...,
    "jobs": a List of TrainingJobs}."""
    def procs(snap: dict) -> Dict[tuple, dict]:
        out = {}
        for g in ((snap.get("gpunode") or {}).get("status") or {}).get("gpus") or []:
            for p in g.get("processes") or []:
                if p.get("podName"):
                    out[(g.get("uuid"), p.get("pid"), p.get("podUid"))] = p
        return out

    def jobs(snap: dict) -> Dict[str, dict]:
        return {f"{j['metadata'].get('namespace')}/{j['metadata']['name']}": (j.get("status") or {})
                for j in (snap.get("jobs") or {}).get("items", [])}

    b, a = procs(before), procs(after)
    common = sorted(set(b) & set(a), key=lambda k: str(k))
    bad, kept = [], []
    for k in common:
        pb, pa = int(b[k].get("peakBytes") or 0), int(a[k].get("peakBytes") or 0)
        if pa < pb:
            bad.append(f"{b[k].get('podName')} (pid {k[1]}): peak {gib(pb)} -> {gib(pa)} GiB")
        else:
            kept.append(f"{b[k].get('podName')} {gib(pb)} -> {gib(pa)} GiB")
    jb, ja = jobs(before), jobs(after)
    measured = []
    for key in sorted(set(jb) & set(ja)):
        if (jb[key].get("phase") == "Running" and ja[key].get("phase") == "Running"
                and jb[key].get("attempt") == ja[key].get("attempt")):
            mb, ma = jb[key].get("measuredPeakBytes"), ja[key].get("measuredPeakBytes")
            if mb and (ma or 0) < mb:
                bad.append(f"{key}: measuredPeakBytes {mb} -> {ma}")
            elif mb:
                measured.append(f"{key.split('/')[-1]} {gib(mb)} -> {gib(ma)} GiB")
    if not common:
        return False, (f"no training process in both the last status before ({len(b)} processes) and the "
                       f"new agent's first ({len(a)}): nothing to compare")
    return not bad, "; ".join(bad) or (f"peaks of {len(kept)} processes kept: {', '.join(kept)}"
                                       + (f"; jobs' measuredPeakBytes kept: {', '.join(measured)}" if measured else ""))


# --- the memory-elastic pair (hack/node/chartdemo.sh, after the demo) ------------

#: The held-out losses of one job's shapes agree within this (scripts/gpu/recovery_check.py's LOSS_RTOL).
ELASTIC_LOSS_RTOL = 1e-3


def elastic_checks(jobs: dict, events: Optional[dict], logs: Dict[str, str], global_batch: int = 64) -> List[tuple]:
    """The elastic pair (nodecfg.py elastic-jobs): both Succeeded; they ran
    at the same time (their processes' start-to-done intervals overlap); one
    at the preferred shape, the other at a smaller micro-batch with the same
    global batch, its placement saying why and an `ElasticShape` event with
    the figures; each process trained at its placement's shape; and their
    held-out losses (train.py --exact) agree within ELASTIC_LOSS_RTOL.
    `logs`: job name -> the training container's log of its last attempt."""
    by = {j["metadata"]["name"]: j for j in jobs.get("items", [])}
    out: List[tuple] = []
    names = sorted(logs) or sorted(by)
    status = {n: (by.get(n) or {}).get("status") or {} for n in names}
    phases = {n: status[n].get("phase") for n in names}
    out.append(("elastic pair: both jobs Succeeded", len(names) == 2 and all(p == "Succeeded" for p in phases.values()),
                ", ".join(f"{n} {p}" for n, p in phases.items())))
    evs = {n: parse_events(logs.get(n) or "") for n in names}
    start = {n: (first(evs[n], "start") or {}).get("unixMs") for n in names}
    done = {n: first(evs[n], "done") or {} for n in names}
    spans = {n: (start[n], done[n].get("unixMs")) for n in names}
    overlap = len(names) == 2 and all(a and b for a, b in spans.values()) and \
        max(a for a, _ in spans.values()) < min(b for _, b in spans.values())
    out.append(("elastic pair: both trained at the same time on the GPU", overlap,
                "; ".join(f"{n} from {spans[n][0]} to {spans[n][1]} ms" for n in names)))
    shapes = {n: (status[n].get("microBatch"), status[n].get("gradAccum")) for n in names}
    elastic = [n for n in names if ((status[n].get("placement") or {}).get("elastic"))]
    preferred = [n for n in names if n not in elastic]
    same_global = all(m and a and m * a == global_batch for m, a in shapes.values())
    ok = (len(elastic) == 1 and len(preferred) == 1 and same_global
          and (shapes[elastic[0]][0] or 0) < (shapes[preferred[0]][0] or 0))
    out.append(("elastic pair: one at its preferred shape, the other smaller with the same global batch", ok,
                ", ".join(f"{n} {m}x{a}{' (elastic)' if n in elastic else ''}" for n, (m, a) in shapes.items())
                + f"; global {global_batch}"))
    notes = [e.get("note") or e.get("message") or "" for e in (events or {}).get("items", [])
             if (e.get("involvedObject") or {}).get("name") in elastic and e.get("reason") == "ElasticShape"]
    out.append(("elastic pair: an ElasticShape event with the preferred and chosen shapes and the step time",
                len(notes) == 1 and "preferred" in notes[0] and "step time" in notes[0],
                "; ".join(notes) or "no ElasticShape event"))
    ran = {n: (done[n].get("micro"), done[n].get("accum")) for n in names}
    out.append(("elastic pair: each process trained at its placement's shape", ran == shapes,
                f"processes {ran}, status {shapes}"))
    losses = {n: done[n].get("evalLoss") for n in names}
    if len(names) == 2 and all(isinstance(v, (int, float)) for v in losses.values()):
        a, b = (losses[n] for n in names)
        rel = abs(a - b) / abs(a) if a else float("inf")
        out.append((f"elastic pair: the same held-out loss at both shapes (relative difference <= {ELASTIC_LOSS_RTOL})",
                    rel <= ELASTIC_LOSS_RTOL, f"{', '.join(f'{n} {v:.6f}' for n, v in losses.items())}; {rel:.2e}"))
    else:
        out.append(("elastic pair: the same held-out loss at both shapes", False, f"held-out losses {losses}"))
    return out


def placement_lines(summary: dict) -> List[str]:
    """`TIME:` lines: for each job profiled automatically, apply to placement
    (and its time in phase Profiling, and to its first training step), beside
    the other jobs' apply to placement."""
    others = sorted((j["times"]["applyToPlacementMs"], j["name"]) for j in summary["jobs"]
                    if not j.get("modelAuto") and "applyToPlacementMs" in j["times"])
    lines = []
    for j in summary["jobs"]:
        if not j.get("modelAuto"):
            continue
        t = j["times"]
        step = next((v for k, v in t.items() if k.startswith("applyToFirstStepMs")), None)
        place = t.get("applyToPlacementMs")
        line = (f"TIME: {j['name']} (model.auto): apply to placement "
                + (f"{place / 1000:.1f} s" if place is not None else "not seen")
                + (f", of which {t['profilingMs'] / 1000:.1f} s in phase Profiling" if t.get("profilingMs") else "")
                + (f"; apply to its first training step {step / 1000:.1f} s" if step is not None else ""))
        if others:
            line += (f"; the other jobs: apply to placement {others[0][0] / 1000:.1f} s ({others[0][1]}) to "
                     f"{others[-1][0] / 1000:.1f} s ({others[-1][1]})")
        lines.append(line)
    return lines


def gib(v) -> str:
    return f"{v / 2**30:.1f}" if isinstance(v, (int, float)) and v else "-"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["operations"]:
        o = argparse.ArgumentParser(prog="report.py operations",
                                    description="the checks of operating the release while the jobs ran")
        o.add_argument("--ops", required=True, help="what was done and when (chartdemo.sh), JSON")
        o.add_argument("--jobs", required=True)
        o.add_argument("--gpunode", required=True)
        o.add_argument("--watch", required=True)
        o.add_argument("--samples", required=True)
        o.add_argument("--events", required=True)
        a = o.parse_args(argv[1:])
        load = lambda f: json.loads(Path(f).read_text()) if Path(f).is_file() else None  # noqa: E731
        samples = []
        if Path(a.samples).is_file():
            for line in Path(a.samples).read_text().splitlines():
                try:
                    samples.append(json.loads(line))
                except ValueError:
                    continue
        records = read_watch(a.watch) if Path(a.watch).is_file() else []
        results = operations_checks(load(a.ops) or {}, load(a.jobs) or {}, records, samples,
                                    load(a.gpunode) or {}, load(a.events))
        for n, ok, d in results:
            print(f"{'PASS' if ok else 'FAIL'}: {n} ({d})")
        return 1 if any(not ok for _, ok, _ in results) else 0
    if argv[:1] == ["elastic"]:
        e = argparse.ArgumentParser(prog="report.py elastic", description=elastic_checks.__doc__.split("\n\n")[0])
        e.add_argument("--jobs", required=True)
        e.add_argument("--events", required=True)
        e.add_argument("--log", action="append", default=[], help="JOB=FILE: its training container's log")
        a = e.parse_args(argv[1:])
        load = lambda f: json.loads(Path(f).read_text()) if Path(f).is_file() else None  # noqa: E731
        logs = {}
        for item in a.log:
            name, _, path = item.partition("=")
            logs[name] = Path(path).read_text() if Path(path).is_file() else ""
        results = elastic_checks(load(a.jobs) or {}, load(a.events), logs)
        for n, ok, d in results:
            print(f"{'PASS' if ok else 'FAIL'}: {n} ({d})")
        return 1 if any(not ok for _, ok, _ in results) else 0
    if argv[:1] == ["peaks"]:
        k = argparse.ArgumentParser(prog="report.py peaks", description=peaks_kept.__doc__.split("\n\n")[0])
        k.add_argument("--before", required=True)
        k.add_argument("--after", required=True)
        a = k.parse_args(argv[1:])
        ok, detail = peaks_kept(json.loads(Path(a.before).read_text()), json.loads(Path(a.after).read_text()))
        print(detail)
        return 0 if ok else 1
    if argv[:1] == ["watch"]:
        w = argparse.ArgumentParser(prog="report.py watch", description=watch.__doc__.split("\n\n")[0])
        w.add_argument("--out", required=True)
        w.add_argument("--kubectl", default="kubectl")
        w.add_argument("--seconds", type=float, help="stop after this long (default: at SIGTERM)")
        a = w.parse_args(argv[1:])
        return watch(a.out, a.kubectl, a.seconds)
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
    p.add_argument("--watch", help="what `report.py watch` wrote during the run (phases, profiling pods and profiles)")
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
    watched = read_watch(a.watch) if a.watch and Path(a.watch).is_file() else None
    summary = summarize(load(a.jobs), load(a.pods), load(a.gpunode), a.apply_ms, Path(a.logs), samples, cdi, events,
                        watched)
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
    for line in placement_lines(summary):
        print(line)
    failed = 0
    for n, ok, d in results:
        print(f"{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}  {n}  ({d})")
        failed += ok is False
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
