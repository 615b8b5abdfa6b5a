#!/usr/bin/env python3
"""The API server's CPU per request, by kind of request, on the requests a
TrainingJob's path makes and on those of a pod scheduled by kube-scheduler.

Each phase sends COUNT requests of one kind from THREADS connections, with
nothing watching (no controller, no scheduler), and reads kube-apiserver's
and etcd's CPU seconds before and after:

  create-trainingjob   POST trainingjobs (the controller benchmark's job)
  finalizer            PATCH trainingjobs (merge patch: the controller's finalizer)
  status               PATCH trainingjobs/status (JSON patch `add /status`: a placed job)
  status-put           PUT trainingjobs/status (the same, as a whole object; its GET not counted
                       apart: the phase's CPU includes one GET per PUT)
  event                POST events (one per job, as the controller sends)
  create-pod           POST pods (a one-GPU pod)
  binding              POST pods/binding (what kube-scheduler sends per pod)

    api_cost.py --dir CONTROLPLANE_DIR [--count 1000] [--threads 8]

CONTROLPLANE_DIR is what `hack/controlplane.sh up --dir D` started, with the
CRDs installed (`hack/controlplane.sh crds --kubeconfig D/kubeconfig`). One
JSON object to stdout. Standard library only.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from upstream_scheduler import connect, cpu_seconds, node, parallel, pod  # noqa: E402

NS = "default"
JOBS = f"/apis/vramfit.dev/v1alpha1/namespaces/{NS}/trainingjobs"
GIB = 1 << 30


def job(name):
    return {
        "apiVersion": "vramfit.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "gpus": 1,
            "batch": {"global": 64, "micro": 8},
            "model": {"mlp": {"layers": 8, "hidden": 4096}, "precision": "fp32", "optimizer": "adamw"},
            "memory": {"request": "20Gi"},
            "template": {
                "spec": {
                    "containers": [
                        {"name": "train", "image": "trainer", "resources": {"requests": {"cpu": "4", "memory": "32Gi"}}}
                    ]
                }
            },
        },
    }


def placed_status(name):
    return {
        "phase": "Running",
        "attempt": 1,
        "budgetBytes": 20 * GIB,
        "placement": {
            "node": "node-00000",
            "gpus": [{"index": 0, "uuid": "GPU-0"}],
            "budgetBytes": 20 * GIB,
            "memoryFraction": 0.142857,
            "attempt": 1,
        },
        "message": f"attempt 1: placed {name} on node-00000 GPU 0",
    }


def event(name, i):
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{i:x}", "namespace": NS},
        "involvedObject": {"apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob", "name": name, "namespace": NS},
        "reason": "Placed",
        "message": f"attempt 1: predicted peak 18.2 GiB; placed on node-00000 GPU 0",
        "type": "Normal",
        "source": {"component": "vramfit"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": "vramfit",
        "reportingInstance": "bench",
    }


def put_status(api, name):
    """The same status written as a whole object (PUT with its resourceVersion)."""
    current = api.ok("GET", f"{JOBS}/{name}")
    current["status"] = placed_status(name) | {"message": f"attempt 1: placed {name} again"}
    api.ok("PUT", f"{JOBS}/{name}/status", current)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    if args.count < 1 or args.threads < 1:
        parser.error("--count and --threads must be positive")
    api, pids = connect(args.dir)
    api.ok("POST", "/api/v1/nodes", node("node-00000", args.count))

    names = [f"job-{i:06d}" for i in range(args.count)]
    pods = [f"pod-{i:06d}" for i in range(args.count)]
    phases = [
        ("create-trainingjob", names, lambda n: api.ok("POST", JOBS, job(n))),
        (
            "finalizer",
            names,
            lambda n: api.ok(
                "PATCH",
                f"{JOBS}/{n}",
                {"metadata": {"finalizers": ["vramfit.dev/release-placement"]}},
                "application/merge-patch+json",
            ),
        ),
        (
            "status",
            names,
            lambda n: api.ok(
                "PATCH",
                f"{JOBS}/{n}/status",
                [{"op": "add", "path": "/status", "value": placed_status(n)}],
                "application/json-patch+json",
            ),
        ),
        ("status-put", names, lambda n: put_status(api, n)),
        ("event", list(enumerate(names)), lambda p: api.ok("POST", f"/api/v1/namespaces/{NS}/events", event(p[1], p[0]))),
        ("create-pod", pods, lambda n: api.ok("POST", f"/api/v1/namespaces/{NS}/pods", pod(n))),
        (
            "binding",
            pods,
            lambda n: api.ok(
                "POST",
                f"/api/v1/namespaces/{NS}/pods/{n}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": n, "namespace": NS},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "node-00000"},
                },
            ),
        ),
    ]
    result = {"count": args.count, "threads": args.threads, "cpusAllowed": len(os.sched_getaffinity(0)), "phases": {}}
    for name, items, work in phases:
        before = {p: cpu_seconds(pid) for p, pid in pids.items()}
        start = time.monotonic()
        parallel(items, args.threads, work)
        wall = time.monotonic() - start
        after = {p: cpu_seconds(pid) for p, pid in pids.items()}
        apiserver = after["apiserver"] - before["apiserver"]
        etcd = after["etcd"] - before["etcd"]
        result["phases"][name] = {
            "seconds": round(wall, 3),
            "requestsPerSecond": round(args.count / wall, 1),
            "apiserverCpuMsPerRequest": round(apiserver * 1000 / args.count, 3),
            "etcdCpuMsPerRequest": round(etcd * 1000 / args.count, 3),
        }
        print(f"api_cost: {name}: {result['phases'][name]}", file=sys.stderr, flush=True)
    sample = api.ok("GET", f"{JOBS}/{names[0]}")
    result["trainingJobBytes"] = len(json.dumps(sample))
    result["trainingJobManagedFieldsBytes"] = len(json.dumps(sample["metadata"].get("managedFields", [])))
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
