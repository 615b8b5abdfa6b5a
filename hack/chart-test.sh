#!/usr/bin/env bash
# Checks of charts/vramfit: the CRDs match crds/, every value is documented,
# helm lint, the schema refuses bad values, the agent's NRI sidecar as
# rendered (probes, the socket's folder mounted into it alone), the agent's
# metrics as rendered (port, probes, headless Service, ServiceMonitor), the rendered manifests pass
# `kubectl apply --dry-run=server` against the local control plane, each
# ServiceAccount can do what it needs and nothing it must not (`kubectl auth can-i`),
# and a real `helm install`, `helm upgrade` and `helm uninstall` leave what they
# should (kube-controller-manager and kube-scheduler running, no kubelet: the
# pods stay Pending).
#
#   hack/chart-test.sh                  start a control plane of its own (with --controllers), check, stop it
#   KUBECONFIG=... hack/chart-test.sh --kubeconfig K   use a running scratch control plane
#                                       (`hack/controlplane.sh up --controllers`; its vramfit CRDs are replaced)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
chart=charts/vramfit
ns=vramfit-system
release=vramfit

log() { printf 'chart-test: %s\n' "$*" >&2; }
fail() { printf 'chart-test: FAIL: %s\n' "$*" >&2; exit 1; }

kubeconfig=
if [[ ${1:-} == --kubeconfig ]]; then kubeconfig=$2; fi

helm=$(hack/tools.sh helm)
# The version of the local control plane (hack/controlplane); helm built from
# source otherwise assumes an old one.
kube_version=1.34.4
passed=0

log "chart CRDs are crds/ (regenerate with \`cargo run -- crdgen\`)"
diff -r crds "$chart/crds" >/dev/null || fail "$chart/crds differs from crds/: run \`cargo run -- crdgen\` (it writes both)"
passed=$((passed + 1))

log "every value in values.schema.json is documented in the chart README"
python3 - "$chart" <<'EOF'
import json, sys
chart = sys.argv[1]
schema = json.load(open(f"{chart}/values.schema.json"))
readme = open(f"{chart}/README.md").read()
missing = []
def walk(node, path):
    props = node.get("properties")
    if node.get("type") == "object" and props:
        for key, sub in props.items():
            walk(sub, f"{path}.{key}" if path else key)
    elif path and path != "global" and f"`{path}`" not in readme:
        missing.append(path)
walk(schema, "")
if missing:
    sys.exit("undocumented values: " + ", ".join(missing))
EOF
passed=$((passed + 1))

log "helm lint"
"$helm" lint --strict --kube-version "$kube_version" "$chart" >/dev/null ||
  { "$helm" lint --strict --kube-version "$kube_version" "$chart"; fail "helm lint"; }
"$helm" lint --strict --kube-version "$kube_version" "$chart" --set serviceMonitor.enabled=true --set controller.watchNamespace=ml \
  --set agent.gpuAccess=cdi --set agent.simulate=2xH200 --set controller.elasticDefault=true >/dev/null || fail "helm lint (all options on)"
# Rendered into a variable first: `helm template | grep -q` under pipefail
# fails whenever grep exits before helm has written everything (SIGPIPE).
rendered=$("$helm" template "$release" "$chart" --kube-version "$kube_version" --set controller.elasticDefault=true)
grep -qx -- "        - --elastic-default" <<<"$rendered" || fail "controller.elasticDefault does not pass --elastic-default"
rendered=$("$helm" template "$release" "$chart" --kube-version "$kube_version")
! grep -q -- "--elastic-default" <<<"$rendered" || fail "--elastic-default passed without controller.elasticDefault"
! grep -q -- "--default-gpu-compute-percent" <<<"$rendered" || fail "--default-gpu-compute-percent passed without controller.defaultGpuComputePercent"
rendered=$("$helm" template "$release" "$chart" --kube-version "$kube_version" --set controller.defaultGpuComputePercent=60)
grep -qx -- "        - --default-gpu-compute-percent=60" <<<"$rendered" ||
  fail "controller.defaultGpuComputePercent does not pass --default-gpu-compute-percent"
passed=$((passed + 1))

log "the schema and the templates refuse bad values"
# refuse WHAT ERROR-TEXT HELM-ARGS...: helm must fail, and for that reason.
refuse() {
  local why=$1 expect=$2 err
  shift 2
  if err=$("$helm" template "$release" "$chart" --kube-version "$kube_version" "$@" 2>&1 >/dev/null); then
    fail "helm template accepted $* ($why)"
  fi
  grep -qF -- "$expect" <<<"$err" || fail "helm template refused $* for another reason than $why: $err"
}
refuse "unknown policy" "/controller/policy" --set controller.policy=fastest
refuse "elasticDefault not a boolean" "/controller/elasticDefault" --set controller.elasticDefault=yes
refuse "a compute share over 100 %" "/controller/defaultGpuComputePercent" --set controller.defaultGpuComputePercent=150
refuse "misspelt value" "additional properties 'replica' not allowed" --set controller.replica=3
refuse "relative kubelet root" "/kubeletRoot" --set kubeletRoot=var/lib/kubelet
refuse "two active controllers" "needs controller.leaderElection" --set controller.leaderElection=false
refuse "unknown GPU access" "/agent/gpuAccess" --set agent.gpuAccess=privileged
refuse "/ui off loopback without authentication" "is off loopback: /ui would show every namespace" \
  --set controller.ui.address=0.0.0.0:8081
refuse "/ui on the metrics port" "give /ui a port of its own" \
  --set controller.ui.authentication=kubernetes --set controller.ui.address=0.0.0.0:8080
