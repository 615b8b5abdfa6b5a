#!/usr/bin/env bash
# The chart as a platform team installs it, on the one-node cluster of
# hack/gpunode.sh (a real kubelet, containerd and runc; no GPU needed): the
# images imported into containerd (no registry), `helm install`, then the
# pods must start and keep working, and a real Prometheus (hack/tools.sh
# prometheus) that finds the controller's and the agent's metrics endpoints
# through the API server must answer every query of the chart's Grafana
# dashboard (hack/prom-check.py). One PASS:/FAIL: line per check, a count at
# the end; exits non-zero on any FAIL. See docs/gpu-node.md.
#
#   hack/node-chart.sh --up [--dir D] [--images DIR]   bring the node up (cluster only,
#                               pod network), check, and always take it down again
#   hack/node-chart.sh [--dir D] [--images DIR]        on a node already up with
#                               `hack/gpunode.sh up --cluster-only --pod-network`
#   hack/node-chart.sh --can-run   exit 0 if this machine can run the node, else say why
#
# The images: DIR (default ~/.cache/vramfit/images-ci) holds
# vramfit-<version>.oci.tar and vramfit-agent-<version>.oci.tar
# (hack/images.sh build --profile dev --out DIR).
#
# How the pods reach the API server: the node's pods have an address on a
# bridge (hack/node/cni-bridge.py), the API server listens there too, and there
# is no kube-proxy, so the chart's apiServer.host/apiServer.port point the
# controller and the agent at the bridge's address instead of the `kubernetes`
# Service (KUBERNETES_SERVICE_HOST/PORT).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
chart=charts/vramfit
ns=vramfit-system
release=vramfit
# A state folder of its own: `hack/gpunode.sh up` in the default one (the
# demo) takes down whatever node runs there first.
dir=/var/lib/vramfit-node-chart
images=$HOME/.cache/vramfit/images-ci
bring_up=0
# Bounds (seconds) of each wait.
bound_ready=${VRAMFIT_NODE_CHART_READY_S:-180}
bound_failover=${VRAMFIT_NODE_CHART_FAILOVER_S:-60}
bound_agent=${VRAMFIT_NODE_CHART_AGENT_S:-60}

# What a kubelet, containerd and runc need here: root, a cgroup hierarchy
# (v2 at /sys/fs/cgroup, or the v1 controllers the kubelet uses) and
# python3. The pod network is made through netlink by vramfit-podnet (no
# `ip` or `nsenter` needed); where `ip` is installed, a bridge is tried here
# first, so that a machine that forbids bridges skips rather than fails.
can_run() {
  [[ $(id -u) == 0 ]] || { echo "not root"; return 1; }
  if [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) != cgroup2fs ]]; then
    local c
    for c in cpu memory pids cpuset; do
      awk -v c="$c" '$3 == "cgroup" && index("," $4 ",", "," c ",") {f=1} END {exit !f}' /proc/mounts ||
        { echo "neither cgroup v2 at /sys/fs/cgroup nor the cgroup v1 controller $c mounted"; return 1; }
    done
  fi
  local t
  command -v python3 >/dev/null || { echo "no python3"; return 1; }
  if command -v ip >/dev/null; then
    ip link add vramfit-probe0 type bridge 2>/dev/null || { echo "cannot create a bridge (ip link add type bridge)"; return 1; }
    ip link del vramfit-probe0
  fi
}

t_start=$(date +%s%N | cut -c1-13)
while [[ $# -gt 0 ]]; do
  case $1 in
    --can-run) can_run; exit ;;
    --up) bring_up=1; shift ;;
    --dir) dir=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    *) sed -n '2,24p' "$0"; exit 2 ;;
  esac
done

log() { printf 'node-chart: %s\n' "$*" >&2; }
now_ms() { python3 -c 'import time; print(int(time.time()*1000))'; }
secs() { python3 -c "import sys; print(f'{(int(sys.argv[2]) - int(sys.argv[1])) / 1000:.1f}')" "$1" "$2"; }

