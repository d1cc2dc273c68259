//! The chaos soak: rekindle installed by helm on the real node with two replicas, 52 workloads of every
//! built-in kind using 8 ConfigMaps and 8 Secrets that keep changing, while a fault injector deletes the
//! leader pod, SIGKILLs and SIGSTOPs replicas, cuts a replica off from the apiserver (its packets
//! dropped inside its network namespace), restarts the apiserver and etcd, and evicts pods.
//!
//! A ledger proves the outcome: every change made, every state of every workload seen by a watch
//! (generation, Job UIDs, markers), and the apiserver's audit log of rekindle's writes (each tagged with
//! the replica's user agent). It asserts every change reloaded (each workload ends on its resources'
//! current hashes), none twice (no two rollouts of a workload carry the same hashes, and no more rollouts
//! than changes), and no write by a replica that was not leading. `REKINDLE_CHAOS_MINUTES` (default 3)
//! sets the length; `REKINDLE_CHAOS_REPORT=DIR` writes chaos.md, chaos.json and chaos.png there
//! (`just chaos`: 30 minutes into bench/results).
//!
//! Runs inside the node's network namespace as root (`node.sh exec`): it signals the replicas' processes
//! and enters their network namespaces.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use e2e::node::{
    client, diagnose, fresh_start, helm, ready_pods, run, wait_rolled_out, RELEASE_NS,
    WORKLOAD_IMAGE,
};
use e2e::{apply_value, root, wait_for, TestNamespace};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DynamicObject, EvictParams, Patch, PatchParams};
use kube::core::Status;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use rekindle::core::envname::env_var_name;
use rekindle::core::hash::{configmap_hash_typed, secret_hash_typed};
use rekindle::core::patch::{config_hash_key, config_hashes, first_env_value, Place};
use rekindle::core::{ResourceKind, WorkloadKind};
use rekindle::reload::error::WriteError;
use serde_json::{json, Value};
use tokio::time::Instant;

const RESOURCES: usize = 8;
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
/// A workload's kind, how many, and whether its pods run (the others have no pods to roll, or are
/// suspended, so the node's two cores are spent on rekindle and the control plane).
const WORKLOADS: [(WorkloadKind, usize); 5] = [
    (WorkloadKind::Deployment, 20),
    (WorkloadKind::StatefulSet, 10),
    (WorkloadKind::DaemonSet, 4),
    (WorkloadKind::CronJob, 8),
    (WorkloadKind::Job, 10),
];

/// A ConfigMap or Secret of the soak.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Res {
    kind: ResourceKind,
    name: String,
}

#[derive(Clone, Debug)]
struct Workload {
    kind: WorkloadKind,
    name: String,
    uses: [Res; 2],
}

impl Workload {
    fn key(&self) -> String {
        format!("{}/{}", self.kind.name(), self.name)
    }
}

/// What the soak's clock (seconds since the start) saw.
#[derive(Clone, Debug, serde::Serialize)]
struct Change {
    at: f64,
    #[serde(skip)]
    kind: ResourceKind,
    name: String,
    hash: String,
}

#[derive(Clone, Debug)]
struct Seen {
    at: f64,
    /// `Kind/name` of the workload this state belongs to (a CronJob's Jobs belong to the CronJob).
    workload: String,
    generation: i64,
    uid: String,
    markers: BTreeMap<String, String>,
    /// A Job a CronJob reload created (its own markers; the CronJob's are in its metadata).
    cronjob_job: bool,
}

#[derive(Clone, Debug, serde::Serialize)]
struct Fault {
    at: f64,
    until: f64,
    what: String,
    /// The replica it hit, when it hit one.
    replica: Option<String>,
}

struct Ledger {
    /// When the soak starts, for its schedule (monotonic).
    start: Instant,
    /// The same moment on the wall clock, which every timestamp of the ledger is measured from.
    started_at: jiff::Timestamp,
    changes: Mutex<Vec<Change>>,
    seen: Mutex<Vec<Seen>>,
    faults: Mutex<Vec<Fault>>,
}

impl Ledger {
    /// Seconds since the start on the wall clock; negative before it (the workloads' first
    /// states). The wall clock, not the monotonic one: the apiserver's audit log, whose writes are
    /// judged against the faults and Lease writes recorded here, is on it, and the two clocks drift
    /// apart by seconds over a long soak on a virtual machine.
    fn now(&self) -> f64 {
        jiff::Timestamp::now()
            .duration_since(self.started_at)
            .as_secs_f64()
    }
}

fn res_env(r: &Res) -> String {
    env_var_name(&r.name, r.kind)
}

