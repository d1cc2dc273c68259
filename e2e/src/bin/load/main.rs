//! Load scenarios against the real control plane (`just bench`): reload latency next to the physical
//! limit (S1), fan-out (S2), the API requests one change costs (S3), memory against data (S4), the
//! webhook alone (S5), start-up (S6) and a no-op storm (S7). Writes bench/results/report.{json,md} and
//! PNG plots. `--vs BIN` runs S1, S2, S3, S5 and S7 a second time against another rekindle-compatible
//! binary and reports both side by side.
//!
//! S8 (the writer at a fixed pace, with and without a busy writer of the same Deployments, and a
//! ConfigMap + Secret pair) and S9 (index memory per object) run in both modes; `--only writer` runs
//! S3 at 1,000 and 5,000 Deployments, S8 and S9 alone and writes bench/results/writer.{json,md};
//! `--only s8` and `--only s9` run one of them (bench/results/s8.* or s9.*). `--only s5` runs S5 alone
//! in rounds (REKINDLE_BENCH_S5_ROUNDS, 3), taking turns with the `--vs` binary if one is given
//! (bench/results/s5.*). `--only csi` measures SecretProviderClassPodStatus objects (bench/results/csi.*,
//! REKINDLE_BENCH_CSI_STATUSES, 10000).
//!
//! Sizes: REKINDLE_BENCH_S9_STEP (10000), REKINDLE_BENCH_S1_PAIRS (100), REKINDLE_BENCH_S1_UPDATES (500), REKINDLE_BENCH_S2_WORKLOADS (500),
//! REKINDLE_BENCH_S3_WORKLOADS (5000), REKINDLE_BENCH_S4_SECRETS (comma list, 20000),
//! REKINDLE_BENCH_S5_SECONDS (10), REKINDLE_BENCH_S6_WORKLOADS (10000, 0 skips the full-size S6),
//! REKINDLE_BENCH_S6_RESOURCES (25000), REKINDLE_BENCH_S6_STARTS (3, start-ups timed over the same
//! objects; REKINDLE_BENCH_S6_KEEP=1 leaves them in their namespace; REKINDLE_BENCH_S6_VS=BIN times
//! each start for another binary too, taking turns; REKINDLE_BENCH_S6_PAGED=0 skips paged lists), REKINDLE_BENCH_S7_SECONDS (30), REKINDLE_BENCH_S8_ROUNDS (3), REKINDLE_BENCH_S8_UPDATES
//! (300 changes per run at 10/s, a fifth of it at 2/s).
//! Output: REKINDLE_BENCH_OUT
//! (bench/results).

mod admission;
mod csi;
mod plots;
mod writer;

use std::collections::BTreeMap;
use std::path::PathBuf;
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

/// The median of the values, `None` for none.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| percentile(&v, 50.0))
}

