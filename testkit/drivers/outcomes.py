#!/usr/bin/env python3
"""Test outcomes of a driver suite, and the tests whose outcome differs between two runs.

    outcomes.py go RESULT.json > OUT.tsv        # `go test -json` output
    outcomes.py junit RESULT.xml > OUT.tsv      # pytest --junitxml output
    outcomes.py differing DIRECT.tsv THROUGH.tsv  # the tests to run again
    outcomes.py diff SUITE DIRECT.tsv THROUGH.tsv EXPECTED.tsv [LABEL]

An outcome file has one line per test: `<test id>\t<pass|fail|skip>`; next to it, `*.rerun.tsv`
(if present) holds the outcomes of the differing tests run again, one line per run. `diff`
prints every test whose outcome through pgwake is not its outcome directly: as flaky when its
runs directly disagree among themselves, as expected when EXPECTED lists it (lines
`suite[:mode]\ttest id\tdirect outcome\toutcomes through pgwake\treason`, the outcomes
`|`-separated, `mixed` for runs through pgwake that disagree), else as a difference; it names the listed ones that did not
differ, and exits 1 when a difference is not listed.
"""

import json
import os
import re
import sys
import xml.etree.ElementTree as ET

TEMP_NUMBER = re.compile(r"\d{6,}")


def go_outcomes(path):
    """Outcome of each test (subtests too) from `go test -json` lines, and `<package> (package)`
    for a package that failed without a failing test."""
    outcomes = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            action = ev.get("Action")
            if action not in ("pass", "fail", "skip"):
                continue
            package = ev.get("Package", "")
            # Some subtests are named after a temporary folder (a random number in its name).
            test = TEMP_NUMBER.sub("N", ev.get("Test") or "")
            key = f"{package} {test}" if test else f"{package} (package)"
            outcomes[key] = action
    # A package's own line counts only when it failed and none of its tests did (a build
    # failure, a panic or a timeout): otherwise it repeats what its tests say.
    failing = {k.split(" ", 1)[0] for k, v in outcomes.items() if v == "fail" and "(package)" not in k}
    return {
        k: v
        for k, v in outcomes.items()
        if not k.endswith(" (package)") or (v == "fail" and k.split(" ", 1)[0] not in failing)
    }


def junit_outcomes(path):
    """Outcome of each test case in a pytest JUnit XML report (an xfail counts as a skip)."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        key = f"{module}.py::{case.get('name')}"
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcomes[key] = "fail"
        elif "skipped" in tags:
            outcomes[key] = "skip"
        else:
            outcomes[key] = "pass"
    return outcomes


def read_tsv(path):
    outcomes = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            test, _, outcome = line.rstrip("\n").rpartition("\t")
            if test:
                outcomes[test] = outcome
    return outcomes


def read_reruns(path):
    """Every outcome each test had when run again (none when the file is missing)."""
    runs = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                test, _, outcome = line.rstrip("\n").rpartition("\t")
                if test:
                    runs.setdefault(test, []).append(outcome)
    return runs


def differing(direct_path, through_path):
    direct, through = read_tsv(direct_path), read_tsv(through_path)
    for test in sorted(set(direct) | set(through)):
        if direct.get(test, "missing") != through.get(test, "missing"):
            print(test)
    return 0


def read_expected(path, suite, mode):
    """The listed differences of `suite` in `mode`: a suite field `name` holds in every mode,
    `name:mode` in that one only."""
    expected = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 5 or not fields[4].strip():
                sys.exit(f"{path}:{number}: want suite, test, direct, through pgwake, reason")
            name, _, only = fields[0].partition(":")
            if name == suite and only in ("", mode):
                expected[fields[1]] = (fields[2], fields[3], fields[4])
    return expected


def diff(suite, direct_path, through_path, expected_path, label=""):
    direct = read_tsv(direct_path)
    through = read_tsv(through_path)
    expected = read_expected(expected_path, suite, label)
    # A package line only matters when the package did not run its tests (build failure,
    # timeout): its tests then show up as missing.
    tests = sorted(set(direct) | set(through))
    differing = []
    for test in tests:
        a, b = direct.get(test, "missing"), through.get(test, "missing")
        if a != b:
            differing.append((test, a, b))
    title = f"{suite}{' ' + label if label else ''}"
    counts = lambda o: {k: sum(1 for v in o.values() if v == k) for k in ("pass", "fail", "skip")}
    print(f"== {title}: directly {counts(direct)}, through pgwake {counts(through)}")
    rerun_direct = read_reruns(direct_path.replace(".tsv", ".rerun.tsv"))
    rerun_through = read_reruns(through_path.replace(".tsv", ".rerun.tsv"))
    unexpected = 0
    for test, a, b in differing:
        listed = expected.get(test)
        runs_a = [a] + rerun_direct.get(test, [])
        runs_b = [b] + rerun_through.get(test, [])
        if len(set(runs_a)) > 1:
            print(f"  flaky       {test}: directly {' '.join(runs_a)}, through pgwake {' '.join(runs_b)}")
            continue
        # Steady directly, unsteady through pgwake: a difference, shown as `mixed`.
        b = b if len(set(runs_b)) == 1 else "mixed"
        if listed and listed[0] == a and b in listed[1].split("|"):
            print(f"  expected    {test}: {a} -> {b} ({listed[2]})")
        else:
            unexpected += 1
            print(f"  DIFFERS     {test}: {a} -> {b} (directly {' '.join(runs_a)}, through pgwake {' '.join(runs_b)})")
    seen = {t for t, _, _ in differing}
    for test in sorted(set(expected) - seen):
        print(f"  not seen    {test}: listed as {expected[test][0]} -> {expected[test][1]}")
    print(f"== {title}: {len(differing)} differ, {unexpected} not listed")
    return 1 if unexpected else 0


def main(argv):
    if len(argv) >= 3 and argv[1] in ("go", "junit"):
        parse = go_outcomes if argv[1] == "go" else junit_outcomes
        for test, outcome in sorted(parse(argv[2]).items()):
            print(f"{test}\t{outcome}")
        return 0
    if len(argv) == 4 and argv[1] == "differing":
        return differing(argv[2], argv[3])
    if len(argv) in (6, 7) and argv[1] == "diff":
        return diff(*argv[2:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
