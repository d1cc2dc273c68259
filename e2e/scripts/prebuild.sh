#!/usr/bin/env bash
# Builds every Go binary the test suite runs (control plane and helm, the real node's binaries, the
# companions), in the order the suite first needs them. .ci/run starts it in the background at the
# lowest priority: on a fresh machine these builds are half the run, and they fill the cores the Rust
# builds and the tests leave idle. Each build script locks per binary, so a step that needs one waits
# for it rather than building it twice. A build that fails here is tried again, in the foreground, by
# the step that needs it, and fails there with its error.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
"$HERE/build-binaries.sh" helm
"$HERE/build-binaries.sh" all
"$HERE/build-companions.sh" prometheus
"$HERE/build-companions.sh" all
"$HERE/build-binaries.sh" node
