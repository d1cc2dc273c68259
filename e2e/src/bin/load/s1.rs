//! S1: reload latency, from a change's acceptance to the new template in a watch, next to a bare client.

use crate::cluster::{create_pairs, seen, start_rekindle, template_watch};
use crate::measure::{summary, webhook_histogram};
use crate::results::{Latency, S1};
use anyhow::{Context, Result};
use e2e::TestNamespace;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// S1: latency from a ConfigMap update's acceptance to the new template in a Deployment watch.
pub async fn s1(
    client: &Client,
    debounce: &str,
    pairs: usize,
    updates: usize,
    binary: Option<PathBuf>,
) -> Result<S1> {
    let ns = TestNamespace::new(client, "bench-s1").await?;
    let rk = start_rekindle(
        client,
        &ns.name,
        &[&format!("--reload-debounce={debounce}")],
        binary,
    )
    .await?;
    // Created with rekindle running, so the apiserver's view of the webhook covers S1's creates.
    let webhook_before = webhook_histogram(client).await?;
    create_pairs(client, &ns.name, pairs, true).await?;
    let webhook = webhook_histogram(client).await?.minus(&webhook_before);
    let mut rx = template_watch(client, &ns.name);
    tokio::time::sleep(Duration::from_secs(2)).await;
    while rx.try_recv().is_ok() {}
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let mut latencies = Vec::new();
    for u in 0..updates {
        let i = (u * 7919) % pairs;
        let cm = cms
            .patch(
                &format!("cm-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&json!({"data": {"v": format!("u{u}")}})),
            )
            .await?;
        let accepted = Instant::now();
        let want = rekindle::core::hash::configmap_hash_typed(&cm);
        let target = format!("d-{i}");
        let seen = seen(&mut rx, &target, &want, Duration::from_secs(30))
            .await
            .context("a reload was not seen within 30 s")?;
        latencies.push(seen.saturating_duration_since(accepted).as_secs_f64() * 1000.0);
    }
    let reloads = rk.reloads(true).await?;
    rk.stop().await?;
    ns.cleanup().await?;
    Ok(S1 {
        latency: summary(latencies),
        reloads,
        apiserver_webhook_admission: webhook.summary(),
    })
}

/// The physical limit: a bare client PATCHes a template itself and waits for the watch.
pub async fn s1_baseline(client: &Client, pairs: usize, updates: usize) -> Result<Latency> {
    let ns = TestNamespace::new(client, "bench-s1base").await?;
    create_pairs(client, &ns.name, pairs, false).await?;
    let mut rx = template_watch(client, &ns.name);
    tokio::time::sleep(Duration::from_secs(2)).await;
    while rx.try_recv().is_ok() {}
    let ds: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let mut latencies = Vec::new();
    for u in 0..updates {
        let i = (u * 7919) % pairs;
        let value = format!("v{u}");
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "env": [{"name": "X", "value": value}]}]}}}});
        let start = Instant::now();
        ds.patch(
            &format!("d-{i}"),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await?;
        let target = format!("d-{i}");
        let seen = seen(&mut rx, &target, &value, Duration::from_secs(30))
            .await
            .context("own patch not seen")?;
        latencies.push(seen.saturating_duration_since(start).as_secs_f64() * 1000.0);
    }
    ns.cleanup().await?;
    Ok(summary(latencies))
}