/// The markers of an object, by resource env-var name: the template's env vars, or for a CronJob the
/// hashes recorded in its metadata (a CronJob reload starts a Job; its spec keeps its markers).
fn markers(obj: &Value, kind: WorkloadKind, uses: &[Res]) -> BTreeMap<String, String> {
    let recorded =
        (kind == WorkloadKind::CronJob).then(|| config_hashes(obj, kind, Place::Metadata));
    uses.iter()
        .filter_map(|r| {
            let value = match &recorded {
                Some(map) => map.get(&config_hash_key(r.kind, &r.name)).cloned(),
                None => first_env_value(obj, kind, &res_env(r)).map(str::to_string),
            }?;
            Some((res_env(r), value))
        })
        .collect()
}

fn pod_template(uses: &[Res; 2]) -> Value {
    json!({"spec": {
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": WORKLOAD_IMAGE, "envFrom": [
            {"configMapRef": {"name": uses[0].name}}, {"secretRef": {"name": uses[1].name}}]}]}})
}

fn manifest(w: &Workload) -> Value {
    let meta = json!({"name": w.name, "annotations": {"reloader.stakater.com/auto": "true"}});
    let labels = json!({"app": w.name});
    let mut template = pod_template(&w.uses);
    template["metadata"] = json!({"labels": labels});
    let always = |mut t: Value| {
        t["spec"]["restartPolicy"] = json!("Always");
        t
    };
    match w.kind {
        WorkloadKind::Deployment => {
            // Four run a pod, so rollouts replace real containers; the others only record rollouts.
            let replicas = if w.name.ends_with("-0") || w.name.ends_with("-1") {
                1
            } else {
                0
            };
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
                "replicas": replicas, "selector": {"matchLabels": labels}, "template": always(template)}})
        }
        WorkloadKind::StatefulSet => json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": meta, "spec": {"replicas": 0, "serviceName": w.name,
            "selector": {"matchLabels": labels}, "template": always(template)}}),
        WorkloadKind::DaemonSet => json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": meta, "spec": {"selector": {"matchLabels": labels}, "template": always(template)}}),
        // Not suspended (a suspended CronJob is not reloaded), scheduled once a year; its Jobs are.
        WorkloadKind::CronJob => {
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta,
            "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {
                "suspend": true, "template": template}}}})
        }
        _ => json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"suspend": true, "template": template}}),
    }
}

fn workloads() -> Vec<Workload> {
    let mut out = Vec::new();
    let mut i = 0;
    for (kind, count) in WORKLOADS {
        for n in 0..count {
            let cm = Res {
                kind: ResourceKind::ConfigMap,
                name: format!("cm-{}", i % RESOURCES),
            };
            let secret = Res {
                kind: ResourceKind::Secret,
                name: format!("secret-{}", (i * 3 + 1) % RESOURCES),
            };
            out.push(Workload {
                kind,
                name: format!("{}-{n}", kind.name().to_lowercase()),
                uses: [cm, secret],
            });
            i += 1;
        }
    }
    out
}

/// A small deterministic generator (xorshift), seeded by `REKINDLE_CHAOS_SEED` or the clock; the seed
/// is printed so a run can be repeated.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn between(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(lo + (hi - lo) * (self.next() % 10_000) as f64 / 10_000.0)
    }
}

/// Writes one resource with `value` (creating it the first time, by server-side apply), retrying
/// until the apiserver takes it; its new hash.
async fn write(client: &Client, ns: &str, r: &Res, value: &str) -> String {
    use base64::Engine as _;
    let params = PatchParams::apply("rekindle-chaos").force();
    loop {
        let result = match r.kind {
            ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), ns)
                .patch(
                    &r.name,
                    &params,
                    &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": r.name}, "data": {"value": value}})),
                )
                .await
                .map(|cm| configmap_hash_typed(&cm)),
            _ => Api::<Secret>::namespaced(client.clone(), ns)
                .patch(
                    &r.name,
                    &params,
                    &Patch::Apply(json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": r.name},
                        "data": {"value": base64::engine::general_purpose::STANDARD.encode(value)}})),
                )
                .await
                .map(|s| secret_hash_typed(&s)),
        };
        match result {
            Ok(hash) => return hash,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Records every state of every workload of the soak's namespace (a CronJob's Jobs under the CronJob).
