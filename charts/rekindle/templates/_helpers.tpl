{{/* Names and labels shared by every template. */}}

{{- define "rekindle.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rekindle.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "rekindle.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "rekindle.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rekindle.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rekindle.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rekindle.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "rekindle.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels of the Roles, ClusterRoles and their bindings: the chart's, and rbac.labels. */}}
{{- define "rekindle.rbacLabels" -}}
{{ include "rekindle.labels" . }}
{{- with .Values.rbac.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "rekindle.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rekindle.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rekindle.image" -}}
{{- $repo := .Values.image.repository -}}
{{- /* global.imageRegistry replaces the repository's registry (or is put in front of it). */ -}}
{{- with (.Values.global).imageRegistry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if or (contains "." $first) (contains ":" $first) (eq $first "localhost") -}}
{{- $repo = join "/" (prepend (rest $parts) .) -}}
{{- else -}}
{{- $repo = printf "%s/%s" . $repo -}}
{{- end -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The leader election Lease: one per release, so two releases in a namespace never share it. */}}
{{- define "rekindle.leaseName" -}}
{{- printf "%s-leader" (include "rekindle.fullname" .) -}}
{{- end -}}

{{/* The webhook configuration's name (cluster-scoped): the plain release-derived name. */}}
{{- define "rekindle.webhookName" -}}
{{- include "rekindle.fullname" . -}}
{{- end -}}

{{- define "rekindle.tlsSecret" -}}
{{- default (printf "%s-tls" (include "rekindle.fullname" .)) .Values.certs.secretName -}}
{{- end -}}

{{- define "rekindle.caSecret" -}}
{{- printf "%s-ca" (include "rekindle.fullname" .) -}}
{{- end -}}

{{- define "rekindle.certsGenName" -}}
{{- printf "%s-certs-gen" (include "rekindle.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rekindle.cleanupName" -}}
{{- printf "%s-cleanup" (include "rekindle.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The namespaces rekindle acts in, as a JSON list; empty means cluster-wide. rekindle.namespaces is a list
or a comma-separated string. With rekindle.watchGlobally false the release namespace is always one of
them (alone when no list is given), as in Reloader's chart.
*/}}
{{- define "rekindle.watchNamespaces" -}}
{{- $r := .Values.rekindle -}}
{{- $given := $r.namespaces | default list -}}
{{- if kindIs "string" $given -}}
{{- $given = splitList "," $given -}}
{{- end -}}
{{- $names := list -}}
{{- range $given -}}
{{- with (. | toString | trim) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- if not $r.watchGlobally -}}
{{- $names = append $names .Release.Namespace -}}
{{- end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* True (non-empty) when rekindle acts in listed namespaces only: namespaced Roles, no ClusterRole. */}}
{{- define "rekindle.namespaced" -}}
{{- if include "rekindle.watchNamespaces" . | fromJsonArray -}}true{{- end -}}
{{- end -}}

{{/* The RBAC rules rekindle needs, least privilege; the optional APIs only when enabled. */}}
{{- define "rekindle.rules" -}}
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets", "daemonsets"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "patch", "create", "delete"]
- apiGroups: [""]
  resources: ["configmaps", "secrets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.rekindle.isArgoRollouts }}
- apiGroups: ["argoproj.io"]
  resources: ["rollouts"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- if .Values.rekindle.isOpenshift }}
- apiGroups: ["apps.openshift.io"]
  resources: ["deploymentconfigs"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- if .Values.rekindle.enableCSIIntegration }}
- apiGroups: ["secrets-store.csi.x-k8s.io"]
  resources: ["secretproviderclasses", "secretproviderclasspodstatuses"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- if .Values.rekindle.podRestarts }}
# Pod restarts (rekindle.io/restart: pods): the pods a walk replaces, read and evicted, and the
# labelled pods of owners rekindle does not write, watched.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
{{- end }}
{{- end -}}

{{/* The server's command line, from rekindle.* values. */}}
{{- define "rekindle.args" -}}
{{- $r := .Values.rekindle -}}
- --webhook-addr=:{{ .Values.webhook.port }}
- --admin-addr=:{{ .Values.metrics.port }}
- --tls-cert-file=/tls/tls.crt
- --tls-key-file=/tls/tls.key
- --tls-min-version={{ .Values.webhook.tlsMinVersion }}
- --reload-strategy={{ $r.reloadStrategy }}
- --cronjob-strategy={{ $r.cronjobStrategy }}
- --reload-debounce={{ $r.reloadDebounce }}
- --reload-debounce-max={{ $r.reloadDebounceMax }}
- --min-reload-interval={{ $r.minReloadInterval }}
- --max-concurrent-reloads={{ $r.maxConcurrentReloads }}
- --consistency-interval={{ $r.consistencyInterval }}
{{- if $r.reloadWindow }}
- --reload-window={{ $r.reloadWindow }}
{{- end }}
- --max-rollouts-in-progress={{ $r.maxRolloutsInProgress }}
- --rollout-timeout={{ $r.rolloutTimeout }}
{{- if $r.haltOnFailedRollout }}
- --halt-on-failed-rollout=true
{{- end }}
- --pod-restarts={{ $r.podRestarts }}
- --reload-on={{ $r.reloadOn }}
- --log-level={{ $r.logLevel }}
{{- if $r.logFormat }}
- --log-format={{ $r.logFormat }}
{{- end }}
{{- if $r.autoReloadAll }}
- --auto-reload-all=true
{{- end }}
{{- if $r.reloadOnCreate }}
- --reload-on-create=true
{{- end }}
{{- if $r.reloadOnDelete }}
- --reload-on-delete=true
{{- end }}
{{- if $r.syncAfterRestart }}
- --sync-after-restart=true
{{- end }}
{{- if $r.enableHA }}
- --enable-ha=true
- --leader-election-lease-duration={{ $r.leaderElection.leaseDuration }}
- --leader-election-renew-deadline={{ $r.leaderElection.renewDeadline }}
- --leader-election-retry-period={{ $r.leaderElection.retryPeriod }}
- --leader-election-lease-name={{ include "rekindle.leaseName" . }}
{{- end }}
- --shutdown-delay={{ $r.shutdownDelay }}
- --admission-lookup={{ $r.admissionLookup }}
- --streaming-lists={{ $r.streamingLists }}
{{- if .Values.webhook.http2 }}
- --webhook-http2=true
{{- end }}
{{- if $r.isArgoRollouts }}
- --is-Argo-Rollouts=true
{{- end }}
{{- if $r.enableCSIIntegration }}
- --enable-csi-integration=true
{{- end }}
{{- if include "rekindle.namespaced" . }}
- --namespaces={{ include "rekindle.watchNamespaces" . | fromJsonArray | join "," }}
{{- else }}
{{- /* Both apply cluster-wide only (rekindle ignores them otherwise, with a warning). */}}
{{- if $r.namespacesToIgnore }}
- --namespaces-to-ignore={{ join "," $r.namespacesToIgnore }}
{{- end }}
{{- if $r.namespaceSelector }}
- --namespace-selector={{ $r.namespaceSelector }}
{{- end }}
{{- end }}
{{- if $r.resourceLabelSelector }}
- --resource-label-selector={{ $r.resourceLabelSelector }}
{{- end }}
{{- if $r.resourcesToIgnore }}
- --resources-to-ignore={{ $r.resourcesToIgnore }}
{{- end }}
{{- if $r.ignoredWorkloadTypes }}
- --ignored-workload-types={{ join "," $r.ignoredWorkloadTypes }}
{{- end }}
{{- if $r.webhookUrl }}
- --webhook-url={{ $r.webhookUrl }}
{{- end }}
{{- with $r.annotations }}
{{- if .configmap }}
- --configmap-annotation={{ .configmap }}
{{- end }}
{{- if .secret }}
- --secret-annotation={{ .secret }}
{{- end }}
{{- if .auto }}
- --auto-annotation={{ .auto }}
{{- end }}
{{- if .configmapAuto }}
- --configmap-auto-annotation={{ .configmapAuto }}
{{- end }}
{{- if .secretAuto }}
- --secret-auto-annotation={{ .secretAuto }}
{{- end }}
{{- if .search }}
- --auto-search-annotation={{ .search }}
{{- end }}
{{- if .match }}
- --search-match-annotation={{ .match }}
{{- end }}
{{- if .ignore }}
- --ignore-annotation={{ .ignore }}
{{- end }}
{{- if .pauseDeployment }}
- --pause-deployment-annotation={{ .pauseDeployment }}
{{- end }}
{{- if .pauseDeploymentTime }}
- --pause-deployment-time-annotation={{ .pauseDeploymentTime }}
{{- end }}
{{- end }}
{{- range $r.extraArgs }}
- {{ . }}
{{- end }}
{{- end -}}

{{/* The certs-gen pod of the hook Jobs and of the renewal CronJob: `root`, `phase`, `serviceAccount`. */}}
{{- define "rekindle.certsGenPod" -}}
{{- $ := .root -}}
metadata:
  labels:
    # Not the server's selector labels: these Pods must never join its Service or PDB.
    app.kubernetes.io/name: {{ include "rekindle.name" $ }}-certs-gen
    app.kubernetes.io/instance: {{ $.Release.Name }}
spec:
  restartPolicy: OnFailure
  serviceAccountName: {{ .serviceAccount }}
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $.Values.podSecurityContext | nindent 4 }}
  containers:
    - name: certs-gen
      image: {{ include "rekindle.image" $ }}
      imagePullPolicy: {{ $.Values.image.pullPolicy }}
      command: ["/certs-gen"]
      args:
        - cluster
        - --phase={{ .phase }}
        - --namespace={{ $.Release.Namespace }}
        - --service={{ include "rekindle.fullname" $ }}
        - --secret={{ include "rekindle.tlsSecret" $ }}
        - --ca-secret={{ include "rekindle.caSecret" $ }}
        - --cluster-domain={{ $.Values.certs.certsGen.clusterDomain }}
        - --webhook-config={{ include "rekindle.webhookName" $ }}
        - --webhook-name=workloads.rekindle.io
        {{- if $.Values.rekindle.podRestarts }}
        - --webhook-name=pods.rekindle.io
        {{- end }}
        - --days={{ $.Values.certs.certsGen.days }}
      resources:
        requests:
          cpu: 10m
          memory: 16Mi
        limits:
          memory: 64Mi
      securityContext:
        {{- toYaml $.Values.containerSecurityContext | nindent 8 }}
  {{- with $.Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $.Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* certs-gen's RBAC: `root`, `name`, `annotations` (the hooks' or none). */}}
{{- define "rekindle.certsGenRbac" -}}
{{- $ := .root -}}
{{- $v := . -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $v.name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "rekindle.labels" $ | nindent 4 }}
  {{- with $v.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $v.name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "rekindle.labels" $ | nindent 4 }}
  {{- with $v.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
rules:
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create"]
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: [{{ include "rekindle.tlsSecret" $ | quote }}, {{ include "rekindle.caSecret" $ | quote }}]
    verbs: ["get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $v.name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "rekindle.labels" $ | nindent 4 }}
  {{- with $v.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $v.name }}
subjects:
  - kind: ServiceAccount
    name: {{ $v.name }}
    namespace: {{ $.Release.Namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $v.name }}
  labels:
    {{- include "rekindle.labels" $ | nindent 4 }}
  {{- with $v.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
rules:
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["mutatingwebhookconfigurations"]
    resourceNames: [{{ include "rekindle.webhookName" $ | quote }}]
    verbs: ["get", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $v.name }}
  labels:
    {{- include "rekindle.labels" $ | nindent 4 }}
  {{- with $v.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $v.name }}
subjects:
  - kind: ServiceAccount
    name: {{ $v.name }}
    namespace: {{ $.Release.Namespace }}
{{- end -}}

{{/* How the apiserver calls the webhook: the same for each of its entries. */}}
{{- define "rekindle.webhookClient" -}}
{{- $fullname := include "rekindle.fullname" . -}}
admissionReviewVersions: ["v1"]
sideEffects: NoneOnDryRun
failurePolicy: {{ .Values.webhook.failurePolicy }}
timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
matchPolicy: Equivalent
reinvocationPolicy: IfNeeded
clientConfig:
  service:
    name: {{ $fullname }}
    namespace: {{ .Release.Namespace }}
    path: /mutate
    port: {{ .Values.service.port }}
  {{- if eq .Values.certs.mode "external" }}
  caBundle: {{ required "certs.external.caBundle is required when certs.mode=external" .Values.certs.external.caBundle }}
  {{- end }}
{{- end -}}

{{/* The namespaces the webhook sees: the same for each of its entries. */}}
{{- define "rekindle.webhookNamespaces" -}}
namespaceSelector:
  {{- if .Values.webhook.namespaceSelector }}
  {{- toYaml .Values.webhook.namespaceSelector | nindent 2 }}
  {{- else }}
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- $excluded := concat (list "kube-system" "kube-node-lease" "kube-public" .Release.Namespace) .Values.webhook.excludeNamespaces }}
        {{- range $excluded | uniq }}
        - {{ . }}
        {{- end }}
    {{- if include "rekindle.namespaced" . }}
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- range include "rekindle.watchNamespaces" . | fromJsonArray }}
        - {{ . }}
        {{- end }}
    {{- end }}
    - key: rekindle.io/admission
      operator: NotIn
      values: ["disabled"]
  {{- end }}
{{- end -}}
