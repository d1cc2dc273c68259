#!/usr/bin/env bash
# Builds the control-plane binaries the e2e harness runs (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, etcdctl, kwok, helm) from their Go modules and caches them by version
# outside the repository. A binary already in the cache is never rebuilt.
#
# `node` adds what the real node runs (kubelet, kube-proxy, CoreDNS, the sandbox's pause binary); `node-all`
# is both.
#
# Environment: K8S_VERSION (v1.35.4), ETCD_VERSION (v3.6.16), KWOK_VERSION (v0.7.0), HELM_VERSION (v3.21.4),
# COREDNS_VERSION (v1.14.7),
# REKINDLE_E2E_CACHE (~/.cache/rekindle-e2e). Prints the bin directory on the last line of stdout.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.21.4}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"
CACHE="${REKINDLE_E2E_CACHE:-$HOME/.cache/rekindle-e2e}"
BIN="$CACHE/bin-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
WORK="$CACHE/build"
mkdir -p "$BIN" "$WORK"
. "$(dirname "$0")/go-env.sh"

log() { echo "[build-binaries] $(date +%T) $*" >&2; }

have() { [ -x "$BIN/$1" ]; }

# build_kubernetes [BINARY...]: the control plane by default; `node` asks for kubelet and kube-proxy.
build_kubernetes() {
  local wanted=("$@") need=0
  [ "${#wanted[@]}" = 0 ] && wanted=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  for b in "${wanted[@]}"; do have "$b" || need=1; done
  [ "$need" = 0 ] && return 0
  local dir="$WORK/k8s-$K8S_VERSION" staging="v0.${K8S_VERSION#v1.}"
  mkdir -p "$dir" && cd "$dir"
  if [ ! -f go.mod ] || ! grep -q kube-proxy tools.go 2>/dev/null; then
    rm -f go.mod go.sum
    go mod init rekindle-e2e/k8s >/dev/null 2>&1
  fi
  log "resolving k8s.io/kubernetes@$K8S_VERSION (staging modules at $staging)"
  local gomod
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  # Every staging module is required at v0.0.0 with a ./staging replace; point each at its published tag.
  grep -E '=> \./staging/' "$gomod" | awk '{print $1}' | sort -u | while read -r m; do
    go mod edit -replace="$m=$m@$staging"
  done
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
  go mod tidy -e >&2 || true
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld="$ld -X $pkg.gitTreeState=clean -X $pkg.gitCommit=0000000000000000000000000000000000000000 -X $pkg.buildDate=$date"
  done
  for b in "${wanted[@]}"; do
    have "$b" && continue
    log "building $b $K8S_VERSION"
    go build -trimpath -ldflags "$ld" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$BIN/$b.tmp" "$BIN/$b"
  done
}

build_etcd() {
  have etcd && have etcdctl && return 0
  local dir="$WORK/etcd-$ETCD_VERSION"
  mkdir -p "$dir" && cd "$dir"
  [ -f go.mod ] || go mod init rekindle-e2e/etcd >/dev/null 2>&1
  log "building etcd $ETCD_VERSION"
  go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
  go get -tool "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION" >&2
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$BIN/etcd.tmp" "$BIN/etcd"
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcdctl.tmp" go.etcd.io/etcd/etcdctl/v3 && mv "$BIN/etcdctl.tmp" "$BIN/etcdctl"
}

build_kwok() {
  have kwok && return 0
  local dir="$WORK/kwok-$KWOK_VERSION"
  mkdir -p "$dir" && cd "$dir"
  [ -f go.mod ] || go mod init rekindle-e2e/kwok >/dev/null 2>&1
  log "building kwok $KWOK_VERSION"
  go get -tool "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$BIN/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "$BIN/kwok.tmp" "$BIN/kwok"
}

# helm as its release build makes it: besides the version, the Kubernetes version its client library is
# built against (from k8s.io/client-go v0.N.x, as helm's Makefile derives it) becomes the default
# `.Capabilities.KubeVersion` of `helm template` and `helm lint`; without it helm says v1.20 and a chart's
# kubeVersion constraint fails offline. The marker file tells a helm built this way from an older build.
build_helm() {
  have helm && [ -f "$BIN/helm.release-ldflags" ] && return 0
  local dir="$WORK/helm-$HELM_VERSION"
  mkdir -p "$dir" && cd "$dir"
  [ -f go.mod ] || go mod init rekindle-e2e/helm >/dev/null 2>&1
  log "building helm $HELM_VERSION"
  go get -tool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  local client_go minor pkg=helm.sh/helm/v3
  client_go="$(go list -m -f '{{.Version}}' k8s.io/client-go)"   # v0.N.x: Kubernetes 1.N
  minor="$(echo "$client_go" | cut -d. -f2)"
  go build -trimpath -ldflags "-s -w -X $pkg/internal/version.version=$HELM_VERSION \
      -X $pkg/internal/version.metadata= -X $pkg/internal/version.gitTreeState=clean \
      -X $pkg/pkg/lint/rules.k8sVersionMajor=1 -X $pkg/pkg/lint/rules.k8sVersionMinor=$minor \
      -X $pkg/pkg/chartutil.k8sVersionMajor=1 -X $pkg/pkg/chartutil.k8sVersionMinor=$minor" \
    -o "$BIN/helm.tmp" $pkg/cmd/helm
  mv "$BIN/helm.tmp" "$BIN/helm"
  echo "k8s.io/client-go $client_go" >"$BIN/helm.release-ldflags"
}

# CoreDNS from e2e/node/coredns, a main with only the plugins the node's Corefile uses; rebuilt when
# that source differs from the copy kept beside the binary.
build_coredns() {
  local src="$HERE/../node/coredns/main.go"
  have coredns && cmp -s "$src" "$BIN/coredns.go" && return 0
  local dir="$WORK/coredns-main-$COREDNS_VERSION"
  mkdir -p "$dir" && cd "$dir"
  cp "$src" main.go
  if [ ! -f go.mod ]; then
    go mod init rekindle-e2e/coredns >/dev/null 2>&1
    go mod edit -require="github.com/coredns/coredns@$COREDNS_VERSION"
  fi
  log "building coredns $COREDNS_VERSION (the node's plugins)"
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o "$BIN/coredns.tmp" .
  mv "$BIN/coredns.tmp" "$BIN/coredns"
  cp "$src" "$BIN/coredns.go"
}

# The pod sandbox's process (e2e/node/pause): the node imports it as its sandbox image. Rebuilt when its
# source differs from the copy kept beside the binary.
build_pause() {
  have pause && cmp -s "$HERE/../node/pause/main.go" "$BIN/pause.go" && return 0
  log "building pause"
  (cd "$HERE/../node/pause" && go build -trimpath -ldflags "-s -w" -o "$BIN/pause.tmp" .)
  mv "$BIN/pause.tmp" "$BIN/pause"
  cp "$HERE/../node/pause/main.go" "$BIN/pause.go"
}

build_node() { build_kubernetes kubelet kube-proxy; build_coredns; build_pause; }

what="${1:-all}"
case "$what" in
  all) build_etcd; build_kubernetes; build_kwok; build_helm ;;
  node) build_node ;;
  node-all) build_etcd; build_kubernetes; build_kwok; build_helm; build_node ;;
  kubernetes|etcd|kwok|helm|coredns) "build_$what" ;;
  *) echo "usage: $0 [all|node|node-all|kubernetes|etcd|kwok|helm|coredns]" >&2; exit 2 ;;
esac
echo "$BIN"
