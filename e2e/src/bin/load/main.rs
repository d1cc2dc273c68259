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
//! REKINDLE_BENCH_CSI_STATUSES, 10000). `--only restarts` times pod-restart walks and counts their
//! requests per pod (bench/results/restarts.*). `--only s10` grows one cluster to 100,000 Deployments
//! and runs rekindle and Stakater Reloader side by side at each size (bench/results/s10.*).
//!
//! Sizes and output: `load --help` (`args.rs`); each flag is also read from its `REKINDLE_BENCH_*`
//! variable, which is how `just bench` passes them. One module per scenario (`s1.rs` … `s7.rs`,
//! `writer.rs` for S8 and S9, `csi.rs`); `cluster.rs` and `measure.rs` hold what they share,
//! `results.rs` the types of what they measure, and `report.rs` the main report.

mod admission;
mod args;
mod cluster;
mod csi;
mod measure;
mod plots;
mod report;
mod restarts;
mod results;
mod s1;
mod s10;
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
use measure::mib;
use report::markdown;
use results::{Comparable, Report, S1Latency, S2Fanout, S6Full, Vs, WriterReport};
use s1::{s1, s1_baseline};
use s2::s2;
use s3::s3;
use s4::{s4, s4_with};
use s5::{s5, s5_only};
use s6::s6_only;
use s7::s7;

/// The scenarios run for each binary compared: S1 (both debounces), S2, S3, S5, S7.
async fn comparable(client: &Client, sizes: &Sizes, binary: Option<PathBuf>) -> Result<Comparable> {
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
    Ok(Comparable {
        s1_latency: S1Latency {
            debounce_0: s1_zero,
            debounce_250ms: s1_default,
            bare_client_baseline: None,
        },
        s2_fanout: S2Fanout {
            debounce_0: s2_zero,
            debounce_250ms: s2_default,
        },
        s3_needle: s3,
        s5_admission: s5,
        s7_noop_storm: s7,
    })
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
        Some(Part::S10) => return s10::run(&client, &args).await,
        Some(Part::Restarts) => {
            let report = restarts::run(&client, &args).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(());
        }
        None => {}
    }
    let (sizes, vs) = (&args.sizes, &args.vs);
    let mut main = comparable(&client, sizes, None).await?;
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
            match s4_with(&client, secrets, s6_workloads, s6_workloads, &[], sizes).await {
                Ok(r) => S6Full::Done(Box::new(r)),
                Err(e) => S6Full::Failed {
                    error: format!("{e:#}"),
                    workloads: s6_workloads,
                },
            },
        )
    } else {
        None
    };
    eprintln!("S8 the writer …");
    let s8 = writer::s8(&client, sizes).await?;
    eprintln!("S9 index memory …");
    let s9 = writer::s9(&client, sizes.s9_step).await?;
    let vs = match vs {
        Some(b) => Some(Vs {
            binary: b.display().to_string(),
            results: comparable(&client, sizes, Some(b.clone())).await?,
        }),
        None => None,
    };
    main.s1_latency.bare_client_baseline = Some(base);
    let report = Report {
        kubernetes: client.apiserver_version().await?.git_version,
        machine: format!(
            "{} cores",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0)
        ),
        main,
        s4_memory_s6_startup: s4_runs,
        s6_startup_full: s6_full,
        s8_writer: s8,
        s9_index_memory: s9,
        vs,
    };
    let dir = args.results_dir()?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    plots(&dir, &report, sizes)?;
    let mut md = markdown(&report, sizes);
    md += &writer::markdown(Some(&report.s8_writer), Some(&report.s9_index_memory), &[]);
    std::fs::write(dir.join("report.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// The main report's plots: S1's and S5's latency CDFs, S4's memory against data.
fn plots(dir: &std::path::Path, report: &Report, sizes: &Sizes) -> Result<()> {
    let s1 = &report.main.s1_latency;
    let mut s1_runs = vec![
        (
            "rekindle, debounce 0",
            s1.debounce_0.latency.samples_ms.clone(),
        ),
        (
            "rekindle, debounce 250ms",
            s1.debounce_250ms.latency.samples_ms.clone(),
        ),
    ];
    if let Some(base) = &s1.bare_client_baseline {
        s1_runs.push(("bare client PATCH (limit)", base.samples_ms.clone()));
    }
    plots::latency_cdf(
        &dir.join("s1_latency.png"),
        &format!(
            "S1: change accepted → new template in a watch ({} updates)",
            sizes.s1_updates
        ),
        &s1_runs,
    )?;
    let s5 = &report.main.s5_admission;
    let mut s5_runs = vec![(
        "shared cores",
        s5.shared.at_1000_rps.latency.samples_ms.clone(),
    )];
    if let Some(pinned) = &s5.pinned {
        s5_runs.push((
            "pinned: server core 1, client core 0",
            pinned.at_1000_rps.latency.samples_ms.clone(),
        ));
    }
    plots::latency_cdf(
        &dir.join("s5_admission.png"),
        "S5: webhook latency at 1000 AdmissionReviews/s",
        &s5_runs,
    )?;
    let memory: Vec<(f64, f64, f64)> = report
        .s4_memory_s6_startup
        .iter()
        .map(|r| {
            (
                mib(r.data_bytes as u64),
                mib(r.rss_after_sync_bytes),
                mib(r.rss_after_changes_bytes),
            )
        })
        .collect();
    plots::memory(&dir.join("s4_memory.png"), &memory)
}

/// `--only writer`: S3 at two sizes, S8 and S9; bench/results/writer.{json,md}. `--only s8` or
/// `--only s9`: that one alone; bench/results/s8.{json,md} or s9.{json,md}.
async fn writer_only(client: &Client, args: &Args, part: Part) -> Result<()> {
    let name = part.name();
    let all = part == Part::Writer;
    let mut s3_runs = Vec::new();
    let mut s8 = None;
    if all {
        for n in [1000, 5000] {
            eprintln!("S3 ({n} Deployments) …");
            s3_runs.push(s3(client, n, None).await?);
        }
    }
    if all || part == Part::S8 {
        eprintln!("S8 the writer …");
        s8 = Some(writer::s8(client, &args.sizes).await?);
    }
    let mut s9 = None;
    if all || part == Part::S9 {
        eprintln!("S9 index memory …");
        s9 = Some(writer::s9(client, args.sizes.s9_step).await?);
    }
    let version = client.apiserver_version().await?.git_version;
    let report = WriterReport {
        kubernetes: version.clone(),
        s3_needle: s3_runs,
        s8_writer: s8,
        s9_index_memory: s9,
    };
    let dir = args.results_dir()?;
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(&report)?,
    )?;
    let md = format!(
        "# The writer and the index

Kubernetes {version}, a shared 2-core machine: read medians and ratios. `just bench-load --only writer`.
{}",
        writer::markdown(
            report.s8_writer.as_ref(),
            report.s9_index_memory.as_ref(),
            &report.s3_needle
        )
    );
    std::fs::write(dir.join(format!("{name}.md")), &md)?;
    println!("{md}");
    Ok(())
}
