#!/usr/bin/env bash
# Runs rekindle in the foreground against the local control plane (target/e2e/kubeconfig), with its
# webhook registered as MutatingWebhookConfiguration `rekindle-local` (clientConfig.url on 127.0.0.1).
# The registration is removed when rekindle exits. Ports: REKINDLE_WEBHOOK_PORT (9443), REKINDLE_ADMIN_PORT (9090).
# Extra arguments are passed to rekindle.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STATE="${REKINDLE_E2E_STATE:-$ROOT/target/e2e}"
WEBHOOK_PORT="${REKINDLE_WEBHOOK_PORT:-9443}"
ADMIN_PORT="${REKINDLE_ADMIN_PORT:-9090}"
NAME="${REKINDLE_WEBHOOK_NAME:-rekindle-local}"
[ -f "$STATE/env" ] || { echo "no local cluster: run 'just cluster-up' first" >&2; exit 1; }
# shellcheck disable=SC1091
source "$STATE/env"
KUBECTL="$BIN/kubectl --kubeconfig $KUBECONFIG"
REKINDLE="${REKINDLE_BIN:-$ROOT/target/debug/rekindle}"
(cd "$ROOT" && cargo build -q -p certs-gen --bin certs-gen && { [ -n "${REKINDLE_BIN:-}" ] || cargo build -q --bin rekindle; })
"$ROOT/target/debug/certs-gen" local --out "$STATE/pki"
CA_BUNDLE="$(base64 -w0 <"$STATE/pki/ca.crt")"

# How the apiserver calls each entry (as the chart).
CALL="  admissionReviewVersions: [\"v1\"]
  sideEffects: NoneOnDryRun
  failurePolicy: Ignore
  timeoutSeconds: 2
  matchPolicy: Equivalent
  reinvocationPolicy: IfNeeded
  clientConfig:
    url: https://127.0.0.1:$WEBHOOK_PORT/mutate
    caBundle: $CA_BUNDLE
  # As the chart: rekindle's own writes (user rekindle, its client certificate) skip the webhook.
  matchConditions:
  - name: not-rekindle-itself
    expression: \"request.userInfo.username != 'rekindle'\""
# Pods labelled rekindle.io/restart=pods, stamped at creation (unless --pod-restarts=false).
POD_WEBHOOK=""
if [[ " $* " != *" --pod-restarts=false "* ]]; then
  POD_WEBHOOK="- name: pods.rekindle.io
$CALL
  namespaceSelector:
    matchExpressions:
    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, kube-node-lease, kube-public]}
  objectSelector:
    matchLabels: {rekindle.io/restart: pods}
  rules:
  - {apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE], resources: [pods], scope: Namespaced}"
fi
$KUBECTL apply -f - >/dev/null <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: $NAME
webhooks:
- name: workloads.rekindle.io
$CALL
  namespaceSelector:
    matchExpressions:
    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, kube-node-lease, kube-public]}
    - {key: rekindle.io/admission, operator: NotIn, values: [disabled]}
  objectSelector:
    matchExpressions:
    - {key: rekindle.io/admission, operator: NotIn, values: [disabled]}
  rules:
  - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments, statefulsets, daemonsets], scope: Namespaced}
  - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [cronjobs, jobs], scope: Namespaced}
$POD_WEBHOOK
YAML
cleanup() { $KUBECTL delete mutatingwebhookconfiguration "$NAME" --ignore-not-found >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'kill -TERM "$pid" 2>/dev/null' INT TERM
"$REKINDLE" --kubeconfig "$REKINDLE_KUBECONFIG" \
  --webhook-addr "127.0.0.1:$WEBHOOK_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
  --tls-cert-file "$STATE/pki/webhook.crt" --tls-key-file "$STATE/pki/webhook.key" "$@" &
pid=$!
wait "$pid"
