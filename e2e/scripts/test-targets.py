#!/usr/bin/env python3
"""Prints `--test NAME` for every test file of the e2e crate that runs without extra features, except the
names given: `just test` runs each e2e file once, the given ones under the chart's identity (`e2e-chart`)
and the rest with this list. A name that is no such file is an error, so a renamed file cannot drop out of
both runs unnoticed."""
import json
import subprocess
import sys

names = sys.argv[1:]
meta = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
)
package = next(p for p in meta["packages"] if p["name"] == "e2e")
tests = sorted(
    t["name"]
    for t in package["targets"]
    if "test" in t["kind"] and not t.get("required-features")
)
unknown = [n for n in names if n not in tests]
if unknown:
    sys.exit(f"test-targets.py: no e2e test file {' '.join(unknown)} (files: {' '.join(tests)})")
print(" ".join(f"--test {t}" for t in tests if t not in names))
