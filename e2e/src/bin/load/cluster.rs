//! Objects the scenarios create, the watch that times a new template, and waits for a quiet control plane.

use crate::measure::apiserver_cost;
use anyhow::Result;
use e2e::rekindle::{Options, Rekindle};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::runtime::watcher::{self, watcher, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub fn deployment(name: &str, cm: &str, annotated: bool, paused: bool) -> Deployment {
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

/// rekindle acting in `ns` with `args`, run from `binary` (`None`: this build).
pub async fn start_rekindle(
    client: &Client,
    ns: &str,
    args: &[&str],
    binary: Option<PathBuf>,
) -> Result<Rekindle> {
    let options = Options {
        args,
        binary,
        ..Default::default()
    };
    Rekindle::start(client, &[ns], options).await
}

/// Runs `make(i)` for every `i` of `n`, 16 at a time; the first error fails them all.
pub async fn create_many<F, Fut>(n: std::ops::Range<usize>, make: F) -> Result<()>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    futures::stream::iter(n)
        .map(make)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    Ok(())
}

pub async fn create_pairs(client: &Client, ns: &str, n: usize, annotated: bool) -> Result<()> {
    create_pairs_with(client, ns, n, annotated, false).await
}

/// [`create_pairs`], the Deployments `paused` if asked: no ReplicaSets or Pods are made for them, so
/// the control plane is quiet again within a minute of creating thousands.
pub async fn create_pairs_with(
    client: &Client,
    ns: &str,
    n: usize,
    annotated: bool,
    paused: bool,
) -> Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let ds: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    create_many(0..n, |i| {
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
    .await?;
    Ok(())
}

/// A watch of Deployments in `ns` reporting (name, template env hash) changes with their arrival time.
pub fn template_watch(
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
pub async fn seen(
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

/// Waits until the namespaces of earlier scenarios are gone, so their deletion's API traffic does not
/// land in a measurement; those whose name starts with `keep` (when not empty) stay.
pub async fn quiesce(client: &Client, keep: &str) -> Result<()> {
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
                name.starts_with("bench-") && (keep.is_empty() || !name.starts_with(keep))
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
pub async fn settle(client: &Client) -> Result<f64> {
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
