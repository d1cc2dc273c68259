//! `--webhook-url` mode: no workload is touched; each in-scope change is POSTed as JSON, keeping
//! Reloader's `{"webhook":"update successful"}` key and adding what changed and which workloads would
//! reload. Sent off the watch path, retried on connection errors and 5xx with backoff.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::core::policy::{decide_with, PolicyConfig, ResourceFlags};
use crate::core::refs::ResourceRef;
use crate::core::ResourceKind;
use crate::index::{Index, WorkloadKey};
use crate::metrics::Metrics;

const ATTEMPTS: u32 = 5;

pub struct Notifier {
    url: Uri,
    client: HttpClient,
    metrics: Arc<Metrics>,
}

/// An HTTP(S) client for outgoing notifications, trusting the system's root certificates.
pub fn http_client() -> Result<HttpClient> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .context("loading the system's root certificates")?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

pub type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

type Tunnel = hyper_util::client::legacy::connect::proxy::Tunnel<HttpConnector>;
pub type ProxiedClient = Client<hyper_rustls::HttpsConnector<Tunnel>, Full<Bytes>>;

/// An HTTP(S) client whose connections go through an HTTP proxy with CONNECT (`ALERT_WEBHOOK_PROXY`,
/// for example `http://user:pass@proxy:3128`); TLS to the destination runs inside the tunnel.
pub fn proxied_client(proxy: &str) -> Result<ProxiedClient> {
    let uri: Uri = proxy
        .trim()
        .parse()
        .with_context(|| format!("proxy {proxy:?} is not a URL"))?;
    let authority = uri
        .authority()
        .with_context(|| format!("proxy {proxy:?} has no host"))?
        .clone();
    let host_port = match authority.port_u16() {
        Some(p) => format!("{}:{p}", authority.host()),
        None => format!("{}:80", authority.host()),
    };
    let proxy_uri: Uri = format!("http://{host_port}").parse()?;
    let mut tunnel = Tunnel::new(proxy_uri, HttpConnector::new());
    if let Some((userinfo, _)) = authority.as_str().rsplit_once('@') {
        use base64::Engine as _;
        let token = base64::engine::general_purpose::STANDARD.encode(userinfo);
        tunnel = tunnel.with_auth(
            hyper::header::HeaderValue::from_str(&format!("Basic {token}"))
                .context("proxy credentials")?,
        );
    }
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .context("loading the system's root certificates")?
        .https_or_http()
        .enable_http1()
        .wrap_connector(tunnel);
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

impl Notifier {
    pub fn new(url: &str, metrics: Arc<Metrics>) -> Result<Arc<Self>> {
        let url: Uri = url
            .parse()
            .with_context(|| format!("--webhook-url {url:?} is not a URL"))?;
        Ok(Arc::new(Self {
            url,
            client: http_client()?,
            metrics,
        }))
    }

    /// The payload for a change: Reloader's key plus what changed and the workloads that would reload.
    pub fn payload(
        kind: ResourceKind,
        namespace: &str,
        name: &str,
        hash: &str,
        workloads: &[WorkloadKey],
    ) -> Value {
        json!({
            "webhook": "update successful",
            "kind": kind.kind_name(),
            "namespace": namespace,
            "name": name,
            "hash": hash,
            "workloads": workloads.iter().map(|w| json!({"kind": w.kind.name(), "namespace": w.namespace, "name": w.name})).collect::<Vec<_>>(),
        })
    }

    /// The dependents the policy says would reload (decided on the index, without the objects).
    pub fn would_reload(
        policy: &PolicyConfig,
        index: &Index,
        dependents: &[WorkloadKey],
        kind: ResourceKind,
        name: &str,
        flags: ResourceFlags,
    ) -> Vec<WorkloadKey> {
        let r = ResourceRef {
            kind,
            name: name.to_string(),
        };
        dependents
            .iter()
            .filter(|w| {
                index.workload(w).is_some_and(|e| {
                    decide_with(
                        policy,
                        w.kind,
                        &e.policy,
                        || e.refs.contains(&r),
                        kind,
                        name,
                        flags,
                    )
                    .reload
                })
            })
            .cloned()
            .collect()
    }

    /// Sends in the background.
    pub fn send(self: &Arc<Self>, payload: Value) {
        let this = self.clone();
        tokio::spawn(async move { this.post(payload).await });
    }

    async fn post(&self, payload: Value) {
        let body = Bytes::from(payload.to_string());
        let mut backoff = Duration::from_millis(200);
        for attempt in 1..=ATTEMPTS {
            let req = Request::builder()
                .method(Method::POST)
                .uri(self.url.clone())
                .header("content-type", "application/json")
                .body(Full::new(body.clone()));
            let Ok(req) = req else { return };
            match self.client.request(req).await {
                Ok(resp) if resp.status().is_server_error() => {
                    tracing::debug!(attempt, status = %resp.status(), "webhook-url answered 5xx; retrying")
                }
                Ok(resp) => {
                    if !resp.status().is_success() {
                        tracing::warn!(status = %resp.status(), "webhook-url refused the notification");
                        self.metrics.error("notify");
                    }
                    return;
                }
                Err(e) => tracing::debug!(attempt, error = %e, "webhook-url unreachable; retrying"),
            }
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
        tracing::warn!(url = %self.url, "notification not delivered");
        self.metrics.error("notify");
    }
}
