#!/usr/bin/env bash
# Builds the components users run beside rekindle, from their Go modules, cached by version outside the
# repository (a binary already in the cache is never rebuilt): Prometheus and promtool, the Argo Rollouts
# controller, cert-manager, the Secrets Store CSI driver. Also fetches the CRDs the tests install from the
# same modules.
#
# Usage: build-companions.sh [all|prometheus|rollouts|cert-manager|csi|csi-crds|openshift-crds|reloader]. Prints
# the bin directory on the last line (csi and csi-crds: the CSI driver's own directory, whose crds/
# csi-crds fills without building anything; openshift-crds: the directory of the DeploymentConfig CRD
# generated from github.com/openshift/api; reloader: the path of the Reloader binary, which only the
# S10 benchmark runs, never `all`). Environment: RELOADER_VERSION (v1.4.21), RELOADER_SRC (a git clone of
# github.com/stakater/Reloader, used when the module proxy does not serve that version), PROMETHEUS_VERSION (v0.316.0), ROLLOUTS_VERSION
# (v1.10.1), PROM_OPERATOR_VERSION (v0.85.0), CERT_MANAGER_VERSION (v1.21.2), CSI_DRIVER_VERSION
# (v1.6.0), OPENSHIFT_API_VERSION (a pseudo-version, below), REKINDLE_E2E_CACHE (~/.cache/rekindle-e2e).
set -euo pipefail

PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
ROLLOUTS_VERSION="${ROLLOUTS_VERSION:-v1.10.1}"
PROM_OPERATOR_VERSION="${PROM_OPERATOR_VERSION:-v0.85.0}"
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.21.2}"
CSI_DRIVER_VERSION="${CSI_DRIVER_VERSION:-v1.6.0}"
# github.com/openshift/api has no semver tags: a commit of its master branch (2025-10-15).
OPENSHIFT_API_VERSION="${OPENSHIFT_API_VERSION:-v0.0.0-20251015095338-264e80a2b6e7}"
RELOADER_VERSION="${RELOADER_VERSION:-v1.4.21}"
# The one openshift/api version served that Reloader's openshift/client-go accepts (the one Reloader pins is
# not served).
RELOADER_OPENSHIFT_API="${RELOADER_OPENSHIFT_API:-v0.0.0-20260326111139-30c2ef7a272e}"
# The kubelet's plugin-registration API, at the Kubernetes libraries' version the driver pins.
KUBELET_API_VERSION="${KUBELET_API_VERSION:-v0.30.1}"
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${REKINDLE_E2E_CACHE:-$HOME/.cache/rekindle-e2e}"
BIN="$CACHE/companions/bin-prometheus-$PROMETHEUS_VERSION-rollouts-$ROLLOUTS_VERSION-cert-manager-$CERT_MANAGER_VERSION"
CRDS="$BIN/crds"
WORK="$CACHE/build"
mkdir -p "$BIN" "$CRDS" "$WORK"
. "$(dirname "$0")/go-env.sh"

log() { echo "[build-companions] $(date +%T) $*" >&2; }
have() { [ -x "$BIN/$1" ]; }

# The directory of a module version in the module cache (downloaded if needed).
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p'; }

