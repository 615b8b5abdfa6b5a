# The GPU node as a platform team runs it (sourced by `hack/gpunode.sh all
# --chart`, after `up --cluster-only`): vramfit installed by helm from
# images imported into containerd, a training image built on the node from
# its own Python environment and vramfit's wheel, the demo's jobs applied by
# tenant users into namespaces under Pod Security (with a GPU, one of them,
# auto-opt, profiled automatically on a CPU before it is placed), the
# tenants' attacks tried for real, then `helm uninstall`. No vramfit process
# is started by hand.
# See docs/gpu-node.md ("The chart on the GPU node").
#
# Uses from gpunode.sh: $dir, $node, $out, $repo, $here, $steps, $images,
# $wheel, $venv, $pod_network, log, now_ms, and demo.sh's demo_run.

ns=vramfit-system
release=vramfit
# shellcheck source=hack/lib.sh
. "$here/lib.sh"
# shellcheck source=hack/node/chart.sh
. "$here/node/chart.sh"

TRAIN_IMAGE=localhost/vramfit/train-venv:dev

# secs T0 T1: seconds between two now_ms readings.
secs() { python3 -c "import sys; print(f'{(int(sys.argv[2]) - int(sys.argv[1])) / 1000:.1f}')" "$1" "$2"; }

chart_checks=0
chart_failed=0
cpass() { printf 'PASS: %s\n' "$*" | tee -a "$out/chart.log"; chart_checks=$((chart_checks + 1)); }
cfail() { printf 'FAIL: %s\n' "$*" | tee -a "$out/chart.log"; chart_checks=$((chart_checks + 1)); chart_failed=$((chart_failed + 1)); }
ctime() { printf 'TIME: %s\n' "$*" | tee -a "$out/chart.log"; }

# The training image: written by trainimage.py straight into `ctr images
# import` (a pipe: the image, several GB with torch and its CUDA libraries,
# never lies on disk twice).
chart_train_image() {
  local t0 figures=$out/trainimage.json
  local ctr=(ctr --address "$dir/containerd.sock" -n k8s.io)
  t0=$(now_ms)
  log "training image $TRAIN_IMAGE from $venv and $(basename "$wheel") (hack/node/trainimage.py | ctr images import -)"
  if ! python3 "$here/node/trainimage.py" --venv "$venv" --wheel "$wheel" --name "$TRAIN_IMAGE" \
    --figures "$figures" --out - 2>>"$out/chart.log" | "${ctr[@]}" images import --local --discard-unpacked-layers - >>"$out/chart.log" 2>&1; then
    cfail "training image built and imported (see $out/chart.log)"
    return 1
  fi
  local bytes
  bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$figures")
  local have
  have=$("${ctr[@]}" images ls -q)
  if grep -qx "$TRAIN_IMAGE" <<<"$have"; then
    cpass "training image $TRAIN_IMAGE built from $venv and the wheel, imported: $(python3 -c "print(f'{$bytes / 2**30:.2f}')") GiB, user 65532"
  else
    cfail "training image $TRAIN_IMAGE not in containerd after the import"
    return 1
  fi
  ctime "training image build and import: $(secs "$t0" "$(now_ms)")s ($bytes bytes)"
}

