//! `rekindle migrate-values`: a values file written for Reloader's chart (2.2.x, Reloader v1.4.x, or
//! 3.x, whose Enterprise parts have no equivalent) turned
//! into one for rekindle's chart that runs the same controller: the same watched namespaces and RBAC
//! scope, flags, annotation names, environment and pod placement. The mapping follows what Reloader's
//! templates render, not its key names: a key that renders nothing there (`webhookUrl` without
//! `custom_annotations`, `ignoreNamespaces` in scoped mode) is not carried over either, and says so.
//! Every key left behind gets a warning with the reason; nothing is dropped silently.

use serde_json::{json, Map, Value};

/// The result: rekindle's values, one line per key not carried over (or carried over differently), and a
/// summary of the controller both charts run.
#[derive(Debug, Default)]
pub struct Migration {
    pub values: Value,
    pub warnings: Vec<String>,
    pub summary: Vec<String>,
}

/// Keys with no equivalent in rekindle, with the reason printed.
const DROPPED: &[(&str, &str)] = &[
    ("image", "rekindle's chart installs rekindle's image (set image.* on the rekindle chart to override)"),
    ("reloader.enablePProf", "rekindle serves no pprof"),
    ("reloader.pprofAddr", "rekindle serves no pprof"),
    ("reloader.legacy", "Reloader's chart does not use it"),
    ("reloader.deployment.gomaxprocsOverride", "Go runtime tuning; rekindle is not a Go program"),
    ("reloader.deployment.gomemlimitOverride", "Go runtime tuning; rekindle is not a Go program"),
    ("reloader.serviceMonitor.scheme", "rekindle's metrics port is plain HTTP"),
    ("reloader.serviceMonitor.tlsConfig", "rekindle's metrics port is plain HTTP"),
    ("reloader.serviceMonitor.bearerTokenFile", "rekindle's metrics need no token"),
    ("reloader.podMonitor.scheme", "rekindle's metrics port is plain HTTP"),
    ("reloader.podMonitor.tlsConfig", "rekindle's metrics port is plain HTTP"),
    ("reloader.podMonitor.bearerTokenSecret", "rekindle's metrics need no token"),
];

/// Straight moves: Reloader's path → rekindle's path (the value as it is).
const MOVES: &[(&str, &str)] = &[
    ("nameOverride", "nameOverride"),
    ("fullnameOverride", "fullnameOverride"),
    ("global.imageRegistry", "global.imageRegistry"),
    (
        "reloader.resourceLabelSelector",
        "rekindle.resourceLabelSelector",
    ),
    ("reloader.logFormat", "rekindle.logFormat"),
    ("reloader.logLevel", "rekindle.logLevel"),
    ("reloader.isOpenshift", "rekindle.isOpenshift"),
    (
        "reloader.enableCSIIntegration",
        "rekindle.enableCSIIntegration",
    ),
    (
        "reloader.enableMetricsByNamespace",
        "rekindle.metricsCountByNamespace",
    ),
    (
        "reloader.deployment.revisionHistoryLimit",
        "revisionHistoryLimit",
    ),
    ("reloader.deployment.nodeSelector", "nodeSelector"),
    ("reloader.deployment.tolerations", "tolerations"),
    (
        "reloader.deployment.topologySpreadConstraints",
        "topologySpreadConstraints",
    ),
    ("reloader.deployment.priorityClassName", "priorityClassName"),
    ("reloader.deployment.runtimeClassName", "runtimeClassName"),
    ("reloader.deployment.schedulerName", "schedulerName"),
    ("reloader.deployment.dnsConfig", "dnsConfig"),
    ("reloader.deployment.volumeMounts", "extraVolumeMounts"),
    ("reloader.deployment.volumes", "extraVolumes"),
    ("reloader.deployment.annotations", "deploymentAnnotations"),
    ("reloader.deployment.livenessProbe", "livenessProbe"),
    ("reloader.deployment.readinessProbe", "readinessProbe"),
    ("reloader.deployment.resources", "resources"),
    ("reloader.deployment.pod.annotations", "podAnnotations"),
    ("reloader.service.labels", "service.labels"),
    ("reloader.service.annotations", "service.annotations"),
    ("reloader.service.port", "metrics.port"),
    ("reloader.service.ipFamilyPolicy", "service.ipFamilyPolicy"),
    ("reloader.service.ipFamilies", "service.ipFamilies"),
    ("reloader.rbac.enabled", "rbac.create"),
    ("reloader.rbac.labels", "rbac.labels"),
    ("reloader.serviceAccount.create", "serviceAccount.create"),
    (
        "reloader.serviceAccount.annotations",
        "serviceAccount.annotations",
    ),
    ("reloader.serviceAccount.labels", "serviceAccount.labels"),
    ("reloader.serviceAccount.name", "serviceAccount.name"),
    (
        "reloader.serviceAccount.automountServiceAccountToken",
        "serviceAccount.automountServiceAccountToken",
    ),
    (
        "reloader.podDisruptionBudget.minAvailable",
        "podDisruptionBudget.minAvailable",
    ),
    (
        "reloader.podDisruptionBudget.maxUnavailable",
        "podDisruptionBudget.maxUnavailable",
    ),
    ("reloader.netpol.enabled", "networkPolicy.enabled"),
    ("reloader.netpol.from", "networkPolicy.metricsFrom"),
    ("reloader.netpol.to", "networkPolicy.apiServerTo"),
    (
        "reloader.verticalPodAutoscaler.enabled",
        "verticalPodAutoscaler.enabled",
    ),
    (
        "reloader.verticalPodAutoscaler.recommenders",
        "verticalPodAutoscaler.recommenders",
    ),
    (
        "reloader.verticalPodAutoscaler.controlledResources",
        "verticalPodAutoscaler.controlledResources",
    ),
    (
        "reloader.verticalPodAutoscaler.controlledValues",
        "verticalPodAutoscaler.controlledValues",
    ),
    (
        "reloader.verticalPodAutoscaler.minAllowed",
        "verticalPodAutoscaler.minAllowed",
    ),
    (
        "reloader.verticalPodAutoscaler.maxAllowed",
        "verticalPodAutoscaler.maxAllowed",
    ),
    (
        "reloader.verticalPodAutoscaler.updatePolicy",
        "verticalPodAutoscaler.updatePolicy",
    ),
];