build_prometheus() {
  if ! have prometheus || ! have promtool; then
    log "building prometheus and promtool $PROMETHEUS_VERSION"
    # Only the service discovery the tests configure (kubernetes_sd_configs; file and http are always
    # in): the cloud providers' SDKs are most of a full build's compile time.
    GOBIN="$BIN" go install -trimpath -ldflags "-s -w" -tags remove_all_sd,enable_kubernetes_sd \
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

# The Secrets Store CSI driver, unchanged from its module; its main package imports monis.app/mlog, which
# is not served, so e2e/companions/secrets-store-csi/mlog stands in for it. Beside it, our registrar and
# test provider (e2e/companions/secrets-store-csi), rebuilt whenever their source changes. Its CRDs and
# CSIDriver object come from the driver's own chart in the same module (the CSIDriver rendered with
# secret rotation on, as its chart does for `enableSecretRotation=true`).
CSI_BIN="$CACHE/companions/bin-secrets-store-csi-$CSI_DRIVER_VERSION"
csi_crds() {
  mkdir -p "$CSI_BIN/crds"
  [ -f "$CSI_BIN/crds/secrets-store.csi.x-k8s.io.yaml" ] && [ -f "$CSI_BIN/crds/csidriver.yaml" ] && return 0
  local mod chart helm_bin
  mod="$(module_dir "sigs.k8s.io/secrets-store-csi-driver@$CSI_DRIVER_VERSION")"
  chart="$mod/charts/secrets-store-csi-driver"
  for f in "$chart"/crds/*.yaml; do echo "---"; cat "$f"; done >"$CSI_BIN/crds/secrets-store.csi.x-k8s.io.yaml.tmp"
  mv "$CSI_BIN/crds/secrets-store.csi.x-k8s.io.yaml.tmp" "$CSI_BIN/crds/secrets-store.csi.x-k8s.io.yaml"
  helm_bin="$("$HERE/build-binaries.sh" helm | tail -n 1)/helm"
  "$helm_bin" template secrets-store "$chart" --set enableSecretRotation=true \
    --show-only templates/csidriver.yaml >"$CSI_BIN/crds/csidriver.yaml.tmp"
  mv "$CSI_BIN/crds/csidriver.yaml.tmp" "$CSI_BIN/crds/csidriver.yaml"
}

build_csi() {
  local src="$HERE/../companions/secrets-store-csi" dir="$WORK/secrets-store-csi-$CSI_DRIVER_VERSION"
  mkdir -p "$CSI_BIN" "$dir" && cd "$dir"
  if ! [ -x "$CSI_BIN/secrets-store-csi-driver" ] || ! [ -x "$CSI_BIN/secrets-store-csi-e2e" ] \
    || ! cmp -s "$src/main.go" main.go || ! cmp -s "$src/mlog/mlog.go" mlog/mlog.go; then
    rm -rf mlog && cp -r "$src/mlog" mlog && cp "$src/main.go" "$src/tools.go" .
    if [ ! -f go.mod ]; then
      go mod init rekindle-e2e/secrets-store-csi >/dev/null 2>&1
      go mod edit -require="sigs.k8s.io/secrets-store-csi-driver@$CSI_DRIVER_VERSION" \
        -require="k8s.io/kubelet@$KUBELET_API_VERSION" -replace=monis.app/mlog=./mlog
    fi
    log "resolving and building the Secrets Store CSI driver $CSI_DRIVER_VERSION, its registrar and the test provider"
    go mod tidy >&2
    go build -trimpath -ldflags "-s -w" -o "$CSI_BIN/secrets-store-csi-driver.tmp" sigs.k8s.io/secrets-store-csi-driver/cmd/secrets-store-csi-driver
    go build -trimpath -ldflags "-s -w" -o "$CSI_BIN/secrets-store-csi-e2e.tmp" .
    mv "$CSI_BIN/secrets-store-csi-driver.tmp" "$CSI_BIN/secrets-store-csi-driver"
    mv "$CSI_BIN/secrets-store-csi-e2e.tmp" "$CSI_BIN/secrets-store-csi-e2e"
  fi
  csi_crds
}

# OpenShift's DeploymentConfig cannot be served for real here (openshift-apiserver is not served): its CRD
# is generated from the type's OpenAPI definitions in github.com/openshift/api (deploymentconfig-crd.py).
OPENSHIFT_CRDS="$CACHE/companions/crds-openshift-api-$OPENSHIFT_API_VERSION"
openshift_crds() {
  mkdir -p "$OPENSHIFT_CRDS"
  local out="$OPENSHIFT_CRDS/deploymentconfig.yaml" mod
  if [ ! -f "$out" ] || [ "$HERE/deploymentconfig-crd.py" -nt "$out" ]; then
    mod="$(module_dir "github.com/openshift/api@$OPENSHIFT_API_VERSION")"
    python3 "$HERE/deploymentconfig-crd.py" "$mod/openapi/openapi.json" >"$out.tmp"
    mv "$out.tmp" "$out"
  fi
}

# Stakater Reloader at a released tag, for the side-by-side benchmark (S10): from the module proxy when it
# serves that version, else from the tag in RELOADER_SRC. One replace: the openshift/api pseudo-version
# it pins is not served.
RELOADER_BIN="$CACHE/companions/bin-reloader-$RELOADER_VERSION"
build_reloader() {
  local dir="$WORK/reloader-$RELOADER_VERSION" mod
  if [ -x "$RELOADER_BIN/reloader" ]; then echo "$RELOADER_BIN/reloader"; return 0; fi
  mkdir -p "$RELOADER_BIN"
  if [ ! -f "$dir/go.mod" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    if mod="$(module_dir "github.com/stakater/Reloader@$RELOADER_VERSION" 2>/dev/null)" && [ -n "$mod" ]; then
      cp -r "$mod"/. "$dir" && chmod -R u+w "$dir"
    elif [ -n "${RELOADER_SRC:-}" ]; then
      git -C "$RELOADER_SRC" archive "$RELOADER_VERSION" | tar -x -C "$dir"
    else
      rm -rf "$dir"
      log "the module proxy does not serve github.com/stakater/Reloader@$RELOADER_VERSION: set RELOADER_SRC to a git clone of it"
      exit 1
    fi
    (cd "$dir" && go mod edit -replace="github.com/openshift/api=github.com/openshift/api@$RELOADER_OPENSHIFT_API")
  fi
  log "building Stakater Reloader $RELOADER_VERSION"
  (cd "$dir" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w" -o "$RELOADER_BIN/reloader.tmp" .)
  mv "$RELOADER_BIN/reloader.tmp" "$RELOADER_BIN/reloader"
  echo "$RELOADER_BIN/reloader"
}

what="${1:-all}"
case "$what" in
  all) build_prometheus; build_rollouts; build_cert_manager; build_csi; openshift_crds ;;
  prometheus) build_prometheus ;;
  rollouts) build_rollouts ;;
  cert-manager) build_cert_manager ;;
  csi) build_csi; echo "$CSI_BIN"; exit 0 ;;
  csi-crds) csi_crds; echo "$CSI_BIN"; exit 0 ;;
  openshift-crds) openshift_crds; echo "$OPENSHIFT_CRDS"; exit 0 ;;
  reloader) build_reloader; exit 0 ;;
  *) echo "usage: $0 [all|prometheus|rollouts|cert-manager|csi|csi-crds|openshift-crds|reloader]" >&2; exit 2 ;;
esac
echo "$BIN"
