//! S7: a storm of changes that reload nothing.

use crate::cluster::{create_pairs, start_rekindle};
use crate::results::S7;
use anyhow::Result;
use e2e::TestNamespace;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// S7: 10 ConfigMaps whose annotations change 20 times a second: no reload, and CPU next to idle.
pub async fn s7(client: &Client, seconds: u64, binary: Option<PathBuf>) -> Result<S7> {
    let ns = TestNamespace::new(client, "bench-s7").await?;
    create_pairs(client, &ns.name, 10, true).await?;
    let rk = start_rekindle(client, &ns.name, &[], binary).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reloads_before = rk.reloads(true).await?;
    let idle_start = rk.cpu_seconds().unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let idle_cpu = rk.cpu_seconds().unwrap_or(0.0) - idle_start;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let storm_start = rk.cpu_seconds().unwrap_or(0.0);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut patches = 0usize;
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        tick.tick().await;
        let i = patches % 10;
        cms.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {"touched": patches.to_string()}}})),
        )
        .await?;
        patches += 1;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let storm_cpu = rk.cpu_seconds().unwrap_or(0.0) - storm_start;
    let reloads = rk.reloads(true).await? - reloads_before;
    rk.stop().await?;
    ns.cleanup().await?;
    Ok(S7 {
        seconds,
        annotation_patches: patches,
        reloads,
        cpu_percent_idle: idle_cpu / seconds as f64 * 100.0,
        cpu_percent_storm: storm_cpu / (seconds as f64 + 2.0) * 100.0,
    })
}