/// Booleans Reloader's chart passes as a flag only when exactly `true` (`eq … true`).
const FLAGS: &[(&str, &str)] = &[
    ("reloader.autoReloadAll", "rekindle.autoReloadAll"),
    ("reloader.isArgoRollouts", "rekindle.isArgoRollouts"),
    ("reloader.reloadOnCreate", "rekindle.reloadOnCreate"),
    ("reloader.reloadOnDelete", "rekindle.reloadOnDelete"),
    ("reloader.syncAfterRestart", "rekindle.syncAfterRestart"),
];

/// `reloader.custom_annotations.*` keys Reloader's chart renders as flags → rekindle's annotation values.
const ANNOTATIONS: &[(&str, &str)] = &[
    ("configmap", "configmap"),
    ("secret", "secret"),
    ("auto", "auto"),
    ("configmap_auto", "configmapAuto"),
    ("secret_auto", "secretAuto"),
    ("search", "search"),
    ("match", "match"),
    ("ignore", "ignore"),
    ("pausePeriod", "pauseDeployment"),
    ("pauseTime", "pauseDeploymentTime"),
];

/// The keys of Reloader's `deployment.env.secret` its chart writes into the Secret it creates.
const ENV_SECRET_KEYS: &[&str] = &[
    "ALERT_ON_RELOAD",
    "ALERT_SINK",
    "ALERT_WEBHOOK_URL",
    "ALERT_ADDITIONAL_INFO",
];

const MONITOR_KEYS: &[(&str, &str)] = &[
    ("enabled", "enabled"),
    ("namespace", "namespace"),
    ("interval", "interval"),
    ("timeout", "scrapeTimeout"),
    ("labels", "labels"),
    ("annotations", "annotations"),
    ("honorLabels", "honorLabels"),
    ("relabelings", "relabelings"),
    ("metricRelabelings", "metricRelabelings"),
    ("targetLabels", "targetLabels"),
    ("podTargetLabels", "podTargetLabels"),
];

/// Removes and returns the value at a dotted path (absent, null and empty maps count as unset).
fn take(values: &mut Value, path: &str) -> Option<Value> {
    take_raw(values, path).filter(|v| !v.is_null() && v.as_object().is_none_or(|m| !m.is_empty()))
}

/// Removes and returns the value at a dotted path as it is (null included).
fn take_raw(values: &mut Value, path: &str) -> Option<Value> {
    let (parent, last) = match path.rsplit_once('.') {
        Some((p, l)) => (
            p.split('.')
                .try_fold(&mut *values, |node, key| node.get_mut(key))?,
            l,
        ),
        None => (&mut *values, path),
    };
    parent.as_object_mut()?.remove(last)
}

fn set(values: &mut Value, path: &str, value: Value) {
    let mut node = values;
    let mut keys = path.split('.').peekable();
    while let Some(key) = keys.next() {
        if !node.is_object() {
            *node = json!({});
        }
        let map = node.as_object_mut().expect("made an object");
        if keys.peek().is_none() {
            map.insert(key.to_string(), value);
            return;
        }
        node = map.entry(key).or_insert_with(|| json!({}));
    }
}

