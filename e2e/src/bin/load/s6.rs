//! S6 alone (`--only s6`): the full-size start-up, streaming and paged lists.

use crate::args::Args;
use crate::measure::f;
use crate::s4::s4_with;
use anyhow::Result;
use kube::Client;
use serde_json::{json, Value};

/// `--only s6`: the full-size start-up alone (REKINDLE_BENCH_S6_* sizes); bench/results/s6.{json,md}.
pub async fn s6_only(client: &Client, args: &Args) -> Result<()> {
    let sizes = &args.sizes;
    let (workloads, resources) = (sizes.s6_workloads, sizes.s6_resources);
    let secrets = resources.saturating_sub(workloads);
    let starts = sizes.s6_starts;
    eprintln!("S6 ({workloads} Deployments, {workloads} ConfigMaps, {secrets} Secrets, {starts} starts) …");
    // Streaming lists (the default on this apiserver) against pages, one after the other.
    let mut runs = Vec::new();
    let mut modes = vec![("streaming lists", &["--streaming-lists=true"][..])];
    if sizes.s6_paged {
        modes.push(("paged lists", &["--streaming-lists=false"][..]));
    }
    for (label, flags) in modes {
        eprintln!("S6 with {label} …");
        let mut r = s4_with(client, secrets, workloads, workloads, flags, sizes).await?;
        r["lists"] = json!(label);
        runs.push(r);
    }
    let r = runs[0].clone();
    let dir = args.results_dir()?;
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
