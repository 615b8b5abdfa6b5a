#!/usr/bin/env bash
# The vramfit images without a registry and without a base image: the binaries
# (glibc, with the few shared libraries they link copied beside them) in an
# OCI image assembled locally by crane (hack/tools.sh crane), written as OCI
# tarballs that `ctr -n k8s.io images import` accepts. The Dockerfile builds the
# same images where a registry is reachable.
#
#   hack/images.sh build [--profile release|dev] [--out DIR] [--sim]   build both images
#                                        (--sim: also vramfit-agent-sim, below)
#   hack/images.sh assemble [--profile release|dev] [--out DIR]
#                                        the same from the Rust binaries cargo already built
#                                        (no cargo run; vramfit-nri-cdi is built with Go)
#   hack/images.sh check [--out DIR]     unpack each tarball and run its binaries (--version;
#                                        the shipped agent must refuse --simulate)
#
#   images: vramfit:<version>        the controller and CLI, user 65532 (non-root)
#           vramfit-agent:<version>  the node agent (cuda feature), user 0 (the
#                                    chart drops every capability but KILL), and
#                                    /usr/local/bin/vramfit-nri-cdi, the NRI plugin
#                                    the chart runs beside it (static Go,
#                                    hack/node/containerd/nri-cdi)
#           vramfit-agent-sim:<version>  with --sim only: the agent built with its
#                                    simulated node (the `sim` feature) for test
#                                    clusters (the chart's agent.simulate), user
#                                    65532; never the shipped agent
#
# Output: DIR (default ~/.cache/vramfit/images)/vramfit-<version>.oci.tar and
# vramfit-agent-<version>.oci.tar. Import on a node with
#   ctr -n k8s.io images import ~/.cache/vramfit/images/vramfit-0.1.0.oci.tar
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/vramfit/target}

log() { printf 'images: %s\n' "$*" >&2; }

# What to stop and remove however the script ends.
cleanup_pids=()
cleanup_dirs=()
cleanup() {
  local pid
  for pid in "${cleanup_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "${cleanup_dirs[@]}"
}
trap cleanup EXIT
die() { printf 'images: %s\n' "$*" >&2; exit 1; }

cmd=${1:-}
shift || true
profile=release
out=$HOME/.cache/vramfit/images
sim=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --sim) sim=1; shift ;;
    *) die "unknown argument $1" ;;
  esac
done
case $profile in
  release) profile_dir=release ;;
  dev) profile_dir=debug ;;
  *) die "--profile is release or dev, not $profile" ;;
esac
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
[[ -n $version ]] || die "no version in Cargo.toml"

# Copies the binary and every shared library it links (as ldd resolves them
# here) into the root filesystem, at the same paths; stripped.
add_binary() {
  local rootfs=$1 binary=$2 name lib
  name=$(basename "$binary")
  install -D -m 0755 "$binary" "$rootfs/usr/local/bin/$name"
  strip --strip-debug "$rootfs/usr/local/bin/$name"
  # A static binary (the Go plugin) links nothing; ldd exits 1 for it.
  if [[ $(ldd "$binary" 2>&1 || true) == *"not a dynamic executable"* ]]; then
    return 0
  fi
  while read -r lib; do
    [[ -n $lib ]] || continue
    [[ -f $rootfs$lib ]] && continue
    install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
  done < <(ldd "$binary" | awk '/=>/ && $3 ~ /^\// {print $3} /^[ \t]*\/[^ ]+ \(/ {print $1}')
}

# add_libs ROOTFS NAME...: system libraries by name (where the loader finds
# them here), at the same paths. The agent image gets those the NVIDIA
# driver's libraries link (libnvidia-ml and libcuda need libpthread, libdl and
# librt, which a binary built against glibc 2.34 or later no longer links
# itself), so that NVML and CUDA load when CDI mounts the driver tree.
add_libs() {
  local rootfs=$1 name dir
  shift
  for name in "$@"; do
    for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64; do
      if [[ -e $dir/$name ]]; then
        [[ -f $rootfs$dir/$name ]] || install -D -m 0755 "$(readlink -f "$dir/$name")" "$rootfs$dir/$name"
        break
      fi
    done
  done
}

# A minimal /etc: root and the non-root user 65532, and nsswitch for files only.
add_etc() {
  local rootfs=$1
  mkdir -p "$rootfs/etc" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
  # So that the NVIDIA runtime's ldconfig hook can register the driver libraries.
  mkdir -p "$rootfs/etc/ld.so.conf.d"
  printf '/usr/local/nvidia/lib64\n/usr/lib/x86_64-linux-gnu\n' >"$rootfs/etc/ld.so.conf.d/vramfit.conf"
}

