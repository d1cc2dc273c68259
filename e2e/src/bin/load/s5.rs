//! S5: the admission webhook alone, under load.

use crate::admission;
use crate::args::Args;
use crate::cluster::start_rekindle;
use crate::measure::{handler_histogram, median, summary};
use crate::results::{FixedRate, S5Phase, S5Rounds, S5};
use anyhow::Result;
use e2e::rekindle::Rekindle;
use e2e::TestNamespace;
use kube::Client;
use std::path::PathBuf;

/// S5: the webhook alone, from this process, over keep-alive TLS: first with client and server sharing
/// every core, then (on a machine with two or more) with the server pinned to one core and this client to
/// another, as when the apiserver runs on a different node.
pub async fn s5(client: &Client, seconds: u64, binary: Option<PathBuf>) -> Result<S5> {
    let ns = TestNamespace::new(client, "bench-s5").await?;
    let rk = start_rekindle(client, &ns.name, &[], binary).await?;
    let https = admission::client(&e2e::state_dir().join("pki/ca.crt"))?;
    let url: hyper::Uri = format!("https://127.0.0.1:{}/mutate", rk.webhook_port).parse()?;
    let body = admission::review(&ns.name);
    // Warm the connection pool.
    let _ = admission::fixed_rate(&https, &url, &body, 200, 1).await?;
    let shared = s5_phase(&rk, &https, &url, &body, seconds).await?;
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
    let rss_bytes = rk.rss_bytes().unwrap_or(0);
    rk.stop().await?;
    ns.cleanup().await?;
    Ok(S5 {
        shared,
        pinned,
        rss_bytes,
        review_bytes: body.len(),
        note: "client and server share the machine's cores; `pinned`: server on core 1, client on core 0",
    })
}

/// Sets the CPU affinity of every thread of `pid` (`taskset`); false when that is not possible here.
pub fn pin(pid: u32, cpus: &str) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One S5 measurement: latency at 1,000 req/s (client side, and inside the handler from rekindle's own
/// histogram), then the highest rate 32 keep-alive connections sustain and the server CPU it costs.
pub async fn s5_phase(
    rk: &Rekindle,
    https: &admission::Https,
    url: &hyper::Uri,
    body: &bytes::Bytes,
    seconds: u64,
) -> Result<S5Phase> {
    let handler_before = handler_histogram(rk).await?;
    let (latencies, errors_1k) = admission::fixed_rate(https, url, body, 1000, seconds).await?;
    let handler = handler_histogram(rk).await?.minus(&handler_before);
    let cpu_before = rk.cpu_seconds().unwrap_or(0.0);
    let (max_rps, errors_max) = admission::max_rate(https, url, body, 32, seconds).await?;
    let cpu_s = rk.cpu_seconds().unwrap_or(0.0) - cpu_before;
    Ok(S5Phase {
        at_1000_rps: FixedRate {
            latency: summary(latencies),
            errors: errors_1k,
            handler: handler.summary(),
        },
        max_sustained_rps: max_rps,
        max_errors: errors_max,
        server_cpu_s_during_max: cpu_s,
        server_cpu_us_per_request: cpu_s / (max_rps * seconds as f64).max(1.0) * 1e6,
    })
}

/// A measure of one S5 phase: its label, its value and the digits it is shown with.
pub type Measure = (&'static str, fn(&S5Phase) -> f64, usize);

/// What each S5 report shows of a phase.
pub const MEASURES: [Measure; 6] = [
    ("p50 at 1000 req/s, ms", |p| p.at_1000_rps.latency.p50_ms, 3),
    ("p99 at 1000 req/s, ms", |p| p.at_1000_rps.latency.p99_ms, 3),
    (
        "handler p99 at 1000 req/s, ≤ ms",
        |p| p.at_1000_rps.handler.p99_bucket_le_ms,
        2,
    ),
    (
        "handler mean at 1000 req/s, ms",
        |p| p.at_1000_rps.handler.mean_ms,
        3,
    ),
    (
        "max sustained, 32 connections, req/s",
        |p| p.max_sustained_rps,
        0,
    ),
    (
        "server CPU per request at max, µs",
        |p| p.server_cpu_us_per_request,
        0,
    ),
];

/// `--only s5`: the webhook alone, in rounds, taking turns with the `--vs` binary (the first to start
/// alternates); bench/results/s5.{json,md} with each round and the medians.
pub async fn s5_only(client: &Client, args: &Args) -> Result<()> {
    let rounds = args.sizes.s5_rounds as usize;
    let seconds = args.sizes.s5_seconds;
    let mut builds: Vec<(String, Option<PathBuf>)> = vec![("this build".into(), None)];
    if let Some(b) = &args.vs {
        builds.push((b.display().to_string(), Some(b.clone())));
    }
    let mut runs: Vec<Vec<S5>> = vec![Vec::new(); builds.len()];
    for round in 0..rounds {
        for turn in 0..builds.len() {
            let i = (turn + round) % builds.len();
            eprintln!("S5 round {} of {rounds}, {} …", round + 1, builds[i].0);
            let mut r = s5(client, seconds, builds[i].1.clone()).await?;
            // Percentiles are kept; 10,000 samples per phase are not.
            for phase in std::iter::once(&mut r.shared).chain(r.pinned.as_mut()) {
                phase.at_1000_rps.latency.samples_ms.clear();
            }
            runs[i].push(r);
        }
    }
    let mut md = format!(
        "# S5 the webhook alone\n\nA Deployment's AdmissionReview over keep-alive TLS from a separate process, {seconds} s at 1,000 req/s then as fast as 32 connections go, {rounds} rounds taking turns (the first to start alternates). *Shared*: client and server share the cores; *pinned*: rekindle on core 1, the client on core 0. *Handler*: rekindle's own `rekindle_admission_duration_seconds` (parse, decide, patch; no TLS or HTTP), as a bucket bound. Medians over the rounds. `just bench-load --only s5`.\n\n| build | measure | shared | pinned | shared, each round | pinned, each round |\n|---|---|---|---|---|---|\n"
    );
    let mut report = Vec::new();
    for ((label, _), runs) in builds.iter().zip(runs) {
        for (measure, value, digits) in MEASURES {
            // A phase that did not run (no pinned phase on one core) has no value in that round.
            let shared: Vec<f64> = runs.iter().map(|r| value(&r.shared)).collect();
            let pinned: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.pinned.as_ref().map(value))
                .collect();
            let cell = |v: Option<f64>| v.map_or("—".into(), |x| format!("{x:.digits$}"));
            let list = |v: &[f64]| {
                v.iter()
                    .map(|x| cell(Some(*x)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            md += &format!(
                "| {label} | {measure} | {} | {} | {} | {} |\n",
                cell(median(shared.clone())),
                cell(median(pinned.clone())),
                list(&shared),
                list(&pinned)
            );
        }
        report.push(S5Rounds {
            build: label.clone(),
            rounds: runs,
        });
    }
    let dir = args.results_dir()?;
    std::fs::write(dir.join("s5.json"), serde_json::to_string_pretty(&report)?)?;
    std::fs::write(dir.join("s5.md"), &md)?;
    println!("{md}");
    Ok(())
}
