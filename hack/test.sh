#!/usr/bin/env bash
# The test command: formatting, lints, generated files, unit tests and the
# integration tests against a real kube-apiserver + etcd (started by the tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/vramfit/target}

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy (the agent with its simulated node: the vramfit crate's tests turn the agent's sim feature on)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "clippy (agent with the cuda feature and without sim, as shipped; cudarc loads CUDA at run time, so this builds without it)"
cargo clippy -p vramfit-agent --features cuda --all-targets --locked -- -D warnings

step "control plane binaries: kube (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl) and etcd"
hack/controlplane.sh build

step "GPU node: the other binaries (cached in ~/.cache/vramfit/bin/node, kube and etcd with them), the NRI plugin, generated files and CDI spec"
hack/gpunode.sh build
(cd hack/node/containerd && go test ./nri-cdi)
python3 -m pytest -q -p no:cacheprovider hack/node hack/test_hf_param_counts.py
python3 -m pytest -q -p no:cacheprovider scripts/gpu/test_calibrate_zero.py scripts/gpu/test_alloc_checks.py scripts/gpu/test_snapshot_to_profile.py

step "generated CRDs and the measured convolution table are current"
cargo run --quiet --locked -- crdgen --out crds
git diff --exit-code -- crds/ charts/vramfit/crds/ || { echo "crds/ is stale: commit the regenerated files" >&2; exit 1; }
python3 scripts/conv_workspace_table.py --check src/predict/conv_workspaces.tsv.gz

step "module layers: no import of controller/ from below, no cycle, docs/architecture.md current"
python3 hack/modgraph.py --check

step "Helm chart: lint, schema, dry-run against the API server, RBAC (kubectl auth can-i)"
hack/chart-test.sh

step "tests (unit + integration against the local control plane)"
cargo test --workspace --locked

step "agent with the cuda feature as a process, as shipped (no libcuda here: it must start Degraded, not panic; no sim feature: --simulate refused)"
cargo test -p vramfit-agent --features cuda --locked --test cli

step "container images without a registry (hack/images.sh, dev profile): build, unpack, run --version"
hack/images.sh build --profile dev --out "$HOME/.cache/vramfit/images-ci"
hack/images.sh check --out "$HOME/.cache/vramfit/images-ci"

step "the chart on a real node: hack/node-chart.sh --up (gpunode.sh up --cluster-only --pod-network, the images imported, helm install, upgrade, uninstall; the node always taken down)"
if why=$(hack/node-chart.sh --can-run); then
  hack/node-chart.sh --up --images "$HOME/.cache/vramfit/images-ci"
else
  echo "skipped: this machine cannot run a kubelet ($why)"
fi

if [[ -d python ]]; then
  step "python helper tests (against the debug build of libvramfit_alloc.so), and the wheel: hack/wheel.sh --profile dev, installed into a fresh venv"
  cargo build --quiet --locked -p vramfit-alloc
  VRAMFIT_ALLOCATOR_LIB="$CARGO_TARGET_DIR/debug/libvramfit_alloc.so" VRAMFIT_REQUIRE_ALLOCATOR_LIB=1 \
    VRAMFIT_WHEEL_TEST=1 python3 -m pytest -q python
fi
