//! S2: fan-out, one ConfigMap used by many Deployments.

use crate::cluster::{create_many, deployment, start_rekindle, template_watch};
use crate::measure::summary;
use crate::results::S2;
use anyhow::Result;
use e2e::TestNamespace;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// S2: one ConfigMap referenced by `n` Deployments changes; time until every one is patched.
pub async fn s2(client: &Client, debounce: &str, n: usize, binary: Option<PathBuf>) -> Result<S2> {
    let ns = TestNamespace::new(client, "bench-s2").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "shared"}, "data": {"v": "0"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    let rk = start_rekindle(
        client,
        &ns.name,
        &[&format!("--reload-debounce={debounce}")],
        binary,
    )
    .await?;
    let ds: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    create_many(0..n, |i| {
        let ds = ds.clone();
        async move {
            ds.create(
                &PostParams::default(),
                &deployment(&format!("d-{i}"), "shared", true, false),
            )
            .await?;
            anyhow::Ok(())
        }
    })
    .await?;
    let mut rx = template_watch(client, &ns.name);
    tokio::time::sleep(Duration::from_secs(3)).await;
    while rx.try_recv().is_ok() {}
    let cm = cms
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": "1"}})),
        )
        .await?;
    let accepted = Instant::now();
    let want = rekindle::core::hash::configmap_hash_typed(&cm);
    let mut done: BTreeMap<String, f64> = BTreeMap::new();
    let deadline = accepted + Duration::from_secs(600);
    while done.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some((name, marker, at))) if marker == want => {
                done.entry(name)
                    .or_insert(at.saturating_duration_since(accepted).as_secs_f64() * 1000.0);
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let reloads = rk.reloads(true).await?;
    rk.stop().await?;
    ns.cleanup().await?;
    let all_s = done.values().copied().fold(0.0, f64::max) / 1000.0;
    Ok(S2 {
        latency: summary(done.values().copied().collect()),
        workloads: n,
        patched: done.len(),
        all_patched_s: all_s,
        reloads,
    })
}
