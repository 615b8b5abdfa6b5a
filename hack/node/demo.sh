# The GPU node demo (sourced by hack/gpunode.sh, which brought the node up):
# applies the demo TrainingJobs, waits until each is Succeeded or Failed, then
# prints and records what happened: the times (apply to first training step,
# OOM to the next attempt's first step), `kubectl get tj`, `vramfit status`,
# the GpuNode, and checks the outcome. Raw results go to $out (two files:
# demo.json and demo.log).
#
# demo: the jobs with the node's folders mounted, in namespace ml, the
# controller and agent host processes. demo_run is the part the chart mode
# (hack/node/chartdemo.sh) shares: it applies through demo_apply, looks at the
# namespaces in demo_namespaces, and runs `vramfit` through demo_vramfit.

demo_python() {
  # The interpreter the training pods run and the host folders it needs.
  if [[ -x /opt/torch/.venv/bin/python ]]; then
    echo /opt/torch/.venv/bin/python
    echo /opt/torch/.venv
    python3 "$here/node/nodecfg.py" venv-base /opt/torch/.venv
  else
    local py
    py=$(python3 -c 'import sys, os; print(os.path.realpath(sys.executable))')
    echo "$py"
    python3 -c 'import sys; print(sys.base_prefix)'
  fi
}

oci_devices() {
  local ctr=("$nodebin/ctr" --address "$dir/containerd.sock" -n k8s.io) id
  for id in $("${ctr[@]}" containers ls -q 2>/dev/null); do
    "${ctr[@]}" containers info "$id" 2>/dev/null
  done | python3 "$here/node/nodecfg.py" oci-devices || true
}

demo_setup() {
  export KUBECONFIG=$dir/controlplane/kubeconfig
  [[ -x $dir/bin/kube ]] && nodebin=$dir/bin
  export PATH=$nodebin:$PATH
  node=$(cat "$dir/node-name")
  out=${out:-$dir/demo-out}
  mkdir -p "$out"
  gpu=1
  [[ -e /dev/nvidiactl ]] || gpu=0
}

# demo_get KIND: the objects of KIND in every namespace of demo_namespaces, one List.
demo_get() {
  local n
  for n in "${demo_namespaces[@]}"; do kubectl get "$1" -n "$n" -o json; done |
    python3 -c '
import json, sys
text, dec, items, i = sys.stdin.read(), json.JSONDecoder(), [], 0
while i < len(text):
    if text[i] == "{":
        doc, i = dec.raw_decode(text, i)
        items += doc.get("items", [])
    else:
        i += 1
json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)'
}

# The pods' log folders (the controller deletes an attempt's pod when it
# starts the next, and the kubelet its logs with it): a copy for the report.
demo_keep_logs() {
  local n
  for n in "${demo_namespaces[@]}"; do cp -r /var/log/pods/"${n}"_* "$1/" 2>/dev/null || true; done
}

demo() {
  local vb
  demo_setup
  vb=$(cat "$dir/vramfit-bin")

  local py roots=()
  mapfile -t py < <(demo_python)
  local root
  for root in "${py[@]:1}"; do roots+=(--root "$root"); done
  local jobs=$dir/demo-jobs.json alloc=()
  # The in-process allocator, from the vramfit binaries (bundle-vramfit packs it).
  if [[ -f $vb/libvramfit_alloc.so ]]; then
    alloc=(--allocator-lib "$vb/libvramfit_alloc.so")
  else
    log "no libvramfit_alloc.so in $vb: the pods fall back to the memory fraction"
  fi
  python3 "$here/node/nodecfg.py" jobs --repo "$repo" --python "${py[0]}" "${roots[@]}" --steps "$steps" \
    "${alloc[@]}" $( ((gpu)) || echo --cpu) >"$jobs"
  local cdi=$dir/cdi/nvidia.json
  if ((!gpu)); then
    # No GPU here: a CDI spec for the simulated GPUs, with stand-in device
    # nodes (/dev/null's numbers) and the simulated GPU's variable, so the pods
    # take the same CDI path, device nodes included, as on a GPU node.
    cdi=$dir/cdi/simulated.json
    kubectl get gpunode "$node" -o json | python3 "$here/node/nodecfg.py" cdi-simulated --dev "$dir/fake-dev" >"$cdi"
  fi

  kubectl apply -f "$repo/examples/00-namespace.yaml" >/dev/null
  demo_namespaces=(ml)
  demo_apply() { kubectl apply -f "$1" >/dev/null; }
  demo_vramfit() { "$vb/vramfit" "$@"; }
  demo_run "$jobs" "$cdi"
}

