#!/usr/bin/env bash
# Applies each I/O mutant's diff from a cargo-mutants output folder in turn
# and runs the integration test that reaches it; run from the repository root
# in a tree nobody edits meanwhile.
#
#   docs/mutants/allocation-fence-cache-events/integration-check.sh /tmp/mut-ctl/mutants.out
set -uo pipefail
D=${1:?the mutants.out folder}/diff
run() {
  local diff=$1 test=$2
  patch -s -p0 <"$D/$diff" || { echo "$diff: patch failed"; return; }
  if nice cargo test -q --test integration "$test" -- --exact >"/tmp/verify-$diff.log" 2>&1; then
    echo "$diff: $test PASSED (mutant missed)"
  else
    echo "$diff: $test FAILED (mutant caught)"
  fi
  patch -s -R -p0 <"$D/$diff"
}
for d in "$D"/src__controller__allocation.rs_line_154*.diff "$D"/src__controller__allocation.rs_line_181*.diff \
  "$D"/src__controller__allocation.rs_line_236*.diff; do
  run "$(basename "$d")" ui::the_ui_page_shows_gpus_jobs_waiting_queue_and_retries_in_chromium
done
for d in "$D"/src__controller__events.rs_line_67*.diff; do
  run "$(basename "$d")" controller::job_goes_from_apply_to_placed_running_and_succeeded
done
