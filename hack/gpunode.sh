#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, from upstream components built
# from their Go modules: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler (hack/controlplane.sh --controllers),
# containerd 2.2 with runc, the loopback, bridge and host-local CNI plugins
# (with vramfit-podnet, which gives the bridge its address and tries the
# network through netlink: no `ip` binary needed) and an NRI plugin that
# hands pods their GPUs through CDI (containerd starts it; with --cluster-only
# NRI is on but containerd starts none: the chart runs it, as the agent pod's
# sidecar), and a kubelet registered with the API server; then the CRDs, the
# vramfit controller and the node agent. The training pods run on the GPU(s)
# of this machine. See docs/gpu-node.md.
#
#   hack/gpunode.sh build [NAME...]       build the node binaries once (cached, rebuilt when pins change)
#   hack/gpunode.sh bundle [OUT]          the node binaries as one xz tarball (default .node-bin/), sizes on stdout
#   hack/gpunode.sh bundle-vramfit [OUT]  vramfit and vramfit-agent from .dev-bin/ as a second one
#   hack/gpunode.sh update NAME...        node binaries rebuilt since the bundle, as a third
#   hack/gpunode.sh node-pki [--node N]   the kubelet's certificate for an older bundle, signed by its CA
#   hack/gpunode.sh up   [--bundle F] [--dir D] [--node N]   bring the node up (from a bundle where Go is absent)
#        [--cluster-only]  only the cluster: no CRDs, no vramfit controller or agent (hack/node-chart.sh installs the chart)
#        [--pod-network]   pods off the host network get an address on a bridge (10.89.0.0/24,
#                          gateway 10.89.0.1) and reach the API server there (it listens on 0.0.0.0);
#                          the bridge and host-local CNI plugins, through netlink (no `ip` binary)
#   hack/gpunode.sh demo [--out D] [--steps N]               run the demo jobs, print and record what happened
#   hack/gpunode.sh down [--dir D]        stop everything `up` started
#   hack/gpunode.sh all  [--bundle F] [--out D]              up, demo, down (what the GPU machine runs)
#   hack/gpunode.sh all --chart [--images D] [--wheel F] [--venv V] [--host-network] [--bundle F] [--out D]
#        the same with vramfit installed by helm (hack/node/chartdemo.sh): up --cluster-only (with
#        the pod network wherever vramfit-podnet's trial of it passes: two controller replicas; else
#        the chart's pods on the host network, one replica), the images of D imported (hack/images.sh build;
#        .oci.tar or .oci.tar.xz), a training image built here from V (default /opt/torch/.venv) and
#        the wheel F (default: the one in D), the jobs applied by tenants, the release operated while
#        they run (leader and agent pods deleted, helm upgrade), their attacks, helm uninstall;
#        --host-network: the chart's pods on the host network even where a bridge could be made
#   hack/gpunode.sh bundle-images [--images D] [--wheel F] [OUT]   the images (xz), the wheel and
#        helm (xz) for a machine without cargo or Go: OUT (default .node-images/)
#
# The node binaries go to $VRAMFIT_BIN/node (default ~/.cache/vramfit/bin/node),
# outside the clone. State defaults to /var/lib/vramfit-node.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
here=$repo/hack
nodebin=${VRAMFIT_BIN:-$HOME/.cache/vramfit/bin}/node
# The node name in the certificate a bundle ships (the GPU machine is "vm").
default_node=vm
dir=/var/lib/vramfit-node
node=
bundle=
out=
steps=${VRAMFIT_DEMO_STEPS:-30}
cluster_only=0
# 1: the bridge (fails `up` where it cannot be made), 0: none, auto: the
# bridge where vramfit-podnet's trial passes, else none (all --chart).
pod_network=0
chart=0
host_network=0
images=$HOME/.cache/vramfit/images
wheel=
venv=/opt/torch/.venv
# The pod network of --pod-network: a bridge, its address the pods' gateway.
pod_bridge=vramfit0
pod_subnet=10.89.0.0/24
pod_gateway=10.89.0.1
# Without a bridge (--cluster-only where none can be made): addresses no interface carries.
pod_isolated_subnet=10.89.1.0/24