# image NAME BINARY USER CMD [EXTRA_BINARY...]: assembles NAME:version (BINARY
# its entrypoint, each EXTRA_BINARY beside it in /usr/local/bin) through a
# registry crane serves on loopback (nothing leaves the machine), then saves it
# as an OCI tarball.
image() {
  local name=$1 binary=$2 user=$3 cmd=$4 work rootfs port pid ref extra
  shift 4
  work=$(mktemp -d /tmp/vramfit-image.XXXXXX)
  cleanup_dirs+=("$work")
  rootfs=$work/rootfs
  add_binary "$rootfs" "$binary"
  for extra in "$@"; do add_binary "$rootfs" "$extra"; done
  [[ $name == vramfit-agent ]] && add_libs "$rootfs" libpthread.so.0 libdl.so.2 librt.so.1 libm.so.6
  add_etc "$rootfs"
  # Reproducible layer: sorted, owned by root, one fixed time.
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$crane" registry serve --address "127.0.0.1:$port" >"$work/registry.log" 2>&1 &
  pid=$!
  cleanup_pids+=("$pid")
  for _ in $(seq 1 50); do
    curl -sf "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break
    sleep 0.1
  done
  ref=127.0.0.1:$port/$name:$version
  "$crane" append --insecure --oci-empty-base --platform linux/amd64 -f "$work/layer.tar" -t "$ref" \
    >>"$work/crane.log" 2>&1 || { cat "$work/crane.log" >&2; die "crane append failed"; }
  "$crane" mutate --insecure "$ref" --set-platform linux/amd64 \
    --entrypoint "/usr/local/bin/$(basename "$binary")" --cmd "$cmd" --user "$user" --workdir / \
    --env PATH=/usr/local/bin --env RUST_LOG=info \
    -l "org.opencontainers.image.title=$name" -l "org.opencontainers.image.version=$version" \
    -l "org.opencontainers.image.licenses=Apache-2.0" -t "$ref" \
    >>"$work/crane.log" 2>&1 || { cat "$work/crane.log" >&2; die "crane mutate failed"; }
  "$crane" pull --insecure --format oci "$ref" "$work/oci" \
    >>"$work/crane.log" 2>&1 || { cat "$work/crane.log" >&2; die "crane pull failed"; }
  # containerd names an imported image after io.containerd.image.name.
  python3 - "$work/oci/index.json" "docker.io/library/$name:$version" "$version" <<'EOF'
import json, sys
path, name, tag = sys.argv[1:]
index = json.load(open(path))
assert len(index["manifests"]) == 1, index
index["manifests"][0].setdefault("annotations", {}).update(
    {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag})
json.dump(index, open(path, "w"))
EOF
  mkdir -p "$out"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/oci" \
    -cf "$out/$name-$version.oci.tar.tmp" oci-layout index.json blobs
  mv "$out/$name-$version.oci.tar.tmp" "$out/$name-$version.oci.tar"
  kill "$pid" 2>/dev/null || true
  log "$out/$name-$version.oci.tar ($(du -h "$out/$name-$version.oci.tar" | cut -f1), docker.io/library/$name:$version)"
}

build() {
  local flag=(--release) work
  [[ $profile == dev ]] && flag=()
  if ((sim)); then
    # First, so that the agent cargo leaves in the target folder is the
    # shipped one (assemble packs what is there).
    log "building vramfit-agent with the sim feature, profile $profile"
    cargo build --locked "${flag[@]}" -p vramfit-agent --features sim --bin vramfit-agent
    work=$(mktemp -d /tmp/vramfit-agent-sim.XXXXXX)
    cleanup_dirs+=("$work")
    cp "$CARGO_TARGET_DIR/$profile_dir/vramfit-agent" "$work/vramfit-agent"
  fi
  log "building vramfit and vramfit-agent (cuda feature), profile $profile"
  cargo build --locked "${flag[@]}" --bin vramfit
  cargo build --locked "${flag[@]}" -p vramfit-agent --features cuda --bin vramfit-agent
  assemble
  if ((sim)); then
    crane=$(hack/tools.sh crane)
    image vramfit-agent-sim "$work/vramfit-agent" 65532:65532 run
  fi
}

# build_nri_plugin OUT: the NRI plugin (hack/node/containerd/nri-cdi) at OUT,
# static (no cgo), so it runs in the agent's image whatever libraries are there.
build_nri_plugin() {
  command -v go >/dev/null || die "vramfit-nri-cdi is built with Go, which is not on PATH"
  (cd hack/node/containerd && CGO_ENABLED=0 nice -n 10 go build -trimpath \
    -ldflags "-s -w -X main.buildVersion=$version" -o "$1" ./nri-cdi) || die "go build ./nri-cdi failed"
}

# Both images from the binaries cargo built (build runs cargo first).
assemble() {
  crane=$(hack/tools.sh crane)
  local bin=$CARGO_TARGET_DIR/$profile_dir f work
  for f in vramfit vramfit-agent; do
    [[ -x $bin/$f ]] || die "no $bin/$f (hack/images.sh build --profile $profile runs cargo)"
  done
  # The shipped agent has no simulated node (a --sim build leaves the
  # shipped one last, and a build by hand may not).
  refuses_simulate "$bin/vramfit-agent" ||
    die "$bin/vramfit-agent was built with the sim feature: the shipped agent is built without it (hack/images.sh build)"
  work=$(mktemp -d /tmp/vramfit-nri-cdi.XXXXXX)
  cleanup_dirs+=("$work")
  log "building vramfit-nri-cdi (Go, static)"
  build_nri_plugin "$work/vramfit-nri-cdi"
  image vramfit "$bin/vramfit" 65532:65532 controller
  image vramfit-agent "$bin/vramfit-agent" 0:0 run "$work/vramfit-nri-cdi"
}

