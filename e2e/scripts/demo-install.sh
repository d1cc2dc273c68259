#!/usr/bin/env bash
# The install demo on the real node (`just node-up` first): the README's `helm install` of the chart
# (certsGen mode), then a Deployment that rolls when its ConfigMap changes, through the chart's webhook.
# Everything runs in the node's network namespace (e2e/scripts/node.sh exec). `just cluster-down` stops it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
N=("$ROOT/e2e/scripts/node.sh" exec --)
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cd "$ROOT"

if "${N[@]}" helm status rekindle -n rekindle >/dev/null 2>&1; then
  say "rekindle is already installed"
else
  say "helm install rekindle charts/rekindle -n rekindle --create-namespace --set certs.mode=certsGen"
  "${N[@]}" helm install rekindle charts/rekindle -n rekindle --create-namespace --set certs.mode=certsGen
fi
"${N[@]}" kubectl -n rekindle rollout status deployment/rekindle --timeout=180s
"${N[@]}" kubectl -n rekindle get pods -o wide

say "a ConfigMap and an annotated Deployment (image: the node's pause image)"
"${N[@]}" kubectl delete namespace demo --ignore-not-found --wait=true >/dev/null
"${N[@]}" kubectl create namespace demo >/dev/null
"${N[@]}" kubectl -n demo apply -f - <<'YAML'
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {greeting: hello}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations: {reloader.stakater.com/auto: "true"}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: web
          image: rekindle.local/pause:e2e
          imagePullPolicy: Never
          envFrom: [{configMapRef: {name: app-config}}]
YAML
"${N[@]}" kubectl -n demo rollout status deployment/web --timeout=120s
say "stamped at admission:"
"${N[@]}" kubectl -n demo get deployment web -o jsonpath='{.spec.template.spec.containers[0].env}'; echo

say "changing the ConfigMap"
"${N[@]}" kubectl -n demo patch configmap app-config --type merge -p '{"data":{"greeting":"hello again"}}' >/dev/null
for _ in $(seq 1 60); do
  [ "$("${N[@]}" kubectl -n demo get replicasets -l app=web -o name | wc -l)" -ge 2 ] && break
  sleep 1
done
"${N[@]}" kubectl -n demo rollout status deployment/web --timeout=120s
"${N[@]}" kubectl -n demo get replicasets,pods -o wide
"${N[@]}" kubectl -n demo get events --field-selector reason=Reloaded
[ "$("${N[@]}" kubectl -n demo get replicasets -l app=web -o name | wc -l)" -eq 2 ] || { echo "web did not roll exactly once" >&2; exit 1; }
say "web rolled once. Try it yourself: e2e/scripts/node.sh exec -- kubectl -n demo edit configmap app-config"
