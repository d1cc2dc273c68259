//! What a pod-restart walk costs (`rekindle.io/restart: pods`): `--only restarts` creates StatefulSets
//! with `updateStrategy: OnDelete`, opted in, sharing one ConfigMap (REKINDLE_BENCH_RESTART_SETS ×
//! REKINDLE_BENCH_RESTART_PODS pods), changes it, and waits until every pod runs the new config. It
//! reports the time the walks took and the requests rekindle sent meanwhile (its own
//! `rest_client_requests_total`, by method: GET and LIST are both GET; POST is evictions and Events;
//! PATCH the templates), per pod replaced. bench/results/restarts.{json,md}.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use e2e::rekindle::{Options, Rekindle};
use e2e::{apply_value, TestNamespace};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;

use crate::args::Args;
use crate::cluster::create_many;

#[derive(Debug, Serialize)]
pub struct Restarts {
    pub statefulsets: usize,
    pub pods_per_set: usize,
    /// From the ConfigMap's change to every pod Ready with the new config.
    pub walk_s: f64,
    pub evictions: f64,
    /// rekindle's requests during the walks, by method.
    pub requests: std::collections::BTreeMap<String, f64>,
    pub requests_per_pod: f64,
}

const METHODS: [&str; 3] = ["GET", "POST", "PATCH"];

async fn requests(rk: &Rekindle) -> Result<std::collections::BTreeMap<String, f64>> {
    let body = rk.metrics().await?;
    let mut out = std::collections::BTreeMap::new();
    for method in METHODS {
        let needle = format!("method=\"{method}\"");
        let n: f64 = body
            .lines()
            .filter(|l| l.starts_with("rest_client_requests_total{") && l.contains(&needle))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        out.insert(method.to_string(), n);
    }
    Ok(out)
}

fn statefulset(i: usize, pods: usize) -> serde_json::Value {
    let name = format!("db-{i}");
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "annotations": {"reloader.stakater.com/auto": "true", "rekindle.io/restart": "pods"}},
        "spec": {
            "replicas": pods, "serviceName": name,
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name, "bench": "restarts"}},
                "spec": {"containers": [{"name": "app", "image": "busybox",
                    "envFrom": [{"configMapRef": {"name": "shared"}}]}]}}
        }
    })
}

/// Pods of the benchmark that are Ready and carry `marker` (None: any), out of those that exist.
async fn ready_with(client: &Client, ns: &str, marker: Option<&str>) -> Result<usize> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("bench=restarts"))
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let env = p
                .spec
                .as_ref()
                .and_then(|s| s.containers[0].env.clone())
                .unwrap_or_default();
            let carries = marker.is_none_or(|m| {
                env.iter()
                    .any(|e| e.name == "STAKATER_SHARED_CONFIGMAP" && e.value.as_deref() == Some(m))
            });
            ready && carries
        })
        .count())
}

pub async fn run(client: &Client, args: &Args) -> Result<Restarts> {
    let (sets, per_set) = (
        args.sizes.restart_sets as usize,
        args.sizes.restart_pods as usize,
    );
    let pods = sets * per_set;
    let ns = TestNamespace::new(client, "bench-restarts").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    apply_value(
        client,
        Some(&ns.name),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": {"v": "1"}}),
    )
    .await?;
    let rk = Rekindle::start(client, &[&ns.name], Options::default()).await?;
    create_many(0..sets, |i| {
        let (client, ns) = (client.clone(), ns.name.clone());
        async move {
            apply_value(&client, Some(&ns), statefulset(i, per_set)).await?;
            Ok(())
        }
    })
    .await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while ready_with(client, &ns.name, None).await? < pods {
        ensure!(Instant::now() < deadline, "the pods did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = requests(&rk).await?;
    let evicted_before = rk
        .metric("rekindle_pod_evictions_total{result=\"evicted\"}")
        .await?;
    let cm = cms
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": "2"}})),
        )
        .await?;
    let started = Instant::now();
    let want = rekindle::core::hash::configmap_hash_typed(&cm);
    let deadline = Instant::now() + Duration::from_secs(600);
    while ready_with(client, &ns.name, Some(&want)).await? < pods {
        ensure!(Instant::now() < deadline, "the walks did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let walk_s = started.elapsed().as_secs_f64();
    // The last step (which sees every pod current and posts the Finished Event) comes just after.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = requests(&rk).await?;
    let requests: std::collections::BTreeMap<String, f64> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect();
    let evictions = rk
        .metric("rekindle_pod_evictions_total{result=\"evicted\"}")
        .await?
        - evicted_before;
    rk.stop().await?;
    ns.cleanup().await?;
    let total: f64 = requests.values().sum();
    let report = Restarts {
        statefulsets: sets,
        pods_per_set: per_set,
        walk_s,
        evictions,
        requests_per_pod: total / pods as f64,
        requests,
    };
    let dir = args.results_dir()?;
    std::fs::write(
        dir.join("restarts.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(dir.join("restarts.md"), markdown(&report))?;
    Ok(report)
}

fn markdown(r: &Restarts) -> String {
    let rows: String = r
        .requests
        .iter()
        .map(|(m, n)| {
            format!(
                "| {m} | {n} | {:.2} |\n",
                n / (r.statefulsets * r.pods_per_set) as f64
            )
        })
        .collect();
    format!(
        "# Pod-restart walks (`just bench-load --only restarts`)\n\n\
         {} StatefulSets (`OnDelete`, `rekindle.io/restart: pods`) of {} pods share one ConfigMap, which \
         changes once; every pod is replaced by eviction, one per StatefulSet at a time, on the kwok node.\n\n\
         - walks finished (every pod Ready with the new config): {:.2} s\n\
         - evictions: {}\n\
         - rekindle's requests per pod replaced: {:.2}\n\n\
         | method | requests | per pod |\n|---|---|---|\n{rows}\n\
         GET counts the walk's reads of the workload and lists of its pods; POST the evictions and the \
         Events; PATCH the template writes.\n",
        r.statefulsets, r.pods_per_set, r.walk_s, r.evictions, r.requests_per_pod
    )
}