/// Go template truth, as Reloader's chart's `if` sees a value: false, 0, "", empty list or map, nil.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

/// Whether a value holds anything but Reloader's defaults (false, "", empty), to decide whether a key
/// with no equivalent deserves a warning.
fn is_set(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.values().any(is_set),
        other => truthy(other),
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every leaf still set under `node`, as dotted paths.
fn leaves(node: &Value, prefix: &str, out: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &path, out);
            }
        }
        Value::Null => {}
        _ => out.push(prefix.to_string()),
    }
}

/// Converts Reloader's chart values. `namespace` is the release namespace Reloader was installed in; it
/// only makes the summary name it (rekindle's chart adds its own release namespace in scoped mode, as
/// Reloader's does). Errors are values Reloader's chart or Reloader itself refuses.
pub fn migrate(reloader: &Value, namespace: Option<&str>) -> Result<Migration, String> {
    let mut rest = reloader.clone();
    let mut m = Migration {
        values: json!({}),
        ..Migration::default()
    };

    for (path, why) in DROPPED {
        // Reloader's defaults (false, "", empty) need no word; anything set does.
        if take(&mut rest, path).is_some_and(|v| is_set(&v)) {
            m.warnings.push(format!("{path}: not carried over: {why}"));
        }
    }
    for (from, to) in MOVES {
        if let Some(v) = take(&mut rest, from) {
            set(&mut m.values, to, v);
        }
    }
    for (from, to) in FLAGS {
        if let Some(v) = take(&mut rest, from) {
            set(&mut m.values, to, json!(v == json!(true)));
        }
    }
    // The chart's own namespace override: the controller lives (and, scoped, watches) there.
    let home = take(&mut rest, "namespace").map(|v| scalar(&v));
    if let Some(ns) = &home {
        m.warnings.push(format!(
            "namespace: {ns}: install rekindle's release there (helm install -n {ns}); the chart uses the release namespace"
        ));
    }

    resources_and_workloads(&mut rest, &mut m)?;
    scope(&mut rest, &mut m, home.as_deref(), namespace)?;
    annotations(&mut rest, &mut m);
    replicas(&mut rest, &mut m);
    pod(&mut rest, &mut m);
    if let Some(env) = take(&mut rest, "reloader.deployment.env") {
        env_vars(&env, &mut m);
    }
    monitors(&mut rest, &mut m);
    enterprise(&mut rest, &mut m);

    let mut unknown = Vec::new();
    leaves(&rest, "", &mut unknown);
    for key in unknown {
        m.warnings.push(format!(
            "{key}: not carried over: not a key of Reloader's chart 2.2.x or 3.x"
        ));
    }
    Ok(m)
}

/// Keys with no equivalent whose chart default is not empty, with that default and the reason: named
/// when set to anything else.
const DROPPED_UNLESS_DEFAULT: &[(&str, &str, &str)] = &[
    (
        "kubernetes.host",
        "https://kubernetes.default",
        "Reloader's chart does not use it",
    ),
    ("global.host", "", ENTERPRISE),
    ("global.gatewayBasePath", "/gateway", ENTERPRISE),
    ("global.ingressScheme", "https", ENTERPRISE),
];

const ENTERPRISE: &str =
    "Reloader Enterprise's console and gateway (chart 3.x); rekindle has neither";

/// Chart 3.x's Reloader Enterprise (`enterprise`: console, gateway and cache), named when switched on;
/// and the keys of [`DROPPED_UNLESS_DEFAULT`].
fn enterprise(rest: &mut Value, m: &mut Migration) {
    if take(rest, "enterprise").is_some_and(|e| e.get("enabled").is_some_and(truthy)) {
        m.warnings.push(format!(
            "enterprise.enabled: not carried over: {ENTERPRISE}"
        ));
    }
    for (path, default, why) in DROPPED_UNLESS_DEFAULT {
        if take(rest, path).is_some_and(|v| v != json!(default)) {
            m.warnings.push(format!("{path}: not carried over: {why}"));
        }
    }
}

