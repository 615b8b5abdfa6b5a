#!/usr/bin/env python3
"""Copies the `channelsLast` flag of each convolution call from one capture of
a set (CL_DIR) onto another capture of the same cases (SRC_DIR), where both
captures list the same calls (kind, shapes, groups); writes OUT_DIR.

    python3 scripts/merge_channels_last.py SRC_DIR CL_DIR OUT_DIR
"""
src, cl, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
for f in sorted(os.listdir(src)):
    a = json.load(open(os.path.join(src, f)))
    try:
        b = json.load(open(os.path.join(cl, f)))
    except FileNotFoundError:
        print(f, "no second capture"); continue
    ca, cb = a.get("convolutions", []), b.get("convolutions", [])
    key = lambda c: (c["kind"], c["input"], c["weight"], c["groups"])
    if len(ca) != len(cb) or any(key(x) != key(y) for x, y in zip(ca, cb)):
        print(f, "convolutions differ", len(ca), len(cb)); continue
    for x, y in zip(ca, cb):
        x["channelsLast"] = y["channelsLast"]
    json.dump(a, open(os.path.join(out, f), "w"), separators=(",", ":"))
