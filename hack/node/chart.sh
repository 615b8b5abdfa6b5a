# The chart on the one-node cluster of hack/gpunode.sh, as a platform team
# installs it: what hack/node-chart.sh (CI, no GPU) and `hack/gpunode.sh all
# --chart` (the GPU node, hack/node/chartdemo.sh) share. Source it from the
# repository root, do not run it. The callers set $dir (the node's state
# folder), $node, $ns (the release's namespace) and $release; kubectl and ctr
# are on PATH with KUBECONFIG set.

# within SECONDS COMMAND...: runs COMMAND every 0.5 s until it succeeds (0)
# or SECONDS of wall-clock time have passed (1), however long each run of
# COMMAND takes (poll counts its tries). Its output is discarded.
within() {
  local deadline=$(($(date +%s) + $1))
  shift
  while :; do
    "$@" >/dev/null 2>&1 && return 0
    (($(date +%s) >= deadline)) && return 1
    sleep 0.5
  done
}

# The chart's version (the images' tag).
chart_version() { sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1; }

# chart_image_file DIR NAME VERSION: DIR/NAME-VERSION.oci.tar, or the same
# compressed with xz (.oci.tar.xz, what travels to the GPU node).
chart_image_file() {
  local f
  for f in "$1/$2-$3.oci.tar" "$1/$2-$3.oci.tar.xz"; do
    [[ -f $f ]] && { echo "$f"; return 0; }
  done
  return 1
}

# chart_import_images DIR VERSION: vramfit and vramfit-agent into containerd
# (namespace k8s.io), an xz tarball decompressed on the way (Python's lzma:
# the GPU node may lack xz), then checks both are there.
chart_import_images() {
  local images=$1 version=$2 f file out have
  local ctr=(ctr --address "$dir/containerd.sock" -n k8s.io)
  for f in vramfit vramfit-agent; do
    file=$(chart_image_file "$images" "$f" "$version") ||
      { log "no $images/$f-$version.oci.tar[.xz] (hack/images.sh build --out $images)"; return 1; }
    if [[ $file == *.xz ]]; then
      out=$(python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer, 1 << 20)' "$file" |
        "${ctr[@]}" images import - 2>&1) || { printf '%s\n' "$out" >&2; log "ctr images import $file failed"; return 1; }
    else
      out=$("${ctr[@]}" images import "$file" 2>&1) || { printf '%s\n' "$out" >&2; log "ctr images import $file failed"; return 1; }
    fi
  done
  have=$("${ctr[@]}" images ls -q 2>/dev/null)
  for f in vramfit vramfit-agent; do
    grep -qx "docker.io/library/$f:$version" <<<"$have" || { log "$f:$version not imported"; return 1; }
  done
}

# chart_node_values API_HOST API_PORT VERSION [CONTROLLER_LINES [AGENT_LINES]]:
# the node's values on stdout: the imported images (never pulled), the way to
# the API server, the node's kubelet root and NRI socket (the agent pod's
# nri-cdi sidecar connects to it); then the caller's lines (YAML, indented by
# two) under controller: and agent:.
chart_node_values() {
  cat <<EOF
kubeletRoot: $dir/kubelet/root
apiServer:
  host: "$1"
  port: $2
nri:
  socket: $dir/nri/nri.sock
controller:
  image: {tag: "$3", pullPolicy: Never}
${4:-}
agent:
  image: {tag: "$3", pullPolicy: Never}
${5:-}
EOF
}

sel() { echo "app.kubernetes.io/instance=$release,app.kubernetes.io/component=$1"; }
# ready_pods COMPONENT: names of its pods that are Ready and not being deleted.
ready_pods() {
  kubectl get pods -n "$ns" -l "$(sel "$1")" -o json | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    if p["metadata"].get("deletionTimestamp"):
        continue
    conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
    if conds.get("Ready") == "True":
        print(p["metadata"]["name"])'
}
count_ready() { ready_pods "$1" | wc -l; }
# lease_holder: the controller replica that holds the leader Lease (empty: none).
lease_holder() { kubectl get lease "$release-controller" -n "$ns" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true; }
all_pods_count() { kubectl get pods -n "$ns" -l "app.kubernetes.io/instance=$release" --no-headers 2>/dev/null | wc -l; }
# chart_all_ready CONTROLLERS AGENTS: that many Ready, and no other pod of the release.
chart_all_ready() {
  [[ $(count_ready controller) == "$1" && $(count_ready agent) == "$2" && $(all_pods_count) == $(($1 + $2)) ]]
}
# A container that cannot start (no image, a crash loop, a bad config), the
# agent's nri-cdi sidecar included: its pod and reason.
stuck() {
  kubectl get pods -n "$ns" -l "app.kubernetes.io/instance=$release" \
    -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.containerStatuses[*].state.waiting.reason}{" "}{.status.initContainerStatuses[*].state.waiting.reason}{"\n"}{end}' 2>/dev/null |
    grep -E ' (ErrImageNeverPull|ErrImagePull|ImagePullBackOff|InvalidImageName|CrashLoopBackOff|CreateContainerConfigError|CreateContainerError|RunContainerError)' | paste -sd, -
}

