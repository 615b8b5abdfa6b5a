#!/usr/bin/env bash
# On the GPU machine, in one call: the named runs of the committed sets
# measured again (allocation histories recorded) and captured on the CPU,
# both with another version of transformers than the machine's, installed
# from a wheel the call carries. It tells whether a capture follows the
# library version a job trains with.
#
#   scripts/gpu/library_version.sh OUT WHEEL NAME...
#
# OUT gets library-version.tgz: SET.jsonl and SET-profiles.jsonl per set
# (the runs), captures/NAME.profile.json and the logs.
set -uo pipefail
out=${1:?usage: library_version.sh OUT WHEEL NAME...}
wheel=${2:?usage: library_version.sh OUT WHEEL NAME...}
shift 2
# shellcheck source=scripts/gpu/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
wheel=$(realpath "$wheel")
setup_run "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" \
  "$wheel" || exit 1
export PYTHONPATH=$work/site
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
  | tee "$work/versions.txt"
mkdir -p "$work/captures"
for s in families fresh fresh2 fresh3 heldout; do
  only=$(python3 - "$s" "$@" <<'PY'
import json, sys
names = set(sys.argv[2:])
rows = [json.loads(l) for l in open(f"data/calibration/h200-{sys.argv[1]}.jsonl")]
print(",".join(r["name"] for r in rows if r["name"] in names and r["split"] != "repeat"))
PY
)
  [[ -z $only ]] && continue
  grep -h -F -f <(tr , '\n' <<<"$only" | sed 's/.*/"name": "&"/') "data/calibration/h200-$s.jsonl" \
    >"$work/$s-rows.jsonl"
  {
    PYTHONPATH=$work/site:python taskset -c $((ncpu - 2)),$((ncpu - 1)) python3 \
      scripts/capture_library_profiles.py "$work/$s-rows.jsonl" "$work/captures"
  } >>"$work/capture.log" 2>&1 &
  python3 scripts/gpu/calibrate_libraries.py --set "$s" --only "$only" --no-repeats --snapshots \
    --parallel 2 --out "$work/$s" --timeout 120 --deadline 60 >"$work/$s.log" 2>&1 &
done
wait
for s in families fresh fresh2 fresh3 heldout; do
  [[ -d $work/$s ]] || continue
  cp "$work/$s"/*.jsonl "$work/" 2>/dev/null
  rm -rf "${work:?}/$s"
done
tar -C "$work" --exclude=site -czf "$out/library-version.tgz" .
cat "$work/capture.log"
tail -n 3 "$work"/*.log
ls -l "$out"
