//! The TLS accept loop for the admission webhook (rustls on ring, HTTP/1.1 and HTTP/2).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context, Result};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::metrics::{ErrorKind, Metrics};

/// The lowest TLS version the webhook accepts (`--tls-min-version`).
/// Go's names (`VersionTLS12`, `VersionTLS13`) are accepted too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsVersion {
    #[value(name = "1.2", alias = "VersionTLS12")]
    Tls12,
    #[value(name = "1.3", alias = "VersionTLS13")]
    Tls13,
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 1024;

/// Loads a certificate chain and key, refusing a pair that does not belong together.
pub fn load_pair(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {}", cert.display()))?;
    if chain.is_empty() {
        return Err(anyhow!("{} holds no certificate", cert.display()));
    }
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, key, &provider)
        .context("certificate and key do not match")?;
    Ok(Arc::new(certified))
}

/// The leaf certificate's expiry, in seconds since the Unix epoch.
pub fn not_after(pair: &CertifiedKey) -> Option<i64> {
    let leaf = pair.cert.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// Serves the current certificate and swaps in a new one when the files change (on a file event, and
/// every 10 s; a pair that fails to load is ignored and the old one kept).
#[derive(Debug)]
pub struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
    cert: PathBuf,
    key: PathBuf,
    stamp: RwLock<Option<(SystemTime, SystemTime)>>,
}

fn mtimes(cert: &Path, key: &Path) -> Option<(SystemTime, SystemTime)> {
    Some((
        std::fs::metadata(cert).ok()?.modified().ok()?,
        std::fs::metadata(key).ok()?.modified().ok()?,
    ))
}

impl ReloadingCert {
    pub fn new(cert: &Path, key: &Path) -> Result<Arc<Self>> {
        let pair = load_pair(cert, key)?;
        Ok(Arc::new(Self {
            current: RwLock::new(pair),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            stamp: RwLock::new(mtimes(cert, key)),
        }))
    }

    /// Expiry of the certificate being served (seconds since the Unix epoch).
    pub fn not_after(&self) -> Option<i64> {
        not_after(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Reloads when the files changed.
    pub fn refresh(&self) -> Refresh {
        let now = mtimes(&self.cert, &self.key);
        if now == *self.stamp.read().unwrap_or_else(|e| e.into_inner()) {
            return Refresh::Unchanged;
        }
        match load_pair(&self.cert, &self.key) {
            Ok(pair) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = pair;
                *self.stamp.write().unwrap_or_else(|e| e.into_inner()) = now;
                tracing::info!(cert = %self.cert.display(), "loaded a new webhook certificate");
                Refresh::Loaded
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "new webhook certificate refused; keeping the old one");
                Refresh::Refused
            }
        }
    }
}

/// What a [`ReloadingCert::refresh`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    Unchanged,
    Loaded,
    /// The files changed but do not hold a usable pair: the old one is still served.
    Refused,
}

impl ReloadingCert {
    /// Loads a new pair as soon as its files change (and every 10 s where file events are not
    /// delivered), keeping the served certificate's expiry current and counting each refused pair
    /// (`tls_cert`: tried again every 10 s until it loads), until `shutdown`. The task is returned
    /// for the caller to supervise: without it, a renewed certificate is never served.
    pub fn keep_fresh(
        self: Arc<Self>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        let expiry = metrics.tls_cert_not_after.clone();
        expiry.set(self.not_after().unwrap_or(0));
        let mut changed = watch_files(&[self.cert.as_path(), self.key.as_path()]);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    Some(()) = changed.next() => {
                        // Let the writer finish both files before reading them.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    _ = shutdown.cancelled() => break,
                }
                match self.refresh() {
                    Refresh::Loaded => {
                        expiry.set(self.not_after().unwrap_or(0));
                    }
                    Refresh::Refused => metrics.error(ErrorKind::TlsCert),
                    Refresh::Unchanged => {}
                }
            }
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

/// Signals changes in the directories of the certificate files (kubelet updates a Secret volume by
/// swapping its `..data` symlink), so a new pair is loaded at once; the 10 s poll remains the fallback
/// where file events are not delivered.
pub struct FileEvents {
    // Kept alive for as long as events are wanted.
    watcher: Option<notify::RecommendedWatcher>,
    rx: tokio::sync::mpsc::Receiver<()>,
}

impl FileEvents {
    pub async fn next(&mut self) -> Option<()> {
        if self.watcher.is_none() {
            return std::future::pending().await;
        }
        self.rx.recv().await
    }
}

pub fn watch_files(files: &[&Path]) -> FileEvents {
    use notify::Watcher as _;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            let _ = tx.try_send(());
        }
    })
    .and_then(|mut w| {
        for file in files {
            let dir = file
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            w.watch(dir, notify::RecursiveMode::NonRecursive)?;
        }
        Ok(w)
    });
    match watcher {
        Ok(w) => FileEvents {
            watcher: Some(w),
            rx,
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the certificate files; polling every 10 s only");
            FileEvents { watcher: None, rx }
        }
    }
}

