//! The main report: headline figures and the markdown of every scenario.

use crate::args::Sizes;
use crate::measure::mib;
use crate::results::{Comparable, Report, S5Phase, S6Full, S4};
use crate::s5::MEASURES;

/// The headline numbers of one run, as (label, value, unit) rows; `--vs` puts two side by side.
pub fn headline(r: &Comparable) -> Vec<(&'static str, f64, &'static str)> {
    let (s1, s2, s5) = (&r.s1_latency, &r.s2_fanout, &r.s5_admission);
    let pinned = |value: fn(&S5Phase) -> f64| s5.pinned.as_ref().map_or(f64::NAN, value);
    vec![
        ("S1 p50, debounce 0", s1.debounce_0.latency.p50_ms, "ms"),
        ("S1 p99, debounce 0", s1.debounce_0.latency.p99_ms, "ms"),
        (
            "S1 p50, debounce 250ms",
            s1.debounce_250ms.latency.p50_ms,
            "ms",
        ),
        (
            "S2 all patched, debounce 0",
            s2.debounce_0.all_patched_s,
            "s",
        ),
        (
            "S2 all patched, debounce 250ms",
            s2.debounce_250ms.all_patched_s,
            "s",
        ),
        ("S3 latency", r.s3_needle.latency_ms, "ms"),
        (
            "S3 LIST deployments during the change",
            r.s3_needle.requests("LIST deployments"),
            "requests",
        ),
        (
            "S5 p50 at 1000 req/s",
            s5.shared.at_1000_rps.latency.p50_ms,
            "ms",
        ),
        (
            "S5 p99 at 1000 req/s",
            s5.shared.at_1000_rps.latency.p99_ms,
            "ms",
        ),
        ("S5 max sustained", s5.shared.max_sustained_rps, "req/s"),
        (
            "S5 p99 at 1000 req/s, pinned cores",
            pinned(|p| p.at_1000_rps.latency.p99_ms),
            "ms",
        ),
        (
            "S5 max sustained, pinned cores",
            pinned(|p| p.max_sustained_rps),
            "req/s",
        ),
        ("S7 reloads during the storm", r.s7_noop_storm.reloads, ""),
        (
            "S7 CPU during the storm",
            r.s7_noop_storm.cpu_percent_storm,
            "%",
        ),
    ]
}