log() { printf 'gpunode: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# --- build -------------------------------------------------------------------------

# Build flags are part of the stamp: changing them rebuilds.
k8s_version=v1.34.4
containerd_version=v2.2.9
runc_version=v1.5.3

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

# build_if NAME STAMP COMMAND...: runs COMMAND unless $nodebin/.stamp-NAME holds STAMP.
build_if() {
  local name=$1 want=$2
  shift 2
  if [[ "$(cat "$nodebin/.stamp-$name" 2>/dev/null)" == "$want" ]]; then
    return 0
  fi
  log "building $name into $nodebin"
  "$@"
  echo "$want" >"$nodebin/.stamp-$name"
}

go_static() { nice -n 10 env CGO_ENABLED=0 go build -trimpath "$@"; }

build_kube() {
  local v=k8s.io/component-base/version
  (cd "$here/controlplane/apiserver" && go_static \
    -ldflags "-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=34 -X $v.gitTreeState=clean" \
    -o "$nodebin/kube" ./kube)
}

build_etcd() {
  (cd "$here/controlplane/etcd" && go_static -ldflags "-s -w" -o "$nodebin/etcd" .)
}

build_containerd() {
  local v=github.com/containerd/containerd/v2/version
  (cd "$here/node/containerd" && go_static -ldflags "-s -w -X $v.Version=$containerd_version -X $v.Revision=vramfit" \
    -o "$nodebin/" github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr &&
    go_static -ldflags "-s -w" -o "$nodebin/vramfit-nri-cdi" ./nri-cdi)
}

build_runc() {
  # runc's nsexec is C: a static cgo build, with libseccomp linked in (the
  # kubelet asks for the RuntimeDefault profile for every pod sandbox).
  [[ -f /usr/lib/x86_64-linux-gnu/libseccomp.a || -f /usr/lib/libseccomp.a ]] ||
    die "runc needs the static libseccomp (apt-get install libseccomp-dev)"
  (cd "$here/node/runc" && nice -n 10 env CGO_ENABLED=1 go build -trimpath -tags "seccomp netgo osusergo" \
    -ldflags "-s -w -X main.version=${runc_version#v} -extldflags -static" -o "$nodebin/runc" github.com/opencontainers/runc)
}

# The upstream CNI plugins (loopback; bridge and host-local for the pod
# network, netlink only, no `ip` binary) and vramfit-podnet (hack/node/cni/vramfit-podnet).
cni_files=(loopback bridge host-local vramfit-podnet)
build_cni() {
  (cd "$here/node/cni" && go_static -ldflags "-s -w" -o "$nodebin/" \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/ipam/host-local ./vramfit-podnet)
}

pause_source() {
  echo "$(cd "$here/controlplane/apiserver" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
}

build_pause() {
  # The upstream pause (k8s.io/kubernetes build/pause), static.
  nice -n 10 gcc -Os -static -Wall -DVERSION=3.10-vramfit -o "$nodebin/pause" "$(pause_source)"
  strip "$nodebin/pause"
}

# kube_links DIR: the commands of the multi-call `kube` binary, as links to it.
kube_links() {
  local l
  for l in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do ln -sf kube "$1/$l"; done
}

# build [COMPONENT...]: all of them by default.
build() {
  command -v go >/dev/null || die "building the node binaries needs Go (or pass --bundle)"
  mkdir -p "$nodebin"
  local flags want=" ${*:-kube etcd containerd runc cni pause} "
  flags=$(printf '%s\n' "$k8s_version $containerd_version $runc_version" "$(declare -f build_kube build_etcd build_containerd build_runc build_cni build_pause go_static)")
  [[ $want == *" kube "* ]] && build_if kube "$(stamp_of "$here/controlplane/apiserver/go.sum" "$here/controlplane/apiserver/kube/main.go" <(echo "$flags"))" build_kube
  [[ $want == *" etcd "* ]] && build_if etcd "$(stamp_of "$here/controlplane/etcd/go.sum" "$here/controlplane/etcd/main.go" <(echo "$flags"))" build_etcd
  [[ $want == *" containerd "* ]] && build_if containerd "$(stamp_of "$here/node/containerd/go.sum" "$here/node/containerd/nri-cdi/main.go" <(echo "$flags"))" build_containerd
  [[ $want == *" runc "* ]] && build_if runc "$(stamp_of "$here/node/runc/go.sum" <(echo "$flags"))" build_runc
  [[ $want == *" cni "* ]] && build_if cni "$(stamp_of "$here/node/cni/go.sum" "$here/node/cni/vramfit-podnet/main.go" <(echo "$flags"))" build_cni
  [[ $want == *" pause "* ]] && build_if pause "$(stamp_of "$(pause_source)" <(echo "$flags"))" build_pause
  kube_links "$nodebin"
  # `VRAMFIT_BIN=$nodebin hack/controlplane.sh` takes these as they are (up does so).
  touch "$nodebin/.prebuilt"
}

# The files of a bundle (links are made again when it is unpacked).
bundle_files=(kube etcd containerd containerd-shim-runc-v2 ctr vramfit-nri-cdi runc "${cni_files[@]}" pause)

bundle() {
  local dest=${1:-$repo/.node-bin}
  build
  mkdir -p "$dest"
  local f tmp
  for f in "${bundle_files[@]}"; do [[ -x $nodebin/$f ]] || die "missing $nodebin/$f"; done
  tmp=$(mktemp -d)
  cp "${bundle_files[@]/#/$nodebin/}" "$tmp/"
  # The control plane's certificates travel too: the GPU machine may lack openssl.
  "$here/controlplane.sh" pki --dir "$tmp/controlplane" >/dev/null
  "$here/controlplane.sh" node-cert "${node:-$default_node}" --dir "$tmp/controlplane" >/dev/null
  tar -C "$tmp" -cf - "${bundle_files[@]}" controlplane/pki | nice -n 10 xz -9 -T2 >"$dest/vramfit-node.tar.xz.tmp"
  mv "$dest/vramfit-node.tar.xz.tmp" "$dest/vramfit-node.tar.xz"
  sizes "$tmp" "${bundle_files[@]}"
  printf '%-24s %11d %11d\n' "vramfit-node.tar.xz" "$(du -cb "${bundle_files[@]/#/$tmp/}" | tail -1 | cut -f1)" \
    "$(stat -c %s "$dest/vramfit-node.tar.xz")"
  rm -rf "$tmp"
}

# vramfit and vramfit-agent (the release builds the lead puts in .dev-bin/),
# stripped, as vramfit-bin.tar.xz beside the node bundle; `up --bundle` takes
# both.
bundle_vramfit() {
  local dest=${1:-$repo/.node-bin} vb tmp f
  vb=$(find_vramfit_bins)
  mkdir -p "$dest"
  tmp=$(mktemp -d)
  local files=(vramfit vramfit-agent)
  cp "$vb/vramfit" "$vb/vramfit-agent" "$tmp/"
  for f in "$vb"/lib*.so; do [[ -f $f ]] && cp "$f" "$tmp/" && files+=("$(basename "$f")"); done
  # The demo's pods load the in-process allocator from here.
  [[ -f $tmp/libvramfit_alloc.so ]] ||
    log "warning: no libvramfit_alloc.so in $vb: the training pods will enforce budgets with the memory fraction"
  for f in "${files[@]}"; do strip "$tmp/$f" 2>/dev/null || true; done
  # Single-threaded -9e: a few dozen KB smaller than -T2, which counts at the 64 MiB limit.
  tar -C "$tmp" -cf - "${files[@]}" | nice -n 10 xz -9e -T1 >"$dest/vramfit-bin.tar.xz"
  log "vramfit binaries from $vb: ${files[*]}"
  printf '%-24s %11d %11d\n' "vramfit-bin.tar.xz" "$(du -cb "${files[@]/#/$tmp/}" | tail -1 | cut -f1)" \
    "$(stat -c %s "$dest/vramfit-bin.tar.xz")"
  rm -rf "$tmp"
}

# update NAME... [--out D]: those node binaries alone, as update-NAME.tar.xz beside the bundle.
bundle_update() {
  local dest=$1 tmp f
  shift
  build
  tmp=$(mktemp -d)
  for f in "$@"; do cp "$nodebin/$f" "$tmp/"; done
  tar -C "$tmp" -cf - "$@" | nice -n 10 xz -9 -T2 >"$dest/update-$(IFS=-; echo "$*").tar.xz"
  rm -rf "$tmp"
  ls -l "$dest/update-$(IFS=-; echo "$*").tar.xz"
}

# node-pki [--node N]: a client certificate for the kubelet of node N
# (default vm), signed by the CA inside the bundle, as update-node-pki.tar.xz
# beside it: for a bundle made before bundles carried one (the GPU machine
# may lack openssl to make it there).
bundle_node_pki() {
  local dest=$1 tmp
  [[ -f $dest/vramfit-node.tar.xz ]] || die "no $dest/vramfit-node.tar.xz"
  tmp=$(mktemp -d)
  python3 - "$dest/vramfit-node.tar.xz" "$tmp" <<'EOF'
import sys, tarfile
want = ("ca.crt", "ca.key", "admin.crt")
with tarfile.open(sys.argv[1], "r:xz") as t:
    for m in t:
        if m.name.startswith("controlplane/pki/") and m.name.rsplit("/", 1)[-1] in want:
            t.extract(m, sys.argv[2])
EOF
  [[ -f $tmp/controlplane/pki/ca.key ]] || die "the bundle holds no CA"
  "$here/controlplane.sh" node-cert "${node:-$default_node}" --dir "$tmp/controlplane" >/dev/null
  tar -C "$tmp" -cf - controlplane/pki/node.crt controlplane/pki/node.key controlplane/pki/node-name |
    xz -9 >"$dest/update-node-pki.tar.xz"
  rm -rf "$tmp"
  ls -l "$dest/update-node-pki.tar.xz"
}

sizes() {
  # Per-file sizes (stripped, xz -9e alone) when VRAMFIT_BUNDLE_SIZES=1: slow.
  [[ ${VRAMFIT_BUNDLE_SIZES:-0} == 1 ]] || return 0
  local from=$1 f
  shift
  printf '%-24s %11s %11s\n' file stripped xz-9e
  for f in "$@"; do
    printf '%-24s %11d %11d\n' "$f" "$(stat -c %s "$from/$f")" "$(nice -n 10 xz -9e -T2 -c "$from/$f" | wc -c)"
  done
}

unpack() {
  # Python's lzma, not xz: the GPU machine may not have xz.
  local from=$1 to=$2
  mkdir -p "$to"
  python3 - "$from" "$to" <<'EOF'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2], filter="tar") if hasattr(tarfile, "data_filter") else t.extractall(sys.argv[2])
EOF
  kube_links "$to"
  # hack/controlplane.sh takes the binaries as they are (no Go here).
  touch "$to/.prebuilt"
}

# --- up ----------------------------------------------------------------------------

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

now_ms() { python3 -c 'import time; print(int(time.time()*1000))'; }

# vramfit and vramfit-agent: $VRAMFIT_BIN_DIR, else an unpacked bundle, else
# .dev-bin/ (release binaries the lead builds), else the cargo target folder.
find_vramfit_bins() {
  local d
  for d in "${VRAMFIT_BIN_DIR:-}" "$dir/bin" "$repo/.dev-bin" "$repo/.devbin" \
    "${CARGO_TARGET_DIR:-$HOME/.cache/vramfit/target}/release" "${CARGO_TARGET_DIR:-$HOME/.cache/vramfit/target}/debug"; do
    if [[ -n $d && -x $d/vramfit && -x $d/vramfit-agent ]]; then
      echo "$d"
      return 0
    fi
  done
  die "no vramfit and vramfit-agent binaries (build them: cargo build -p vramfit -p vramfit-agent)"
}

start_bg() {
  # start_bg NAME COMMAND...: runs COMMAND in the background with its log and pid in $dir.
  local name=$1
  shift
  "$@" >"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
}

wait_for() {
  # wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s.
  local secs=$1 what=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  log "$what not ready after ${secs}s"
  return 1
}

gpunode_has_gpus() {
  [[ -n $(kubectl get gpunode "$1" -o jsonpath='{.status.gpus[0].uuid}' 2>/dev/null) ]]
}

simulated_gpunode() {
  local node=$1
  printf 'apiVersion: vramfit.dev/v1alpha1\nkind: GpuNode\nmetadata: {name: %s}\nspec: {}\n' "$node" | kubectl apply -f -
  while :; do
    kubectl patch gpunode "$node" --subresource=status --type=merge -p "$(python3 -c '
import json, sys, time
now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
gpus = [{"index": i, "uuid": f"GPU-sim-{i}", "model": "H200", "totalBytes": 150754820096, "health": "Healthy"} for i in (0, 1)]
print(json.dumps({"status": {"heartbeat": now, "gpuCount": 2, "model": "H200", "gpus": gpus}}))')" >/dev/null
    sleep 20
  done
}

# cni_setup: the node's CNI network in $dir/cni (containerd's bin_dirs and
# conf_dir), before the control plane, which listens where the pods can
# reach it. With $pod_network 1 or auto the bridge network (the upstream
# bridge and host-local plugins) is written and tried by vramfit-podnet:
# the bridge made with its address, a throwaway network namespace attached,
# its TCP connection to the gateway, detached again. On success
# $pod_network is 1; where the trial fails, `up --pod-network` fails, and
# with auto (all --chart) $pod_network becomes 0. Without the bridge,
# --cluster-only gives pods the isolated network, else loopback only.
# What was chosen and why is in $dir/pod-network-choice.
cni_setup() {
  local cd=$dir why
  rm -rf "$cd/cni" "$dir/pod-network-choice"
  mkdir -p "$cd/cni/bin" "$cd/cni/net.d"
  cp "$nodebin/loopback" "$cd/cni/bin/loopback"
  if [[ $pod_network != 0 ]]; then
    local conf=$cd/cni/net.d/10-vramfit-bridge.conflist f missing=
    for f in bridge host-local vramfit-podnet; do [[ -x $nodebin/$f ]] || missing+=" $f"; done
    if [[ -n $missing ]]; then
      # A bundle from before the pod network travelled.
      why="no$missing among the node's binaries (hack/gpunode.sh update bridge host-local vramfit-podnet)"
    else
      cp "$nodebin/bridge" "$nodebin/host-local" "$cd/cni/bin/"
      python3 "$here/node/nodecfg.py" cni --bridge "$pod_bridge" --subnet "$pod_subnet" --data-dir "$cd/cni/ipam" >"$conf"
    fi
    if [[ -z $missing ]] && why=$("$nodebin/vramfit-podnet" up --bridge "$pod_bridge" --gateway "$pod_gateway/${pod_subnet#*/}" \
      --conflist "$conf" --cni-bin "$cd/cni/bin" 2>&1); then
      pod_network=1
      log "pod network: $why"
      printf 'bridge: %s\n' "$why" >"$dir/pod-network-choice"
      return 0
    fi
    rm -f "$conf" "$cd/cni/bin/bridge" "$cd/cni/bin/host-local"
    [[ $pod_network == auto ]] || die "pod network: $why"
    pod_network=0
    log "no pod network here ($why)"
    printf 'none: %s\n' "$why" >"$dir/pod-network-choice"
  else
    echo "none: ${pod_network_off:-not asked for (up without --pod-network)}" >"$dir/pod-network-choice"
  fi
  if [[ $cluster_only == 1 ]]; then
    # The chart's node without a bridge: its tenants' pods may not use the
    # host network (Pod Security), and containerd wants an address for every
    # other pod. They get `lo` alone and an address no interface carries
    # (cni-isolated.py); the chart's own pods run on the host network.
    log "pod network: isolated (lo only; each pod an address of $pod_isolated_subnet for its status)"
    install -m 0755 "$here/node/cni-isolated.py" "$cd/cni/bin/vramfit-isolated"
    python3 "$here/node/nodecfg.py" cni --isolated --subnet "$pod_isolated_subnet" --data-dir "$cd/cni/ipam" \
      >"$cd/cni/net.d/10-vramfit-isolated.conflist"
  else
    python3 "$here/node/nodecfg.py" cni >"$cd/cni/net.d/10-vramfit-lo.conflist"
  fi
}

up() {
  local t0
  t0=$(now_ms)
  if [[ -n $bundle ]]; then
    log "unpacking $bundle into $dir/bin"
    rm -rf "$dir/bin"
    unpack "$bundle" "$dir/bin"
    # Then every other tarball beside it, in name order, each replacing what
    # it holds: vramfit-bin.tar.xz (bundle-vramfit), or a binary rebuilt
    # since the bundle (`update NAME`), which saves compressing it all again.
    local extra
    for extra in "$(dirname "$bundle")"/*.tar.xz; do
      [[ $extra == "$bundle" || $extra == */vramfit-images*.tar.xz ]] && continue
      log "unpacking $extra"
      unpack "$extra" "$dir/bin"
    done
    nodebin=$dir/bin
  else
    build
  fi
  export PATH=$nodebin:$PATH
  mkdir -p "$dir"
  # The pod network first: whether there is one decides where the API server listens.
  cni_setup

  log "control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)"
  local pki=$dir/controlplane/pki
  if [[ -d $nodebin/controlplane/pki && ! -f $pki/admin.crt ]]; then
    mkdir -p "$dir/controlplane"
    cp -r "$nodebin/controlplane/pki" "$dir/controlplane/"
  elif [[ -f $nodebin/controlplane/pki/ca.crt && "$(cat "$nodebin/controlplane/pki/ca.crt")" == "$(cat "$pki/ca.crt")" ]]; then
    # The same CA: what the bundle has and an earlier run's folder lacks (the
    # controllers' certificates; the machine may lack openssl to make them).
    local f
    for f in "$nodebin"/controlplane/pki/*; do [[ -e $pki/${f##*/} ]] || cp "$f" "$pki/"; done
  fi
  local kubeconfig
  rm -f "$dir/pod-network"
  if [[ $pod_network == 1 ]]; then
    # Pods reach the API server at the bridge's address: it listens on every
    # address, its certificate names that one too.
    # And pods get their ServiceAccount's token (the ServiceAccount admission
    # plugin, which the tests' control plane leaves off).
    export VRAMFIT_APISERVER_BIND=0.0.0.0 VRAMFIT_APISERVER_SANS=IP:$pod_gateway VRAMFIT_SERVICEACCOUNT_ADMISSION=1
  elif [[ $cluster_only == 1 ]]; then
    # The chart's pods on the host network (no bridge here) need their
    # ServiceAccount tokens all the same.
    export VRAMFIT_SERVICEACCOUNT_ADMISSION=1
  fi
  kubeconfig=$(VRAMFIT_BIN=$nodebin "$here/controlplane.sh" up --controllers --dir "$dir/controlplane")
  export KUBECONFIG=$kubeconfig

  # The node's name: --node, else the one its shipped certificate names,
  # else the host's. The kubelet authenticates as system:node:<name>.
  local certname=
  [[ -f $pki/node.crt && -f $pki/node-name ]] && certname=$(cat "$pki/node-name")
  node=${node:-${certname:-$(hostname | tr '[:upper:]' '[:lower:]' | cut -d. -f1)}}
  if [[ $certname != "$node" ]]; then
    command -v openssl >/dev/null ||
      die "no node certificate for $node and no openssl to make one (hack/gpunode.sh node-pki --node NAME ships one)"
    "$here/controlplane.sh" node-cert "$node" --dir "$dir/controlplane"
  fi
  echo "$node" >"$dir/node-name"

  log "containerd (CRI, overlayfs, cgroupfs, CDI, NRI)"
  local cd=$dir
  rm -rf "$cd/nri" "$cd/cdi"
  mkdir -p "$cd/containerd" "$cd/nri/plugins" "$cd/nri/conf.d" "$cd/cdi" "$cd/images"
  python3 "$here/node/nodecfg.py" containerd --dir "$cd" --runc "$nodebin/runc" >"$cd/containerd/config.toml"
  if [[ $pod_network == 1 ]]; then
    log "pod network: bridge $pod_bridge, $pod_subnet, gateway $pod_gateway (the bridge and host-local CNI plugins)"
    local api_port
    api_port=$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')
    api_port=${api_port##*:}
    # What the chart's apiServer.host and apiServer.port take on this node.
    printf '%s %s\n' "$pod_gateway" "$api_port" >"$dir/pod-network"
  fi
  rm -f "$dir/nri-cdi.log" "$dir/nri-cdi.ready"
  if [[ $cluster_only == 1 ]]; then
    # The chart runs the NRI plugin, as the agent pod's sidecar connected to
    # the socket (its nri.socket): containerd starts none from plugin_path,
    # which stays empty.
    log "NRI on (socket $cd/nri/nri.sock), no plugin in $cd/nri/plugins: the chart's agent pod brings it"
  else
    cp "$nodebin/vramfit-nri-cdi" "$cd/nri/plugins/10-vramfit-cdi"
    python3 "$here/node/nodecfg.py" nri-config --log "$dir/nri-cdi.log" >"$cd/nri/conf.d/10-vramfit-cdi.conf"
  fi
  if [[ -e /dev/nvidiactl ]]; then
    python3 "$here/node/nodecfg.py" cdi >"$cd/cdi/nvidia.json"
    log "CDI spec for $(grep -c '"name": "GPU-' "$cd/cdi/nvidia.json") GPU(s) in $cd/cdi/nvidia.json"
  else
    log "no /dev/nvidiactl: no CDI spec, CPU-only pods"
  fi
  start_bg containerd "$nodebin/containerd" --config "$cd/containerd/config.toml"
  local ctr=("$nodebin/ctr" --address "$cd/containerd.sock" -n k8s.io)
  wait_for 30 containerd "${ctr[@]}" version || { tail -20 "$dir/containerd.log" >&2; return 1; }
  if [[ $cluster_only == 1 ]]; then
    # The socket the chart's plugin connects to.
    wait_for 15 "NRI socket $cd/nri/nri.sock" test -S "$cd/nri/nri.sock" ||
      { grep -i nri "$dir/containerd.log" | tail -10 >&2; return 1; }
  else
    # Without its NRI plugin containerd would start GPU pods without their GPUs.
    wait_for 15 "NRI plugin 10-vramfit-cdi" grep -q "connected to" "$dir/nri-cdi.log" ||
      { grep -i nri "$dir/containerd.log" | tail -10 >&2; return 1; }
  fi

  log "images (built here, imported; no registry)"
  python3 "$here/node/nodecfg.py" image pause --pause "$nodebin/pause" --out "$cd/images/pause.tar"
  python3 "$here/node/nodecfg.py" image train --out "$cd/images/train.tar"
  "${ctr[@]}" images import --local "$cd/images/pause.tar" >/dev/null
  "${ctr[@]}" images import --local "$cd/images/train.tar" >/dev/null

  log "kubelet (node $node, registered with the API server as system:node:$node)"
  mkdir -p "$dir/kubelet/root" "$dir/kubelet/pki" "$dir/kubelet/manifests"
  local cpus
  cpus=$(nproc)
  python3 "$here/node/nodecfg.py" kubelet --dir "$dir" --endpoint "unix://$cd/containerd.sock" \
    --healthz-port "$(free_port)" --port "$(free_port)" --cpus "$cpus" --client-ca "$pki/ca.crt" \
    --cpu-manager "${VRAMFIT_CPU_MANAGER:-static}" >"$dir/kubelet/config.json"
  # A fresh CPU manager state: a changed policy or CPU count fails the kubelet.
  rm -f "$dir/kubelet/root/cpu_manager_state" "$dir/kubelet/root/memory_manager_state"
  # Its own credentials, not the admin's: the API server's Node authorizer
  # and NodeRestriction keep it to this node's objects.
  python3 "$here/node/nodecfg.py" kubeconfig --pki "$pki" \
    --server "$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')" >"$dir/kubelet/kubeconfig"
  start_bg kubelet "$nodebin/kubelet" --config "$dir/kubelet/config.json" --kubeconfig "$dir/kubelet/kubeconfig" \
    --hostname-override "$node" --root-dir "$dir/kubelet/root" --cert-dir "$dir/kubelet/pki" --v=1
  wait_for 60 "node $node" kubectl wait --for condition=Ready --timeout=1s "node/$node" ||
    { tail -30 "$dir/kubelet.log" >&2; return 1; }
  # kube-controller-manager's node lifecycle controller lifts the not-ready
  # taint the API server put on the new node within seconds; lifted here at
  # once all the same, so that nothing waits for it.
  kubectl taint node "$node" node.kubernetes.io/not-ready- >/dev/null 2>&1 || true
  log "node $node Ready after $(( ($(now_ms) - t0) ))ms"
  echo $(( $(now_ms) - t0 )) >"$dir/node-ready-ms"
  if [[ $cluster_only == 1 ]]; then
    log "cluster only (no CRDs, controller or agent); KUBECONFIG=$kubeconfig"
    echo "$kubeconfig"
    return 0
  fi

  log "CRDs, controller, agent"
  VRAMFIT_BIN=$nodebin "$here/controlplane.sh" crds --kubeconfig "$kubeconfig"
  local vb
  vb=$(find_vramfit_bins)
  echo "$vb" >"$dir/vramfit-bin"
  export RUST_LOG=${RUST_LOG:-info,kube=warn}
  if [[ -e /dev/nvidiactl ]]; then
    # A status write at least every 3 s (default 10 s): the demo samples the
    # GpuNode for the training processes' allocator and shape figures, and the
    # shortest jobs train for about 10 s.
    start_bg agent "$vb/vramfit-agent" run --node "$node" --heartbeat 3s --kubelet-root "$dir/kubelet/root"
  else
    # No GPU: keep a GpuNode with two simulated H200s alive, so the
    # controller places. Not `vramfit-agent run
    # --simulate`: it also plays the kubelet, and here the kubelet is real.
    log "no GPU: a simulated GpuNode (no measurements) stands in for the agent"
    start_bg agent simulated_gpunode "$node"
  fi
  ui_port=$(free_port)
  start_bg controller "$vb/vramfit" controller --no-leader-election --metrics-addr "127.0.0.1:$ui_port" --ui-addr "127.0.0.1:$ui_port"
  # The agent has reported (after its probe): the GpuNode lists GPUs.
  wait_for 90 "GpuNode $node" gpunode_has_gpus "$node" || { tail -20 "$dir/agent.log" >&2; return 1; }
  log "up in $(( ($(now_ms) - t0) ))ms; KUBECONFIG=$kubeconfig"
  echo "$kubeconfig"
}