/// `ignoreSecrets`, `ignoreConfigMaps`, `ignoreJobs`, `ignoreCronJobs`, `reloadStrategy`.
fn resources_and_workloads(rest: &mut Value, m: &mut Migration) -> Result<(), String> {
    let flag = |rest: &mut Value, path| take(rest, path).is_some_and(|v| truthy(&v));
    match (
        flag(rest, "reloader.ignoreSecrets"),
        flag(rest, "reloader.ignoreConfigMaps"),
    ) {
        (true, true) => {
            return Err(
                "reloader.ignoreSecrets and reloader.ignoreConfigMaps are both true: Reloader refuses to start (nothing to watch)".into(),
            )
        }
        (true, false) => set(&mut m.values, "rekindle.resourcesToIgnore", json!("secrets")),
        (false, true) => set(&mut m.values, "rekindle.resourcesToIgnore", json!("configMaps")),
        (false, false) => {}
    }
    let mut ignored = Vec::new();
    if flag(rest, "reloader.ignoreJobs") {
        ignored.push(json!("jobs"));
    }
    if flag(rest, "reloader.ignoreCronJobs") {
        ignored.push(json!("cronjobs"));
    }
    if !ignored.is_empty() {
        set(
            &mut m.values,
            "rekindle.ignoredWorkloadTypes",
            Value::Array(ignored),
        );
    }
    if let Some(strategy) = take(rest, "reloader.reloadStrategy") {
        let mapped = match strategy.as_str() {
            Some("default") | Some("env-vars") | Some("") => "env-vars",
            Some("annotations") => "annotations",
            _ => {
                return Err(format!(
                    "reloader.reloadStrategy: {strategy} is not default, env-vars or annotations"
                ))
            }
        };
        set(&mut m.values, "rekindle.reloadStrategy", json!(mapped));
    }
    Ok(())
}

/// `watchGlobally`, `namespaces` (a list or a comma-separated string), `ignoreNamespaces`,
/// `namespaceSelector`: which namespaces the controller acts in, and where its Roles go.
/// `home` is Reloader's `namespace` override, `release` the release namespace given on the command line.
fn scope(
    rest: &mut Value,
    m: &mut Migration,
    home: Option<&str>,
    release: Option<&str>,
) -> Result<(), String> {
    let global = take_raw(rest, "reloader.watchGlobally")
        .map(|v| truthy(&v))
        .unwrap_or(true);
    let listed: Vec<String> = match take(rest, "reloader.namespaces") {
        Some(Value::String(csv)) => csv.split(',').map(|s| s.trim().to_string()).collect(),
        Some(Value::Array(list)) => list.iter().map(|v| scalar(v).trim().to_string()).collect(),
        Some(other) => {
            return Err(format!(
                "reloader.namespaces: {other} is not a list or a comma-separated string"
            ))
        }
        None => Vec::new(),
    };
    let mut listed: Vec<String> = listed.into_iter().filter(|n| !n.is_empty()).collect();
    let ignored: Vec<String> = take(rest, "reloader.ignoreNamespaces")
        .map(|v| scalar(&v))
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect();
    let selector = take(rest, "reloader.namespaceSelector").map(|v| scalar(&v));

    if global {
        if !listed.is_empty() {
            return Err("reloader.namespaces is set but reloader.watchGlobally is true: Reloader's chart refuses to render this (set watchGlobally: false for scoped mode)".into());
        }
        if !ignored.is_empty() {
            set(&mut m.values, "rekindle.namespacesToIgnore", json!(ignored));
        }
        if let Some(s) = selector.filter(|s| !s.is_empty()) {
            set(&mut m.values, "rekindle.namespaceSelector", json!(s));
        }
        m.summary.push(match ignored.is_empty() {
            true => "scope: every namespace (a ClusterRole)".into(),
            false => format!(
                "scope: every namespace but {} (a ClusterRole)",
                ignored.join(", ")
            ),
        });
        return Ok(());
    }
    for (key, unused) in [
        ("reloader.ignoreNamespaces", !ignored.is_empty()),
        (
            "reloader.namespaceSelector",
            selector.is_some_and(|s| !s.is_empty()),
        ),
    ] {
        if unused {
            m.warnings.push(format!(
                "{key}: not carried over: Reloader's chart passes it only with watchGlobally: true (it had no effect)"
            ));
        }
    }
    // Reloader's chart adds its own namespace (`namespace`, else the release's); rekindle's chart adds
    // the release namespace, so a `namespace` override is listed explicitly.
    if let Some(ns) = home {
        listed.push(ns.to_string());
    }
    listed.sort();
    listed.dedup();
    set(&mut m.values, "rekindle.watchGlobally", json!(false));
    if !listed.is_empty() {
        set(&mut m.values, "rekindle.namespaces", json!(listed));
    }
    let release = home.or(release).unwrap_or("the release namespace");
    let mut all = listed.clone();
    all.push(release.to_string());
    all.sort();
    all.dedup();
    m.summary.push(format!(
        "scope: namespaces {} only (a Role in each, no ClusterRole)",
        all.join(", ")
    ));
    Ok(())
}

