#!/usr/bin/env bash
# The controller scale benchmark (benches/controller_scale.rs) on a machine
# without cargo or Go: the GPU machine, used for its 16 quiet cores (no GPU is
# touched). The benchmark's processes (kube-apiserver, etcd, the controller
# and the driver with its simulated agents) can be pinned to a few CPUs, so
# a quiet 2-core budget is measured beside the shared 2-core development
# machine.
#
#   scripts/gpu/controller_scale.sh bundle [OUT]
#       here: the release benchmark binary, the release `vramfit` it drives,
#       kube (kube-apiserver, kubectl) and etcd from hack/gpunode.sh's build,
#       and the control plane's certificates, as one xz tarball (default .node-bin/vramfit-scale.tar.xz)
#   scripts/gpu/controller_scale.sh run --bundle F --out D --name NAME [--cpus LIST] -- BENCH-ARGS...
#       there: unpack F once (beside it), run the benchmark with BENCH-ARGS
#       (e.g. --nodes 200 --gpus 8 --jobs 2000), pinned to LIST (taskset
#       syntax, e.g. 0,2) when given; its JSON goes to D/NAME.json, its log to
#       D/NAME.log, and the machine's CPU topology to D/cpus.txt
#
#   scripts/gpu/controller_scale.sh bundle-upstream [OUT]
#       here: kube-scheduler (built from hack/controlplane/apiserver's pinned
#       k8s.io/kubernetes), kube, etcd and the certificates (default
#       .node-bin/vramfit-upstream.tar.xz), for run-upstream
#   scripts/gpu/controller_scale.sh run-upstream --bundle F --out D --name NAME [--cpus LIST] -- ARGS...
#       there: the upstream kube-scheduler on the same control plane and CPUs
#       (scripts/bench/upstream_scheduler.py with ARGS, e.g. --nodes 200
#       --gpus 8 --pods 2000), pinned like `run`
#
# A summary line per run goes to stdout.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log() { printf 'controller_scale: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

bundle() {
  local dest=${1:-$repo/.node-bin}
  local nodebin=${VRAMFIT_BIN:-$HOME/.cache/vramfit/bin}/node
  [[ -x $nodebin/kube && -x $nodebin/etcd ]] || die "no kube/etcd in $nodebin: run hack/gpunode.sh build kube etcd"
  log "building the benchmark and vramfit (release)"
  local exe
  exe=$(cd "$repo" && cargo bench --bench controller_scale --no-run --message-format json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "controller_scale" and m.get("executable"):
        print(m["executable"])')
  [[ -x $exe ]] || die "cargo did not report the benchmark's executable"
  local vramfit
  vramfit=$(dirname "$(dirname "$exe")")/vramfit
  [[ -x $vramfit ]] || die "no $vramfit beside the benchmark"
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  cp "$exe" "$tmp/controller_scale"
  cp "$vramfit" "$tmp/vramfit"
  strip "$tmp/controller_scale" "$tmp/vramfit"
  cp "$nodebin/kube" "$nodebin/etcd" "$tmp/"
  # Certificates travel too: the machine there may have no openssl.
  "$repo/hack/controlplane.sh" pki --dir "$tmp/controlplane"
  mkdir -p "$dest"
  tar -C "$tmp" -cf - controller_scale vramfit kube etcd controlplane/pki | nice -n 10 xz -9 -T2 >"$dest/vramfit-scale.tar.xz.tmp"
  mv "$dest/vramfit-scale.tar.xz.tmp" "$dest/vramfit-scale.tar.xz"
  ls -l "$dest/vramfit-scale.tar.xz"
}

bundle_upstream() {
  local dest=${1:-$repo/.node-bin}
  local nodebin=${VRAMFIT_BIN:-$HOME/.cache/vramfit/bin}/node
  [[ -x $nodebin/kube && -x $nodebin/etcd ]] || die "no kube/etcd in $nodebin: run hack/gpunode.sh build kube etcd"
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  log "building kube-scheduler (k8s.io/kubernetes, the control plane's pinned version)"
  (cd "$repo/hack/controlplane/apiserver" && nice -n 10 env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$tmp/kube-scheduler" k8s.io/kubernetes/cmd/kube-scheduler)
  cp "$nodebin/kube" "$nodebin/etcd" "$tmp/"
  "$repo/hack/controlplane.sh" pki --dir "$tmp/controlplane"
  mkdir -p "$dest"
  tar -C "$tmp" -cf - kube-scheduler kube etcd controlplane/pki | nice -n 10 xz -9 -T2 >"$dest/vramfit-upstream.tar.xz.tmp"
  mv "$dest/vramfit-upstream.tar.xz.tmp" "$dest/vramfit-upstream.tar.xz"
  ls -l "$dest/vramfit-upstream.tar.xz"
}

# unpack FILE MARKER: the bundle's binaries, unpacked once beside it; prints the folder.
unpack() {
  local file=$1 marker=$2 bin
  bin=$(dirname "$(realpath "$file")")/$(basename "$file" .tar.xz)-bin
  if [[ ! -x $bin/$marker ]]; then
    mkdir -p "$bin"
    xz -dc "$file" | tar -C "$bin" -xf -
    ln -sf kube "$bin/kube-apiserver"
    ln -sf kube "$bin/kubectl"
    # hack/controlplane.sh takes the binaries as they are (no Go here).
    touch "$bin/.prebuilt"
  fi
  echo "$bin"
}

# Pin a command (and its children) to CPUs when a list is given.
pinned() {
  local cpus=$1
  shift
  if [[ -z $cpus ]]; then
    "$@"
  else
    command -v taskset >/dev/null || die "--cpus needs taskset (util-linux)"
    taskset -c "$cpus" "$@"
  fi
}

# summary JSON NAME RC KEY...: one line with the run's exit status and the keys' values.
summary() {
  python3 - "$@" <<'EOF'
import json, sys
path, name, rc, *keys = sys.argv[1:]
try:
    d = json.load(open(path))
except ValueError:
    print(f"{name}: rc={rc}, no JSON (see {name}.log)")
    sys.exit(0)
print(name, f"rc={rc}", " ".join(f"{k}={d.get(k)}" for k in keys))
EOF
}

# run_args COMMAND ARGS...: sets the caller's file, out, name and cpus from
# --bundle, --out, --name and --cpus, and rest to what follows `--`.
run_args() {
  local command=$1
  shift
  file="" out="" name="" cpus="" rest=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      --bundle) file=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --name) name=$2; shift 2 ;;
      --cpus) cpus=$2; shift 2 ;;
      --) shift; break ;;
      *) die "unknown argument $1" ;;
    esac
  done
  rest=("$@")
  [[ -f $file && -n $out && -n $name ]] || die "$command needs --bundle FILE --out DIR --name NAME"
}

