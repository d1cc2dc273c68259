#!/usr/bin/env bash
# A real control plane on 127.0.0.1 for rekindle's tests and demo: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (one fake Node). State under target/e2e/.
#
#   cluster.sh up       start (idempotent: reports a running cluster)
#   cluster.sh down     stop every process it started (by pid) and remove the state
#   cluster.sh status   say what runs
#   cluster.sh kill C     SIGKILL one component (etcd, kube-apiserver, ...), for fault tests
#   cluster.sh start C    start a killed component again with its original command line
#   cluster.sh compact    compact etcd's history to its current revision (watches from before get 410 Gone)
#   cluster.sh keep-logs  after a failed test run: say what runs and copy the logs out of the state
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STATE="${REKINDLE_E2E_STATE:-$ROOT/target/e2e}"
PKI="$STATE/pki"
LOGS="$STATE/logs"
PIDS="$STATE/pids"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
COMPONENTS="etcd kube-apiserver kube-controller-manager kube-scheduler kwok"

log() { echo "[cluster] $*" >&2; }

running() { # component
  local f="$PIDS/$1.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

start() { # name, then command...
  local name="$1"; shift
  mkdir -p "$STATE/cmds"
  printf '%q ' "$@" >"$STATE/cmds/$name"
  nohup "$@" >>"$LOGS/$name.log" 2>&1 &
  echo $! >"$PIDS/$name.pid"
}

kill_component() { # name
  local f="$PIDS/$1.pid"
  [ -f "$f" ] || { log "$1 is not running"; return 1; }
  local pid; pid="$(cat "$f")"
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  log "$1 killed"
}

restart_component() { # name
  local name="$1" f="$STATE/cmds/$1"
  [ -f "$f" ] || { log "no saved command for $name"; return 1; }
  running "$name" && { log "$name is already running"; return 0; }
  # shellcheck disable=SC1090
  eval "start $name $(cat "$f")"
  # shellcheck disable=SC1091
  source "$STATE/env"
  case "$name" in
    etcd) wait_for etcd 30 curl -sf "$ETCD/health" ;;
    kube-apiserver) wait_for "kube-apiserver /readyz" 90 curl -sf --cacert "$PKI/ca.crt" "$APISERVER/readyz" ;;
  esac
  log "$name started again"
  case "$name" in etcd|kube-apiserver) refresh_controllers ;; esac
}

# After an outage of etcd or the apiserver, client-go's informers in the controller-manager, scheduler
# and kwok retry with an exponential backoff that only resets after two quiet minutes: a few outages in a
# row leave them up to a minute behind, and the next test waits for ReplicaSets that do not come. The
# outage tests are about rekindle, so the cluster's own controllers start afresh, and this returns once a
# Deployment rolls out again.
refresh_controllers() {
  local c
  for c in kube-controller-manager kube-scheduler kwok; do
    running "$c" && kill_component "$c" >/dev/null 2>&1
    eval "start $c $(cat "$STATE/cmds/$c")"
  done
  local k=("$BIN/kubectl" --kubeconfig "$STATE/kubeconfig" -n default)
  "${k[@]}" delete deployment e2e-canary --ignore-not-found --wait=true >/dev/null 2>&1 || true
  "${k[@]}" create deployment e2e-canary --image=registry.invalid/canary >/dev/null
  wait_for "the controller-manager to roll a Deployment again" 90 \
    bash -c "[ -n \"\$(${k[*]} get replicasets -l app=e2e-canary -o name)\" ]"
  "${k[@]}" delete deployment e2e-canary --ignore-not-found >/dev/null 2>&1 || true
  log "controller-manager, scheduler and kwok restarted and rolling"
}

compact() {
  # shellcheck disable=SC1091
  source "$STATE/env"
  local rev
  rev="$("$BIN/etcdctl" --endpoints "$ETCD" endpoint status -w json | sed -n 's/.*"revision":\([0-9]*\).*/\1/p')"
  "$BIN/etcdctl" --endpoints "$ETCD" compact "$rev" >/dev/null
  log "etcd compacted to revision $rev"
}

