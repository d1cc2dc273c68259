#!/usr/bin/env bash
# Builds the components users run beside rekindle, from their Go modules, cached by version outside the
# repository (a binary already in the cache is never rebuilt): Prometheus and promtool, the Argo Rollouts
# controller. Also fetches the CRDs the tests install from the same modules.
#
# Usage: build-companions.sh [all|prometheus|rollouts|cert-manager]. Prints the bin directory on the last
# line. Environment: PROMETHEUS_VERSION (v0.316.0), ROLLOUTS_VERSION (v1.10.1), PROM_OPERATOR_VERSION
# (v0.85.0), CERT_MANAGER_VERSION (v1.21.2), REKINDLE_E2E_CACHE (~/.cache/rekindle-e2e).
set -euo pipefail

PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
ROLLOUTS_VERSION="${ROLLOUTS_VERSION:-v1.10.1}"
PROM_OPERATOR_VERSION="${PROM_OPERATOR_VERSION:-v0.85.0}"
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.21.2}"
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${REKINDLE_E2E_CACHE:-$HOME/.cache/rekindle-e2e}"
BIN="$CACHE/companions/bin-prometheus-$PROMETHEUS_VERSION-rollouts-$ROLLOUTS_VERSION-cert-manager-$CERT_MANAGER_VERSION"
CRDS="$BIN/crds"
WORK="$CACHE/build"
mkdir -p "$BIN" "$CRDS" "$WORK"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { echo "[build-companions] $*" >&2; }
have() { [ -x "$BIN/$1" ]; }

# The directory of a module version in the module cache (downloaded if needed).
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p'; }

build_prometheus() {
  if ! have prometheus || ! have promtool; then
    log "building prometheus and promtool $PROMETHEUS_VERSION"
    GOBIN="$BIN" go install -trimpath -ldflags "-s -w" \
      "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" \
      "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
  fi
  if [ ! -f "$CRDS/monitoring.coreos.com.yaml" ]; then
    local dir
    dir="$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROM_OPERATOR_VERSION")"
    cat "$dir"/example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,podmonitors,prometheusrules}.yaml \
      >"$CRDS/monitoring.coreos.com.yaml.tmp"
    mv "$CRDS/monitoring.coreos.com.yaml.tmp" "$CRDS/monitoring.coreos.com.yaml"
  fi
}

# The Rollouts module pins its k8s.io dependencies with replace directives, which `go install` refuses:
# a wrapper module carries them over.
build_rollouts() {
  if ! have rollouts-controller; then
    local dir="$WORK/rollouts-$ROLLOUTS_VERSION" gomod
    mkdir -p "$dir" && cd "$dir"
    if [ ! -f go.mod ]; then
      go mod init rekindle-e2e/rollouts >/dev/null 2>&1
      gomod="$(go mod download -json "github.com/argoproj/argo-rollouts@$ROLLOUTS_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
      awk '/^replace \(/{r=1; next} r && /^\)/{r=0} r && /=>/{print}' "$gomod" | while read -r from _ to ver; do
        go mod edit -replace="$from=$to@$ver"
      done
      go mod edit -require="github.com/argoproj/argo-rollouts@$ROLLOUTS_VERSION"
      cat > tools.go <<'GO'
//go:build tools

package tools

import _ "github.com/argoproj/argo-rollouts/cmd/rollouts-controller"
GO
    fi
    log "resolving and building the Argo Rollouts controller $ROLLOUTS_VERSION"
    go mod tidy >&2
    go build -trimpath -ldflags "-s -w" -o "$BIN/rollouts-controller.tmp" github.com/argoproj/argo-rollouts/cmd/rollouts-controller
    mv "$BIN/rollouts-controller.tmp" "$BIN/rollouts-controller"
  fi
  if [ ! -f "$CRDS/argoproj.io.yaml" ]; then
    local mod
    mod="$(module_dir "github.com/argoproj/argo-rollouts@$ROLLOUTS_VERSION")"
    # The controller watches Rollouts, Experiments, AnalysisRuns and (Cluster)AnalysisTemplates.
    for f in "$mod"/manifests/crds/*-crd.yaml; do echo "---"; cat "$f"; done >"$CRDS/argoproj.io.yaml.tmp"
    mv "$CRDS/argoproj.io.yaml.tmp" "$CRDS/argoproj.io.yaml"
  fi
}

# cert-manager's cmd/* binaries are separate modules that are not served: e2e/companions/cert-manager is
# the thin main that runs its controllers and cainjector from the root module's packages. Its CRDs come
# from the same module.
build_cert_manager() {
  if ! have cert-manager-e2e; then
    local dir="$WORK/cert-manager-$CERT_MANAGER_VERSION"
    mkdir -p "$dir" && cd "$dir"
    cp "$HERE/../companions/cert-manager/main.go" .
    if [ ! -f go.mod ]; then
      go mod init rekindle-e2e/cert-manager >/dev/null 2>&1
      go mod edit -require="github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION"
    fi
    log "resolving and building cert-manager $CERT_MANAGER_VERSION (controller and cainjector)"
    go mod tidy >&2
    go build -trimpath -ldflags "-s -w" -o "$BIN/cert-manager-e2e.tmp" .
    mv "$BIN/cert-manager-e2e.tmp" "$BIN/cert-manager-e2e"
  fi
  if [ ! -f "$CRDS/cert-manager.io.yaml" ]; then
    local mod
    mod="$(module_dir "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")"
    for f in "$mod"/deploy/crds/*.yaml; do
      echo "---"; cat "$f"
    done >"$CRDS/cert-manager.io.yaml.tmp"
    mv "$CRDS/cert-manager.io.yaml.tmp" "$CRDS/cert-manager.io.yaml"
  fi
}

what="${1:-all}"
case "$what" in
  all) build_prometheus; build_rollouts; build_cert_manager ;;
  prometheus) build_prometheus ;;
  rollouts) build_rollouts ;;
  cert-manager) build_cert_manager ;;
  *) echo "usage: $0 [all|prometheus|rollouts|cert-manager]" >&2; exit 2 ;;
esac
echo "$BIN"