fn watch_workloads(
    client: &Client,
    ns: &str,
    all: &[Workload],
    ledger: &Arc<Ledger>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let by_key: Arc<BTreeMap<String, Workload>> =
        Arc::new(all.iter().map(|w| (w.key(), w.clone())).collect());
    WORKLOADS
        .into_iter()
        .map(|(kind, _)| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), ns, &kind.api_resource());
            let (ledger, by_key) = (ledger.clone(), by_key.clone());
            tokio::spawn(async move {
                let mut events = watcher(api, watcher::Config::default()).boxed();
                while let Some(event) = events.next().await {
                    let Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) = event
                    else {
                        continue;
                    };
                    let owner = obj
                        .owner_references()
                        .iter()
                        .find(|o| o.kind == "CronJob")
                        .map(|o| format!("CronJob/{}", o.name));
                    let workload = owner
                        .clone()
                        .unwrap_or_else(|| format!("{}/{}", kind.name(), obj.name_any()));
                    let Some(w) = by_key.get(&workload) else {
                        continue;
                    };
                    let Ok(value) = serde_json::to_value(&obj) else {
                        continue;
                    };
                    let cronjob_job = owner.is_some();
                    let marker_kind = if cronjob_job { WorkloadKind::Job } else { kind };
                    ledger.seen.lock().unwrap().push(Seen {
                        at: ledger.now(),
                        workload,
                        generation: obj.metadata.generation.unwrap_or(0),
                        uid: obj.uid().unwrap_or_default(),
                        markers: markers(&value, marker_kind, &w.uses),
                        cronjob_job,
                    });
                }
            })
        })
        .collect()
}

/// Each workload's markers as they are now: the object itself, a Job's current incarnation (not one
/// being deleted), a CronJob's recorded hashes.
async fn end_states(
    client: &Client,
    ns: &str,
    all: &[Workload],
) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    let mut out = BTreeMap::new();
    for (kind, _) in WORKLOADS {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &kind.api_resource());
        for obj in api.list(&Default::default()).await? {
            if obj.metadata.deletion_timestamp.is_some() || !obj.owner_references().is_empty() {
                continue;
            }
            let key = format!("{}/{}", kind.name(), obj.name_any());
            let Some(w) = all.iter().find(|w| w.key() == key) else {
                continue;
            };
            out.insert(key, markers(&serde_json::to_value(&obj)?, kind, &w.uses));
        }
    }
    Ok(out)
}

/// The replicas' pods (not terminating), by name.
async fn replicas(client: &Client) -> Result<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/instance=rekindle"))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

async fn holder(client: &Client) -> Option<String> {
    let leases = Api::<Lease>::namespaced(client.clone(), RELEASE_NS);
    let list = leases.list(&Default::default()).await.ok()?;
    list.items.into_iter().find_map(|l| l.spec?.holder_identity)
}

/// The host pid of the rekindle process of pod `pod` (its POD_NAME in the environment).
fn replica_pid(pod: &str) -> Option<u32> {
    let want = format!("POD_NAME={pod}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        if comm.trim() != "rekindle" {
            return None;
        }
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        environ
            .split(|b| *b == 0)
            .any(|v| v == want.as_bytes())
            .then_some(pid)
    })
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    run("kill", &[&format!("-{sig}"), &pid.to_string()]).map(|_| ())
}

/// Drops every packet between the process's network namespace and the apiserver (its Service address
/// and the node's), both ways, or (`on` false) removes those rules.
fn partition(pid: u32, on: bool) -> Result<()> {
    let op = if on { "-I" } else { "-D" };
    let pid = pid.to_string();
    for (chain, dir) in [("OUTPUT", "-d"), ("INPUT", "-s")] {
        for addr in ["10.0.0.1", "10.200.0.1"] {
            run(
                "nsenter",
                &[
                    "-t", &pid, "-n", "iptables", op, chain, dir, addr, "-p", "tcp", "-j", "DROP",
                ],
            )?;
        }
    }
    Ok(())
}

