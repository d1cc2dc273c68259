//! The main report: headline figures and the markdown of every scenario.

use crate::args::Sizes;
use crate::measure::f;
use serde_json::Value;

/// The headline numbers of one run, as (label, value, unit) rows; `--vs` puts two side by side.
pub fn headline(r: &Value) -> Vec<(&'static str, f64, &'static str)> {
    vec![
        (
            "S1 p50, debounce 0",
            f(&r["s1_latency"]["debounce_0"]["p50_ms"]),
            "ms",
        ),
        (
            "S1 p99, debounce 0",
            f(&r["s1_latency"]["debounce_0"]["p99_ms"]),
            "ms",
        ),
        (
            "S1 p50, debounce 250ms",
            f(&r["s1_latency"]["debounce_250ms"]["p50_ms"]),
            "ms",
        ),
        (
            "S2 all patched, debounce 0",
            f(&r["s2_fanout"]["debounce_0"]["all_patched_s"]),
            "s",
        ),
        (
            "S2 all patched, debounce 250ms",
            f(&r["s2_fanout"]["debounce_250ms"]["all_patched_s"]),
            "s",
        ),
        ("S3 latency", f(&r["s3_needle"]["latency_ms"]), "ms"),
        (
            "S3 LIST deployments during the change",
            r["s3_needle"]["api_requests_during_change"]["LIST deployments"]
                .as_f64()
                .unwrap_or(0.0),
            "requests",
        ),
        (
            "S5 p50 at 1000 req/s",
            f(&r["s5_admission"]["at_1000_rps"]["p50_ms"]),
            "ms",
        ),
        (
            "S5 p99 at 1000 req/s",
            f(&r["s5_admission"]["at_1000_rps"]["p99_ms"]),
            "ms",
        ),
        (
            "S5 max sustained",
            f(&r["s5_admission"]["max_sustained_rps"]),
            "req/s",
        ),
        (
            "S5 p99 at 1000 req/s, pinned cores",
            f(&r["s5_admission"]["pinned"]["at_1000_rps"]["p99_ms"]),
            "ms",
        ),
        (
            "S5 max sustained, pinned cores",
            f(&r["s5_admission"]["pinned"]["max_sustained_rps"]),
            "req/s",
        ),
        (
            "S7 reloads during the storm",
            f(&r["s7_noop_storm"]["reloads"]),
            "",
        ),
        (
            "S7 CPU during the storm",
            f(&r["s7_noop_storm"]["cpu_percent_storm"]),
            "%",
        ),
    ]
}

