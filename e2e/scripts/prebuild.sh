#!/usr/bin/env bash
# Builds every Go binary the test suite runs into the cache (the control plane, the real node, the
# companions), so that no later step has to. .ci/run runs it beside the Rust builds on a fresh machine,
# never beside the tests: a Go build starves the control plane the timing-sensitive tests run against.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
"$HERE/build-binaries.sh" node-all >/dev/null
"$HERE/build-companions.sh" all >/dev/null
echo "[prebuild] $(date +%T) every Go binary built"
