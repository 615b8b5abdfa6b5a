#!/usr/bin/env python3
"""Tenants and their attacks on a node where the chart is installed
(hack/gpunode.sh all --chart), each tried for real with the tenant's own
rights (`kubectl --as`), one PASS:/FAIL: line each (docs/security.md).

    attacks.py tenants                      namespaces team-a (Pod Security enforce=baseline) and
                                            team-b (enforce=restricted), alice and bob with `edit` in
                                            their own
    attacks.py run --out FILE [--image I] [--release R] [--other-job J]
    attacks.py restricted-job --out FILE [--image I] [--release R] [--timeout S]

`run` tries, as alice in team-a:
  a. pods that ask for a GPU themselves (a cdi.k8s.io annotation, a
     cdi-devices.noderesource.dev annotation, NVIDIA_VISIBLE_DEVICES=all):
     refused by the API server (the chart's <release>-gpu-access policy),
     while a plain pod of hers passes admission (a server-side dry run);
  c. TrainingJobs whose template asks for a privileged container or a
     hostPath volume: refused at apply (<release>-trainingjob-pod-security);
  d. reading, changing and deleting bob's TrainingJobs in team-b: forbidden
     (`auth can-i` and real attempts), while her own namespace's are hers.
and, as bob in team-b:
  e. a pod that baseline admits but restricted does not (no securityContext):
     refused by Pod Security in team-b (a server-side dry run), while one
     with the training template's securityContext passes.
`restricted-job` (after the demo's jobs, so that its placement takes no
room from them), as bob: a TrainingJob in team-b whose template baseline
admits and restricted does not. Refused at apply where the chart holds
templates to restricted; with the chart's cluster-wide baseline it is
accepted, and then its pod must be refused by Pod Security (the job Failed
with PodRejected, no pod of it created). Either way nothing of it runs.
Attack b (a job over its budget again after the watchdog's first stop) is
judged from the run by report.py. Only the standard library and kubectl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import List, Optional, Tuple

TENANTS = (("alice", "team-a"), ("bob", "team-b"))
#: The Pod Security level each tenant namespace enforces.
LEVELS = {"team-a": "baseline", "team-b": "restricted"}
#: What Pod Security restricted wants of a pod, as the demo's templates set it
#: (nodecfg.py image_template).
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
PAUSE = "localhost/vramfit/pause:3.10"


def kubectl(args: List[str], user: Optional[str] = None, stdin: Optional[str] = None) -> Tuple[int, str]:
    cmd = ["kubectl"] + (["--as", user] if user else []) + args
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)
    return p.returncode, (p.stdout + p.stderr).strip()


def tenants() -> int:
    """The tenants' namespaces (Pod Security enforced: team-a baseline,
    team-b restricted; both warn at restricted) and users (the default
    `edit` ClusterRole, into which the chart aggregates TrainingJob rights,
    bound in their own namespace only)."""
    docs = []
    for user, ns in TENANTS:
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": LEVELS[ns], "pod-security.kubernetes.io/warn": "restricted"}}})
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": f"{user}-edit", "namespace": ns},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    rc, out = kubectl(["apply", "-f", "-"], stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    print(out, file=sys.stderr)
    return rc


def pod(name: str, annotations: Optional[dict] = None, env: Optional[list] = None, restricted: bool = False) -> dict:
    c = {"name": "main", "image": PAUSE, "imagePullPolicy": "Never"}
    if env:
        c["env"] = env
    meta = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    spec = {"containers": [c]}
    if restricted:
        spec["securityContext"] = dict(RESTRICTED_POD)
        c["securityContext"] = json.loads(json.dumps(RESTRICTED_CONTAINER))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def trainingjob(name: str, image: str, spec_changes: dict, container_changes: dict) -> dict:
    c = {"name": "train", "image": image, "imagePullPolicy": "Never", "command": ["python", "-c", "pass"]}
    c.update(container_changes)
    spec = {"containers": [c]}
    spec.update(spec_changes)
    return {"apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"batch": {"global": 8, "micro": 8},
                     "model": {"mlp": {"layers": 2, "hidden": 256}, "precision": "fp32", "optimizer": "sgd-momentum"},
                     "memory": {"request": "1Gi"}, "template": {"spec": spec}}}


class Results:
    def __init__(self) -> None:
        self.items: List[dict] = []

    def add(self, attack: str, what: str, ok: bool, detail: str) -> None:
        # The API server's answer, without Pod Security's warnings (the namespaces warn at restricted).
        detail = " ".join(" ".join(line for line in detail.splitlines() if not line.startswith("Warning:")).split())[:300]
        self.items.append({"attack": attack, "check": what, "ok": ok, "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'}: attack {attack}: {what} ({detail})", flush=True)


def refused(r: Results, attack: str, what: str, user: str, ns: str, obj: dict, want: str) -> None:
    """Creates obj for real as user; it must be refused with `want` in the answer."""
    rc, out = kubectl(["create", "-n", ns, "-f", "-"], user=user, stdin=json.dumps(obj))
    if rc == 0:
        kubectl(["delete", "-n", ns, obj["kind"].lower() + "/" + obj["metadata"]["name"], "--wait=false"])
        r.add(attack, what, False, f"accepted: {out}")
    else:
        r.add(attack, what, want in out, out)


def run(args) -> int:
    r = Results()
    (user, ns), (other_user, other_ns) = TENANTS
    gpu_access = f"{args.release}-gpu-access"
    pod_security = f"{args.release}-trainingjob-pod-security"

    # a. A GPU asked for by the pod itself. In restricted namespaces the
    # plain pod carries what restricted wants; team-a is baseline.
    rc, out = kubectl(["create", "--dry-run=server", "-n", ns, "-f", "-"], user=user,
                      stdin=json.dumps(pod("plain", restricted=LEVELS[ns] == "restricted")))
    r.add("a", f"{user}'s plain pod passes admission in {ns} (the refusals below are the policy's)", rc == 0, out)
    refused(r, "a", "a pod with cdi.k8s.io/gpu: nvidia.com/gpu=0 is refused", user, ns,
            pod("cdi-annotation", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}), gpu_access)
    refused(r, "a", "a pod with cdi-devices.noderesource.dev/container.main: [nvidia.com/gpu=0] is refused", user, ns,
            pod("nri-annotation", annotations={"cdi-devices.noderesource.dev/container.main": "- nvidia.com/gpu=0\n"}),
            gpu_access)
    refused(r, "a", "a pod with NVIDIA_VISIBLE_DEVICES=all is refused", user, ns,
            pod("visible-all", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), gpu_access)

    # c. A template that asks for the node.
    refused(r, "c", "a TrainingJob whose template is privileged is refused at apply", user, ns,
            trainingjob("privileged", args.image, {}, {"securityContext": {"privileged": True}}), pod_security)
    refused(r, "c", "a TrainingJob whose template mounts a hostPath is refused at apply", user, ns,
            trainingjob("hostpath", args.image, {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
                        {"volumeMounts": [{"name": "root", "mountPath": "/host"}]}), pod_security)

    # d. Another tenant's jobs.
    rc, out = kubectl(["auth", "can-i", "create", "trainingjobs.vramfit.dev", "-n", ns], user=user)
    r.add("d", f"{user} may create TrainingJobs in her own {ns} (edit)", out.splitlines()[-1:] == ["yes"], out)
    for verb in ("get", "list", "patch", "delete"):
        rc, out = kubectl(["auth", "can-i", verb, "trainingjobs.vramfit.dev", "-n", other_ns], user=user)
        r.add("d", f"{user} cannot {verb} TrainingJobs in {other_ns} (auth can-i)", out.splitlines()[-1:] == ["no"], out)
    rc, out = kubectl(["get", "trainingjobs", "-n", other_ns], user=user)
    r.add("d", f"{user}: kubectl get trainingjobs -n {other_ns} is forbidden", rc != 0 and "forbidden" in out.lower(), out)
    target = args.other_job or "any"
    rc, out = kubectl(["patch", "trainingjob", target, "-n", other_ns, "--type=merge", "-p",
                       '{"spec": {"memory": {"request": "100Gi"}}}'], user=user)
    r.add("d", f"{user}: patching {other_ns}/{target} is forbidden", rc != 0 and "forbidden" in out.lower(), out)
    rc, out = kubectl(["delete", "trainingjob", target, "-n", other_ns, "--wait=false"], user=user)
    r.add("d", f"{user}: deleting {other_ns}/{target} is forbidden", rc != 0 and "forbidden" in out.lower(), out)
    if args.other_job:
        rc, out = kubectl(["get", "trainingjob", args.other_job, "-n", other_ns, "-o", "jsonpath={.metadata.name}"],
                          user=other_user)
        r.add("d", f"{other_user}'s {other_ns}/{args.other_job} is still there, and his", rc == 0 and out == args.other_job, out)

    # e. Pod Security restricted in bob's namespace.
    if LEVELS[other_ns] == "restricted":
        rc, out = kubectl(["create", "--dry-run=server", "-n", other_ns, "-f", "-"], user=other_user,
                          stdin=json.dumps(pod("baseline-only")))
        r.add("e", f"{other_user}'s pod without the securityContext restricted wants is refused in {other_ns} "
                   "(enforce=restricted)", rc != 0 and 'violates PodSecurity "restricted' in out, out)
        rc, out = kubectl(["create", "--dry-run=server", "-n", other_ns, "-f", "-"], user=other_user,
                          stdin=json.dumps(pod("restricted", restricted=True)))
        r.add("e", f"{other_user}'s pod with the training template's securityContext passes admission in {other_ns}",
              rc == 0, out)
    return finish(r, args.out, "attacks")


def finish(r: Results, out_file: str, label: str) -> int:
    failed = sum(not i["ok"] for i in r.items)
    with open(out_file, "w") as f:
        json.dump({"results": r.items, "passed": len(r.items) - failed, "failed": failed}, f, indent=1)
    print(f"{label}: {len(r.items) - failed} passed, {failed} failed")
    return 1 if failed else 0


def restricted_job(args) -> int:
    """Bob's TrainingJob in team-b (enforce=restricted) whose template
    baseline admits and restricted does not: nothing of it may run."""
    r = Results()
    user, ns = TENANTS[1]
    name = "not-restricted"
    job = trainingjob(name, args.image, {}, {})
    rc, out = kubectl(["create", "-n", ns, "-f", "-"], user=user, stdin=json.dumps(job))
    what = (f"{user}'s TrainingJob {ns}/{name}, whose template baseline admits and restricted does not, "
            f"runs no pod in {ns} (enforce=restricted)")
    if rc != 0:
        r.add("e", what, f"{args.release}-trainingjob-pod-security" in out, f"refused at apply: {out}")
        return finish(r, args.out, "attack e after the demo")
    deadline = time.time() + args.timeout
    status: dict = {}
    while time.time() < deadline:
        rc, text = kubectl(["get", "trainingjob", name, "-n", ns, "-o", "json"], user=user)
        status = (json.loads(text).get("status") or {}) if rc == 0 else {}
        if status.get("phase") in ("Failed", "Succeeded"):
            break
        time.sleep(1)
    rc, pods = kubectl(["get", "pods", "-n", ns, "-l", f"vramfit.dev/training-job={name}", "-o", "name"])
    rejected = any(c.get("type") == "PodRejected" and c.get("status") == "True" for c in status.get("conditions") or [])
    message = status.get("message") or ""
    ok = (status.get("phase") == "Failed" and rejected and 'violates PodSecurity "restricted' in message
          and rc == 0 and not pods.strip())
    r.add("e", what, ok, f"accepted at apply (the chart's template policy holds every namespace to the same level); "
                         f"phase {status.get('phase')}, PodRejected {rejected}, pods: {pods.strip() or 'none'}; "
                         f"{message}")
    kubectl(["delete", "trainingjob", name, "-n", ns, "--wait=false"], user=user)
    return finish(r, args.out, "attack e after the demo")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="attacks.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tenants")
    a = sub.add_parser("run")
    a.add_argument("--out", required=True, help="the results, JSON")
    a.add_argument("--release", default="vramfit")
    a.add_argument("--image", default="localhost/vramfit/train-venv:dev", help="the training image (for the job templates)")
    a.add_argument("--other-job", help="a TrainingJob of bob's in team-b to try to change and delete")
    rj = sub.add_parser("restricted-job")
    rj.add_argument("--out", required=True, help="the results, JSON")
    rj.add_argument("--release", default="vramfit")
    rj.add_argument("--image", default="localhost/vramfit/train-venv:dev")
    rj.add_argument("--timeout", type=float, default=90, help="seconds to wait for the job to fail")
    args = p.parse_args(argv)
    if args.cmd == "tenants":
        return tenants()
    return run(args) if args.cmd == "run" else restricted_job(args)


if __name__ == "__main__":
    sys.exit(main())
