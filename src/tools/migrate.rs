//! `rekindle migrate-values`: a values file written for Reloader's chart (v2.2.x) turned into one for
//! rekindle's chart, with a warning for each key that has no equivalent (never silently dropped).

use serde_json::{json, Map, Value};

/// The result: rekindle's values, and one line per key not carried over.
#[derive(Debug, Default)]
pub struct Migration {
    pub values: Value,
    pub warnings: Vec<String>,
}

/// Keys of Reloader's chart that mean nothing for rekindle, with the reason given to the user.
const DROPPED: &[(&str, &str)] = &[
    ("kubernetes.host", "rekindle uses the in-cluster configuration"),
    ("image", "rekindle's chart installs rekindle's image (set image.* on the rekindle chart to override)"),
    ("reloader.enablePProf", "rekindle serves no pprof"),
    ("reloader.pprofAddr", "rekindle serves no pprof"),
    ("reloader.readOnlyRootFileSystem", "rekindle's root filesystem is always read-only"),
    ("reloader.legacy", "rekindle's RBAC has no legacy mode"),
    ("reloader.matchLabels", "the chart's selector labels are fixed; use podLabels for extra pod labels"),
    ("reloader.deployment.dnsConfig", "no equivalent value"),
    ("reloader.deployment.gomaxprocsOverride", "rekindle is not a Go program"),
    ("reloader.deployment.gomemlimitOverride", "rekindle is not a Go program"),
    ("reloader.rbac.labels", "no equivalent value"),
    ("reloader.serviceAccount.labels", "no equivalent value"),
    ("reloader.serviceMonitor.scheme", "rekindle's metrics port is plain HTTP"),
    ("reloader.serviceMonitor.tlsConfig", "rekindle's metrics port is plain HTTP"),
    ("reloader.serviceMonitor.bearerTokenFile", "rekindle's metrics need no token"),
    ("reloader.podMonitor.scheme", "rekindle's metrics port is plain HTTP"),
    ("reloader.podMonitor.tlsConfig", "rekindle's metrics port is plain HTTP"),
    ("reloader.podMonitor.bearerTokenSecret", "rekindle's metrics need no token"),
    ("reloader.verticalPodAutoscaler", "no equivalent value; create a VerticalPodAutoscaler yourself"),
];