/// Where reports are written: REKINDLE_BENCH_OUT, else bench/results; created if missing.
fn results_dir() -> Result<PathBuf> {
    let dir = std::env::var_os("REKINDLE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| e2e::root().join("bench/results"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn summary(mut ms: Vec<f64>) -> Value {
    ms.sort_by(|a, b| a.total_cmp(b));
    json!({"n": ms.len(), "p50_ms": percentile(&ms, 50.0), "p95_ms": percentile(&ms, 95.0), "p99_ms": percentile(&ms, 99.0),
        "samples_ms": ms})
}

fn deployment(name: &str, cm: &str, annotated: bool, paused: bool) -> Deployment {
    let annotations = if annotated {
        json!({"reloader.stakater.com/auto": "true"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": 1, "paused": paused, "selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": cm}}]}]}}}}))
    .expect("static deployment")
}

async fn create_pairs(client: &Client, ns: &str, n: usize, annotated: bool) -> Result<()> {
    create_pairs_with(client, ns, n, annotated, false).await
}

/// [`create_pairs`], the Deployments `paused` if asked: no ReplicaSets or Pods are made for them, so
/// the control plane is quiet again within a minute of creating thousands.
async fn create_pairs_with(
    client: &Client,
    ns: &str,
    n: usize,
    annotated: bool,
    paused: bool,
) -> Result<()> {
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
                let cm = cms.create(&pp, &cm).await?;
                let mut d = deployment(&format!("d-{i}"), &format!("cm-{i}"), annotated, paused);
                if annotated {
                    // Stamped as the webhook stamps at creation, whether or not rekindle runs now, so
                    // changes made while rekindle starts are owed (absent markers are left alone).
                    let marker = k8s_openapi::api::core::v1::EnvVar {
                        name: rekindle::core::envname::env_var_name(
                            &format!("cm-{i}"),
                            rekindle::core::ResourceKind::ConfigMap,
                        ),
                        value: Some(rekindle::core::hash::configmap_hash_typed(&cm)),
                        ..Default::default()
                    };
                    if let Some(c) = d
                        .spec
                        .as_mut()
                        .and_then(|s| s.template.spec.as_mut())
                        .and_then(|p| p.containers.first_mut())
                    {
                        c.env = Some(vec![marker]);
                    }
                }
                ds.create(&pp, &d).await?;
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
async fn s1(
    client: &Client,
    debounce: &str,
    pairs: usize,
    updates: usize,
    binary: Option<PathBuf>,
) -> Result<Value> {
    let ns = TestNamespace::new(client, "bench-s1").await?;
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            args: &[&format!("--reload-debounce={debounce}")],
            binary,
            ..Default::default()
        },
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
    let mut s = summary(latencies);
    s["reloads"] = json!(reloads);
    s["apiserver_webhook_admission"] = webhook.summary();
    Ok(s)
}

/// The apiserver's own `apiserver_admission_webhook_admission_duration_seconds` for rekindle's webhook.
#[derive(Default)]
struct Histogram {
    buckets: BTreeMap<String, f64>,
    sum: f64,
    count: f64,
}

impl Histogram {
    fn minus(mut self, before: &Histogram) -> Histogram {
        for (le, v) in self.buckets.iter_mut() {
            *v -= before.buckets.get(le).copied().unwrap_or(0.0);
        }
        self.sum -= before.sum;
        self.count -= before.count;
        self
    }

    /// Mean, and the upper bound of the bucket holding p50 and p99.
    fn summary(&self) -> Value {
        let mut bounds: Vec<(f64, f64)> = self
            .buckets
            .iter()
            .filter_map(|(le, v)| {
                Some((
                    if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().ok()?
                    },
                    *v,
                ))
            })
            .collect();
        bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let quantile = |q: f64| {
            bounds
                .iter()
                .find(|(_, c)| *c >= q * self.count)
                .map(|(le, _)| le * 1000.0)
                .unwrap_or(f64::NAN)
        };
        json!({"requests": self.count, "mean_ms": if self.count > 0.0 { self.sum / self.count * 1000.0 } else { f64::NAN },
            "p50_bucket_le_ms": quantile(0.5), "p99_bucket_le_ms": quantile(0.99)})
    }
}

async fn webhook_histogram(client: &Client) -> Result<Histogram> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(Histogram::parse(
        &text,
        "apiserver_admission_webhook_admission_duration_seconds",
        |l| l.contains("name=\"workloads.rekindle.io\"") && l.contains("type=\"admit\""),
    ))
}

impl Histogram {
    /// The series of histogram `name` in Prometheus text whose line passes `keep`, summed.
    fn parse(text: &str, name: &str, keep: impl Fn(&str) -> bool) -> Histogram {
        let mut h = Histogram::default();
        for line in text.lines().filter(|l| l.starts_with(name) && keep(l)) {
            let (labels, value) = line.rsplit_once(' ').unwrap_or((line, "0"));
            let value: f64 = value.parse().unwrap_or(0.0);
            if line.starts_with(&format!("{name}_bucket")) {
                let le = labels
                    .split("le=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("")
                    .to_string();
                *h.buckets.entry(le).or_default() += value;
            } else if line.starts_with(&format!("{name}_sum")) {
                h.sum += value;
            } else if line.starts_with(&format!("{name}_count")) {
                h.count += value;
            }
        }
        h
    }
}

/// rekindle's own `rekindle_admission_duration_seconds`: time inside the handler, without TLS and HTTP.
async fn handler_histogram(rk: &Rekindle) -> Result<Histogram> {
    Ok(Histogram::parse(
        &rk.metrics().await?,
        "rekindle_admission_duration_seconds",
        |_| true,
    ))
}

/// S2: one ConfigMap referenced by `n` Deployments changes; time until every one is patched.
async fn s2(client: &Client, debounce: &str, n: usize, binary: Option<PathBuf>) -> Result<Value> {
    let ns = TestNamespace::new(client, "bench-s2").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "shared"}, "data": {"v": "0"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            args: &[&format!("--reload-debounce={debounce}")],
            binary,
            ..Default::default()
        },
    )
    .await?;
    let ds: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    futures::stream::iter(0..n)
        .map(|i| {
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
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
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
    let mut s = summary(done.values().copied().collect());
    s["workloads"] = json!(n);
    s["patched"] = json!(done.len());
    s["all_patched_s"] = json!(all_s);
    s["reloads"] = json!(reloads);
    Ok(s)
}

/// S5: the webhook alone, from this process, over keep-alive TLS: first with client and server sharing
/// every core, then (on a machine with two or more) with the server pinned to one core and this client to
/// another, as when the apiserver runs on a different node.
async fn s5(client: &Client, seconds: u64, binary: Option<PathBuf>) -> Result<Value> {
    let ns = TestNamespace::new(client, "bench-s5").await?;
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            binary,
            ..Default::default()
        },
    )
    .await?;
    let https = admission::client(&e2e::state_dir().join("pki/ca.crt"))?;
    let url: hyper::Uri = format!("https://127.0.0.1:{}/mutate", rk.webhook_port).parse()?;
    let body = admission::review(&ns.name);
    // Warm the connection pool.
    let _ = admission::fixed_rate(&https, &url, &body, 200, 1).await?;
    let mut result = s5_phase(&rk, &https, &url, &body, seconds).await?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pinned = match rk.pid() {
        Some(pid) if cores >= 2 => {
            let all = format!("0-{}", cores - 1);
            if pin(pid, "1") && pin(std::process::id(), "0") {
                let phase = s5_phase(&rk, &https, &url, &body, seconds).await;
                pin(std::process::id(), &all);
                Some(phase?)
            } else {
                None
            }
        }
        _ => None,
    };
    result["rss_bytes"] = json!(rk.rss_bytes().unwrap_or(0));
    rk.stop().await?;
    ns.cleanup().await?;
    result["review_bytes"] = json!(body.len());
    result["pinned"] = json!(pinned);
    result["note"] = json!(
        "client and server share the machine's cores; `pinned`: server on core 1, client on core 0"
    );
    Ok(result)
}

/// Sets the CPU affinity of every thread of `pid` (`taskset`); false when that is not possible here.
fn pin(pid: u32, cpus: &str) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One S5 measurement: latency at 1,000 req/s (client side, and inside the handler from rekindle's own
/// histogram), then the highest rate 32 keep-alive connections sustain and the server CPU it costs.
async fn s5_phase(
    rk: &Rekindle,
    https: &admission::Https,
    url: &hyper::Uri,
    body: &bytes::Bytes,
    seconds: u64,
) -> Result<Value> {
    let handler_before = handler_histogram(rk).await?;
    let (latencies, errors_1k) = admission::fixed_rate(https, url, body, 1000, seconds).await?;
    let handler = handler_histogram(rk).await?.minus(&handler_before);
    let cpu_before = rk.cpu_seconds().unwrap_or(0.0);
    let (max_rps, errors_max) = admission::max_rate(https, url, body, 32, seconds).await?;
    let cpu_s = rk.cpu_seconds().unwrap_or(0.0) - cpu_before;
    let mut at_1k = summary(latencies);
    at_1k["errors"] = json!(errors_1k);
    at_1k["handler"] = handler.summary();
    Ok(
        json!({"at_1000_rps": at_1k, "max_sustained_rps": max_rps, "max_errors": errors_max,
        "server_cpu_s_during_max": cpu_s,
        "server_cpu_us_per_request": cpu_s / (max_rps * seconds as f64).max(1.0) * 1e6}),
    )
}

/// S7: 10 ConfigMaps whose annotations change 20 times a second: no reload, and CPU next to idle.
async fn s7(client: &Client, seconds: u64, binary: Option<PathBuf>) -> Result<Value> {
    let ns = TestNamespace::new(client, "bench-s7").await?;
    create_pairs(client, &ns.name, 10, true).await?;
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            binary,
            ..Default::default()
        },
    )
    .await?;
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
    Ok(
        json!({"seconds": seconds, "annotation_patches": patches, "reloads": reloads,
        "cpu_percent_idle": idle_cpu / seconds as f64 * 100.0,
        "cpu_percent_storm": storm_cpu / (seconds as f64 + 2.0) * 100.0}),
    )
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

/// The apiserver's CPU seconds (`process_cpu_seconds_total`) and the bytes of all its responses
/// (`apiserver_response_sizes_sum`), from its /metrics.
async fn apiserver_cost(client: &Client) -> Result<(f64, f64)> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let value = |l: &str| {
        l.rsplit_once(' ')
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = text
        .lines()
        .find(|l| l.starts_with("process_cpu_seconds_total "))
        .map(value)
        .unwrap_or(f64::NAN);
    let bytes = text
        .lines()
        .filter(|l| l.starts_with("apiserver_response_sizes_sum{"))
        .map(value)
        .sum();
    Ok((cpu, bytes))
}

/// Waits until the namespaces of earlier scenarios are gone, so their deletion's API traffic does not
/// land in a measurement.
async fn quiesce(client: &Client, keep: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let others = api
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|n| {
                let name = n.name_any();
                name.starts_with("bench-") && name != keep
            })
            .count();
        if others == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("warning: earlier bench namespaces still terminating");
    Ok(())
}

