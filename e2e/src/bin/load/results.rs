//! What each scenario measures, as types: a report reads fields the compiler checks, never a name
//! that was not written. Serialized as the reports' JSON (a value that could not be measured, NaN or
//! `None`, is `null`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::measure::median;

/// Latency percentiles of one run, with its samples (dropped where only the percentiles are kept).
#[derive(Serialize, Clone, Debug, Default)]
pub struct Latency {
    pub n: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples_ms: Vec<f64>,
}

/// A histogram scraped from a /metrics endpoint: its mean, and the upper bound of the buckets holding
/// p50 and p99.
#[derive(Serialize, Clone, Debug)]
pub struct Buckets {
    pub requests: f64,
    pub mean_ms: f64,
    pub p50_bucket_le_ms: f64,
    pub p99_bucket_le_ms: f64,
}

/// S1 for one debounce: change accepted → new template in a watch.
#[derive(Serialize, Clone, Debug)]
pub struct S1 {
    #[serde(flatten)]
    pub latency: Latency,
    pub reloads: f64,
    /// The apiserver's view of the webhook while S1's Deployments were created.
    pub apiserver_webhook_admission: Buckets,
}

#[derive(Serialize, Clone, Debug)]
pub struct S1Latency {
    pub debounce_0: S1,
    pub debounce_250ms: S1,
    /// The bare client's own PATCH (the limit); measured once, not per binary compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bare_client_baseline: Option<Latency>,
}

/// S2: one ConfigMap used by many Deployments.
#[derive(Serialize, Clone, Debug)]
pub struct S2 {
    #[serde(flatten)]
    pub latency: Latency,
    pub workloads: usize,
    pub patched: usize,
    pub all_patched_s: f64,
    pub reloads: f64,
}

#[derive(Serialize, Clone, Debug)]
pub struct S2Fanout {
    pub debounce_0: S2,
    pub debounce_250ms: S2,
}

/// S3: one change among many workloads, and what it cost the apiserver.
#[derive(Serialize, Clone, Debug)]
pub struct S3 {
    pub workloads: usize,
    pub configmaps: usize,
    pub setup_s: f64,
    pub latency_ms: f64,
    /// `apiserver_request_total` deltas by "VERB resource".
    pub api_requests_during_change: BTreeMap<String, f64>,
    pub apiserver_cpu_s: f64,
    pub apiserver_response_bytes: f64,
}

impl S3 {
    /// Requests of one "VERB resource" during the change (0 when none were made).
    pub fn requests(&self, verb_resource: &str) -> f64 {
        self.api_requests_during_change
            .get(verb_resource)
            .copied()
            .unwrap_or(0.0)
    }
}

/// S5 at 1,000 req/s: the client's latency, its errors and the handler's own histogram.
#[derive(Serialize, Clone, Debug)]
pub struct FixedRate {
    #[serde(flatten)]
    pub latency: Latency,
    pub errors: u64,
    pub handler: Buckets,
}

/// One S5 phase: latency at a fixed rate, then the highest rate sustained and its CPU.
#[derive(Serialize, Clone, Debug)]
pub struct S5Phase {
    pub at_1000_rps: FixedRate,
    pub max_sustained_rps: f64,
    pub max_errors: u64,
    pub server_cpu_s_during_max: f64,
    pub server_cpu_us_per_request: f64,
}

/// S5: a phase with client and server sharing the cores, and one pinned apart where there are two.
#[derive(Serialize, Clone, Debug)]
pub struct S5 {
    #[serde(flatten)]
    pub shared: S5Phase,
    pub pinned: Option<S5Phase>,
    pub rss_bytes: u64,
    pub review_bytes: usize,
    pub note: &'static str,
}

/// `--only s5`: each build's rounds.
#[derive(Serialize, Clone, Debug)]
pub struct S5Rounds {
    pub build: String,
    pub rounds: Vec<S5>,
}

/// S7: annotation-only changes, which reload nothing.
#[derive(Serialize, Clone, Debug)]
pub struct S7 {
    pub seconds: u64,
    pub annotation_patches: usize,
    pub reloads: f64,
    pub cpu_percent_idle: f64,
    pub cpu_percent_storm: f64,
}

/// One start of rekindle over the S4/S6 objects.
#[derive(Serialize, Clone, Debug, Default)]
pub struct Start {
    pub startup_to_ready_s: f64,
    /// A change made at start, reloaded this long after start (`None`: not within a minute).
    pub first_reload_after_start_s: Option<f64>,
    pub cpu_to_ready_s: Option<f64>,
    pub apiserver_cpu_to_ready_s: f64,
}

/// The medians of several starts.
#[derive(Serialize, Clone, Debug, Default)]
pub struct Starts {
    pub startup_to_ready_s: Option<f64>,
    pub first_reload_after_start_s: Option<f64>,
    pub cpu_to_ready_s: Option<f64>,
    pub apiserver_cpu_to_ready_s: Option<f64>,
}

