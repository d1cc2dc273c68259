//! A TCP proxy on 127.0.0.1 whose path the test can freeze: while frozen, bytes are neither delivered
//! nor refused (a partition that drops packets, not one that resets connections), new connections are
//! accepted and held, and what was held flows again once healed, as TCP's retransmissions would
//! deliver it. The path can also freeze one way only: requests held, answers and watch events still
//! delivered (a client that keeps learning of changes while nothing it sends arrives).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct FreezableProxy {
    pub addr: SocketAddr,
    /// Client to apiserver.
    requests: watch::Sender<bool>,
    /// Apiserver to client.
    answers: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Waits until the path is not frozen.
async fn open(frozen: &mut watch::Receiver<bool>) {
    let _ = frozen.wait_for(|f| !*f).await;
}

/// Copies one direction, holding each chunk read while frozen until healed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        open(&mut frozen).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        open(&mut frozen).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    open(&mut frozen).await;
    let _ = to.shutdown().await;
}

impl FreezableProxy {
    /// Forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (requests, up) = watch::channel(false);
        let (answers, down) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (mut up, down) = (up.clone(), down.clone());
                tokio::spawn(async move {
                    open(&mut up).await;
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, up),
                        pump(server_read, client_write, down),
                    );
                });
            }
        });
        Ok(Self {
            addr,
            requests,
            answers,
            task,
        })
    }

    /// Both ways.
    pub fn freeze(&self) {
        self.requests.send_replace(true);
        self.answers.send_replace(true);
    }

    /// Requests only: what the client sends is held, what the apiserver sends still arrives.
    pub fn freeze_requests(&self) {
        self.requests.send_replace(true);
    }

    pub fn heal(&self) {
        self.requests.send_replace(false);
        self.answers.send_replace(false);
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The apiserver's address in a kubeconfig (`server: https://HOST:PORT`).
fn apiserver_addr(kubeconfig: &Path) -> Result<SocketAddr> {
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .ok_or_else(|| anyhow!("no server in {}", kubeconfig.display()))?;
    server
        .trim()
        .parse()
        .with_context(|| format!("server {server} in {}", kubeconfig.display()))
}

/// A proxy in front of the apiserver `kubeconfig` names, and a copy of `kubeconfig` that reaches it
/// through the proxy (same credentials; the apiserver's certificate names 127.0.0.1, so TLS verifies
/// unchanged), written under the state directory as `name`.
pub async fn in_front_of(kubeconfig: &Path, name: &str) -> Result<(FreezableProxy, PathBuf)> {
    let upstream = apiserver_addr(kubeconfig)?;
    let proxy = FreezableProxy::start(upstream).await?;
    let text = std::fs::read_to_string(kubeconfig)?.replace(
        &format!("server: https://{upstream}"),
        &format!("server: https://{}", proxy.addr),
    );
    let path = crate::state_dir().join(name);
    std::fs::write(&path, text)?;
    Ok((proxy, path))
}
