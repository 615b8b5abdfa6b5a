#!/usr/bin/env python3
"""Pool the analytic rows of several `vramfit bench predict -o json` outputs.

    python3 scripts/summarize_bench_predict.py docs/results/predict/2026-12-05-address-order/after/h200*.json

Prints, over every row whose source is the analytic model: the count, the
median absolute error, and how many rows are under and over by more than 5 %.
Files named `profiles-*` are left out (their rows come from captures).
"""

import json
import os
import statistics
import sys


def main(paths):
    errors = []
    for path in paths:
        if os.path.basename(path).startswith("profiles-"):
            continue
        with open(path) as f:
            rows = json.load(f)["rows"]
        errors += [100 * r["relativeError"] for r in rows if r.get("source") == "model"]
    if not errors:
        sys.exit("no analytic rows in " + " ".join(paths))
    print(f"analytic rows {len(errors)}: median abs error "
          f"{statistics.median(abs(e) for e in errors):.2f} %, "
          f"under beyond 5 % {sum(e < -5 for e in errors)}, "
          f"over beyond 5 % {sum(e > 5 for e in errors)}")


if __name__ == "__main__":
    main(sys.argv[1:])