run() {
  local file out name cpus rest
  run_args run "$@"
  set -- "${rest[@]}"
  local bin
  bin=$(unpack "$file" controller_scale)
  mkdir -p "$out"
  [[ -f $out/cpus.txt ]] || { lscpu -e 2>/dev/null || cat /proc/cpuinfo; } >"$out/cpus.txt"
  log "$name: pinned to ${cpus:-all CPUs}: $*"
  local rc=0
  PATH=$bin:$PATH VRAMFIT_BIN=$bin VRAMFIT_REPO_ROOT=$repo VRAMFIT_PKI=$bin/controlplane/pki \
    pinned "$cpus" "$bin/controller_scale" --controller "$bin/vramfit" "$@" \
    >"$out/$name.json" 2>"$out/$name.log" || rc=$?
  summary "$out/$name.json" "$name" "$rc" jobs placed settled jobsPerSecond secondsToAllPods apiRequestsPerJob \
    apiserverCpuSeconds controllerCpuSeconds driverCpuSeconds etcdCpuSeconds controllerPeakRssBytes \
    schedulingCycleSecondsMean overcommittedGpus
  return "$rc"
}

run_upstream() {
  local file out name cpus rest
  run_args run-upstream "$@"
  set -- "${rest[@]}"
  local bin cp
  bin=$(unpack "$file" kube-scheduler)
  mkdir -p "$out"
  [[ -f $out/cpus.txt ]] || { lscpu -e 2>/dev/null || cat /proc/cpuinfo; } >"$out/cpus.txt"
  cp=$(mktemp -d /tmp/vramfit-upstream-cp-XXXXXX)
  log "$name: kube-scheduler, pinned to ${cpus:-all CPUs}: $*"
  local rc=0
  # The control plane, the scheduler and the driver all run on the pinned CPUs.
  PATH=$bin:$PATH VRAMFIT_BIN=$bin VRAMFIT_PKI=$bin/controlplane/pki \
    pinned "$cpus" "$repo/hack/controlplane.sh" up --dir "$cp" >/dev/null 2>"$out/$name.log" || rc=$?
  if ((rc == 0)); then
    PATH=$bin:$PATH pinned "$cpus" python3 "$repo/scripts/bench/upstream_scheduler.py" --dir "$cp" \
      --scheduler "$bin/kube-scheduler" "$@" >"$out/$name.json" 2>>"$out/$name.log" || rc=$?
  fi
  cp "$cp/scheduler.log" "$out/$name-scheduler.log" 2>/dev/null || true
  PATH=$bin:$PATH VRAMFIT_BIN=$bin "$repo/hack/controlplane.sh" down --dir "$cp" || true
  rm -rf "$cp"
  summary "$out/$name.json" "$name" "$rc" pods bound podsPerSecond secondsToAllBound createsTook apiRequestsPerPod \
    apiserverCpuSeconds etcdCpuSeconds schedulerCpuSeconds driverCpuSeconds nodesOverCapacity
  return "$rc"
}

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  bundle-upstream) shift; bundle_upstream "$@" ;;
  run-upstream) shift; run_upstream "$@" ;;
  *) sed -n '2,27p' "$0"; exit 2 ;;
esac