refuse "unknown /ui authentication" "/controller/ui/authentication" --set controller.ui.authentication=basic
refuse "ServiceMonitor without a Service" "needs metrics.service.enabled" \
  --set serviceMonitor.enabled=true --set metrics.service.enabled=false
"$helm" template "$release" "$chart" --kube-version "$kube_version" --set controller.leaderElection=false \
  --set controller.replicas=1 >/dev/null || fail "one replica without leader election was refused"
passed=$((passed + 1))

render() { "$helm" template "$release" "$chart" --kube-version "$kube_version" --namespace "$ns" "$@"; }

log "the agent reads the stats emptyDirs under the kubelet root, read-only"
out=$(render --set kubeletRoot=/srv/kubelet/)
grep -q -- '- --kubelet-root=/srv/kubelet$' <<<"$out" || fail "the agent's --kubelet-root is not /srv/kubelet"
grep -q 'path: /srv/kubelet/pods$' <<<"$out" || fail "the agent's hostPath is not <kubeletRoot>/pods"
grep -q -- '--stats-root' <<<"$out" && fail "a --stats-root is still passed"
passed=$((passed + 1))

log "controller on the host network: the rollout frees a pod's ports before its replacement comes"
out=$(render)
grep -q 'maxSurge: 0' <<<"$out" && fail "maxSurge 0 without hostNetwork"
out=$(render --set controller.hostNetwork=true)
grep -q 'maxSurge: 0' <<<"$out" || fail "no maxSurge 0 with controller.hostNetwork (a surge pod would wait for the old pod's ports)"
grep -q 'maxUnavailable: 1' <<<"$out" || fail "no maxUnavailable 1 with controller.hostNetwork"
passed=$((passed + 1))

log "/ui: loopback and no authentication by default; behind TokenReview and SubjectAccessReview on request"
out=$(render)
grep -q -- '- --ui-addr=127.0.0.1:8081$' <<<"$out" || fail "the default /ui is not on loopback"
grep -q -- '- --ui-auth=none$' <<<"$out" || fail "the default /ui authentication is not none"
grep -q 'name: system:auth-delegator' <<<"$out" && fail "auth-delegator bound without /ui authentication"
out=$(render --set controller.ui.authentication=kubernetes --set controller.ui.address=0.0.0.0:8081 \
  --set 'controller.ui.tokenAudiences={vramfit-ui}')
grep -q -- '- --ui-auth=kubernetes$' <<<"$out" || fail "no --ui-auth=kubernetes"
grep -q -- '- --ui-token-audience=vramfit-ui$' <<<"$out" || fail "no --ui-token-audience"
grep -q 'name: system:auth-delegator' <<<"$out" || fail "the controller is not bound to system:auth-delegator"
grep -q "name: $release-vramfit-ui\$\|name: $release-ui\$" <<<"$out" || fail "no /ui Service with the address off loopback"
grep -q 'containerPort: 8081' <<<"$out" || fail "no ui container port"
passed=$((passed + 1))

log "the agent reaches the GPUs as configured"
out=$(render)
grep -q 'cdi.k8s.io/vramfit-agent: "nvidia.com/gpu=all"' <<<"$out" || fail "no CDI annotation for every GPU by default"
grep -q 'runtimeClassName' <<<"$out" && fail "runtimeClassName set by default (gpuAccess cdi)"
out=$(render --set 'agent.cdiDevices={nvidia.com/gpu=0,nvidia.com/gpu=1}')
grep -q 'cdi.k8s.io/vramfit-agent: "nvidia.com/gpu=0,nvidia.com/gpu=1"' <<<"$out" || fail "no CDI annotation"
out=$(render --set agent.gpuAccess=runtimeClass --set nri.enabled=false)
grep -q 'runtimeClassName: nvidia' <<<"$out" || fail "no runtimeClassName with gpuAccess=runtimeClass"
grep -q 'cdi.k8s.io/vramfit-agent' <<<"$out" && fail "a CDI annotation with gpuAccess=runtimeClass"
# The plugin sets NVIDIA_VISIBLE_DEVICES=void on whatever it gives no device:
# the NVIDIA runtime would give the agent nothing.
refuse "the NVIDIA runtime beside the NRI plugin" "agent.gpuAccess=runtimeClass with nri.enabled" \
  --set agent.gpuAccess=runtimeClass
# How an admin replaces the default label: null removes it (Helm merges maps).
out=$(render -f <(printf 'agent:\n  nodeSelector:\n    nvidia.com/gpu.present: null\n    pool: a100\n') \
  --show-only templates/agent-daemonset.yaml)
grep -A1 'nodeSelector:' <<<"$out" | grep -q 'pool: a100' || fail "agent.nodeSelector is not the DaemonSet's"
grep -q 'gpu.present' <<<"$out" && fail "a null nodeSelector entry kept the default label"
passed=$((passed + 1))

