#!/usr/bin/env bash
# A real node for rekindle's install tests: its own control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler), containerd + runc, a kubelet, kube-proxy and CoreDNS, all inside
# a network namespace this script creates (default `rekindle-node`). The namespace has loopback, the node's
# address on node0 (a bridge without ports) and the pods' CNI bridge; its default route points at node0,
# which leads nowhere: nothing leaves the namespace. Images are imported from local OCI archives, never pulled.
# State under target/e2e-node/. The kwok cluster of cluster.sh is separate and unaffected.
#
#   node.sh up                 start (idempotent), import the pause image and target/image/*.tar
#   node.sh down               stop every process it started (by pid), the pods' containers, and remove
#                              the state, the mounts and the network namespace
#   node.sh status             say what runs
#   node.sh exec -- CMD...     run CMD inside the node's network namespace with KUBECONFIG set to the
#                              admin's: where the apiserver, pods and Services can be reached
#                              (REKINDLE_KUBELET_ROOT names the kubelet's root directory, where CSI
#                              drivers register)
#   node.sh import FILE...     import OCI archives into the node's containerd
#   node.sh restart C [SECS]   SIGKILL etcd or kube-apiserver, wait SECS (3), start it again
#   node.sh keep-logs          after a failed run: copy the node's logs to target/e2e-node-failed-logs
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STATE="${REKINDLE_NODE_STATE:-$ROOT/target/e2e-node}"
NETNS="${REKINDLE_NODE_NETNS:-rekindle-node}"
NODE_NAME=rekindle-node
NODE_IP=10.200.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.0.0.0/24
PAUSE_IMAGE=rekindle.local/pause:e2e
PKI="$STATE/pki"
LOGS="$STATE/logs"
PIDS="$STATE/pids"
CTRD="$STATE/containerd"
SOCK="$CTRD/containerd.sock"
# Start order; stopped in reverse.
COMPONENTS="etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns"

log() { echo "[node] $*" >&2; }
die() { log "$*"; exit 1; }

in_netns() { nsenter --net="/run/netns/$NETNS" -- "$@"; }

running() { # component
  local f="$PIDS/$1.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

# Every component runs in the node's network namespace but in the machine's mount namespace (nsenter
# --net, not `ip netns exec`, which makes a mount namespace per call): the kubelet's volume mounts must be
# visible to containerd and runc.
start() { # name, then command...
  local name="$1"; shift
  nohup nsenter --net="/run/netns/$NETNS" -- "$@" >>"$LOGS/$name.log" 2>&1 &
  echo $! >"$PIDS/$name.pid"
}

wait_for() { # component, what, seconds, command...
  local comp="$1" what="$2" secs="$3"; shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ! running "$comp"; then
      log "$comp exited while waiting for $what; last lines of its log:"
      tail -n 30 "$LOGS/$comp.log" >&2 || true
      exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      log "timed out after ${secs}s waiting for $what; last lines of $comp.log:"
      tail -n 30 "$LOGS/$comp.log" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
}

kubectl_node() { in_netns "$BIN/kubectl" --kubeconfig "$STATE/kubeconfig" "$@"; }

preflight() {
  [ "$(id -u)" = 0 ] || die "the node needs root (network namespaces, containerd, kubelet)"
  "$ROOT/e2e/scripts/install-node-packages.sh"
  for b in containerd containerd-shim-runc-v2 ctr runc iptables conntrack ip nsenter; do
    command -v "$b" >/dev/null || die "'$b' is missing after installing the node's packages"
  done
  for b in kubelet kube-proxy coredns pause; do
    [ -x "$BIN/$b" ] || die "'$b' was not built into $BIN (e2e/scripts/build-binaries.sh node)"
  done
}

network_up() {
  if ! ip netns list | grep -qw "$NETNS"; then
    ip netns add "$NETNS" || die "cannot create the network namespace $NETNS"
  fi
  in_netns ip link set lo up
  if ! in_netns ip link show node0 >/dev/null 2>&1; then
    in_netns ip link add node0 type bridge || die "cannot create the bridge node0 (is the bridge module there?)"
    in_netns ip addr add "$NODE_IP/24" dev node0
    in_netns ip link set node0 up
  fi
  # The kubelet and kube-proxy want a default route to find the node's interface; this one ends at
  # node0, a bridge with no ports, so nothing leaves the namespace.
  in_netns ip route replace default dev node0
  in_netns sysctl -qw net.ipv4.ip_forward=1
}

write_configs() {
  mkdir -p "$STATE/cni" "$STATE/kubelet" "$CTRD"
  cat >"$STATE/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:rekindle"]
  verbs: ["create", "update", "patch", "delete"]
- level: None
YAML
  cat >"$STATE/cni/10-bridge.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "rekindle-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "hairpinMode": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$STATE/cni-ipam"}},
    {"type": "loopback"}
  ]
}
JSON
  cat >"$CTRD/config.toml" <<TOML
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  # No image is ever pulled: the sandbox image is imported from a local archive.
  sandbox_image = "$PAUSE_IMAGE"
  # A negative oom_score_adj cannot be written without CAP_SYS_RESOURCE; runc then fails every sandbox.
  restrict_oom_score_adj = true
  # Pod network namespaces under the state directory, so that node.sh down finds and removes each one.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni"