/// One fault, chosen at random, run to its end; what it was.
async fn inject(client: &Client, rng: &mut Rng, ledger: &Ledger) -> Result<()> {
    let pods = replicas(client).await?;
    let leader = holder(client).await;
    let pick = |rng: &mut Rng| -> Option<String> {
        (!pods.is_empty()).then(|| pods[rng.below(pods.len())].name_any())
    };
    let at = ledger.now();
    let (what, replica) = match rng.below(7) {
        0 => {
            let Some(leader) = leader.filter(|l| pods.iter().any(|p| p.name_any() == *l)) else {
                return Ok(());
            };
            Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
                .delete(&leader, &Default::default())
                .await?;
            ("leader pod deleted".to_string(), Some(leader))
        }
        1 => {
            let Some(pod) = pick(rng) else { return Ok(()) };
            let Some(pid) = replica_pid(&pod) else {
                return Ok(());
            };
            signal(pid, "KILL")?;
            ("replica SIGKILLed".to_string(), Some(pod))
        }
        2 => {
            let Some(pod) = pick(rng) else { return Ok(()) };
            let Some(pid) = replica_pid(&pod) else {
                return Ok(());
            };
            let pause = rng.between(3.0, 12.0);
            signal(pid, "STOP")?;
            tokio::time::sleep(pause).await;
            let _ = signal(pid, "CONT");
            (
                format!("replica SIGSTOPped {:.0} s", pause.as_secs_f64()),
                Some(pod),
            )
        }
        3 => {
            let Some(pod) = pick(rng) else { return Ok(()) };
            let Some(pid) = replica_pid(&pod) else {
                return Ok(());
            };
            let cut = rng.between(4.0, 15.0);
            partition(pid, true)?;
            tokio::time::sleep(cut).await;
            partition(pid, false)?;
            (
                format!(
                    "replica cut off from the apiserver {:.0} s",
                    cut.as_secs_f64()
                ),
                Some(pod),
            )
        }
        4 => {
            run("e2e/scripts/node.sh", &["restart", "kube-apiserver", "2"])?;
            ("apiserver restarted".to_string(), None)
        }
        5 => {
            run("e2e/scripts/node.sh", &["restart", "etcd", "2"])?;
            ("etcd restarted".to_string(), None)
        }
        _ => {
            let Some(pod) = pick(rng) else { return Ok(()) };
            // A PodDisruptionBudget may refuse it: that is the budget working, not a failure.
            let evicted = Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
                .evict(&pod, &EvictParams::default())
                .await
                .is_ok();
            (
                format!(
                    "replica evicted{}",
                    if evicted { "" } else { " (refused by the PDB)" }
                ),
                Some(pod),
            )
        }
    };
    println!(
        "[{at:>7.1} s] {what}{}",
        replica
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    ledger.faults.lock().unwrap().push(Fault {
        at,
        until: ledger.now(),
        what,
        replica,
    });
    Ok(())
}

/// One write of rekindle's as the audit log recorded it.
#[derive(Debug)]
struct Write {
    replica: String,
    received: f64,
    committed: f64,
    verb: String,
    resource: String,
    name: String,
    code: u16,
    /// Refused as stale: 409, or 422 from a failed JSON-patch `test`.
    stale: bool,
}

/// rekindle's writes since the soak started, from the node apiserver's audit log, on the soak's clock.
fn audited_writes(ledger: &Ledger, ns: &str) -> Result<Vec<Write>> {
    let text = std::fs::read_to_string(root().join("target/e2e-node/logs/audit.log"))
        .context("reading the audit log")?;
    let on_clock = |t: Option<&str>| -> Option<f64> {
        let t: jiff::Timestamp = t?.parse().ok()?;
        Some(t.duration_since(ledger.started_at).as_secs_f64())
    };
    let mut writes = Vec::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if e["stage"] != "ResponseComplete" {
            continue;
        }
        let agent = e["userAgent"].as_str().unwrap_or_default();
        let Some(replica) = agent
            .strip_prefix("rekindle/")
            .and_then(|a| a.split_once(" ("))
            .map(|(_, r)| r.trim_end_matches(')').to_string())
        else {
            continue;
        };
        let object = &e["objectRef"];
        let resource = object["resource"].as_str().unwrap_or_default().to_string();
        let in_scope = resource == "leases" || object["namespace"] == ns;
        let (Some(received), Some(committed)) = (
            on_clock(e["requestReceivedTimestamp"].as_str()),
            on_clock(e["stageTimestamp"].as_str()),
        ) else {
            continue;
        };
        // Lease writes from before the start too: who led when the soak began.
        if !in_scope || (received < 0.0 && resource != "leases") || resource == "events" {
            continue;
        }
        writes.push(Write {
            replica,
            received,
            committed,
            verb: e["verb"].as_str().unwrap_or_default().to_string(),
            resource,
            name: object["name"].as_str().unwrap_or_default().to_string(),
            code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            // Refused as stale: what the writer itself counts as a conflict (a 409, or a JSON
            // patch whose guard no longer holds).
            stale: serde_json::from_value::<Status>(e["responseStatus"].clone())
                .is_ok_and(|s| matches!(WriteError::from_status("", &s), WriteError::Conflict(_))),
        });
    }
    writes.sort_by(|a, b| a.committed.total_cmp(&b.committed));
    Ok(writes)
}

