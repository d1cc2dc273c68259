//! The one outgoing HTTP client: a bounded queue in front of a sender that POSTs one body at a time,
//! each request with a timeout, retried with backoff on connection errors, timeouts and 5xx. A receiver
//! that hangs or is down holds at most the queue, never the caller: `try_send` never waits.

use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use backon::Retryable;

use crate::retry;

type Direct = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;
type Tunnel = hyper_util::client::legacy::connect::proxy::Tunnel<HttpConnector>;
type Proxied = Client<hyper_rustls::HttpsConnector<Tunnel>, Full<Bytes>>;

/// An HTTP(S) client trusting the system's root certificates, optionally through a CONNECT proxy.
#[derive(Clone)]
pub enum HttpClient {
    Direct(Direct),
    Proxied(Proxied),
}

impl HttpClient {
    pub fn direct() -> Result<Self> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .context("loading the system's root certificates")?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self::Direct(
            Client::builder(TokioExecutor::new()).build(https),
        ))
    }

    /// Connections go through an HTTP proxy with CONNECT (for example `http://user:pass@proxy:3128`);
    /// TLS to the destination runs inside the tunnel.
    pub fn via_proxy(proxy: &str) -> Result<Self> {
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
        Ok(Self::Proxied(
            Client::builder(TokioExecutor::new()).build(https),
        ))
    }

    async fn request(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        match self {
            Self::Direct(c) => c.request(req).await,
            Self::Proxied(c) => c.request(req).await,
        }
    }
}

/// Why a POST was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum Undelivered {
    /// The receiver answered 4xx: the same body would be refused again.
    #[error("refused with {0}")]
    Refused(StatusCode),
    /// No answer in time, unreachable, or 5xx, on every attempt.
    #[error("{0}")]
    Unavailable(String),
}

/// Where and how to POST.
pub struct Destination {
    pub url: Uri,
    pub client: HttpClient,
    /// How long one request may take before it counts as failed (and is retried).
    pub timeout: Duration,
    /// Retries after the first attempt.
    pub retries: usize,
}

impl Destination {
    /// POSTs `body`; retries what may succeed later.
    pub async fn post(&self, content_type: &str, body: Bytes) -> Result<(), Undelivered> {
        let once = || async {
            let req = Request::builder()
                .method(Method::POST)
                .uri(self.url.clone())
                .header("content-type", content_type)
                .body(Full::new(body.clone()))
                .map_err(|e| Undelivered::Unavailable(e.to_string()))?;
            match tokio::time::timeout(self.timeout, self.client.request(req)).await {
                Err(_) => Err(Undelivered::Unavailable("no answer in time".into())),
                Ok(Err(e)) => Err(Undelivered::Unavailable(format!("unreachable: {e}"))),
                Ok(Ok(resp)) if resp.status().is_server_error() => Err(Undelivered::Unavailable(
                    format!("answered {}", resp.status()),
                )),
                Ok(Ok(resp)) if resp.status().is_client_error() => {
                    Err(Undelivered::Refused(resp.status()))
                }
                Ok(Ok(_)) => Ok(()),
            }
        };
        once.retry(retry::backoff(
            Duration::from_millis(200),
            Duration::from_secs(5),
            self.retries,
        ))
        .sleep(tokio::time::sleep)
        .when(|e| matches!(e, Undelivered::Unavailable(_)))
        .notify(|e, _| tracing::debug!(url = %self.url, error = %e, "POST failed; retrying"))
        .await
    }
}

/// A bounded queue of bodies for one destination, sent in order by one background task.
pub struct Outbox {
    tx: mpsc::Sender<(&'static str, Bytes)>,
}

impl Outbox {
    /// Starts the sender (needs a Tokio runtime); `failed` hears of each body not delivered. The
    /// sender's task is returned for the caller to supervise: without it, bodies are only dropped.
    pub fn start(
        destination: Destination,
        queue: usize,
        failed: impl Fn(Undelivered) + Send + 'static,
    ) -> (Self, JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<(&'static str, Bytes)>(queue);
        let sender = tokio::spawn(async move {
            while let Some((content_type, body)) = rx.recv().await {
                if let Err(e) = destination.post(content_type, body).await {
                    failed(e);
                }
            }
        });
        (Self { tx }, sender)
    }

    /// Queues a body; never waits. `false` when the queue is full (the body is dropped).
    pub fn try_send(&self, content_type: &'static str, body: Bytes) -> bool {
        self.tx.try_send((content_type, body)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A receiver that answers the given statuses in turn (the last one from then on), counting POSTs.
    async fn receiver(statuses: Vec<u16>) -> (Uri, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                let code = statuses[n.min(statuses.len() - 1)];
                async move { StatusCode::from_u16(code).unwrap() }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/hook").parse().unwrap(), hits)
    }

    fn to(url: Uri) -> Destination {
        Destination {
            url,
            client: HttpClient::direct().unwrap(),
            timeout: Duration::from_secs(5),
            retries: 4,
        }
    }

    #[tokio::test]
    async fn server_errors_are_retried_until_delivered() {
        let (url, hits) = receiver(vec![503, 500, 204]).await;
        to(url).post("text/plain", Bytes::from("x")).await.unwrap();
        assert_eq!(hits.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_refusal_is_not_retried() {
        let (url, hits) = receiver(vec![400]).await;
        let e = to(url)
            .post("text/plain", Bytes::from("x"))
            .await
            .unwrap_err();
        assert!(matches!(e, Undelivered::Refused(s) if s == StatusCode::BAD_REQUEST));
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn gives_up_after_its_retries() {
        let (url, hits) = receiver(vec![502]).await;
        let mut d = to(url);
        d.retries = 2;
        assert!(matches!(
            d.post("text/plain", Bytes::from("x")).await,
            Err(Undelivered::Unavailable(_))
        ));
        assert_eq!(hits.load(Ordering::SeqCst), 3);
    }

    /// The sender's task is handed to the caller, so a sender that fails is seen (the supervisor ends
    /// the process naming it) rather than leaving every later body dropped.
    #[tokio::test]
    async fn the_senders_end_is_seen_by_its_caller() {
        let (url, _) = receiver(vec![400]).await;
        let (outbox, sender) = Outbox::start(to(url), 4, |_| panic!("failure handler broke"));
        assert!(outbox.try_send("text/plain", Bytes::from("x")));
        let ended = tokio::time::timeout(Duration::from_secs(10), sender)
            .await
            .expect("the sender went on");
        assert!(ended.unwrap_err().is_panic());
        assert!(
            !outbox.try_send("text/plain", Bytes::from("y")),
            "with its sender gone, the outbox takes nothing"
        );
    }
}
