#!/usr/bin/env python3
"""The upstream kube-scheduler's throughput for extended resources, on the
same control plane and CPUs as the controller benchmark (benches/controller_scale.rs).

It registers NODES fake Nodes with GPUS `nvidia.com/gpu` each (no kubelet: the
Nodes are API objects only, as the controller benchmark's GpuNodes are),
starts kube-scheduler, creates PODS pods that each request one GPU as fast as
THREADS connections allow, and waits until every pod is bound. It reports the
pods bound per second from the first create to the last binding (the
controller benchmark's "jobs/s from apply to pod created"), the API requests
per pod by verb and resource (`apiserver_request_total`), and the CPU seconds
of kube-apiserver, etcd, kube-scheduler and this driver.

    upstream_scheduler.py --dir CONTROLPLANE_DIR --scheduler KUBE_SCHEDULER \
        [--nodes 200] [--gpus 8] [--pods 2000] [--threads 8] [--qps 5000]

CONTROLPLANE_DIR is what `hack/controlplane.sh up --dir D` started (its
ports, pid files and pki/). One JSON object goes to stdout; progress to stderr.
Standard library only.
"""

import argparse
import http.client
import json
import multiprocessing
import os
import queue
import re
import ssl
import subprocess
import sys
import threading
import time

NAMESPACE = "default"
GPU = "nvidia.com/gpu"


def log(message):
    print(f"upstream_scheduler: {message}", file=sys.stderr, flush=True)


class Api:
    """One keep-alive HTTPS connection to the API server per thread."""

    def __init__(self, port, pki):
        self.port = port
        self.context = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.context.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))
        self.local = threading.local()

    def connection(self):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=60)
            self.local.conn = conn
        return conn

    def request(self, method, path, body=None, content_type="application/json"):
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        for attempt in range(3):
            conn = self.connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                return response.status, payload
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def ok(self, method, path, body=None, content_type="application/json"):
        status, payload = self.request(method, path, body, content_type)
        if status >= 300:
            raise SystemExit(f"{method} {path}: HTTP {status}: {payload[:500].decode(errors='replace')}")
        return json.loads(payload) if payload else None


def connect(folder):
    """The API server of the control plane `hack/controlplane.sh up --dir
    folder` started, and the pids of its kube-apiserver and etcd."""
    with open(os.path.join(folder, "ports")) as f:
        port = int(f.read().split()[2])
    pids = {}
    for process in ("apiserver", "etcd"):
        with open(os.path.join(folder, f"{process}.pid")) as f:
            pids[process] = int(f.read().strip())
    return Api(port, os.path.join(folder, "pki")), pids


def node(name, gpus):
    resources = {"cpu": "128", "memory": "1024Gi", "pods": "250", GPU: str(gpus)}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        },
    }


