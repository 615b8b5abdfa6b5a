#!/usr/bin/env bash
# On the GPU machine's CPUs (the GPU is not used): capture again, with the
# repository's vramfit.profile and the library versions the runs trained
# with, every run of the committed measured sets, so that the committed
# captures (data/profiles/*-h200) follow the capture's code.
#
#   scripts/gpu/recapture.sh OUT [SET...]
#
# SET names data/calibration/h200-SET.jsonl (all eight by default); each set
# is captured on two CPUs of its own, the sets side by side. OUT gets
# recaptures.tgz (SET/NAME.profile.json) and recapture.log (each capture's
# events, live peak and seconds, the host's peak memory per set).
set -uo pipefail
out=${1:?usage: recapture.sh OUT [SET...]}
shift
sets=("$@")
if ((${#sets[@]} == 0)); then
  sets=(libraries libraries-validation families heldout fresh fresh2 fresh3 fresh4)
fi
# shellcheck source=scripts/gpu/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
setup_run "$out"
timer=()
if [[ -x /usr/bin/time ]]; then timer=(/usr/bin/time -f "%C: host peak %M KiB, %e s"); fi
i=0
for s in "${sets[@]}"; do
  first=$(((2 * i) % ncpu))
  {
    OMP_NUM_THREADS=2 PYTHONPATH=python "${timer[@]}" taskset -c "$first,$((first + 1))" python3 scripts/capture_library_profiles.py \
      "data/calibration/h200-$s.jsonl" "$work/recaptures/$s"
    echo "$s: rc=$?"
  } >"$work/$s.log" 2>&1 &
  i=$((i + 1))
done
wait
for s in "${sets[@]}"; do cat "$work/$s.log"; done >"$out/recapture.log"
tar -C "$work/recaptures" -czf "$out/recaptures.tgz" .
grep -h "rc=\|host peak\|FAILED" "$out/recapture.log"
ls -l "$out"
