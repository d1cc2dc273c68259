//! Load scenarios against the real control plane (`just bench`): rekindle's reload latency next to the
//! physical limit, and the API requests one change costs. Writes bench/results/report.{json,md}.
//!
//! Sizes: REKINDLE_BENCH_S1_PAIRS (100), REKINDLE_BENCH_S1_UPDATES (200), REKINDLE_BENCH_S3_WORKLOADS (1000).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::rekindle::{Options, Rekindle};
use e2e::{admin_client, TestNamespace};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(mut ms: Vec<f64>) -> Value {
    ms.sort_by(|a, b| a.total_cmp(b));
    json!({"n": ms.len(), "p50_ms": percentile(&ms, 50.0), "p95_ms": percentile(&ms, 95.0), "p99_ms": percentile(&ms, 99.0)})
}

fn deployment(name: &str, cm: &str, annotated: bool) -> Deployment {
    let annotations = if annotated {
        json!({"reloader.stakater.com/auto": "true"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": cm}}]}]}}}}))
    .expect("static deployment")
}

async fn create_pairs(client: &Client, ns: &str, n: usize, annotated: bool) -> Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let ds: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    futures::stream::iter(0..n)
        .map(|i| {
            let (cms, ds, pp) = (cms.clone(), ds.clone(), pp.clone());
            async move {
                let cm: ConfigMap = serde_json::from_value(
                    json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "0"}}),
                )?;
                cms.create(&pp, &cm).await?;
                ds.create(
                    &pp,
                    &deployment(&format!("d-{i}"), &format!("cm-{i}"), annotated),
                )
                .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    Ok(())
}

/// A watch of Deployments in `ns` reporting (name, template env hash) changes with their arrival time.
fn template_watch(
    client: &Client,
    ns: &str,
) -> tokio::sync::mpsc::UnboundedReceiver<(String, String, Instant)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(ev)) = stream.next().await {
            if let Event::Apply(d) | Event::InitApply(d) = ev {
                let v = serde_json::to_value(&d).unwrap_or_default();
                let marker = v
                    .pointer("/spec/template/spec/containers/0/env/0/value")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let _ = tx.send((d.name_any(), marker, Instant::now()));
            }
        }
    });
    rx
}

/// Waits for the watch to show `name` carrying `marker`; the time it arrived.
async fn seen(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String, Instant)>,
    name: &str,
    marker: &str,
    timeout: Duration,
) -> Option<Instant> {
    let wait = async {
        while let Some((n, m, at)) = rx.recv().await {
            if n == name && m == marker {
                return Some(at);
            }
        }
        None
    };
    tokio::time::timeout(timeout, wait).await.ok().flatten()
}

/// S1: latency from a ConfigMap update's acceptance to the new template in a Deployment watch.
async fn s1(client: &Client, debounce: &str, pairs: usize, updates: usize) -> Result<Value> {
    let ns = TestNamespace::new(client, "bench-s1").await?;
    create_pairs(client, &ns.name, pairs, true).await?;
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            args: &[&format!("--reload-debounce={debounce}")],
            ..Default::default()
        },
    )
    .await?;
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
    let reloads = rk
        .metric("reloader_reload_executed_total{success=\"true\"}")
        .await?;
    rk.stop().await?;
    ns.cleanup().await?;
    let mut s = summary(latencies);
    s["reloads"] = json!(reloads);
    Ok(s)
}

/// The physical limit: a bare client PATCHes a template itself and waits for the watch.
async fn s1_baseline(client: &Client, pairs: usize, updates: usize) -> Result<Value> {
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

async fn request_counts(client: &Client) -> Result<BTreeMap<String, f64>> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').unwrap_or((line, "0"));
        let get = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let resource = get("resource");
        if !matches!(
            resource.as_str(),
            "deployments" | "configmaps" | "statefulsets" | "daemonsets"
        ) || !get("subresource").is_empty()
        {
            continue;
        }
        *out.entry(format!("{} {}", get("verb"), resource))
            .or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

/// S3: one ConfigMap changes among many: latency, and the API requests the change cost.
async fn s3(client: &Client, workloads: usize) -> Result<Value> {
    let ns = TestNamespace::new(client, "bench-s3").await?;
    let t = Instant::now();
    create_pairs(client, &ns.name, workloads, true).await?;
    let setup_s = t.elapsed().as_secs_f64();
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0"],
            ..Default::default()
        },
    )
    .await?;
    let mut rx = template_watch(client, &ns.name);
    tokio::time::sleep(Duration::from_secs(5)).await;
    while rx.try_recv().is_ok() {}
    let before = request_counts(client).await?;
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
    let after = request_counts(client).await?;
    let delta: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    rk.stop().await?;
    ns.cleanup().await?;
    Ok(
        json!({"workloads": workloads, "configmaps": workloads, "setup_s": setup_s,
        "latency_ms": seen.saturating_duration_since(accepted).as_secs_f64() * 1000.0,
        "api_requests_during_change": delta}),
    )
}

