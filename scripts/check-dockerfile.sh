#!/usr/bin/env bash
# Lints the Dockerfile with hadolint and checks that its build command is the one `just release` runs
# (the binary the tests and benchmarks exercise is the binary the image ships).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$(scripts/install-python-tools.sh)"
"$VENV/bin/hadolint" Dockerfile
image_cmd="$(sed -n 's/^RUN \(cargo build .*\)$/\1/p' Dockerfile)"
release_cmd="$(awk '/^release:/{getline; sub(/^[ \t]+/, ""); print; exit}' justfile)"
if [ -z "$image_cmd" ] || [ "$image_cmd" != "$release_cmd" ]; then
  echo "Dockerfile builds with '$image_cmd' but \`just release\` runs '$release_cmd'" >&2
  exit 1
fi
echo "Dockerfile: hadolint clean; builds with \`just release\`'s command: $release_cmd"