chart_demo() {
  local version api_host api_port values t0 t_install controllers=2 gpu=1
  [[ -e /dev/nvidiactl ]] || gpu=0
  export KUBECONFIG=$dir/controlplane/kubeconfig
  mkdir -p "$out"
  : >"$out/chart.log"
  version=$(cd "$repo" && chart_version)
  node=$(cat "$dir/node-name")
  [[ -n $wheel && -f $wheel ]] || { log "--wheel: no vramfit wheel (hack/wheel.sh builds one)"; return 1; }
  [[ -x $venv/bin/python ]] || { log "--venv $venv: no bin/python"; return 1; }

  # The GPU label the chart's agent selects (the GPU operator's, which this node lacks).
  kubectl label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null

  t0=$(now_ms)
  (cd "$repo" && chart_import_images "$images" "$version") || { cfail "vramfit images imported from $images"; return 1; }
  cpass "vramfit:$version and vramfit-agent:$version imported from $images"
  ctime "vramfit images import: $(secs "$t0" "$(now_ms)")s"
  chart_train_image || return 1

  # The node's values: pods reach the API server on the bridge (--pod-network),
  # else (no ip binary for a bridge: the GPU machine) from the host network,
  # where one controller replica fits (each binds its metrics port).
  local cvals="" avals
  if [[ $pod_network == 1 ]]; then
    read -r api_host api_port <"$dir/pod-network"
  else
    api_host=127.0.0.1
    api_port=$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')
    api_port=${api_port##*:}
    controllers=1
    cvals="  replicas: 1
  hostNetwork: true"
  fi
  avals="  extraArgs: [\"--heartbeat=3s\"]"
  [[ $pod_network == 1 ]] || avals+=$'\n  hostNetwork: true'
  if ((gpu)); then
    # The agent's GPUs through CDI: every GPU of the node's spec by index,
    # injected by the NRI plugin (containerd's CDI does not read pod annotations).
    avals+=$'\n  gpuAccess: cdi\n  cdiDevices: '"$(python3 -c '
import json, sys
names = [d["name"] for d in json.load(open(sys.argv[1]))["devices"] if d["name"].isdigit()]
print(json.dumps(["nvidia.com/gpu=" + n for n in names]))' "$dir/cdi/nvidia.json")"
  else
    avals+=$'\n  gpuAccess: none'
  fi
  values=$out/values.yaml
  (cd "$repo" && chart_node_values "$api_host" "$api_port" "$version" "$cvals" "$avals") >"$values"
  log "values: $(tr '\n' ' ' <"$values")"

  # helm: on PATH, else the one bundle-images packed beside the images (the
  # GPU machine has no Go to build it), else hack/tools.sh builds it.
  local helm=helm
  if ! command -v helm >/dev/null; then
    if [[ -f $images/helm.xz ]]; then
      helm=$dir/bin/helm
      mkdir -p "$dir/bin"
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$images/helm.xz" "$helm"
      chmod 0755 "$helm"
    else
      helm=$("$here/tools.sh" helm) || helm=
    fi
  fi
  [[ -n $helm ]] || { cfail "helm: not on PATH, no $images/helm.xz, and hack/tools.sh helm could not build it"; return 1; }
  t_install=$(now_ms)
  if ! (cd "$repo" && "$helm" install "$release" charts/vramfit -n "$ns" --create-namespace -f "$values") >>"$out/chart.log" 2>&1; then
    cfail "helm install $release charts/vramfit -n $ns"
    return 1
  fi
  cpass "helm install $release charts/vramfit -n $ns (agent: $( ((gpu)) && echo "gpuAccess cdi" || echo "gpuAccess none, no GPU"), $( [[ $pod_network == 1 ]] && echo "pod network" || echo "host network, 1 controller replica"))"
  ready_or_stuck() { chart_all_ready "$controllers" 1 && return 0; [[ -n $(stuck) ]]; }
  if poll 240 ready_or_stuck && chart_all_ready "$controllers" 1; then
    cpass "all vramfit pods Ready $(secs "$t_install" "$(now_ms)")s after helm install: $(ready_pods controller | paste -sd' ') $(ready_pods agent)"
    ctime "helm install to all vramfit pods Ready: $(secs "$t_install" "$(now_ms)")s"
  else
    cfail "vramfit pods not Ready: $(kubectl get pods -n "$ns" --no-headers 2>&1 | awk '{print $1 " " $2 " " $3}' | paste -sd, -) $(stuck)"
    chart_explain >>"$out/chart.log" 2>&1
    return 1
  fi
  # The NRI plugin is the agent pod's sidecar (containerd starts none here).
  local why
  if why=$(nri_sidecar_check); then
    cpass "the NRI plugin runs as the agent pod's native sidecar: $why"
  else
    cfail "the NRI plugin as the agent pod's sidecar: $why"
    chart_explain >>"$out/chart.log" 2>&1
    return 1
  fi
  gn() { kubectl get gpunode "$node" -o jsonpath="$1" 2>/dev/null || true; }
  local cdi keepalive= agent_pod line
  agent_pod=$(ready_pods agent | head -1)
  if ((gpu)); then
    if poll 120 eval '[[ -n $(gn "{.status.gpus[0].uuid}") ]]'; then
      cpass "the agent's pod reads the GPUs through CDI: GpuNode $node $(gn '{.status.gpuCount}') x $(gn '{.status.model}'), agent $(gn '{.status.agent.mode} {.status.agent.health}')"
    else
      cfail "no GPU in GpuNode $node within 120s (agent $(gn '{.status.agent.health}: {.status.agent.message}'))"
      chart_explain >>"$out/chart.log" 2>&1
      return 1
    fi
    # The agent's container was created after its sidecar registered, and
    # got its GPUs from it.
    if line=$(kubectl logs -n "$ns" "$agent_pod" -c nri-cdi 2>&1 | grep -m1 "container agent (agent namespace): "); then
      cpass "the agent's GPUs injected by its own pod's sidecar: ${line#* vramfit-nri-cdi: }"
    else
      cfail "no injection of the agent container's GPUs in the log of $agent_pod's nri-cdi"
    fi
    cdi=$dir/cdi/nvidia.json
  else
    if poll 60 eval '[[ -n $(gn "{.status.heartbeat}") ]]'; then
      cpass "the agent's pod writes GpuNode $node (no GPU here: $(gn '{.status.agent.health}'))"
    else
      cfail "no GpuNode $node heartbeat from the agent's pod within 60s"
    fi
    # No GPU: the agent off, two simulated H200s in the GpuNode, stand-in
    # device nodes for CDI (as hack/node-chart.sh does).
    if (cd "$repo" && "$helm" upgrade "$release" charts/vramfit -n "$ns" -f "$values" --set agent.enabled=false) >>"$out/chart.log" 2>&1 &&
      poll 60 eval '[[ -z $(kubectl get daemonset,pods -n "$ns" -l "$(sel agent)" -o name) ]]'; then
      log "no GPU: the agent turned off, two simulated GPUs in GpuNode $node"
    else
      cfail "helm upgrade --set agent.enabled=false did not remove the agent"
    fi
    simulate_gpus
    (while sleep 15; do simulate_gpus || true; done) >/dev/null 2>&1 &
    keepalive=$!
    echo "$keepalive" >"$dir/simulate.pid"   # `down` ends it if this run does not
    cdi=$(cd "$repo" && simulated_cdi)
    # The agent's pod took its sidecar along: the node's own plugin stands in,
    # so that the training pods still get their stand-in GPUs through NRI.
    if node_nri_plugin_start; then
      log "no GPU: the node's vramfit-nri-cdi stands in for the agent pod's sidecar ($dir/nri-cdi.log)"
    else
      cfail "the node's NRI plugin in place of the agent's sidecar"
      return 1
    fi
  fi

  # Tenants: team-a (alice) and team-b (bob), Pod Security baseline enforced.
  python3 "$here/node/attacks.py" tenants 2>>"$out/chart.log" || { cfail "tenant namespaces and users"; return 1; }
  demo_namespaces=(team-a team-b)
  local jobs=$dir/demo-jobs.json
  python3 "$here/node/nodecfg.py" jobs --repo "$repo" --python "$venv/bin/python" --image "$TRAIN_IMAGE" \
    --namespaces team-a,team-b --steps "$steps" $( ((gpu)) || echo --cpu) >"$jobs"
  # Each tenant applies the jobs of their own namespace.
  demo_apply() {
    local user n part
    for pair in alice:team-a bob:team-b; do
      user=${pair%%:*} n=${pair#*:} part=$dir/demo-jobs-$n.json
      python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
d["items"] = [j for j in d["items"] if j["metadata"]["namespace"] == sys.argv[2]]
json.dump(d, sys.stdout)' "$1" "$n" >"$part"
      kubectl --as "$user" apply -n "$n" -f "$part" >>"$out/chart.log" 2>&1 || log "kubectl --as $user apply -n $n failed"
    done
    # The attacks, in the background while the jobs run (the demo's times
    # start at the apply); bob's first job is alice's target.
    python3 "$here/node/attacks.py" run --release "$release" --image "$TRAIN_IMAGE" --out "$out/attacks.json" \
      --other-job "$(python3 -c 'import json,sys; print(next(j["metadata"]["name"] for j in json.load(open(sys.argv[1]))["items"] if j["metadata"]["namespace"] == "team-b"))' "$1")" \
      >"$dir/attacks.txt" 2>&1 &
    attacks_pid=$!
  }
  demo_vramfit() { kubectl exec -n "$ns" "deploy/$release-controller" -- vramfit "$@"; }
  # The run as the API server reports it, stamped with this clock (report.py
  # watch: kubectl get --watch of the TrainingJobs, the profiling pods and
  # the captured-profile ConfigMaps): the phases each job went through (the
  # auto-profiled job's Profiling), apply to placement, the profiling pod
  # and its ConfigMap. Started before the apply; report.py reads it (--watch).
  local watch=$dir/watch.jsonl watch_pid
  rm -f "$watch"
  python3 "$here/node/report.py" watch --out "$watch" 2>>"$out/chart.log" &
  watch_pid=$!
  poll 15 grep -q '"WATCHING"' "$watch" || log "report.py watch did not start (see $out/chart.log)"
  local rc=0 attacks_pid=
  demo_run "$jobs" "$cdi" --attacks --watch "$watch" || rc=$?
  kill "$watch_pid" 2>/dev/null || true
  wait "$watch_pid" 2>/dev/null || true
  cp "$watch" "$out/watch.jsonl" 2>/dev/null || true
  grep '^TIME: ' "$dir/summary.txt" >>"$out/chart.log" || true
  [[ -n $attacks_pid ]] && wait "$attacks_pid"
  [[ -n $keepalive ]] && kill "$keepalive" 2>/dev/null
  if ((gpu)); then
    # Every training container's GPU came from the sidecar.
    local given
    given=$(kubectl logs -n "$ns" "$agent_pod" -c nri-cdi 2>/dev/null | grep -c ' container [^ ]*: nvidia.com/gpu=GPU-' || true)
    if ((given > 0)); then
      cpass "the agent pod's sidecar gave $given training containers their GPUs ($agent_pod, container nri-cdi)"
    else
      cfail "no training container's GPU in the log of $agent_pod's nri-cdi"
    fi
  else
    node_nri_plugin_stop
  fi
  echo
  cat "$dir/attacks.txt"
  cat "$dir/attacks.txt" >>"$out/demo.log"
  grep -q '^FAIL' "$dir/attacks.txt" && rc=1
  grep -q '^PASS' "$dir/attacks.txt" || { echo "FAIL: the attacks did not run"; rc=1; }

  # Uninstall: nothing of the release left but the CRDs.
  if (cd "$repo" && "$helm" uninstall "$release" -n "$ns" --wait --timeout 120s) >>"$out/chart.log" 2>&1 &&
    poll 90 eval '[[ -z $(kubectl get pods,deployments,daemonsets -n "$ns" -l "app.kubernetes.io/instance=$release" -o name) ]]'; then
    cpass "helm uninstall: no pod, Deployment or DaemonSet of the release left"
  else
    cfail "helm uninstall: $(kubectl get pods,deployments,daemonsets -n "$ns" -o name 2>&1 | paste -sd' ')"
  fi
  ctime "chart mode in all (images, training image, install, demo, attacks, uninstall): $(secs "$t0" "$(now_ms)")s"
  echo "chart: $((chart_checks - chart_failed)) passed, $chart_failed failed" | tee -a "$out/chart.log"
  cat "$out/chart.log" >>"$out/demo.log"
  ((chart_failed == 0)) || rc=1
  return $rc
}