/// `custom_annotations.*` and `webhookUrl`, which Reloader's chart renders only inside the
/// `custom_annotations` block.
fn annotations(rest: &mut Value, m: &mut Migration) {
    let custom = take(rest, "reloader.custom_annotations");
    let webhook = take(rest, "reloader.webhookUrl").filter(truthy);
    if let Some(url) = webhook {
        if custom.as_ref().is_some_and(truthy) {
            set(&mut m.values, "rekindle.webhookUrl", url);
        } else {
            m.warnings.push(format!(
                "reloader.webhookUrl: not carried over: Reloader's chart passes it only when custom_annotations is set, so Reloader reloaded rather than calling {}; set rekindle.webhookUrl to call it instead",
                scalar(&url)
            ));
        }
    }
    let Some(Value::Object(mut custom)) = custom else {
        return;
    };
    for (from, to) in ANNOTATIONS {
        if let Some(v) = custom.remove(*from).filter(truthy) {
            set(&mut m.values, &format!("rekindle.annotations.{to}"), v);
        }
    }
    for key in custom.keys() {
        m.warnings.push(format!(
            "reloader.custom_annotations.{key}: not carried over: Reloader's chart does not render it"
        ));
    }
}

/// `enableHA` and `deployment.replicas`: Reloader's chart runs `replicas` only with enableHA (else at most
/// one), and passes `--enable-ha` when either asks for it.
fn replicas(rest: &mut Value, m: &mut Migration) {
    let ha = take(rest, "reloader.enableHA").is_some_and(|v| truthy(&v));
    let asked = take(rest, "reloader.deployment.replicas")
        .and_then(|v| v.as_i64())
        .unwrap_or(1);
    // Reloader's leader election timings, which its chart passes only with enableHA.
    for key in ["leaseDuration", "renewDeadline", "retryPeriod"] {
        let from = format!("reloader.leaderElection.{key}");
        let Some(v) = take(rest, &from).filter(truthy) else {
            continue;
        };
        if ha {
            set(&mut m.values, &format!("rekindle.leaderElection.{key}"), v);
        } else {
            m.warnings.push(format!(
                "{from}: not carried over: Reloader's chart passes it only with enableHA"
            ));
        }
    }
    let runs = if ha { asked } else { asked.min(1) };
    let elects = ha || asked > 1;
    set(&mut m.values, "replicaCount", json!(runs.max(1)));
    // rekindle's chart runs one replica without election (its default is two with it).
    set(&mut m.values, "rekindle.enableHA", json!(elects));
    if elects && !ha {
        m.warnings.push(format!(
            "reloader.deployment.replicas: {asked} without enableHA: Reloader's chart runs 1 replica with --enable-ha but grants no Lease access; rekindle runs 1 replica with leader election (and the Lease access it needs)"
        ));
    }
    // Reloader's chart has no PodDisruptionBudget unless asked; rekindle's default one would block
    // every drain of the single replica.
    let pdb = take(rest, "reloader.podDisruptionBudget.enabled").is_some_and(|v| truthy(&v));
    set(&mut m.values, "podDisruptionBudget.enabled", json!(pdb));
    m.summary.push(format!(
        "replicas: {runs}{}",
        if elects { ", leader election on" } else { "" }
    ));
}