pub fn markdown(report: &Report, sizes: &Sizes) -> String {
    let main = &report.main;
    let row = |label: &str, v: &crate::results::Latency| {
        format!(
            "| {label} | {} | {:.1} | {:.1} | {:.1} |\n",
            v.n, v.p50_ms, v.p95_ms, v.p99_ms
        )
    };
    let mut md = format!("# Load scenarios\n\nKubernetes {}, {} — a shared, noisy machine: read medians and ratios. Plots: [S1](s1_latency.png), [S4](s4_memory.png), [S5](s5_admission.png).\n\n", report.kubernetes, report.machine);
    md += "## Summary\n\n| | value | unit |\n|---|---|---|\n";
    for (label, v, unit) in headline(main) {
        md += &format!("| {label} | {v:.2} | {unit} |\n");
    }
    if let Some(vs) = &report.vs {
        md += &format!("\n## Side by side: this build vs `{}`\n\n| | this build | other | other / this |\n|---|---|---|---|\n", vs.binary);
        for ((label, a, unit), (_, b, _)) in headline(main).into_iter().zip(headline(&vs.results)) {
            let ratio = if a != 0.0 { b / a } else { f64::NAN };
            md += &format!("| {label} ({unit}) | {a:.2} | {b:.2} | {ratio:.2} |\n");
        }
    }
    let s1 = &main.s1_latency;
    md += &format!("\n## S1 latency: {} ConfigMaps ↔ {} Deployments, {} updates\n\nFrom the update's acceptance to the new template in a watch.\n\n| | n | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|---|\n", sizes.s1_pairs, sizes.s1_pairs, sizes.s1_updates);
    md += &row("rekindle, --reload-debounce=0", &s1.debounce_0.latency);
    md += &row(
        "rekindle, default debounce (250ms)",
        &s1.debounce_250ms.latency,
    );
    if let Some(base) = &s1.bare_client_baseline {
        md += &row("bare client PATCHing the template (limit)", base);
    }
    let wh = &s1.debounce_0.apiserver_webhook_admission;
    md += &format!("\nThe apiserver's own view of the webhook while S1's Deployments were created (`apiserver_admission_webhook_admission_duration_seconds`): {} calls, mean {:.2} ms, p50 ≤ {} ms, p99 ≤ {} ms (bucket bounds).\n", wh.requests, wh.mean_ms, wh.p50_bucket_le_ms, wh.p99_bucket_le_ms);
    md += &format!("\n## S2 fan-out: 1 ConfigMap referenced by {} Deployments\n\n| | patched | all patched s | p50 ms | p99 ms |\n|---|---|---|---|---|\n", sizes.s2_workloads);
    for (label, v) in [
        ("debounce 0", &main.s2_fanout.debounce_0),
        ("debounce 250ms", &main.s2_fanout.debounce_250ms),
    ] {
        md += &format!(
            "| {label} | {} | {:.2} | {:.0} | {:.0} |\n",
            v.patched, v.all_patched_s, v.latency.p50_ms, v.latency.p99_ms
        );
    }
    let s3 = &main.s3_needle;
    md += &format!("\n## S3 needle in a haystack: {} Deployments and {} ConfigMaps in one namespace, one changes\n\nLatency {:.1} ms. API requests during the change (apiserver_request_total delta, all clients, main resources):\n\n| verb resource | requests |\n|---|---|\n", sizes.s3_workloads, sizes.s3_workloads, s3.latency_ms);
    for (k, v) in &s3.api_requests_during_change {
        md += &format!("| {k} | {v} |\n");
    }
    md += "\n## S4 memory and S6 start-up: Secrets of 8 KiB, 5,000 ConfigMaps, 2,000 Deployments\n\nRSS of rekindle (release build) against the bytes of data it watches; start-up is process start to `/ready`.\n\n| Secrets | data watched MiB | start-up to /ready s | RSS after sync MiB | RSS after 1,000 changes MiB |\n|---|---|---|---|---|\n";
    for r in &report.s4_memory_s6_startup {
        md += &format!(
            "| {} | {:.1} | {:.2} | {:.1} | {:.1} |\n",
            r.secrets,
            mib(r.data_bytes as u64),
            r.medians.startup_to_ready_s.unwrap_or(f64::NAN),
            mib(r.rss_after_sync_bytes),
            mib(r.rss_after_changes_bytes)
        );
    }
    match &report.s6_startup_full {
        Some(S6Full::Failed { error, workloads }) => {
            md += &format!("\n## S6 start-up at full size: {workloads} Deployments\n\nDid not complete: {error}\n");
        }
        Some(S6Full::Done(s6)) => md += &s6_markdown(s6),
        None => {}
    }
    md += &s5_markdown(report);
    let s7 = &main.s7_noop_storm;
    md += &format!("\n## S7 no-op storm: 10 ConfigMaps, annotations changing 20 times a second\n\n{} annotation patches in {} s: {} reloads; rekindle's CPU {:.2}% idle, {:.2}% during the storm.\n", s7.annotation_patches, s7.seconds, s7.reloads, s7.cpu_percent_idle, s7.cpu_percent_storm);
    md
}

fn s6_markdown(s6: &S4) -> String {
    let m = &s6.medians;
    let secs = |v: Option<f64>| v.unwrap_or(f64::NAN);
    format!("\n## S6 start-up at full size: {} Deployments, {} resources\n\n{} Deployments (one replica each) each with its ConfigMap, and {} Secrets of 8 KiB ({:.1} MiB watched), medians of {} starts: process start to `/ready` in {:.2} s (rekindle's CPU {:.2} s, the apiserver's {:.2} s), a change made at start reloaded {:.2} s after start; RSS {:.1} MiB after sync, {:.1} MiB after 1,000 changes.\n",
        s6.workloads, s6.configmaps + s6.secrets, s6.workloads, s6.secrets, mib(s6.data_bytes as u64),
        s6.starts.len(),
        secs(m.startup_to_ready_s), secs(m.cpu_to_ready_s), secs(m.apiserver_cpu_to_ready_s), secs(m.first_reload_after_start_s),
        mib(s6.rss_after_sync_bytes), mib(s6.rss_after_changes_bytes))
}

fn s5_markdown(report: &Report) -> String {
    let s5 = &report.main.s5_admission;
    let mut md = format!("\n## S5 admission: the webhook alone, keep-alive TLS from a separate process\n\nA {}-byte AdmissionReview (a Deployment with a ConfigMap and a Secret). *Shared*: client and server share the machine's {}. *Pinned*: rekindle on core 1, the client on core 0 (as when the apiserver is on another node). *Handler*: rekindle's own `rekindle_admission_duration_seconds` (parse, decide, patch; no TLS or HTTP), bucket bound.\n\n| | shared | pinned |\n|---|---|---|\n", s5.review_bytes, report.machine);
    let errors: crate::s5::Measure = ("errors at 1000 req/s", |p| p.at_1000_rps.errors as f64, 0);
    for (label, value, digits) in MEASURES.into_iter().chain([errors]) {
        let pinned = s5
            .pinned
            .as_ref()
            .map_or("—".into(), |p| format!("{:.digits$}", value(p)));
        md += &format!("| {label} | {:.digits$} | {pinned} |\n", value(&s5.shared));
    }
    md
}