impl Starts {
    pub fn median_of(starts: &[Start]) -> Self {
        let of =
            |field: fn(&Start) -> Option<f64>| median(starts.iter().filter_map(field).collect());
        Starts {
            startup_to_ready_s: of(|s| Some(s.startup_to_ready_s)),
            first_reload_after_start_s: of(|s| s.first_reload_after_start_s),
            cpu_to_ready_s: of(|s| s.cpu_to_ready_s),
            apiserver_cpu_to_ready_s: of(|s| Some(s.apiserver_cpu_to_ready_s)),
        }
    }
}

/// The starts of the `REKINDLE_BENCH_S6_VS` binary over the same objects.
#[derive(Serialize, Clone, Debug)]
pub struct VsStarts {
    pub binary: String,
    #[serde(flatten)]
    pub medians: Starts,
    pub starts: Vec<Start>,
}

/// S4/S6: memory against the data watched, and start-up.
#[derive(Serialize, Clone, Debug)]
pub struct S4 {
    /// `--only s6`: streaming or paged lists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lists: Option<&'static str>,
    pub secrets: usize,
    pub configmaps: usize,
    pub workloads: usize,
    pub data_bytes: usize,
    pub settled_s: f64,
    #[serde(flatten)]
    pub medians: Starts,
    pub starts: Vec<Start>,
    pub rss_after_sync_bytes: u64,
    pub rss_after_changes_bytes: u64,
    pub vs: Option<VsStarts>,
}

/// S6 at full size: the largest run, whose failure is reported instead of losing the report.
#[derive(Serialize, Clone, Debug)]
#[serde(untagged)]
pub enum S6Full {
    Done(Box<S4>),
    Failed { error: String, workloads: usize },
}

/// One S8 run: one writer at one pace.
#[derive(Serialize, Clone, Debug)]
pub struct Paced {
    #[serde(flatten)]
    pub latency: Latency,
    pub who: &'static str,
    pub rate_per_s: f64,
    /// Rounds of the paced runs; none for the busy-writer runs.
    pub round: Option<usize>,
    pub missed: usize,
    /// Where in the run the slowest change came (0 = the first change after start).
    pub slowest_at: Option<usize>,
    pub busy_writer_patches: Option<u64>,
    #[serde(flatten)]
    pub rekindle: Option<WriterCost>,
}

/// What rekindle's writer spent on the changes of one S8 run.
#[derive(Serialize, Clone, Debug)]
pub struct WriterCost {
    pub get_deployments_per_change: f64,
    /// Less the busy writer's own PATCHes.
    pub patch_deployments_per_change: f64,
    pub failed_attempts: f64,
    pub workload_reads: f64,
    /// Share of changes handled (watch event → dependents queued) within 1 ms.
    pub reconcile_within_1ms: f64,
    pub reloads: f64,
    /// rekindle's PATCHes slower than 25 ms to their response headers.
    pub patches_over_25ms: f64,
}

/// A ConfigMap and a Secret of one Deployment changed 200 ms apart, `trials` times.
#[derive(Serialize, Clone, Debug)]
pub struct Pair {
    pub trials: usize,
    pub rollouts_per_pair: Vec<i64>,
}

#[derive(Serialize, Clone, Debug)]
pub struct S8 {
    pub paced: Vec<Paced>,
    pub busy: Vec<Paced>,
    pub pair: Pair,
}

/// S9: RSS at each step, as (objects, bytes).
#[derive(Serialize, Clone, Debug)]
pub struct S9 {
    pub resources: Vec<(usize, u64)>,
    pub workloads: Vec<(usize, u64)>,
    pub bytes_per_resource: f64,
    pub bytes_per_workload: f64,
    pub bytes_per_workload_second_step: f64,
    /// RSS before and after the used-keys readers (each making the index digest a ConfigMap).
    pub key_readers: Vec<(usize, u64)>,
    pub bytes_per_key_reader: f64,
    pub bytes_per_key: f64,
}

/// The scenarios run for each binary compared.
#[derive(Serialize, Clone, Debug)]
pub struct Comparable {
    pub s1_latency: S1Latency,
    pub s2_fanout: S2Fanout,
    pub s3_needle: S3,
    pub s5_admission: S5,
    pub s7_noop_storm: S7,
}

/// The same scenarios against the `--vs` binary.
#[derive(Serialize, Clone, Debug)]
pub struct Vs {
    pub binary: String,
    pub results: Comparable,
}

/// bench/results/report.json.
#[derive(Serialize, Clone, Debug)]
pub struct Report {
    pub kubernetes: String,
    pub machine: String,
    #[serde(flatten)]
    pub main: Comparable,
    pub s4_memory_s6_startup: Vec<S4>,
    pub s6_startup_full: Option<S6Full>,
    pub s8_writer: S8,
    pub s9_index_memory: S9,
    pub vs: Option<Vs>,
}

/// `--only writer`, `--only s8`, `--only s9`: bench/results/<part>.json.
#[derive(Serialize, Clone, Debug)]
pub struct WriterReport {
    pub kubernetes: String,
    pub s3_needle: Vec<S3>,
    pub s8_writer: Option<S8>,
    pub s9_index_memory: Option<S9>,
}

impl From<&Start> for Starts {
    /// One start, shown as the medians of one.
    fn from(s: &Start) -> Self {
        Starts::median_of(std::slice::from_ref(s))
    }
}
