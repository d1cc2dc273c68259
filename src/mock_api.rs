//! A scripted apiserver for tests of the I/O shell (the tower-test mock service behind a kube
//! `Client`): each test answers requests in turn and asserts the methods, paths and bodies it saw.

use hyper::{Method, Request, Response};
use kube::client::Body;
use serde_json::{json, Value};

/// One request as the mock apiserver saw it.
#[derive(Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    /// The query string (empty when there is none).
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

/// The scripted apiserver: `answer` gives (status, body) for each non-Event request in turn; Events
/// are accepted and recorded apart.
pub struct ApiServer {
    pub requests: Vec<Seen>,
    pub events: Vec<Value>,
}

pub async fn serve(
    handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    answer: impl FnMut(&Seen) -> (u16, Value) + Send + 'static,
) -> ApiServer {
    serve_slow_events(handle, answer, std::time::Duration::ZERO).await
}

/// As [`serve`], each Event answered `event_delay` after it arrived.
pub async fn serve_slow_events(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    mut answer: impl FnMut(&Seen) -> (u16, Value) + Send + 'static,
    event_delay: std::time::Duration,
) -> ApiServer {
    let mut server = ApiServer {
        requests: Vec::new(),
        events: Vec::new(),
    };
    while let Some((request, send)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = http_body_util::BodyExt::collect(body)
            .await
            .unwrap()
            .to_bytes();
        let seen = Seen {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        };
        let (status, reply) = if seen.path.contains("/events") {
            tokio::time::sleep(event_delay).await;
            server.events.push(seen.body.clone());
            (201, seen.body.clone())
        } else {
            let a = answer(&seen);
            server.requests.push(seen);
            a
        };
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
    }
    server
}

pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
        "reason": reason, "message": message})
}

/// A kube client whose requests go to the returned handle.
pub fn client() -> (
    kube::Client,
    tower_test::mock::Handle<Request<Body>, Response<Body>>,
) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), handle)
}