/// Pod fields, labels and security settings.
fn pod(rest: &mut Value, m: &mut Migration) {
    // Rendered only when a boolean (`kindIs "bool"`), and only when the key is present (`hasKey`).
    if let Some(Value::Bool(b)) = take(rest, "reloader.deployment.hostUsers") {
        set(&mut m.values, "hostUsers", json!(b));
    }
    if let Some(v) = take_raw(rest, "reloader.deployment.automountServiceAccountToken") {
        set(&mut m.values, "automountServiceAccountToken", v);
    }
    // Pull secrets: names or {name: …} objects.
    if let Some(Value::Array(list)) = take(rest, "global.imagePullSecrets") {
        let secrets: Vec<Value> = list
            .iter()
            .map(|s| match s {
                Value::Object(_) => s.clone(),
                other => json!({"name": scalar(other)}),
            })
            .collect();
        set(&mut m.values, "imagePullSecrets", json!(secrets));
    }
    // Reloader's deployment.labels and matchLabels go on the Deployment and its pods.
    let mut labels = Map::new();
    for path in ["reloader.deployment.labels", "reloader.matchLabels"] {
        if let Some(Value::Object(l)) = take(rest, path) {
            labels.extend(l);
        }
    }
    if !labels.is_empty() {
        set(
            &mut m.values,
            "deploymentLabels",
            Value::Object(labels.clone()),
        );
        set(&mut m.values, "podLabels", Value::Object(labels));
    }
    // Helm merges a map given in values into the chart's default: the keys of rekindle's default
    // securityContext that Reloader's does not set are removed (null), so the pod runs as Reloader's did.
    // Reloader's own default is merged the same way into what its values give.
    if let Some(Value::Object(given)) = take(rest, "reloader.deployment.securityContext") {
        let mut ctx = Map::new();
        for key in [
            "runAsNonRoot",
            "runAsUser",
            "runAsGroup",
            "fsGroup",
            "seccompProfile",
        ] {
            ctx.insert(key.into(), Value::Null);
        }
        ctx.insert("runAsNonRoot".into(), json!(true));
        ctx.insert("runAsUser".into(), json!(65534));
        ctx.insert("seccompProfile".into(), json!({"type": "RuntimeDefault"}));
        ctx.extend(given);
        set(&mut m.values, "podSecurityContext", Value::Object(ctx));
    }
    let read_only = take(rest, "reloader.readOnlyRootFileSystem").is_some_and(|v| truthy(&v));
    if let Some(mut ctx) = take(rest, "reloader.deployment.containerSecurityContext") {
        // rekindle's container always runs read-only; Reloader's only when asked.
        if read_only || ctx.get("readOnlyRootFilesystem").is_none() {
            ctx["readOnlyRootFilesystem"] = json!(true);
        }
        set(&mut m.values, "containerSecurityContext", ctx);
    }
    // With enableHA and no affinity of its own, Reloader's chart prefers spreading replicas over nodes;
    // rekindle's default topology spread does the same, so only an explicit affinity is carried over.
    if let Some(a) = take(rest, "reloader.deployment.affinity") {
        set(&mut m.values, "affinity", a);
    }
}

