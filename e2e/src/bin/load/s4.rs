//! S4: memory against the data watched; with several starts over the same objects, the S6 start-up.

use crate::args::Sizes;
use crate::cluster::{create_many, create_pairs_with, quiesce, seen, settle, template_watch};
use crate::measure::apiserver_cost;
use crate::results::{Start, Starts, VsStarts, S4};
use anyhow::Result;
use e2e::rekindle::{Options, Rekindle};
use e2e::TestNamespace;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::time::{Duration, Instant};

/// S4 + S6: memory against the bytes of data watched, and start-up time to /ready.
pub async fn s4(
    client: &Client,
    secrets: usize,
    configmaps: usize,
    workloads: usize,
    sizes: &Sizes,
) -> Result<S4> {
    let one_start = Sizes {
        s6_starts: 1,
        ..sizes.clone()
    };
    s4_with(client, secrets, configmaps, workloads, &[], &one_start).await
}

/// S4/S6 with extra rekindle flags (an A/B of one setting).
pub async fn s4_with(
    client: &Client,
    secrets: usize,
    configmaps: usize,
    workloads: usize,
    args: &[&str],
    sizes: &Sizes,
) -> Result<S4> {
    use k8s_openapi::api::core::v1::Secret;
    let starts = sizes.s6_starts;
    quiesce(client, "").await?;
    let ns = TestNamespace::new(client, "bench-s4").await?;
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let payload = "s".repeat(8 * 1024);
    create_many(0..secrets, |i| {
        let (api, payload) = (secret_api.clone(), payload.clone());
        async move {
            let s: Secret = serde_json::from_value(
                json!({"metadata": {"name": format!("s-{i}")}, "stringData": {"blob": payload}}),
            )?;
            api.create(&PostParams::default(), &s).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    // Paused: start-up is timed against a quiet control plane, not one creating a ReplicaSet and a
    // Pod for each of thousands of Deployments (that took over half an hour here).
    create_pairs_with(client, &ns.name, workloads, true, true).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in workloads..configmaps.max(workloads) {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "x".repeat(1024)}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let data_bytes = secrets * 8 * 1024 + configmaps.max(workloads) * 1024;
    let mut rx = template_watch(client, &ns.name);
    let settled_s = settle(client).await?;
    while rx.try_recv().is_ok() {}
    // Start-up is timed `starts` times over the same objects (the median is reported); memory after
    // changes is measured in the first start only.
    // With REKINDLE_BENCH_S6_VS=BIN, each start is timed for that binary too, over the same objects,
    // the two taking turns to go first.
    let vs = sizes.s6_vs.clone();
    let mut runs = Vec::new();
    let mut vs_runs = Vec::new();
    let (mut rss_synced, mut rss_after) = (0, 0);
    for turn in 0..starts.max(1) * if vs.is_some() { 2 } else { 1 } {
        let (start, other) = match &vs {
            Some(_) => (turn / 2, (turn % 2 == 1) != (turn / 2 % 2 == 1)),
            None => (turn, false),
        };
        if turn > 0 {
            settle(client).await?;
        }
        let apiserver_before = apiserver_cost(client).await?.0;
        let started = Instant::now();
        let rk = Rekindle::start(
            client,
            &[&ns.name],
            Options {
                webhook: false,
                wait_ready: false,
                args,
                binary: if other { vs.clone() } else { None },
                ..Default::default()
            },
        )
        .await?;
        // A change made while rekindle starts: when is it reloaded, against when /ready answers?
        let changed = cms
            .patch(
                "cm-0",
                &PatchParams::default(),
                &Patch::Merge(&json!({"data": {"v": format!("during-start-up-{turn}")}})),
            )
            .await?;
        let want = rekindle::core::hash::configmap_hash_typed(&changed);
        rk.wait_ready_every(Duration::from_millis(10)).await?;
        let startup_s = started.elapsed().as_secs_f64();
        let cpu_s = rk.cpu_seconds();
        let apiserver_cpu_s = apiserver_cost(client).await?.0 - apiserver_before;
        let first_reload_s = seen(&mut rx, "d-0", &want, Duration::from_secs(60))
            .await
            .map(|at| at.saturating_duration_since(started).as_secs_f64());
        let run = Start {
            startup_to_ready_s: startup_s,
            first_reload_after_start_s: first_reload_s,
            cpu_to_ready_s: cpu_s,
            apiserver_cpu_to_ready_s: apiserver_cpu_s,
        };
        if other {
            vs_runs.push(run);
        } else {
            runs.push(run);
        }
        if start > 0 || other {
            rk.stop().await?;
            continue;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        rss_synced = rk.rss_bytes().unwrap_or(0);
        for c in 0..1000usize {
            let i = (c * 7919) % workloads;
            cms.patch(
                &format!("cm-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&json!({"data": {"v": format!("m{c}")}})),
            )
            .await?;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        rss_after = rk.rss_bytes().unwrap_or(0);
        rk.stop().await?;
        // The reloads of the changes above, so that the next start finds nothing stale but cm-0.
        while rx.try_recv().is_ok() {}
    }
    if sizes.s6_keep {
        eprintln!("S6: objects kept in namespace {}", ns.keep());
    } else {
        ns.cleanup().await?;
    }
    let vs = vs.map(|bin| VsStarts {
        binary: bin.display().to_string(),
        medians: Starts::median_of(&vs_runs),
        starts: vs_runs,
    });
    Ok(S4 {
        lists: None,
        secrets,
        configmaps: configmaps.max(workloads),
        workloads,
        data_bytes,
        settled_s,
        medians: Starts::median_of(&runs),
        starts: runs,
        rss_after_sync_bytes: rss_synced,
        rss_after_changes_bytes: rss_after,
        vs,
    })
}