# simulate_gpus: two simulated H200s and a fresh heartbeat in the node's
# GpuNode (the agent off: a node without a GPU), as `gpunode.sh up` does
# without one.
simulate_gpus() {
  kubectl patch gpunode "$node" --subresource=status --type=merge -p "$(python3 -c '
import json, time
now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
gpus = [{"index": i, "uuid": f"GPU-sim-{i}", "model": "H200", "totalBytes": 150754820096, "health": "Healthy"} for i in (0, 1)]
print(json.dumps({"status": {"heartbeat": now, "gpuCount": 2, "model": "H200", "gpus": gpus,
                             "agent": {"mode": "simulated", "version": "node-chart", "health": "Healthy", "message": None}}}))')" >/dev/null
}

# simulated_cdi: the CDI spec of the simulated GPUs, with stand-in device
# nodes (nodecfg.py cdi-simulated), where containerd reads specs; its path.
simulated_cdi() {
  mkdir -p "$dir/cdi"
  kubectl get gpunode "$node" -o json | python3 hack/node/nodecfg.py cdi-simulated --dev "$dir/fake-dev" >"$dir/cdi/simulated.json"
  echo "$dir/cdi/simulated.json"
}

# chart_explain: the release's pods, events and logs and the kubelet's, after a failure.
chart_explain() {
  echo "== pods"
  kubectl get pods -A -o wide 2>&1 || true
  echo "== events in $ns"
  kubectl get events -n "$ns" --sort-by=.lastTimestamp 2>&1 | tail -30 || true
  local p
  for p in $(kubectl get pods -n "$ns" -o name 2>/dev/null); do
    echo "== logs $p (every container: the agent's nri-cdi sidecar too)"
    kubectl logs -n "$ns" "$p" --all-containers --prefix --tail=20 2>&1 || true
  done
  echo "== kubelet.log"
  tail -20 "$dir/kubelet.log" 2>/dev/null || true
}

# nri_sidecar_check: the NRI plugin runs as the chart's agent pod's sidecar:
# its container nri-cdi started and ready (its probe: registered with
# containerd), its log says so, and containerd started no plugin of its own
# (plugin_path empty). A line saying what was seen on stdout; 1 if not so.
nri_sidecar_check() {
  local pod st line plugins
  pod=$(ready_pods agent | head -1)
  [[ -n $pod ]] || { echo "no Ready agent pod"; return 1; }
  st=$(kubectl get pod -n "$ns" "$pod" \
    -o jsonpath='{range .status.initContainerStatuses[?(@.name=="nri-cdi")]}{.started} {.ready} {.restartCount}{end}')
  [[ $st == "true true "* ]] || { echo "$pod: sidecar nri-cdi started, ready, restarts: '$st'"; return 1; }
  line=$(kubectl logs -n "$ns" "$pod" -c nri-cdi 2>&1 | grep -m1 'registered with containerd') ||
    { echo "$pod: no 'registered with containerd' in the log of nri-cdi"; return 1; }
  plugins=$(ls -A "$dir/nri/plugins" 2>/dev/null || true)
  [[ -z $plugins ]] || { echo "containerd's plugin_path $dir/nri/plugins holds $plugins"; return 1; }
  echo "$pod: sidecar nri-cdi ready, ${st##* } restarts, ${line#* vramfit-nri-cdi: }; nothing in containerd's plugin_path"
}

# node_nri_plugin_start: the node's own vramfit-nri-cdi (on PATH: the node's
# binaries) connected to the node's NRI socket, as the agent pod's sidecar
# would be, for the checks that turn the agent off (no GPU here): the training
# pods still get their stand-in GPUs through NRI and CDI. Its log is
# $dir/nri-cdi.log, its pid $dir/nri-cdi.pid (`gpunode.sh down` ends it too).
node_nri_plugin_start() {
  local bin
  bin=$(command -v vramfit-nri-cdi) || { log "no vramfit-nri-cdi on PATH (the node's binaries)"; return 1; }
  "$bin" --socket "$dir/nri/nri.sock" --ready-file "$dir/nri-cdi.ready" >"$dir/nri-cdi.log" 2>&1 &
  echo $! >"$dir/nri-cdi.pid"
  poll 30 "$bin" --probe --ready-file "$dir/nri-cdi.ready" ||
    { log "the node's NRI plugin did not register: $(tail -3 "$dir/nri-cdi.log")"; return 1; }
}

node_nri_plugin_stop() {
  [[ -f $dir/nri-cdi.pid ]] || return 0
  kill "$(cat "$dir/nri-cdi.pid")" 2>/dev/null || true
  rm -f "$dir/nri-cdi.pid"
}