/// Waits (up to 10 minutes) until the apiserver uses under half a core over 3 s: the control plane
/// has finished with the objects just made (with 35,000 objects it idles at about a third of a core
/// here, making them takes all of one). Returns the seconds waited.
async fn settle(client: &Client) -> Result<f64> {
    let started = Instant::now();
    let mut before = apiserver_cost(client).await?.0;
    while started.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = apiserver_cost(client).await?.0;
        if now - before < 1.5 {
            return Ok(started.elapsed().as_secs_f64());
        }
        before = now;
    }
    eprintln!("warning: the apiserver was still busy after 10 minutes");
    Ok(started.elapsed().as_secs_f64())
}

/// S3: one ConfigMap changes among many: latency, and the API requests the change cost.
async fn s3(client: &Client, workloads: usize, binary: Option<PathBuf>) -> Result<Value> {
    let ns = TestNamespace::new(client, "bench-s3").await?;
    let t = Instant::now();
    create_pairs(client, &ns.name, workloads, true).await?;
    let setup_s = t.elapsed().as_secs_f64();
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0"],
            binary,
            ..Default::default()
        },
    )
    .await?;
    let mut rx = template_watch(client, &ns.name);
    quiesce(client, &ns.name).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    while rx.try_recv().is_ok() {}
    let before = request_counts(client).await?;
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
    let after = request_counts(client).await?;
    let cost_after = apiserver_cost(client).await?;
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
        "api_requests_during_change": delta,
        "apiserver_cpu_s": cost_after.0 - cost_before.0, "apiserver_response_bytes": cost_after.1 - cost_before.1}),
    )
}

/// S4 + S6: memory against the bytes of data watched, and start-up time to /ready.
async fn s4(client: &Client, secrets: usize, configmaps: usize, workloads: usize) -> Result<Value> {
    s4_with(client, secrets, configmaps, workloads, &[], 1).await
}

/// S4/S6 with extra rekindle flags (an A/B of one setting).
async fn s4_with(
    client: &Client,
    secrets: usize,
    configmaps: usize,
    workloads: usize,
    args: &[&str],
    starts: usize,
) -> Result<Value> {
    use k8s_openapi::api::core::v1::Secret;
    quiesce(client, "").await?;
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
    let vs = std::env::var_os("REKINDLE_BENCH_S6_VS").map(PathBuf::from);
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
        let run = json!({"startup_to_ready_s": startup_s, "first_reload_after_start_s": first_reload_s,
            "cpu_to_ready_s": cpu_s, "apiserver_cpu_to_ready_s": apiserver_cpu_s});
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
    if std::env::var_os("REKINDLE_BENCH_S6_KEEP").is_some() {
        eprintln!("S6: objects kept in namespace {}", ns.keep());
    } else {
        ns.cleanup().await?;
    }
    let median_of = |runs: &[Value], field: &str| {
        median(runs.iter().filter_map(|r| r[field].as_f64()).collect())
    };
    let median = |field: &str| median_of(&runs, field);
    let vs_report = vs.as_ref().map(|bin| {
        json!({"binary": bin.display().to_string(), "starts": vs_runs,
            "startup_to_ready_s": median_of(&vs_runs, "startup_to_ready_s"),
            "first_reload_after_start_s": median_of(&vs_runs, "first_reload_after_start_s"),
            "cpu_to_ready_s": median_of(&vs_runs, "cpu_to_ready_s"),
            "apiserver_cpu_to_ready_s": median_of(&vs_runs, "apiserver_cpu_to_ready_s")})
    });
    Ok(
        json!({"secrets": secrets, "configmaps": configmaps.max(workloads), "workloads": workloads, "data_bytes": data_bytes, "settled_s": settled_s,
        "startup_to_ready_s": median("startup_to_ready_s"), "first_reload_after_start_s": median("first_reload_after_start_s"),
        "cpu_to_ready_s": median("cpu_to_ready_s"), "apiserver_cpu_to_ready_s": median("apiserver_cpu_to_ready_s"), "starts": runs,
        "rss_after_sync_bytes": rss_synced, "rss_after_changes_bytes": rss_after, "vs": vs_report}),
    )
}