log "the NRI plugin: a native sidecar of the agent with its probes, the socket's folder mounted into it alone"
# nri_check EXPECT HELM-ARGS...: the agent DaemonSet as rendered with HELM-ARGS
# must have the sidecar as EXPECT says (JSON: socket, namespace or null,
# index, name; or null for no sidecar).
nri_check() {
  local expect=$1 rendered
  shift
  rendered=$(render --show-only templates/agent-daemonset.yaml "$@")
  RENDERED=$rendered python3 - "$expect" "$@" <<'EOF' || fail "the NRI sidecar"
import json, os, sys
import yaml
expect = json.loads(sys.argv[1])
pod = yaml.safe_load(os.environ["RENDERED"])["spec"]["template"]["spec"]
inits = pod.get("initContainers") or []
volumes = {v["name"]: v for v in pod.get("volumes", [])}
[agent] = [c for c in pod["containers"] if c["name"] == "agent"]
def fail(why):
    sys.exit(f"{why} (rendered with {sys.argv[2:]})")
if expect is None:
    if inits or "nri-socket" in volumes:
        fail("an NRI sidecar or socket volume without the plugin")
    sys.exit(0)
if [c["name"] for c in inits] != ["nri-cdi"]:
    fail(f"init containers {[c['name'] for c in inits]}, want the sidecar nri-cdi alone")
[nri] = inits
if nri.get("restartPolicy") != "Always":
    fail("nri-cdi is not a native sidecar (restartPolicy Always)")
if nri["image"] != agent["image"]:
    fail(f"nri-cdi runs {nri['image']}, not the agent image {agent['image']}")
ready = "/run/vramfit-nri/ready"
probe = ["/usr/local/bin/vramfit-nri-cdi", "--probe", "--ready-file=" + ready]
for kind in ("startupProbe", "readinessProbe"):
    if nri.get(kind, {}).get("exec", {}).get("command") != probe:
        fail(f"nri-cdi {kind}: {nri.get(kind)}, want exec {probe}")
if nri["startupProbe"]["failureThreshold"] * nri["startupProbe"]["periodSeconds"] <= 60:
    fail("the startup probe gives up before the plugin does")
args = nri["command"] + nri["args"]
for a in ["/usr/local/bin/vramfit-nri-cdi", "--socket=/var/run/nri/" + os.path.basename(expect["socket"]),
          "--plugin-name=" + expect["name"], "--plugin-index=" + expect["index"], "--ready-file=" + ready]:
    if a not in args:
        fail(f"nri-cdi has no {a}: {args}")
ns = [a for a in args if a.startswith("--agent-namespace")]
if ns != ([f"--agent-namespace={expect['namespace']}"] if expect["namespace"] else []):
    fail(f"nri-cdi agent namespaces {ns}, want {expect['namespace']}")
mounts = {m["name"]: m["mountPath"] for m in nri["volumeMounts"]}
if mounts.get("nri-socket") != "/var/run/nri":
    fail(f"nri-cdi mounts {mounts}: no socket folder at /var/run/nri")
if mounts.get("nri-ready") != os.path.dirname(ready):
    fail(f"nri-cdi mounts {mounts}: no writable folder for its ready file")
host = volumes["nri-socket"].get("hostPath", {})
if host != {"path": os.path.dirname(expect["socket"]), "type": "Directory"}:
    fail(f"the socket volume is {host}, want the folder of {expect['socket']}")
if "emptyDir" not in volumes["nri-ready"]:
    fail("the ready file's folder is not an emptyDir")
if any(m["name"] == "nri-socket" for m in agent.get("volumeMounts", [])):
    fail("the agent container mounts the NRI socket")
caps = nri["securityContext"].get("capabilities", {})
if caps.get("drop") != ["ALL"] or caps.get("add"):
    fail(f"nri-cdi keeps capabilities: {nri['securityContext']}")
EOF
}
nri_check '{"socket": "/var/run/nri/nri.sock", "namespace": "vramfit-system", "index": "10", "name": "vramfit-cdi"}'
nri_check '{"socket": "/var/lib/vramfit-node/nri/nri.sock", "namespace": null, "index": "05", "name": "gpus"}' \
  --set agent.gpuAccess=none --set nri.socket=/var/lib/vramfit-node/nri/nri.sock \
  --set-string nri.pluginIndex=05 --set nri.pluginName=gpus
nri_check null --set nri.enabled=false
nri_check null --set agent.simulate=2xH200
# The shipped agent image has no simulated node: agent.simulate runs
# agent.simulateImage, and only then.
out=$(render --show-only templates/agent-daemonset.yaml)
grep -q 'image: vramfit-agent:' <<<"$out" || fail "the agent does not run agent.image"
grep -q 'vramfit-agent-sim' <<<"$out" && fail "the agent runs the simulator's image without agent.simulate"
out=$(render --show-only templates/agent-daemonset.yaml --set agent.simulate=2xH200 --set agent.simulateImage.tag=t)
grep -q 'image: vramfit-agent-sim:t$' <<<"$out" || fail "agent.simulate does not run agent.simulateImage"
grep -q -- '- --simulate=2xH200' <<<"$out" || fail "agent.simulate passes no --simulate"
out=$(render --show-only templates/agent-daemonset.yaml)
grep -q 'kubectl.kubernetes.io/default-container: agent' <<<"$out" || fail "kubectl does not default to the agent container"
refuse "a relative NRI socket" "/nri/socket" --set nri.socket=nri.sock
refuse "a one-digit plugin index" "/nri/pluginIndex" --set-string nri.pluginIndex=1
refuse "a plugin index as a number" "/nri/pluginIndex" --set nri.pluginIndex=10
refuse "a negative reconnect timeout" "/nri/reconnectTimeoutSeconds" --set nri.reconnectTimeoutSeconds=-1
passed=$((passed + 1))

