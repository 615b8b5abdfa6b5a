#!/usr/bin/env bash
# Mutation testing with cargo-mutants: every mutant (a changed operator, a
# function returning a default, a deleted match arm, ...) must make a unit test
# fail. Unit tests only, so each mutant costs one incremental build of the
# library's test binary.
#
#   hack/mutants.sh                 # the decision files of controller/ and job/ (tests controller:: job::)
#   hack/mutants.sh place           # the packer, src/place (tests place::)
#   hack/mutants.sh alloc           # the caching allocator, the vramfit-alloc-core crate (all its tests)
#   hack/mutants.sh FILE...         # other files (tests controller:: job::, or MUTANTS_TESTS)
#
# MUTANTS_TESTS is a space-separated list of test-name filters.
#
# MUTANTS_SKIP is a space-separated list of test names (substrings) to leave
# out, passed to the test binary as `--skip NAME` each: e.g. the allocator's
# snapshot replays of the expandable policy and the planner, 45 of the 51 s
# that `alloc::` takes.
#
# Extra cargo-mutants flags go in MUTANTS_ARGS, e.g. MUTANTS_ARGS=--iterate
# (only the mutants missed or not yet tested in the last run) or
# MUTANTS_ARGS="--output /tmp/run1". Installs cargo-mutants when missing.
# Results land in mutants.out/ (caught, missed, timeout, unviable lists;
# outcomes.json; one log per mutant). Runs under nice: it is a long CPU job on
# a shared machine. The lists of the recorded runs are in docs/mutants/.
#
# MUTANTS_SKIP_DEV_AGENT=1 drops the `vramfit-agent` dev-dependency and the
# crate's dev-dependency on itself (its `testing` fixtures) from Cargo.toml for
# the run (restored on exit, also on Ctrl-C): cargo builds every
# dev-dependency even for the library's unit tests, so each mutant otherwise
# compiles the vramfit library twice (once for the agent and the fixtures) and
# the agent once. The unit tests use neither (they have the fixtures through
# cfg(test)).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo-mutants >/dev/null; then
  nice -n 19 cargo install --locked cargo-mutants
fi

tests=${MUTANTS_TESTS:-controller:: job::}
package=vramfit
files=()
case "${1:-}" in
  "")
    files=(
      src/controller/cluster_view.rs
      src/job/budget.rs
      src/job/backoff.rs
      src/job/exit.rs
      src/job/env.rs
      src/job/shape_file.rs
      src/controller/scheduler.rs
      src/job/signature.rs
      src/quantity.rs
      src/controller/transition.rs
      src/controller/retry.rs
      src/controller/supervise.rs
      src/controller/absorbed.rs
      src/controller/job_index.rs
      src/controller/model_cache.rs
    )
    ;;
  place)
    files=("src/place/**")
    tests=${MUTANTS_TESTS:-place::}
    ;;
  alloc)
    files=("alloc-core/src/**")
    package=vramfit-alloc-core
    tests=${MUTANTS_TESTS:-}
    ;;
  *) files=("$@") ;;
esac
args=()
for f in "${files[@]}"; do args+=(--file "$f"); done
skips=()
for s in ${MUTANTS_SKIP:-}; do skips+=(--skip "$s"); done

if [[ ${MUTANTS_SKIP_DEV_AGENT:-0} == 1 ]]; then
  backup=$(mktemp -d)
  cp Cargo.toml Cargo.lock "$backup/"
  trap 'cp "$backup/Cargo.toml" "$backup/Cargo.lock" . && rm -r "$backup"' EXIT
  sed -i -e '/^vramfit-agent = { path = "agent"[,}]/d' -e '/^vramfit = { path = "\."[,}]/d' Cargo.toml
fi

# Each mutant is one incremental build whose link dominates: link with mold
# when it is installed (apt-get install mold) and leave debug info out, which
# the unit tests do not need (MUTANTS_DEBUG=1 keeps it).
if command -v mold >/dev/null; then
  export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-fuse-ld=mold"
fi
if [[ ${MUTANTS_DEBUG:-0} != 1 ]]; then
  export CARGO_PROFILE_DEV_DEBUG=0
fi

# --in-place: mutate this tree rather than a copy, so the existing target
# directory's incremental build is reused. Run it in a tree nobody edits, and
# with no other tree building into the same target folder: worktrees share
# artifact hashes there, and another tree's build can make a mutant's test run
# an unmutated binary (a false "missed").
# shellcheck disable=SC2086 # MUTANTS_ARGS and tests are lists of words
nice -n 19 cargo mutants --in-place --no-shuffle -p "$package" "${args[@]}" \
  --timeout 120 --build-timeout 900 ${MUTANTS_ARGS:-} --cargo-arg=--lib -- -- $tests "${skips[@]}"
