#!/usr/bin/env bash
# On the GPU machine: the allocation histories of reference-model runs
# (scripts/gpu/calibrate_predictor.py, whose configurations are the
# data/calibration/h200.jsonl set), to compare with the sequence the
# predictor generates for them:
#
#   scripts/gpu/reference_histories.sh OUT DEADLINE NAME...
#
# OUT gets reference.jsonl (the measured lines), reference.log and
# profiles.tar.gz (NAME.profile.json each, converted from the snapshots).
set -uo pipefail
out=${1:?usage: reference_histories.sh OUT DEADLINE NAME...}
deadline=${2:?DEADLINE}
shift 2
# shellcheck source=scripts/gpu/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
setup_run "$out"
out=$(cd "$out" && pwd)
names=$(IFS=,; echo "$*")
python3 scripts/gpu/calibrate_predictor.py --snapshots --only "$names" \
  --deadline "$deadline" --out "$work/ref" >"$out/reference.log" 2>&1
echo "rc=$?" >>"$out/reference.log"
cp "$work"/ref/*.jsonl "$out/" 2>/dev/null
(cd "$work/ref" && tar -czf "$out/profiles.tar.gz" ./*.profile.json) 2>>"$out/reference.log"
ls -la "$out" >>"$out/reference.log"