TOML
  echo "nameserver $NODE_IP" >"$STATE/resolv.conf"
  cat >"$STATE/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
# Imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $STATE/resolv.conf
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
serializeImagePulls: false
# A pod's periodic sync is when the kubelet republishes CSI volumes whose driver asks for it (the Secrets
# Store CSI driver's rotation): every 10 s instead of every minute, so a rotation reaches its pods soon.
syncFrequency: 10s
YAML
  cat >"$STATE/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
clientConnection:
  kubeconfig: $STATE/kubeconfig
# Pod-to-Service traffic on one bridge needs br_netfilter unless every Service packet is masqueraded.
iptables:
  masqueradeAll: true
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
YAML
  cat >"$STATE/Corefile" <<COREFILE
.:53 {
    bind $NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/kubeconfig node
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    ready 127.0.0.1:8181
    cache 5
}
COREFILE
}

pause_image() {
  local tar="$STATE/images/pause.tar"
  [ -f "$tar" ] && return 0
  mkdir -p "$STATE/images"
  python3 "$ROOT/e2e/scripts/oci-image.py" --name "$PAUSE_IMAGE" --out "$tar" \
    --file "$BIN/pause:/pause:0755" --entrypoint '["/pause"]' --user 65535:65535 >/dev/null
}

import_images() { # archives...
  local f
  for f in "$@"; do
    [ -f "$f" ] || die "no image archive $f"
    ctr --address "$SOCK" -n k8s.io images import --all-platforms "$f" >&2 || die "importing $f into containerd failed"
    log "imported $f"
  done
}

start_etcd() {
  start etcd "$BIN/etcd" --name node --data-dir "$STATE/etcd-data" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster node=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn
  wait_for etcd etcd 30 in_netns curl -sf http://127.0.0.1:2379/health
}

# Pods reach the apiserver through the `kubernetes` Service (10.0.0.1, in the serving certificate),
# whose endpoint is the node's address; processes in the namespace use 127.0.0.1. The audit log records
# every write made by a ServiceAccount of the namespace `rekindle` (with the client's user agent and
# address), the ledger the chaos soak checks.
start_apiserver() {
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
    --bind-address 0.0.0.0 --advertise-address "$NODE_IP" --secure-port 6443 \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/admin.crt" --kubelet-client-key "$PKI/admin.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --authorization-mode Node,RBAC --allow-privileged=true \
    --audit-policy-file "$STATE/audit-policy.yaml" --audit-log-path "$LOGS/audit.log" \
    --audit-log-maxsize 200 --audit-log-maxbackup 1
  wait_for kube-apiserver "kube-apiserver /readyz" 90 in_netns curl -sf --cacert "$PKI/ca.crt" https://127.0.0.1:6443/readyz
}

