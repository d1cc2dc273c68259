//! The admission webhook: the handler over what the index knows, its TLS listener, and the
//! certificate kept fresh beside it.

use std::sync::Arc;

use super::clients::self_username;
use super::supervisor::Beside;
use anyhow::{Context, Result};
use kube::Client;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admission::{self, http as admission_http, Admission};
use crate::config::Config;
use crate::core::{ResourceKind, WorkloadKind};
use crate::metrics::Metrics;
use crate::server::admin::Health;
use crate::server::{bind, tls};
use crate::watch::Ctx;

/// The admission webhook, when TLS is configured: stamps what the index knows, and (with
/// `--admission-lookup`) reads what it misses.
pub(super) async fn start_webhook(
    config: &Config,
    client: &Client,
    health: &Arc<Health>,
    ctx: &Ctx,
    kinds: Vec<WorkloadKind>,
    shutdown: &CancellationToken,
    beside: &mut Beside,
) -> Result<Option<JoinHandle<()>>> {
    let metrics = &ctx.metrics;
    let admission = Admission {
        plan: config.plan.clone(),
        scope: ctx.scope.clone(),
        index: ctx.index.clone(),
        metrics: metrics.clone(),
        self_username: self_username(client).await,
        notify_only: ctx.sink.triggers().is_none(),
        kinds,
        lookup: config
            .admission_lookup
            .then(|| admission_lookup(config, client, health, metrics)),
    };
    serve_webhook(config, Arc::new(admission), metrics, shutdown, beside).await
}

/// `--admission-lookup`: reads at admission what the index does not know yet, of the watched kinds.
fn admission_lookup(
    config: &Config,
    client: &Client,
    health: &Arc<Health>,
    metrics: &Arc<Metrics>,
) -> Arc<admission::lookup::Lookup> {
    let watched = [
        (ResourceKind::ConfigMap, !config.ignore_configmaps),
        (ResourceKind::Secret, !config.ignore_secrets),
    ];
    Arc::new(admission::lookup::Lookup::new(
        client.clone(),
        health.clone(),
        config.plan.policy.keys.clone(),
        config.resource_label_selector.clone(),
        watched
            .iter()
            .filter(|(_, w)| *w)
            .map(|(k, _)| *k)
            .collect(),
        metrics.clone(),
    ))
}

/// The admission webhook over TLS, when a certificate is given.
async fn serve_webhook(
    config: &Config,
    admission: Arc<Admission>,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    beside: &mut Beside,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let webhook = &config.webhook;
    let (Some(cert), Some(key)) = (&webhook.tls_cert_file, &webhook.tls_key_file) else {
        tracing::warn!("no --tls-cert-file/--tls-key-file: the admission webhook is off; workloads are found by the watch only");
        return Ok(None);
    };
    let certs = tls::ReloadingCert::new(cert, key)?;
    let tls_config = tls::server_config(
        certs.clone(),
        webhook.tls_min_version,
        webhook.webhook_http2,
    )?;
    let listener = bind(webhook.webhook_addr)
        .await
        .with_context(|| format!("binding --webhook-addr {}", webhook.webhook_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "admission webhook listening");
    beside.add(
        "the certificate refresh",
        certs.keep_fresh(metrics.clone(), shutdown.clone()),
    );
    Ok(Some(tokio::spawn(tls::serve(
        listener,
        tls_config,
        admission_http::router(admission),
        metrics.clone(),
        shutdown.clone(),
    ))))
}
