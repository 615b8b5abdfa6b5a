#!/usr/bin/env bash
# Builds vramfit's wheel: the Python helper (python/) with libvramfit_alloc.so,
# built from alloc-ffi/, inside it, so that `pip install vramfit-*.whl` is all
# a training image needs (no hostPath mount of the library, no PYTHONPATH).
#
#   hack/wheel.sh [--profile release|dev] [--out DIR] [--no-build-isolation] [-v]
#
# --profile  cargo profile of the library: release (default, what images
#            ship) or dev (unoptimised, quicker to build; the CI test)
# --out      where the wheel goes (default ~/.cache/vramfit/wheels, outside
#            the clone); a wheel of the same name there is replaced
# --no-build-isolation
#            use this Python's setuptools (>= 70.1) and setuptools-rust
#            instead of installing them into a throwaway build environment
#            (which needs the package index or pip's cache)
# -v         show pip's and cargo's output
#
# The library builds in $CARGO_TARGET_DIR (default ~/.cache/vramfit/target),
# shared with the other builds. The wheel is built from a copy of python/ (the
# files git tracks or would track) under ~/.cache/vramfit/wheel-build, so no
# build/ or *.egg-info appears in the clone and no stale file gets in.
# Prints the wheel's path and size; the last line is the path alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/vramfit/target}

log() { printf 'wheel: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

profile=release
out=$HOME/.cache/vramfit/wheels
pip_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --profile) [[ $# -ge 2 ]] || die "--profile needs a value"; profile=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a value"; out=$2; shift 2 ;;
    --no-build-isolation) pip_args+=(--no-build-isolation); shift ;;
    -v|--verbose) pip_args+=(-v); shift ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case $profile in
  release) unset SETUPTOOLS_RUST_CARGO_PROFILE ;;
  dev) export SETUPTOOLS_RUST_CARGO_PROFILE=dev ;;
  *) die "--profile is release or dev, not $profile" ;;
esac
export VRAMFIT_BUILD_ALLOCATOR=1
export VRAMFIT_ALLOC_MANIFEST=$repo/alloc-ffi/Cargo.toml
command -v cargo >/dev/null || die "cargo not found: the wheel's library is built from alloc-ffi/"

out=$(realpath -m -- "$out")
case $out/ in
  "$(realpath -- "$repo")"/*) die "--out $out is inside the clone; pick a folder outside it" ;;
esac
mkdir -p "$out"

stage=$HOME/.cache/vramfit/wheel-build/$profile
rm -rf "$stage"
mkdir -p "$stage/python" "$stage/dist"
# The working tree's python/ as git sees it: tracked files (less deleted ones)
# and untracked ones that are not ignored.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard -- python |
    while IFS= read -r -d '' f; do if [[ -f $f ]]; then printf '%s\0' "${f#python/}"; fi; done |
    (cd python && tar --null -T - -cf -) | tar -xf - -C "$stage/python"
else
  cp -a python/. "$stage/python/"
  rm -rf "$stage/python/build" "$stage/python"/*.egg-info "$stage/python/vramfit/libvramfit_alloc.so"
fi

log "building vramfit's wheel with libvramfit_alloc.so (profile $profile, CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
start=$SECONDS
(cd "$stage" && python3 -m pip wheel --no-deps --disable-pip-version-check ${pip_args[@]+"${pip_args[@]}"} \
  --wheel-dir "$stage/dist" ./python) >&2
elapsed=$((SECONDS - start))

shopt -s nullglob
built=("$stage"/dist/vramfit-*.whl)
[[ ${#built[@]} -eq 1 ]] || die "expected one wheel in $stage/dist, found ${#built[@]}"
wheel=$out/$(basename "${built[0]}")
mv -f "${built[0]}" "$wheel"

# What the wheel holds and needs: the library, its size, and the newest
# glibc and libstdc++ symbol versions it uses (the wheel is tagged
# linux_x86_64, not manylinux: a target system needs these or newer).
read -r lib_size needs < <(python3 - "$wheel" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    try:
        data = z.read("vramfit/libvramfit_alloc.so")
    except KeyError:
        print("missing -")
        sys.exit()
def newest(name):
    found = {tuple(map(int, v.split(b"."))) for v in re.findall(name + rb"_([0-9]+(?:\.[0-9]+)+)\0", data)}
    return name.decode() + "_" + (".".join(map(str, max(found))) if found else "none")
print(len(data), newest(b"GLIBC") + "," + newest(b"GLIBCXX"))
EOF
)
[[ $lib_size != missing ]] || die "$wheel has no vramfit/libvramfit_alloc.so"
size=$(stat -c %s "$wheel")
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
log "built in ${elapsed}s: $(basename "$wheel"), $(mib "$size") ($size bytes); libvramfit_alloc.so $(mib "$lib_size") unpacked, needs ${needs/,/ and } or newer"
log "install: pip install $wheel"
echo "$wheel"
