#!/usr/bin/env bash
# Runs the cached helm (built from its Go module on first use) with the given arguments.
set -euo pipefail
BIN="$("$(dirname "$0")/build-binaries.sh" helm | tail -n 1)"
exec "$BIN/helm" "$@"
