//! Network servers: the TLS admission server and the plain-HTTP admin server.

pub mod admin;
pub mod tls;

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// Binds `addr`; `[::]:port` falls back to `0.0.0.0:port` on hosts without IPv6.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(l),
        Err(e) if addr.ip().is_unspecified() && addr.is_ipv6() => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], addr.port()));
            TcpListener::bind(v4).await.map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}
