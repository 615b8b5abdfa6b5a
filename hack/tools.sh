#!/usr/bin/env bash
# Developer tools built from their Go modules (hack/tools/<name>/go.mod pins each
# with a `tool` directive), the way hack/gpunode.sh builds kube-apiserver.
#
#   hack/tools.sh helm     build helm (helm.sh/helm/v3) if needed, print its path
#   hack/tools.sh crane    build crane (github.com/google/go-containerregistry) if needed, print its path
#   hack/tools.sh prometheus   build prometheus (github.com/prometheus/prometheus, Kubernetes
#                          service discovery only) if needed, print its path
#   hack/tools.sh all      build all three, print their paths
#
# Binaries go to $VRAMFIT_BIN (default ~/.cache/vramfit/bin), outside the clone, so
# a fresh clone reuses them; each is rebuilt when its go.mod or go.sum changes.
# Progress goes to stderr, the path alone to stdout: `helm=$(hack/tools.sh helm)`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${VRAMFIT_BIN:-$HOME/.cache/vramfit/bin}

log() { printf 'tools: %s\n' "$*" >&2; }

# The Go package of each tool's main, as named by the `tool` directive of its go.mod.
declare -A package=(
  [helm]=helm.sh/helm/v3/cmd/helm
  [crane]=github.com/google/go-containerregistry/cmd/crane
  [prometheus]=github.com/prometheus/prometheus/cmd/prometheus
)
# Build tags of a tool. Prometheus: of its service discoveries only Kubernetes's
# (plugins/plugin_*.go), which leaves out the cloud SDKs and most of the build
# time; no `builtinassets`, so no web UI: the HTTP API alone.
declare -A tags=(
  [prometheus]=remove_all_sd,enable_kubernetes_sd
)

stamp() {
  { cat "$here/tools/$1/go.mod" "$here/tools/$1/go.sum"; [[ -z ${tags[$1]:-} ]] || echo "tags ${tags[$1]}"; } |
    sha256sum | cut -c1-16
}

build() {
  local name=$1 want
  [[ -n ${package[$name]:-} ]] || { log "unknown tool '$name' (known: ${!package[*]})"; exit 2; }
  want=$(stamp "$name")
  if [[ -x $bin/$name && "$(cat "$bin/.stamp-$name" 2>/dev/null)" == "$want" ]]; then
    echo "$bin/$name"
    return 0
  fi
  mkdir -p "$bin"
  log "building $name (${package[$name]}) into $bin; the first build takes a few minutes"
  # Built to a temporary name and moved, so an interrupted build leaves no binary
  # that looks current.
  (cd "$here/tools/$name" && nice -n 10 go build -trimpath -tags "${tags[$name]:-}" -o "$bin/.$name.tmp" "${package[$name]}")
  mv "$bin/.$name.tmp" "$bin/$name"
  echo "$want" >"$bin/.stamp-$name"
  echo "$bin/$name"
}

case ${1:-} in
  helm | crane | prometheus) build "$1" ;;
  all) build helm; build crane; build prometheus ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
