#!/usr/bin/env bash
# The demo in one command: the local control plane, the CRDs, the example jobs,
# a simulated GPU node (a Node and its GpuNode with two H200s, as a node agent
# would report them) and the controller, which predicts and places the jobs.
# There is no kubelet, so the training pods stay Pending.
#
#   hack/demo.sh        bring it up and show `kubectl get tj -n ml`
#   hack/demo.sh down   stop the controller and the control plane
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/vramfit/target}
state=$HOME/.cache/vramfit/demo
mkdir -p "$state"

log() { printf 'demo: %s\n' "$*" >&2; }

if [[ ${1:-} == down ]]; then
  if [[ -f $state/controller.pid ]]; then
    kill "$(cat "$state/controller.pid")" 2>/dev/null || true
    rm -f "$state/controller.pid"
  fi
  hack/controlplane.sh down --dir "$state/controlplane"
  exit 0
fi

log "building vramfit"
cargo build --release --quiet --bin vramfit
kubeconfig=$(hack/controlplane.sh up --dir "$state/controlplane")
export KUBECONFIG=$kubeconfig
hack/controlplane.sh crds --kubeconfig "$kubeconfig"

log "adding the simulated GPU node demo-gpu-1"
kubectl apply -f examples/demo/gpu-node.yaml >/dev/null
# The API server taints new nodes not-ready until a kubelet reports Ready.
kubectl taint node demo-gpu-1 node.kubernetes.io/not-ready- >/dev/null 2>&1 || true
kubectl patch node demo-gpu-1 --subresource=status --type=merge \
  -p '{"status":{"allocatable":{"cpu":"64","memory":"512Gi","pods":"110"}}}' >/dev/null
kubectl patch gpunode demo-gpu-1 --subresource=status --type=merge \
  -p "$(sed "s/NOW/$(date -u +%FT%TZ)/" examples/demo/gpu-node-status.json)" >/dev/null

log "starting the controller (log: $state/controller.log, metrics: http://127.0.0.1:18080/metrics)"
if [[ -f $state/controller.pid ]]; then
  kill "$(cat "$state/controller.pid")" 2>/dev/null || true
fi
# The demo's GpuNode gets no more heartbeats, so trust it for a day.
"$CARGO_TARGET_DIR/release/vramfit" controller --no-leader-election \
  --metrics-addr 127.0.0.1:18080 --heartbeat-ttl-seconds 86400 >"$state/controller.log" 2>&1 &
echo $! >"$state/controller.pid"

kubectl apply -f examples/ >/dev/null
for _ in $(seq 1 60); do
  waiting=$(kubectl get tj -n ml -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -cvx Placed || true)
  [[ $waiting == 0 ]] && break
  sleep 1
done
kubectl get tj -n ml
cat <<EOF

The demo runs. Try:
  export KUBECONFIG=$kubeconfig
  kubectl get tj -n ml -o wide
  kubectl describe tj -n ml llama-1b
  curl -s 127.0.0.1:18080/metrics | grep ^vramfit_
  hack/demo.sh down
EOF
