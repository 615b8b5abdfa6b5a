# The GPU node as a platform team runs it (sourced by `hack/gpunode.sh all
# --chart`, after `up --cluster-only`): vramfit installed by helm from
# images imported into containerd, a training image built on the node from
# its own Python environment and vramfit's wheel, the demo's jobs applied by
# tenant users into namespaces under Pod Security (team-a baseline, team-b
# restricted; with a GPU, one job, auto-opt, profiled automatically on a CPU
# before it is placed), the release operated while they run (the leader's
# pod deleted, the agent's pod deleted, `helm upgrade` with a changed value),
# the tenants' attacks tried for real, then `helm uninstall`. No vramfit
# process is started by hand.
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
cskip() { printf 'SKIP: %s\n' "$*" | tee -a "$out/chart.log"; }
ctime() { printf 'TIME: %s\n' "$*" | tee -a "$out/chart.log"; }
cnote() { printf 'NETWORK: %s\n' "$*" | tee -a "$out/chart.log"; }
# clines: PASS:/FAIL:/SKIP: lines on stdin, each counted as cpass/cfail/cskip.
clines() {
  local line
  while IFS= read -r line; do
    case $line in
      PASS:*) cpass "${line#PASS: }" ;;
      FAIL:*) cfail "${line#FAIL: }" ;;
      SKIP:*) cskip "${line#SKIP: }" ;;
      *) [[ -z $line ]] || printf '%s\n' "$line" | tee -a "$out/chart.log" ;;
    esac
  done
  return 0
}

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

# bundled_tool NAME: the path of a tool this machine lacks: the one
# bundle-images packed beside the images (NAME.xz; the GPU machine has no Go
# to build it), unpacked into $dir/bin, else hack/tools.sh builds it.
bundled_tool() {
  if [[ -f $images/$1.xz ]]; then
    mkdir -p "$dir/bin"
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$images/$1.xz" "$dir/bin/$1" && chmod 0755 "$dir/bin/$1" && echo "$dir/bin/$1"
  else
    "$here/tools.sh" "$1"
  fi
}

# --- a real Prometheus scraping the release while the jobs run ----------------------
# chart_prom_start: Prometheus started against the release (hack/prom-check.py:
# Kubernetes service discovery of the metrics Services through the API
# server); $prom_dir is its folder, empty when it did not start.
chart_prom_start() {
  local prom t
  prom_dir=
  prom=$(bundled_tool prometheus 2>>"$out/chart.log") ||
    { cfail "Prometheus: no $images/prometheus.xz and hack/tools.sh prometheus could not build it"; return 1; }
  prom_dir=$(mktemp -d /tmp/vramfit-prom.XXXXXX)
  t=$(now_ms)
  if python3 "$here/prom-check.py" start --prometheus "$prom" --kubeconfig "$KUBECONFIG" --dir "$prom_dir" \
      --namespace "$ns" --release "$release" >>"$out/chart.log" 2>&1; then
    cpass "Prometheus (github.com/prometheus/prometheus $(awk '$1 == "github.com/prometheus/prometheus" {print $2}' "$here/tools/prometheus/go.mod"), built from its Go module) started after $(secs "$t" "$(now_ms)")s, Kubernetes service discovery through the API server"
  else
    cfail "Prometheus did not start: $(tail -3 "$prom_dir/prometheus.log" 2>/dev/null | paste -sd' ' -)"
    prom_dir=
    return 1
  fi
}

# chart_prom_check: once a training pod's process runs on a GPU, every target
# of the controller and the agent up, then every query of the dashboard
# (PASS:, FAIL:, NEEDS GPU: and NEEDS EVENT: lines on stdout).
chart_prom_check() {
  [[ -n $prom_dir ]] || { echo "FAIL: no Prometheus to check the release's metrics with"; return; }
  gpu_process() { [[ -n $(kubectl get gpunode "$node" -o jsonpath='{.status.gpus[*].processes[*].podName}' 2>/dev/null) ]]; }
  within 240 gpu_process || echo "FAIL: Prometheus: no training process on a GPU within 240s (the per-pod series need one)"
  python3 "$here/prom-check.py" targets --dir "$prom_dir" --component all --wait 120 || true
  python3 "$here/prom-check.py" query --dir "$prom_dir" --component all --wait 150 --want-events || true
}

