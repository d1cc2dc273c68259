//! S3: the API requests one change costs among many workloads (a needle in a haystack).

use crate::cluster::{create_pairs, quiesce, seen, start_rekindle, template_watch};
use crate::measure::{apiserver_cost, request_counts, workloads_and_configmaps};
use crate::results::S3;
use anyhow::{Context, Result};
use e2e::TestNamespace;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// S3: one ConfigMap changes among many: latency, and the API requests the change cost.
pub async fn s3(client: &Client, workloads: usize, binary: Option<PathBuf>) -> Result<S3> {
    let ns = TestNamespace::new(client, "bench-s3").await?;
    let t = Instant::now();
    create_pairs(client, &ns.name, workloads, true).await?;
    let setup_s = t.elapsed().as_secs_f64();
    let rk = start_rekindle(client, &ns.name, &["--reload-debounce=0"], binary).await?;
    let mut rx = template_watch(client, &ns.name);
    quiesce(client, &ns.name).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    while rx.try_recv().is_ok() {}
    let before = request_counts(client, workloads_and_configmaps).await?;
    let cost_before = apiserver_cost(client).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let target = workloads / 2;
    let cm = cms
        .patch(
            &format!("cm-{target}"),
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": "changed"}})),
        )
        .await?;
    let accepted = Instant::now();
    let want = rekindle::core::hash::configmap_hash_typed(&cm);
    let name = format!("d-{target}");
    let seen = seen(&mut rx, &name, &want, Duration::from_secs(60))
        .await
        .context("the needle was not reloaded")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = request_counts(client, workloads_and_configmaps).await?;
    let cost_after = apiserver_cost(client).await?;
    let delta: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    rk.stop().await?;
    ns.cleanup().await?;
    Ok(S3 {
        workloads,
        configmaps: workloads,
        setup_s,
        latency_ms: seen.saturating_duration_since(accepted).as_secs_f64() * 1000.0,
        api_requests_during_change: delta,
        apiserver_cpu_s: cost_after.0 - cost_before.0,
        apiserver_response_bytes: cost_after.1 - cost_before.1,
    })
}