wait_for() { # what, seconds, command...
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      log "timed out after ${secs}s waiting for $what; last log lines:"
      tail -n 20 "$LOGS"/*.log >&2 || true
      return 1
    fi
    sleep 0.5
  done
}

status() {
  local any=0
  for c in $COMPONENTS; do
    if running "$c"; then echo "$c: running (pid $(cat "$PIDS/$c.pid"))"; any=1; else echo "$c: not running"; fi
  done
  if [ -f "$STATE/env" ]; then cat "$STATE/env"; fi
  [ "$any" = 1 ]
}

up() {
  if running kube-apiserver && [ -f "$STATE/kubeconfig" ] && "$BIN/kubectl" --kubeconfig "$STATE/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
    log "cluster already running"
    status
    return 0
  fi
  [ -d "$PIDS" ] && down_processes
  local t0=$SECONDS
  mkdir -p "$PKI" "$LOGS" "$PIDS"
  (cd "$ROOT" && cargo build -q -p certs-gen)
  "$ROOT/target/debug/certs-gen" local --out "$PKI"

  local etcd_port etcd_peer api_port
  etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port)
  rm -rf "$STATE/etcd-data"
  start etcd "$BIN/etcd" --name e2e --data-dir "$STATE/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "e2e=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync --log-level warn
  wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"

  # The audit log records who wrote each workload (user, agent, verb, response code), what a patch
  # asked for, and every pod eviction (the pod-restart tests count them): what a failed test's logs (keep-logs) need to tell rekindle's writes from the
  # controllers' and one of rekindle's writes from another.
  cat >"$STATE/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Request
  verbs: ["patch"]
  resources:
  - group: apps
    resources: ["deployments", "statefulsets", "daemonsets"]
  - group: batch
    resources: ["jobs", "cronjobs"]
- level: Metadata
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - group: apps
    resources: ["deployments", "statefulsets", "daemonsets"]
  - group: batch
    resources: ["jobs", "cronjobs"]
- level: Metadata
  verbs: ["create"]
  resources:
  - group: ""
    resources: ["pods/eviction"]
- level: None
YAML
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --endpoint-reconciler-type none \
    --audit-policy-file "$STATE/audit-policy.yaml" --audit-log-path "$LOGS/audit.log" \
    --audit-log-maxsize 100 --audit-log-maxbackup 1 \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --authorization-mode RBAC --allow-privileged=true \
    --enable-priority-and-fairness=true
  cat >"$STATE/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $PKI/ca.crt
users:
- name: e2e-admin
  user:
    client-certificate: $PKI/admin.crt
    client-key: $PKI/admin.key
contexts:
- name: e2e
  context: {cluster: e2e, user: e2e-admin}
current-context: e2e
KC
  wait_for "kube-apiserver /readyz" 90 curl -sf --cacert "$PKI/ca.crt" "https://127.0.0.1:$api_port/readyz"

  local kc="$STATE/kubeconfig"
  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$kc" \
    --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port 0 --root-ca-file "$PKI/ca.crt" \
    --service-account-private-key-file "$PKI/sa.key" --use-service-account-credentials=false \
    --controllers '*,-nodeipam,-nodelifecycle,-service-lb-controller,-cloud-node-lifecycle' \
    --kube-api-qps 500 --kube-api-burst 1000
  # The default client rate limits (20 and 50 QPS) make ReplicaSets lag far behind a test that rolls
  # dozens of Deployments at once.
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$kc" \
    --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port 0 --kube-api-qps 500 --kube-api-burst 1000

  local stages
  stages="$(cd "$ROOT" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')/kustomize/stage"
  : >"$STATE/kwok-stages.yaml"
  for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    { echo "---"; cat "$stages/$f"; } >>"$STATE/kwok-stages.yaml"
  done
  start kwok "$BIN/kwok" --kubeconfig "$kc" --config "$STATE/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip 127.0.0.1 --node-lease-duration-seconds 40 --server-address 127.0.0.1:0

  "$BIN/kubectl" --kubeconfig "$kc" apply -f - >/dev/null <<'NODE'
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: kwok-node-0
    type: kwok
spec: {}
status:
  allocatable: {cpu: "1000", memory: 4000Gi, pods: "50000"}
  capacity: {cpu: "1000", memory: 4000Gi, pods: "50000"}
NODE
  wait_for "the kwok node to be Ready" 60 bash -c "'$BIN/kubectl' --kubeconfig '$kc' get node kwok-node-0 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
  # The node lifecycle controller is off (no real kubelets), so nothing would lift the taint the apiserver
  # puts on a new Node.
  "$BIN/kubectl" --kubeconfig "$kc" taint node kwok-node-0 node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  wait_for "the default ServiceAccount" 60 "$BIN/kubectl" --kubeconfig "$kc" -n default get serviceaccount default
  # rekindle's own identity (its requests must not look like the admin's: the webhook lets its own
  # writes through unchanged).
  "$ROOT/target/debug/certs-gen" client --out "$PKI" --name rekindle --cn rekindle --org system:masters
  sed -e "s#$PKI/admin.crt#$PKI/rekindle.crt#" -e "s#$PKI/admin.key#$PKI/rekindle.key#" -e 's/e2e-admin/rekindle/g' "$kc" >"$STATE/rekindle.kubeconfig"
  {
    echo "KUBECONFIG=$kc"
    echo "REKINDLE_KUBECONFIG=$STATE/rekindle.kubeconfig"
    echo "APISERVER=https://127.0.0.1:$api_port"
    echo "ETCD=http://127.0.0.1:$etcd_port"
    echo "BIN=$BIN"
  } >"$STATE/env"
  log "cluster up in $((SECONDS - t0))s; kubeconfig: $kc"
}

down_processes() {
  # Anything else started under this state (the demo's rekindle) goes first.
  for f in "$PIDS"/*.pid; do
    [ -e "$f" ] || continue
    case "$(basename "$f" .pid)" in etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok) continue ;; esac
    kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  for c in $(echo "$COMPONENTS" | tr ' ' '\n' | tac); do
    if running "$c"; then
      kill "$(cat "$PIDS/$c.pid")" 2>/dev/null || true
    fi
  done
  for c in $COMPONENTS; do
    local f="$PIDS/$c.pid"
    [ -f "$f" ] || continue
    local pid; pid="$(cat "$f")"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

keep_logs() {
  status || true
  local out="$ROOT/target/e2e-failed-logs"
  rm -rf "$out" && cp -r "$LOGS" "$out" 2>/dev/null && log "control-plane logs kept in $out"
  for c in $COMPONENTS; do
    [ -f "$out/$c.log" ] && { echo "--- last lines of $c.log"; tail -n 5 "$out/$c.log" | cut -c1-300; }
  done >&2
  return 0
}

down() {
  down_processes
  rm -rf "$STATE"
  log "cluster down"
}

cmd="${1:-status}"
case "$cmd" in
  up) BIN="$("$ROOT/e2e/scripts/build-binaries.sh" all | tail -n 1)"; up ;;
  down) down ;;
  status) status ;;
  kill) kill_component "${2:?component}" ;;
  start) restart_component "${2:?component}" ;;
  compact) compact ;;
  keep-logs) keep_logs ;;
  *) echo "usage: $0 up|down|status|kill C|start C|compact|keep-logs" >&2; exit 2 ;;
esac
