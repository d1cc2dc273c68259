//! The offline tools `rekindle hash` and `rekindle explain` (the same core the server uses, on files),
//! and the `rekindle healthcheck` probe.

use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::{json, Value};

use crate::cli::{EventArg, Output};
use crate::core::envname::env_var_name;
use crate::core::hash::{configmap_hash_typed, secret_hash_typed, spcps_hash_json};
use crate::core::patch;
use crate::core::plan::{self, Change, Event, PlanConfig};
use crate::core::policy::ResourceFlags;
use crate::core::{ResourceKind, WorkloadKind};

/// Reads every document of a YAML or JSON file (`-` is standard input); `List` objects are expanded.
pub fn read_documents(path: &Path) -> Result<Vec<Value>> {
    let mut text = String::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
    } else {
        text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| anyhow!("{}: not valid YAML or JSON: {e}", path.display()))?;
    let mut out = Vec::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        if doc
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"))
        {
            out.extend(
                doc.get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            );
        } else {
            out.push(doc);
        }
    }
    Ok(out)
}

/// A hashed configuration resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Hashed {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// The resource a workload names: for an SPCPS, its SecretProviderClass.
    pub resource_kind: ResourceKind,
    pub resource_name: String,
    pub hash: String,
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl Hashed {
    pub fn env_var(&self) -> String {
        env_var_name(&self.resource_name, self.resource_kind)
    }
}

fn meta_str(doc: &Value, field: &str) -> Option<String> {
    doc.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .map(String::from)
}

/// Hashes one ConfigMap, Secret or SecretProviderClassPodStatus document.
pub fn hash_document(doc: &Value) -> Result<Hashed> {
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("document has no kind"))?;
    let name = meta_str(doc, "name").ok_or_else(|| anyhow!("{kind} has no metadata.name"))?;
    let namespace = meta_str(doc, "namespace");
    let annotations = doc
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let (resource_kind, resource_name, hash) = match kind {
        "ConfigMap" => {
            let cm: ConfigMap =
                serde_json::from_value(doc.clone()).with_context(|| format!("ConfigMap {name}"))?;
            (
                ResourceKind::ConfigMap,
                name.clone(),
                configmap_hash_typed(&cm),
            )
        }
        "Secret" => {
            let s: Secret = serde_json::from_value(doc.clone())
                .with_context(|| format!("Secret {name}: data values must be base64"))?;
            (ResourceKind::Secret, name.clone(), secret_hash_typed(&s))
        }
        "SecretProviderClassPodStatus" => {
            let (class, hash) = spcps_hash_json(doc).ok_or_else(|| {
                anyhow!("SecretProviderClassPodStatus {name} has no status.secretProviderClassName")
            })?;
            (ResourceKind::SecretProviderClass, class, hash)
        }
        other => {
            bail!("{other} {name}: expected a ConfigMap, Secret or SecretProviderClassPodStatus")
        }
    };
    Ok(Hashed {
        kind: kind.to_string(),
        namespace,
        name,
        resource_kind,
        resource_name,
        hash,
        annotations,
    })
}

pub fn run_hash(file: &Path, output: Output) -> Result<()> {
    for doc in read_documents(file)? {
        let h = hash_document(&doc)?;
        match output {
            Output::Text => println!(
                "{}/{}/{} {} {}",
                h.kind,
                h.namespace.as_deref().unwrap_or("-"),
                h.name,
                h.hash,
                h.env_var()
            ),
            Output::Json => println!(
                "{}",
                json!({"kind": h.kind, "namespace": h.namespace, "name": h.name, "hash": h.hash, "envVar": h.env_var()})
            ),
        }
    }
    Ok(())
}

fn single(path: &Path, what: &str) -> Result<Value> {
    let mut docs = read_documents(path)?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        n => bail!(
            "{}: expected exactly one {what} document, found {n}",
            path.display()
        ),
    }
}

/// Builds the explanation object of `rekindle explain -o json`.
pub fn explain(
    cfg: &PlanConfig,
    workload: &Value,
    changed: &Value,
    event: EventArg,
    now: i64,
) -> Result<Value> {
    let kind_name = workload
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("the workload has no kind"))?;
    let kind: WorkloadKind = kind_name.parse()?;
    let res = hash_document(changed)?;
    let flags = ResourceFlags::from_annotations(&cfg.policy.keys, &res.annotations);
    let namespace = res
        .namespace
        .clone()
        .or_else(|| meta_str(workload, "namespace"))
        .unwrap_or_default();
    let event = match event {
        EventArg::Update => Event::Update,
        EventArg::Create => Event::Create,
        EventArg::Delete => Event::Delete,
    };
    let change = Change {
        kind: res.resource_kind,
        name: &res.resource_name,
        namespace: &namespace,
        hash: &res.hash,
        flags,
        event,
    };
    let p = plan::plan(cfg, workload, kind, &change, now);
    let patch = if p.changes.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(patch::render(workload, kind, &p.changes)?)?
    };
    Ok(json!({
        "workload": {"kind": kind_name, "namespace": meta_str(workload, "namespace"), "name": meta_str(workload, "name")},
        "resource": {"kind": res.resource_kind.kind_name(), "namespace": res.namespace, "name": res.resource_name, "hash": res.hash},
        "reload": p.decision.reload,
        "reason": p.decision.reason.as_str(),
        "action": p.action,
        "container": p.container.map(|c| c.name),
        "patch": patch,
        "invalidPatterns": p.decision.invalid_patterns.iter().map(|i| json!({"annotation": i.annotation, "pattern": i.pattern, "error": i.error})).collect::<Vec<_>>(),
    }))
}