# demo_run JOBS CDI [REPORT_ARG...]: applies the jobs (demo_apply), waits,
# records and reports; the extra arguments go to report.py.
demo_run() {
  local jobs=$1 cdi=$2 t0
  shift 2
  log "applying $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["items"]))' "$jobs") TrainingJobs"
  t0=$(now_ms)
  demo_apply "$jobs"
  local deadline=$(( $(date +%s) + ${VRAMFIT_DEMO_TIMEOUT:-420} )) left
  # The GpuNode as the agent rewrites it, one line a sample: the training
  # processes (and their allocator counters) are gone from the last one.
  local samples=$dir/gpunode-samples.jsonl
  : >"$samples"
  local podlogs=$dir/pod-logs
  rm -rf "$podlogs" && mkdir -p "$podlogs"
  while :; do
    { kubectl get gpunode "$node" -o json 2>/dev/null | tr -d '\n'; echo; } >>"$samples"
    # The controller deletes an attempt's pod when it starts the next, and
    # the kubelet its logs with it: keep a copy for the report.
    demo_keep_logs "$podlogs"
    left=$(demo_get tj | python3 -c 'import json,sys; print(sum(1 for j in json.load(sys.stdin)["items"] if (j.get("status") or {}).get("phase") not in ("Succeeded", "Failed")))')
    [[ $left == 0 ]] && break
    if (( $(date +%s) > deadline )); then
      log "timed out with $left job(s) not finished"
      break
    fi
    sleep 2
  done
  local t1
  t1=$(now_ms)

  local n
  {
    for n in "${demo_namespaces[@]}"; do
      echo "== kubectl get tj -n $n -o wide"
      kubectl get tj -n "$n" -o wide
      echo
      echo "== kubectl get pods -n $n -o wide"
      kubectl get pods -n "$n" -o wide
      echo
    done
    if demo_vramfit status --help >/dev/null 2>&1; then
      echo "== vramfit status"
      demo_vramfit status 2>&1 || true
      echo
    fi
    echo "== kubectl get gpunode $node -o yaml"
    kubectl get gpunode "$node" -o yaml
    echo
    for n in "${demo_namespaces[@]}"; do
      echo "== events ($n)"
      kubectl get events -n "$n" --sort-by=.lastTimestamp 2>&1 | tail -60
      echo
    done
    # What containerd put in each training container's OCI spec: the device
    # nodes and device-cgroup rules CDI added (and whether it is privileged).
    echo "== OCI spec devices of the training containers (ctr containers info)"
    oci_devices
  } >"$out/demo.log" 2>&1

  # Who the kubelet is to the API server (its own kubeconfig): the report
  # checks it is the node's user, which may not create namespaces.
  local ident=$dir/kubelet-identity.json kk=(kubectl --kubeconfig "$dir/kubelet/kubeconfig")
  python3 - "$ident" "$("${kk[@]}" auth whoami -o json 2>&1 | tr -d '\n')" \
    "$("${kk[@]}" auth can-i create namespaces 2>/dev/null || true)" <<'EOF'
import json, sys
try:
    who = json.loads(sys.argv[2]).get("status", {}).get("userInfo", {})
except ValueError:
    who = {"error": sys.argv[2][:300]}
answer = (sys.argv[3].strip().splitlines() or [""])[-1].strip()
json.dump({"userInfo": who, "canCreateNamespaces": answer}, open(sys.argv[1], "w"))
EOF

  # Everything the summary needs, in one JSON document: the jobs, the pods,
  # the GpuNode and each pod's vramfit-train events from its log.
  demo_get tj >"$dir/tj.json"
  demo_get pods >"$dir/pods.json"
  kubectl get gpunode "$node" -o json >"$dir/gpunode.json"
  demo_get events >"$dir/events.json"
  demo_keep_logs "$podlogs"
  local rc=0
  python3 "$here/node/report.py" --apply-ms "$t0" --end-ms "$t1" --gpu "$gpu" \
    --jobs "$dir/tj.json" --pods "$dir/pods.json" --gpunode "$dir/gpunode.json" \
    --logs "$podlogs" --cdi "$cdi" --samples "$samples" --kubelet-identity "$ident" --node "$node" --events "$dir/events.json" --out "$out/demo.json" "$@" >"$dir/summary.txt" || rc=$?
  cat "$out/demo.log"
  echo
  cat "$dir/summary.txt"
  cat "$dir/summary.txt" >>"$out/demo.log"
  return $rc
}
