//! client-go's `rest_client_requests_total{code,host,method}` and
//! `rest_client_request_duration_seconds{host,verb}` for rekindle's own API client: a tower layer on
//! the kube client, so every request (watches included, timed to their response headers) is counted.

use std::task::{Context, Poll};
use std::time::Instant;

use axum::http::{Request, Response};
use futures::future::BoxFuture;
use kube::client::Body;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tower::{Layer, Service};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub code: String,
    pub host: String,
    pub method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    pub host: String,
    pub verb: String,
}

/// The two families (registered by `Metrics::new`) and the apiserver's host they are labelled with.
#[derive(Clone)]
pub struct RestLayer {
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Family<DurationLabels, Histogram>,
    pub host: String,
}

impl<S> Layer<S> for RestLayer {
    type Service = RestService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RestService {
            inner,
            metrics: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RestService<S> {
    inner: S,
    metrics: RestLayer,
}

impl<S, B> Service<Request<Body>> for RestService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(r) => r.status().as_u16().to_string(),
                // client-go's label for a request that got no response.
                Err(_) => "<error>".to_string(),
            };
            metrics
                .duration
                .get_or_create(&DurationLabels {
                    host: metrics.host.clone(),
                    verb: method.clone(),
                })
                .observe(started.elapsed().as_secs_f64());
            metrics
                .requests
                .get_or_create(&RequestLabels {
                    code,
                    host: metrics.host.clone(),
                    method,
                })
                .inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    #[tokio::test]
    async fn counts_each_request_by_code_and_method() {
        let layer = RestLayer {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new([0.1, 1.0])),
            host: "10.0.0.1:443".into(),
        };
        let inner = tower::service_fn(|req: Request<Body>| async move {
            let status = if req.method() == "PATCH" { 409 } else { 200 };
            Ok::<_, Infallible>(Response::builder().status(status).body(()).unwrap())
        });
        let mut svc = layer.layer(inner);
        for method in ["GET", "GET", "PATCH"] {
            let req = Request::builder()
                .method(method)
                .uri("/api/v1/namespaces")
                .body(Body::empty())
                .unwrap();
            svc.call(req).await.unwrap();
        }
        let count = |code: &str, method: &str| {
            layer
                .requests
                .get_or_create(&RequestLabels {
                    code: code.into(),
                    host: "10.0.0.1:443".into(),
                    method: method.into(),
                })
                .get()
        };
        assert_eq!(count("200", "GET"), 2);
        assert_eq!(count("409", "PATCH"), 1);
    }
}
