//! The webhook's HTTP surface: `POST /mutate` with AdmissionReview v1 JSON.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

use super::Admission;

/// The apiserver's own request limit is 3 MiB of object; 7 MiB leaves room for old + new objects.
pub const BODY_LIMIT: usize = 7 * 1024 * 1024;

pub fn router(admission: Arc<Admission>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(admission)
}

async fn mutate(
    State(admission): State<Arc<Admission>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !json {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type: application/json\n",
        )
            .into_response();
    }
    // Large objects take a while to parse and stamp; keep that off the async workers.
    let result = tokio::task::spawn_blocking(move || admission.review(&body)).await;
    match result {
        Ok(Ok(review)) => (StatusCode::OK, axum::Json(review)).into_response(),
        Ok(Err(reason)) => (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "admission handler failed\n",
        )
            .into_response(),
    }
}
