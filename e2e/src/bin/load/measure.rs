//! Measurements: percentiles, histograms scraped from /metrics, the apiserver's request counts and CPU.

use anyhow::Result;
use e2e::rekindle::Rekindle;
use kube::Client;
use rand::{RngExt, SeedableRng};
use rand_xorshift::XorShiftRng;
use std::collections::BTreeMap;

use crate::results::{Buckets, Latency};

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// How far this run's sampling noise alone moves the difference of two latency ratios,
/// `p-th(a1) / p-th(b1) − p-th(a0) / p-th(b0)`: the 2.5th and 97.5th percentiles of that difference
/// over resamples of the four sample sets, each drawn again with replacement (a bootstrap). Seeded,
/// so that one set of samples always gives one interval. `None` when a set is empty.
///
/// It says nothing of what changed between the two sets' runs (the machine's load, the
/// apiserver's state): rounds run back to back show that spread.
pub fn ratio_difference_interval(
    (a0, b0): (&[f64], &[f64]),
    (a1, b1): (&[f64], &[f64]),
    p: f64,
) -> Option<(f64, f64)> {
    const RESAMPLES: usize = 1000;
    if [a0, b0, a1, b1].iter().any(|s| s.is_empty()) {
        return None;
    }
    let mut rng = XorShiftRng::seed_from_u64(10);
    let mut scratch = Vec::new();
    let mut resampled = |s: &[f64]| {
        scratch.clear();
        scratch.extend((0..s.len()).map(|_| s[rng.random_range(0..s.len())]));
        scratch.sort_by(f64::total_cmp);
        percentile(&scratch, p)
    };
    let mut differences: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let small = resampled(a0) / resampled(b0);
            resampled(a1) / resampled(b1) - small
        })
        .collect();
    differences.sort_by(f64::total_cmp);
    Some((
        percentile(&differences, 2.5),
        percentile(&differences, 97.5),
    ))
}

/// Bytes in MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// The median of the values, `None` for none.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| percentile(&v, 50.0))
}

pub fn summary(mut ms: Vec<f64>) -> Latency {
    ms.sort_by(|a, b| a.total_cmp(b));
    Latency {
        n: ms.len(),
        p50_ms: percentile(&ms, 50.0),
        p95_ms: percentile(&ms, 95.0),
        p99_ms: percentile(&ms, 99.0),
        samples_ms: ms,
    }
}

/// A Prometheus histogram, summed over the series kept: for example the apiserver's own
/// `apiserver_admission_webhook_admission_duration_seconds` for rekindle's webhook.
#[derive(Default)]
pub struct Histogram {
    buckets: BTreeMap<String, f64>,
    sum: f64,
    count: f64,
}

impl Histogram {
    pub fn minus(mut self, before: &Histogram) -> Histogram {
        for (le, v) in self.buckets.iter_mut() {
            *v -= before.buckets.get(le).copied().unwrap_or(0.0);
        }
        self.sum -= before.sum;
        self.count -= before.count;
        self
    }

    /// The mean in milliseconds; `None` without observations.
    pub fn mean_ms(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count * 1000.0)
    }

    /// Mean, and the upper bound of the bucket holding p50 and p99.
    pub fn summary(&self) -> Buckets {
        let mut bounds: Vec<(f64, f64)> = self
            .buckets
            .iter()
            .filter_map(|(le, v)| {
                Some((
                    if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().ok()?
                    },
                    *v,
                ))
            })
            .collect();
        bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let quantile = |q: f64| {
            bounds
                .iter()
                .find(|(_, c)| *c >= q * self.count)
                .map(|(le, _)| le * 1000.0)
                .unwrap_or(f64::NAN)
        };
        Buckets {
            requests: self.count,
            mean_ms: self.mean_ms().unwrap_or(f64::NAN),
            p50_bucket_le_ms: quantile(0.5),
            p99_bucket_le_ms: quantile(0.99),
        }
    }
}

impl Histogram {
    /// The series of histogram `name` in Prometheus text whose line passes `keep`, summed.
    pub fn parse(text: &str, name: &str, keep: impl Fn(&str) -> bool) -> Histogram {
        let mut h = Histogram::default();
        for line in text.lines().filter(|l| l.starts_with(name) && keep(l)) {
            let (labels, value) = line.rsplit_once(' ').unwrap_or((line, "0"));
            let value: f64 = value.parse().unwrap_or(0.0);
            if line.starts_with(&format!("{name}_bucket")) {
                let le = labels
                    .split("le=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("")
                    .to_string();
                *h.buckets.entry(le).or_default() += value;
            } else if line.starts_with(&format!("{name}_sum")) {
                h.sum += value;
            } else if line.starts_with(&format!("{name}_count")) {
                h.count += value;
            }
        }
        h
    }
}

pub async fn webhook_histogram(client: &Client) -> Result<Histogram> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(Histogram::parse(
        &text,
        "apiserver_admission_webhook_admission_duration_seconds",
        |l| l.contains("name=\"workloads.rekindle.io\"") && l.contains("type=\"admit\""),
    ))
}