# refuses_simulate COMMAND...: the agent COMMAND runs refuses --simulate as a
# build without the sim feature does.
refuses_simulate() {
  local said
  if said=$("$@" run --node n --once --simulate 1xH200 2>&1 >/dev/null); then
    return 1
  fi
  [[ $said == *"built without the simulated node"* ]]
}

# Unpacks each tarball as containerd would (index -> manifest -> config and
# layers), checks the config, and runs the binary in a chroot of the unpacked
# layers, so nothing of this machine's libraries is used.
check() {
  local name user tarball dir pairs=(vramfit:65532:65532 vramfit-agent:0:0) checked=0
  # The simulating agent's image where `build --sim` made one.
  [[ -f $out/vramfit-agent-sim-$version.oci.tar ]] && pairs+=(vramfit-agent-sim:65532:65532)
  for pair in "${pairs[@]}"; do
    name=${pair%%:*}
    user=${pair#*:}
    tarball=$out/$name-$version.oci.tar
    [[ -f $tarball ]] || die "$tarball is missing: run hack/images.sh build"
    dir=$(mktemp -d /tmp/vramfit-image-check.XXXXXX)
    cleanup_dirs+=("$dir")
    python3 - "$tarball" "$dir/rootfs" "$name" "$version" "$user" <<'EOF'
import io, json, sys, tarfile
tarball, rootfs, name, version, user = sys.argv[1:]
with tarfile.open(tarball) as outer:
    def blob(digest):
        return outer.extractfile("blobs/" + digest.replace(":", "/")).read()
    layout = json.loads(outer.extractfile("oci-layout").read())
    assert layout["imageLayoutVersion"] == "1.0.0", layout
    index = json.loads(outer.extractfile("index.json").read())
    [desc] = index["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == f"docker.io/library/{name}:{version}", desc
    manifest = json.loads(blob(desc["digest"]))
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json", manifest["mediaType"]
    config = json.loads(blob(manifest["config"]["digest"]))
    assert config["os"] == "linux" and config["architecture"] == "amd64", config
    assert config["config"]["User"] == user, config["config"]
    binary = name.removesuffix("-sim")
    assert config["config"]["Entrypoint"] == [f"/usr/local/bin/{binary}"], config["config"]
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as t:
            t.extractall(rootfs, filter="tar")
EOF
    local binary=${name%-sim} got
    local entry="/usr/local/bin/$binary"
    got=$(chroot --userspec="$user" "$dir/rootfs" "$entry" --version) ||
      die "$name: $entry --version failed inside the image"
    [[ $got == "$binary $version" ]] || die "$name: --version printed '$got', not '$binary $version'"
    log "$name-$version.oci.tar: user $user, $entry --version -> $got"
    if [[ $name == vramfit-agent-sim ]]; then
      got=$(chroot --userspec="$user" "$dir/rootfs" "$entry" run --node n --once --simulate 1xH200 -o json) ||
        die "$name: $entry run --simulate failed inside the image"
      [[ $got == *'"mode": "simulated"'* ]] || die "$name: run --simulate printed no simulated status: $got"
      log "$name-$version.oci.tar: run --simulate 1xH200 --once -> a simulated status"
    fi
    if [[ $name == vramfit-agent ]]; then
      refuses_simulate chroot --userspec="$user" "$dir/rootfs" "$entry" ||
        die "$name: $entry has the simulated node (the sim feature): the shipped agent is built without it"
      log "$name-$version.oci.tar: run --simulate refused (no simulated node in the shipped agent)"
      # The NRI plugin the chart runs beside the agent, from the same image.
      local nri=/usr/local/bin/vramfit-nri-cdi
      [[ -x $dir/rootfs$nri ]] || die "$name: no $nri in the image"
      got=$(chroot --userspec="$user" "$dir/rootfs" "$nri" --version) ||
        die "$name: $nri --version failed inside the image"
      [[ $got == "vramfit-nri-cdi $version" ]] || die "$name: $nri --version printed '$got', not 'vramfit-nri-cdi $version'"
      # Its probe, as the chart's startup probe runs it: no ready file, not registered.
      if chroot --userspec="$user" "$dir/rootfs" "$nri" --probe --ready-file /run/vramfit-nri/ready 2>/dev/null; then
        die "$name: $nri --probe passed without a registered plugin"
      fi
      log "$name-$version.oci.tar: $nri --version -> $got; --probe fails while nothing is registered"
    fi
    checked=$((checked + 1))
  done
  echo "images: $checked passed, 0 failed"
}

case $cmd in
  build) build ;;
  assemble) assemble ;;
  check) check ;;
  *) sed -n '2,29p' "$0"; exit 2 ;;
esac
