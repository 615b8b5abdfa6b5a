#!/usr/bin/env python3
"""Mutation score per file of a cargo-mutants run, before and after added tests.

    hack/mutants-score.py mutants.out [ADDED_TESTS]

ADDED_TESTS is a file with one test path a line (as `cargo test` prints them,
e.g. `controller::scheduler::tests::forgetting_a_job_drops_only_its_own_entries`),
the tests added for the run's survivors. libtest runs every test of the binary
and lists each one that failed, so a caught mutant whose failing tests are all
added ones was missed before they existed; one run with the new tests in place
gives both scores. Without ADDED_TESTS only the run's own score is printed.
Timeouts are counted apart (neither caught nor missed).
"""

import collections
import json
import re
import sys


def failing_tests(log: str) -> set[str]:
    blocks = re.findall(r"\nfailures:\n((?:    \S+\n)+)", log)
    return {line.strip() for block in blocks for line in block.splitlines()}


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    added = set()
    if len(sys.argv) == 3:
        with open(sys.argv[2]) as f:
            added = {line.strip() for line in f if line.strip()}
    with open(f"{out}/outcomes.json") as f:
        outcomes = json.load(f)["outcomes"]
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    only_added = []
    for outcome in outcomes:
        scenario = outcome["scenario"]
        if not isinstance(scenario, dict):  # the baseline
            continue
        mutant = scenario["Mutant"]
        c = counts[mutant["file"]]
        c["mutants"] += 1
        summary = outcome["summary"]
        if summary != "CaughtMutant":
            c[{"MissedMutant": "missed", "Unviable": "unviable", "Timeout": "timeout"}.get(summary, summary)] += 1
            continue
        with open(f"{out}/{outcome['log_path']}") as f:
            failed = failing_tests(f.read())
        if added and failed and failed <= added:
            c["caught_by_added_only"] += 1
            only_added.append((mutant["name"], sorted(failed)))
        else:
            # No list at all (the test binary aborted) counts as caught by
            # the old tests only when there are no added tests to blame.
            c["caught_before"] += 1
    print("| file | mutants | unviable | caught before | caught after | missed after | timeout |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for file, c in sorted(counts.items()):
        viable = c["mutants"] - c["unviable"] - c["timeout"]
        after = c["caught_before"] + c["caught_by_added_only"]
        print(
            f"| {file} | {c['mutants']} | {c['unviable']} | {c['caught_before']}/{viable} "
            f"| {after}/{viable} | {c['missed']} | {c['timeout']} |"
        )
    for name, failed in only_added:
        print(f"caught only by added tests: {name} ({', '.join(failed)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
