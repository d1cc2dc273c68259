//! The webhook's HTTP surface: `POST /mutate` with AdmissionReview v1 JSON.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

use super::lookup::Looked;
use super::{Admission, Reviewed};
use crate::index::ResourceKey;

/// The apiserver's own request limit is 3 MiB of object; 7 MiB leaves room for old + new objects.
pub const BODY_LIMIT: usize = 7 * 1024 * 1024;

/// Bodies up to this size are reviewed on the async worker (no thread hand-off).
const INLINE_LIMIT: usize = 128 * 1024;

pub fn router(admission: Arc<Admission>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(admission)
}

async fn mutate(
    State(admission): State<Arc<Admission>>,
    RawQuery(query): RawQuery,
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
    let limit = apiserver_timeout(query.as_deref());
    let mut result = run(&admission, &body, None, limit).await;
    // The index missed a resource the workload uses (created just before it): read it, then answer.
    if let Ok(Ok(Reviewed::Lookup(keys))) = &result {
        let read = match &admission.lookup {
            Some(lookup) => lookup.fetch(keys.clone()).await,
            None => Default::default(),
        };
        result = run(&admission, &body, Some(read), limit).await;
    }
    match result {
        Ok(Ok(Reviewed::Done(review))) => (StatusCode::OK, axum::Json(review)).into_response(),
        Ok(Ok(Reviewed::Lookup(_))) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "admission handler asked twice for a lookup\n",
        )
            .into_response(),
        Ok(Err(reason)) => (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response(),
        Err(response) => response,
    }
}

/// One review pass. A typical object (tens of KiB) is reviewed in well under a millisecond: inline.
/// Large ones take a while to parse and stamp; those go off the async workers, bounded by the
/// apiserver's own timeout (answering later is wasted work).
async fn run(
    admission: &Arc<Admission>,
    body: &Bytes,
    looked_up: Option<HashMap<ResourceKey, Looked>>,
    limit: Option<std::time::Duration>,
) -> Result<Result<Reviewed, String>, Response> {
    if body.len() <= INLINE_LIMIT {
        return Ok(admission.review_pass(body, looked_up.as_ref()));
    }
    let (admission, body) = (admission.clone(), body.clone());
    let work =
        tokio::task::spawn_blocking(move || admission.review_pass(&body, looked_up.as_ref()));
    let joined = match limit {
        Some(limit) => match tokio::time::timeout(limit, work).await {
            Ok(r) => r,
            Err(_) => {
                return Err((
                    StatusCode::GATEWAY_TIMEOUT,
                    "the apiserver's timeout passed\n",
                )
                    .into_response())
            }
        },
        None => work.await,
    };
    joined.map_err(|_| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "admission handler failed\n",
        )
            .into_response()
    })
}

/// The `timeout` query parameter the apiserver adds to webhook calls (a Go duration).
fn apiserver_timeout(query: Option<&str>) -> Option<std::time::Duration> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeout="))
        .and_then(|v| crate::core::duration::parse_go_duration(v).ok())
        .filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::apiserver_timeout;
    use std::time::Duration;

    #[test]
    fn reads_the_apiservers_timeout() {
        assert_eq!(
            apiserver_timeout(Some("timeout=2s")),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            apiserver_timeout(Some("a=b&timeout=500ms")),
            Some(Duration::from_millis(500))
        );
        assert_eq!(apiserver_timeout(Some("timeout=bogus")), None);
        assert_eq!(apiserver_timeout(Some("timeout=0s")), None);
        assert_eq!(apiserver_timeout(None), None);
    }
}
