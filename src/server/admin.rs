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

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    registry: Arc<Registry>,
}

pub fn router(health: Arc<Health>, registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(AdminState { health, registry })
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