passed=0
failed=0
pass() { printf 'PASS: %s\n' "$*"; passed=$((passed + 1)); }
failc() { printf 'FAIL: %s\n' "$*"; failed=$((failed + 1)); }
# poll SECONDS COMMAND...: hack/lib.sh.
# shellcheck source=hack/lib.sh
. hack/lib.sh   # the scripts run from the repository root (cd above)
# The install's pieces, shared with `hack/gpunode.sh all --chart`.
# shellcheck source=hack/node/chart.sh
. hack/node/chart.sh

version=$(chart_version)
for f in vramfit vramfit-agent; do
  chart_image_file "$images" "$f" "$version" >/dev/null ||
    { log "no $images/$f-$version.oci.tar (hack/images.sh build --profile dev --out $images)"; exit 1; }
done
helm=$(hack/tools.sh helm)
# Built before the node is up (the first build takes minutes).
prom=$(hack/tools.sh prometheus)
nodebin=${VRAMFIT_BIN:-$HOME/.cache/vramfit/bin}/node
[[ -x $dir/bin/kube ]] && nodebin=$dir/bin

# Every exit: what explains a failure, then the node down (with --up).
values=
on_exit() {
  local rc=$?
  [[ -n $values ]] && rm -f "$values"
  if [[ -n ${prom_dir:-} ]]; then
    [[ $failed -gt 0 || $rc -ne 0 ]] && [[ -f $prom_dir/prometheus.log ]] &&
      { echo "--- Prometheus (last lines)"; tail -5 "$prom_dir/prometheus.log"; } >&2
    python3 hack/prom-check.py stop --dir "$prom_dir" || true
  fi
  [[ -n ${keepalive:-} ]] && kill "$keepalive" 2>/dev/null
  node_nri_plugin_stop
  if [[ $failed -gt 0 || $rc -ne 0 ]] && [[ -n ${KUBECONFIG:-} ]]; then
    chart_explain >&2
  fi
  if [[ $bring_up == 1 ]]; then
    log "taking the node down"
    hack/gpunode.sh down --dir "$dir" >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap on_exit EXIT

# --- the node ------------------------------------------------------------------------
up_s=
if [[ $bring_up == 1 ]]; then
  log "hack/gpunode.sh up --cluster-only --pod-network --dir $dir"
  t0=$(now_ms)
  hack/gpunode.sh up --cluster-only --pod-network --dir "$dir" >/dev/null
  up_s=$(secs "$t0" "$(now_ms)")
fi
[[ -f $dir/pod-network && -f $dir/controlplane/kubeconfig ]] ||
  { log "no node with a pod network in $dir (hack/gpunode.sh up --cluster-only --pod-network)"; exit 1; }
export KUBECONFIG=$dir/controlplane/kubeconfig
export PATH=$nodebin:$PATH
node=$(cat "$dir/node-name")
read -r api_host api_port <"$dir/pod-network"
kubectl get node "$node" >/dev/null || { log "node $node is not registered"; exit 1; }
if kubectl get deployment -A -l app.kubernetes.io/instance=$release -o name 2>/dev/null | grep -q .; then
  log "a release $release is already installed: this check installs its own"; exit 1
fi

log "importing the images into containerd (namespace k8s.io)"
chart_import_images "$images" "$version" || exit 1

# The node's values: the imported images (never pulled), the pod network's way
# to the API server, the node's kubelet root; the agent on this node, which has
# no nvidia.com/gpu.present label and no NVIDIA runtime.
values=$(mktemp /tmp/vramfit-node-values.XXXXXX)
chart_node_values "$api_host" "$api_port" "$version" "" "  gpuAccess: none
  nodeSelector:
    nvidia.com/gpu.present: null
    kubernetes.io/hostname: \"$node\"" >"$values"
log "values: $(tr '\n' ' ' <"$values")"

# sel, ready_pods, count_ready, all_pods_count, stuck: hack/node/chart.sh.
all_ready() { chart_all_ready 2 1; }

# --- a. install ----------------------------------------------------------------------
log "helm install $release $chart -n $ns --create-namespace -f <node values>"
t_install=$(now_ms)
extra=()
# VRAMFIT_NODE_CHART_SET=a=b,c=d: --set for the install only (to see a broken chart fail).
[[ -n ${VRAMFIT_NODE_CHART_SET:-} ]] && extra=(--set "$VRAMFIT_NODE_CHART_SET")
if "$helm" install "$release" "$chart" -n "$ns" --create-namespace -f "$values" "${extra[@]}" >/dev/null; then
  pass "helm install (revision 1, deployed)"
else
  failc "helm install"
  echo "node-chart: $passed passed, $failed failed"
  exit 1
fi
# A container that cannot start (no image, a crash loop, a bad config) ends the wait at once.
ready_or_stuck() { all_ready && return 0; [[ -n $(stuck) ]] && return 0; return 1; }
if poll "$bound_ready" ready_or_stuck && all_ready; then
  t_ready=$(now_ms)
  install_s=$(secs "$t_install" "$t_ready")
  pass "all vramfit pods Ready ${install_s}s after helm install: $(ready_pods controller | paste -sd' ') $(ready_pods agent)"
else
  why=$(stuck)
  failc "not all vramfit pods Ready (bound ${bound_ready}s): $(kubectl get pods -n "$ns" --no-headers 2>&1 | awk '{print $1 " " $2 " " $3}' | paste -sd, -)${why:+ (stuck: $why)}"
  # Nothing after this means anything without running pods.
  echo "node-chart: $passed passed, $failed failed (stopped: the release's pods do not run)"
  exit 1
fi
if [[ $(kubectl get deployment "$release-controller" -n "$ns" -o jsonpath='{.status.conditions[?(@.type=="Available")].status}') == True &&
  $(kubectl get deployment "$release-controller" -n "$ns" -o jsonpath='{.status.readyReplicas}') == 2 ]]; then
  pass "Deployment $release-controller Available, 2/2 replicas Ready (leader election: --lease-name=$release-controller)"
else
  failc "Deployment $release-controller not Available with 2 Ready replicas: $(kubectl get deployment "$release-controller" -n "$ns" --no-headers 2>&1)"
fi
ds=$(kubectl get daemonset "$release-agent" -n "$ns" -o jsonpath='{.status.desiredNumberScheduled} {.status.numberReady}' 2>/dev/null || true)
if [[ $ds == "1 1" ]]; then
  pass "DaemonSet $release-agent: 1 pod wanted, 1 Ready (its readiness probe, GET /healthz on the metrics port, passes and its nri-cdi sidecar registered)"
else
  failc "DaemonSet $release-agent: wanted/ready $ds"
fi
# nri_sidecar_check: hack/node/chart.sh.
if why=$(nri_sidecar_check); then
  pass "the NRI plugin runs as the agent pod's native sidecar, connected to $dir/nri/nri.sock: $why"
else
  failc "the NRI plugin as the agent pod's sidecar: $why"
fi
# gn JSONPATH: a field of the node's GpuNode (empty while there is none).
gn() { kubectl get gpunode "$node" -o jsonpath="$1" 2>/dev/null || true; }
gpunode_heartbeat() { [[ -n $(gn '{.status.heartbeat}') ]]; }
if poll 60 gpunode_heartbeat; then
  state=$(gn '{.status.agent.mode} {.status.agent.health}: {.status.agent.message}')
  pass "GpuNode $node, heartbeat $(gn '{.status.heartbeat}'), agent $state"
  if [[ ! -e /dev/nvidiactl ]]; then
    if [[ $(gn '{.status.agent.health}') == Degraded ]]; then
      pass "no GPU here: the agent reports Degraded (and keeps running)"
    else
      failc "no GPU here, yet the agent does not report Degraded: $state"
    fi
  fi
else
  failc "no GpuNode $node with a heartbeat within 60s"
fi
restarts=$(kubectl get pods -n "$ns" -o jsonpath='{range .items[*]}{.status.containerStatuses[*].restartCount} {.status.initContainerStatuses[*].restartCount}{"\n"}{end}' |
  awk '{for (i = 1; i <= NF; i++) s += $i} END {print s + 0}')
[[ $restarts == 0 ]] && pass "no container restarted" || failc "containers restarted: $restarts"

# --- Prometheus --------------------------------------------------------------------------
# Started now, it scrapes through the pods' replacements below. It finds the
# endpoints of the Services $release-metrics and $release-agent-metrics through
# the API server (Kubernetes service discovery, the node's kubeconfig) and
# scrapes the pods on the bridge. Each component's queries run while it has
# data: the agent's before the agent is turned off (on this node without a
# GPU its per-GPU and per-pod series are empty: prom-check says NEEDS GPU for
# each, from sum(vramfit_agent_gpus) = 0), the controller's with the
# TrainingJob placed on the simulated GPUs.
prom_dir=$(mktemp -d /tmp/vramfit-prom.XXXXXX)
prom_ok=0
t_prom=$(now_ms)
if python3 hack/prom-check.py start --prometheus "$prom" --kubeconfig "$KUBECONFIG" --dir "$prom_dir" \
    --namespace "$ns" --release "$release"; then
  prom_ok=1
  pass "Prometheus (github.com/prometheus/prometheus $(awk '$1 == "github.com/prometheus/prometheus" {print $2}' hack/tools/prometheus/go.mod), built from its Go module) started after $(secs "$t_prom" "$(now_ms)")s, Kubernetes service discovery through the API server"
else
  failc "Prometheus did not start: $(tail -3 "$prom_dir/prometheus.log" 2>/dev/null)"
fi
# prom_check COMPONENT: its targets up, then every dashboard query of it
# (hack/prom-check.py prints PASS:, FAIL:, NEEDS GPU: and NEEDS EVENT: lines;
# the PASS and FAIL lines count here).
prom_check() {
  local out
  [[ $prom_ok == 1 ]] || { failc "no Prometheus to check the $1's metrics with"; return; }
  out=$({
    python3 hack/prom-check.py targets --dir "$prom_dir" --component "$1" --wait 120
    python3 hack/prom-check.py query --dir "$prom_dir" --component "$1" --wait 90
  } || true)
  printf '%s\n' "$out"
  passed=$((passed + $(grep -c '^PASS: ' <<<"$out" || true)))
  failed=$((failed + $(grep -c '^FAIL: ' <<<"$out" || true)))
}

# --- b. leader election ----------------------------------------------------------------
lease_holder() { kubectl get lease "$release-controller" -n "$ns" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true; }
poll 60 eval '[[ -n $(lease_holder) ]]' || true
holder=$(lease_holder)
controllers=$(ready_pods controller)
if [[ -n $holder ]] && grep -qx "$holder" <<<"$controllers"; then
  pass "Lease $release-controller held by one replica: $holder (duration $(kubectl get lease "$release-controller" -n "$ns" -o jsonpath='{.spec.leaseDurationSeconds}')s)"
  t_del=$(now_ms)
  kubectl delete pod -n "$ns" "$holder" --wait=false >/dev/null
  new_holder() { local h; h=$(lease_holder); [[ -n $h && $h != "$holder" ]] && kubectl get pod -n "$ns" "$h" >/dev/null; }
  if poll "$bound_failover" new_holder; then
    took=$(secs "$t_del" "$(now_ms)")
    who="the replacement pod"
    grep -qx "$(lease_holder)" <<<"$controllers" && who="the standby replica"
    pass "holder $holder deleted: $(lease_holder), $who, took the Lease after ${took}s (bound ${bound_failover}s)"
  else
    failc "holder $holder deleted: no other replica took the Lease within ${bound_failover}s (holder: $(lease_holder))"
  fi
  if poll "$bound_ready" all_ready; then
    pass "the Deployment is back to 2 Ready replicas after $(secs "$t_del" "$(now_ms)")s"
  else
    failc "the Deployment is not back to 2 Ready replicas within ${bound_ready}s"
  fi
else
  failc "the Lease $release-controller names '$holder', not one of the Ready replicas ($(paste -sd' ' <<<"$controllers"))"
fi

# --- c. the agent pod replaced ---------------------------------------------------------
agent_pod=$(ready_pods agent | head -1)
if [[ -n $agent_pod ]]; then
  t_del=$(now_ms)
  kubectl delete pod -n "$ns" "$agent_pod" --wait=false >/dev/null
  new_agent() { local p; p=$(ready_pods agent); [[ -n $p && $p != "$agent_pod" ]]; }
  if poll "$bound_agent" new_agent; then
    pass "agent pod $agent_pod deleted: the DaemonSet's $(ready_pods agent) Ready after $(secs "$t_del" "$(now_ms)")s (bound ${bound_agent}s)"
    # Its plugin took the old one's place with containerd.
    if why=$(nri_sidecar_check); then
      pass "the new agent pod's NRI sidecar registered: $why"
    else
      failc "the new agent pod's NRI sidecar: $why"
    fi
  else
    failc "agent pod $agent_pod deleted: no new agent pod Ready within ${bound_agent}s"
  fi
  hb_before=$(gn '{.status.heartbeat}')
  hb_moved() { [[ $(gn '{.status.heartbeat}') != "$hb_before" ]]; }
  if poll 60 hb_moved; then
    pass "the new agent writes the GpuNode's heartbeat ($(gn '{.status.heartbeat}'))"
  else
    failc "the GpuNode's heartbeat did not move within 60s of the new agent"
  fi
else
  failc "no Ready agent pod to delete"
fi

# --- d. upgrade ------------------------------------------------------------------------
policy=best-fit
t_up=$(now_ms)
# The same values file plus the change (--reuse-values would fail: the stored
# values keep the null that removes the default agent.nodeSelector label, which
# the schema then refuses).
if "$helm" upgrade "$release" "$chart" -n "$ns" -f "$values" --set controller.policy=$policy >/dev/null; then
  pass "helm upgrade -f <node values> --set controller.policy=$policy (revision $("$helm" status "$release" -n "$ns" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])'))"
else
  failc "helm upgrade -f <node values> --set controller.policy=$policy"
fi
rolled() {
  kubectl rollout status deployment "$release-controller" -n "$ns" --timeout=1s >/dev/null 2>&1 || return 1
  all_ready || return 1
  local p
  for p in $(ready_pods controller); do
    kubectl get pod -n "$ns" "$p" -o jsonpath='{.spec.containers[0].args}' | grep -q -- "--policy=$policy" || return 1
  done
}
if poll "$bound_ready" rolled; then
  pass "the Deployment rolled: 2 Ready pods with --policy=$policy after $(secs "$t_up" "$(now_ms)")s ($(ready_pods controller | paste -sd' '))"
else
  failc "the Deployment did not roll to 2 Ready pods with --policy=$policy within ${bound_ready}s"
fi
poll 60 eval '[[ -n $(lease_holder) ]] && ready_pods controller | grep -qx "$(lease_holder)"' &&
  pass "after the upgrade the Lease is held by a new pod: $(lease_holder)" ||
  failc "after the upgrade no new pod holds the Lease (holder: $(lease_holder))"

# --- the agent's metrics ------------------------------------------------------------------
# The agent (real, in its no-GPU mode) after its pod was replaced and the
# release upgraded: its targets and the dashboard's agent queries.
prom_check agent

# --- a TrainingJob in a baseline namespace ------------------------------------------------
# The node has no GPU, so the GpuNode's GPUs are simulated as in `gpunode.sh up`
# without one: the agent is turned off (helm upgrade agent.enabled=false; it
# would report no GPUs), the admin patches two simulated H200s into the
# GpuNode and keeps its heartbeat fresh, and a CDI spec with stand-in device
# nodes (nodecfg.py cdi-simulated) lets containerd inject "GPUs" that are
# /dev/null; the agent's pod took its NRI sidecar along, so the node's own
# vramfit-nri-cdi stands in for it. The trainer is the pause image: the check
# is that the controller's pod passes Pod Security baseline and the chart's
# admission policies, and runs with its stand-in GPU.
tj_ns=team-baseline
# simulate_gpus, simulated_cdi, node_nri_plugin_start/stop: hack/node/chart.sh.
keepalive=
tj_cleanup() {
  [[ -n $keepalive ]] && kill "$keepalive" 2>/dev/null || true
  keepalive=
  kubectl delete namespace "$tj_ns" --ignore-not-found --wait=true --timeout=90s >/dev/null 2>&1 || true
  node_nri_plugin_stop
}
if "$helm" upgrade "$release" "$chart" -n "$ns" -f "$values" --set controller.policy=$policy --set agent.enabled=false >/dev/null &&
  poll 60 eval '[[ -z $(kubectl get daemonset,pods -n "$ns" -l "$(sel agent)" -o name) ]]'; then
  pass "helm upgrade --set agent.enabled=false: the DaemonSet and its pod gone (the GpuNode's GPUs simulated from here on)"
  simulate_gpus
  (while sleep 15; do simulate_gpus || true; done) >/dev/null 2>&1 &
  keepalive=$!
  simulated_cdi >/dev/null
  node_nri_plugin_start || failc "the node's NRI plugin in place of the agent's sidecar: $(tail -3 "$dir/nri-cdi.log" 2>/dev/null)"
  kubectl create namespace "$tj_ns" >/dev/null
  kubectl label namespace "$tj_ns" pod-security.kubernetes.io/enforce=baseline >/dev/null
  kubectl apply -f - >/dev/null <<EOF
apiVersion: vramfit.dev/v1alpha1
kind: TrainingJob
metadata: {name: cpu-pause, namespace: $tj_ns}
spec:
  batch: {global: 64, micro: 16}
  model: {mlp: {layers: 2, hidden: 256}, precision: fp32, optimizer: sgd-momentum}
  memory: {request: 1Gi}
  template:
    spec:
      containers:
      - name: train
        image: localhost/vramfit/pause:3.10
        imagePullPolicy: Never
EOF
  t_tj=$(now_ms)
  tj_running() {
    [[ $(kubectl get pods -n "$tj_ns" -l vramfit.dev/training-job -o jsonpath='{.items[0].status.phase} {.items[0].spec.nodeName}') == "Running $node" ]]
  }
  if poll 90 tj_running; then
    pod=$(kubectl get pods -n "$tj_ns" -l vramfit.dev/training-job -o jsonpath='{.items[0].metadata.name}')
    pass "TrainingJob $tj_ns/cpu-pause (namespace enforce=baseline): pod $pod Running on $node after $(secs "$t_tj" "$(now_ms)")s, volumes: $(kubectl get pod -n "$tj_ns" "$pod" -o jsonpath='{range .spec.volumes[*]}{.name}{" "}{end}'), hostNetwork: $(kubectl get pod -n "$tj_ns" "$pod" -o jsonpath='{.spec.hostNetwork}{"\n"}' | sed 's/^$/false/'), IP $(kubectl get pod -n "$tj_ns" "$pod" -o jsonpath='{.status.podIP}')"
    if line=$(grep -m1 "pod $tj_ns/$pod container [^ ]*: nvidia.com/gpu=" "$dir/nri-cdi.log"); then
      pass "its container's stand-in GPU came through NRI and CDI: ${line#* vramfit-nri-cdi: }"
    else
      failc "the node's NRI plugin logged no GPU for pod $tj_ns/$pod: $(tail -3 "$dir/nri-cdi.log" 2>/dev/null)"
    fi
    # The controller's metrics with the job placed on the simulated GPUs,
    # once Prometheus scraped the leader after the placement.
    if [[ $prom_ok == 1 ]]; then
      line=$(python3 hack/prom-check.py wait --dir "$prom_dir" --wait 60 \
        --what "Prometheus shows the job placed on the simulated GPUs (the controller's own state)" \
        --query 'sum(vramfit_trainingjobs{phase=~"Placed|Running"}) and (sum(vramfit_gpu_memory_committed_bytes) > 0)' || true)
      echo "$line"
      [[ $line == PASS:* ]] && passed=$((passed + 1)) || failed=$((failed + 1))
    fi
    prom_check controller
  else
    failc "TrainingJob $tj_ns/cpu-pause: no pod Running on $node within 90s (job: $(kubectl get trainingjob -n "$tj_ns" cpu-pause -o jsonpath='{.status.phase} {.status.message}' 2>&1); pods: $(kubectl get pods -n "$tj_ns" --no-headers 2>&1 | paste -sd, -); events: $(kubectl get events -n "$tj_ns" -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' 2>&1 | tail -3 | paste -sd'|' -))"
  fi
  tj_cleanup
else
  failc "helm upgrade --set agent.enabled=false did not remove the agent DaemonSet"
fi

# --- e. uninstall ----------------------------------------------------------------------
if "$helm" uninstall "$release" -n "$ns" --wait --timeout 120s >/dev/null; then
  pass "helm uninstall"
else
  failc "helm uninstall"
fi
pods_left() { kubectl get pods,deployments,daemonsets,replicasets -n "$ns" -l "app.kubernetes.io/instance=$release" -o name; }
if poll 90 eval '[[ -z $(pods_left) ]]'; then
  pass "no pod, Deployment, DaemonSet or ReplicaSet of the release left"
else
  failc "left after uninstall: $(pods_left | paste -sd' ')"
fi
ns_left() {
  kubectl get roles,rolebindings,serviceaccounts,services,configmaps,secrets,poddisruptionbudgets -n "$ns" -o name |
    grep -vx -e serviceaccount/default -e configmap/kube-root-ca.crt || true
}
cluster_left() {
  local kinds=clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,validatingwebhookconfigurations,mutatingwebhookconfigurations
  { kubectl get "$kinds" -o name | grep "/$release-" || true; kubectl get "$kinds" -l "app.kubernetes.io/instance=$release" -o name; } | sort -u
}
left=$(ns_left)
[[ -z $left ]] && pass "no Role, RoleBinding, ServiceAccount, Service, ConfigMap, Secret or PDB of the release left in $ns" ||
  failc "left in $ns: $(paste -sd' ' <<<"$left")"
left=$(cluster_left)
[[ -z $left ]] && pass "no ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy(Binding) or webhook configuration of the release left" ||
  failc "cluster-scoped objects of the release left: $(paste -sd' ' <<<"$left")"
kubectl get crd trainingjobs.vramfit.dev gpunodes.vramfit.dev >/dev/null 2>&1 &&
  pass "the CRDs are kept" || failc "helm uninstall removed the CRDs"

# --- f. timings ------------------------------------------------------------------------
[[ -n $up_s ]] && echo "TIME: hack/gpunode.sh up to node $node Ready: $(python3 -c "print(f'{$(cat "$dir/node-ready-ms")/1000:.1f}')")s (up returned after ${up_s}s)"
[[ -n ${install_s:-} ]] && echo "TIME: helm install to all vramfit pods Ready: ${install_s}s"
echo "TIME: node-chart in all (images imported, checks, before down): $(secs "$t_start" "$(now_ms)")s"
echo "node-chart: $passed passed, $failed failed"
[[ $failed == 0 ]]
