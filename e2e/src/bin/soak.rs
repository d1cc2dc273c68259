//! A bounded soak (`just soak`): mixed changes against rekindle for REKINDLE_SOAK_MINUTES (30), sampling
//! its RSS and open file descriptors every 10 s; at the end every workload must carry its resources'
//! current hashes. Writes bench/results/soak.{json,md} with the samples and the growth trend.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::rekindle::{Options, Rekindle};
use e2e::{admin_client, apply_value, dynamic_api, get_json, wait_for, TestNamespace};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use rekindle::core::hash::{configmap_hash_typed, secret_hash_typed};
use serde_json::{json, Value};

const WORKLOADS: usize = 50;

fn deployment(i: usize) -> Value {
    let name = format!("d-{i}");
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "busybox",
                "envFrom": [{"configMapRef": {"name": format!("cm-{i}")}}, {"secretRef": {"name": format!("s-{i}")}}]}]}}}})
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
    let (mx, my) = (sx / n, sy / n);
    let cov: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let var: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if var == 0.0 {
        0.0
    } else {
        cov / var
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let minutes: f64 = std::env::var("REKINDLE_SOAK_MINUTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30.0);
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "soak").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..WORKLOADS {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "0"}}),
            )?,
        )
        .await?;
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": format!("s-{i}")}, "stringData": {"v": "0"}}),
                )?,
            )
            .await?;
    }
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    for i in 0..WORKLOADS {
        apply_value(&client, Some(&ns.name), deployment(i)).await?;
    }
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let pid = rk.pid().context("rekindle is not running")?;
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(minutes * 60.0);
    let mut samples: Vec<Value> = Vec::new();
    let mut next_sample = started;
    let mut step: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    while Instant::now() < end {
        tick.tick().await;
        let i = (step as usize * 7) % WORKLOADS;
        let result = match step % 10 {
            // Data changes of ConfigMaps and Secrets (reloads).
            0..=3 => cms
                .patch(
                    &format!("cm-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"data": {"v": step.to_string()}})),
                )
                .await
                .map(|_| ()),
            4..=5 => secrets
                .patch(
                    &format!("s-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"stringData": {"v": step.to_string()}})),
                )
                .await
                .map(|_| ()),
            // No-op changes (annotations only).
            6..=8 => cms
                .patch(
                    &format!("cm-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"annotations": {"n": step.to_string()}}})),
                )
                .await
                .map(|_| ()),
            // Workload churn: delete one and create it again.
            _ => {
                let _ = deployments
                    .delete(&format!("d-{i}"), &DeleteParams::default())
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                apply_value(&client, Some(&ns.name), deployment(i))
                    .await
                    .map(|_| ())
                    .map_err(|e| kube::Error::Service(e.into()))
            }
        };
        if let Err(e) = result {
            eprintln!("soak: change {step} failed: {e}");
        }
        step += 1;
        if Instant::now() >= next_sample {
            let rss = rk.rss_bytes().unwrap_or(0);
            let fds = open_fds(pid);
            let t = started.elapsed().as_secs_f64();
            samples.push(json!({"t_s": t, "rss_bytes": rss, "open_fds": fds, "changes": step}));
            eprintln!(
                "soak: {t:>6.0} s  rss {:.1} MiB  fds {fds}  changes {step}",
                rss as f64 / 1048576.0
            );
            next_sample += Duration::from_secs(10);
        }
    }
    // Correctness at the end: every workload carries its resources' current hashes.
    wait_for(
        "every Deployment current",
        Duration::from_secs(120),
        || async {
            for i in 0..WORKLOADS {
                let d = get_json(&deployments, &format!("d-{i}")).await?;
                let env = d
                    .pointer("/spec/template/spec/containers/0/env")
                    .cloned()
                    .unwrap_or_default();
                let value = |name: &str| {
                    env.as_array()
                        .and_then(|a| a.iter().find(|e| e["name"] == name))
                        .and_then(|e| e["value"].as_str())
                        .map(String::from)
                };
                let cm = configmap_hash_typed(&cms.get(&format!("cm-{i}")).await?);
                let s = secret_hash_typed(&secrets.get(&format!("s-{i}")).await?);
                if value(&format!("STAKATER_CM_{i}_CONFIGMAP")) != Some(cm)
                    || value(&format!("STAKATER_S_{i}_SECRET")) != Some(s)
                {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    let failed = rk.reloads(false).await?;
    let ok = rk.reloads(true).await?;
    rk.stop().await?;
    ns.cleanup().await?;

    // Trend over the second half (after warm-up), per hour.
    let half: Vec<&Value> = samples
        .iter()
        .filter(|s| s["t_s"].as_f64().unwrap_or(0.0) >= minutes * 30.0)
        .collect();
    let points = |key: &str, scale: f64| -> Vec<(f64, f64)> {
        half.iter()
            .map(|s| {
                (
                    s["t_s"].as_f64().unwrap_or(0.0) / 3600.0,
                    s[key].as_f64().unwrap_or(0.0) / scale,
                )
            })
            .collect()
    };
    let rss_slope = slope(&points("rss_bytes", 1048576.0));
    let fd_slope = slope(&points("open_fds", 1.0));
    let max = |key: &str| {
        samples
            .iter()
            .filter_map(|s| s[key].as_f64())
            .fold(0.0, f64::max)
    };
    let min = |key: &str| {
        samples
            .iter()
            .filter_map(|s| s[key].as_f64())
            .fold(f64::MAX, f64::min)
    };
    let report = json!({"minutes": minutes, "changes": step, "reloads_ok": ok, "reloads_failed": failed,
        "rss_mib_min": min("rss_bytes") / 1048576.0, "rss_mib_max": max("rss_bytes") / 1048576.0,
        "rss_mib_per_hour_second_half": rss_slope, "fds_min": min("open_fds"), "fds_max": max("open_fds"),
        "fds_per_hour_second_half": fd_slope, "samples": samples});
    let dir = e2e::root().join("bench/results");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("soak.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let md = format!(
        "# Soak\n\n{minutes} minutes, {step} mixed changes (ConfigMap and Secret data, annotation-only no-ops, Deployment delete/create) over {WORKLOADS} Deployments: {ok} reloads, {failed} failed; every Deployment current at the end.\n\n| | min | max | trend over the second half |\n|---|---|---|---|\n| RSS MiB | {:.1} | {:.1} | {rss_slope:+.2} MiB/h |\n| open fds | {} | {} | {fd_slope:+.2} /h |\n",
        report["rss_mib_min"].as_f64().unwrap_or(0.0),
        report["rss_mib_max"].as_f64().unwrap_or(0.0),
        report["fds_min"],
        report["fds_max"],
    );
    std::fs::write(dir.join("soak.md"), &md)?;
    println!("{md}");
    Ok(())
}
