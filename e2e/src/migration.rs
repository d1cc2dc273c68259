//! What a rendered chart makes the controller do, read the same way from Reloader's chart and from
//! rekindle's: the facts of a render (the server's arguments and environment, replicas, pod fields, the
//! RBAC granted to its ServiceAccount, the Service's IP families), and the behaviour those facts give,
//! with the arguments and environment parsed by rekindle's own flag parser (which takes Reloader's
//! flags with Reloader's syntax).
//!
//! `e2e/fixtures/migrate/cases/` holds, per case, a Reloader values file and the facts Reloader's chart
//! rendered for it (`cargo run -p e2e --bin reloader_chart_facts -- <Reloader's chart directory>`
//! records them); the chart test converts each values file with `rekindle migrate-values`, renders
//! rekindle's chart, and compares the behaviour.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::chart::{kind_of, name_of, of_kind};

/// The release both charts are rendered as, and its namespace.
pub const RELEASE: &str = "reloader";
pub const NAMESPACE: &str = "tools";

/// APIs both renders are told exist, so that every optional RBAC rule and object can render.
pub const API_VERSIONS: &[&str] = &[
    "argoproj.io/v1alpha1",
    "apps.openshift.io/v1",
    "autoscaling.k8s.io/v1",
    "monitoring.coreos.com/v1",
];

/// Pod fields that place or shape the controller's pod, compared as they are.
const POD_FIELDS: &[&str] = &[
    "nodeSelector",
    "affinity",
    "tolerations",
    "topologySpreadConstraints",
    "priorityClassName",
    "runtimeClassName",
    "schedulerName",
    "hostUsers",
    "dnsConfig",
    "automountServiceAccountToken",
    "imagePullSecrets",
    "securityContext",
];

/// Environment each chart sets for its own machinery (Go runtime, its own names, the downward API of
/// leader election), not configuration.
const CHART_ENV: &[&str] = &[
    "GOMAXPROCS",
    "GOMEMLIMIT",
    "RELOADER_NAMESPACE",
    "RELOADER_DEPLOYMENT_NAME",
    "POD_NAME",
    "POD_NAMESPACE",
];

/// What a render sets up for the controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    pub args: Vec<String>,
    /// Environment of the container, each variable's value resolved: a literal, `field:<path>`,
    /// `secret:<name>/<key>` (a Secret the chart does not create), or the value of the chart's own Secret.
    pub env: BTreeMap<String, String>,
    pub replicas: i64,
    /// The fields of POD_FIELDS the render sets.
    pub pod: BTreeMap<String, Value>,
    pub read_only_root: bool,
    /// Per scope (a namespace, or `*` for a ClusterRole), what the ServiceAccount may do: `verb resource`.
    pub rbac: BTreeMap<String, BTreeSet<String>>,
    /// The IP family settings of the chart's Service, when the chart renders one.
    pub service_ip: BTreeMap<String, Value>,
}

