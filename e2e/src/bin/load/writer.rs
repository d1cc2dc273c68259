//! S8, the writer: reload latency at a fixed pace next to the bare client of the same run, the API
//! requests and retries one change costs (also while another client keeps writing the workloads), a
//! ConfigMap and a Secret changed 200 ms apart under the default configuration, and S9, the index's
//! memory per workload and per resource as either grows at a fixed number of the other.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::rekindle::{Options, Rekindle};
use e2e::TestNamespace;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::args::Sizes;
use crate::cluster::{create_many, create_pairs, quiesce, seen, template_watch};
use crate::measure::{mib, percentile, request_counts, summary, workloads_and_configmaps};
use crate::results::{Paced, Pair, WriterCost, S3, S8, S9};

/// Who applies the change: rekindle (with its debounce flag, None = default) or the bench itself.
#[derive(Clone, Copy)]
enum Who {
    Bare,
    Rekindle(Option<&'static str>),
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::Bare => "bare client",
            Who::Rekindle(Some(_)) => "rekindle, debounce 0",
            Who::Rekindle(None) => "rekindle, default configuration",
        }
    }
}

const PAIRS: usize = 20;

/// One paced run: `updates` ConfigMap changes at `rate` per second, each waited for in a watch.
/// `busy`: another client patches every Deployment's labels in a tight loop meanwhile.
async fn paced(client: &Client, who: Who, rate: f64, updates: usize, busy: bool) -> Result<Paced> {
    // The previous run's namespace (its Deployments, ReplicaSets and pods) is deleted in the
    // background: let that finish first, or it lands in whichever writer runs next.
    quiesce(client, "").await?;
    let ns = TestNamespace::new(client, "bench-s8").await?;
    create_pairs(client, &ns.name, PAIRS, matches!(who, Who::Rekindle(_))).await?;
    let rk = match who {
        Who::Bare => None,
        Who::Rekindle(debounce) => {
            let flag = debounce.map(|d| format!("--reload-debounce={d}"));
            let args: Vec<&str> = flag.iter().map(String::as_str).collect();
            Some(
                Rekindle::start(
                    client,
                    &[&ns.name],
                    Options {
                        args: &args,
                        ..Default::default()
                    },
                )
                .await?,
            )
        }
    };
    let mut rx = template_watch(client, &ns.name);
    tokio::time::sleep(Duration::from_secs(2)).await;
    while rx.try_recv().is_ok() {}
    let ds: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let stop = tokio_util::sync::CancellationToken::new();
    let busy_writer = busy.then(|| {
        let (ds, stop) = (ds.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                let patch = json!({"metadata": {"labels": {"busy": n.to_string()}}});
                let name = format!("d-{}", n as usize % PAIRS);
                if ds
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    n += 1;
                }
            }
            n
        })
    });
    let before = request_counts(client, workloads_and_configmaps).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let mut latencies = Vec::new();
    let mut missed = 0;
    for u in 0..updates {
        let due = start + interval * u as u32;
        tokio::time::sleep_until(due.into()).await;
        let i = (u * 7) % PAIRS;
        let target = format!("d-{i}");
        let (marker, accepted) = match who {
            Who::Bare => {
                let value = format!("v{u}");
                let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "env": [{"name": "X", "value": value}]}]}}}});
                let at = Instant::now();
                ds.patch(&target, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await?;
                (value, at)
            }
            Who::Rekindle(_) => {
                let cm = cms
                    .patch(
                        &format!("cm-{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"data": {"v": format!("u{u}")}})),
                    )
                    .await?;
                (
                    rekindle::core::hash::configmap_hash_typed(&cm),
                    Instant::now(),
                )
            }
        };
        match seen(&mut rx, &target, &marker, Duration::from_secs(10)).await {
            Some(at) => {
                latencies.push(at.saturating_duration_since(accepted).as_secs_f64() * 1000.0)
            }
            None => missed += 1,
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = request_counts(client, workloads_and_configmaps).await?;
    stop.cancel();
    let busy_patches = match busy_writer {
        Some(t) => Some(t.await?),
        None => None,
    };
    let per_change = |k: &str| {
        (after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0))
            / updates as f64
    };
    // Where in the run the slowest change came (0 = the first change after start).
    let slowest_at = latencies
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i);
    let rekindle = match rk {
        Some(rk) => {
            // The busy writer's own PATCHes are not rekindle's.
            let busy = busy_patches.unwrap_or(0) as f64 / updates as f64;
            let (get, patch) = (
                per_change("GET deployments"),
                per_change("PATCH deployments"),
            );
            let cost = writer_cost(&rk, get, patch - busy).await?;
            rk.stop().await?;
            Some(cost)
        }
        None => None,
    };
    ns.cleanup().await?;
    Ok(Paced {
        latency: summary(latencies),
        who: who.label(),
        rate_per_s: rate,
        round: None,
        missed,
        slowest_at,
        busy_writer_patches: busy_patches,
        rekindle,
    })
}