/// The scenarios run for each binary compared: S1 (both debounces), S2, S3, S5, S7.
async fn comparable(client: &Client, sizes: &Sizes, binary: Option<PathBuf>) -> Result<Value> {
    let who = binary
        .as_ref()
        .map(|b| b.display().to_string())
        .unwrap_or_else(|| "rekindle".into());
    eprintln!(
        "[{who}] S1 ({} pairs, {} updates) debounce=0 …",
        sizes.pairs, sizes.updates
    );
    let s1_zero = s1(client, "0", sizes.pairs, sizes.updates, binary.clone()).await?;
    eprintln!("[{who}] S1 default debounce …");
    let s1_default = s1(client, "250ms", sizes.pairs, sizes.updates, binary.clone()).await?;
    eprintln!("[{who}] S2 fan-out ({} Deployments) …", sizes.s2);
    let s2_zero = s2(client, "0", sizes.s2, binary.clone()).await?;
    let s2_default = s2(client, "250ms", sizes.s2, binary.clone()).await?;
    eprintln!("[{who}] S3 ({} Deployments + ConfigMaps) …", sizes.s3);
    let s3 = s3(client, sizes.s3, binary.clone()).await?;
    eprintln!("[{who}] S5 admission …");
    let s5 = s5(client, sizes.s5_seconds, binary.clone()).await?;
    eprintln!("[{who}] S7 no-op storm …");
    let s7 = s7(client, sizes.s7_seconds, binary).await?;
    Ok(json!({
        "s1_latency": {"debounce_0": s1_zero, "debounce_250ms": s1_default},
        "s2_fanout": {"debounce_0": s2_zero, "debounce_250ms": s2_default},
        "s3_needle": s3,
        "s5_admission": s5,
        "s7_noop_storm": s7,
    }))
}