/// Reads the facts of one render (both charts run one container).
pub fn facts(docs: &[Value]) -> Result<Facts> {
    let deployments: Vec<_> = of_kind(docs, "Deployment");
    let [deployment] = deployments.as_slice() else {
        bail!("expected one Deployment, got {}", deployments.len());
    };
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let chart_secrets: BTreeMap<(String, String), String> = of_kind(docs, "Secret")
        .into_iter()
        .flat_map(|s| {
            let name = name_of(s).to_string();
            s["data"]
                .as_object()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |(k, v)| {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(v.as_str().unwrap_or_default())
                        .unwrap_or_default();
                    (
                        (name.clone(), k),
                        String::from_utf8_lossy(&bytes).into_owned(),
                    )
                })
        })
        .collect();
    let mut env = BTreeMap::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap_or_default().to_string();
        let value = if let Some(v) = e.get("value") {
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
        } else if let Some(path) = e.pointer("/valueFrom/fieldRef/fieldPath") {
            format!("field:{}", path.as_str().unwrap_or_default())
        } else if let Some(r) = e.pointer("/valueFrom/secretKeyRef") {
            let key = (
                r["name"].as_str().unwrap_or_default().to_string(),
                r["key"].as_str().unwrap_or_default().to_string(),
            );
            chart_secrets
                .get(&key)
                .cloned()
                .unwrap_or_else(|| format!("secret:{}/{}", key.0, key.1))
        } else {
            format!("other:{}", e["valueFrom"])
        };
        env.insert(name, value);
    }
    let args = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            a.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| a.to_string())
        })
        .collect();
    let pod_fields = POD_FIELDS
        .iter()
        .filter_map(|f| {
            pod.get(*f)
                .filter(|v| !v.is_null())
                .map(|v| (f.to_string(), v.clone()))
        })
        .collect();
    let service_ip = of_kind(docs, "Service")
        .first()
        .map(|s| {
            ["ipFamilyPolicy", "ipFamilies"]
                .iter()
                .filter_map(|k| s["spec"].get(*k).map(|v| (k.to_string(), v.clone())))
                .collect()
        })
        .unwrap_or_default();
    let account = pod["serviceAccountName"].as_str().unwrap_or("default");
    Ok(Facts {
        args,
        env,
        replicas: deployment["spec"]["replicas"].as_i64().unwrap_or(1),
        pod: pod_fields,
        read_only_root: c["securityContext"]["readOnlyRootFilesystem"] == json!(true),
        rbac: rbac(docs, account),
        service_ip,
    })
}

