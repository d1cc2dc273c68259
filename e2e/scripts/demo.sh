#!/usr/bin/env bash
# The demo: a local control plane, rekindle running against it, and a Deployment that reloads when its
# ConfigMap changes. rekindle keeps running afterwards (`just demo-stop` stops it, `just cluster-down`
# stops everything).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STATE="${REKINDLE_E2E_STATE:-$ROOT/target/e2e}"
"$ROOT/e2e/scripts/cluster.sh" up
# shellcheck disable=SC1091
source "$STATE/env"
K="$BIN/kubectl --kubeconfig $KUBECONFIG"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

(cd "$ROOT" && cargo build -q --bin rekindle)
if [ -f "$STATE/pids/rekindle-demo.pid" ] && kill -0 "$(cat "$STATE/pids/rekindle-demo.pid")" 2>/dev/null; then
  say "rekindle already running (pid $(cat "$STATE/pids/rekindle-demo.pid"))"
else
  say "starting rekindle (log: $STATE/logs/rekindle-demo.log)"
  nohup "$ROOT/e2e/scripts/serve-local.sh" >"$STATE/logs/rekindle-demo.log" 2>&1 &
  echo $! >"$STATE/pids/rekindle-demo.pid"
fi
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:${REKINDLE_ADMIN_PORT:-9090}/ready" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -sf "http://127.0.0.1:${REKINDLE_ADMIN_PORT:-9090}/ready" >/dev/null || { echo "rekindle did not become ready; see $STATE/logs/rekindle-demo.log" >&2; exit 1; }
sleep 1

say "a namespace with a ConfigMap, a Secret and an annotated Deployment"
$K delete namespace demo --ignore-not-found --wait=true >/dev/null
$K create namespace demo >/dev/null
$K -n demo apply -f - <<'YAML'
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {greeting: hello}
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret}
stringData: {password: initial}
YAML
sleep 1
$K -n demo apply -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations: {reloader.stakater.com/auto: "true"}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: app
        image: busybox
        envFrom: [{configMapRef: {name: app-config}}, {secretRef: {name: app-secret}}]
YAML
$K -n demo rollout status deploy/web --timeout=60s >/dev/null
say "env vars stamped by the webhook at creation"
$K -n demo get deploy web -o jsonpath='{range .spec.template.spec.containers[0].env[*]}{.name}={.value}{"\n"}{end}'
say "what rekindle hash says of the ConfigMap"
$K -n demo get cm app-config -o yaml | "$ROOT/target/debug/rekindle" hash -f -
say "ReplicaSets before the change"
$K -n demo get rs -l app=web

say "editing the ConfigMap: greeting=hello -> greeting=bonjour"
$K -n demo patch configmap app-config -p '{"data":{"greeting":"bonjour"}}'
for _ in $(seq 1 60); do
  [ "$($K -n demo get rs -l app=web --no-headers | wc -l)" -ge 2 ] && break
  sleep 0.5
done
$K -n demo rollout status deploy/web --timeout=60s >/dev/null
say "env vars after the change"
$K -n demo get deploy web -o jsonpath='{range .spec.template.spec.containers[0].env[*]}{.name}={.value}{"\n"}{end}'
say "ReplicaSets after the change (a new one took over)"
$K -n demo get rs -l app=web
say "the Event rekindle recorded"
$K -n demo get events --field-selector reason=Reloaded -o custom-columns=REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message
say "done: rekindle is still running (admin :${REKINDLE_ADMIN_PORT:-9090}, webhook :${REKINDLE_WEBHOOK_PORT:-9443})"
echo "try: $K -n demo patch secret app-secret -p '{\"stringData\":{\"password\":\"rotated\"}}'"
echo "stop rekindle: just demo-stop    stop everything: just cluster-down"
