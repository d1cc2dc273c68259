//! Helpers for rekindle's end-to-end tests against the real control plane started by
//! `e2e/scripts/cluster.sh up` (`just cluster-up`).

pub mod chart;
pub mod companions;
pub mod csi;
pub mod fixtures;
pub mod migration;
pub mod node;
pub mod policy;
pub mod prometheus;
pub mod proxy;
pub mod rekindle;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, ApiCapabilities, ApiResource, Scope};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The series docs/reference.md's metrics table lists (its first column; `a`, `b` rows name several):
/// what the install tests scrape from real pods.
pub fn documented_series() -> Result<Vec<String>> {
    let reference = std::fs::read_to_string(root().join("docs/reference.md"))?;
    let section = reference
        .split("\n## Metrics")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .ok_or_else(|| anyhow::anyhow!("docs/reference.md has no Metrics section"))?;
    let mut names = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap_or_default();
        names.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
    }
    anyhow::ensure!(names.len() > 30, "too few series documented: {names:?}");
    Ok(names)
}

/// Where the cluster keeps its state (`target/e2e`, or `REKINDLE_E2E_STATE`).
pub fn state_dir() -> PathBuf {
    std::env::var_os("REKINDLE_E2E_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/e2e"))
}

pub fn kubeconfig_path() -> PathBuf {
    state_dir().join("kubeconfig")
}

/// The rekindle binary under test: `REKINDLE_BIN`, else `target/release/rekindle`, else `target/debug/rekindle`.
pub fn rekindle_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("REKINDLE_BIN") {
        // Relative to the workspace root (test binaries run in their crate's directory).
        return Ok(root().join(p));
    }
    let candidates = [
        root().join("target/release/rekindle"),
        root().join("target/debug/rekindle"),
    ];
    candidates
        .into_iter()
        .filter(|p| p.exists())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .ok_or_else(|| anyhow!("no rekindle binary: run `cargo build` (or set REKINDLE_BIN)"))
}

/// A client with the admin credentials of the test cluster.
pub async fn admin_client() -> Result<Client> {
    client_from(&kubeconfig_path()).await
}

pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig).with_context(|| {
        format!(
            "reading {} — is the test cluster up? (`just cluster-up`)",
            kubeconfig.display()
        )
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A client that authenticates with a client certificate and key (PEM files) against the test cluster.
pub async fn client_with_cert(cert: &Path, key: &Path) -> Result<Client> {
    let mut kc = Kubeconfig::read_from(kubeconfig_path())?;
    for user in &mut kc.auth_infos {
        if let Some(info) = user.auth_info.as_mut() {
            info.client_certificate = Some(cert.display().to_string());
            info.client_key = Some(key.display().to_string());
        }
    }
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A kubeconfig for the cluster user `user` (a client certificate signed by the cluster's CA, from
/// `certs-gen client`), written under the state directory with `tag` in its name. What the user may
/// do is up to the caller's RBAC.
pub fn user_kubeconfig(user: &str, tag: &str) -> Result<PathBuf> {
    let pki = state_dir().join("pki");
    let status = std::process::Command::new(root().join("target/debug/certs-gen"))
        .args(["client", "--out"])
        .arg(&pki)
        .args(["--name", user, "--cn", user])
        .status()
        .context("running target/debug/certs-gen (cargo build -p certs-gen)")?;
    if !status.success() {
        bail!("certs-gen client --name {user}: {status}");
    }
    let kubeconfig = std::fs::read_to_string(state_dir().join("rekindle.kubeconfig"))?
        .replace("rekindle.crt", &format!("{user}.crt"))
        .replace("rekindle.key", &format!("{user}.key"));
    let path = state_dir().join(format!("{user}-{tag}.kubeconfig"));
    std::fs::write(&path, kubeconfig)?;
    Ok(path)
}

/// Polls `check` until it yields `Some`, failing with a message naming what it waited for.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    wait_for_every(what, timeout, Duration::from_millis(200), check).await
}

/// [`wait_for`], checking every `interval`.
pub async fn wait_for_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() > timeout {
            let detail = last_err
                .map(|e| format!(" (last error: {e:#})"))
                .unwrap_or_default();
            bail!("timed out after {timeout:?} waiting for {what}{detail}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// A namespace of its own for one test, deleted by [`TestNamespace::cleanup`], or when dropped (a test
/// that fails before its clean-up leaves nothing behind for the next one).
pub struct TestNamespace {
    pub name: String,
    client: Client,
    cleaned: bool,
}

impl TestNamespace {
    pub async fn new(client: &Client, prefix: &str) -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let name = format!(
            "{prefix}-{}-{:05x}",
            std::process::id() % 100_000,
            nanos & 0xfffff
        );
        let ns: Namespace = serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "labels": {"e2e.rekindle.io/test": prefix}}}),
        )?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Self {
            name,
            client: client.clone(),
            cleaned: false,
        })
    }

    /// Leaves the namespace in place (for a look at what a benchmark made) and returns its name.
    pub fn keep(mut self) -> String {
        self.cleaned = true;
        std::mem::take(&mut self.name)
    }

    pub async fn cleanup(mut self) -> Result<()> {
        self.cleaned = true;
        Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::background())
            .await?;
        Ok(())
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // Drop cannot await, and the test's runtime is going away: delete from a thread with a
        // runtime and a client of its own (the cluster the test used: KUBECONFIG, else the e2e one).
        let name = self.name.clone();
        let kubeconfig = std::env::var_os("KUBECONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(kubeconfig_path);
        let deleted = std::thread::spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let client = client_from(&kubeconfig).await?;
                let namespaces = Api::<Namespace>::all(client);
                let params = DeleteParams::background();
                tokio::time::timeout(Duration::from_secs(10), namespaces.delete(&name, &params))
                    .await??;
                Ok(())
            })
        })
        .join();
        if !matches!(deleted, Ok(Ok(()))) {
            eprintln!("could not delete test namespace {}", self.name);
        }
    }
}

