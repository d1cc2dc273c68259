//! The Helm chart in tests: rendering it with the cached helm, and installing its RBAC so rekindle
//! runs with exactly the permissions the chart grants (a client certificate for the chart's
//! ServiceAccount name; RBAC matches ServiceAccount subjects by user name).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::{apply_value, kubeconfig_path, root, state_dir};

/// Runs the cached helm (`e2e/scripts/helm.sh`, built from its Go module on first use).
pub fn helm(args: &[&str]) -> Result<String> {
    let out = Command::new(root().join("e2e/scripts/helm.sh"))
        .args(args)
        .output()
        .context("running e2e/scripts/helm.sh")?;
    if !out.status.success() {
        bail!(
            "helm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// `helm template` of the chart as JSON documents (hooks included unless `--no-hooks` is passed).
pub fn render(release: &str, namespace: &str, args: &[&str]) -> Result<Vec<Value>> {
    let chart = root().join("charts/rekindle");
    let chart = chart.to_string_lossy();
    // No --kube-version: helm renders for the Kubernetes its client library is built against, as the
    // release build users run does (e2e/scripts/build-binaries.sh builds it that way).
    let mut all = vec!["template", release, &chart, "--namespace", namespace];
    all.extend_from_slice(args);
    let yaml = helm(&all)?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&yaml).map_err(|e| anyhow!("chart output is not YAML: {e}"))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

pub fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

pub fn name_of(doc: &Value) -> &str {
    doc.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

pub fn is_hook(doc: &Value) -> bool {
    doc.pointer("/metadata/annotations/helm.sh~1hook").is_some()
}

/// Documents of one kind.
pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind_of(d) == kind).collect()
}

/// Issues a client certificate for `user` (with `groups`) from the test CA and writes a kubeconfig
/// using it; returns the kubeconfig's path.
pub fn identity_kubeconfig(file_name: &str, user: &str, groups: &[&str]) -> Result<PathBuf> {
    let pki = state_dir().join("pki");
    let mut cmd = Command::new(root().join("target/debug/certs-gen"));
    cmd.args(["client", "--out"])
        .arg(&pki)
        .args(["--name", file_name, "--cn", user]);
    for g in groups {
        cmd.args(["--org", g]);
    }
    let status = cmd.status().context("running certs-gen client")?;
    if !status.success() {
        bail!("certs-gen client failed for {user}");
    }
    let mut kc = Kubeconfig::read_from(kubeconfig_path())?;
    for info in kc
        .auth_infos
        .iter_mut()
        .filter_map(|u| u.auth_info.as_mut())
    {
        info.client_certificate = Some(pki.join(format!("{file_name}.crt")).display().to_string());
        info.client_key = Some(pki.join(format!("{file_name}.key")).display().to_string());
    }
    let path = state_dir().join(format!("{file_name}.kubeconfig"));
    // JSON is YAML: every kubeconfig reader takes it.
    std::fs::write(&path, serde_json::to_string_pretty(&kc)?)?;
    Ok(path)
}

/// A ServiceAccount's user name and groups, as the apiserver authenticates its tokens.
pub fn service_account_identity(namespace: &str, name: &str) -> (String, Vec<String>) {
    (
        format!("system:serviceaccount:{namespace}:{name}"),
        vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{namespace}"),
        ],
    )
}

/// Values that switch on every optional rule, so the RBAC covers every feature test, and keep the
/// chart's webhook configuration from matching anything (its Service has no real endpoints here).
pub const ALL_FEATURES: &[&str] = &[
    "--set",
    "certs.mode=certsGen",
    "--set",
    "rekindle.isArgoRollouts=true",
    "--set",
    "rekindle.isOpenshift=true",
    "--set",
    "rekindle.enableCSIIntegration=true",
    "--set",
    "rekindle.namespaceSelector=rekindle-e2e=chart",
    "--set",
    "webhook.namespaceSelector.matchLabels.rekindle-e2e-chart-webhook=never",
];

/// Installs the chart's non-hook objects into `namespace` (server-side apply, as the admin) and
/// returns the objects applied.
pub async fn install(
    client: &Client,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> Result<Vec<Value>> {
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.patch(
        namespace,
        &PatchParams::apply("rekindle-e2e").force(),
        &Patch::Apply(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        ),
    )
    .await
    .with_context(|| format!("creating namespace {namespace}"))?;
    let mut all = args.to_vec();
    all.push("--no-hooks");
    let docs = render(release, namespace, &all)?;
    for doc in &docs {
        apply_value(client, Some(namespace), doc.clone()).await?;
    }
    Ok(docs)
}

/// The kubeconfig of the chart's ServiceAccount, after installing the chart into `namespace`.
pub async fn install_identity(client: &Client, release: &str, namespace: &str) -> Result<PathBuf> {
    let docs = install(client, release, namespace, ALL_FEATURES).await?;
    // The server's ServiceAccount (the chart renders others, for certs-gen's renewal CronJob).
    let sa = of_kind(&docs, "Deployment")
        .first()
        .and_then(|d| d.pointer("/spec/template/spec/serviceAccountName"))
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| anyhow!("the chart rendered no Deployment with a ServiceAccount"))?;
    let (user, groups) = service_account_identity(namespace, &sa);
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    identity_kubeconfig(&format!("chart-{namespace}"), &user, &groups)
}

/// Where the webhook-config/ manifests are rendered from.
pub fn webhook_config_dir() -> PathBuf {
    root().join("webhook-config")
}

/// Renders webhook-config/ into `out` with the same script `just webhook-config` runs.
pub fn render_webhook_config(out: &Path) -> Result<()> {
    let status = Command::new(root().join("e2e/scripts/render-webhook-config.sh"))
        .arg(out)
        .status()?;
    if !status.success() {
        bail!("render-webhook-config.sh failed");
    }
    Ok(())
}