/// Straight moves: Reloader's path → rekindle's path.
const MOVES: &[(&str, &str)] = &[
    ("nameOverride", "nameOverride"),
    ("fullnameOverride", "fullnameOverride"),
    ("global.imageRegistry", "global.imageRegistry"),
    ("global.imagePullSecrets", "imagePullSecrets"),
    ("reloader.autoReloadAll", "rekindle.autoReloadAll"),
    ("reloader.isArgoRollouts", "rekindle.isArgoRollouts"),
    ("reloader.isOpenshift", "rekindle.isOpenshift"),
    ("reloader.reloadOnCreate", "rekindle.reloadOnCreate"),
    ("reloader.reloadOnDelete", "rekindle.reloadOnDelete"),
    ("reloader.syncAfterRestart", "rekindle.syncAfterRestart"),
    ("reloader.namespaceSelector", "rekindle.namespaceSelector"),
    (
        "reloader.resourceLabelSelector",
        "rekindle.resourceLabelSelector",
    ),
    ("reloader.logFormat", "rekindle.logFormat"),
    ("reloader.logLevel", "rekindle.logLevel"),
    ("reloader.enableHA", "rekindle.enableHA"),
    (
        "reloader.enableMetricsByNamespace",
        "rekindle.metricsCountByNamespace",
    ),
    ("reloader.webhookUrl", "rekindle.webhookUrl"),
    ("reloader.deployment.replicas", "replicaCount"),
    (
        "reloader.deployment.revisionHistoryLimit",
        "revisionHistoryLimit",
    ),
    ("reloader.deployment.nodeSelector", "nodeSelector"),
    ("reloader.deployment.affinity", "affinity"),
    ("reloader.deployment.tolerations", "tolerations"),
    (
        "reloader.deployment.topologySpreadConstraints",
        "topologySpreadConstraints",
    ),
    ("reloader.deployment.volumeMounts", "extraVolumeMounts"),
    ("reloader.deployment.volumes", "extraVolumes"),
    ("reloader.deployment.securityContext", "podSecurityContext"),
    (
        "reloader.deployment.containerSecurityContext",
        "containerSecurityContext",
    ),
    ("reloader.deployment.annotations", "deploymentAnnotations"),
    ("reloader.deployment.labels", "deploymentLabels"),
    ("reloader.deployment.livenessProbe", "livenessProbe"),
    ("reloader.deployment.readinessProbe", "readinessProbe"),
    ("reloader.deployment.resources", "resources"),
    ("reloader.deployment.pod.annotations", "podAnnotations"),
    ("reloader.deployment.priorityClassName", "priorityClassName"),
    ("reloader.deployment.imagePullSecrets", "imagePullSecrets"),
    ("reloader.service.labels", "service.labels"),
    ("reloader.service.annotations", "service.annotations"),
    ("reloader.service.port", "metrics.port"),
    ("reloader.rbac.enabled", "rbac.create"),
    ("reloader.serviceAccount.create", "serviceAccount.create"),
    (
        "reloader.serviceAccount.annotations",
        "serviceAccount.annotations",
    ),
    ("reloader.serviceAccount.name", "serviceAccount.name"),
    (
        "reloader.custom_annotations.configmap",
        "rekindle.annotations.configmap",
    ),
    (
        "reloader.custom_annotations.secret",
        "rekindle.annotations.secret",
    ),
    (
        "reloader.custom_annotations.auto",
        "rekindle.annotations.auto",
    ),
    (
        "reloader.custom_annotations.configmapAuto",
        "rekindle.annotations.configmapAuto",
    ),
    (
        "reloader.custom_annotations.secretAuto",
        "rekindle.annotations.secretAuto",
    ),
    (
        "reloader.custom_annotations.search",
        "rekindle.annotations.search",
    ),
    (
        "reloader.custom_annotations.match",
        "rekindle.annotations.match",
    ),
    (
        "reloader.custom_annotations.ignore",
        "rekindle.annotations.ignore",
    ),
    (
        "reloader.custom_annotations.pausePeriod",
        "rekindle.annotations.pauseDeployment",
    ),
    (
        "reloader.custom_annotations.pauseTime",
        "rekindle.annotations.pauseDeploymentTime",
    ),
    (
        "reloader.podDisruptionBudget.enabled",
        "podDisruptionBudget.enabled",
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
    let (parent, last) = match path.rsplit_once('.') {
        Some((p, l)) => (
            p.split('.')
                .try_fold(&mut *values, |node, key| node.get_mut(key))?,
            l,
        ),
        None => (&mut *values, path),
    };
    let taken = parent.as_object_mut()?.remove(last)?;
    let unset = taken.is_null() || taken.as_object().is_some_and(Map::is_empty);
    (!unset).then_some(taken)
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

/// Whether a value holds anything but defaults: a true, a number, a non-empty string or list.
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(_) => true,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => m.values().any(is_set),
    }
}