/// Reloader's `deployment.env`: `open` and `field` as they are, `existing` Secrets by reference, and
/// `secret` into the Secret rekindle's chart creates (Reloader's chart writes only its four ALERT_* keys).
fn env_vars(env: &Value, m: &mut Migration) {
    let pairs = |key: &str| {
        env.get(key)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for (name, value) in pairs("open").into_iter().filter(|(_, v)| truthy(v)) {
        out.push(json!({"name": name, "value": scalar(&value)}));
    }
    let mut secret = Map::new();
    for (name, value) in pairs("secret").into_iter().filter(|(_, v)| truthy(v)) {
        if ENV_SECRET_KEYS.contains(&name.as_str()) {
            secret.insert(name, json!(scalar(&value)));
        } else {
            m.warnings.push(format!(
                "reloader.deployment.env.secret.{name}: not carried over: Reloader's chart puts only ALERT_ON_RELOAD, ALERT_SINK, ALERT_WEBHOOK_URL and ALERT_ADDITIONAL_INFO in its Secret, so its pod could not start with this one"
            ));
        }
    }
    if !secret.is_empty() {
        set(&mut m.values, "rekindle.envSecret", Value::Object(secret));
    }
    for (secret_name, keys) in pairs("existing") {
        for (name, key) in keys.as_object().cloned().unwrap_or_default() {
            out.push(json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": scalar(&key)}}}));
        }
    }
    for (name, path) in pairs("field").into_iter().filter(|(_, v)| truthy(v)) {
        out.push(json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": scalar(&path)}}}));
    }
    if !out.is_empty() {
        set(&mut m.values, "rekindle.env", Value::Array(out));
    }
}

fn monitors(rest: &mut Value, m: &mut Migration) {
    for monitor in ["serviceMonitor", "podMonitor"] {
        for (from, to) in MONITOR_KEYS {
            let path = format!("reloader.{monitor}.{from}");
            if let Some(v) = take(rest, &path) {
                let here = match *from {
                    "targetLabels" => monitor == "serviceMonitor",
                    "podTargetLabels" => monitor == "podMonitor",
                    _ => true,
                };
                if here {
                    set(&mut m.values, &format!("{monitor}.{to}"), v);
                } else if is_set(&v) {
                    m.warnings.push(format!(
                        "{path}: not carried over: Reloader's chart does not render it"
                    ));
                }
            }
        }
    }
}

/// The command: reads `file`, prints rekindle's values as YAML on stdout (with the summary as comments)
/// and the warnings on stderr.
pub fn run(file: &std::path::Path, namespace: Option<&str>) -> anyhow::Result<()> {
    use anyhow::Context;
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let values: Value = match serde_saphyr::from_str::<Value>(&text)
        .with_context(|| format!("{} is not a YAML values file", file.display()))?
    {
        Value::Null => json!({}),
        v => v,
    };
    let migration = migrate(&values, namespace).map_err(anyhow::Error::msg)?;
    for w in &migration.warnings {
        eprintln!("warning: {w}");
    }
    println!(
        "# rekindle chart values converted from {} by `rekindle migrate-values`.",
        file.display()
    );
    println!("# The controller both charts run:");
    for line in &migration.summary {
        println!("#   {line}");
    }
    print!("{}", serde_saphyr::to_string(&migration.values)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(v: Value) -> Migration {
        migrate(&v, Some("tools")).unwrap()
    }

    /// Every value `migrate-values` writes, for every everyday Reloader values file of the chart tests,
    /// is one rekindle's chart has (or lies inside one of its free-form maps and lists).
    #[test]
    fn every_value_written_is_one_the_chart_has() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let chart: Value = serde_saphyr::from_str(
            &std::fs::read_to_string(root.join("charts/rekindle/values.yaml")).unwrap(),
        )
        .unwrap();
        let cases = std::fs::read_dir(root.join("e2e/fixtures/migrate/cases")).unwrap();
        let mut checked = 0;
        for case in cases {
            let path = case.unwrap().path();
            if !path.to_string_lossy().ends_with(".reloader.yaml") {
                continue;
            }
            let input: Value =
                serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let Ok(m) = migrate(&input, Some("tools")) else {
                continue;
            };
            let mut written = Vec::new();
            leaves(&m.values, "", &mut written);
            for leaf in written {
                let mut node = &chart;
                for key in leaf.split('.') {
                    match node {
                        Value::Object(map) if map.is_empty() => break,
                        Value::Object(map) => {
                            node = map.get(key).unwrap_or_else(|| {
                                panic!("{}: {leaf} is not a value of the chart", path.display())
                            })
                        }
                        _ => break,
                    }
                }
                checked += 1;
            }
        }
        assert!(checked >= 40, "only {checked} values checked");
    }

    #[test]
    fn scoped_namespaces_as_a_list_or_a_string_keep_their_scope() {
        for listed in [json!(["team-b", "team-a"]), json!("team-a, team-b,")] {
            let m = values(json!({"reloader": {"watchGlobally": false, "namespaces": listed}}));
            assert_eq!(m.values["rekindle"]["watchGlobally"], false);
            assert_eq!(
                m.values["rekindle"]["namespaces"],
                json!(["team-a", "team-b"])
            );
            assert!(
                m.summary[0].contains("team-a, team-b, tools"),
                "{:?}",
                m.summary
            );
            assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        }
        let alone = values(json!({"reloader": {"watchGlobally": false}}));
        assert_eq!(alone.values["rekindle"]["watchGlobally"], false);
        assert!(alone.values["rekindle"].get("namespaces").is_none());
        let refused = migrate(&json!({"reloader": {"namespaces": ["a"]}}), None);
        assert!(refused.unwrap_err().contains("watchGlobally"));
    }

    #[test]
    fn what_reloaders_chart_renders_only_cluster_wide_or_inside_custom_annotations_is_left_with_a_reason(
    ) {
        let m = values(
            json!({"reloader": {"watchGlobally": false, "ignoreNamespaces": "a",
            "namespaceSelector": "x=y", "webhookUrl": "http://hook"}}),
        );
        assert!(m.values["rekindle"].get("namespacesToIgnore").is_none());
        assert!(m.values["rekindle"].get("webhookUrl").is_none());
        assert_eq!(m.warnings.len(), 3, "{:?}", m.warnings);
        let m = values(json!({"reloader": {"webhookUrl": "http://hook",
            "custom_annotations": {"secret_auto": "s/auto", "configmap_auto": "c/auto", "pausePeriod": "p", "nope": "x"}}}));
        assert_eq!(m.values["rekindle"]["webhookUrl"], "http://hook");
        assert_eq!(m.values["rekindle"]["annotations"]["secretAuto"], "s/auto");
        assert_eq!(
            m.values["rekindle"]["annotations"]["configmapAuto"],
            "c/auto"
        );
        assert_eq!(m.values["rekindle"]["annotations"]["pauseDeployment"], "p");
        assert_eq!(m.warnings, vec!["reloader.custom_annotations.nope: not carried over: Reloader's chart does not render it"]);
    }

    #[test]
    fn replicas_follow_reloaders_chart() {
        let defaults = values(json!({}));
        assert_eq!(defaults.values["replicaCount"], 1);
        assert_eq!(defaults.values["rekindle"]["enableHA"], false);
        assert_eq!(defaults.values["podDisruptionBudget"]["enabled"], false);
        assert!(defaults.warnings.is_empty());
        let ha = values(json!({"reloader": {"enableHA": true, "deployment": {"replicas": 3}}}));
        assert_eq!(
            (
                ha.values["replicaCount"].clone(),
                ha.values["rekindle"]["enableHA"].clone()
            ),
            (json!(3), json!(true))
        );
        let capped = values(json!({"reloader": {"deployment": {"replicas": 3}}}));
        assert_eq!(capped.values["replicaCount"], 1);
        assert_eq!(capped.values["rekindle"]["enableHA"], true);
        assert_eq!(capped.warnings.len(), 1);
    }

    #[test]
    fn pod_fields_env_and_security_carry_over() {
        let m = values(
            json!({"reloader": {"readOnlyRootFileSystem": true, "matchLabels": {"team": "p"},
            "deployment": {"hostUsers": false, "automountServiceAccountToken": false, "runtimeClassName": "gvisor",
                "containerSecurityContext": {"allowPrivilegeEscalation": false},
                "env": {"open": {"A": "1", "EMPTY": ""}, "secret": {"ALERT_SINK": "slack", "OTHER": "x"},
                        "field": {"P": "metadata.name"}, "existing": {"s": {"K": "k"}}}}},
            "global": {"imagePullSecrets": ["a", {"name": "b"}]}}),
        );
        let v = &m.values;
        assert_eq!(v["hostUsers"], false);
        assert_eq!(v["automountServiceAccountToken"], false);
        assert_eq!(v["runtimeClassName"], "gvisor");
        assert_eq!(v["podLabels"]["team"], "p");
        assert_eq!(
            v["containerSecurityContext"]["readOnlyRootFilesystem"],
            true
        );
        assert_eq!(v["imagePullSecrets"], json!([{"name": "a"}, {"name": "b"}]));
        assert_eq!(v["rekindle"]["envSecret"], json!({"ALERT_SINK": "slack"}));
        assert_eq!(
            v["rekindle"]["env"],
            json!([{"name": "A", "value": "1"},
                   {"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                   {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
        );
        assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
        assert!(m.warnings[0].contains("env.secret.OTHER"));
    }

    /// Chart 3.x's new blocks as its values.yaml ships them say nothing; Enterprise switched on, or
    /// served at a host, is named. Leader election timings follow enableHA, as Reloader's template.
    #[test]
    fn chart_3_enterprise_blocks_and_leader_election_timings() {
        let shipped = json!({
            "global": {"imageRegistry": "", "imagePullSecrets": [], "host": "",
                "gatewayBasePath": "/gateway", "ingressScheme": "https"},
            "kubernetes": {"host": "https://kubernetes.default"},
            "enterprise": {"enabled": false, "console": {"enabled": true},
                "gateway": {"enabled": true, "dragonfly": {"enabled": true}}},
            "reloader": {"leaderElection": {"leaseDuration": "", "renewDeadline": "", "retryPeriod": ""}}
        });
        let m = values(shipped.clone());
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        assert!(m.values["rekindle"].get("leaderElection").is_none());

        let mut on = shipped;
        on["enterprise"]["enabled"] = json!(true);
        on["global"]["host"] = json!("reloader.example.com");
        on["reloader"]["enableHA"] = json!(true);
        on["reloader"]["leaderElection"] = json!({"leaseDuration": "30s", "retryPeriod": "5s"});
        let m = values(on.clone());
        let warned = m.warnings.join("\n");
        assert!(warned.contains("enterprise.enabled"), "{warned}");
        assert!(warned.contains("global.host"), "{warned}");
        assert_eq!(
            m.values["rekindle"]["leaderElection"],
            json!({"leaseDuration": "30s", "retryPeriod": "5s"})
        );
        on["reloader"]["enableHA"] = json!(false);
        let m = values(on);
        assert!(m.values["rekindle"].get("leaderElection").is_none());
        assert!(
            m.warnings
                .iter()
                .any(|w| w.starts_with("reloader.leaderElection.leaseDuration")),
            "{:?}",
            m.warnings
        );
    }

    #[test]
    fn refuses_what_reloader_refuses_and_names_unknown_keys() {
        let both = json!({"reloader": {"ignoreSecrets": true, "ignoreConfigMaps": true}});
        assert!(migrate(&both, None).unwrap_err().contains("both true"));
        let bad = json!({"reloader": {"reloadStrategy": "restart"}});
        assert!(migrate(&bad, None).is_err());
        let m = values(
            json!({"reloader": {"enablePProf": true, "bogus": 1}, "kubernetes": {"host": "x"}}),
        );
        let warned = m.warnings.join("\n");
        for key in ["reloader.enablePProf", "reloader.bogus", "kubernetes.host"] {
            assert!(warned.contains(key), "{key} in {warned}");
        }
    }
}
