#!/usr/bin/env bash
# Renders webhook-config/ from the chart: certsGen mode, release "rekindle" in namespace "rekindle".
#   rekindle.yaml   everything the server needs (no Helm hooks)
#   certs-gen.yaml  the certs-gen Jobs and their RBAC, as plain objects (Helm runs them as hooks)
# Usage: render-webhook-config.sh OUT_DIR
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:?usage: $0 OUT_DIR}"
mkdir -p "$OUT"
helm() { "$ROOT/e2e/scripts/helm.sh" "$@"; }
common=(template rekindle "$ROOT/charts/rekindle" --namespace rekindle --kube-version 1.35.0
  --set certs.mode=certsGen --set fullnameOverride=rekindle --set tests.enabled=false)
header='# Generated from charts/rekindle by `just webhook-config`; do not edit.'
{
  echo "$header"
  helm "${common[@]}" --no-hooks
} > "$OUT/rekindle.yaml"
{
  echo "$header"
  echo "# Apply after rekindle.yaml; the Jobs retry until the webhook configuration exists."
  helm "${common[@]}" --show-only templates/certs-gen.yaml | grep -v 'helm.sh/hook'
} > "$OUT/certs-gen.yaml"
