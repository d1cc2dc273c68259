//! The admin server: `/live`, `/ready` (200 only once every watch has synced and until shutdown starts)
//! and `/metrics`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;

use crate::metrics::exposition::{self, Format};

#[derive(Default)]
pub struct Health {
    pub ready: AtomicBool,
}

impl Health {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

/// Why the process is not live (it should be restarted), or `None`.
pub type LiveCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    registry: Arc<Registry>,
    live: LiveCheck,
}

pub fn router(health: Arc<Health>, registry: Arc<Registry>, live: LiveCheck) -> Router {
    Router::new()
        .route("/live", get(liveness))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(AdminState {
            health,
            registry,
            live,
        })
}

async fn liveness(State(s): State<AdminState>) -> impl IntoResponse {
    match (s.live)() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not live: {why}\n"),
        ),
    }
}

async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    if s.health.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: watches are syncing or shutdown has started\n",
        )
    }
}

/// OpenMetrics when the scraper's `Accept` asks for it, else the classic text format.
async fn metrics(State(s): State<AdminState>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    match exposition::encode(&s.registry, format) {
        Ok(out) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, format.content_type())],
            out,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "encoding failed\n".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get_live(live: LiveCheck) -> (StatusCode, String) {
        let app = router(Arc::default(), Arc::default(), live);
        let response = app
            .oneshot(
                axum::http::Request::get("/live")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// `/live` answers what the check says, with the reason, so the kubelet restarts a stuck replica and
    /// the operator reads why.
    #[tokio::test]
    async fn live_fails_with_the_reason_the_check_gives() {
        assert_eq!(
            get_live(Arc::new(|| None)).await,
            (StatusCode::OK, "ok\n".into())
        );
        let (status, body) = get_live(Arc::new(|| Some("the writer is stuck".into()))).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not live: the writer is stuck\n");
    }
}
