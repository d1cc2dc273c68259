#!/usr/bin/env bash
# Installs `just` when it is missing: the prebuilt wheel from PyPI (seconds), else from crates.io (minutes).
set -euo pipefail
if command -v just >/dev/null 2>&1; then exit 0; fi
if python3 -m pip install --quiet --disable-pip-version-check rust-just >&2 && command -v just >/dev/null 2>&1; then
  exit 0
fi
cargo install --locked just >&2