# --- the memory-elastic pair, once the demo's jobs are done ----------------------------
# chart_elastic: two identical memory-elastic GPT-2 jobs (nodecfg.py
# elastic-jobs) whose preferred shape does not fit twice on the empty GPU,
# applied by alice: one must take its preferred shape, the other start at
# the same time with a smaller micro-batch (the same global batch), and both
# end with the same held-out loss (report.py elastic: PASS:/FAIL: lines on
# stdout).
chart_elastic() {
  local jobs=$dir/elastic-jobs.json n pod ns_e=team-a logs=()
  python3 "$here/node/nodecfg.py" elastic-jobs --repo "$repo" --python "$venv/bin/python" --image "$TRAIN_IMAGE" \
    --namespace "$ns_e" >"$jobs" || { echo "FAIL: elastic pair: nodecfg.py elastic-jobs"; return; }
  # The GPU empty first: every budget of the demo released.
  local committed='{.status.allocation.committedBytes}'
  empty() { [[ $(kubectl get gpunode "$node" -o jsonpath="$committed" 2>/dev/null) == 0 ]]; }
  within 120 empty || echo "elastic: the GPU still has budgets committed: $(kubectl get gpunode "$node" -o jsonpath="$committed")" >&2
  kubectl --as alice apply -n "$ns_e" -f "$jobs" >&2 || { echo "FAIL: elastic pair: kubectl --as alice apply"; return; }
  done_or_failed() {
    local p
    for n in elastic-a elastic-b; do
      p=$(kubectl get tj -n "$ns_e" "$n" -o jsonpath='{.status.phase}' 2>/dev/null)
      [[ $p == Succeeded || $p == Failed ]] || return 1
    done
  }
  within 420 done_or_failed || echo "elastic: not both ended within 420s" >&2
  kubectl get tj -n "$ns_e" elastic-a elastic-b -o json >"$dir/elastic-tj.json" 2>/dev/null
  kubectl get events -n "$ns_e" -o json >"$dir/elastic-events.json" 2>/dev/null
  for n in elastic-a elastic-b; do
    pod=$(kubectl get tj -n "$ns_e" "$n" -o jsonpath='{.status.podName}' 2>/dev/null)
    [[ -n $pod ]] || pod=$n-a$(kubectl get tj -n "$ns_e" "$n" -o jsonpath='{.status.attempt}' 2>/dev/null)
    kubectl logs -n "$ns_e" "$pod" -c train >"$dir/elastic-$n.log" 2>/dev/null || true
    logs+=(--log "$n=$dir/elastic-$n.log")
  done
  cp "$dir/elastic-tj.json" "$out/elastic-tj.json" 2>/dev/null || true
  python3 "$here/node/report.py" elastic --jobs "$dir/elastic-tj.json" --events "$dir/elastic-events.json" "${logs[@]}" || true
  kubectl get tj -n "$ns_e" elastic-a elastic-b -o custom-columns=NAME:.metadata.name,PHASE:.status.phase,SHAPE:.status.batchShape,BUDGET:.status.budgetBytes >&2 || true
  kubectl delete tj -n "$ns_e" elastic-a elastic-b --wait=false >/dev/null 2>&1 || true
}

# --- operating the release while the jobs run ----------------------------------------

# jobs_in PHASE...: how many of the demo's TrainingJobs are in one of the phases.
jobs_in() {
  demo_get tj | python3 -c '
import json, sys
want = set(sys.argv[1:])
print(sum(1 for j in json.load(sys.stdin)["items"] if ((j.get("status") or {}).get("phase") or "Pending") in want))' "$@"
}

# The state a job is in while nothing is about to create one of its pods:
# running (or done). Any other (Pending, Profiling, Placed, Retrying) means
# the controller creates a pod soon.
jobs_quiet() { [[ $(jobs_in Pending Profiling Placed Retrying) == 0 && $(jobs_in Running) -gt 0 ]]; }

