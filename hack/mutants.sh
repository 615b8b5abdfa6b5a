#!/usr/bin/env bash
# Mutation testing of the controller's decision code with cargo-mutants:
# every mutant (a changed operator, a function returning a default, a deleted
# match arm, ...) must make a unit test fail. Unit tests only, so each mutant
# costs one incremental build of the library's test binary.
#
#   hack/mutants.sh            # the decision files listed below
#   hack/mutants.sh FILE...    # other files
#
# Installs cargo-mutants when missing. Results land in mutants.out/ (caught,
# missed, timeout, unviable lists; outcomes.json). Runs under nice: it is a
# long CPU job on a shared machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo-mutants >/dev/null; then
  nice -n 15 cargo install --locked cargo-mutants
fi

files=("$@")
if [[ ${#files[@]} -eq 0 ]]; then
  files=(
    src/controller/inventory.rs
    src/controller/budget.rs
    src/controller/backoff.rs
    src/controller/exit.rs
    src/controller/scheduler.rs
    src/controller/signature.rs
    src/controller/quantity.rs
    src/controller/transition.rs
    src/controller/retry.rs
    src/controller/supervise.rs
  )
fi
args=()
for f in "${files[@]}"; do args+=(--file "$f"); done

# --in-place: mutate this tree rather than a copy, so the existing target
# directory's incremental build is reused. Run it in a tree nobody edits, and
# with no other tree building into the same target folder: worktrees share
# artifact hashes there, and another tree's build can make a mutant's test run
# an unmutated binary (a false "missed").
exec nice -n 15 cargo mutants --in-place --no-shuffle -p vramfit "${args[@]}" \
  --timeout 120 --build-timeout 900 --cargo-arg=--lib -- -- controller::
