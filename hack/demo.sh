#!/usr/bin/env bash
# The demo in one command: the local control plane, the CRDs, the example jobs,
# a simulated GPU node (`vramfit-agent run --simulate 2xH200`: it registers the
# Node, reports its GpuNode and plays the kubelet, so the training pods run as
# simulated processes) and the controller, which predicts, places and runs the
# jobs.
#
#   hack/demo.sh        bring it up and show `vramfit status` and `kubectl get tj -n ml`
#   hack/demo.sh --dev  the same with debug binaries (a faster first build)
#   hack/demo.sh down   stop the controller and the control plane
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/vramfit/target}
state=$HOME/.cache/vramfit/demo
mkdir -p "$state"

log() { printf 'demo: %s\n' "$*" >&2; }

if [[ ${1:-} == down ]]; then
  for p in controller agent; do
    if [[ -f $state/$p.pid ]]; then
      kill "$(cat "$state/$p.pid")" 2>/dev/null || true
      rm -f "$state/$p.pid"
    fi
  done
  hack/controlplane.sh down --dir "$state/controlplane"
  exit 0
fi

profile=release
profile_flag=(--release)
if [[ ${1:-} == --dev ]]; then
  profile=debug
  profile_flag=()
fi
bin=$CARGO_TARGET_DIR/$profile
if [[ ! -x $bin/vramfit || ! -x $bin/vramfit-agent ]]; then
  log "building vramfit and vramfit-agent (sim feature, $profile) into $CARGO_TARGET_DIR: the first build compiles about 400 crates, 5 to 15 minutes; later runs take seconds"
else
  log "building vramfit and vramfit-agent (sim feature, $profile, up to date unless the sources changed)"
fi
cargo build "${profile_flag[@]}" -p vramfit --bin vramfit
# The simulated node is not in the shipped agent: the `sim` feature adds it.
cargo build "${profile_flag[@]}" -p vramfit-agent --features sim --bin vramfit-agent
if [[ ! -x ${VRAMFIT_BIN:-$HOME/.cache/vramfit/bin}/node/kube ]]; then
  log "building kube (kube-apiserver and more) and etcd from their Go modules (once, about 10 minutes)"
fi
log "starting the local control plane (kube-apiserver + etcd on loopback)"
kubeconfig=$(hack/controlplane.sh up --dir "$state/controlplane")
export KUBECONFIG=$kubeconfig
hack/controlplane.sh crds --kubeconfig "$kubeconfig"

log "starting the simulated GPU node demo-gpu-1 (log: $state/agent.log)"
if [[ -f $state/agent.pid ]]; then
  kill "$(cat "$state/agent.pid")" 2>/dev/null || true
fi
"$bin/vramfit-agent" run --simulate 2xH200 --node demo-gpu-1 \
  --sim-run 60s >"$state/agent.log" 2>&1 &
echo $! >"$state/agent.pid"
for _ in $(seq 1 60); do
  kubectl get gpunode demo-gpu-1 -o jsonpath='{.status.heartbeat}' 2>/dev/null | grep -q . && break
  sleep 0.5
done

log "starting the controller (log: $state/controller.log, metrics and /ui: http://127.0.0.1:18080)"
if [[ -f $state/controller.pid ]]; then
  kill "$(cat "$state/controller.pid")" 2>/dev/null || true
fi
"$bin/vramfit" controller --no-leader-election \
  --metrics-addr 127.0.0.1:18080 --ui-addr 127.0.0.1:18080 >"$state/controller.log" 2>&1 &
echo $! >"$state/controller.pid"

log "applying examples/ (namespace ml) and waiting for the jobs to run"
kubectl apply -f examples/ >/dev/null
for _ in $(seq 1 60); do
  waiting=$(kubectl get tj -n ml -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -cvxE 'Running|Succeeded' || true)
  [[ $waiting == 0 ]] && break
  sleep 1
done
# The agent's next report carries what the running jobs measure.
for _ in $(seq 1 30); do
  "$bin/vramfit" status -o json 2>/dev/null | python3 -c '
import json, sys
jobs = [j for n in json.load(sys.stdin)["nodes"] for g in n["gpus"] for j in g["jobs"]]
sys.exit(0 if jobs and all(j.get("measuredBytes") for j in jobs) else 1)' && break
  sleep 1
done
"$bin/vramfit" status --color never
echo
kubectl get tj -n ml
cat <<EOF

The demo runs. In another shell, point kubectl and vramfit at it first:
  export KUBECONFIG=$kubeconfig
  export PATH=$bin:\$PATH             # vramfit and vramfit-agent
  vramfit status --watch               # or open http://127.0.0.1:18080/ui
  kubectl get tj -n ml -o wide
  kubectl get gn -o wide
  kubectl describe tj -n ml llama-1b
  kubectl get gpunode demo-gpu-1 -o yaml     # what the simulated agent reports
  curl -s 127.0.0.1:18080/metrics | grep ^vramfit_
  hack/demo.sh down
EOF