pub fn server_config(
    cert: Arc<ReloadingCert>,
    min: TlsVersion,
    http2: bool,
) -> Result<rustls::ServerConfig> {
    let versions: &[&rustls::SupportedProtocolVersion] = match min {
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)?
    .with_no_client_auth()
    .with_cert_resolver(cert);
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(config)
}

/// Accepts TLS connections until `shutdown`, then lets open connections finish (up to 10 s).
/// Connections refused over the bound (`webhook_overload`) and handshakes that fail or time out
/// (`webhook_handshake`: often a CA bundle the apiserver does not trust) are counted.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: rustls::ServerConfig,
    router: Router,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, _peer) = tokio::select! {
            conn = listener.accept() => match conn {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors, most often: an overload too.
                    metrics.error(ErrorKind::WebhookOverload);
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Over the connection bound: close rather than queue, so the apiserver retries elsewhere.
            metrics.error(ErrorKind::WebhookOverload);
            drop(stream);
            continue;
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    metrics.error(ErrorKind::WebhookHandshake);
                    tracing::debug!(error = %e, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => {
                    metrics.error(ErrorKind::WebhookHandshake);
                    tracing::debug!("webhook TLS handshake timed out");
                    return;
                }
            };
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let conn = builder
                .serve_connection(TokioIo::new(tls), service)
                .into_owned();
            let _ = watcher.watch(conn).await;
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    /// The bound is checked before any handshake, so no certificate is needed.
    #[derive(Debug)]
    struct NoCertificate;

    impl ResolvesServerCert for NoCertificate {
        fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            None
        }
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        for _ in 0..500 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("not within 5 s: {what}");
    }

    #[tokio::test]
    async fn a_connection_over_the_bound_is_closed_and_counted_and_a_freed_slot_is_reused() {
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry, false));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(NoCertificate));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            config,
            Router::new(),
            metrics.clone(),
            shutdown.clone(),
        ));

        // Every slot taken by a client that never starts its handshake (10 s allowed).
        let mut held = Vec::with_capacity(MAX_CONNECTIONS);
        for _ in 0..MAX_CONNECTIONS {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut over = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), over.read(&mut byte))
            .await
            .expect("the connection over the bound is closed at once");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "closed, not served: {read:?}"
        );
        assert_eq!(metrics.errors_of(ErrorKind::WebhookOverload), 1);
        assert_eq!(metrics.errors_of(ErrorKind::WebhookHandshake), 0);

        // A client that leaves frees its slot (its handshake fails), and the next one is accepted.
        drop(held.pop());
        until("the abandoned handshake is counted", || {
            metrics.errors_of(ErrorKind::WebhookHandshake) == 1
        })
        .await;
        drop(TcpStream::connect(addr).await.unwrap());
        until("the next connection is accepted, then abandoned", || {
            metrics.errors_of(ErrorKind::WebhookHandshake) == 2
        })
        .await;
        assert_eq!(metrics.errors_of(ErrorKind::WebhookOverload), 1);

        shutdown.cancel();
        drop(held);
        server.await.unwrap();
    }
}