/// What rekindle's writer spent: the requests per change the caller counted, and what rekindle's own
/// metrics say.
async fn writer_cost(rk: &Rekindle, get: f64, patch: f64) -> Result<WriterCost> {
    let failed_attempts = rk
        .metric("rekindle_errors_total{kind=\"reload_attempt\"}")
        .await?;
    let mut workload_reads = 0.0;
    for reason in ["retry", "kind", "not_indexed"] {
        workload_reads += rk
            .metric(&format!(
                "rekindle_workload_reads_total{{reason=\"{reason}\"}}"
            ))
            .await?;
    }
    // rekindle's own time per change (watch event → dependents queued): share within 1 ms.
    let within_1ms = rk
        .metric("reloader_reconcile_duration_seconds_bucket{le=\"0.001\",result=\"success\"}")
        .await?;
    let handled = rk
        .metric("reloader_reconcile_duration_seconds_count{result=\"success\"}")
        .await?;
    // rekindle's own PATCHes slower than 25 ms to their response headers (client-go buckets).
    let body = rk.metrics().await?;
    let patch_sample = |suffix: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(suffix) && l.contains("verb=\"PATCH\""))
            .filter(|l| !suffix.ends_with("bucket") || l.contains("le=\"0.025\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok(WriterCost {
        get_deployments_per_change: get,
        patch_deployments_per_change: patch,
        failed_attempts,
        workload_reads,
        reconcile_within_1ms: if handled > 0.0 {
            within_1ms / handled
        } else {
            f64::NAN
        },
        reloads: rk.reloads(true).await?,
        patches_over_25ms: patch_sample("rest_client_request_duration_seconds_count")
            - patch_sample("rest_client_request_duration_seconds_bucket"),
    })
}