# pod_started_ms NAMESPACE POD CONTAINER: when the container started (ms), empty if not yet.
pod_started_ms() {
  kubectl get pod -n "$1" "$2" -o json 2>/dev/null | python3 -c '
import datetime as dt, json, sys
p = json.load(sys.stdin)
for c in (p.get("status") or {}).get("containerStatuses") or []:
    t = ((c.get("state") or {}).get("running") or {}).get("startedAt")
    if c.get("name") == sys.argv[1] and t:
        print(int(dt.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1000))' "$3"
}

# gn_heartbeat_ms: the GpuNode's heartbeat (ms), empty while there is none
# (the agent writes nanoseconds, which Python before 3.11 does not parse).
gn_heartbeat_ms() {
  kubectl get gpunode "$node" -o jsonpath='{.status.heartbeat}' 2>/dev/null | python3 -c '
import datetime as dt, re, sys
t = re.sub(r"(\.\d{6})\d+", r"\1", sys.stdin.read().strip()).replace("Z", "+00:00")
print(int(dt.datetime.fromisoformat(t).timestamp() * 1000) if t else "")'
}

# gn_snapshot FILE: the GpuNode and the demo's jobs, for report.py peaks.
gn_snapshot() {
  kubectl get gpunode "$node" -o json >"$1.gn" 2>/dev/null
  demo_get tj >"$1.tj"
  python3 -c '
import json, sys
def load(f):
    try:
        return json.load(open(f))
    except (OSError, ValueError):
        return {}
json.dump({"gpunode": load(sys.argv[1] + ".gn"), "jobs": load(sys.argv[1] + ".tj")}, open(sys.argv[1], "w"))' "$1"
  rm -f "$1.gn" "$1.tj"
}