/// rekindle's own `rekindle_admission_duration_seconds`: time inside the handler, without TLS and HTTP.
pub async fn handler_histogram(rk: &Rekindle) -> Result<Histogram> {
    Ok(Histogram::parse(
        &rk.metrics().await?,
        "rekindle_admission_duration_seconds",
        |_| true,
    ))
}

/// `apiserver_request_total` by "VERB resource", for the (verb, resource) pairs `keep` passes
/// (subresources left out).
pub async fn request_counts(
    client: &Client,
    keep: impl Fn(&str, &str) -> bool,
) -> Result<BTreeMap<String, f64>> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').unwrap_or((line, "0"));
        let get = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let (verb, resource) = (get("verb"), get("resource"));
        if !keep(&verb, &resource) || !get("subresource").is_empty() {
            continue;
        }
        *out.entry(format!("{verb} {resource}")).or_insert(0.0) +=
            value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

/// The apiserver's CPU seconds (`process_cpu_seconds_total`) and the bytes of all its responses
/// (`apiserver_response_sizes_sum`), from its /metrics.
pub async fn apiserver_cost(client: &Client) -> Result<(f64, f64)> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let value = |l: &str| {
        l.rsplit_once(' ')
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = text
        .lines()
        .find(|l| l.starts_with("process_cpu_seconds_total "))
        .map(value)
        .unwrap_or(f64::NAN);
    let bytes = text
        .lines()
        .filter(|l| l.starts_with("apiserver_response_sizes_sum{"))
        .map(value)
        .sum();
    Ok((cpu, bytes))
}

/// The workload and ConfigMap requests S3 and S8 count.
pub fn workloads_and_configmaps(_verb: &str, resource: &str) -> bool {
    matches!(
        resource,
        "deployments" | "configmaps" | "statefulsets" | "daemonsets"
    )
}

#[cfg(test)]
mod tests {
    use super::{ratio_difference_interval, Histogram};

    /// Latencies spread like a paced round's: mostly near `median`, a tail of a few times it.
    fn round(median: f64, n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| {
                let tail = if i % 50 == 0 { 2.5 } else { 1.0 };
                median * tail * (0.8 + 0.4 * ((i * 37) % 101) as f64 / 100.0)
            })
            .collect()
    }

    #[test]
    fn the_interval_holds_zero_for_one_distribution_and_not_for_a_slower_one() {
        let (a, b) = (round(5.0, 300), round(6.0, 300));
        // The same samples at both sizes: the difference is 0 and its interval holds it.
        for p in [50.0, 99.0] {
            let (lo, hi) = ratio_difference_interval((&a, &b), (&a, &b), p).unwrap();
            assert!(lo < 0.0 && hi > 0.0, "p{p}: {lo} .. {hi}");
        }
        // The controller half again as slow at the larger size, the bare client not.
        let slower: Vec<f64> = a.iter().map(|v| v * 1.5).collect();
        let (lo, _) = ratio_difference_interval((&a, &b), (&slower, &b), 50.0).unwrap();
        assert!(lo > 0.2, "{lo}");
        assert_eq!(
            ratio_difference_interval((&a, &b), (&a, &b), 99.0),
            ratio_difference_interval((&a, &b), (&a, &b), 99.0),
            "seeded: one set of samples, one interval"
        );
        assert_eq!(ratio_difference_interval((&[], &b), (&a, &b), 50.0), None);
    }

    #[test]
    fn a_histogram_sums_the_series_kept_and_its_mean_is_of_the_difference() {
        let text = |patch_sum: f64, patch_count: f64| {
            format!(
                "# HELP rest_client_request_duration_seconds x\n\
                 rest_client_request_duration_seconds_bucket{{host=\"a\",verb=\"PATCH\",le=\"0.005\"}} {patch_count}\n\
                 rest_client_request_duration_seconds_sum{{host=\"a\",verb=\"PATCH\"}} {patch_sum}\n\
                 rest_client_request_duration_seconds_count{{host=\"a\",verb=\"PATCH\"}} {patch_count}\n\
                 rest_client_request_duration_seconds_sum{{host=\"a\",verb=\"GET\"}} 9\n\
                 rest_client_request_duration_seconds_count{{host=\"a\",verb=\"GET\"}} 3\n"
            )
        };
        let patch = |l: &str| l.contains("verb=\"PATCH\"");
        let before = Histogram::parse(
            &text(0.010, 2.0),
            "rest_client_request_duration_seconds",
            patch,
        );
        let after = Histogram::parse(
            &text(0.040, 8.0),
            "rest_client_request_duration_seconds",
            patch,
        );
        assert_eq!(before.mean_ms(), Some(5.0));
        assert_eq!(after.minus(&before).mean_ms(), Some(5.0));
        assert_eq!(Histogram::default().mean_ms(), None);
    }
}