pub fn run_explain(
    cfg: &PlanConfig,
    workload: &Path,
    changed: &Path,
    event: EventArg,
    output: Output,
) -> Result<()> {
    let w = single(workload, "workload")?;
    let c = single(changed, "changed resource")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let e = explain(cfg, &w, &c, event, now)?;
    match output {
        Output::Json => println!("{e}"),
        Output::Text => {
            let w = &e["workload"];
            let r = &e["resource"];
            println!(
                "workload:  {}/{}/{}",
                w["kind"].as_str().unwrap_or(""),
                w["namespace"].as_str().unwrap_or("-"),
                w["name"].as_str().unwrap_or("")
            );
            println!(
                "resource:  {}/{}/{} hash {}",
                r["kind"].as_str().unwrap_or(""),
                r["namespace"].as_str().unwrap_or("-"),
                r["name"].as_str().unwrap_or(""),
                r["hash"].as_str().unwrap_or("")
            );
            println!(
                "reload:    {} ({})",
                if e["reload"] == true { "yes" } else { "no" },
                e["reason"].as_str().unwrap_or("")
            );
            println!("action:    {}", e["action"].as_str().unwrap_or(""));
            if let Some(c) = e["container"].as_str() {
                println!("container: {c}");
            }
            for i in e["invalidPatterns"].as_array().into_iter().flatten() {
                println!(
                    "warning:   invalid pattern {} in {}: {}",
                    i["pattern"],
                    i["annotation"],
                    i["error"].as_str().unwrap_or("")
                );
            }
            if !e["patch"].is_null() {
                println!("patch:     {}", serde_json::to_string_pretty(&e["patch"])?);
            }
        }
    }
    Ok(())
}

/// `rekindle healthcheck`: GETs each URL over plain HTTP (the admin server) and fails unless all answer
/// 2xx. For container probes and `helm test`, where the image has no curl.
pub fn run_healthcheck(urls: &[String], timeout: std::time::Duration) -> Result<()> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    use hyper_util::rt::TokioExecutor;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client: Client<HttpConnector, Empty<axum::body::Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        for url in urls {
            let uri: hyper::Uri = url.parse().with_context(|| format!("--url {url:?}"))?;
            if uri.scheme_str() != Some("http") {
                bail!("--url {url:?}: only http:// URLs (the admin server) are probed");
            }
            let response = tokio::time::timeout(timeout, client.get(uri))
                .await
                .map_err(|_| anyhow!("{url}: no answer within {timeout:?}"))?
                .with_context(|| url.clone())?;
            let status = response.status();
            let body = tokio::time::timeout(timeout, response.into_body().collect())
                .await
                .map_err(|_| anyhow!("{url}: body not read within {timeout:?}"))?
                .with_context(|| url.clone())?
                .to_bytes();
            if !status.is_success() {
                bail!(
                    "{url}: {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
                );
            }
            println!("{url}: {status}");
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_manifests_with_string_data() {
        let docs: Vec<Value> = serde_saphyr::from_multiple(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {password: initial}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: my.app.config, namespace: ns}\ndata: {test.url: www.stakater.com}\n",
        )
        .unwrap();
        let s = hash_document(&docs[0]).unwrap();
        assert_eq!(s.hash, "c89820d4c89a3faac2e18b569de03dfe4d818f5e");
        assert_eq!(s.env_var(), "STAKATER_S_SECRET");
        let c = hash_document(&docs[1]).unwrap();
        assert_eq!(c.hash, "3c9a892aeaedc759abc3df9884a37b8be5680382");
        assert_eq!(c.env_var(), "STAKATER_MY_APP_CONFIG_CONFIGMAP");
        assert!(hash_document(&json!({"kind": "Pod", "metadata": {"name": "p"}})).is_err());
    }

    #[test]
    fn explain_reports_patch_and_already_current() {
        let cfg = PlanConfig::default();
        let workload = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ns", "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "c"}}]}]}}}});
        let cm = json!({"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}});
        let e = explain(&cfg, &workload, &cm, EventArg::Update, 0).unwrap();
        assert_eq!(e["reload"], true);
        assert_eq!(e["reason"], "auto");
        assert_eq!(e["action"], "patch");
        assert_eq!(e["container"], "app");
        let ops: json_patch::Patch = serde_json::from_value(e["patch"].clone()).unwrap();
        let mut after = workload.clone();
        json_patch::patch(&mut after, &ops).unwrap();
        let again = explain(&cfg, &after, &cm, EventArg::Update, 0).unwrap();
        assert_eq!(again["reload"], false);
        assert_eq!(again["reason"], "already-current");
        assert!(again["patch"].is_null());
    }
}