/// Resolves a GVK against the cluster (discovery), for objects without Rust types.
pub async fn resource_for(
    client: &Client,
    api_version: &str,
    kind: &str,
) -> Result<(ApiResource, ApiCapabilities)> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Ok(pinned_kind(client, &GroupVersionKind::gvk(group, version, kind)).await?)
}

/// A dynamic API for the object's kind, namespaced when the kind is.
pub async fn dynamic_api(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> Result<Api<DynamicObject>> {
    let (ar, caps) = resource_for(client, api_version, kind).await?;
    Ok(match (caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &ar),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &ar),
    })
}

/// Server-side applies every document of a YAML string, into `namespace` for namespaced kinds.
pub async fn apply_yaml(
    client: &Client,
    namespace: Option<&str>,
    yaml: &str,
) -> Result<Vec<DynamicObject>> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| anyhow!("bad YAML: {e}"))?;
    let mut out = Vec::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        out.push(apply_value(client, namespace, doc).await?);
    }
    Ok(out)
}

pub async fn apply_value(
    client: &Client,
    namespace: Option<&str>,
    doc: Value,
) -> Result<DynamicObject> {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("document without apiVersion"))?;
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("document without kind"))?;
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("{kind} without metadata.name"))?;
    let api = dynamic_api(client, api_version, kind, namespace).await?;
    let obj = api
        .patch(
            name,
            &PatchParams::apply("rekindle-e2e").force(),
            &Patch::Apply(&doc),
        )
        .await
        .with_context(|| format!("applying {kind}/{name}"))?;
    Ok(obj)
}

/// The object as JSON.
pub async fn get_json(api: &Api<DynamicObject>, name: &str) -> Result<Value> {
    Ok(serde_json::to_value(api.get(name).await?)?)
}

/// Names of the ReplicaSets owned by a Deployment, with their replicas and ready counts.
pub async fn replica_sets(
    client: &Client,
    ns: &str,
    deployment: &str,
) -> Result<Vec<(String, i32, i32)>> {
    use k8s_openapi::api::apps::v1::ReplicaSet;
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await?;
    Ok(rs
        .items
        .into_iter()
        .filter(|r| {
            r.owner_references()
                .iter()
                .any(|o| o.kind == "Deployment" && o.name == deployment)
        })
        .map(|r| {
            let spec = r.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            let ready = r
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            (r.name_any(), spec, ready)
        })
        .collect())
}

/// How long a test waits for the cluster or rekindle to act.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until the Deployment has `n` ReplicaSets (`what` names the wait in a timeout error).
pub async fn wait_replica_sets(
    client: &Client,
    ns: &str,
    deployment: &str,
    n: usize,
    what: &str,
) -> Result<()> {
    wait_for(what, TIMEOUT, || async {
        Ok((replica_sets(client, ns, deployment).await?.len() == n).then_some(()))
    })
    .await
}

/// Waits until the Deployment has exactly `n` ReplicaSets, then checks that no more appear for a few
/// seconds (a doubled reload would).
pub async fn expect_replica_sets(
    client: &Client,
    ns: &str,
    deployment: &str,
    n: usize,
) -> Result<()> {
    wait_replica_sets(
        client,
        ns,
        deployment,
        n,
        &format!("{deployment} to have {n} ReplicaSet(s)"),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = replica_sets(client, ns, deployment).await?.len();
    anyhow::ensure!(
        now == n,
        "{deployment}: expected exactly {n} ReplicaSet(s), found {now}"
    );
    Ok(())
}

/// A tiny HTTP receiver on 127.0.0.1 that answers 200 and passes on each request's
/// (content type, body). Returns its URL.
pub async fn http_receiver() -> Result<(
    String,
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = sock.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let header = |name: &str| {
                        head.lines().find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.trim()
                                .eq_ignore_ascii_case(name)
                                .then(|| v.trim().to_string())
                        })
                    };
                    let len: usize = header("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    if body.len() >= len {
                        let _ =
                            tx.send((header("content-type").unwrap_or_default(), body.to_string()));
                        let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
                        return;
                    }
                }
            });
        }
    });
    Ok((url, rx))
}

/// A minimal HTTP CONNECT proxy on 127.0.0.1 (user:secret required); reports each tunnel's target.
pub async fn connect_proxy() -> Result<(String, tokio::sync::mpsc::UnboundedReceiver<String>)> {
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://user:secret@{}", listener.local_addr()?);
    let want_auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("user:secret")
    );
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (tx, want_auth) = (tx.clone(), want_auth.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    if client.read(&mut byte).await.ok() != Some(1) {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let target = text
                    .strip_prefix("CONNECT ")
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or("")
                    .to_string();
                let authorised = text.lines().any(|l| {
                    l.split_once(':').is_some_and(|(k, v)| {
                        k.trim().eq_ignore_ascii_case("proxy-authorization")
                            && v.trim() == want_auth
                    })
                });
                if target.is_empty() || !authorised {
                    let _ = client
                        .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await else {
                    let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                let _ = tx.send(target);
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    Ok((url, rx))
}

#[cfg(test)]
mod tests {
    /// What the install tests scrape is read from the metrics reference, rows naming several series
    /// included.
    #[test]
    fn the_documented_series_are_read_from_the_reference() {
        let series = super::documented_series().unwrap();
        for name in [
            "reloader_reload_executed_total",
            "rekindle_pod_evictions_total",
            "rest_client_requests_total",
        ] {
            assert!(series.iter().any(|s| s == name), "{name} not in {series:?}");
        }
    }
}