pub fn markdown(report: &Value, sizes: &Sizes) -> String {
    let version = report["kubernetes"].as_str().unwrap_or("");
    let row = |label: &str, v: &Value| {
        format!(
            "| {label} | {} | {:.1} | {:.1} | {:.1} |\n",
            v["n"],
            f(&v["p50_ms"]),
            f(&v["p95_ms"]),
            f(&v["p99_ms"])
        )
    };
    let mut md = format!("# Load scenarios\n\nKubernetes {version}, {} — a shared, noisy machine: read medians and ratios. Plots: [S1](s1_latency.png), [S4](s4_memory.png), [S5](s5_admission.png).\n\n", report["machine"].as_str().unwrap_or(""));
    md += "## Summary\n\n| | value | unit |\n|---|---|---|\n";
    for (label, v, unit) in headline(report) {
        md += &format!("| {label} | {v:.2} | {unit} |\n");
    }
    if let Some(vs) = report.get("vs") {
        md += &format!("\n## Side by side: this build vs `{}`\n\n| | this build | other | other / this |\n|---|---|---|---|\n", vs["binary"].as_str().unwrap_or(""));
        for ((label, a, unit), (_, b, _)) in
            headline(report).into_iter().zip(headline(&vs["results"]))
        {
            let ratio = if a != 0.0 { b / a } else { f64::NAN };
            md += &format!("| {label} ({unit}) | {a:.2} | {b:.2} | {ratio:.2} |\n");
        }
    }
    md += &format!("\n## S1 latency: {} ConfigMaps ↔ {} Deployments, {} updates\n\nFrom the update's acceptance to the new template in a watch.\n\n| | n | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|---|\n", sizes.s1_pairs, sizes.s1_pairs, sizes.s1_updates);
    md += &row(
        "rekindle, --reload-debounce=0",
        &report["s1_latency"]["debounce_0"],
    );
    md += &row(
        "rekindle, default debounce (250ms)",
        &report["s1_latency"]["debounce_250ms"],
    );
    md += &row(
        "bare client PATCHing the template (limit)",
        &report["s1_latency"]["bare_client_baseline"],
    );
    let wh = &report["s1_latency"]["debounce_0"]["apiserver_webhook_admission"];
    md += &format!("\nThe apiserver's own view of the webhook while S1's Deployments were created (`apiserver_admission_webhook_admission_duration_seconds`): {} calls, mean {:.2} ms, p50 ≤ {} ms, p99 ≤ {} ms (bucket bounds).\n", wh["requests"], f(&wh["mean_ms"]), wh["p50_bucket_le_ms"], wh["p99_bucket_le_ms"]);
    md += &format!("\n## S2 fan-out: 1 ConfigMap referenced by {} Deployments\n\n| | patched | all patched s | p50 ms | p99 ms |\n|---|---|---|---|---|\n", sizes.s2_workloads);
    for (label, key) in [
        ("debounce 0", "debounce_0"),
        ("debounce 250ms", "debounce_250ms"),
    ] {
        let v = &report["s2_fanout"][key];
        md += &format!(
            "| {label} | {} | {:.2} | {:.0} | {:.0} |\n",
            v["patched"],
            f(&v["all_patched_s"]),
            f(&v["p50_ms"]),
            f(&v["p99_ms"])
        );
    }
    md += &format!("\n## S3 needle in a haystack: {} Deployments and {} ConfigMaps in one namespace, one changes\n\nLatency {:.1} ms. API requests during the change (apiserver_request_total delta, all clients, main resources):\n\n| verb resource | requests |\n|---|---|\n", sizes.s3_workloads, sizes.s3_workloads, f(&report["s3_needle"]["latency_ms"]));
    for (k, v) in report["s3_needle"]["api_requests_during_change"]
        .as_object()
        .into_iter()
        .flatten()
    {
        md += &format!("| {k} | {v} |\n");
    }
    md += "\n## S4 memory and S6 start-up: Secrets of 8 KiB, 5,000 ConfigMaps, 2,000 Deployments\n\nRSS of rekindle (release build) against the bytes of data it watches; start-up is process start to `/ready`.\n\n| Secrets | data watched MiB | start-up to /ready s | RSS after sync MiB | RSS after 1,000 changes MiB |\n|---|---|---|---|---|\n";
    for r in report["s4_memory_s6_startup"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let mib = |k: &str| f(&r[k]) / 1048576.0;
        md += &format!(
            "| {} | {:.1} | {:.2} | {:.1} | {:.1} |\n",
            r["secrets"],
            mib("data_bytes"),
            f(&r["startup_to_ready_s"]),
            mib("rss_after_sync_bytes"),
            mib("rss_after_changes_bytes")
        );
    }
    let s6 = &report["s6_startup_full"];
    if let Some(error) = s6["error"].as_str() {
        md += &format!(
            "\n## S6 start-up at full size: {} Deployments\n\nDid not complete: {error}\n",
            s6["workloads"]
        );
    } else if s6.is_object() {
        md += &format!("\n## S6 start-up at full size: {} Deployments, {} resources\n\n{} Deployments (one replica each) each with its ConfigMap, and {} Secrets of 8 KiB ({:.1} MiB watched), medians of {} starts: process start to `/ready` in {:.2} s (rekindle's CPU {:.2} s, the apiserver's {:.2} s), a change made at start reloaded {:.2} s after start; RSS {:.1} MiB after sync, {:.1} MiB after 1,000 changes.\n",
            s6["workloads"], f(&s6["configmaps"]) + f(&s6["secrets"]), s6["workloads"], s6["secrets"], f(&s6["data_bytes"]) / 1048576.0,
            s6["starts"].as_array().map_or(0, Vec::len),
            f(&s6["startup_to_ready_s"]), f(&s6["cpu_to_ready_s"]), f(&s6["apiserver_cpu_to_ready_s"]), f(&s6["first_reload_after_start_s"]),
            f(&s6["rss_after_sync_bytes"]) / 1048576.0, f(&s6["rss_after_changes_bytes"]) / 1048576.0);
    }
    let s5 = &report["s5_admission"];
    md += &format!("\n## S5 admission: the webhook alone, keep-alive TLS from a separate process\n\nA {}-byte AdmissionReview (a Deployment with a ConfigMap and a Secret). *Shared*: client and server share the machine's {}. *Pinned*: rekindle on core 1, the client on core 0 (as when the apiserver is on another node). *Handler*: rekindle's own `rekindle_admission_duration_seconds` (parse, decide, patch; no TLS or HTTP), bucket bound.\n\n| | shared | pinned |\n|---|---|---|\n", s5["review_bytes"], report["machine"].as_str().unwrap_or(""));
    let p = &s5["pinned"];
    for (label, key, unit, digits) in [
        ("p50 at 1000 req/s", "/at_1000_rps/p50_ms", "ms", 3),
        ("p99 at 1000 req/s", "/at_1000_rps/p99_ms", "ms", 3),
        (
            "handler p99 at 1000 req/s, ≤",
            "/at_1000_rps/handler/p99_bucket_le_ms",
            "ms",
            2,
        ),
        (
            "handler mean at 1000 req/s",
            "/at_1000_rps/handler/mean_ms",
            "ms",
            3,
        ),
        ("errors at 1000 req/s", "/at_1000_rps/errors", "", 0),
        (
            "max sustained (32 connections)",
            "/max_sustained_rps",
            "req/s",
            0,
        ),
        (
            "server CPU per request at max",
            "/server_cpu_us_per_request",
            "µs",
            0,
        ),
    ] {
        let cell = |v: Option<&Value>| match v.and_then(Value::as_f64) {
            Some(x) => format!("{x:.digits$} {unit}"),
            None => "—".into(),
        };
        md += &format!(
            "| {label} | {} | {} |\n",
            cell(s5.pointer(key)),
            cell(p.pointer(key))
        );
    }
    let s7 = &report["s7_noop_storm"];
    md += &format!("\n## S7 no-op storm: 10 ConfigMaps, annotations changing 20 times a second\n\n{} annotation patches in {} s: {} reloads; rekindle's CPU {:.2}% idle, {:.2}% during the storm.\n", s7["annotation_patches"], s7["seconds"], s7["reloads"], f(&s7["cpu_percent_idle"]), f(&s7["cpu_percent_storm"]));
    md
}