fn truthy(v: &Option<Value>) -> bool {
    v.as_ref().and_then(Value::as_bool).unwrap_or(false)
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

/// Converts Reloader's chart values. `namespace` is the release namespace, needed only for
/// `reloader.watchGlobally: false` (Reloader then watches its own namespace). Errors are values
/// Reloader itself refuses.
pub fn migrate(reloader: &Value, namespace: Option<&str>) -> Result<Migration, String> {
    let mut rest = reloader.clone();
    let mut out = json!({});
    let mut warnings = Vec::new();

    for (path, why) in DROPPED {
        // Reloader's defaults (false, "", empty) need no word; anything set does.
        if take(&mut rest, path).is_some_and(|v| is_set(&v)) {
            warnings.push(format!("{path}: not carried over: {why}"));
        }
    }
    for (from, to) in MOVES {
        if let Some(v) = take(&mut rest, from) {
            set(&mut out, to, v);
        }
    }

    let ignore_secrets = truthy(&take(&mut rest, "reloader.ignoreSecrets"));
    let ignore_configmaps = truthy(&take(&mut rest, "reloader.ignoreConfigMaps"));
    match (ignore_secrets, ignore_configmaps) {
        (true, true) => {
            return Err(
                "reloader.ignoreSecrets and reloader.ignoreConfigMaps are both true: nothing would be watched".into(),
            )
        }
        (true, false) => set(&mut out, "rekindle.resourcesToIgnore", json!("secrets")),
        (false, true) => set(&mut out, "rekindle.resourcesToIgnore", json!("configMaps")),
        (false, false) => {}
    }
    let mut ignored_types = Vec::new();
    if truthy(&take(&mut rest, "reloader.ignoreJobs")) {
        ignored_types.push(json!("jobs"));
    }
    if truthy(&take(&mut rest, "reloader.ignoreCronJobs")) {
        ignored_types.push(json!("cronjobs"));
    }
    if !ignored_types.is_empty() {
        set(
            &mut out,
            "rekindle.ignoredWorkloadTypes",
            Value::Array(ignored_types),
        );
    }
    if let Some(strategy) = take(&mut rest, "reloader.reloadStrategy") {
        let mapped = match strategy.as_str() {
            Some("default") | Some("env-vars") | Some("") => "env-vars",
            Some("annotations") => "annotations",
            _ => {
                return Err(format!(
                    "reloader.reloadStrategy: {strategy} is not default, env-vars or annotations"
                ))
            }
        };
        set(&mut out, "rekindle.reloadStrategy", json!(mapped));
    }
    if let Some(list) = take(&mut rest, "reloader.ignoreNamespaces") {
        let names: Vec<Value> = list
            .as_str()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| json!(n))
            .collect();
        if !names.is_empty() {
            set(&mut out, "rekindle.namespacesToIgnore", Value::Array(names));
        }
    }
    if take(&mut rest, "reloader.watchGlobally").and_then(|v| v.as_bool()) == Some(false) {
        match namespace {
            Some(ns) => set(&mut out, "rekindle.namespaces", json!([ns])),
            None => warnings.push(
                "reloader.watchGlobally: false watches only the release namespace: pass --namespace NS to carry it over".into(),
            ),
        }
    }
    if let Some(env) = take(&mut rest, "reloader.deployment.env") {
        let list = env_list(&env, &mut warnings);
        if !list.is_empty() {
            set(&mut out, "rekindle.env", Value::Array(list));
        }
    }
    for monitor in ["serviceMonitor", "podMonitor"] {
        for (from, to) in MONITOR_KEYS {
            let path = format!("reloader.{monitor}.{from}");
            if let Some(v) = take(&mut rest, &path) {
                let ok = match *from {
                    "targetLabels" => monitor == "serviceMonitor",
                    "podTargetLabels" => monitor == "podMonitor",
                    _ => true,
                };
                if ok {
                    set(&mut out, &format!("{monitor}.{to}"), v);
                } else {
                    warnings.push(format!("{path}: not carried over: no such field here"));
                }
            }
        }
    }
    if out.pointer("/rekindle/enableHA").and_then(Value::as_bool) != Some(true)
        && out
            .pointer("/replicaCount")
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 1)
    {
        warnings.push(
            "reloader.deployment.replicas > 1 without reloader.enableHA: rekindle runs one replica (every replica would write)".into(),
        );
    }
    if out.pointer("/rekindle/enableHA").is_none() {
        // Reloader's chart defaults to no leader election and one replica; keep that behaviour.
        set(&mut out, "rekindle.enableHA", json!(false));
    }

    let mut unknown = Vec::new();
    leaves(&rest, "", &mut unknown);
    for key in unknown {
        warnings.push(format!("{key}: not carried over: not a key rekindle knows"));
    }
    Ok(Migration {
        values: out,
        warnings,
    })
}