# Kills a control-plane component (SIGKILL, as a crash), waits SECONDS, starts it again and waits until
# it serves. etcd keeps its data.
restart() { # etcd|kube-apiserver, seconds
  local c="$1" down="${2:-3}"
  case "$c" in etcd|kube-apiserver) ;; *) die "restart: etcd or kube-apiserver, not '$c'" ;; esac
  [ -f "$STATE/env" ] || die "the node is not up (just node-up)"
  # shellcheck disable=SC1091
  source "$STATE/env"
  running "$c" && kill -9 "$(cat "$PIDS/$c.pid")"
  log "$c killed"
  sleep "$down"
  if [ "$c" = etcd ]; then start_etcd; else start_apiserver; fi
  log "$c started again"
}

up() {
  if running kubelet && running kube-apiserver && kubectl_node get --raw /readyz >/dev/null 2>&1; then
    log "node already running"
    shopt -s nullglob
    local images=("$ROOT"/target/image/*.tar)
    [ "${#images[@]}" = 0 ] || import_images "${images[@]}"
    return 0
  fi
  [ -d "$PIDS" ] && down_processes
  preflight
  local t0=$SECONDS
  mkdir -p "$PKI" "$LOGS" "$PIDS"
  network_up
  write_configs
  (cd "$ROOT" && cargo build -q -p certs-gen)
  "$ROOT/target/debug/certs-gen" local --out "$PKI" >/dev/null

  rm -rf "$STATE/etcd-data"
  start_etcd
  cat >"$STATE/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: $PKI/ca.crt
users:
- name: node-admin
  user:
    client-certificate: $PKI/admin.crt
    client-key: $PKI/admin.key
contexts:
- name: node
  context: {cluster: node, user: node-admin}
current-context: node
KC
  start_apiserver

  local kc="$STATE/kubeconfig"
  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$kc" \
    --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port 0 --root-ca-file "$PKI/ca.crt" \
    --service-account-private-key-file "$PKI/sa.key" --use-service-account-credentials=false \
    --controllers '*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle' \
    --kube-api-qps 100 --kube-api-burst 200
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$kc" \
    --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port 0

  start containerd containerd --config "$CTRD/config.toml"
  wait_for containerd "containerd's socket" 30 ctr --address "$SOCK" version
  pause_image
  import_images "$STATE/images/pause.tar"
  shopt -s nullglob
  local images=("$ROOT"/target/image/*.tar)
  shopt -u nullglob
  [ "${#images[@]}" = 0 ] || import_images "${images[@]}"

  start kubelet "$BIN/kubelet" --config "$STATE/kubelet/config.yaml" --kubeconfig "$kc" \
    --node-ip "$NODE_IP" --hostname-override "$NODE_NAME" --root-dir "$STATE/kubelet/root" \
    --cert-dir "$STATE/kubelet/pki" --node-labels type=real
  wait_for kubelet "the node $NODE_NAME to be Ready" 120 bash -c \
    "nsenter --net=/run/netns/$NETNS -- '$BIN/kubectl' --kubeconfig '$kc' get node $NODE_NAME -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
  start kube-proxy "$BIN/kube-proxy" --config "$STATE/kube-proxy.yaml"
  start coredns "$BIN/coredns" -conf "$STATE/Corefile"
  wait_for kube-proxy "kube-proxy's /healthz" 60 in_netns curl -sf http://127.0.0.1:10256/healthz
  wait_for coredns "CoreDNS to sync with the apiserver" 60 in_netns curl -sf http://127.0.0.1:8181/ready
  wait_for kube-controller-manager "the default ServiceAccount" 60 \
    in_netns "$BIN/kubectl" --kubeconfig "$kc" -n default get serviceaccount default
  {
    echo "KUBECONFIG=$kc"
    echo "NETNS=$NETNS"
    echo "NODE_IP=$NODE_IP"
    echo "BIN=$BIN"
  } >"$STATE/env"
  log "node up in $((SECONDS - t0))s; run commands in it with: e2e/scripts/node.sh exec -- CMD"
}

status() {
  local any=0 c
  for c in $COMPONENTS; do
    if running "$c"; then echo "$c: running (pid $(cat "$PIDS/$c.pid"))"; any=1; else echo "$c: not running"; fi
  done
  [ "$any" = 1 ]
}

# The pods' processes outlive the kubelet and containerd: the containers (in the kubelet's kubepods
# cgroups) and the shims that watch them (found by the containerd socket on their command line).
kill_pods() {
  local pids=() p f
  for f in $(find /sys/fs/cgroup/pids/kubepods* /sys/fs/cgroup/memory/kubepods* -name cgroup.procs 2>/dev/null); do
    while read -r p; do [ -n "$p" ] && pids+=("$p"); done <"$f"
  done
  for f in /proc/[0-9]*/cmdline; do
    if tr '\0' ' ' <"$f" 2>/dev/null | grep -q -- "containerd-shim.* -address $SOCK"; then
      p="${f#/proc/}"; pids+=("${p%/cmdline}")
    fi
  done
  [ "${#pids[@]}" = 0 ] && return 0
  kill -9 "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 50); do
    local alive=0
    for p in "${pids[@]}"; do [ -e "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
}

down_processes() {
  local c
  for c in $(echo "$COMPONENTS" | tr ' ' '\n' | tac); do
    running "$c" && kill "$(cat "$PIDS/$c.pid")" 2>/dev/null || true
  done
  for c in $COMPONENTS; do
    local f="$PIDS/$c.pid"
    [ -f "$f" ] || continue
    local pid; pid="$(cat "$f")"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  kill_pods
  # Volume, rootfs and shm mounts of the pods, deepest first.
  { findmnt -rn -o TARGET | grep -F "$STATE/" || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  # The kubelet's cgroups (cgroupfs driver), emptied by the kills above.
  find /sys/fs/cgroup -depth -type d -name 'kubepods*' 2>/dev/null | while read -r d; do
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

down() {
  if [ -d "$STATE" ]; then down_processes; fi
  ip netns list 2>/dev/null | grep -qw "$NETNS" && ip netns delete "$NETNS" 2>/dev/null || true
  rm -rf "$STATE"
  log "node down"
}

keep_logs() {
  status || true
  local out="$ROOT/target/e2e-node-failed-logs" c
  rm -rf "$out" && cp -r "$LOGS" "$out" 2>/dev/null && log "node logs kept in $out"
  for c in $COMPONENTS; do
    [ -f "$out/$c.log" ] && { echo "--- last lines of $c.log"; tail -n 5 "$out/$c.log" | cut -c1-300; }
  done >&2
  return 0
}

cmd="${1:-status}"
case "$cmd" in
  up) BIN="$("$ROOT/e2e/scripts/build-binaries.sh" node-all | tail -n 1)"; up ;;
  down) down ;;
  status) status ;;
  exec)
    shift
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || { echo "usage: $0 exec -- CMD..." >&2; exit 2; }
    [ -f "$STATE/env" ] || die "the node is not up (just node-up)"
    # shellcheck disable=SC1091
    source "$STATE/env"
    exec nsenter --net="/run/netns/$NETNS" -- env KUBECONFIG="$KUBECONFIG" PATH="$BIN:$PATH" \
      REKINDLE_KUBELET_ROOT="$STATE/kubelet/root" "$@"
    ;;
  import) shift; import_images "$@" ;;
  restart) shift; restart "$@" ;;
  keep-logs) keep_logs ;;
  *) echo "usage: $0 up|down|status|exec -- CMD...|import FILE...|restart etcd|kube-apiserver [SECS]|keep-logs" >&2; exit 2 ;;
esac
