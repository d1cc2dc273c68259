//! One connection to the apiserver kept open for the writer.
//!
//! kube's HTTP/1.1 client pools the connections no request holds and drops one after 90 s idle. Without
//! this, the first reload after start, and every reload after a quiet minute and a half (the usual case
//! in a cluster where config changes now and then), first opens a TLS connection and authenticates: the
//! slowest change of every paced benchmark run was its first, its PATCH 40–50 ms where the others take
//! 5. A cheap GET of `/version` every 30 s, on the writer's own client (the watches hold theirs), keeps
//! one pooled connection ready.

use std::time::Duration;

use kube::Client;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

pub const INTERVAL: Duration = Duration::from_secs(30);

/// Uses `client` now and every `interval` until shutdown.
pub async fn keep_warm(client: Client, interval: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        tokio::select! {
            result = client.apiserver_version() => {
                if let Err(error) = result {
                    // The next reload opens a connection of its own; nothing else depends on this.
                    tracing::debug!(%error, "keeping the writer's connection open failed");
                }
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock_api;
    use hyper::Response;
    use kube::client::Body;
    use serde_json::json;

    #[tokio::test(start_paused = true)]
    async fn the_connection_is_used_at_start_and_every_interval() {
        let (client, mut handle) = mock_api::client();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(keep_warm(client, INTERVAL, shutdown.clone()));
        let start = tokio::time::Instant::now();
        let version = json!({"major": "1", "minor": "35", "gitVersion": "v1.35.4", "gitCommit": "x",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.26",
            "compiler": "gc", "platform": "linux/amd64"});
        for i in 0..3u64 {
            let (request, send) = handle.next_request().await.expect("a request");
            assert_eq!(request.method(), "GET");
            assert_eq!(request.uri().path(), "/version");
            assert_eq!(start.elapsed().as_secs(), 30 * i, "request {i}");
            send.send_response(
                Response::builder()
                    .status(200)
                    .body(Body::from(serde_json::to_vec(&version).unwrap()))
                    .unwrap(),
            );
        }
        // A failed request is only logged: the next tick tries again.
        let (_, send) = handle.next_request().await.expect("a request");
        send.send_response(
            Response::builder()
                .status(500)
                .body(Body::from(b"{}".to_vec()))
                .unwrap(),
        );
        let (request, _unanswered) = handle.next_request().await.expect("another request");
        assert_eq!(request.uri().path(), "/version");
        assert_eq!(start.elapsed().as_secs(), 120);
        // Shutdown does not wait for an unanswered request.
        shutdown.cancel();
        task.await.unwrap();
    }
}
