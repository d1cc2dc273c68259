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
//! Sizes and output: `load --help` (`args.rs`); each flag is also read from its `REKINDLE_BENCH_*`
//! variable, which is how `just bench` passes them. One module per scenario (`s1.rs` … `s7.rs`,
//! `writer.rs` for S8 and S9, `csi.rs`); `cluster.rs` and `measure.rs` hold what they share, and
//! `report.rs` the main report.

mod admission;
mod args;
mod cluster;
mod csi;
mod measure;
mod plots;
mod report;
mod s1;
mod s2;
mod s3;
mod s4;
mod s5;
mod s6;
mod s7;
mod writer;

use std::path::PathBuf;

use anyhow::Result;
use args::{Args, Part, Sizes};
use clap::Parser;
use e2e::admin_client;
use kube::Client;
use measure::{f, samples};
use report::markdown;
use s1::{s1, s1_baseline};
use s2::s2;
use s3::s3;
use s4::{s4, s4_with};
use s5::{s5, s5_only};
use s6::s6_only;
use s7::s7;
use serde_json::{json, Value};

/// The scenarios run for each binary compared: S1 (both debounces), S2, S3, S5, S7.
async fn comparable(client: &Client, sizes: &Sizes, binary: Option<PathBuf>) -> Result<Value> {
    let who = binary
        .as_ref()
        .map(|b| b.display().to_string())
        .unwrap_or_else(|| "rekindle".into());
    eprintln!(
        "[{who}] S1 ({} pairs, {} updates) debounce=0 …",
        sizes.s1_pairs, sizes.s1_updates
    );
    let s1_zero = s1(
        client,
        "0",
        sizes.s1_pairs,
        sizes.s1_updates,
        binary.clone(),
    )
    .await?;
    eprintln!("[{who}] S1 default debounce …");
    let s1_default = s1(
        client,
        "250ms",
        sizes.s1_pairs,
        sizes.s1_updates,
        binary.clone(),
    )
    .await?;
    eprintln!("[{who}] S2 fan-out ({} Deployments) …", sizes.s2_workloads);
    let s2_zero = s2(client, "0", sizes.s2_workloads, binary.clone()).await?;
    let s2_default = s2(client, "250ms", sizes.s2_workloads, binary.clone()).await?;
    eprintln!(
        "[{who}] S3 ({} Deployments + ConfigMaps) …",
        sizes.s3_workloads
    );
    let s3 = s3(client, sizes.s3_workloads, binary.clone()).await?;
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

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let client = admin_client().await?;
    match args.only {
        Some(part @ (Part::Writer | Part::S8 | Part::S9)) => {
            return writer_only(&client, &args, part).await
        }
        Some(Part::S5) => return s5_only(&client, &args).await,
        Some(Part::S6) => return s6_only(&client, &args).await,
        Some(Part::Csi) => {
            let report = csi::run(&client, &args).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(());
        }
        None => {}
    }
    let (sizes, vs) = (&args.sizes, &args.vs);
    let main_run = comparable(&client, sizes, None).await?;
    eprintln!("S1 baseline (bare client) …");
    let base = s1_baseline(&client, sizes.s1_pairs, sizes.s1_updates).await?;
    let mut s4_runs = Vec::new();
    for secrets in sizes.s4_secrets.iter().copied() {
        for fraction in [4usize, 2, 1] {
            let n = secrets / fraction;
            eprintln!("S4/S6 ({n} Secrets of 8 KiB, 5,000 ConfigMaps, 2,000 Deployments) …");
            s4_runs.push(s4(&client, n, 5000, 2000, sizes).await?);
        }
    }
    let (s6_workloads, s6_resources) = (sizes.s6_workloads, sizes.s6_resources);
    let s6_full = if s6_workloads > 0 {
        // One ConfigMap per workload; the rest of the resources are 8 KiB Secrets.
        let secrets = s6_resources.saturating_sub(s6_workloads);
        eprintln!(
            "S6 ({s6_workloads} Deployments, {s6_workloads} ConfigMaps, {secrets} Secrets) …"
        );
        // The largest run: a failure here is reported, not allowed to lose the rest of the report.
        Some(
            s4_with(&client, secrets, s6_workloads, s6_workloads, &[], sizes)
                .await
                .unwrap_or_else(|e| json!({"error": format!("{e:#}"), "workloads": s6_workloads})),
        )
    } else {
        None
    };
    eprintln!("S8 the writer …");
    let s8 = writer::s8(&client, sizes).await?;
    eprintln!("S9 index memory …");
    let s9 = writer::s9(&client, sizes.s9_step).await?;
    let vs_run = match vs {
        Some(b) => Some(comparable(&client, sizes, Some(b.clone())).await?),
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
    if let (Some(b), Some(r)) = (vs, &vs_run) {
        report["vs"] = json!({"binary": b.display().to_string(), "results": r});
    }
    let dir = args.results_dir()?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;

    // Plots.
    plots::latency_cdf(
        &dir.join("s1_latency.png"),
        &format!(
            "S1: change accepted → new template in a watch ({} updates)",
            sizes.s1_updates
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

    let mut md = markdown(&report, sizes);
    md += &writer::markdown(&report["s8_writer"], &report["s9_index_memory"], &[]);
    std::fs::write(dir.join("report.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// `--only writer`: S3 at two sizes, S8 and S9; bench/results/writer.{json,md}. `--only s8` or
/// `--only s9`: that one alone; bench/results/s8.{json,md} or s9.{json,md}.
async fn writer_only(client: &Client, args: &Args, part: Part) -> Result<()> {
    let name = part.name();
    let all = part == Part::Writer;
    let mut s3_runs = Vec::new();
    let mut s8 = Value::Null;
    if all {
        for n in [1000, 5000] {
            eprintln!("S3 ({n} Deployments) …");
            s3_runs.push(s3(client, n, None).await?);
        }
    }
    if all || part == Part::S8 {
        eprintln!("S8 the writer …");
        s8 = writer::s8(client, &args.sizes).await?;
    }
    let mut s9 = Value::Null;
    if all || part == Part::S9 {
        eprintln!("S9 index memory …");
        s9 = writer::s9(client, args.sizes.s9_step).await?;
    }
    let version = client.apiserver_version().await?.git_version;
    let report = json!({"kubernetes": version, "s3_needle": s3_runs, "s8_writer": s8, "s9_index_memory": s9});
    let dir = args.results_dir()?;
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
