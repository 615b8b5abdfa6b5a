#!/usr/bin/env python3
"""Adds what a newer capture writes to older captures of the same cases.

    python3 scripts/merge_capture_fields.py SRC_DIR NEW_DIR OUT_DIR

For each profile in SRC_DIR (captured on the GPU machine's CPU, with the
measuring machine's PyTorch), the profile of the same name in NEW_DIR (a
later capture, possibly on another machine) gives:

- each convolution's `channelsLast` flag, when both list the same
  convolution calls (kind, shapes, groups);
- its `reductions`, when both have the same events and sizes (their
  positions index the events).

A field whose condition does not hold is left as it was, and said so.
"""
import json
import os
import sys


def key(c):
    return (c["kind"], c["input"], c["weight"], c["groups"])


def main():
    src, new, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(src)):
        a = json.load(open(os.path.join(src, name)))
        try:
            b = json.load(open(os.path.join(new, name)))
        except FileNotFoundError:
            print(f"{name}: no newer capture")
            continue
        ca, cb = a.get("convolutions", []), b.get("convolutions", [])
        if len(ca) == len(cb) and all(key(x) == key(y) for x, y in zip(ca, cb)):
            for x, y in zip(ca, cb):
                x["channelsLast"] = y.get("channelsLast", False)
        else:
            print(f"{name}: convolution calls differ, channelsLast left out")
        if a["events"] == b["events"] and a["sizes"] == b["sizes"]:
            a["reductions"] = b.get("reductions", [])
        else:
            print(f"{name}: events differ, reductions left out")
        with open(os.path.join(out, name), "w") as f:
            json.dump(a, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
