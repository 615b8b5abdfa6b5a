#!/usr/bin/env bash
# Checks of charts/vramfit: the CRDs match crds/, every value is documented,
# helm lint, the schema refuses bad values, the rendered manifests pass
# `kubectl apply --dry-run=server` against the local control plane, and each
# ServiceAccount can do what it needs and nothing it must not (`kubectl auth can-i`).
#
#   hack/chart-test.sh                  start a control plane of its own, check, stop it
#   KUBECONFIG=... hack/chart-test.sh --kubeconfig K   use a running control plane
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
  --set agent.gpuAccess=cdi --set agent.simulate=2xH200 >/dev/null || fail "helm lint (all options on)"
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
refuse "misspelt value" "additional properties 'replica' not allowed" --set controller.replica=3
refuse "relative stats root" "/statsRoot" --set statsRoot=var/run
refuse "two active controllers" "needs controller.leaderElection" --set controller.leaderElection=false
refuse "unknown GPU access" "/agent/gpuAccess" --set agent.gpuAccess=privileged
refuse "ServiceMonitor without a Service" "needs metrics.service.enabled" \
  --set serviceMonitor.enabled=true --set metrics.service.enabled=false
"$helm" template "$release" "$chart" --kube-version "$kube_version" --set controller.leaderElection=false \
  --set controller.replicas=1 >/dev/null || fail "one replica without leader election was refused"
passed=$((passed + 1))

render() { "$helm" template "$release" "$chart" --kube-version "$kube_version" --namespace "$ns" "$@"; }

log "the controller and the agent get the same stats root"
out=$(render --set statsRoot=/srv/vramfit/stats/)
[[ $(grep -c -- '- --stats-root=/srv/vramfit/stats$' <<<"$out") == 2 ]] ||
  fail "--stats-root is not /srv/vramfit/stats for both the controller and the agent"
grep -q 'path: /srv/vramfit/stats$' <<<"$out" || fail "the agent's hostPath is not the stats root"
passed=$((passed + 1))

log "the agent reaches the GPUs as configured"
render | grep -q 'runtimeClassName: nvidia' || fail "no runtimeClassName by default"
out=$(render --set agent.gpuAccess=cdi --set 'agent.cdiDevices={nvidia.com/gpu=0,nvidia.com/gpu=1}')
grep -q 'runtimeClassName' <<<"$out" && fail "runtimeClassName set with gpuAccess=cdi"
grep -q 'cdi.k8s.io/vramfit-agent: "nvidia.com/gpu=0,nvidia.com/gpu=1"' <<<"$out" || fail "no CDI annotation"
# How an admin replaces the default label: null removes it (Helm merges maps).
out=$(render -f <(printf 'agent:\n  nodeSelector:\n    nvidia.com/gpu.present: null\n    pool: a100\n') \
  --show-only templates/agent-daemonset.yaml)
grep -A1 'nodeSelector:' <<<"$out" | grep -q 'pool: a100' || fail "agent.nodeSelector is not the DaemonSet's"
grep -q 'gpu.present' <<<"$out" && fail "a null nodeSelector entry kept the default label"
passed=$((passed + 1))

# --- against the API server ---------------------------------------------------
own_cp=
if [[ -z $kubeconfig ]]; then
  own_cp=$(mktemp -d /tmp/vramfit-chart-cp.XXXXXX)
  trap 'hack/controlplane.sh down --dir "$own_cp"; rm -rf "$own_cp"' EXIT
  kubeconfig=$(hack/controlplane.sh up --dir "$own_cp")
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
for verb in list watch create delete; do must controller "$verb" pods -n ml; done
must controller get configmaps -n ml
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

for verb in get patch; do must agent "$verb" gpunodes.vramfit.dev; done
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

log "kubectl auth can-i with controller.watchNamespace=ml: other namespaces are out of reach"
render | k delete -f - --ignore-not-found >/dev/null
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

echo "chart: $passed passed, 0 failed"
