# Sourced by the GPU machine's capture scripts: `setup_run OUT` moves to the
# repository root, creates OUT, and sets `work` (a fresh scratch folder) and
# `ncpu` (the machine's CPUs, for the taskset splits).
# shellcheck shell=bash
setup_run() {
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
  mkdir -p "$1"
  export PYTHONUNBUFFERED=1
  work=$(mktemp -d)
  ncpu=$(nproc)
}
