//! S6 alone (`--only s6`): the full-size start-up, streaming and paged lists.

use crate::args::Args;
use crate::measure::mib;
use crate::results::Starts;
use crate::s4::s4_with;
use anyhow::Result;
use kube::Client;

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
        r.lists = Some(label);
        runs.push(r);
    }
    let dir = args.results_dir()?;
    std::fs::write(dir.join("s6.json"), serde_json::to_string_pretty(&runs)?)?;
    let r = &runs[0];
    let mut md = format!(
        "# S6 start-up at full size\n\n{} Deployments (one replica each, paused: the control plane makes no ReplicaSets or Pods for them, and each start waits for the apiserver to be idle) each with its ConfigMap, and {} Secrets of 8 KiB ({:.1} MiB watched), started {starts} times over the same objects (medians): process start to `/ready` in {} s, first reload of a change made at start {} s after start; RSS {:.1} MiB after sync, {:.1} MiB after 1,000 changes (first start). `just bench-load --only s6`.\n",
        r.workloads, r.secrets, mib(r.data_bytes as u64), secs(r.medians.startup_to_ready_s),
        secs(r.medians.first_reload_after_start_s),
        mib(r.rss_after_sync_bytes), mib(r.rss_after_changes_bytes)
    );
    md += "\n| lists | start-up to /ready s | change made at start reloaded after s | rekindle CPU to /ready s | apiserver CPU to /ready s | RSS after sync MiB | RSS after 1,000 changes MiB |\n|---|---|---|---|---|---|---|\n";
    for r in &runs {
        let lists = r.lists.unwrap_or("");
        md += &format!(
            "| {lists}, median | {} | {:.1} | {:.1} |\n",
            start_cells(&r.medians),
            mib(r.rss_after_sync_bytes),
            mib(r.rss_after_changes_bytes)
        );
        for (i, start) in r.starts.iter().enumerate() {
            md += &format!(
                "| {lists}, start {} | {} | | |\n",
                i + 1,
                start_cells(&start.into())
            );
        }
    }
    for r in &runs {
        let Some(vs) = &r.vs else { continue };
        let lists = r.lists.unwrap_or("");
        md += &format!(
            "| {lists}, {}, median | {} | | |\n",
            vs.binary,
            start_cells(&vs.medians)
        );
        for (i, start) in vs.starts.iter().enumerate() {
            md += &format!(
                "| {lists}, {}, start {} | {} | | |\n",
                vs.binary,
                i + 1,
                start_cells(&start.into())
            );
        }
    }
    std::fs::write(dir.join("s6.md"), &md)?;
    println!("{md}");
    Ok(())
}

fn secs(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "—".into())
}

/// Start-up to /ready, the change made at start, rekindle's and the apiserver's CPU: four cells.
fn start_cells(s: &Starts) -> String {
    [
        s.startup_to_ready_s,
        s.first_reload_after_start_s,
        s.cpu_to_ready_s,
        s.apiserver_cpu_to_ready_s,
    ]
    .map(secs)
    .join(" | ")
}