/// What each Role and ClusterRole bound to `account` grants, per scope.
fn rbac(docs: &[Value], account: &str) -> BTreeMap<String, BTreeSet<String>> {
    let bound = |binding: &Value| {
        binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == account)
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (binding_kind, role_kind) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        for b in of_kind(docs, binding_kind).into_iter().filter(|b| bound(b)) {
            let scope = match binding_kind {
                "ClusterRoleBinding" => "*".to_string(),
                _ => b["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            };
            let role_name = b["roleRef"]["name"].as_str().unwrap_or_default();
            let role = docs.iter().find(|d| {
                kind_of(d) == role_kind
                    && name_of(d) == role_name
                    && (role_kind == "ClusterRole" || d["metadata"]["namespace"] == scope.as_str())
            });
            for rule in role
                .into_iter()
                .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
            {
                for res in rule["resources"].as_array().into_iter().flatten() {
                    for verb in rule["verbs"].as_array().into_iter().flatten() {
                        out.entry(scope.clone()).or_default().insert(format!(
                            "{} {}",
                            verb.as_str().unwrap_or_default(),
                            res.as_str().unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    out
}

/// The controller a render runs, in terms both charts can be compared in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Behaviour {
    /// The validated configuration rekindle's parser makes of the arguments and environment, with
    /// what only rekindle has (its server's ports, certificates, timings) left out.
    pub config: BTreeMap<&'static str, String>,
    /// Environment that is neither chart machinery nor read by the parser (the ALERT_* variables are).
    pub extra_env: BTreeMap<String, String>,
    pub replicas: i64,
    pub pod: BTreeMap<String, Value>,
    /// The scopes the ServiceAccount may patch Deployments in: where the controller acts.
    pub acts_in: BTreeSet<String>,
    pub service_ip: BTreeMap<String, Value>,
}

/// Parses a render's arguments and environment with rekindle's flag parser.
pub fn behaviour(f: &Facts) -> Result<Behaviour> {
    let cli = rekindle::config::Cli::try_parse_from(
        std::iter::once("rekindle".to_string()).chain(f.args.iter().cloned()),
    )
    .map_err(|e| anyhow!("rekindle's parser refuses {:?}: {e}", f.args))?;
    let lookup = |name: &str| {
        f.env.get(name).map(|v| match v.as_str() {
            "field:metadata.namespace" => NAMESPACE.to_string(),
            other => other.to_string(),
        })
    };
    let (cfg, _warnings) = rekindle::config::Config::from_args(&cli.server, lookup)
        .map_err(|e| anyhow!("rekindle refuses {:?}: {e}", f.args))?;
    let config = BTreeMap::from([
        ("annotations, strategy, events", format!("{:?}", cfg.plan)),
        ("log", format!("{:?} {}", cfg.log_format, cfg.log_level)),
        ("webhook url", format!("{:?}", cfg.webhook_url)),
        (
            "ignored resources",
            format!(
                "configmaps {} secrets {}",
                cfg.ignore_configmaps, cfg.ignore_secrets
            ),
        ),
        ("scope", format!("{:?}", cfg.scope)),
        (
            "resource label selector",
            format!("{:?}", cfg.resource_label_selector),
        ),
        ("argo rollouts", cfg.argo_rollouts.to_string()),
        ("leader election", cfg.leader_election.enable_ha.to_string()),
        ("sync after restart", cfg.sync_after_restart.to_string()),
        ("csi", cfg.enable_csi.to_string()),
        (
            "metrics by namespace",
            cfg.metrics_count_by_namespace.to_string(),
        ),
        ("alerts", format!("{:?}", cfg.alerts)),
    ]);
    let extra_env = f
        .env
        .iter()
        .filter(|(k, _)| {
            !CHART_ENV.contains(&k.as_str())
                && !k.starts_with("ALERT_")
                && *k != "KUBERNETES_NAMESPACE"
                && *k != "METRICS_COUNT_BY_NAMESPACE"
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let acts_in = f
        .rbac
        .iter()
        .filter(|(_, grants)| grants.iter().any(|g| g == "patch deployments"))
        .map(|(scope, _)| scope.clone())
        .collect();
    Ok(Behaviour {
        config,
        extra_env,
        replicas: f.replicas,
        pod: f.pod.clone(),
        acts_in,
        service_ip: f.service_ip.clone(),
    })
}

/// Grants of Reloader's that rekindle's ServiceAccount lacks (each scope's grants, or the cluster's).
/// Left out: the meta-info ConfigMap Reloader writes about itself (rekindle publishes none), and writes
/// by `update`, which rekindle never issues (it patches). Leases, which Reloader's ClusterRole grants
/// everywhere, are needed in the controller's own namespace only, where rekindle's Role grants them.
pub fn missing_grants(reloader: &Facts, rekindle: &Facts) -> Vec<String> {
    let has = |scope: &str, grant: &str| {
        [scope, "*"]
            .iter()
            .any(|s| rekindle.rbac.get(*s).is_some_and(|g| g.contains(grant)))
    };
    let mut missing = Vec::new();
    for (scope, grants) in &reloader.rbac {
        for g in grants {
            let scope = if g.ends_with(" leases") {
                NAMESPACE
            } else {
                scope
            };
            let skip = matches!(g.as_str(), "create configmaps" | "update configmaps")
                || g.starts_with("update ");
            if !skip && !has(scope, g) {
                missing.push(format!("{scope}: {g}"));
            }
        }
    }
    missing
}

/// The differences between two behaviours, field by field (`config.<key>` for the configuration).
pub fn differences(want: &Behaviour, got: &Behaviour) -> Result<Vec<String>> {
    let (want, got) = (serde_json::to_value(want)?, serde_json::to_value(got)?);
    let mut out = Vec::new();
    let fields = |v: &Value| v.as_object().cloned().unwrap_or_default();
    for (key, w) in fields(&want) {
        let g = &got[&key];
        if key == "config" {
            for (k, wv) in fields(&w) {
                if g[&k] != wv {
                    out.push(format!("config.{k}: Reloader {wv}, rekindle {}", g[&k]));
                }
            }
        } else if g != &w {
            out.push(format!("{key}: Reloader {w}, rekindle {g}"));
        }
    }
    Ok(out)
}

/// One case: Reloader's values and what Reloader's chart rendered for them.
pub struct Case {
    pub name: String,
    pub values: PathBuf,
    pub recorded: PathBuf,
}

pub fn cases() -> Result<Vec<Case>> {
    let dir = crate::root().join("e2e/fixtures/migrate/cases");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if let Some(name) = file.strip_suffix(".values.yaml") {
            out.push(Case {
                name: name.to_string(),
                recorded: dir.join(format!("{name}.reloader.yaml")),
                values: path,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The `--api-versions` arguments of both renders.
pub fn api_version_args() -> Vec<&'static str> {
    API_VERSIONS
        .iter()
        .flat_map(|v| ["--api-versions", v])
        .collect()
}