log "the agent's metrics: its port, --metrics-addr, probes on /healthz, a headless Service, the agents' ServiceMonitor"
# metrics_check PORT HELM-ARGS...: the agent as rendered with HELM-ARGS serves
# /metrics on PORT (0: nothing of it rendered), with the ServiceMonitors on.
metrics_check() {
  local port=$1 rendered
  shift
  rendered=$(render --set serviceMonitor.enabled=true "$@")
  RENDERED=$rendered python3 - "$port" "$@" <<'EOF2' || fail "the agent's metrics"
import os, sys
import yaml
port = int(sys.argv[1])
docs = [d for d in yaml.safe_load_all(os.environ["RENDERED"]) if d]
def fail(why):
    sys.exit(f"{why} (rendered with {sys.argv[2:]})")
def one(kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found[0] if found else None
ds = one("DaemonSet", "vramfit-agent")
[agent] = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
svc = one("Service", "vramfit-agent-metrics")
mon = one("ServiceMonitor", "vramfit-agent")
addr = [a for a in agent["args"] if a.startswith("--metrics-addr")]
if port == 0:
    if addr or agent.get("ports") or agent.get("livenessProbe") or svc or mon:
        fail("agent.metricsPort=0 still renders a metrics port, flag, probe, Service or ServiceMonitor")
    sys.exit(0)
if addr != [f"--metrics-addr=0.0.0.0:{port}"]:
    fail(f"the agent's --metrics-addr is {addr}, want 0.0.0.0:{port}")
if agent.get("ports") != [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]:
    fail(f"the agent's ports are {agent.get('ports')}")
for kind in ("livenessProbe", "readinessProbe"):
    get = agent.get(kind, {}).get("httpGet")
    if get != {"path": "/healthz", "port": "metrics"}:
        fail(f"the agent's {kind} is {agent.get(kind)}, want GET /healthz on the metrics port")
if svc is None:
    fail("no Service vramfit-agent-metrics")
if svc["spec"].get("clusterIP") != "None":
    fail("the agents' metrics Service is not headless")
if svc["spec"]["ports"] != [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]:
    fail(f"the agents' metrics Service ports: {svc['spec']['ports']}")
pod_labels = ds["spec"]["template"]["metadata"]["labels"]
if any(pod_labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
    fail(f"the Service selects {svc['spec']['selector']}, the agent pods are {pod_labels}")
if mon is None:
    fail("no ServiceMonitor vramfit-agent with serviceMonitor.enabled")
if any(svc["metadata"]["labels"].get(k) != v for k, v in mon["spec"]["selector"]["matchLabels"].items()):
    fail("the agents' ServiceMonitor does not select their Service")
[ep] = mon["spec"]["endpoints"]
if ep.get("port") != "metrics" or ep.get("path") != "/metrics" or ep.get("honorLabels") is not True:
    fail(f"the agents' ServiceMonitor endpoint: {ep}")
ctl = one("ServiceMonitor", "vramfit-controller")
if ctl is None or ctl["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component") != "controller":
    fail("the controller's ServiceMonitor is gone or selects the agents")
EOF2
}
metrics_check 9465
metrics_check 19465 --set agent.metricsPort=19465 --set agent.hostNetwork=true
metrics_check 0 --set agent.metricsPort=0
out=$(render --set metrics.agentService.enabled=false --set serviceMonitor.enabled=true)
grep -q 'name: vramfit-agent-metrics$' <<<"$out" && fail "metrics.agentService.enabled=false still renders the Service"
grep -q 'name: vramfit-agent$' <<<"$(grep -A3 'kind: ServiceMonitor' <<<"$out")" &&
  fail "a ServiceMonitor for an agents' Service that is not there"
grep -q -- '--metrics-addr=0.0.0.0:9465' <<<"$out" || fail "without the Service the agent no longer serves its metrics"
out=$(render --set agent.enabled=false --set serviceMonitor.enabled=true)
grep -q 'vramfit-agent-metrics' <<<"$out" && fail "agent.enabled=false still renders the agents' metrics Service"
refuse "an agent metrics port out of range" "/agent/metricsPort" --set agent.metricsPort=70000
refuse "a negative agent metrics port" "/agent/metricsPort" --set agent.metricsPort=-1
passed=$((passed + 1))

log "apiServer sets KUBERNETES_SERVICE_HOST/PORT in both containers, nothing by default"
out=$(render)
grep -q 'KUBERNETES_SERVICE_' <<<"$out" && fail "KUBERNETES_SERVICE_* set by default"
out=$(render --set apiServer.host=10.89.0.1 --set apiServer.port=6443)
[[ $(grep -A1 -c 'name: KUBERNETES_SERVICE_HOST$' <<<"$out") == 2 ]] || fail "KUBERNETES_SERVICE_HOST is not in both containers"
[[ $(grep -A1 'name: KUBERNETES_SERVICE_HOST$' <<<"$out" | grep -c 'value: "10.89.0.1"') == 2 ]] || fail "KUBERNETES_SERVICE_HOST is not apiServer.host"
[[ $(grep -A1 'name: KUBERNETES_SERVICE_PORT$' <<<"$out" | grep -c 'value: "6443"') == 2 ]] || fail "KUBERNETES_SERVICE_PORT is not apiServer.port"
refuse "a host without a port" "apiServer.host needs apiServer.port" --set apiServer.host=10.89.0.1
refuse "a port out of range" "/apiServer/port" --set apiServer.host=10.89.0.1 --set apiServer.port=70000
passed=$((passed + 1))

# --- against the API server ---------------------------------------------------
own_cp=
if [[ -z $kubeconfig ]]; then
  own_cp=$(mktemp -d /tmp/vramfit-chart-cp.XXXXXX)
  trap 'hack/controlplane.sh down --dir "$own_cp"; rm -rf "$own_cp"' EXIT
  kubeconfig=$(hack/controlplane.sh up --controllers --dir "$own_cp")
fi
export KUBECONFIG=$kubeconfig
k() { kubectl "$@"; }

k create namespace "$ns" --dry-run=client -o yaml | k apply -f - >/dev/null
k create namespace ml --dry-run=client -o yaml | k apply -f - >/dev/null
k create namespace other --dry-run=client -o yaml | k apply -f - >/dev/null

log "helm template | kubectl apply --dry-run=server (CRDs installed first, as helm does)"
k apply --server-side --force-conflicts -f "$chart/crds" >/dev/null
k wait --for condition=established --timeout=60s crd/trainingjobs.vramfit.dev crd/gpunodes.vramfit.dev >/dev/null
render | k apply --dry-run=server -f - >/dev/null || fail "the default rendering is refused by the API server"
render --set controller.watchNamespace=ml --set agent.gpuAccess=cdi --set agent.simulate=2xH200 |
  k apply --dry-run=server -f - >/dev/null || fail "the namespaced rendering is refused by the API server"
passed=$((passed + 1))

# Applies a rendering for real (no kubelet: nothing runs; the RBAC is what counts).
apply_release() {
  render "$@" | k apply -f - >/dev/null
}

can() {
  local who=$1
  shift
  k auth can-i --as "system:serviceaccount:$ns:$release-$who" "$@" >/dev/null 2>&1
}
must() { can "$@" || fail "$1 cannot: ${*:2}"; }
mustnt() { ! can "$@" || fail "$1 can, and must not: ${*:2}"; }

log "kubectl auth can-i as each ServiceAccount (all namespaces)"
apply_release
for verb in get list watch patch; do must controller "$verb" trainingjobs.vramfit.dev -n ml; done
must controller patch trainingjobs.vramfit.dev -n ml --subresource=status
for verb in get list watch create delete; do must controller "$verb" pods -n ml; done
must controller get pods -n ml --subresource=log
must controller get configmaps -n ml
must controller create configmaps -n ml
must controller create events.events.k8s.io -n ml
must controller patch events.events.k8s.io -n ml
for verb in list watch; do
  must controller "$verb" gpunodes.vramfit.dev
  must controller "$verb" nodes
done
for verb in get list watch create patch; do must controller "$verb" leases.coordination.k8s.io -n "$ns"; done
mustnt controller get leases.coordination.k8s.io -n ml
mustnt controller get secrets -n ml
mustnt controller list secrets -n "$ns"
mustnt controller create pods -n ml --subresource=exec
mustnt controller update pods -n ml
mustnt controller list configmaps -n ml
must controller patch gpunodes.vramfit.dev --subresource=status
mustnt controller patch gpunodes.vramfit.dev
mustnt controller delete gpunodes.vramfit.dev
mustnt controller delete trainingjobs.vramfit.dev -n ml
mustnt controller create deployments.apps -n ml
mustnt controller '*' '*'

for verb in get create patch; do must agent "$verb" gpunodes.vramfit.dev; done
must agent patch gpunodes.vramfit.dev --subresource=status
for verb in list watch; do must agent "$verb" pods -n ml; done
mustnt agent delete pods -n ml
mustnt agent patch pods -n ml --subresource=status
mustnt agent create nodes
mustnt agent get secrets -n ml
mustnt agent create pods -n ml --subresource=exec
mustnt agent create pods -n ml
mustnt agent get trainingjobs.vramfit.dev -n ml
mustnt agent list configmaps -n ml
mustnt agent delete gpunodes.vramfit.dev
mustnt agent get leases.coordination.k8s.io -n "$ns"
passed=$((passed + 1))

log "tenants: the admission policies refuse what a TrainingJob author could not get in a pod of their own"
apply_release
k create namespace team-a --dry-run=client -o yaml | k apply -f - >/dev/null
k label --overwrite namespace team-a pod-security.kubernetes.io/enforce=baseline >/dev/null
# No kube-controller-manager here aggregates the default roles: bind the
# chart's aggregated role and pod rights directly (the labels are checked).
tenancy=$(render --show-only templates/tenancy.yaml)
grep -q 'rbac.authorization.k8s.io/aggregate-to-edit: "true"' <<<"$tenancy" ||
  fail "the TrainingJob role is not aggregated into edit"
k create clusterrole chart-test-pods --verb=create,get,list --resource=pods --dry-run=client -o yaml | k apply -f - >/dev/null
k create rolebinding alice-tj -n team-a --clusterrole="$release-trainingjobs-edit" --user=alice --dry-run=client -o yaml | k apply -f - >/dev/null
k create rolebinding alice-pods -n team-a --clusterrole=chart-test-pods --user=alice --dry-run=client -o yaml | k apply -f - >/dev/null
# tj NAME TEMPLATE-SPEC-YAML [TEMPLATE-METADATA-YAML]: a TrainingJob of
# team-a with that pod spec (and metadata).
tj() {
  local metadata=${3:-'{}'}
  printf 'apiVersion: vramfit.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: %s, namespace: team-a}\nspec:\n  batch: {global: 8, micro: 8}\n  model: {mlp: {layers: 2, hidden: 64}}\n  template:\n    metadata: %s\n    spec: %s\n' "$1" "$metadata" "$2"
}
# refused WHO WHY EXPECTED-TEXT KUBECTL-ARGS... (stdin: the object, if any)
refused() {
  local who=$1 why=$2 expect=$3 err
  shift 3
  if err=$(k --as "$who" "$@" --dry-run=server 2>&1); then fail "$who was allowed: $why"; fi
  grep -qF -- "$expect" <<<"$err" || fail "$why: refused for another reason: $err"
}
allowed() {
  local who=$1 why=$2 err
  shift 2
  err=$(k --as "$who" "$@" --dry-run=server 2>&1) || fail "$who was refused: $why: $err"
}
plain='{containers: [{name: t, image: i}]}'
tj plain "$plain" | allowed alice "a plain template" apply -f -
tj priv '{containers: [{name: t, image: i, securityContext: {privileged: true}}]}' |
  refused alice "a privileged template" "privileged containers are not allowed" apply -f -
tj hp '{containers: [{name: t, image: i}], volumes: [{name: root, hostPath: {path: /}}]}' |
  refused alice "a hostPath volume" "hostPath volumes are not allowed" apply -f -
tj hpid '{hostPID: true, containers: [{name: t, image: i}]}' |
  refused alice "hostPID" "hostNetwork, hostPID and hostIPC are not allowed" apply -f -
tj caps '{initContainers: [{name: s, image: i, securityContext: {capabilities: {add: [SYS_ADMIN]}}}], containers: [{name: t, image: i}]}' |
  refused alice "SYS_ADMIN in an init container" "capabilities beyond the baseline set" apply -f -
tj port '{containers: [{name: t, image: i, ports: [{containerPort: 22, hostPort: 22}]}]}' |
  refused alice "a hostPort" "hostPort is not allowed" apply -f -
# The controls of baseline beyond the host: AppArmor (field and annotation),
# SELinux, probe and lifecycle hook hosts; what baseline allows of them passes.
tj aa '{securityContext: {appArmorProfile: {type: Unconfined}}, containers: [{name: t, image: i}]}' |
  refused alice "AppArmor Unconfined" "appArmorProfile.type must be RuntimeDefault or Localhost" apply -f -
tj aann "$plain" '{annotations: {container.apparmor.security.beta.kubernetes.io/t: unconfined}}' |
  refused alice "the AppArmor annotation unconfined" "AppArmor profiles must be runtime/default or localhost/*" apply -f -
tj spc '{initContainers: [{name: s, image: i, securityContext: {seLinuxOptions: {type: spc_t}}}], containers: [{name: t, image: i}]}' |
  refused alice "SELinux type spc_t in an init container" "seLinuxOptions.type must be container_t" apply -f -
tj seuser '{securityContext: {seLinuxOptions: {user: system_u}}, containers: [{name: t, image: i}]}' |
  refused alice "an SELinux user" "SELinux user and role may not be set" apply -f -
tj probe '{containers: [{name: t, image: i, livenessProbe: {httpGet: {host: 169.254.169.254, port: 80}}}]}' |
  refused alice "a probe to another host" "probes and lifecycle hooks may not set host" apply -f -
tj hook '{containers: [{name: t, image: i, lifecycle: {preStop: {tcpSocket: {host: 10.0.0.1, port: 80}}}}]}' |
  refused alice "a preStop hook to another host" "probes and lifecycle hooks may not set host" apply -f -
tj baseline '{securityContext: {appArmorProfile: {type: RuntimeDefault}, seLinuxOptions: {type: container_t, level: "s0:c1,c2"}, sysctls: [{name: net.ipv4.tcp_rmem, value: "4096 87380 6291456"}]}, containers: [{name: t, image: i, livenessProbe: {httpGet: {port: 8080, path: /healthz}}}]}' \
  '{annotations: {container.apparmor.security.beta.kubernetes.io/t: runtime/default}}' |
  allowed alice "what baseline allows of AppArmor, SELinux, sysctls and probes" apply -f -
refused alice "a pod naming a GPU by the NRI plugin's annotation" "may not carry CDI device annotations" \
  -n team-a run gpu --image=i --annotations='cdi-devices.noderesource.dev/container.gpu=- nvidia.com/gpu=GPU-x'
refused alice "a pod naming a GPU by containerd's CDI annotation" "may not carry CDI device annotations" \
  -n team-a run gpu --image=i --annotations='cdi.k8s.io/gpu=nvidia.com/gpu=all'
refused alice "a pod setting NVIDIA_VISIBLE_DEVICES" "may not set NVIDIA_VISIBLE_DEVICES" \
  -n team-a run gpu --image=i --env=NVIDIA_VISIBLE_DEVICES=all
refused alice "a pod granting itself a placement" "written by the vramfit controller only" \
  -n team-a run gpu --image=i --annotations='vramfit.dev/placement={"node":"n","gpus":[],"budgetBytes":1,"memoryFraction":0,"attempt":1}'
refused alice "a pod granting itself a budget" "written by the vramfit controller only" \
  -n team-a run gpu --image=i --annotations='vramfit.dev/budget-bytes=999999999999'
allowed alice "a plain pod" -n team-a run plain --image=i
allowed "system:serviceaccount:$ns:$release-controller" "the controller's training pod" \
  -n team-a run gpu --image=i --annotations='cdi-devices.noderesource.dev/container.gpu=- nvidia.com/gpu=GPU-x'
# restricted: what baseline lets through is refused.
render --set tenancy.podSecurity=restricted --show-only templates/tenancy.yaml | k apply -f - >/dev/null
# The API server picks up a changed policy from its watch: wait for it.
for _ in $(seq 50); do
  tj plain "$plain" | k --as alice apply -f - --dry-run=server >/dev/null 2>&1 || break
  sleep 0.2
done
tj plain "$plain" | refused alice "a plain template under restricted" "allowPrivilegeEscalation=false" apply -f -
# What meets restricted; the checks below start from it, so that only the
# policy they are about can refuse them (when two policies refuse, which
# one the API server reports varies from run to run).
pod_sc='securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}'
ctr_sc='securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}'
tj strict "{$pod_sc, containers: [{name: t, image: i, $ctr_sc}]}" |
  allowed alice "a template that meets restricted" apply -f -
# One object nested past the controller's JSON parser (128 levels) would make
# every TrainingJob LIST fail: refused at admission, whatever the level.
deep=$(python3 -c 'print("[" * 130 + "]" * 130)')
tj deep "{$pod_sc, containers: [{name: t, image: i, $ctr_sc}], nodeSelector: {}, x: $deep}" |
  refused alice "a template nested 130 levels" "spec.template nests more than 24 levels" apply -f -
printf 'apiVersion: vramfit.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: deepcfg, namespace: team-a}\nspec:\n  batch: {global: 8, micro: 8}\n  model: {huggingFace: {seqLen: 128, config: {model_type: gpt2, x: %s}}}\n  template: {spec: {%s, containers: [{name: t, image: i, %s}]}}\n' "$deep" "$pod_sc" "$ctr_sc" |
  refused alice "a Hugging Face config nested 130 levels" "huggingFace.config nests more than 24 levels" apply -f -
tj habit "{$pod_sc, containers: [{name: t, image: i, $ctr_sc, resources: {limits: {nvidia.com/gpu: 1}}}]}" |
  refused alice "nvidia.com/gpu in the template, out of habit" "leave out resources nvidia.com/gpu" apply -f -
tenancy=$(render --set tenancy.podSecurity=none --show-only templates/tenancy.yaml)
grep -q trainingjob-pod-security <<<"$tenancy" && fail "tenancy.podSecurity=none still renders the policy"
grep -q trainingjob-bounds <<<"$tenancy" || fail "tenancy.podSecurity=none drops the nesting bound too"
render --show-only templates/tenancy.yaml | k apply -f - >/dev/null
passed=$((passed + 1))

log "agents: each writes the GpuNode of its own node only (the node its token is bound to)"
for n in node-a node-b; do
  printf 'apiVersion: vramfit.dev/v1alpha1\nkind: GpuNode\nmetadata: {name: %s}\nspec: {}\n' "$n" | k apply -f - >/dev/null
done
api=$(k config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
certs=$(mktemp -d)
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$certs/ca"
k config view --raw --minify -o jsonpath='{.users[0].user.client-certificate-data}' | base64 -d >"$certs/crt"
k config view --raw --minify -o jsonpath='{.users[0].user.client-key-data}' | base64 -d >"$certs/key"
# as_agent NODE-OF-TOKEN GPUNODE [SUBRESOURCE]: the HTTP status of a dry-run
# patch by the agent's ServiceAccount with that node in its token.
as_agent() {
  local extra=()
  [[ -n $1 ]] && extra=(-H "Impersonate-Extra-authentication.kubernetes.io%2fnode-name: $1")
  curl -s -o /dev/null -w '%{http_code}' --cacert "$certs/ca" --cert "$certs/crt" --key "$certs/key" \
    -H "Impersonate-User: system:serviceaccount:$ns:$release-agent" "${extra[@]}" \
    -H 'Content-Type: application/merge-patch+json' -X PATCH \
    "$api/apis/vramfit.dev/v1alpha1/gpunodes/$2${3:-}?dryRun=All" --data '{"metadata":{"annotations":{"x":"y"}}}'
}
[[ $(as_agent node-a node-a) == 200 ]] || fail "the agent of node-a cannot write its own GpuNode"
[[ $(as_agent node-a node-a /status) == 200 ]] || fail "the agent of node-a cannot write its own GpuNode's status"
[[ $(as_agent node-a node-b) == 403 ]] || fail "the agent of node-a can write node-b's GpuNode"
[[ $(as_agent node-a node-b /status) == 403 ]] || fail "the agent of node-a can write node-b's GpuNode status"
[[ $(as_agent "" node-a) == 403 ]] || fail "an agent token bound to no node can write a GpuNode"
rm -r "$certs"
render | k delete -f - --ignore-not-found >/dev/null
passed=$((passed + 1))

log "kubectl auth can-i with controller.watchNamespace=ml: other namespaces are out of reach"
apply_release --set controller.watchNamespace=ml --set agent.simulate=2xH200
for verb in list watch create delete; do must controller "$verb" pods -n ml; done
must controller patch trainingjobs.vramfit.dev -n ml --subresource=status
must controller get configmaps -n ml
mustnt controller create pods -n other
mustnt controller list trainingjobs.vramfit.dev -n other
mustnt controller list trainingjobs.vramfit.dev --all-namespaces
mustnt controller get configmaps -n other
mustnt controller create events.events.k8s.io -n other
must controller list gpunodes.vramfit.dev
# The simulated agent plays the node and its kubelet.
must agent patch pods -n ml --subresource=status
must agent delete pods -n ml
must agent create nodes
must agent patch nodes --subresource=status
must agent get trainingjobs.vramfit.dev -n ml
mustnt agent get secrets -n ml
mustnt agent create pods -n ml --subresource=exec
render --set controller.watchNamespace=ml --set agent.simulate=2xH200 | k delete -f - --ignore-not-found >/dev/null
passed=$((passed + 1))

log "helm install, upgrade and uninstall against the API server (kube-controller-manager and kube-scheduler running, no kubelet)"
pass() { printf 'chart-test: PASS: %s\n' "$*" >&2; }
# poll SECONDS COMMAND...: hack/lib.sh.
# shellcheck source=hack/lib.sh
. hack/lib.sh   # the scripts run from the repository root (cd above)
# The release's pods and ReplicaSets (made by the controllers, not by helm).
owned() { k get pods,replicasets -n "$ns" -l "app.kubernetes.io/instance=$release" -o name; }
# What is left in the namespace besides what Kubernetes puts in every one.
ns_left() {
  k get all,roles,rolebindings,serviceaccounts,configmaps,secrets,poddisruptionbudgets,leases -n "$ns" -o name |
    grep -vx -e serviceaccount/default -e configmap/kube-root-ca.crt || true
}
# The release's cluster-scoped objects, by name or by label.
cluster_left() {
  local kinds=clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,validatingwebhookconfigurations,mutatingwebhookconfigurations
  { k get "$kinds" -o name | grep "/$release-" || true; k get "$kinds" -l "app.kubernetes.io/instance=$release" -o name; } | sort -u
}
edit_has_trainingjobs() { k get clusterrole edit -o jsonpath='{.rules[*].resources}' | grep -q trainingjobs; }

# Controllers are needed: ReplicaSets, pods, garbage collection, role aggregation.
poll 30 k get serviceaccount default -n "$ns" ||
  fail "no ServiceAccount default in $ns: no kube-controller-manager runs (hack/controlplane.sh up --controllers)"
# Nothing of the kubectl-applied renderings above may be left (helm refuses objects it does not own).
poll 60 eval '[[ -z $(ns_left) && -z $(cluster_left) ]]' ||
  fail "objects of the release left before helm install: $(ns_left | tr '\n' ' ') $(cluster_left | tr '\n' ' ')"
# helm installs the CRDs of crds/ itself: removed first, so that it does.
k delete crd trainingjobs.vramfit.dev gpunodes.vramfit.dev --wait --timeout=60s >/dev/null
if ! err=$("$helm" install "$release" "$chart" -n "$ns" --create-namespace 2>&1 >/dev/null); then
  fail "helm install: $err"
fi
[[ $("$helm" status "$release" -n "$ns" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["info"]["status"])') == deployed ]] ||
  fail "helm status is not deployed after install"
pass "helm install (server $(k version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'))"
k wait --for condition=established --timeout=60s crd/trainingjobs.vramfit.dev crd/gpunodes.vramfit.dev >/dev/null ||
  fail "helm did not install the CRDs"
pass "helm installed the CRDs (crds/)"
replicas=$(k get deployment "$release-controller" -n "$ns" -o jsonpath='{.spec.replicas}')
pods_made() { [[ $(k get pods -n "$ns" -l "app.kubernetes.io/instance=$release" --no-headers | wc -l) -ge $replicas ]]; }
poll 60 pods_made || fail "the controller Deployment made no pods: $(owned | tr '\n' ' ')"
unschedulable() {
  [[ $(k get pods -n "$ns" -l "app.kubernetes.io/instance=$release" \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="PodScheduled")].reason}{"\n"}{end}' | grep -c Unschedulable) -ge $replicas ]]
}
poll 60 unschedulable || fail "kube-scheduler did not try the controller's pods"
pass "Deployment $release-controller -> ReplicaSet -> $replicas pods, Pending (no node): $(k get pods -n "$ns" -l "app.kubernetes.io/instance=$release" --no-headers | awk '{print $1 " " $3}' | paste -sd, -)"
ds_seen() { [[ $(k get daemonset "$release-agent" -n "$ns" -o jsonpath='{.status.observedGeneration}') == 1 ]]; }
poll 30 ds_seen || fail "the DaemonSet controller did not process $release-agent"
pass "DaemonSet $release-agent processed, $(k get daemonset "$release-agent" -n "$ns" -o jsonpath='{.status.desiredNumberScheduled}') pods wanted (no node)"
poll 30 edit_has_trainingjobs || fail "the ClusterRole edit did not get TrainingJobs (aggregation)"
pass "ClusterRole edit aggregates $release-trainingjobs-edit"

"$helm" upgrade "$release" "$chart" -n "$ns" --reuse-values --set controller.policy=best-fit >/dev/null ||
  fail "helm upgrade --set controller.policy=best-fit"
[[ $("$helm" status "$release" -n "$ns" -o json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["version"], d["info"]["status"])') == "2 deployed" ]] ||
  fail "helm status is not revision 2, deployed, after the upgrade"
k get deployment "$release-controller" -n "$ns" -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q -- '--policy=best-fit' ||
  fail "the upgrade did not reach the Deployment's args"
rolled() { [[ $(k get replicasets -n "$ns" -l "app.kubernetes.io/instance=$release" --no-headers | wc -l) -ge 2 ]]; }
poll 60 rolled || fail "the Deployment made no new ReplicaSet for the changed template"
pass "helm upgrade --set controller.policy=best-fit: revision 2, --policy=best-fit in the Deployment, a new ReplicaSet"

manifest=$("$helm" get manifest "$release" -n "$ns")
[[ -n $manifest ]] || fail "helm get manifest is empty"
"$helm" uninstall "$release" -n "$ns" >/dev/null || fail "helm uninstall"
pass "helm uninstall"
helm_gone() { ! "$helm" status "$release" -n "$ns"; }
helm_gone >/dev/null 2>&1 || fail "helm still lists the release"
manifest_left() { k get -f - -n "$ns" --ignore-not-found -o name <<<"$manifest"; }
poll 60 eval '[[ -z $(manifest_left) ]]' || fail "objects of the release's manifest left: $(manifest_left | tr '\n' ' ')"
pass "no object of the release's manifest left ($(grep -c '^kind:' <<<"$manifest") objects)"
poll 60 eval '[[ -z $(owned) ]]' || fail "pods or ReplicaSets of the release left: $(owned | tr '\n' ' ')"
pass "the ReplicaSets and pods garbage-collected"
[[ -z $(ns_left) ]] || fail "left in $ns: $(ns_left | tr '\n' ' ')"
pass "nothing left in $ns but ServiceAccount default and ConfigMap kube-root-ca.crt (no Deployment, DaemonSet, pod, Role, RoleBinding, ServiceAccount, Service, ConfigMap, PDB, release Secret)"
[[ -z $(cluster_left) ]] || fail "cluster-scoped objects of the release left: $(cluster_left | tr '\n' ' ')"
pass "no ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy(Binding) or webhook configuration of the release left"
poll 30 eval '! edit_has_trainingjobs' || fail "the ClusterRole edit still grants TrainingJobs"
pass "ClusterRole edit no longer grants TrainingJobs"
k get crd trainingjobs.vramfit.dev gpunodes.vramfit.dev >/dev/null || fail "helm uninstall removed the CRDs"
pass "the CRDs are kept (helm leaves crds/ installed)"
passed=$((passed + 1))

echo "chart: $passed passed, 0 failed"