#[derive(Default, serde::Serialize)]
struct Verdict {
    changes: usize,
    workloads: usize,
    faults: usize,
    /// Workloads not on their resources' current hashes at the end.
    lost: Vec<String>,
    /// Rollouts (or Jobs) carrying hashes an earlier one of the same workload carried, or more
    /// rollouts than changes.
    doubled: Vec<String>,
    /// Successful workload writes that arrived while the last committed Lease write was another
    /// replica's (or a release): two writers.
    non_leader_writes: Vec<String>,
    /// Writes by the replica holding the Lease that arrived more than its renew deadline after its last
    /// Lease write arrived, with no other replica leading yet: sent just before its deadline and slow
    /// to arrive, or late. Reported, not failed: nobody else was writing.
    after_own_deadline: Vec<String>,
    /// Such writes that landed right after their replica's partition healed: sent before it, held in
    /// the network (the one write a leader cut off may still land).
    in_flight_at_partition: Vec<String>,
    /// Creates of a Job its replica had deleted while leading, with no other write of it in between:
    /// a re-create finished after the lease ran out. Reported, not failed: no other replica knows the
    /// Job is owed, and with its name fixed it cannot be created twice.
    recreates_finished: Vec<String>,
    /// Workload writes the apiserver refused as stale: 409, planned from a version the object had
    /// moved past, or 422 from a failed `test` of the markers a retry replaces (another writer in
    /// between, or a write held back by the network).
    refused_as_stale: usize,
    rollouts: usize,
    workload_writes: usize,
    /// Seconds from a change to the first state of each dependent carrying it (or a later hash of the
    /// same resource, when changes coalesced).
    latencies: Vec<(f64, f64)>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn judge(
    ledger: &Ledger,
    all: &[Workload],
    current: &BTreeMap<Res, String>,
    ends: &BTreeMap<String, BTreeMap<String, String>>,
    writes: &[Write],
) -> Verdict {
    let changes = ledger.changes.lock().unwrap().clone();
    let seen = ledger.seen.lock().unwrap().clone();
    let faults = ledger.faults.lock().unwrap().clone();
    let mut v = Verdict {
        changes: changes.len(),
        workloads: all.len(),
        faults: faults.len(),
        ..Default::default()
    };
    for w in all {
        let key = w.key();
        let states: Vec<&Seen> = seen.iter().filter(|s| s.workload == key).collect();
        let changed: Vec<&Change> = changes
            .iter()
            .filter(|c| w.uses.iter().any(|r| r.name == c.name && r.kind == c.kind))
            .collect();
        let want: BTreeMap<String, String> = w
            .uses
            .iter()
            .filter(|r| changed.iter().any(|c| c.name == r.name))
            .map(|r| (res_env(r), current[r].clone()))
            .collect();
        // Rollouts: generations of the object itself, or Jobs (UIDs) of a Job or a CronJob.
        let baseline = states.iter().find(|s| !s.cronjob_job && s.at < 0.0);
        let rollouts: Vec<&Seen> = match w.kind {
            WorkloadKind::Job => {
                let mut by_uid: BTreeMap<&str, &Seen> = BTreeMap::new();
                for s in &states {
                    by_uid.entry(&s.uid).or_insert(s);
                }
                by_uid
                    .into_values()
                    .filter(|s| Some(s.uid.as_str()) != baseline.map(|b| b.uid.as_str()))
                    .collect()
            }
            WorkloadKind::CronJob => {
                let mut by_uid: BTreeMap<&str, &Seen> = BTreeMap::new();
                for s in states.iter().filter(|s| s.cronjob_job) {
                    by_uid.entry(&s.uid).or_insert(s);
                }
                by_uid.into_values().collect()
            }
            _ => {
                let mut by_generation: BTreeMap<i64, &Seen> = BTreeMap::new();
                for s in &states {
                    by_generation.entry(s.generation).or_insert(s);
                }
                let base = baseline.map(|b| b.generation).unwrap_or(1);
                by_generation
                    .into_values()
                    .filter(|s| s.generation > base)
                    .collect()
            }
        };
        v.rollouts += rollouts.len();
        let mut carried: BTreeSet<&BTreeMap<String, String>> = BTreeSet::new();
        if let Some(b) = baseline.filter(|_| w.kind != WorkloadKind::CronJob) {
            carried.insert(&b.markers);
        }
        for r in &rollouts {
            if !carried.insert(&r.markers) {
                v.doubled
                    .push(format!("{key}: a second rollout with {:?}", r.markers));
            }
        }
        if rollouts.len() > changed.len() {
            v.doubled.push(format!(
                "{key}: {} rollouts for {} changes",
                rollouts.len(),
                changed.len()
            ));
        }
        // The end state: the object (a CronJob's recorded hashes, the current Job) on the current hashes.
        let ends_on = ends.get(&key).map(|m| {
            m.iter()
                .filter(|(k, _)| want.contains_key(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<BTreeMap<_, _>>()
        });
        if !want.is_empty() && ends_on.as_ref() != Some(&want) {
            v.lost
                .push(format!("{key}: ends on {ends_on:?}, current {want:?}"));
        }
        // Latency: each change to the first state carrying it or a later hash of the same resource.
        for r in &w.uses {
            let of_r: Vec<&&Change> = changed.iter().filter(|c| c.name == r.name).collect();
            let env = res_env(r);
            let mut next = 0;
            for s in states
                .iter()
                .filter(|s| s.at >= 0.0 && (w.kind != WorkloadKind::CronJob || !s.cronjob_job))
            {
                let Some(value) = s.markers.get(&env) else {
                    continue;
                };
                let Some(k) = of_r.iter().position(|c| c.hash == *value) else {
                    continue;
                };
                while next <= k {
                    v.latencies.push((of_r[next].at, s.at - of_r[next].at));
                    next += 1;
                }
            }
        }
    }
    // Writes: each successful workload write must arrive while its replica is the one whose Lease write
    // was committed last, before that replica's renew deadline (counted from when that Lease write
    // arrived, which is after the replica started it) ran out. A write sent by the leader and committed
    // after a takeover is in flight, and allowed.
    let leases: Vec<(f64, Option<&str>, f64)> = writes
        .iter()
        .filter(|w| w.resource == "leases" && w.code < 300)
        .map(|w| {
            (
                w.committed,
                (w.verb != "delete").then_some(w.replica.as_str()),
                w.received,
            )
        })
        .collect();
    let renew = RENEW_DEADLINE.as_secs_f64() + 0.25;
    v.refused_as_stale = writes
        .iter()
        .filter(|w| w.resource != "leases" && w.stale)
        .count();
    // Per object, the last successful write: by whom, what, and whether its replica was leading.
    let mut last: BTreeMap<(&str, &str), (&str, &str, bool)> = BTreeMap::new();
    for w in writes
        .iter()
        .filter(|w| w.resource != "leases" && w.code < 300)
    {
        v.workload_writes += 1;
        let lease = leases.iter().rev().find(|l| l.0 <= w.received);
        let holds = lease.is_some_and(|(_, holder, _)| *holder == Some(w.replica.as_str()));
        let in_time = lease.is_some_and(|(_, _, renewed)| w.received <= renewed + renew);
        let before = last.insert(
            (w.resource.as_str(), w.name.as_str()),
            (w.replica.as_str(), w.verb.as_str(), holds && in_time),
        );
        if holds && in_time {
            continue;
        }
        let text = format!(
            "{:.2} s: {} {} {}/{} by {} (last Lease write: {:?})",
            w.received, w.verb, w.code, w.resource, w.name, w.replica, lease
        );
        if holds {
            v.after_own_deadline.push(text);
            continue;
        }
        let finishes_own_recreate = w.resource == "jobs"
            && w.verb == "create"
            && before == Some((w.replica.as_str(), "delete", true));
        if finishes_own_recreate {
            v.recreates_finished.push(text);
            continue;
        }
        let healed_just_before = faults.iter().any(|f| {
            f.replica.as_deref() == Some(&w.replica)
                && f.what.contains("cut off")
                && (f.until - 1.0..=f.until + 5.0).contains(&w.received)
        });
        if healed_just_before {
            v.in_flight_at_partition.push(text);
        } else {
            v.non_leader_writes.push(text);
        }
    }
    v
}

fn report(
    dir: &std::path::Path,
    v: &Verdict,
    ledger: &Ledger,
    minutes: f64,
    seed: u64,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let faults = ledger.faults.lock().unwrap().clone();
    let changes = ledger.changes.lock().unwrap().clone();
    let mut lat: Vec<f64> = v.latencies.iter().map(|l| l.1).collect();
    lat.sort_by(f64::total_cmp);
    let mut by_fault: BTreeMap<String, usize> = BTreeMap::new();
    for f in &faults {
        let name = f.what.split(" (").next().unwrap_or(&f.what);
        let name = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == ' ' || c == 's');
        *by_fault.entry(name.to_string()).or_default() += 1;
    }
    std::fs::write(
        dir.join("chaos.json"),
        serde_json::to_string_pretty(&json!({
            "minutes": minutes, "seed": seed, "verdict": v, "faults": faults, "changes": changes,
        }))?,
    )?;
    let mut md = format!(
        "# Chaos soak\n\n`just chaos` (REKINDLE_CHAOS_MINUTES={minutes}, seed {seed}): rekindle installed by helm on the \
         real node with two replicas (lease 6 s, renew deadline 4 s, retry 1 s), {} workloads (Deployments, StatefulSets, \
         DaemonSets, CronJobs, Jobs) using 8 ConfigMaps and 8 Secrets.\n\n\
         | | |\n|---|---|\n| changes | {} |\n| faults | {} |\n| rollouts (generations, Jobs) | {} |\n\
         | successful workload writes (audit log) | {} |\n| **lost** | **{}** |\n| **doubled** | **{}** |\n\
         | **writes by a replica not leading** | **{}** |\n| writes held by a partition, landed at its heal | {} |\n\
         | writes by the holder arriving after its renew deadline, nobody else leading | {} |\n\
         | Job re-creates finished after the lease ran out (deleted while leading) | {} |\n\
         | workload writes refused as stale (409, or 422 from a failed test) | {} |\n\
         | change → reload, p50 / p99 / max | {:.2} s / {:.2} s / {:.2} s ({} change × workload pairs) |\n\n",
        v.workloads,
        v.changes,
        v.faults,
        v.rollouts,
        v.workload_writes,
        v.lost.len(),
        v.doubled.len(),
        v.non_leader_writes.len(),
        v.in_flight_at_partition.len(),
        v.after_own_deadline.len(),
        v.recreates_finished.len(),
        v.refused_as_stale,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(0.0),
        lat.len(),
    );
    md += "| fault | times |\n|---|---|\n";
    for (f, n) in &by_fault {
        md += &format!("| {f} | {n} |\n");
    }
    md += "\n![change to reload latency over the run, faults marked](chaos.png)\n\nEvery fault, on the run's clock:\n\n";
    for f in &faults {
        md += &format!(
            "- {:.1}–{:.1} s: {}{}\n",
            f.at,
            f.until,
            f.what,
            f.replica
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
    }
    for (title, list) in [
        ("Lost", &v.lost),
        ("Doubled", &v.doubled),
        ("Writes by a replica not leading", &v.non_leader_writes),
        ("Writes held by a partition", &v.in_flight_at_partition),
        (
            "Writes by the holder after its renew deadline",
            &v.after_own_deadline,
        ),
        (
            "Job re-creates finished after the lease ran out",
            &v.recreates_finished,
        ),
    ] {
        if !list.is_empty() {
            md += &format!("\n## {title}\n\n");
            for l in list {
                md += &format!("- {l}\n");
            }
        }
    }
    std::fs::write(dir.join("chaos.md"), md)?;
    plot(&dir.join("chaos.png"), &v.latencies, &faults)
}

/// Latency of each change × dependent over the run, with the faults as shaded spans.
fn plot(path: &std::path::Path, latencies: &[(f64, f64)], faults: &[Fault]) -> Result<()> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Debug| anyhow!("plotting: {e:?}");
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        include_bytes!("../../bench/fonts/DejaVuSans.ttf"),
    )
    .map_err(|_| anyhow!("bundled font refused"))?;
    let end = latencies
        .iter()
        .map(|l| l.0)
        .chain(faults.iter().map(|f| f.until))
        .fold(1.0, f64::max)
        / 60.0;
    let top = latencies.iter().map(|l| l.1).fold(1.0, f64::max) * 1.1;
    let root = BitMapBackend::new(path, (1000, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("change → reload under faults", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("minutes into the run (shaded: a fault)")
        .y_desc("seconds to reload")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(faults.iter().map(|f| {
            Rectangle::new(
                [
                    (f.at / 60.0, 0.0),
                    ((f.until / 60.0).max(f.at / 60.0 + end / 400.0), top),
                ],
                RGBColor(255, 180, 180).mix(0.5).filled(),
            )
        }))
        .map_err(|e| err(&e))?;
    chart
        .draw_series(
            latencies
                .iter()
                .map(|(at, l)| Circle::new((at / 60.0, *l), 2, BLUE.filled())),
        )
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[tokio::test]
async fn chaos_soak_loses_nothing_doubles_nothing_and_has_one_writer() -> Result<()> {
    let minutes: f64 = std::env::var("REKINDLE_CHAOS_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(3.0);
    let seed: u64 = std::env::var("REKINDLE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| jiff::Timestamp::now().as_nanosecond() as u64 | 1);
    println!("chaos soak: {minutes} minutes, seed {seed}");
    let client = client().await?;
    fresh_start()?;
    helm(&[
        "install",
        "rekindle",
        "charts/rekindle",
        "-n",
        RELEASE_NS,
        "--create-namespace",
        "--set",
        "certs.mode=certsGen",
        "--set",
        "rekindle.leaderElection.leaseDuration=6s",
        "--set",
        "rekindle.leaderElection.renewDeadline=4s",
        "--set",
        "rekindle.leaderElection.retryPeriod=1s",
        "--set",
        "rekindle.shutdownDelay=1s",
    ])
    .inspect_err(|_| diagnose(RELEASE_NS))?;
    wait_rolled_out(RELEASE_NS)?;
    ensure!(
        ready_pods(&client, RELEASE_NS).await?.len() == 2,
        "two Ready replicas"
    );

    let ns = TestNamespace::new(&client, "chaos").await?;
    let mut current: BTreeMap<Res, String> = BTreeMap::new();
    for i in 0..RESOURCES {
        for (kind, prefix) in [
            (ResourceKind::ConfigMap, "cm"),
            (ResourceKind::Secret, "secret"),
        ] {
            let r = Res {
                kind,
                name: format!("{prefix}-{i}"),
            };
            let hash = write(&client, &ns.name, &r, "0").await;
            current.insert(r, hash);
        }
    }
    let all = workloads();
    for w in &all {
        apply_value(&client, Some(&ns.name), manifest(w)).await?;
    }
    // Let both replicas index everything, and the watches record each workload's first state.
    let ledger = Arc::new(Ledger {
        start: Instant::now() + Duration::from_secs(10),
        started_at: jiff::Timestamp::now() + jiff::SignedDuration::from_secs(10),
        changes: Mutex::default(),
        seen: Mutex::default(),
        faults: Mutex::default(),
    });
    let watches = watch_workloads(&client, &ns.name, &all, &ledger);
    tokio::time::sleep_until(ledger.start).await;

    let mut rng = Rng(seed);
    let end = Duration::from_secs_f64(minutes * 60.0);
    let changes = {
        let (client, ns, ledger) = (client.clone(), ns.name.clone(), ledger.clone());
        let resources: Vec<Res> = current.keys().cloned().collect();
        let mut rng = Rng(seed.rotate_left(17) | 1);
        tokio::spawn(async move {
            let mut n = 0u64;
            while ledger.start.elapsed() < end {
                let r = &resources[rng.below(resources.len())];
                n += 1;
                let hash = write(&client, &ns, r, &format!("change-{n}")).await;
                ledger.changes.lock().unwrap().push(Change {
                    at: ledger.now(),
                    kind: r.kind,
                    name: r.name.clone(),
                    hash,
                });
                tokio::time::sleep(rng.between(0.3, 2.0)).await;
            }
        })
    };
    while ledger.start.elapsed() < end {
        tokio::time::sleep(rng.between(8.0, 25.0)).await;
        if ledger.start.elapsed() >= end {
            break;
        }
        if let Err(e) = inject(&client, &mut rng, &ledger).await {
            println!("fault injection failed: {e:#}");
        }
    }
    changes.await?;
    // The last changes' values, then time for the last reloads (a replica may be in CrashLoopBackOff).
    for c in ledger.changes.lock().unwrap().iter() {
        current.insert(
            Res {
                kind: c.kind,
                name: c.name.clone(),
            },
            c.hash.clone(),
        );
    }
    println!(
        "changes done at {:.1} s; waiting for the last reloads",
        ledger.now()
    );
    let settled = wait_for(
        "every workload on its current hashes",
        Duration::from_secs(600),
        || async {
            let ends = end_states(&client, &ns.name, &all).await?;
            let v = judge(&ledger, &all, &current, &ends, &[]);
            Ok(v.lost.is_empty().then_some(()))
        },
    )
    .await;
    // Anything written late (a doubled reload) would land now.
    tokio::time::sleep(Duration::from_secs(15)).await;
    for w in watches {
        w.abort();
    }
    let writes = audited_writes(&ledger, &ns.name)?;
    let ends = end_states(&client, &ns.name, &all).await?;
    let verdict = judge(&ledger, &all, &current, &ends, &writes);
    let out = std::env::var_os("REKINDLE_CHAOS_REPORT")
        .map(|d| root().join(PathBuf::from(d)))
        .unwrap_or_else(|| root().join("target/chaos"));
    report(&out, &verdict, &ledger, minutes, seed)?;
    println!(
        "{}",
        std::fs::read_to_string(out.join("chaos.md"))?
            .split("Every fault")
            .next()
            .unwrap_or("")
    );
    if settled.is_err() {
        diagnose(RELEASE_NS);
    }
    ensure!(
        verdict.changes > 0 && verdict.faults > 0,
        "nothing happened"
    );
    ensure!(
        verdict.workload_writes > 0,
        "no rekindle write in the audit log"
    );
    ensure!(verdict.lost.is_empty(), "lost: {:#?}", verdict.lost);
    ensure!(
        verdict.doubled.is_empty(),
        "doubled: {:#?}",
        verdict.doubled
    );
    ensure!(
        verdict.non_leader_writes.is_empty(),
        "writes by a replica not leading: {:#?}",
        verdict.non_leader_writes
    );
    ns.cleanup().await?;
    fresh_start()
}
