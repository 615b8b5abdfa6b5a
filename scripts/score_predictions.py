#!/usr/bin/env python3
"""Score predictions recorded before a set ran (scripts/record_predictions.py)
against the set's measurements (scripts/gpu/calibrate_libraries.py), with
the figures `vramfit bench predict` reports: each run's error of the
predicted peak against NVML's measured peak, then the median, p90
(nearest rank), largest absolute error and the runs under beyond 5 %.

Usage:
    python3 scripts/score_predictions.py data/calibration/fresh4-predictions.jsonl \
        data/calibration/h200-fresh4.jsonl [--path analytic|profile]
"""

import argparse
import json
import math
import statistics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("predictions")
    ap.add_argument("measured")
    ap.add_argument("--path", default="analytic", choices=("analytic", "profile"))
    args = ap.parse_args()
    predicted, unanswered = {}, {}
    for line in open(args.predictions):
        r = json.loads(line)
        entry = r.get(args.path) or {}
        if "peakBytes" in entry:
            predicted[r["name"]] = entry["peakBytes"]
        elif "error" in entry:
            # recorded as refused (a family the path does not describe)
            unanswered[r["name"]] = entry["error"].splitlines()[0][:120]
    rows, failed = [], []
    for line in open(args.measured):
        r = json.loads(line)
        if r["split"] == "repeat" or r["name"] not in predicted:
            continue
        if "measured" not in r:
            failed.append(r["name"])
            continue
        m, p = r["measured"]["nvmlPeakBytes"], predicted[r["name"]]
        rows.append((r["name"], m, p, (p - m) / m))
    if not rows:
        raise SystemExit("no run of the measured file has a recorded prediction")
    for name, m, p, e in rows:
        print(f"{name:48s} measured {m / 2**30:8.3f} GiB  predicted {p / 2**30:8.3f} GiB  {100 * e:+6.1f}%")
    errors = sorted(abs(r[3]) for r in rows)
    p90 = errors[min(len(errors), max(1, math.ceil(0.9 * len(errors)))) - 1]
    under = [r[0] for r in rows if r[3] < -0.05]
    print(f"n={len(errors)} median {100 * statistics.median(errors):.1f}% p90 {100 * p90:.1f}% "
          f"max {100 * errors[-1]:.1f}% under-predicted >5%: {len(under)} {under}")
    if failed:
        print(f"not measured (the run failed): {failed}")
    for name, error in unanswered.items():
        print(f"no prediction recorded for {name}: {error}")


if __name__ == "__main__":
    main()