# chart_operate HELM APPLY_MS: what a platform team does to a release
# while its jobs run, started in the background once the jobs are applied:
#   1. the leader's pod deleted: the standby (or the replacement) takes the
#      Lease, the Deployment is back to its replicas (SKIP with one replica:
#      the host network, no standby);
#   2. the agent's pod deleted at a moment no pod of a job is due (every job
#      running or done): the DaemonSet's new pod Ready, its NRI sidecar
#      registered, and its first status keeps the running processes' peaks
#      (report.py peaks; SKIP without a GPU: the agent is off then);
#   3. `helm upgrade` with the values files of the install and
#      controller.policy changed: the Deployment rolls to pods with the new
#      flag, one of them holds the Lease.
# Each with the number of jobs Running when it was done (none: FAIL, nothing
# was tried); every wait bounded in wall-clock time (within). PASS:/FAIL:/SKIP: lines on stdout; what was done and when in
# $dir/ops.json, which report.py operations judges after the run (no job
# lost, doubled or over-committed, the events).
chart_operate() {
  # Its own background shell: a command that fails (an API call refused
  # while a pod goes) is reported by the check, not the end of this shell.
  set +e
  local helm=$1 apply_ms=$2 running holder took who policy=best-fit
  local leader_ms= agent_ms= upgrade_ms= leader_json=null agent_json=null upgrade_json=null
  within 240 eval '[[ $(jobs_in Running) -gt 0 ]]' || echo "FAIL: operations: no job Running within 240 s of the apply"

  # 1. The leader.
  if ((controllers > 1)); then
    within 60 eval '[[ -n $(lease_holder) ]]' || true
    holder=$(lease_holder)
    local before
    before=$(ready_pods controller)
    if [[ -n $holder ]] && grep -qx "$holder" <<<"$before"; then
      running=$(jobs_in Running)
      leader_ms=$(now_ms)
      kubectl delete pod -n "$ns" "$holder" --wait=false >/dev/null
      new_holder() { local h; h=$(lease_holder); [[ -n $h && $h != "$holder" ]] && kubectl get pod -n "$ns" "$h" >/dev/null; }
      if within 90 new_holder; then
        took=$(secs "$leader_ms" "$(now_ms)")
        who="the replacement pod"
        grep -qx "$(lease_holder)" <<<"$before" && who="the standby replica"
        [[ $running -gt 0 ]] && echo "PASS: operations: the leader's pod $holder deleted with $running jobs Running: $(lease_holder), $who, took the Lease after ${took}s" ||
          echo "FAIL: operations: the leader's pod $holder deleted, but no job was Running then (nothing tried)"
      else
        echo "FAIL: operations: the leader's pod $holder deleted: no other replica took the Lease within 90s (holder: $(lease_holder))"
      fi
      leader_json="{\"ms\": $leader_ms, \"old\": \"$holder\", \"new\": \"$(lease_holder)\", \"running\": $running}"
      back() { [[ $(count_ready controller) == "$controllers" && $(kubectl get pods -n "$ns" -l "$(sel controller)" --no-headers 2>/dev/null | wc -l) == "$controllers" ]]; }
      if within 180 back; then
        echo "PASS: operations: the controller Deployment back to $controllers Ready replicas $(secs "$leader_ms" "$(now_ms)")s after the leader's pod was deleted"
      else
        echo "FAIL: operations: the controller Deployment not back to $controllers Ready replicas within 180s: $(kubectl get pods -n "$ns" -l "$(sel controller)" --no-headers 2>&1 | paste -sd, -)"
      fi
    else
      echo "FAIL: operations: the Lease $release-controller names '$holder', not one of the Ready replicas ($(paste -sd' ' <<<"$before"))"
    fi
  else
    echo "SKIP: operations: the leader's pod deleted while the jobs run: one controller replica, no standby to take over (the chart's pods on the host network; no pod network: $no_bridge_why)"
  fi

  # 2. The agent.
  if ((gpu)); then
    local old new t_ready hb before_f=$dir/ops-agent-before.json after_f=$dir/ops-agent-after.json peaks
    # A moment no pod of a job is due: the NRI plugin goes with the agent's
    # pod, and a container created before the new pod's sidecar registers
    # would get no GPU.
    local quiet="no pod of a job due"
    within 60 jobs_quiet || quiet="after 60s still a pod of a job due: $(jobs_in Pending Profiling Placed Retrying) jobs Pending, Profiling, Placed or Retrying"
    old=$(ready_pods agent | head -1)
    running=$(jobs_in Running)
    gn_snapshot "$before_f"
    # Its sidecar's log (the GPUs it gave) goes with the pod: kept here, for
    # the count of training containers given their GPU after the demo; again
    # once the pod is being deleted (the sidecar stops last).
    kubectl logs -n "$ns" "$old" -c nri-cdi >"$dir/nri-cdi-$old.log" 2>/dev/null
    agent_ms=$(now_ms)
    kubectl delete pod -n "$ns" "$old" --wait=false >/dev/null
    kubectl logs -n "$ns" "$old" -c nri-cdi >"$dir/nri-cdi-$old.log.2" 2>/dev/null &&
      [[ $(wc -l <"$dir/nri-cdi-$old.log.2") -ge $(wc -l <"$dir/nri-cdi-$old.log") ]] &&
      mv "$dir/nri-cdi-$old.log.2" "$dir/nri-cdi-$old.log"
    rm -f "$dir/nri-cdi-$old.log.2"
    new_agent() { new=$(ready_pods agent | head -1); [[ -n $new && $new != "$old" ]]; }
    if within 120 new_agent; then
      t_ready=$(now_ms)
      [[ $running -gt 0 ]] && echo "PASS: operations: the agent's pod $old deleted with $running jobs Running ($quiet): the DaemonSet's $new Ready after $(secs "$agent_ms" "$t_ready")s" ||
        echo "FAIL: operations: the agent's pod $old deleted, but no job was Running then (nothing tried)"
      local why
      if why=$(nri_sidecar_check); then
        echo "PASS: operations: the new agent pod's NRI sidecar registered: $why"
      else
        echo "FAIL: operations: the new agent pod's NRI sidecar: $why"
      fi
      # The new agent's first status: a heartbeat after its container started.
      local started
      started=$(pod_started_ms "$ns" "$new" agent)
      new_status() { hb=$(gn_heartbeat_ms); [[ -n $hb && -n $started && $hb -gt $started ]]; }
      if within 90 new_status; then
        gn_snapshot "$after_f"
        if peaks=$(python3 "$here/node/report.py" peaks --before "$before_f" --after "$after_f"); then
          echo "PASS: operations: the new agent's first status ($(secs "$agent_ms" "$hb")s after the old pod's deletion) keeps the peaks of the running processes: $peaks"
        else
          echo "FAIL: operations: the new agent's first status does not keep the running processes' peaks: $peaks"
        fi
      else
        echo "FAIL: operations: no GpuNode status from the new agent $new within 90s (heartbeat $(kubectl get gpunode "$node" -o jsonpath='{.status.heartbeat}'))"
      fi
    else
      echo "FAIL: operations: the agent's pod $old deleted: no new agent pod Ready within 120s"
    fi
    agent_json="{\"ms\": $agent_ms, \"old\": \"$old\", \"new\": \"${new:-}\", \"running\": $running, \"readyMs\": ${t_ready:-null}}"
  else
    echo "SKIP: operations: the agent's pod deleted while the jobs run: no GPU here, the agent is off and the GpuNode simulated (its pod replaced without jobs: hack/node-chart.sh)"
  fi

  # 3. helm upgrade with a changed value.
  local agents_before agents_after
  agents_before=$(kubectl get pods -n "$ns" -l "$(sel agent)" -o name 2>/dev/null | sort | paste -sd' ' -)
  running=$(jobs_in Running)
  upgrade_ms=$(now_ms)
  # The node's values files as installed (without a GPU, the one that keeps
  # the agent off too), the one value changed.
  if (cd "$repo" && "$helm" upgrade "$release" charts/vramfit -n "$ns" "${values_files[@]}" --set controller.policy=$policy) >>"$dir/operate-helm.log" 2>&1; then
    rolled() {
      kubectl rollout status deployment "$release-controller" -n "$ns" --timeout=1s >/dev/null 2>&1 || return 1
      [[ $(kubectl get pods -n "$ns" -l "$(sel controller)" --no-headers 2>/dev/null | wc -l) == "$controllers" ]] || return 1
      local p
      for p in $(ready_pods controller); do
        kubectl get pod -n "$ns" "$p" -o jsonpath='{.spec.containers[0].args}' | grep -q -- "--policy=$policy" || return 1
      done
      [[ -n $(lease_holder) ]] && ready_pods controller | grep -qx "$(lease_holder)"
    }
    if within 240 rolled; then
      # The agent's pods are the same (none without a GPU): a changed
      # controller value rolls no agent under running jobs.
      agents_after=$(kubectl get pods -n "$ns" -l "$(sel agent)" -o name 2>/dev/null | sort | paste -sd' ' -)
      if [[ $running -gt 0 && $agents_after == "$agents_before" ]]; then
        echo "PASS: operations: helm upgrade --set controller.policy=$policy with $running jobs Running: the Deployment rolled to $controllers Ready pods with --policy=$policy after $(secs "$upgrade_ms" "$(now_ms)")s, the Lease held by $(lease_holder); the agent's pods unchanged (${agents_after:-none})"
      elif [[ $running -gt 0 ]]; then
        echo "FAIL: operations: helm upgrade --set controller.policy=$policy changed the agent's pods: '${agents_before:-none}' -> '${agents_after:-none}'"
      else
        echo "FAIL: operations: helm upgrade --set controller.policy=$policy rolled, but no job was Running then (nothing tried)"
      fi
    else
      local hint=
      ((controllers == 1)) && hint="one replica on the host network: the rolling update's new pod wants the old one's host ports; "
      echo "FAIL: operations: helm upgrade --set controller.policy=$policy: the Deployment did not roll within 240s (${hint}$(kubectl get pods -n "$ns" -l "$(sel controller)" --no-headers 2>&1 | awk '{print $1 " " $2 " " $3}' | paste -sd, -); $(kubectl get events -n "$ns" --field-selector reason=FailedScheduling -o jsonpath='{.items[-1:].message}' 2>/dev/null))"
    fi
  else
    echo "FAIL: operations: helm upgrade --set controller.policy=$policy: $(tail -3 "$dir/operate-helm.log" | paste -sd' ' -)"
  fi
  upgrade_json="{\"ms\": $upgrade_ms, \"running\": $running, \"set\": \"controller.policy=$policy\"}"
  printf '{"applyMs": %s, "leader": %s, "agent": %s, "upgrade": %s}\n' "$apply_ms" "$leader_json" "$agent_json" "$upgrade_json" >"$dir/ops.json"
}

