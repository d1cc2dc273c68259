//! `--webhook-url` mode: no workload is touched; each in-scope change is POSTed as JSON, keeping
//! Reloader's `{"webhook":"update successful"}` key and adding what changed and which workloads would
//! reload. Sent off the watch path by one background task from a bounded queue, each request with a
//! timeout, retried on connection errors, timeouts and 5xx with backoff: a receiver that hangs or is down
//! holds at most the queue, never the watches or unbounded tasks. When the queue is full the
//! notification is dropped, counted (`rekindle_errors_total{kind="notify_dropped"}`) and logged.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Bytes;
use hyper::Uri;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::core::policy::{decide_with, PolicyConfig, ResourceFlags};
use crate::core::refs::ResourceRef;
use crate::core::ResourceKind;
use crate::index::{Index, WorkloadKey};
use crate::metrics::{ErrorKind, Metrics};
use crate::outbound::http::{Destination, HttpClient, Outbox};

/// Retries after the first POST.
const RETRIES: usize = 4;
/// Notifications waiting for the receiver.
const QUEUE: usize = 1024;
/// How long one POST may take before it counts as failed (and is retried).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Notifier {
    outbox: Outbox,
    metrics: Arc<Metrics>,
}

impl Notifier {
    /// Starts the background sender (needs a Tokio runtime); its task is returned for the caller to
    /// supervise.
    pub fn new(url: &str, metrics: Arc<Metrics>) -> Result<(Arc<Self>, JoinHandle<()>)> {
        Self::with_limits(url, metrics, QUEUE, REQUEST_TIMEOUT)
    }

    fn with_limits(
        url: &str,
        metrics: Arc<Metrics>,
        queue: usize,
        timeout: Duration,
    ) -> Result<(Arc<Self>, JoinHandle<()>)> {
        let url: Uri = url
            .parse()
            .with_context(|| format!("--webhook-url {url:?} is not a URL"))?;
        let destination = Destination {
            url: url.clone(),
            client: HttpClient::direct()?,
            timeout,
            retries: RETRIES,
        };
        let failure_metrics = metrics.clone();
        let (outbox, sender) = Outbox::start(destination, queue, move |e| {
            tracing::warn!(%url, error = %e, "notification not delivered");
            failure_metrics.error(ErrorKind::Notify);
        });
        Ok((Arc::new(Self { outbox, metrics }), sender))
    }

    /// The payload for a change: Reloader's key plus what changed and the workloads that would reload.
    pub fn payload(
        kind: ResourceKind,
        namespace: &str,
        name: &str,
        hash: &str,
        workloads: &[WorkloadKey],
    ) -> Value {
        json!({
            "webhook": "update successful",
            "kind": kind.kind_name(),
            "namespace": namespace,
            "name": name,
            "hash": hash,
            "workloads": workloads.iter().map(|w| json!({"kind": w.kind.name(), "namespace": w.namespace, "name": w.name})).collect::<Vec<_>>(),
        })
    }

    /// The dependents the policy says would reload (decided on the index, without the objects).
    pub fn would_reload(
        policy: &PolicyConfig,
        index: &Index,
        dependents: &[WorkloadKey],
        kind: ResourceKind,
        name: &str,
        flags: ResourceFlags,
    ) -> Vec<WorkloadKey> {
        let r = ResourceRef {
            kind,
            name: name.into(),
        };
        dependents
            .iter()
            .filter(|w| {
                index.workload(w).is_some_and(|e| {
                    decide_with(
                        policy,
                        w.kind,
                        &e.policy(&policy.keys, w.kind),
                        || e.references(&r),
                        kind,
                        name,
                        flags,
                    )
                    .reload
                })
            })
            .cloned()
            .collect()
    }

    /// Queues a notification; never waits.
    pub fn send(&self, payload: Value) {
        if !self
            .outbox
            .try_send("application/json", Bytes::from(payload.to_string()))
        {
            tracing::warn!("webhook-url queue full; notification dropped");
            self.metrics.error(ErrorKind::NotifyDropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver that accepts connections and never answers: every POST times out and is retried,
    /// the notification ends as undelivered, and what does not fit the queue is dropped and counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hanging_receiver_costs_a_bounded_queue_and_timeouts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let (notifier, _sender) = Notifier::with_limits(
            &format!("http://{addr}/hook"),
            metrics.clone(),
            4,
            Duration::from_millis(50),
        )
        .unwrap();
        for i in 0..10 {
            notifier.send(json!({"n": i}));
        }
        // One is being sent, four wait: the other five are dropped at once.
        assert!(metrics.errors_of(ErrorKind::NotifyDropped) >= 5);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while metrics.errors_of(ErrorKind::Notify) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "a timed-out notification was never given up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