# --- down --------------------------------------------------------------------------

stop_pid() {
  local name=$1 pid i
  [[ -f $dir/$name.pid ]] || return 0
  pid=$(cat "$dir/$name.pid")
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/$name.pid"
}

down() {
  local b=$nodebin
  [[ -x $dir/bin/kube ]] && b=$dir/bin
  stop_pid controller
  stop_pid agent
  stop_pid simulate
  # The node's own plugin, where a chart check started it (hack/node/chart.sh).
  stop_pid nri-cdi
  # The kubelet first (it would restart what containerd stops), then every
  # pod sandbox and container, then containerd.
  stop_pid kubelet
  local netns=()
  if [[ -S $dir/containerd.sock && -x $b/ctr ]]; then
    local ctr=("$b/ctr" --address "$dir/containerd.sock" -n k8s.io) id
    # The pods' network namespaces, from their sandboxes' specs: containerd
    # keeps them under /run/netns, outside this folder, and a pod not removed
    # through the kubelet (a run stopped halfway) leaves its namespace, and
    # its veth, behind.
    mapfile -t netns < <(for id in $("${ctr[@]}" containers ls -q 2>/dev/null); do
      "${ctr[@]}" containers info "$id" 2>/dev/null; done | python3 "$here/node/nodecfg.py" oci-netns)
    for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$id" >/dev/null 2>&1 || true; done
    sleep 0.5
    for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks delete -f "$id" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd
  # Shims outlive containerd by design; end this node's, by the pid each wrote.
  local f
  for f in "$dir"/containerd/state/io.containerd.runtime.v2.task/k8s.io/*/shim.pid; do
    [[ -f $f ]] && kill -9 "$(cat "$f")" 2>/dev/null || true
  done
  # A shim whose sandbox was still being set up leaves no shim.pid: those that
  # name this node's containerd socket.
  local p
  for p in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q "^[^ ]*containerd-shim-runc-v2 .*-address $dir/containerd.sock\( \|$\)" &&
      kill -9 "${p#/proc/}" 2>/dev/null || true
  done
  # Mounts the kubelet and containerd left (pod volumes, rootfs, netns, shm).
  local m
  for m in $(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  local n
  for n in "${netns[@]}"; do
    umount "$n" 2>/dev/null || true
    rm -f "$n"
  done
  "$here/controlplane.sh" down --dir "$dir/controlplane"
  # containerd's images and snapshots: `up` imports every image again (the
  # chart mode's training image alone takes 6-7 GB unpacked).
  rm -rf "$dir/containerd/root"
  # The pod network's bridge, if this node made it (each pod's veth went with
  # its namespace): through netlink (vramfit-podnet; the GPU machine has no
  # `ip`), else with `ip` (a node brought up before vramfit-podnet).
  if [[ -f $dir/pod-network || -f $dir/cni/net.d/10-vramfit-bridge.conflist ]]; then
    if [[ -x $b/vramfit-podnet ]]; then
      "$b/vramfit-podnet" down --bridge "$pod_bridge" || true
    elif command -v ip >/dev/null && ip link show "$pod_bridge" >/dev/null 2>&1; then
      ip link del "$pod_bridge" 2>/dev/null || true
    fi
  fi
  # Once only: a later `down` leaves a bridge another node made alone.
  rm -rf "$dir/cni/ipam" "$dir/pod-network" "$dir/cni/net.d/10-vramfit-bridge.conflist"
}

# The end of every process's log, after the demo's own output (demo.log), so
# a failed run on the GPU machine still explains itself.
collect_logs() {
  local f
  {
    echo
    echo "== node logs (last 25 lines each)"
    for f in "$dir"/controlplane/apiserver.log "$dir"/controlplane/controller-manager.log \
      "$dir"/controlplane/scheduler.log "$dir"/containerd.log "$dir"/nri-cdi.log "$dir"/kubelet.log "$dir"/agent.log "$dir"/controller.log; do
      [[ -f $f ]] || continue
      echo "-- $f"
      tail -25 "$f"
    done
    if [[ $chart == 1 && -f $dir/controlplane/kubeconfig ]]; then
      local p
      for p in $(KUBECONFIG=$dir/controlplane/kubeconfig kubectl get pods -n vramfit-system -o name 2>/dev/null); do
        echo "-- kubectl logs -n vramfit-system $p --all-containers (the agent's: nri-cdi, its NRI plugin, too)"
        KUBECONFIG=$dir/controlplane/kubeconfig kubectl logs -n vramfit-system "$p" --all-containers --prefix --tail=25 2>&1
      done
    fi
  } >>"$out/demo.log" 2>&1
}

# bundle-images [OUT]: the vramfit images of $images, xz-compressed (chart
# mode imports them as they are), the wheel, helm and Prometheus, for a
# machine without cargo or Go.
bundle_images() {
  local dest=${1:-$repo/.node-images} version f w
  version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
  w=${wheel:-$(ls -t "$HOME"/.cache/vramfit/wheels/vramfit-*.whl 2>/dev/null | head -1 || true)}
  [[ -f $w ]] || die "no wheel (hack/wheel.sh builds one; or --wheel F)"
  mkdir -p "$dest"
  for f in vramfit vramfit-agent; do
    [[ -f $images/$f-$version.oci.tar ]] || die "no $images/$f-$version.oci.tar (hack/images.sh build --out $images)"
    # The layers uncompressed first: xz -9 of the binaries beats xz of gzip's output.
    python3 "$here/node/nodecfg.py" oci-uncompress "$images/$f-$version.oci.tar" "$dest/$f-$version.oci.tar.tmp"
    nice -n 10 xz -9e -T2 -c "$dest/$f-$version.oci.tar.tmp" >"$dest/$f-$version.oci.tar.xz.tmp"
    rm -f "$dest/$f-$version.oci.tar.tmp"
    mv "$dest/$f-$version.oci.tar.xz.tmp" "$dest/$f-$version.oci.tar.xz"
  done
  rm -f "$dest"/vramfit-*.whl
  cp "$w" "$dest/"
  # helm, which the GPU machine lacks (no Go there to build it), stripped.
  local helm tmp
  helm=$("$here/tools.sh" helm)
  tmp=$(mktemp)
  cp "$helm" "$tmp" && strip "$tmp" 2>/dev/null || true
  nice -n 10 xz -9 -T2 -c "$tmp" >"$dest/helm.xz"
  # Prometheus (hack/tools.sh builds it from its Go module), stripped: chart
  # mode scrapes the release with it while the jobs run on the GPU.
  cp "$("$here/tools.sh" prometheus)" "$tmp" && strip "$tmp" 2>/dev/null || true
  nice -n 10 xz -9 -T2 -c "$tmp" >"$dest/prometheus.xz"
  rm -f "$tmp"
  du -b "$dest"/* | sort -k2
  du -cb "$dest"/* | tail -1
}

# all --chart: the node with vramfit installed by helm (hack/node/chartdemo.sh).
all_chart() {
  cluster_only=1
  # The bridge for the pods wherever vramfit-podnet's trial of it passes
  # (cni_setup); else the chart's pods run on the host network.
  [[ $host_network == 1 ]] && pod_network_off="--host-network" || pod_network=auto
  [[ -n $wheel ]] || wheel=$(ls -t "$images"/vramfit-*.whl 2>/dev/null | head -1 || true)
  [[ -n $wheel ]] || wheel=$(ls -t "$HOME"/.cache/vramfit/wheels/vramfit-*.whl 2>/dev/null | head -1 || true)
  local t0
  t0=$(now_ms)
  up >/dev/null
  log "node $(cat "$dir/node-name") up (cluster only, $([[ $pod_network == 1 ]] && echo "pod network" || echo "isolated network, host-network chart pods")) in $(( $(now_ms) - t0 ))ms"
  source "$here/node/demo.sh"
  source "$here/node/chartdemo.sh"
  demo_setup
  echo "TIME: hack/gpunode.sh up --cluster-only to node Ready: $(python3 -c "print(f'{$(cat "$dir/node-ready-ms")/1000:.1f}')")s"
  chart_demo
}

# --- command line --------------------------------------------------------------------

cmd=${1:-}
shift || true
components=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --node) node=$2; shift 2 ;;
    --bundle) bundle=$(realpath "$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --cluster-only) cluster_only=1; shift ;;
    --pod-network) pod_network=1; shift ;;
    --chart) chart=1; shift ;;
    --host-network) host_network=1; shift ;;
    --images) images=$(realpath "$2"); shift 2 ;;
    --wheel) wheel=$(realpath "$2"); shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    *)
      if [[ ($cmd == bundle* || $cmd == node-pki) && -z $out ]]; then out=$1; shift
      elif [[ $cmd == build || $cmd == update ]]; then components+=("$1"); shift
      else die "unknown argument $1"; fi ;;
  esac
done

case $cmd in
  build) build "${components[@]}" ;;
  bundle) bundle "$out" ;;
  bundle-vramfit) bundle_vramfit "$out" ;;
  bundle-images) bundle_images "$out" ;;
  node-pki) bundle_node_pki "${out:-$repo/.node-bin}" ;;
  update) bundle_update "${out:-$repo/.node-bin}" "${components[@]}" ;;
  up) down >/dev/null 2>&1 || true; up ;;
  demo) source "$here/node/demo.sh"; demo ;;
  down) down ;;
  all)
    out=${out:-$dir/demo-out}
    mkdir -p "$out"
    down >/dev/null 2>&1 || true
    # Each step of its own: a failing one (a `kubectl logs` of a pod that
    # never started) must not end the trap before `down`.
    trap 'collect_logs || true; down >/dev/null 2>&1 || true' EXIT
    if [[ $chart == 1 ]]; then
      all_chart
    else
      up >/dev/null
      source "$here/node/demo.sh"
      demo
    fi
    ;;
  *) sed -n '2,30p' "$0"; exit 2 ;;
esac