struct Sizes {
    pairs: usize,
    updates: usize,
    s2: usize,
    s3: usize,
    s5_seconds: u64,
    s7_seconds: u64,
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The headline numbers of one run, as (label, value, unit) rows; `--vs` puts two side by side.
fn headline(r: &Value) -> Vec<(&'static str, f64, &'static str)> {
    vec![
        (
            "S1 p50, debounce 0",
            f(&r["s1_latency"]["debounce_0"]["p50_ms"]),
            "ms",
        ),
        (
            "S1 p99, debounce 0",
            f(&r["s1_latency"]["debounce_0"]["p99_ms"]),
            "ms",
        ),
        (
            "S1 p50, debounce 250ms",
            f(&r["s1_latency"]["debounce_250ms"]["p50_ms"]),
            "ms",
        ),
        (
            "S2 all patched, debounce 0",
            f(&r["s2_fanout"]["debounce_0"]["all_patched_s"]),
            "s",
        ),
        (
            "S2 all patched, debounce 250ms",
            f(&r["s2_fanout"]["debounce_250ms"]["all_patched_s"]),
            "s",
        ),
        ("S3 latency", f(&r["s3_needle"]["latency_ms"]), "ms"),
        (
            "S3 LIST deployments during the change",
            r["s3_needle"]["api_requests_during_change"]["LIST deployments"]
                .as_f64()
                .unwrap_or(0.0),
            "requests",
        ),
        (
            "S5 p50 at 1000 req/s",
            f(&r["s5_admission"]["at_1000_rps"]["p50_ms"]),
            "ms",
        ),
        (
            "S5 p99 at 1000 req/s",
            f(&r["s5_admission"]["at_1000_rps"]["p99_ms"]),
            "ms",
        ),
        (
            "S5 max sustained",
            f(&r["s5_admission"]["max_sustained_rps"]),
            "req/s",
        ),
        (
            "S5 p99 at 1000 req/s, pinned cores",
            f(&r["s5_admission"]["pinned"]["at_1000_rps"]["p99_ms"]),
            "ms",
        ),
        (
            "S5 max sustained, pinned cores",
            f(&r["s5_admission"]["pinned"]["max_sustained_rps"]),
            "req/s",
        ),
        (
            "S7 reloads during the storm",
            f(&r["s7_noop_storm"]["reloads"]),
            "",
        ),
        (
            "S7 CPU during the storm",
            f(&r["s7_noop_storm"]["cpu_percent_storm"]),
            "%",
        ),
    ]
}

fn samples(v: &Value) -> Vec<f64> {
    v["samples_ms"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let vs: Option<PathBuf> = match args.iter().position(|a| a == "--vs") {
        Some(i) => Some(PathBuf::from(
            args.get(i + 1).context("--vs needs a binary")?,
        )),
        None => args
            .iter()
            .find_map(|a| a.strip_prefix("--vs="))
            .map(PathBuf::from),
    };
    if let Some(b) = &vs {
        anyhow::ensure!(b.exists(), "--vs {}: no such binary", b.display());
    }
    let client = admin_client().await?;
    let s9_step = env_usize("REKINDLE_BENCH_S9_STEP", 10_000);
    let only = args
        .iter()
        .find_map(|a| a.strip_prefix("--only="))
        .or_else(|| {
            args.windows(2)
                .find(|w| w[0] == "--only")
                .map(|w| w[1].as_str())
        });
    match only {
        Some(part @ ("writer" | "s8" | "s9")) => return writer_only(&client, s9_step, part).await,
        Some("s5") => return s5_only(&client, vs).await,
        Some("s6") => return s6_only(&client).await,
        Some("csi") => {
            let report = csi::run(&client).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(());
        }
        Some(other) => anyhow::bail!("--only {other}: expected writer, s5, s6, s8, s9 or csi"),
        None => {}
    }
    let sizes = Sizes {
        pairs: env_usize("REKINDLE_BENCH_S1_PAIRS", 100),
        updates: env_usize("REKINDLE_BENCH_S1_UPDATES", 500),
        s2: env_usize("REKINDLE_BENCH_S2_WORKLOADS", 500),
        s3: env_usize("REKINDLE_BENCH_S3_WORKLOADS", 5000),
        s5_seconds: env_usize("REKINDLE_BENCH_S5_SECONDS", 10) as u64,
        s7_seconds: env_usize("REKINDLE_BENCH_S7_SECONDS", 30) as u64,
    };
    let main_run = comparable(&client, &sizes, None).await?;
    eprintln!("S1 baseline (bare client) …");
    let base = s1_baseline(&client, sizes.pairs, sizes.updates).await?;
    let mut s4_runs = Vec::new();
    let s4_sizes = std::env::var("REKINDLE_BENCH_S4_SECRETS").unwrap_or_else(|_| "20000".into());
    for secrets in s4_sizes.split(',').filter_map(|v| v.parse::<usize>().ok()) {
        for fraction in [4usize, 2, 1] {
            let n = secrets / fraction;
            eprintln!("S4/S6 ({n} Secrets of 8 KiB, 5,000 ConfigMaps, 2,000 Deployments) …");
            s4_runs.push(s4(&client, n, 5000, 2000).await?);
        }
    }
    let s6_workloads = env_usize("REKINDLE_BENCH_S6_WORKLOADS", 10_000);
    let s6_resources = env_usize("REKINDLE_BENCH_S6_RESOURCES", 25_000);
    let s6_starts = env_usize("REKINDLE_BENCH_S6_STARTS", 3);
    let s6_full = if s6_workloads > 0 {
        // One ConfigMap per workload; the rest of the resources are 8 KiB Secrets.
        let secrets = s6_resources.saturating_sub(s6_workloads);
        eprintln!(
            "S6 ({s6_workloads} Deployments, {s6_workloads} ConfigMaps, {secrets} Secrets) …"
        );
        // The largest run: a failure here is reported, not allowed to lose the rest of the report.
        Some(
            s4_with(&client, secrets, s6_workloads, s6_workloads, &[], s6_starts)
                .await
                .unwrap_or_else(|e| json!({"error": format!("{e:#}"), "workloads": s6_workloads})),
        )
    } else {
        None
    };
    eprintln!("S8 the writer …");
    let s8 = writer::s8(&client).await?;
    eprintln!("S9 index memory …");
    let s9 = writer::s9(&client, s9_step).await?;
    let vs_run = match &vs {
        Some(b) => Some(comparable(&client, &sizes, Some(b.clone())).await?),
        None => None,
    };
    let version = client.apiserver_version().await?.git_version;
    let mut report = main_run.clone();
    report["kubernetes"] = json!(version);
    report["machine"] = json!(format!(
        "{} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    ));
    report["s1_latency"]["bare_client_baseline"] = base;
    report["s4_memory_s6_startup"] = json!(s4_runs);
    report["s6_startup_full"] = json!(s6_full);
    report["s8_writer"] = s8;
    report["s9_index_memory"] = s9;
    if let (Some(b), Some(r)) = (&vs, &vs_run) {
        report["vs"] = json!({"binary": b.display().to_string(), "results": r});
    }
    let dir = results_dir()?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;

    // Plots.
    plots::latency_cdf(
        &dir.join("s1_latency.png"),
        &format!(
            "S1: change accepted → new template in a watch ({} updates)",
            sizes.updates
        ),
        &[
            (
                "rekindle, debounce 0",
                samples(&report["s1_latency"]["debounce_0"]),
            ),
            (
                "rekindle, debounce 250ms",
                samples(&report["s1_latency"]["debounce_250ms"]),
            ),
            (
                "bare client PATCH (limit)",
                samples(&report["s1_latency"]["bare_client_baseline"]),
            ),
        ],
    )?;
    plots::latency_cdf(
        &dir.join("s5_admission.png"),
        "S5: webhook latency at 1000 AdmissionReviews/s",
        &[
            (
                "shared cores",
                samples(&report["s5_admission"]["at_1000_rps"]),
            ),
            (
                "pinned: server core 1, client core 0",
                samples(&report["s5_admission"]["pinned"]["at_1000_rps"]),
            ),
        ],
    )?;
    let mib = |v: &Value| f(v) / 1048576.0;
    let memory: Vec<(f64, f64, f64)> = report["s4_memory_s6_startup"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                mib(&r["data_bytes"]),
                mib(&r["rss_after_sync_bytes"]),
                mib(&r["rss_after_changes_bytes"]),
            )
        })
        .collect();
    plots::memory(&dir.join("s4_memory.png"), &memory)?;

    let mut md = markdown(&report, &sizes);
    md += &writer::markdown(&report["s8_writer"], &report["s9_index_memory"], &[]);
    std::fs::write(dir.join("report.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// `--only s5`: the webhook alone, in rounds, taking turns with the `--vs` binary (the first to start
/// alternates); bench/results/s5.{json,md} with each round and the medians.
async fn s5_only(client: &Client, vs: Option<PathBuf>) -> Result<()> {
    let rounds = env_usize("REKINDLE_BENCH_S5_ROUNDS", 3).max(1);
    let seconds = env_usize("REKINDLE_BENCH_S5_SECONDS", 10) as u64;
    let mut builds: Vec<(String, Option<PathBuf>)> = vec![("this build".into(), None)];
    if let Some(b) = vs {
        builds.push((b.display().to_string(), Some(b)));
    }
    let mut runs: Vec<Vec<Value>> = vec![Vec::new(); builds.len()];
    for round in 0..rounds {
        for turn in 0..builds.len() {
            let i = (turn + round) % builds.len();
            eprintln!("S5 round {} of {rounds}, {} …", round + 1, builds[i].0);
            let mut r = s5(client, seconds, builds[i].1.clone()).await?;
            // Percentiles are kept; 10,000 samples per phase are not.
            for phase in ["/at_1000_rps", "/pinned/at_1000_rps"] {
                if let Some(Value::Object(m)) = r.pointer_mut(phase) {
                    m.remove("samples_ms");
                }
            }
            runs[i].push(r);
        }
    }
    let rows: [(&str, &str, usize); 6] = [
        ("p50 at 1000 req/s, ms", "/at_1000_rps/p50_ms", 3),
        ("p99 at 1000 req/s, ms", "/at_1000_rps/p99_ms", 3),
        (
            "handler p99 at 1000 req/s, ≤ ms",
            "/at_1000_rps/handler/p99_bucket_le_ms",
            2,
        ),
        (
            "handler mean at 1000 req/s, ms",
            "/at_1000_rps/handler/mean_ms",
            3,
        ),
        (
            "max sustained, 32 connections, req/s",
            "/max_sustained_rps",
            0,
        ),
        (
            "server CPU per request at max, µs",
            "/server_cpu_us_per_request",
            0,
        ),
    ];
    let mut md = format!(
        "# S5 the webhook alone\n\nA Deployment's AdmissionReview over keep-alive TLS from a separate process, {seconds} s at 1,000 req/s then as fast as 32 connections go, {rounds} rounds taking turns (the first to start alternates). *Shared*: client and server share the cores; *pinned*: rekindle on core 1, the client on core 0. *Handler*: rekindle's own `rekindle_admission_duration_seconds` (parse, decide, patch; no TLS or HTTP), as a bucket bound. Medians over the rounds. `just bench-load --only s5`.\n\n| build | measure | shared | pinned | shared, each round | pinned, each round |\n|---|---|---|---|---|---|\n"
    );
    let mut report = Vec::new();
    for ((label, _), runs) in builds.iter().zip(&runs) {
        for (measure, key, digits) in rows {
            // A phase that did not run (no pinned phase on one core) has no value in that round.
            let per_round = |prefix: &str| -> Vec<f64> {
                runs.iter()
                    .filter_map(|r| r.pointer(&format!("{prefix}{key}")).and_then(Value::as_f64))
                    .collect()
            };
            let cell = |v: Option<f64>| v.map_or("—".into(), |x| format!("{x:.digits$}"));
            let list = |v: &[f64]| {
                v.iter()
                    .map(|x| cell(Some(*x)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (shared, pinned) = (per_round(""), per_round("/pinned"));
            md += &format!(
                "| {label} | {measure} | {} | {} | {} | {} |\n",
                cell(median(shared.clone())),
                cell(median(pinned.clone())),
                list(&shared),
                list(&pinned)
            );
        }
        report.push(json!({"build": label, "rounds": runs}));
    }
    let dir = results_dir()?;
    std::fs::write(dir.join("s5.json"), serde_json::to_string_pretty(&report)?)?;
    std::fs::write(dir.join("s5.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// `--only s6`: the full-size start-up alone (REKINDLE_BENCH_S6_* sizes); bench/results/s6.{json,md}.
async fn s6_only(client: &Client) -> Result<()> {
    let workloads = env_usize("REKINDLE_BENCH_S6_WORKLOADS", 10_000);
    let resources = env_usize("REKINDLE_BENCH_S6_RESOURCES", 25_000);
    let secrets = resources.saturating_sub(workloads);
    let starts = env_usize("REKINDLE_BENCH_S6_STARTS", 3);
    eprintln!("S6 ({workloads} Deployments, {workloads} ConfigMaps, {secrets} Secrets, {starts} starts) …");
    // Streaming lists (the default on this apiserver) against pages, one after the other.
    let mut runs = Vec::new();
    let mut modes = vec![("streaming lists", &["--streaming-lists=true"][..])];
    if env_usize("REKINDLE_BENCH_S6_PAGED", 1) > 0 {
        modes.push(("paged lists", &["--streaming-lists=false"][..]));
    }
    for (label, args) in modes {
        eprintln!("S6 with {label} …");
        let mut r = s4_with(client, secrets, workloads, workloads, args, starts).await?;
        r["lists"] = json!(label);
        runs.push(r);
    }
    let r = runs[0].clone();
    let dir = results_dir()?;
    std::fs::write(dir.join("s6.json"), serde_json::to_string_pretty(&runs)?)?;
    let secs = |v: &Value| {
        v.as_f64()
            .map(|v| format!("{v:.2}"))
            .unwrap_or_else(|| "—".into())
    };
    let mut md = format!(
        "# S6 start-up at full size\n\n{} Deployments (one replica each, paused: the control plane makes no ReplicaSets or Pods for them, and each start waits for the apiserver to be idle) each with its ConfigMap, and {} Secrets of 8 KiB ({:.1} MiB watched), started {starts} times over the same objects (medians): process start to `/ready` in {} s, first reload of a change made at start {} s after start; RSS {:.1} MiB after sync, {:.1} MiB after 1,000 changes (first start). `just bench-load --only s6`.\n",
        r["workloads"], r["secrets"], f(&r["data_bytes"]) / 1048576.0, secs(&r["startup_to_ready_s"]),
        secs(&r["first_reload_after_start_s"]),
        f(&r["rss_after_sync_bytes"]) / 1048576.0, f(&r["rss_after_changes_bytes"]) / 1048576.0
    );
    md += "\n| lists | start-up to /ready s | change made at start reloaded after s | rekindle CPU to /ready s | apiserver CPU to /ready s | RSS after sync MiB | RSS after 1,000 changes MiB |\n|---|---|---|---|---|---|---|\n";
    for r in &runs {
        md += &format!(
            "| {}, median | {} | {} | {} | {} | {:.1} | {:.1} |\n",
            r["lists"].as_str().unwrap_or(""),
            secs(&r["startup_to_ready_s"]),
            secs(&r["first_reload_after_start_s"]),
            secs(&r["cpu_to_ready_s"]),
            secs(&r["apiserver_cpu_to_ready_s"]),
            f(&r["rss_after_sync_bytes"]) / 1048576.0,
            f(&r["rss_after_changes_bytes"]) / 1048576.0
        );
        for (i, start) in r["starts"].as_array().into_iter().flatten().enumerate() {
            md += &format!(
                "| {}, start {} | {} | {} | {} | {} | | |\n",
                r["lists"].as_str().unwrap_or(""),
                i + 1,
                secs(&start["startup_to_ready_s"]),
                secs(&start["first_reload_after_start_s"]),
                secs(&start["cpu_to_ready_s"]),
                secs(&start["apiserver_cpu_to_ready_s"]),
            );
        }
    }
    for r in &runs {
        let vs = &r["vs"];
        if !vs.is_object() {
            continue;
        }
        md += &format!(
            "| {}, {}, median | {} | {} | {} | {} | | |\n",
            r["lists"].as_str().unwrap_or(""),
            vs["binary"].as_str().unwrap_or(""),
            secs(&vs["startup_to_ready_s"]),
            secs(&vs["first_reload_after_start_s"]),
            secs(&vs["cpu_to_ready_s"]),
            secs(&vs["apiserver_cpu_to_ready_s"]),
        );
        for (i, start) in vs["starts"].as_array().into_iter().flatten().enumerate() {
            md += &format!(
                "| {}, {}, start {} | {} | {} | {} | {} | | |\n",
                r["lists"].as_str().unwrap_or(""),
                vs["binary"].as_str().unwrap_or(""),
                i + 1,
                secs(&start["startup_to_ready_s"]),
                secs(&start["first_reload_after_start_s"]),
                secs(&start["cpu_to_ready_s"]),
                secs(&start["apiserver_cpu_to_ready_s"]),
            );
        }
    }
    std::fs::write(dir.join("s6.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// `--only writer`: S3 at two sizes, S8 and S9; bench/results/writer.{json,md}. `--only s8` or
/// `--only s9`: that one alone; bench/results/s8.{json,md} or s9.{json,md}.
async fn writer_only(client: &Client, s9_step: usize, name: &str) -> Result<()> {
    let all = name == "writer";
    let mut s3_runs = Vec::new();
    let mut s8 = Value::Null;
    if all {
        for n in [1000, 5000] {
            eprintln!("S3 ({n} Deployments) …");
            s3_runs.push(s3(client, n, None).await?);
        }
    }
    if all || name == "s8" {
        eprintln!("S8 the writer …");
        s8 = writer::s8(client).await?;
    }
    let mut s9 = Value::Null;
    if all || name == "s9" {
        eprintln!("S9 index memory …");
        s9 = writer::s9(client, s9_step).await?;
    }
    let version = client.apiserver_version().await?.git_version;
    let report = json!({"kubernetes": version, "s3_needle": s3_runs, "s8_writer": s8, "s9_index_memory": s9});
    let dir = results_dir()?;
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(&report)?,
    )?;
    let md = format!(
        "# The writer and the index

Kubernetes {version}, a shared 2-core machine: read medians and ratios. `just bench-load --only writer`.
{}",
        writer::markdown(&report["s8_writer"], &report["s9_index_memory"], &s3_runs)
    );
    std::fs::write(dir.join(format!("{name}.md")), &md)?;
    println!("{md}");
    Ok(())
}

fn markdown(report: &Value, sizes: &Sizes) -> String {
    let version = report["kubernetes"].as_str().unwrap_or("");
    let row = |label: &str, v: &Value| {
        format!(
            "| {label} | {} | {:.1} | {:.1} | {:.1} |\n",
            v["n"],
            f(&v["p50_ms"]),
            f(&v["p95_ms"]),
            f(&v["p99_ms"])
        )
    };
    let mut md = format!("# Load scenarios\n\nKubernetes {version}, {} — a shared, noisy machine: read medians and ratios. Plots: [S1](s1_latency.png), [S4](s4_memory.png), [S5](s5_admission.png).\n\n", report["machine"].as_str().unwrap_or(""));
    md += "## Summary\n\n| | value | unit |\n|---|---|---|\n";
    for (label, v, unit) in headline(report) {
        md += &format!("| {label} | {v:.2} | {unit} |\n");
    }
    if let Some(vs) = report.get("vs") {
        md += &format!("\n## Side by side: this build vs `{}`\n\n| | this build | other | other / this |\n|---|---|---|---|\n", vs["binary"].as_str().unwrap_or(""));
        for ((label, a, unit), (_, b, _)) in
            headline(report).into_iter().zip(headline(&vs["results"]))
        {
            let ratio = if a != 0.0 { b / a } else { f64::NAN };
            md += &format!("| {label} ({unit}) | {a:.2} | {b:.2} | {ratio:.2} |\n");
        }
    }
    md += &format!("\n## S1 latency: {} ConfigMaps ↔ {} Deployments, {} updates\n\nFrom the update's acceptance to the new template in a watch.\n\n| | n | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|---|\n", sizes.pairs, sizes.pairs, sizes.updates);
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
    let wh = &report["s1_latency"]["debounce_0"]["apiserver_webhook_admission"];
    md += &format!("\nThe apiserver's own view of the webhook while S1's Deployments were created (`apiserver_admission_webhook_admission_duration_seconds`): {} calls, mean {:.2} ms, p50 ≤ {} ms, p99 ≤ {} ms (bucket bounds).\n", wh["requests"], f(&wh["mean_ms"]), wh["p50_bucket_le_ms"], wh["p99_bucket_le_ms"]);
    md += &format!("\n## S2 fan-out: 1 ConfigMap referenced by {} Deployments\n\n| | patched | all patched s | p50 ms | p99 ms |\n|---|---|---|---|---|\n", sizes.s2);
    for (label, key) in [
        ("debounce 0", "debounce_0"),
        ("debounce 250ms", "debounce_250ms"),
    ] {
        let v = &report["s2_fanout"][key];
        md += &format!(
            "| {label} | {} | {:.2} | {:.0} | {:.0} |\n",
            v["patched"],
            f(&v["all_patched_s"]),
            f(&v["p50_ms"]),
            f(&v["p99_ms"])
        );
    }
    md += &format!("\n## S3 needle in a haystack: {} Deployments and {} ConfigMaps in one namespace, one changes\n\nLatency {:.1} ms. API requests during the change (apiserver_request_total delta, all clients, main resources):\n\n| verb resource | requests |\n|---|---|\n", sizes.s3, sizes.s3, f(&report["s3_needle"]["latency_ms"]));
    for (k, v) in report["s3_needle"]["api_requests_during_change"]
        .as_object()
        .into_iter()
        .flatten()
    {
        md += &format!("| {k} | {v} |\n");
    }
    md += "\n## S4 memory and S6 start-up: Secrets of 8 KiB, 5,000 ConfigMaps, 2,000 Deployments\n\nRSS of rekindle (release build) against the bytes of data it watches; start-up is process start to `/ready`.\n\n| Secrets | data watched MiB | start-up to /ready s | RSS after sync MiB | RSS after 1,000 changes MiB |\n|---|---|---|---|---|\n";
    for r in report["s4_memory_s6_startup"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let mib = |k: &str| f(&r[k]) / 1048576.0;
        md += &format!(
            "| {} | {:.1} | {:.2} | {:.1} | {:.1} |\n",
            r["secrets"],
            mib("data_bytes"),
            f(&r["startup_to_ready_s"]),
            mib("rss_after_sync_bytes"),
            mib("rss_after_changes_bytes")
        );
    }
    let s6 = &report["s6_startup_full"];
    if let Some(error) = s6["error"].as_str() {
        md += &format!(
            "\n## S6 start-up at full size: {} Deployments\n\nDid not complete: {error}\n",
            s6["workloads"]
        );
    } else if s6.is_object() {
        md += &format!("\n## S6 start-up at full size: {} Deployments, {} resources\n\n{} Deployments (one replica each) each with its ConfigMap, and {} Secrets of 8 KiB ({:.1} MiB watched), medians of {} starts: process start to `/ready` in {:.2} s (rekindle's CPU {:.2} s, the apiserver's {:.2} s), a change made at start reloaded {:.2} s after start; RSS {:.1} MiB after sync, {:.1} MiB after 1,000 changes.\n",
            s6["workloads"], f(&s6["configmaps"]) + f(&s6["secrets"]), s6["workloads"], s6["secrets"], f(&s6["data_bytes"]) / 1048576.0,
            s6["starts"].as_array().map_or(0, Vec::len),
            f(&s6["startup_to_ready_s"]), f(&s6["cpu_to_ready_s"]), f(&s6["apiserver_cpu_to_ready_s"]), f(&s6["first_reload_after_start_s"]),
            f(&s6["rss_after_sync_bytes"]) / 1048576.0, f(&s6["rss_after_changes_bytes"]) / 1048576.0);
    }
    let s5 = &report["s5_admission"];
    md += &format!("\n## S5 admission: the webhook alone, keep-alive TLS from a separate process\n\nA {}-byte AdmissionReview (a Deployment with a ConfigMap and a Secret). *Shared*: client and server share the machine's {}. *Pinned*: rekindle on core 1, the client on core 0 (as when the apiserver is on another node). *Handler*: rekindle's own `rekindle_admission_duration_seconds` (parse, decide, patch; no TLS or HTTP), bucket bound.\n\n| | shared | pinned |\n|---|---|---|\n", s5["review_bytes"], report["machine"].as_str().unwrap_or(""));
    let p = &s5["pinned"];
    for (label, key, unit, digits) in [
        ("p50 at 1000 req/s", "/at_1000_rps/p50_ms", "ms", 3),
        ("p99 at 1000 req/s", "/at_1000_rps/p99_ms", "ms", 3),
        (
            "handler p99 at 1000 req/s, ≤",
            "/at_1000_rps/handler/p99_bucket_le_ms",
            "ms",
            2,
        ),
        (
            "handler mean at 1000 req/s",
            "/at_1000_rps/handler/mean_ms",
            "ms",
            3,
        ),
        ("errors at 1000 req/s", "/at_1000_rps/errors", "", 0),
        (
            "max sustained (32 connections)",
            "/max_sustained_rps",
            "req/s",
            0,
        ),
        (
            "server CPU per request at max",
            "/server_cpu_us_per_request",
            "µs",
            0,
        ),
    ] {
        let cell = |v: Option<&Value>| match v.and_then(Value::as_f64) {
            Some(x) => format!("{x:.digits$} {unit}"),
            None => "—".into(),
        };
        md += &format!(
            "| {label} | {} | {} |\n",
            cell(s5.pointer(key)),
            cell(p.pointer(key))
        );
    }
    let s7 = &report["s7_noop_storm"];
    md += &format!("\n## S7 no-op storm: 10 ConfigMaps, annotations changing 20 times a second\n\n{} annotation patches in {} s: {} reloads; rekindle's CPU {:.2}% idle, {:.2}% during the storm.\n", s7["annotation_patches"], s7["seconds"], s7["reloads"], f(&s7["cpu_percent_idle"]), f(&s7["cpu_percent_storm"]));
    md
}