def pod(name):
    requests = {"cpu": "100m", "memory": "128Mi", GPU: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "burst"}},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": requests, "limits": {GPU: "1"}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def cpu_seconds(pid):
    """User + system CPU of a process and its waited-for children."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks


def requests_by_kind(api):
    """apiserver_request_total summed by (verb, resource, subresource)."""
    status, payload = api.request("GET", "/metrics")
    if status != 200:
        raise SystemExit(f"GET /metrics: HTTP {status}")
    totals = {}
    line_re = re.compile(r"^apiserver_request_total\{(.*)\} ([0-9.e+]+)$")
    label_re = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
    for line in payload.decode().splitlines():
        m = line_re.match(line)
        if not m:
            continue
        labels = dict(label_re.findall(m.group(1)))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        totals[key] = totals.get(key, 0) + float(m.group(2))
    return totals


def watch_bindings(port, pki, resource_version, names, results):
    """Follows the pods' watch and records when each of `names` first shows a
    node; puts ({name: (monotonic time, node)}, its CPU seconds) on `results`.
    Runs in a process of its own, so the creating threads do not hold it up
    (the API server closes a watch that falls behind); a watch that ends is
    resumed from the last resourceVersion seen."""
    api = Api(port, pki)
    bound = {}
    try:
        while len(bound) < len(names):
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=api.context, timeout=600)
            conn.request(
                "GET",
                f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&labelSelector=app%3Dburst"
                f"&resourceVersion={resource_version}&allowWatchBookmarks=true",
                headers={"Accept": "application/json"},
            )
            response = conn.getresponse()
            if response.status != 200:
                raise SystemExit(f"watch pods: HTTP {response.status}")
            while len(bound) < len(names):
                line = response.readline()
                if not line:
                    break
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    raise SystemExit(f"watch pods: {event.get('object')}")
                obj = event.get("object", {})
                resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
                name = obj.get("metadata", {}).get("name")
                if name in names and name not in bound and obj.get("spec", {}).get("nodeName"):
                    bound[name] = (time.monotonic(), obj["spec"]["nodeName"])
            conn.close()
        results.put((bound, time.process_time(), None))
    except BaseException as error:  # noqa: BLE001 - reported by the main process
        results.put((bound, time.process_time(), repr(error)))


def parallel(items, threads, work):
    """Runs work(item) over items from `threads` threads, in order of items."""
    lock = threading.Lock()
    it = iter(items)
    errors = []

    def run():
        while True:
            with lock:
                item = next(it, None)
            if item is None or errors:
                return
            try:
                work(item)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)
                return

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="the control plane's folder (hack/controlplane.sh up --dir)")
    parser.add_argument("--scheduler", required=True, help="the kube-scheduler binary")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument(
        "--replicas",
        type=int,
        default=2,
        help="each GPU advertised this many times, as the NVIDIA device plugin's time-slicing does, "
        "so that 2,000 one-GPU pods fit 200 x 8 GPUs as the controller benchmark's shared GPUs do",
    )
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--qps", type=int, default=5000, help="kube-scheduler's client QPS and burst")
    parser.add_argument(
        "--json",
        action="store_true",
        help="kube-scheduler talks JSON to the API server instead of its default protobuf "
        "(custom resources such as TrainingJobs are JSON only)",
    )
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    if min(args.nodes, args.gpus, args.replicas, args.pods, args.threads, args.qps) < 1:
        parser.error("--nodes, --gpus, --replicas, --pods, --threads and --qps must be positive")
    slots = args.gpus * args.replicas
    # One slot goes to the warm-up pod.
    if args.pods > args.nodes * slots - 1:
        parser.error(f"--pods {args.pods} exceeds the {args.nodes * slots - 1} free GPU slots of the nodes")

    api, pids = connect(args.dir)
    port = api.port

    log(f"registering {args.nodes} nodes with {args.gpus} GPUs x {args.replicas} = {slots} {GPU} each")
    names = [f"node-{i:05d}" for i in range(args.nodes)]

    def register(name):
        api.ok("POST", "/api/v1/nodes", node(name, slots))
        # The API server's TaintNodesByCondition admission taints a new Node
        # not-ready, and the node lifecycle controller (not run here) lifts it
        # once the kubelet reports Ready: lift it as that controller would.
        got = api.ok("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, "application/merge-patch+json")
        if got.get("status", {}).get("allocatable", {}).get(GPU) != str(slots):
            # The create kept no status: write it.
            api.ok(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": node(name, slots)["status"]},
                "application/merge-patch+json",
            )

    parallel(names, args.threads, register)

    config = os.path.join(args.dir, "scheduler.yaml")
    with open(config, "w") as f:
        f.write(
            "apiVersion: kubescheduler.config.k8s.io/v1\n"
            "kind: KubeSchedulerConfiguration\n"
            f"clientConnection: {{kubeconfig: {os.path.join(args.dir, 'kubeconfig')}, qps: {args.qps}, burst: {args.qps}, "
            f"contentType: {'application/json' if args.json else 'application/vnd.kubernetes.protobuf'}}}\n"
            "leaderElection: {leaderElect: false}\n"
        )
    scheduler_log = open(os.path.join(args.dir, "scheduler.log"), "w")
    scheduler = subprocess.Popen(
        [args.scheduler, "--config", config, "--secure-port", "0", "-v", "1"],
        stdout=scheduler_log,
        stderr=subprocess.STDOUT,
    )
    try:
        # One pod first: the scheduler is up and its caches are synced once it binds.
        api.ok("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod("warmup"))
        deadline = time.monotonic() + 120
        while not api.ok("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/warmup")["spec"].get("nodeName"):
            if scheduler.poll() is not None:
                raise SystemExit(f"kube-scheduler exited ({scheduler.returncode}); see {args.dir}/scheduler.log")
            if time.monotonic() > deadline:
                raise SystemExit("the warm-up pod was not bound within 120 s")
            time.sleep(0.2)
        log("kube-scheduler bound the warm-up pod")
        time.sleep(2)

        listed = api.ok("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3Dburst&limit=1")
        resource_version = listed["metadata"]["resourceVersion"]
        pod_names = [f"burst-{i:06d}" for i in range(args.pods)]
        results = multiprocessing.Queue()
        watcher = multiprocessing.Process(
            target=watch_bindings,
            args=(port, os.path.join(args.dir, "pki"), resource_version, set(pod_names), results),
            daemon=True,
        )
        watcher.start()
        time.sleep(0.5)

        before = requests_by_kind(api)
        cpu_before = {p: cpu_seconds(pid) for p, pid in pids.items()}
        cpu_before["scheduler"] = cpu_seconds(scheduler.pid)
        driver_before = time.process_time()
        log(f"creating {args.pods} pods from {args.threads} connections")
        start = time.monotonic()
        parallel(pod_names, args.threads, lambda n: api.ok("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(n)))
        created = time.monotonic()
        log(f"created in {created - start:.1f} s; waiting for the bindings")
        try:
            bound, watcher_cpu, watch_error = results.get(timeout=args.timeout)
        except queue.Empty:
            raise SystemExit(f"not every pod was bound within {args.timeout} s") from None
        if watch_error:
            raise SystemExit(f"the pod watch failed after {len(bound)} bindings: {watch_error}")
        last = max(t for t, _ in bound.values())
        driver_cpu = time.process_time() - driver_before + watcher_cpu
        cpu_after = {p: cpu_seconds(pid) for p, pid in pids.items()}
        cpu_after["scheduler"] = cpu_seconds(scheduler.pid)
        after = requests_by_kind(api)
    finally:
        scheduler.terminate()
        try:
            scheduler.wait(10)
        except subprocess.TimeoutExpired:
            scheduler.kill()

    per_node = {}
    for _, node_name in bound.values():
        per_node[node_name] = per_node.get(node_name, 0) + 1
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta = {k: v for k, v in delta.items() if v > 0}
    # The driver's own reads (/metrics) are not requests of the pods' path.
    pod_path = {k: v for k, v in delta.items() if not (k[0] == "GET" and k[1] == "")}
    seconds = last - start
    result = {
        "scheduler": "kube-scheduler",
        "nodes": args.nodes,
        "gpusPerNode": args.gpus,
        "replicasPerGpu": args.replicas,
        "pods": args.pods,
        "bound": len(bound),
        "threads": args.threads,
        "schedulerQps": args.qps,
        "schedulerContentType": "json" if args.json else "protobuf",
        "secondsToAllBound": round(seconds, 3),
        "podsPerSecond": round(args.pods / seconds, 1),
        "createsTook": round(created - start, 3),
        "apiRequestsPerPod": round(sum(pod_path.values()) / args.pods, 2),
        "apiRequests": {" ".join(p for p in k if p): v for k, v in sorted(pod_path.items())},
        "apiserverCpuSeconds": round(cpu_after["apiserver"] - cpu_before["apiserver"], 2),
        "etcdCpuSeconds": round(cpu_after["etcd"] - cpu_before["etcd"], 2),
        "schedulerCpuSeconds": round(cpu_after["scheduler"] - cpu_before["scheduler"], 2),
        "driverCpuSeconds": round(driver_cpu, 2),
        "nodesOverCapacity": sum(1 for n in per_node.values() if n > slots),
        "cpusAllowed": len(os.sched_getaffinity(0)),
    }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
