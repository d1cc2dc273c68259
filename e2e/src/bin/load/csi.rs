//! What `--enable-csi-integration` costs as pods grow: the Secrets Store CSI driver keeps one
//! SecretProviderClassPodStatus per pod and class, so the watch scales with pods, not workloads.
//! `--only csi`: rekindle started over no status objects and over N (REKINDLE_BENCH_CSI_STATUSES,
//! default 10,000, 50 pods per class), start-up to /ready and RSS after it; then a rotation of every
//! class at once (each status object updated, as the driver does on rotation), timed until rekindle has
//! handled every update, with the CPU it used. bench/results/csi.{json,md}.

use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::rekindle::{Options, Rekindle};
use e2e::TestNamespace;
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::cluster::create_many;
use crate::measure::mib;

use crate::args::Args;

const PODS_PER_CLASS: usize = 50;
const UPDATES: &str = "reloader_events_received_total{event_type=\"update\",resource_type=\"secretproviderclasspodstatuses\"}";

fn status(i: usize, version: &str) -> Value {
    let class = format!("class-{}", i / PODS_PER_CLASS);
    json!({
        "apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClassPodStatus",
        "metadata": {"name": format!("pod-{i}-{class}"), "labels": {"internal.secrets-store.csi.k8s.io/node-name": "node-0"}},
        "status": {"podName": format!("pod-{i}"), "secretProviderClassName": class, "mounted": true,
            "targetPath": format!("/var/lib/kubelet/pods/uid-{i}/volumes/kubernetes.io~csi/secrets/mount"),
            "objects": [{"id": format!("secret/{class}/password"), "version": version},
                        {"id": format!("secret/{class}/username"), "version": "1"}]},
    })
}

async fn write_all(api: &Api<DynamicObject>, n: usize, version: &str, update: bool) -> Result<()> {
    create_many(0..n, |i| {
        let api = api.clone();
        let mut obj: DynamicObject = serde_json::from_value(status(i, version)).expect("valid");
        async move {
            if update {
                let name = obj.metadata.name.clone().unwrap_or_default();
                obj.metadata.resource_version = api.get(&name).await?.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &obj).await?;
            } else {
                api.create(&PostParams::default(), &obj).await?;
            }
            Ok(())
        }
    })
    .await
}

/// One start: seconds to /ready, seconds until the index holds every class (the CSI watches are
/// optional APIs, which /ready does not wait for), and RSS then.
async fn start(client: &Client, ns: &str, classes: usize) -> Result<(Rekindle, f64, f64, u64)> {
    let started = Instant::now();
    let rk = Rekindle::start(
        client,
        &[ns],
        Options {
            webhook: false,
            args: &["--enable-csi-integration"],
            ..Default::default()
        },
    )
    .await?;
    let ready = started.elapsed().as_secs_f64();
    e2e::wait_for(
        "every class in the index",
        Duration::from_secs(300),
        || async {
            let held = rk.metric("rekindle_index_resources ").await? as usize;
            Ok((held >= classes).then_some(()))
        },
    )
    .await?;
    let listed = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rk.rss_bytes().unwrap_or(0);
    Ok((rk, ready, listed, rss))
}

pub async fn run(client: &Client, args: &Args) -> Result<Value> {
    let n = args.sizes.csi_statuses as usize;
    e2e::apply_yaml(client, None, &e2e::csi::crds()?).await?;
    crate::cluster::quiesce(client, "").await?;
    let ns = TestNamespace::new(client, "bench-csi").await?;
    let api = e2e::csi::status_api(client, &ns.name).await?;

    eprintln!("CSI: rekindle over no status objects …");
    let (rk, ready_empty, _, rss_empty) = start(client, &ns.name, 0).await?;
    rk.stop().await?;

    eprintln!("CSI: {n} status objects ({} classes) …", n / PODS_PER_CLASS);
    write_all(&api, n, "1", false).await?;
    crate::cluster::settle(client).await?;
    let (rk, ready_full, listed_full, rss_full) =
        start(client, &ns.name, n / PODS_PER_CLASS).await?;

    eprintln!("CSI: every class rotated ({n} status updates) …");
    let before = rk.metric(UPDATES).await?;
    let cpu_before = rk.cpu_seconds().unwrap_or(0.0);
    let rotated = Instant::now();
    write_all(&api, n, "2", true).await?;
    let written_s = rotated.elapsed().as_secs_f64();
    e2e::wait_for(
        "rekindle to handle every update",
        Duration::from_secs(300),
        || async { Ok((rk.metric(UPDATES).await? - before >= n as f64).then_some(())) },
    )
    .await?;
    let handled_s = rotated.elapsed().as_secs_f64();
    let cpu_s = rk.cpu_seconds().unwrap_or(0.0) - cpu_before;
    let rss_after = rk.rss_bytes().unwrap_or(0);
    rk.stop().await?;
    ns.cleanup().await?;

    let per_status = |a: u64, b: u64| (a as f64 - b as f64) / n as f64;
    let report = json!({
        "statuses": n, "classes": n / PODS_PER_CLASS,
        "ready_s_without": ready_empty, "ready_s_with": ready_full, "listed_s_with": listed_full,
        "rss_bytes_without": rss_empty, "rss_bytes_with": rss_full, "rss_bytes_after_rotation": rss_after,
        "rss_bytes_per_status": per_status(rss_full, rss_empty),
        "rotation_written_s": written_s, "rotation_handled_s": handled_s,
        "rotation_cpu_s": cpu_s, "cpu_us_per_update": cpu_s * 1e6 / n as f64,
    });
    let dir = args.results_dir()?;
    std::fs::write(dir.join("csi.json"), serde_json::to_string_pretty(&report)?)?;
    let md = format!(
        "# CSI: the cost of SecretProviderClassPodStatus objects\n\n\
         `just bench-load --only csi`: {n} status objects (one per pod and class, as the Secrets Store CSI \
         driver writes them; {classes} classes of {PODS_PER_CLASS} pods, each status listing two secrets) in one namespace, \
         rekindle started with `--enable-csi-integration` (release build, webhook off). The CSI watches \
         are optional APIs, which `/ready` does not wait for: the index is polled until it holds every \
         class.\n\n\
         | | no status objects | {n} status objects |\n|---|---|---|\n\
         | start-up to /ready s | {ready_empty:.2} | {ready_full:.2} |\n\
         | start-up until every class is indexed s | — | {listed_full:.2} |\n\
         | RSS then MiB | {:.1} | {:.1} |\n\n\
         RSS per status object: {:.0} bytes (the watch keeps no copy of them: a class's hash is all that is \
         kept). Every class rotated at once ({n} updates written in {written_s:.1} s at 16 in flight): all \
         handled {handled_s:.1} s after the first write, {cpu_s:.2} s of rekindle CPU ({:.0} µs per update); \
         RSS after {:.1} MiB.\n",
        mib(rss_empty),
        mib(rss_full),
        per_status(rss_full, rss_empty),
        cpu_s * 1e6 / n as f64,
        mib(rss_after),
        classes = n / PODS_PER_CLASS,
    );
    std::fs::write(dir.join("csi.md"), md)?;
    Ok(report)
}