chart_demo() {
  local version api_host api_port values t0 t_install controllers=2 gpu=1 no_bridge_why= values_files=()
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

  # The node's values: pods reach the API server on the bridge (the pod
  # network, wherever vramfit-podnet's trial passed at `up`), else from the
  # host network, where one controller replica fits (each binds its metrics
  # port), so that there is no standby to take over from the leader.
  local cvals="" avals choice
  choice=$(cat "$dir/pod-network-choice" 2>/dev/null || echo "none: no record of the choice")
  no_bridge_why=${choice#none: }
  if [[ $pod_network == 1 ]]; then
    read -r api_host api_port <"$dir/pod-network"
    cnote "pod network: ${choice#bridge: }; the chart's pods on it, ${controllers} controller replicas with leader election"
  else
    cnote "host network for the chart's pods, 1 controller replica (no pod network: $no_bridge_why); tenants' pods isolated (lo alone)"
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
  values_files=(-f "$values")
  (cd "$repo" && chart_node_values "$api_host" "$api_port" "$version" "$cvals" "$avals") >"$values"
  # The level every TrainingJob's template is held to at apply: one for the
  # whole cluster (the chart's tenancy.podSecurity), the lower of the
  # tenants' (team-a enforces baseline); Pod Security admission holds team-b's
  # pods to restricted when the controller creates them.
  printf 'tenancy:\n  podSecurity: baseline\n' >>"$values"
  log "values: $(tr '\n' ' ' <"$values")"

  # helm: on PATH, else the one bundle-images packed beside the images (the
  # GPU machine has no Go to build it), else hack/tools.sh builds it.
  local helm=helm
  command -v helm >/dev/null || helm=$(bundled_tool helm) || helm=
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
    # A values file of its own, so that every later upgrade keeps it off.
    printf 'agent:\n  enabled: false\n' >"$out/values-no-agent.yaml"
    values_files+=(-f "$out/values-no-agent.yaml")
    if (cd "$repo" && "$helm" upgrade "$release" charts/vramfit -n "$ns" "${values_files[@]}") >>"$out/chart.log" 2>&1 &&
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

  local prom_dir= prom_pid=
  ((gpu)) && chart_prom_start

  # Tenants: team-a (alice, Pod Security baseline enforced) and team-b (bob, restricted).
  python3 "$here/node/attacks.py" tenants 2>>"$out/chart.log" || { cfail "tenant namespaces and users"; return 1; }
  demo_namespaces=(team-a team-b)
  local jobs=$dir/demo-jobs.json
  python3 "$here/node/nodecfg.py" jobs --repo "$repo" --python "$venv/bin/python" --image "$TRAIN_IMAGE" \
    --namespaces team-a,team-b --steps "$steps" $( ((gpu)) || echo --cpu) >"$jobs"
  # Each tenant applies the jobs of their own namespace.
  demo_apply() {
    local user n part t_apply
    t_apply=$(now_ms)
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
    # The release operated while the jobs run (its lines in operate.txt).
    chart_operate "$helm" "$t_apply" >"$dir/operate.txt" 2>>"$out/chart.log" &
    operate_pid=$!
    # With a GPU: the dashboard's every query against the real Prometheus
    # while the jobs run (without one, hack/node-chart.sh checks it in CI).
    if ((gpu)); then
      chart_prom_check >"$dir/prom.txt" 2>>"$out/chart.log" &
      prom_pid=$!
    fi
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
  local rc=0 attacks_pid= operate_pid=
  rm -f "$dir/operate.txt" "$dir/ops.json" "$dir/prom.txt" "$dir"/nri-cdi-*.log
  demo_run "$jobs" "$cdi" --attacks --watch "$watch" || rc=$?
  kill "$watch_pid" 2>/dev/null || true
  wait "$watch_pid" 2>/dev/null || true
  cp "$watch" "$out/watch.jsonl" 2>/dev/null || true
  grep '^TIME: ' "$dir/summary.txt" >>"$out/chart.log" || true
  # (A FAIL among the attacks is counted below, from attacks.txt.)
  [[ -z $attacks_pid ]] || wait "$attacks_pid" || true
  # The operations done while the jobs ran, then what they must not have
  # cost, judged over the whole run.
  [[ -z $operate_pid ]] || wait "$operate_pid" || true
  echo
  if [[ -f $dir/operate.txt ]]; then
    clines <"$dir/operate.txt"
  else
    cfail "operations: no record of them ($dir/operate.txt)"
  fi
  cp "$dir/ops.json" "$out/ops.json" 2>/dev/null || true
  if ((gpu)); then
    [[ -z $prom_pid ]] || wait "$prom_pid" || true
    if [[ -s $dir/prom.txt ]]; then
      clines <"$dir/prom.txt"
    else
      cfail "Prometheus: no check of the release's metrics ran ($dir/prom.txt)"
    fi
    [[ -z $prom_dir ]] || python3 "$here/prom-check.py" stop --dir "$prom_dir" >/dev/null 2>&1 || true
  fi
  # (Not a pipe: clines counts in this shell.)
  clines < <(python3 "$here/node/report.py" operations --ops "$dir/ops.json" --jobs "$dir/tj.json" \
    --gpunode "$dir/gpunode.json" --watch "$out/watch.jsonl" --samples "$dir/gpunode-samples.jsonl" \
    --events "$dir/events.json" 2>>"$out/chart.log")
  # Attack e's job, once the demo's jobs are done (its placement would take
  # room from them): bob's template that restricted refuses runs nothing.
  python3 "$here/node/attacks.py" restricted-job --release "$release" --image "$TRAIN_IMAGE" \
    --out "$out/attacks-restricted.json" >>"$dir/attacks.txt" 2>&1 || true
  # The memory-elastic pair on the empty GPU (issue: elastic placement).
  if ((gpu)); then
    clines < <(chart_elastic 2>>"$out/chart.log")
    cp "$dir"/elastic-elastic-*.log "$out/" 2>/dev/null || true
  fi
  # team-b's pods, the controller's, admitted under restricted.
  local bpods
  bpods=$(python3 -c '
import json, sys
names = sorted({r["name"] for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "Pod" and r.get("namespace") == "team-b"
                and r.get("type") == "ADDED"})
print(len(names), " ".join(names))' "$out/watch.jsonl" 2>/dev/null || echo 0)
  if [[ $(kubectl get ns team-b -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}') == restricted && ${bpods%% *} -gt 0 ]]; then
    cpass "team-b enforces Pod Security restricted: the controller's ${bpods%% *} pods there admitted (${bpods#* })"
  else
    cfail "team-b enforces Pod Security restricted, the controller's pods there admitted: label '$(kubectl get ns team-b -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')', pods seen: ${bpods}"
  fi
  [[ -z $keepalive ]] || kill "$keepalive" 2>/dev/null || true
  if ((gpu)); then
    # Every training container's GPU came from the sidecar: of the agent
    # pod now, and of those the operations deleted (their logs kept).
    local given pods_now
    pods_now=$(ready_pods agent | paste -sd' ' -)
    given=$( { cat "$dir"/nri-cdi-*.log 2>/dev/null; for p in $pods_now; do kubectl logs -n "$ns" "$p" -c nri-cdi 2>/dev/null; done; } |
      grep -c ' container [^ ]*: nvidia.com/gpu=GPU-' || true)
    if ((given > 0)); then
      cpass "the agent pods' sidecars gave $given training containers their GPUs ($agent_pod, then ${pods_now:-none}; container nri-cdi)"
    else
      cfail "no training container's GPU in the log of the agent pods' nri-cdi ($agent_pod, then ${pods_now:-none})"
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