/// S4 + S6: memory against the bytes of data watched, and start-up time to /ready.
async fn s4(client: &Client, secrets: usize, configmaps: usize, workloads: usize) -> Result<Value> {
    use k8s_openapi::api::core::v1::Secret;
    let ns = TestNamespace::new(client, "bench-s4").await?;
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let payload = "s".repeat(8 * 1024);
    futures::stream::iter(0..secrets)
        .map(|i| {
            let (api, payload) = (secret_api.clone(), payload.clone());
            async move {
                let s: Secret = serde_json::from_value(json!({"metadata": {"name": format!("s-{i}")}, "stringData": {"blob": payload}}))?;
                api.create(&PostParams::default(), &s).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    create_pairs(client, &ns.name, workloads, true).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in workloads..configmaps.max(workloads) {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "x".repeat(1024)}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let data_bytes = secrets * 8 * 1024 + configmaps.max(workloads) * 1024;
    let started = Instant::now();
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            webhook: false,
            ..Default::default()
        },
    )
    .await?;
    let startup_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_synced = rk.rss_bytes().unwrap_or(0);
    for c in 0..200usize {
        let i = (c * 7919) % workloads;
        cms.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": format!("m{c}")}})),
        )
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_after = rk.rss_bytes().unwrap_or(0);
    rk.stop().await?;
    ns.cleanup().await?;
    Ok(
        json!({"secrets": secrets, "configmaps": configmaps.max(workloads), "workloads": workloads, "data_bytes": data_bytes,
        "startup_to_ready_s": startup_s, "rss_after_sync_bytes": rss_synced, "rss_after_200_changes_bytes": rss_after}),
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = admin_client().await?;
    let pairs = env_usize("REKINDLE_BENCH_S1_PAIRS", 100);
    let updates = env_usize("REKINDLE_BENCH_S1_UPDATES", 200);
    let s3_n = env_usize("REKINDLE_BENCH_S3_WORKLOADS", 1000);
    eprintln!("S1 ({pairs} pairs, {updates} updates) debounce=0 …");
    let s1_zero = s1(&client, "0", pairs, updates).await?;
    eprintln!("S1 default debounce …");
    let s1_default = s1(&client, "250ms", pairs, updates).await?;
    eprintln!("S1 baseline (bare client) …");
    let base = s1_baseline(&client, pairs, updates).await?;
    eprintln!("S3 ({s3_n} Deployments + ConfigMaps) …");
    let s3 = s3(&client, s3_n).await?;
    let mut s4_runs = Vec::new();
    for secrets in env_usize("REKINDLE_BENCH_S4_SECRETS", 4000)
        .to_string()
        .split(',')
        .filter_map(|v| v.parse::<usize>().ok())
    {
        for fraction in [4usize, 2, 1] {
            let n = secrets / fraction;
            eprintln!("S4/S6 ({n} Secrets of 8 KiB) …");
            s4_runs.push(s4(&client, n, 1000, 200).await?);
        }
    }
    let version = client.apiserver_version().await?.git_version;
    let report = json!({
        "kubernetes": version,
        "machine": format!("{} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)),
        "s1_latency": {"debounce_0": s1_zero, "debounce_250ms": s1_default, "bare_client_baseline": base},
        "s3_needle": s3,
        "s4_memory_s6_startup": s4_runs,
    });
    let dir = e2e::root().join("bench/results");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let row = |label: &str, v: &Value| {
        format!(
            "| {label} | {} | {:.1} | {:.1} | {:.1} |\n",
            v["n"],
            v["p50_ms"].as_f64().unwrap_or(f64::NAN),
            v["p95_ms"].as_f64().unwrap_or(f64::NAN),
            v["p99_ms"].as_f64().unwrap_or(f64::NAN)
        )
    };
    let mut md = format!("# Load scenarios\n\nKubernetes {version}, {} — a shared, noisy machine: read medians and ratios.\n\n", report["machine"].as_str().unwrap_or(""));
    md += &format!("## S1 latency: {pairs} ConfigMaps ↔ {pairs} Deployments, {updates} updates\n\nFrom the update's acceptance to the new template in a watch.\n\n| | n | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|---|\n");
    md += &row(
        "rekindle, --reload-debounce=0",
        &report["s1_latency"]["debounce_0"],
    );
    md += &row(
        "rekindle, default debounce (250ms)",
        &report["s1_latency"]["debounce_250ms"],
    );
    md += &row(
        "bare client PATCHing the template (limit)",
        &report["s1_latency"]["bare_client_baseline"],
    );
    md += &format!("\n## S3 needle in a haystack: {s3_n} Deployments and {s3_n} ConfigMaps in one namespace, one changes\n\nLatency {:.1} ms. API requests during the change (apiserver_request_total delta, all clients, main resources):\n\n| verb resource | requests |\n|---|---|\n", report["s3_needle"]["latency_ms"].as_f64().unwrap_or(f64::NAN));
    for (k, v) in report["s3_needle"]["api_requests_during_change"]
        .as_object()
        .into_iter()
        .flatten()
    {
        md += &format!("| {k} | {v} |\n");
    }
    md += "\n## S4 memory and S6 start-up: Secrets of 8 KiB, 1,000 ConfigMaps, 200 Deployments\n\nRSS of rekindle (release build) against the bytes of data it watches; start-up is process start to `/ready`.\n\n| Secrets | data watched MiB | start-up to /ready s | RSS after sync MiB | RSS after 200 changes MiB |\n|---|---|---|---|---|\n";
    for r in report["s4_memory_s6_startup"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let mib = |k: &str| r[k].as_f64().unwrap_or(0.0) / 1048576.0;
        md += &format!(
            "| {} | {:.1} | {:.2} | {:.1} | {:.1} |\n",
            r["secrets"],
            mib("data_bytes"),
            r["startup_to_ready_s"].as_f64().unwrap_or(0.0),
            mib("rss_after_sync_bytes"),
            mib("rss_after_200_changes_bytes")
        );
    }
    std::fs::write(dir.join("report.md"), &md)?;
    println!("{md}");
    Ok(())
}
