//! S5: the webhook alone under load from this (separate) process, over keep-alive TLS, with real
//! AdmissionReviews: latency at a fixed rate, and the highest sustained rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

pub type Https = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client trusting the test CA, HTTP/1.1 with keep-alive.
pub fn client(ca_pem: &std::path::Path) -> Result<Https> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca_pem)? {
        roots.add(cert?)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build(https))
}

/// A real AdmissionReview of a ~2 KiB Deployment that references a ConfigMap and a Secret.
pub fn review(namespace: &str) -> Bytes {
    let env: Vec<Value> = (0..20)
        .map(|i| json!({"name": format!("SETTING_{i}"), "value": format!("value-{i}-{}", "x".repeat(24))}))
        .collect();
    let object = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace, "labels": {"app": "web", "team": "payments"},
            "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "registry.example/web:1.2.3",
                    "envFrom": [{"configMapRef": {"name": "app-config"}}, {"secretRef": {"name": "app-secret"}}],
                    "env": env, "ports": [{"containerPort": 8080}],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}}});
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "00000000-0000-0000-0000-000000000001",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "requestKind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "requestResource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": "web", "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "bench", "groups": ["system:authenticated"]},
            "object": object, "dryRun": false, "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}});
    Bytes::from(review.to_string())
}

async fn one(client: &Https, url: &hyper::Uri, body: &Bytes) -> Result<f64> {
    let req = hyper::Request::post(url.clone())
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))?;
    let start = Instant::now();
    let resp = client.request(req).await.context("request")?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if !status.is_success() || !bytes.starts_with(b"{") {
        return Err(anyhow!("answer {status}"));
    }
    Ok(ms)
}

/// Open loop: `rate` requests per second for `seconds`; every request's latency (ms).
pub async fn fixed_rate(
    client: &Https,
    url: &hyper::Uri,
    body: &Bytes,
    rate: u64,
    seconds: u64,
) -> Result<(Vec<f64>, u64)> {
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let errors = Arc::new(AtomicU64::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..rate * seconds {
        tick.tick().await;
        let (client, url, body, tx, errors) = (
            client.clone(),
            url.clone(),
            body.clone(),
            tx.clone(),
            errors.clone(),
        );
        tokio::spawn(async move {
            match one(&client, &url, &body).await {
                Ok(ms) => {
                    let _ = tx.send(ms);
                }
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    drop(tx);
    let mut out = Vec::new();
    while let Some(ms) = rx.recv().await {
        out.push(ms);
    }
    Ok((out, errors.load(Ordering::Relaxed)))
}

/// Closed loop: `workers` connections sending back to back for `seconds`; requests per second.
pub async fn max_rate(
    client: &Https,
    url: &hyper::Uri,
    body: &Bytes,
    workers: usize,
    seconds: u64,
) -> Result<(f64, u64)> {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut handles = Vec::new();
    for _ in 0..workers {
        let (client, url, body, done, errors) = (
            client.clone(),
            url.clone(),
            body.clone(),
            done.clone(),
            errors.clone(),
        );
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                match one(&client, &url, &body).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for h in handles {
        h.await?;
    }
    Ok((
        done.load(Ordering::Relaxed) as f64 / seconds as f64,
        errors.load(Ordering::Relaxed),
    ))
}