/// A ConfigMap and a Secret of one Deployment changed 200 ms apart, default configuration: how many
/// template changes (rollouts) each pair gives.
async fn pair(client: &Client, trials: usize) -> Result<Pair> {
    let ns = TestNamespace::new(client, "bench-s8pair").await?;
    let rk = Rekindle::start(client, &[&ns.name], Options::default()).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let ds: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let pp = PostParams::default();
    cms.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"v": "0"}}))?,
    )
    .await?;
    secrets
        .create(
            &pp,
            &serde_json::from_value(
                json!({"metadata": {"name": "sec"}, "stringData": {"v": "0"}}),
            )?,
        )
        .await?;
    ds.create(&pp, &serde_json::from_value(json!({"metadata": {"name": "d", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}}, "template": {"metadata": {"labels": {"app": "d"}},
            "spec": {"containers": [{"name": "app", "image": "busybox",
                "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "sec"}}]}]}}}}))?)
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let generation = |d: Deployment| d.metadata.generation.unwrap_or(0);
    let mut rollouts = Vec::new();
    for t in 0..trials {
        let g0 = generation(ds.get("d").await?);
        let merge = |v: String| Patch::Merge(json!({"data": {"v": v}}));
        cms.patch("cm", &PatchParams::default(), &merge(format!("c{t}")))
            .await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let secret = json!({"stringData": {"v": format!("s{t}")}});
        secrets
            .patch("sec", &PatchParams::default(), &Patch::Merge(&secret))
            .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        rollouts.push(generation(ds.get("d").await?) - g0);
    }
    rk.stop().await?;
    ns.cleanup().await?;
    Ok(Pair {
        trials,
        rollouts_per_pair: rollouts,
    })
}

/// S8: paced latency at 10 and 2 updates/s for the three writers (alternating), the same at 10/s with
/// a busy writer, and the pair.
///
/// The paced runs repeat for REKINDLE_BENCH_S8_ROUNDS rounds (default 3), the writers' order rotated
/// each round so none always runs first on a machine that warms up or gets busier; the report pools
/// each writer's samples over the rounds and gives the median of the per-round ratios too.
pub async fn s8(client: &Client, sizes: &Sizes) -> Result<S8> {
    let rounds = sizes.s8_rounds;
    // Changes per run at 10/s (a fifth of it at 2/s): a p99 of 100 samples is their second largest,
    // as noisy as one sample, so runs are 30 s long.
    let updates = sizes.s8_updates;
    let writers = [Who::Bare, Who::Rekindle(Some("0")), Who::Rekindle(None)];
    let mut runs = Vec::new();
    for (rate, updates) in [(10.0, updates), (2.0, updates.div_ceil(5))] {
        for round in 0..rounds {
            for k in 0..writers.len() {
                let who = writers[(k + round) % writers.len()];
                eprintln!("S8 round {} {} at {rate}/s …", round + 1, who.label());
                let mut run = paced(client, who, rate, updates, false).await?;
                run.round = Some(round + 1);
                runs.push(run);
            }
        }
    }
    let mut busy = Vec::new();
    for who in [Who::Bare, Who::Rekindle(Some("0"))] {
        eprintln!("S8 {} at 10/s with a busy writer …", who.label());
        busy.push(paced(client, who, 10.0, 100, true).await?);
    }
    eprintln!("S8 ConfigMap + Secret 200 ms apart …");
    let pair = pair(client, 10).await?;
    Ok(S8 {
        paced: runs,
        busy,
        pair,
    })
}

async fn wait_for_metric(rk: &Rekindle, series: &str, at_least: f64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while rk.metric(series).await? < at_least {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{series} did not reach {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// RSS once the index holds `want` of a gauge, after rekindle's next heap trim (every 60 s), so the
/// heap the creates' watch events and admission reviews freed is not counted.
async fn rss_at(rk: &Rekindle, gauge: &str, want: usize) -> Result<u64> {
    wait_for_metric(rk, gauge, want as f64).await?;
    tokio::time::sleep(Duration::from_secs(62)).await;
    rk.rss_bytes().context("no RSS")
}

/// S9's used-keys part: `readers` ConfigMaps of [`KEYS`] keys, RSS, then as many `used-keys`
/// Deployments reading one key each, RSS once every ConfigMap is digested. `before`: the resources
/// and workloads already indexed.
async fn key_reader_rss(
    rk: &Rekindle,
    cms: &Api<ConfigMap>,
    ds: &Api<Deployment>,
    before: usize,
    readers: usize,
) -> Result<Vec<(usize, u64)>> {
    let kcms = cms.clone();
    create_many(0..readers, move |i| {
        let cms = kcms.clone();
        Box::pin(async move {
            let data: serde_json::Map<String, serde_json::Value> = (0..KEYS)
                .map(|k| (format!("key-{k}"), json!(format!("{k:032}"))))
                .collect();
            let cm: ConfigMap = serde_json::from_value(
                json!({"metadata": {"name": format!("keyed-{i}")}, "data": data}),
            )?;
            cms.create(&PostParams::default(), &cm).await?;
            Ok(())
        })
    })
    .await?;
    let mut key_readers = vec![(
        0usize,
        rss_at(rk, "rekindle_index_resources", before + readers).await?,
    )];
    let kds = ds.clone();
    create_many(0..readers, move |i| {
        let ds = kds.clone();
        Box::pin(async move {
            let name = format!("reader-{i}");
            let d: Deployment = serde_json::from_value(json!({"metadata": {"name": name,
                    "annotations": {"reloader.stakater.com/auto": "true", "rekindle.io/reload-on": "used-keys"}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "app", "image": "busybox",
                        "env": [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": format!("keyed-{i}"), "key": "key-0"}}}]}]}}}}))?;
            ds.create(&PostParams::default(), &d).await?;
            Ok(())
        })
    })
    .await?;
    wait_for_metric(rk, "rekindle_index_key_digests", readers as f64).await?;
    key_readers.push((
        readers,
        rss_at(rk, "rekindle_index_workloads", before + readers).await?,
    ));
    Ok(key_readers)
}

/// Keys of each ConfigMap S9 digests.
const KEYS: usize = 10;

/// S9: index memory. ConfigMaps 0 → `step` → 2·`step` with no workloads, then Deployments
/// (replicas 0, each using one of 1,000 ConfigMaps) 0 → `step` → 2·`step`; RSS at each step. Then
/// `step` ConfigMaps of [`KEYS`] keys and as many `used-keys` Deployments reading one key each.
pub async fn s9(client: &Client, step: usize) -> Result<S9> {
    let ns = TestNamespace::new(client, "bench-s9").await?;
    let rk = Rekindle::start(client, &[&ns.name], Options::default()).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let ds: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let gauge_res = "rekindle_index_resources";
    let gauge_wl = "rekindle_index_workloads";
    let mut resources = vec![(0usize, rss_at(&rk, gauge_res, 0).await?)];
    for k in 1..=2 {
        let cms = cms.clone();
        create_many((k - 1) * step..k * step, move |i| {
            let cms = cms.clone();
            Box::pin(async move {
                let cm: ConfigMap = serde_json::from_value(
                    json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "x"}}),
                )?;
                cms.create(&PostParams::default(), &cm).await?;
                Ok(())
            })
        })
        .await?;
        resources.push((k * step, rss_at(&rk, gauge_res, k * step).await?));
    }
    let mut workloads = vec![(0usize, rk.rss_bytes().context("no RSS")?)];
    for k in 1..=2 {
        let ds = ds.clone();
        create_many((k - 1) * step..k * step, move |i| {
            let ds = ds.clone();
            Box::pin(async move {
                let name = format!("d-{i}");
                let d: Deployment = serde_json::from_value(json!({"metadata": {"name": name,
                        "annotations": {"reloader.stakater.com/auto": "true"}},
                    "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "app", "image": "busybox",
                            "envFrom": [{"configMapRef": {"name": format!("cm-{}", i % 1000)}}]}]}}}}))?;
                ds.create(&PostParams::default(), &d).await?;
                Ok(())
            })
        })
        .await?;
        workloads.push((k * step, rss_at(&rk, gauge_wl, k * step).await?));
    }
    // Used keys: ConfigMaps of KEYS keys each (digests not kept: nobody reads them key by key),
    // then one used-keys Deployment per ConfigMap reading one key, so each of them is digested. A
    // binary without used keys (a comparison run through REKINDLE_BIN) skips this part.
    let mut key_readers = Vec::new();
    if rk.metrics().await?.contains("rekindle_index_key_digests") {
        key_readers = key_reader_rss(&rk, &cms, &ds, 2 * step, step).await?;
    }
    rk.stop().await?;
    ns.cleanup().await?;
    let per = |v: &[(usize, u64)]| {
        let (n0, r0) = v[0];
        let (n2, r2) = v[v.len() - 1];
        (r2 as f64 - r0 as f64) / (n2 - n0) as f64
    };
    let bytes_per_key_reader = if key_readers.len() == 2 {
        per(&key_readers)
    } else {
        f64::NAN
    };
    Ok(S9 {
        bytes_per_key: (bytes_per_key_reader - per(&workloads)) / KEYS as f64,
        bytes_per_key_reader,
        key_readers,
        bytes_per_resource: per(&resources),
        bytes_per_workload: per(&workloads),
        bytes_per_workload_second_step: (workloads[2].1 as f64 - workloads[1].1 as f64)
            / step as f64,
        resources,
        workloads,
    })
}

pub fn markdown(s8: Option<&S8>, s9: Option<&S9>, s3: &[S3]) -> String {
    let Some(s8) = s8 else {
        return s9.map(s9_markdown).unwrap_or_default();
    };
    let mut md = String::from("\n## S8 the writer: paced changes, 20 ConfigMaps ↔ 20 Deployments\n\nChange accepted → new template in a watch; the bare client PATCHes the template itself (the limit). Runs alternate writers at each rate, in rounds (the writers' order rotated each round); each row's ratios are to the bare client of its round. Requests per change are `apiserver_request_total` deltas for Deployments (GET, and PATCH less the busy writer's); failed attempts and reads are rekindle's own `rekindle_errors_total{kind=\"reload_attempt\"}` and `rekindle_workload_reads_total`.\n\n| writer | rate /s | n | missed | p50 ms | p99 ms | p50 / bare | p99 / bare | GET/change | PATCH/change | failed attempts | reads | changes handled ≤ 1 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    md += &rows(&s8.paced);
    md += &rows(&s8.busy);
    md += &pooled_markdown(&s8.paced);
    md += &format!(
        "\nA ConfigMap and a Secret of one Deployment changed 200 ms apart, default configuration, {} times: template changes per pair {:?}.\n",
        s8.pair.trials, s8.pair.rollouts_per_pair
    );
    if !s3.is_empty() {
        md += "\n## S3 apiserver cost of one change among many (one namespace)\n\n| Deployments | latency ms | apiserver CPU s in the window | apiserver response bytes in the window | GET deployments | LIST deployments |\n|---|---|---|---|---|---|\n";
        for r in s3 {
            md += &format!(
                "| {} | {:.1} | {:.3} | {:.0} | {} | {} |\n",
                r.workloads,
                r.latency_ms,
                r.apiserver_cpu_s,
                r.apiserver_response_bytes,
                r.requests("GET deployments"),
                r.requests("LIST deployments")
            );
        }
    }
    md + &s9.map(s9_markdown).unwrap_or_default()
}

/// A run's rate (as its key) and round.
type RateRound = (String, Option<usize>);

/// A run's rate as a key: the rates are whole or decimal numbers per second.
fn rate_key(run: &Paced) -> String {
    run.rate_per_s.to_string()
}

/// One row per run, its ratios to the bare client of the same rate and round.
fn rows(runs: &[Paced]) -> String {
    let bare: BTreeMap<RateRound, (f64, f64)> = runs
        .iter()
        .filter(|r| r.who == Who::Bare.label())
        .map(|r| ((rate_key(r), r.round), (r.latency.p50_ms, r.latency.p99_ms)))
        .collect();
    let mut md = String::new();
    for r in runs {
        let (b50, b99) = bare
            .get(&(rate_key(r), r.round))
            .copied()
            .unwrap_or((f64::NAN, f64::NAN));
        let cost = r.rekindle.as_ref();
        let cell = |value: fn(&WriterCost) -> f64| {
            cost.map_or("—".into(), |c| format!("{:.2}", value(c)))
        };
        let which = match (r.round, r.busy_writer_patches) {
            (_, Some(patches)) => format!(", busy writer ({patches} patches)"),
            (Some(round), None) => format!(", round {round}"),
            (None, None) => String::new(),
        };
        md += &format!(
            "| {}{which} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {} | {} |\n",
            r.who,
            rate_key(r),
            r.latency.n,
            r.missed,
            r.latency.p50_ms,
            r.latency.p99_ms,
            r.latency.p50_ms / b50,
            r.latency.p99_ms / b99,
            cell(|c| c.get_deployments_per_change),
            cell(|c| c.patch_deployments_per_change),
            cell(|c| c.failed_attempts),
            cell(|c| c.workload_reads),
            cell(|c| c.reconcile_within_1ms),
        );
    }
    md
}
/// Each writer's samples pooled over the rounds, against the bare client's pooled samples, and the
/// median over rounds of the ratio within a round.
fn pooled_markdown(runs: &[Paced]) -> String {
    let mut pooled: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    // (rate, round) → writer → (p50, p99)
    let mut per_round: BTreeMap<RateRound, BTreeMap<String, (f64, f64)>> = BTreeMap::new();
    for r in runs {
        let (who, rate) = (r.who.to_string(), rate_key(r));
        pooled
            .entry((rate.clone(), who.clone()))
            .or_default()
            .extend(&r.latency.samples_ms);
        per_round
            .entry((rate, r.round))
            .or_default()
            .insert(who, (r.latency.p50_ms, r.latency.p99_ms));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        percentile(&v, 50.0)
    };
    let mut md = String::from("\n### S8 pooled over rounds\n\n| writer | rate /s | rounds | n | p50 ms | p99 ms | p50 / bare | p99 / bare | median of round p50 ratios | median of round p99 ratios |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for ((rate, who), mut samples) in pooled.clone() {
        samples.sort_by(|a, b| a.total_cmp(b));
        let mut bare = pooled
            .get(&(rate.clone(), Who::Bare.label().to_string()))
            .cloned()
            .unwrap_or_default();
        bare.sort_by(|a, b| a.total_cmp(b));
        let ratios: Vec<(f64, f64)> = per_round
            .iter()
            .filter(|((r, _), _)| *r == rate)
            .filter_map(|(_, writers)| {
                let (b50, b99) = writers.get(Who::Bare.label())?;
                let (w50, w99) = writers.get(&who)?;
                Some((w50 / b50, w99 / b99))
            })
            .collect();
        md += &format!(
            "| {who} | {rate} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            ratios.len(),
            samples.len(),
            percentile(&samples, 50.0),
            percentile(&samples, 99.0),
            percentile(&samples, 50.0) / percentile(&bare, 50.0),
            percentile(&samples, 99.0) / percentile(&bare, 99.0),
            median(ratios.iter().map(|r| r.0).collect()),
            median(ratios.iter().map(|r| r.1).collect()),
        );
    }
    // How much the limit itself moves from round to round: the noise a ratio of one round carries.
    for (rate, bare) in per_round
        .iter()
        .filter_map(|((rate, _), w)| Some((rate.clone(), w.get(Who::Bare.label())?.1)))
        .fold(BTreeMap::<String, Vec<f64>>::new(), |mut m, (rate, p99)| {
            m.entry(rate).or_default().push(p99);
            m
        })
    {
        let max = bare.iter().copied().fold(f64::MIN, f64::max);
        let min = bare.iter().copied().fold(f64::MAX, f64::min);
        let each: Vec<String> = bare.iter().map(|v| format!("{v:.1}")).collect();
        md += &format!(
            "\nThe bare client's own p99 at {rate}/s, round by round: {} ms (largest / smallest {:.2}).\n",
            each.join(", "),
            max / min
        );
    }
    md
}

fn s9_markdown(s9: &S9) -> String {
    let steps = |v: &[(usize, u64)]| {
        v.iter()
            .map(|(n, rss)| format!("{n} → {:.1} MiB", mib(*rss)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut md = format!("\n## S9 index memory\n\nRSS of rekindle (release build) as ConfigMaps grow with no workloads ({}), then as Deployments grow at 2× that many ConfigMaps ({}). **{:.0} bytes per ConfigMap, {:.0} bytes per Deployment** (second step alone: {:.0}).\n",
        steps(&s9.resources), steps(&s9.workloads), s9.bytes_per_resource, s9.bytes_per_workload, s9.bytes_per_workload_second_step);
    if !s9.key_readers.is_empty() {
        md += &format!("\nUsed keys: ConfigMaps of {KEYS} keys added (nobody reads them key by key, so no digests are kept), then one `used-keys` Deployment per ConfigMap reading one of its keys, which makes the index keep that ConfigMap's {KEYS} value digests ({}). **{:.0} bytes per such Deployment**, its ConfigMap's digests included; less a Deployment's {:.0} bytes above, **{:.0} bytes per key digested** (the reader's skeleton differs a little from an `envFrom` one).\n",
            steps(&s9.key_readers), s9.bytes_per_key_reader, s9.bytes_per_workload, s9.bytes_per_key);
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Latency;

    fn run(who: Who, round: usize, p50: f64, p99: f64) -> Paced {
        Paced {
            latency: Latency {
                n: 3,
                p50_ms: p50,
                p95_ms: p99,
                p99_ms: p99,
                samples_ms: vec![p50, p50, p99],
            },
            who: who.label(),
            rate_per_s: 10.0,
            round: Some(round),
            missed: 0,
            slowest_at: Some(2),
            busy_writer_patches: None,
            rekindle: matches!(who, Who::Rekindle(_)).then_some(WriterCost {
                get_deployments_per_change: 0.0,
                patch_deployments_per_change: 1.0,
                failed_attempts: 0.0,
                workload_reads: 0.0,
                reconcile_within_1ms: 1.0,
                reloads: 3.0,
                patches_over_25ms: 0.0,
            }),
        }
    }

    /// Each run's ratios are to the bare client of its own round; the bare client has no writer cost.
    #[test]
    fn ratios_are_to_the_bare_client_of_the_same_round() {
        let runs = [
            run(Who::Bare, 1, 10.0, 20.0),
            run(Who::Rekindle(Some("0")), 1, 20.0, 30.0),
            run(Who::Bare, 2, 40.0, 40.0),
            run(Who::Rekindle(Some("0")), 2, 20.0, 20.0),
        ];
        let md = rows(&runs);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 4, "{md}");
        assert!(
            lines[0].starts_with(
                "| bare client, round 1 | 10 | 3 | 0 | 10.0 | 20.0 | 1.00 | 1.00 | — | — |"
            ),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("| rekindle, debounce 0, round 1 | 10 | 3 | 0 | 20.0 | 30.0 | 2.00 | 1.50 | 0.00 | 1.00 |"),
            "{}",
            lines[1]
        );
        assert!(lines[3].contains("| 0.50 | 0.50 |"), "{}", lines[3]);
        // Pooled: rekindle's samples over both rounds against the bare client's, and the median of the
        // per-round ratios (2.0 and 0.5).
        let pooled = pooled_markdown(&runs);
        assert!(
            pooled.contains("| rekindle, debounce 0 | 10 | 2 | 6 | 20.0 | 30.0 | 0.50 | 0.75 |"),
            "{pooled}"
        );
    }
}
