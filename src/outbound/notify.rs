//! `--webhook-url` mode: no workload is touched; each in-scope change is POSTed as JSON, keeping
//! Reloader's `{"webhook":"update successful"}` key and adding what changed and which workloads would
//! reload. Sent off the watch path by one background task from a bounded queue, each request with a
//! timeout, retried on connection errors, timeouts and 5xx with backoff: a receiver that hangs or is down
//! holds at most the queue, never the watches or unbounded tasks. When the queue is full the
//! notification is dropped, counted (`rekindle_errors_total{kind="notify_dropped"}`) and logged.

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
/// Notifications waiting for the receiver.
const QUEUE: usize = 1024;
/// How long one POST may take before it counts as failed (and is retried).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Notifier {
    tx: tokio::sync::mpsc::Sender<Value>,
    metrics: Arc<Metrics>,
}

/// The background sender: one notification at a time, in order.
struct Sender {
    url: Uri,
    client: HttpClient,
    metrics: Arc<Metrics>,
    timeout: Duration,
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
    /// Starts the background sender (needs a Tokio runtime).
    pub fn new(url: &str, metrics: Arc<Metrics>) -> Result<Arc<Self>> {
        Self::with_limits(url, metrics, QUEUE, REQUEST_TIMEOUT)
    }

    fn with_limits(
        url: &str,
        metrics: Arc<Metrics>,
        queue: usize,
        timeout: Duration,
    ) -> Result<Arc<Self>> {
        let url: Uri = url
            .parse()
            .with_context(|| format!("--webhook-url {url:?} is not a URL"))?;
        let sender = Sender {
            url,
            client: http_client()?,
            metrics: metrics.clone(),
            timeout,
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(queue);
        tokio::spawn(async move {
            while let Some(payload) = rx.recv().await {
                sender.post(payload).await;
            }
        });
        Ok(Arc::new(Self { tx, metrics }))
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
                        &e.policy(&policy.keys, w.kind),
                        || e.references(&r),
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

    /// Queues a notification; never waits.
    pub fn send(&self, payload: Value) {
        if self.tx.try_send(payload).is_err() {
            tracing::warn!("webhook-url queue full; notification dropped");
            self.metrics.error("notify_dropped");
        }
    }
}

impl Sender {
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
            match tokio::time::timeout(self.timeout, self.client.request(req)).await {
                Err(_) => {
                    tracing::debug!(attempt, "webhook-url did not answer in time; retrying")
                }
                Ok(Ok(resp)) if resp.status().is_server_error() => {
                    tracing::debug!(attempt, status = %resp.status(), "webhook-url answered 5xx; retrying")
                }
                Ok(Ok(resp)) => {
                    if !resp.status().is_success() {
                        tracing::warn!(status = %resp.status(), "webhook-url refused the notification");
                        self.metrics.error("notify");
                    }
                    return;
                }
                Ok(Err(e)) => {
                    tracing::debug!(attempt, error = %e, "webhook-url unreachable; retrying")
                }
            }
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
        tracing::warn!(url = %self.url, "notification not delivered");
        self.metrics.error("notify");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ErrorLabels;

    fn errors(metrics: &Metrics, kind: &str) -> u64 {
        metrics
            .errors
            .get_or_create(&ErrorLabels { kind: kind.into() })
            .get()
    }

    /// A receiver that accepts connections and never answers: every POST times out and is retried,
    /// the notification ends as undelivered, and what does not fit the queue is dropped and counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hanging_receiver_costs_a_bounded_queue_and_timeouts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let notifier = Notifier::with_limits(
            &format!("http://{addr}/hook"),
            metrics.clone(),
            4,
            Duration::from_millis(50),
        )
        .unwrap();
        for i in 0..10 {
            notifier.send(json!({"n": i}));
        }
        // One is being sent, four wait: the other five are dropped at once.
        assert!(errors(&metrics, "notify_dropped") >= 5);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while errors(&metrics, "notify") == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "a timed-out notification was never given up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
