#!/usr/bin/env python3
"""A real Prometheus against an installed vramfit release: it finds the
controller's and the agents' metrics endpoints the way an install does
(Kubernetes service discovery through the API server: the EndpointSlices of
the Services <release>-metrics and <release>-agent-metrics), and every query
of the Grafana dashboard (each panel's targets and the variables' queries)
must return data from its HTTP API.

  hack/prom-check.py start --kubeconfig K --dir D [--namespace NS] [--release R]
        write D/prometheus.yml, start Prometheus (hack/tools.sh prometheus, or
        --prometheus BIN) on a free loopback port, wait until it is ready
  hack/prom-check.py targets --dir D [--component agent|controller|all] [--wait S]
        wait until the component's jobs have targets and all of them are up;
        one PASS/FAIL line per target
  hack/prom-check.py query --dir D [--component agent|controller|all] [--wait S]
        run the dashboard's queries of that component (by the metrics each
        names: vramfit_agent_* are the agents') against /api/v1/query; one
        line per query: PASS (data), FAIL (an error, or no data), or NEEDS
        GPU / NEEDS EVENT where no data is what this cluster can have (below);
        --want-events asks the NEEDS EVENT ones again until the bound
  hack/prom-check.py wait --dir D --query Q [--at-least V] [--wait S] [--what TEXT]
        until the PromQL query Q returns at least V (default 1): a PASS or FAIL line
  hack/prom-check.py stop --dir D
        stop Prometheus and remove D

Grafana's variables are replaced as Grafana does with "All" selected: by the
values their own queries find, as a regex alternation; $__rate_interval by
1m (four scrape intervals and more), $__interval by the scrape interval,
$__range by the dashboard's time range.

No data is not a failure in two cases, each said on its own line, and only
when Prometheus itself shows the condition:
  NEEDS GPU    a per-GPU or per-pod series of the agents while they report no
               GPU at all (sum(vramfit_agent_gpus) == 0: a node without one),
               and the prediction error of finished attempts while none has
               been measured there (the measured peak comes from an agent's
               GPU; where agents report GPUs, that is a NEEDS EVENT);
  NEEDS EVENT  with GPUs, the per-pod series while no pod runs a process on
               them, the allocator's OOMs while no process publishes its
               counters, the probe's figures while no GPU was probed; the
               reconcile errors by kind while no reconcile has failed (each
               family has no series until the first such event).
Exits non-zero on any FAIL. Only the Python standard library.
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(REPO, "charts/vramfit/dashboards/vramfit.json")
SCRAPE_INTERVAL_S = 5
RATE_INTERVAL = "1m"
METRIC = re.compile(r"\bvramfit_[a-z0-9_]+")


def log(msg):
    print(f"prom-check: {msg}", file=sys.stderr, flush=True)


# --- Prometheus -------------------------------------------------------------


def config(kubeconfig, namespace, release):
    """Two scrape jobs, as the chart's ServiceMonitors set them up: each
    keeps the ready endpoints of one Service's `metrics` port; the job is
    named after the Service; the agents' keep their own labels (a per-pod
    series names the training pod in `namespace` and `pod`)."""

    def job(name, service, honor):
        return {
            "job_name": name,
            "honor_labels": honor,
            "kubernetes_sd_configs": [
                {
                    "role": "endpointslice",
                    "kubeconfig_file": kubeconfig,
                    "namespaces": {"names": [namespace]},
                }
            ],
            "relabel_configs": [
                {
                    "source_labels": [
                        "__meta_kubernetes_service_name",
                        "__meta_kubernetes_endpointslice_port_name",
                    ],
                    "regex": f"{service};metrics",
                    "action": "keep",
                },
                {
                    "source_labels": ["__meta_kubernetes_endpointslice_endpoint_conditions_ready"],
                    "regex": "true",
                    "action": "keep",
                },
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            ],
        }

    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL_S - 1}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "scrape_configs": [
            job("controller", f"{release}-metrics", False),
            job("agent", f"{release}-agent-metrics", True),
        ],
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state(dir_):
    with open(os.path.join(dir_, "state.json")) as f:
        return json.load(f)


def api(base, path, params=None, timeout=10):
    url = base + path
    if params:
        url += "?" + urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        try:
            body = json.load(e)
        except ValueError:
            return None, f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, str(e)
    if body.get("status") != "success":
        return None, f"{body.get('errorType', '?')}: {body.get('error', body)}"
    return body["data"], None


def start(args):
    prometheus = args.prometheus or subprocess.run(
        [os.path.join(REPO, "hack/tools.sh"), "prometheus"], check=True, capture_output=True, text=True
    ).stdout.strip()
    os.makedirs(args.dir, exist_ok=True)
    cfg = os.path.join(args.dir, "prometheus.yml")
    # JSON is YAML.
    with open(cfg, "w") as f:
        json.dump(config(os.path.abspath(args.kubeconfig), args.namespace, args.release), f, indent=2)
    port = free_port()
    logf = open(os.path.join(args.dir, "prometheus.log"), "w")
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={os.path.join(args.dir, 'data')}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=2h",
        ],
        stdout=logf,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    with open(os.path.join(args.dir, "state.json"), "w") as f:
        json.dump({"pid": proc.pid, "base": base, "started": time.time()}, f)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            log(f"Prometheus exited ({proc.returncode}): {tail(args.dir)}")
            return 1
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    info, _ = api(base, "/api/v1/status/buildinfo")
                    log(f"Prometheus {prometheus} ready on {base} (go {info and info.get('goVersion')}), config {cfg}")
                    return 0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    log(f"Prometheus not ready within 60s: {tail(args.dir)}")
    return 1


def tail(dir_, n=5):
    try:
        with open(os.path.join(dir_, "prometheus.log")) as f:
            return " | ".join(f.read().splitlines()[-n:])
    except OSError:
        return "(no log)"


def stop(args):
    try:
        pid = state(args.dir)["pid"]
    except (OSError, ValueError, KeyError):
        pid = None
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


# --- targets ----------------------------------------------------------------

JOBS = {"agent": ["agent"], "controller": ["controller"], "all": ["controller", "agent"]}


def targets(args):
    base = state(args.dir)["base"]
    deadline = time.time() + args.wait
    while True:
        data, err = api(base, "/api/v1/targets", {"state": "active"})
        found = {}
        for t in (data or {}).get("activeTargets", []):
            found.setdefault(t["scrapePool"], []).append(t)
        ok = not err and all(
            found.get(j) and all(t["health"] == "up" for t in found[j]) for j in JOBS[args.component]
        )
        if ok or time.time() >= deadline:
            break
        time.sleep(2)
    failed = 0
    for j in JOBS[args.component]:
        ts = found.get(j, [])
        if not ts:
            print(f"FAIL: Prometheus found no {j} target through the API server within {args.wait}s ({err or 'no ready endpoint'})")
            failed += 1
        for t in ts:
            labels = t["labels"]
            line = (
                f"{j} target {t['scrapeUrl']} (Service {labels.get('service')}, pod {labels.get('pod')}) "
                f"found through the API server"
            )
            if t["health"] == "up":
                print(f"PASS: {line}, up, scraped in {t['lastScrapeDuration'] * 1000:.0f} ms")
            else:
                print(f"FAIL: {line}, {t['health']}: {t.get('lastError')}")
                failed += 1
    return 1 if failed else 0


# --- the dashboard's queries ------------------------------------------------


def component_of(expr):
    names = METRIC.findall(expr)
    return "agent" if names and all(n.startswith("vramfit_agent_") for n in names) else "controller"


def dashboard_queries(path):
    """(what, expr) of every panel target, and the variables (name, query)."""
    with open(path) as f:
        d = json.load(f)
    queries = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    queries.append((f"panel {p.get('id')} \"{p.get('title')}\" {t.get('refId')}", t["expr"]))
            walk(p.get("panels", []))

    walk(d.get("panels", []))
    variables = [
        (v["name"], v["query"] if isinstance(v["query"], str) else v["query"].get("query", ""))
        for v in d.get("templating", {}).get("list", [])
        if v.get("type") == "query"
    ]
    time_from = d.get("time", {}).get("from", "now-6h")
    return queries, variables, time_from.removeprefix("now-")


LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),)?\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def promql_regex_literal(value):
    """`value` matched literally by a regex inside a PromQL string: each regex
    metacharacter behind a backslash, written `\\` in the string (as
    Grafana escapes a variable's values for Prometheus)."""
    return "".join("\\\\" + c if c in "\\^$.|?*+()[]{}" else c for c in value)


def substitute(expr, values, range_):
    """Grafana's replacements, "All" selected for each variable."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    expr = expr.replace("$__interval", f"{SCRAPE_INTERVAL_S}s")
    expr = expr.replace("$__range", range_)

    def var(m):
        name = m.group(1) or m.group(2)
        if name not in values:
            return m.group(0)
        vs = values[name]
        return "(" + "|".join(promql_regex_literal(v) for v in vs) + ")" if vs else ".+"

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", var, expr)


def has_data(result):
    """Series with at least one number (NaN is what a panel shows as no data)."""
    if result["resultType"] == "vector":
        return [s for s in result["result"] if not math.isnan(float(s["value"][1]))]
    if result["resultType"] == "scalar":
        return [] if math.isnan(float(result["result"][1])) else [{"metric": {}, "value": result["result"]}]
    return result["result"]


def scalar(base, expr):
    data, err = api(base, "/api/v1/query", {"query": expr})
    if err or not data["result"]:
        return None
    return float(data["result"][0]["value"][1])


def why_empty(base, names):
    """NEEDS GPU or NEEDS EVENT with the condition Prometheus shows, or None."""
    names = set(names)

    def absent(name):
        return scalar(base, f"count({name})") is None

    if any(n.startswith(("vramfit_agent_gpu_", "vramfit_agent_pod_")) for n in names):
        if scalar(base, "sum(vramfit_agent_gpus)") == 0:
            listed = ", ".join(sorted(n for n in names if n.startswith("vramfit_agent_")))
            return "NEEDS GPU", f"{listed}: the agents report no GPU (sum(vramfit_agent_gpus) = 0)"
        if any(n.startswith("vramfit_agent_pod_") for n in names) and absent("vramfit_agent_pod_memory_used_bytes"):
            return "NEEDS EVENT", "no pod runs a process on the agents' GPUs (no vramfit_agent_pod_memory_used_bytes series)"
        if "vramfit_agent_pod_allocator_ooms_total" in names and absent("vramfit_agent_pod_allocator_ooms_total"):
            return "NEEDS EVENT", "no pod's process publishes vramfit's allocator counters (its stats files)"
        if any(n.startswith("vramfit_agent_gpu_probe_") for n in names) and absent("vramfit_agent_gpu_probe_ok"):
            return "NEEDS EVENT", "no GPU probed (an agent with --no-probe, or built without the cuda feature)"
        return None
    if any(n.startswith("vramfit_prediction_error_ratio") for n in names):
        if scalar(base, "sum(vramfit_prediction_error_ratio_count)") == 0:
            # With GPUs the measured attempt is an event still to come.
            kind = "NEEDS EVENT" if (scalar(base, "sum(vramfit_agent_gpus)") or 0) > 0 else "NEEDS GPU"
            return kind, (
                "no finished attempt measured yet (sum(vramfit_prediction_error_ratio_count) = 0; "
                "the measured peak is an agent's reading of a GPU)"
            )
        return None
    if any(n.startswith("vramfit_reconcile_errors") for n in names) and absent("vramfit_reconcile_errors_total"):
        return "NEEDS EVENT", "no reconcile has failed (vramfit_reconcile_errors_total has no series until one does)"
    return None


def show(result):
    out = []
    for s in result[:3]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k not in ("__name__",))
        out.append(f"{{{labels}}} {float(s['value'][1]):.4g}")
    more = f" (+{len(result) - 3})" if len(result) > 3 else ""
    return "; ".join(out) + more


def query(args):
    base = state(args.dir)["base"]
    queries, variables, range_ = dashboard_queries(args.dashboard)
    deadline = time.time() + args.wait
    verdicts = {}
    values = {}

    def run_variables():
        for name, q in variables:
            if args.component != "all" and component_of(q) != args.component:
                continue
            m = LABEL_VALUES.match(q)
            if not m:
                verdicts[f"variable {name}"] = ("FAIL", q, f"not label_values(...): {q}")
                continue
            selector, label = m.group(1), m.group(2)
            params = {"match[]": substitute(selector, values, range_)} if selector else None
            data, err = api(base, f"/api/v1/label/{label}/values", params)
            if err:
                verdicts[f"variable {name}"] = ("FAIL", q, err)
            elif not data:
                verdicts[f"variable {name}"] = ("FAIL", q, "no values")
            else:
                values[name] = data
                verdicts[f"variable {name}"] = ("PASS", q, ", ".join(data))

    def run_queries():
        for what, expr in queries:
            if args.component != "all" and component_of(expr) != args.component:
                continue
            done = ("PASS", "NEEDS GPU") if args.want_events else ("PASS", "NEEDS GPU", "NEEDS EVENT")
            if verdicts.get(what, ("",))[0] in done:
                continue
            q = substitute(expr, values, range_)
            data, err = api(base, "/api/v1/query", {"query": q})
            if err:
                verdicts[what] = ("FAIL", q, err)
                continue
            series = has_data(data)
            if series:
                verdicts[what] = ("PASS", q, f"{len(series)} series: {show(series)}")
                continue
            why = why_empty(base, METRIC.findall(q))
            if why:
                verdicts[what] = (why[0], q, why[1])
            else:
                nan = " (NaN only)" if data["result"] else ""
                verdicts[what] = ("FAIL", q, f"no data{nan}")

    # Data arrives with the scrapes: a query that failed is asked again until
    # the bound.
    while True:
        run_variables()
        run_queries()
        waiting = ("FAIL", "NEEDS EVENT") if args.want_events else ("FAIL",)
        if time.time() >= deadline or all(v[0] not in waiting for v in verdicts.values()):
            break
        time.sleep(min(5, max(0, deadline - time.time())))

    counts = {}
    for what, (verdict, q, detail) in verdicts.items():
        counts[verdict] = counts.get(verdict, 0) + 1
        print(f"{verdict}: [{args.component}] {what}: {q} -> {detail}")
    for verdict in ("NEEDS GPU", "NEEDS EVENT"):
        listed = [w for w, v in verdicts.items() if v[0] == verdict]
        if listed:
            log(f"{verdict.lower()} ({len(listed)}): {'; '.join(listed)}")
    log(
        f"{args.component}: {counts.get('PASS', 0)} queries with data, {counts.get('FAIL', 0)} failed, "
        f"{counts.get('NEEDS GPU', 0)} need a GPU, {counts.get('NEEDS EVENT', 0)} need an event"
    )
    return 1 if counts.get("FAIL") else 0


def wait(args):
    """Until `query` returns a value of at least `at_least` (one PASS or FAIL line)."""
    base = state(args.dir)["base"]
    deadline = time.time() + args.wait
    started = time.time()
    while True:
        value = scalar(base, args.query)
        if value is not None and value >= args.at_least:
            print(f"PASS: {args.what}: {args.query} = {value:g} after {time.time() - started:.1f}s")
            return 0
        if time.time() >= deadline:
            print(f"FAIL: {args.what}: {args.query} = {value} (want at least {args.at_least:g}) after {args.wait:g}s")
            return 1
        time.sleep(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("start")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--namespace", default="vramfit-system")
    p.add_argument("--release", default="vramfit")
    p.add_argument("--prometheus", help="the binary (default: hack/tools.sh prometheus)")
    for name in ("targets", "query"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True)
        p.add_argument("--component", choices=["agent", "controller", "all"], default="all")
        p.add_argument("--wait", type=float, default=90, help="seconds to wait for targets or data")
        p.add_argument("--dashboard", default=DASHBOARD)
        if name == "query":
            p.add_argument("--want-events", action="store_true",
                           help="ask NEEDS EVENT queries again until the bound (where the events happen: jobs on GPUs)")
    p = sub.add_parser("wait")
    p.add_argument("--dir", required=True)
    p.add_argument("--query", required=True)
    p.add_argument("--at-least", type=float, default=1)
    p.add_argument("--what", default="Prometheus")
    p.add_argument("--wait", type=float, default=60)
    p = sub.add_parser("stop")
    p.add_argument("--dir", required=True)
    args = parser.parse_args()
    return {"start": start, "targets": targets, "query": query, "wait": wait, "stop": stop}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