/// Reloader's `deployment.env` (`open`, `secret`, `field`, `existing`) as a list of env vars.
fn env_list(env: &Value, warnings: &mut Vec<String>) -> Vec<Value> {
    let mut out = Vec::new();
    let pairs = |key: &str| {
        env.get(key)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    for (name, value) in pairs("open") {
        out.push(json!({"name": name, "value": scalar(&value)}));
    }
    let secret = pairs("secret");
    if !secret.is_empty() {
        warnings.push("reloader.deployment.env.secret: written as plain env values (Reloader's chart put them in a Secret); move them to a Secret and use env.existing".into());
    }
    for (name, value) in secret {
        out.push(json!({"name": name, "value": scalar(&value)}));
    }
    for (name, path) in pairs("field") {
        out.push(json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": scalar(&path)}}}));
    }
    for (secret_name, keys) in pairs("existing") {
        for (name, key) in keys.as_object().cloned().unwrap_or_default() {
            out.push(json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": scalar(&key)}}}));
        }
    }
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The command: reads `file`, prints rekindle's values as YAML on stdout and the warnings on stderr.
pub fn run(file: &std::path::Path, namespace: Option<&str>) -> anyhow::Result<()> {
    use anyhow::Context;
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let values: Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("{} is not a YAML values file", file.display()))?;
    let migration = migrate(&values, namespace).map_err(anyhow::Error::msg)?;
    for w in &migration.warnings {
        eprintln!("warning: {w}");
    }
    println!(
        "# rekindle chart values converted from {} by `rekindle migrate-values`.",
        file.display()
    );
    print!("{}", serde_saphyr::to_string(&migration.values)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_renames_and_splits_reloaders_keys() {
        let reloader = json!({"reloader": {
            "ignoreSecrets": true, "ignoreJobs": true, "ignoreCronJobs": true,
            "reloadStrategy": "default", "ignoreNamespaces": "a, b,", "watchGlobally": false,
            "enableHA": true, "enablePProf": true, "custom_annotations": {"auto": "x/auto", "bogus": "y"},
            "deployment": {"replicas": 3, "env": {"open": {"A": "1"}, "field": {"P": "metadata.name"},
                "existing": {"s": {"K": "k"}}}, "nodeSelector": null, "pod": {"annotations": {}}},
            "serviceMonitor": {"enabled": true, "timeout": "5s", "podTargetLabels": ["x"]},
        }});
        let m = migrate(&reloader, Some("tools")).unwrap();
        let v = &m.values;
        assert_eq!(v["rekindle"]["resourcesToIgnore"], "secrets");
        assert_eq!(
            v["rekindle"]["ignoredWorkloadTypes"],
            json!(["jobs", "cronjobs"])
        );
        assert_eq!(v["rekindle"]["reloadStrategy"], "env-vars");
        assert_eq!(v["rekindle"]["namespacesToIgnore"], json!(["a", "b"]));
        assert_eq!(v["rekindle"]["namespaces"], json!(["tools"]));
        assert_eq!(v["rekindle"]["enableHA"], true);
        assert_eq!(v["rekindle"]["annotations"]["auto"], "x/auto");
        assert_eq!(v["replicaCount"], 3);
        assert_eq!(v["serviceMonitor"]["scrapeTimeout"], "5s");
        assert_eq!(
            v["rekindle"]["env"],
            json!([{"name": "A", "value": "1"},
                   {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                   {"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
        );
        assert!(v.get("nodeSelector").is_none(), "unset values stay unset");
        let warned = m.warnings.join("\n");
        for key in [
            "reloader.enablePProf",
            "reloader.custom_annotations.bogus",
            "reloader.serviceMonitor.podTargetLabels",
        ] {
            assert!(warned.contains(key), "{key} in {warned}");
        }
        assert_eq!(m.warnings.len(), 3, "{warned}");
    }

    #[test]
    fn refuses_what_reloader_refuses_and_keeps_its_single_replica_default() {
        let both = json!({"reloader": {"ignoreSecrets": true, "ignoreConfigMaps": true}});
        assert!(migrate(&both, None).unwrap_err().contains("both true"));
        let bad = json!({"reloader": {"reloadStrategy": "restart"}});
        assert!(migrate(&bad, None).is_err());
        let m = migrate(
            &json!({"reloader": {"deployment": {"replicas": 2}, "watchGlobally": false}}),
            None,
        )
        .unwrap();
        assert_eq!(m.values["rekindle"]["enableHA"], false);
        assert_eq!(m.warnings.len(), 2, "{:?}", m.warnings);
    }
}
