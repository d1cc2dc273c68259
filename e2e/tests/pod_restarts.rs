//! Pod restarts (`rekindle.io/restart: pods`) through the real apiserver: the StatefulSet controller
//! re-creates evicted pods, kwok makes them Ready, and the disruption controller keeps the
//! PodDisruptionBudgets' status that the Eviction API consults.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use e2e::fixtures::{deployment, generation};
use e2e::policy::refuse_new_pods;
use e2e::rekindle::{Options, Rekindle};
use e2e::{admin_client, apply_value, apply_yaml, dynamic_api, get_json, wait_for, TestNamespace};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

const CM: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: db-config}\ndata: {setting: one}\n";
const MARKER: &str = "STAKATER_DB_CONFIG_CONFIGMAP";
const WALK_TIMEOUT: Duration = Duration::from_secs(120);

async fn change(client: &Client, ns: &str, name: &str, value: &str) -> Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"setting": value}})),
        )
        .await?;
    Ok(())
}

/// An `OnDelete` StatefulSet `db` of `replicas` pods reading `db-config`, with `annotations`.
fn statefulset(replicas: i64, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db", "annotations": annotations},
        "spec": {
            "replicas": replicas,
            "serviceName": "db",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "app", "image": "busybox",
                    "envFrom": [{"configMapRef": {"name": "db-config"}}]}]}
            }
        }
    })
}

fn opted_in() -> Value {
    json!({"reloader.stakater.com/auto": "true", "rekindle.io/restart": "pods"})
}

/// One pod as the tests see it.
#[derive(Debug, Clone)]
struct PodView {
    uid: String,
    ready: bool,
    terminating: bool,
    marker: Option<String>,
}

async fn pods(client: &Client, ns: &str) -> Result<Vec<PodView>> {
    let list = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app=db"))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|p| {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let marker = p.spec.as_ref().and_then(|s| {
                s.containers[0]
                    .env
                    .as_ref()?
                    .iter()
                    .find(|e| e.name == MARKER)?
                    .value
                    .clone()
            });
            PodView {
                uid: p.metadata.uid.clone().unwrap_or_default(),
                ready,
                terminating: p.metadata.deletion_timestamp.is_some(),
                marker,
            }
        })
        .collect())
}

/// Waits until `replicas` pods exist, every one Ready and carrying the workload's template marker.
async fn wait_all_current(client: &Client, ns: &str, replicas: usize) -> Result<Vec<PodView>> {
    let sts = dynamic_api(client, "apps/v1", "StatefulSet", Some(ns)).await?;
    wait_for(
        "every pod Ready with the template's marker",
        WALK_TIMEOUT,
        || async {
            let template = get_json(&sts, "db").await?;
            let wanted = template_marker(&template);
            let pods = pods(client, ns).await?;
            let current = pods.len() == replicas
                && pods
                    .iter()
                    .all(|p| p.ready && !p.terminating && p.marker == wanted);
            Ok(current.then_some(pods))
        },
    )
    .await
}

fn template_marker(sts: &Value) -> Option<String> {
    sts.pointer("/spec/template/spec/containers/0/env")?
        .as_array()?
        .iter()
        .find(|e| e["name"] == MARKER)?["value"]
        .as_str()
        .map(String::from)
}

/// Follows the pods until every one runs `wanted` and is Ready, from LIST snapshots every 50 ms:
/// the most pods seen down at once (not Ready, terminating or missing).
async fn follow_walk(client: &Client, ns: &str, replicas: usize, wanted: &str) -> Result<usize> {
    let deadline = tokio::time::Instant::now() + WALK_TIMEOUT;
    let mut most_down = 0;
    loop {
        let pods = pods(client, ns).await?;
        let up = pods.iter().filter(|p| p.ready && !p.terminating).count();
        most_down = most_down.max(replicas.saturating_sub(up));
        let done = pods.len() == replicas
            && pods
                .iter()
                .all(|p| p.ready && !p.terminating && p.marker.as_deref() == Some(wanted));
        if done {
            return Ok(most_down);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the walk did not finish: {pods:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The evictions of the namespace's pods the apiserver accepted, by pod name, from the cluster's
/// audit log (cluster.sh): what was restarted, whatever else deletes pods (kwok may delete a pod
/// that reuses a deleted one's name).
fn evictions(ns: &str) -> BTreeMap<String, usize> {
    let log = std::fs::read_to_string(e2e::state_dir().join("logs/audit.log")).unwrap_or_default();
    let mut counted = BTreeMap::new();
    for e in log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let accepted = e.pointer("/responseStatus/code").and_then(Value::as_i64) == Some(201);
        if e.pointer("/objectRef/namespace").and_then(Value::as_str) == Some(ns)
            && e.pointer("/objectRef/subresource").and_then(Value::as_str) == Some("eviction")
            && e["stage"] == "ResponseComplete"
            && accepted
        {
            let name = e
                .pointer("/objectRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            *counted.entry(name.to_string()).or_default() += 1;
        }
    }
    counted
}

fn each_once() -> BTreeMap<String, usize> {
    ["db-0", "db-1", "db-2"]
        .into_iter()
        .map(|n| (n.to_string(), 1))
        .collect()
}

async fn events(client: &Client, ns: &str, reason: &str) -> Result<Vec<Event>> {
    Ok(Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("reason={reason}")))
        .await?
        .items)
}

/// The template is written once, then each pod is evicted exactly once, never more than one down,
/// highest ordinal first, and every new pod carries the new marker.
#[tokio::test]
async fn an_on_delete_statefulset_gets_each_pod_evicted_once_one_at_a_time() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podrestart").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_value(&client, Some(&ns.name), statefulset(3, opted_in())).await?;
    let before = wait_all_current(&client, &ns.name, 3).await?;
    let old_marker = before[0].marker.clone();
    assert!(old_marker.is_some(), "stamped at creation: {before:?}");

    change(&client, &ns.name, "db-config", "two").await?;
    let sts = dynamic_api(&client, "apps/v1", "StatefulSet", Some(&ns.name)).await?;
    let wanted = wait_for("the template to be written", WALK_TIMEOUT, || async {
        let obj = get_json(&sts, "db").await?;
        Ok(template_marker(&obj).filter(|m| Some(m) != old_marker.as_ref()))
    })
    .await?;
    let most_down = follow_walk(&client, &ns.name, 3, &wanted).await?;
    assert!(most_down <= 1, "one pod down at a time");
    let after = pods(&client, &ns.name).await?;
    let old: BTreeSet<&str> = before.iter().map(|p| p.uid.as_str()).collect();
    assert!(
        after.iter().all(|p| !old.contains(p.uid.as_str())),
        "every pod replaced: {after:?}"
    );
    assert_eq!(evictions(&ns.name), each_once(), "each pod evicted once");
    assert_eq!(
        generation(&get_json(&sts, "db").await?),
        2,
        "template written once"
    );
    assert_eq!(
        rk.metric("rekindle_pod_evictions_total{result=\"evicted\"}")
            .await?,
        3.0
    );
    wait_for("the walk's end to be told", WALK_TIMEOUT, || async {
        let finished = events(&client, &ns.name, "PodRestartsFinished").await?;
        Ok((!finished.is_empty()).then_some(()))
    })
    .await?;
    assert_eq!(
        events(&client, &ns.name, "PodRestartsStarted").await?.len(),
        1
    );
    assert_eq!(rk.metric("rekindle_pod_restarts_in_progress ").await?, 0.0);
    // The StatefulSet, like every kind below, was watched in protobuf from start to end.
    let fallbacks = rk.protobuf_fallbacks().await?;
    let watched: BTreeSet<&str> = fallbacks.keys().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        watched,
        BTreeSet::from([
            "configmaps",
            "daemonset",
            "deployment",
            "secrets",
            "statefulset"
        ]),
        "{fallbacks:?}"
    );
    assert_eq!(fallbacks.len(), 10, "both reasons of each: {fallbacks:?}");
    assert!(fallbacks.values().all(|n| *n == 0.0), "{fallbacks:?}");
    rk.stop().await?;
    ns.cleanup().await
}

/// A PodDisruptionBudget that allows no disruption holds the walk: no pod is removed, one Event names
/// the budget; once it is relaxed, the walk finishes.
#[tokio::test]
async fn a_disruption_budget_that_allows_none_holds_the_walk_until_relaxed() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podrestart-pdb").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "db-pdb"},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "db"}}}
    });
    apply_value(&client, Some(&ns.name), pdb).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_value(&client, Some(&ns.name), statefulset(3, opted_in())).await?;
    let before = wait_all_current(&client, &ns.name, 3).await?;

    change(&client, &ns.name, "db-config", "two").await?;
    let blocked = wait_for("the walk to be blocked", WALK_TIMEOUT, || async {
        let blocked = events(&client, &ns.name, "PodRestartsBlocked").await?;
        Ok(blocked.into_iter().next())
    })
    .await?;
    let note = blocked.message.unwrap_or_default();
    assert!(
        note.contains("db-pdb"),
        "the Event names the budget: {note}"
    );
    // Held for a while: retried, refused, no pod removed, no second Event.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let held = pods(&client, &ns.name).await?;
    let uids = |ps: &[PodView]| ps.iter().map(|p| p.uid.clone()).collect::<BTreeSet<_>>();
    assert_eq!(uids(&held), uids(&before), "no pod removed: {held:?}");
    assert!(held.iter().all(|p| !p.terminating));
    assert!(evictions(&ns.name).is_empty(), "none accepted while held");
    assert!(
        rk.metric("rekindle_pod_evictions_total{result=\"disruption_budget\"}")
            .await?
            >= 2.0
    );
    assert_eq!(
        rk.metric("rekindle_pod_evictions_total{result=\"evicted\"}")
            .await?,
        0.0
    );
    assert_eq!(
        events(&client, &ns.name, "PodRestartsBlocked").await?.len(),
        1
    );

    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client.clone(), &ns.name)
        .patch(
            "db-pdb",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"minAvailable": 2}})),
        )
        .await?;
    let sts = dynamic_api(&client, "apps/v1", "StatefulSet", Some(&ns.name)).await?;
    let wanted = template_marker(&get_json(&sts, "db").await?).unwrap_or_default();
    let most_down = follow_walk(&client, &ns.name, 3, &wanted).await?;
    assert!(most_down <= 1, "within the budget");
    assert_eq!(evictions(&ns.name), each_once(), "each pod evicted once");
    rk.stop().await?;
    ns.cleanup().await
}

/// rekindle killed in the middle of a walk, and started again: the new process continues from what
/// the pods say and evicts none twice. The walk is held after its first eviction by refusing the
/// replacement (an admission policy), so rekindle dies mid-walk and not mid-request.
#[tokio::test]
async fn a_walk_continues_across_a_restart_and_evicts_no_pod_twice() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podrestart-restart").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_value(&client, Some(&ns.name), statefulset(3, opted_in())).await?;
    let before = wait_all_current(&client, &ns.name, 3).await?;
    let old_marker = before[0].marker.clone().unwrap_or_default();
    let policy = refuse_new_pods(&client, &ns.name, &["db"], MARKER, &old_marker).await?;

    change(&client, &ns.name, "db-config", "two").await?;
    wait_for("the first eviction", WALK_TIMEOUT, || async {
        Ok((!evictions(&ns.name).is_empty()).then_some(()))
    })
    .await?;
    // Its replacement cannot be created: the walk waits for it, and evicts nothing more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first: BTreeMap<String, usize> = [("db-2".to_string(), 1)].into();
    assert_eq!(evictions(&ns.name), first, "held after the first eviction");
    // `rekindle why` shows the walk from the cluster as it is: which pods are behind, and what it waits for.
    let out = std::process::Command::new(e2e::rekindle_binary()?)
        .args(["why", "sts/db", "-n", &ns.name, "-o", "json"])
        .arg("--kubeconfig")
        .arg(e2e::kubeconfig_path())
        .output()?;
    let why: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(why["state"], "restarting", "{why}");
    assert_eq!(why["pods"]["behind"], json!(["db-0", "db-1"]), "{why}");
    let next = why["pods"]["next"].as_str().unwrap_or_default();
    assert!(next.starts_with("waiting for"), "{why}");
    rk.kill().await?;

    policy.remove(&client).await?;
    rk.restart().await?;
    let sts = dynamic_api(&client, "apps/v1", "StatefulSet", Some(&ns.name)).await?;
    let wanted = template_marker(&get_json(&sts, "db").await?).unwrap_or_default();
    follow_walk(&client, &ns.name, 3, &wanted).await?;
    assert_eq!(
        evictions(&ns.name),
        each_once(),
        "each pod evicted once across the restart"
    );
    assert_eq!(
        generation(&get_json(&sts, "db").await?),
        2,
        "template written once"
    );
    rk.stop().await?;
    ns.cleanup().await
}

/// Without the opt-in, an `OnDelete` StatefulSet's reload is written and restarts no pod, and it holds
/// no budget slot: a Deployment's reload right after it is not kept waiting.
#[tokio::test]
async fn without_the_opt_in_an_on_delete_reload_holds_no_budget_slot() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podrestart-budget").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    apply_yaml(
        &client,
        Some(&ns.name),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web-config}\ndata: {setting: one}\n",
    )
    .await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0", "--max-rollouts-in-progress=1"],
            ..Default::default()
        },
    )
    .await?;
    apply_value(
        &client,
        Some(&ns.name),
        statefulset(2, json!({"reloader.stakater.com/auto": "true"})),
    )
    .await?;
    deployment("web")
        .auto()
        .uses_configmap("web-config")
        .apply(&client, &ns.name)
        .await?;
    let before = wait_all_current(&client, &ns.name, 2).await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    wait_for("the Deployment's first rollout", WALK_TIMEOUT, || async {
        let d = get_json(&deployments, "web").await?;
        let available = d
            .pointer("/status/availableReplicas")
            .and_then(Value::as_i64)
            == Some(1);
        Ok(available.then_some(()))
    })
    .await?;

    change(&client, &ns.name, "db-config", "two").await?;
    let sts = dynamic_api(&client, "apps/v1", "StatefulSet", Some(&ns.name)).await?;
    wait_for(
        "the StatefulSet's template to be written",
        WALK_TIMEOUT,
        || async { Ok((generation(&get_json(&sts, "db").await?) == 2).then_some(())) },
    )
    .await?;
    change(&client, &ns.name, "web-config", "two").await?;
    // Held, it would wait for --rollout-timeout (10 minutes).
    wait_for(
        "the Deployment's reload",
        Duration::from_secs(30),
        || async { Ok((generation(&get_json(&deployments, "web").await?) == 2).then_some(())) },
    )
    .await?;
    let reloaded = events(&client, &ns.name, "Reloaded").await?;
    let note = reloaded
        .iter()
        .filter_map(|e| e.message.clone())
        .find(|n| n.contains("'db'"))
        .unwrap_or_default();
    assert!(
        note.contains("OnDelete") && note.contains("rekindle.io/restart: pods"),
        "the Event says the pods will not restart and how to opt in: {note}"
    );
    let after = pods(&client, &ns.name).await?;
    let uids = |ps: &[PodView]| ps.iter().map(|p| p.uid.clone()).collect::<BTreeSet<_>>();
    assert_eq!(
        uids(&after),
        uids(&before),
        "no pod restarted without the opt-in"
    );
    assert_eq!(
        rk.metric("rekindle_pod_evictions_total{result=\"evicted\"}")
            .await?,
        0.0
    );
    assert!(evictions(&ns.name).is_empty());
    rk.stop().await?;
    ns.cleanup().await
}

/// An `OnDelete` DaemonSet opted in: its pod (one, on the one kwok node) is evicted once and comes
/// back with the new marker.
#[tokio::test]
async fn an_on_delete_daemonset_gets_its_pod_evicted_once() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podrestart-ds").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let mut ds = statefulset(1, opted_in());
    ds["kind"] = json!("DaemonSet");
    let spec = ds["spec"].as_object_mut().expect("an object");
    spec.remove("replicas");
    spec.remove("serviceName");
    apply_value(&client, Some(&ns.name), ds).await?;
    let daemonsets = dynamic_api(&client, "apps/v1", "DaemonSet", Some(&ns.name)).await?;
    let before = wait_for("the DaemonSet's pod", WALK_TIMEOUT, || async {
        let pods = pods(&client, &ns.name).await?;
        let ready = pods.len() == 1 && pods[0].ready && pods[0].marker.is_some();
        Ok(ready.then_some(pods))
    })
    .await?;

    change(&client, &ns.name, "db-config", "two").await?;
    let wanted = wait_for("the template to be written", WALK_TIMEOUT, || async {
        let obj = get_json(&daemonsets, "db").await?;
        Ok(template_marker(&obj).filter(|m| Some(m) != before[0].marker.as_ref()))
    })
    .await?;
    follow_walk(&client, &ns.name, 1, &wanted).await?;
    let after = pods(&client, &ns.name).await?;
    assert_ne!(after[0].uid, before[0].uid, "replaced");
    let evicted = evictions(&ns.name);
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert!(
        evicted.values().all(|n| *n == 1),
        "evicted once: {evicted:?}"
    );
    rk.stop().await?;
    ns.cleanup().await
}

const STAMPS: &str = "rekindle.io/config-hashes";

/// A pod labelled for pod restarts as the tests see it: the hash it was stamped with for `db-config`.
#[derive(Debug, Clone)]
struct LabelledPod {
    name: String,
    uid: String,
    ready: bool,
    terminating: bool,
    stamp: Option<String>,
}

async fn labelled_pods(client: &Client, ns: &str, selector: &str) -> Result<Vec<LabelledPod>> {
    let list = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|p| {
            let value = serde_json::to_value(&p).unwrap_or_default();
            let stamp = value
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(STAMPS))
                .and_then(Value::as_str)
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
                .and_then(|h| h["configmap/db-config"].as_str().map(String::from));
            let ready = value
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            LabelledPod {
                name: p.metadata.name.clone().unwrap_or_default(),
                uid: p.metadata.uid.clone().unwrap_or_default(),
                ready,
                terminating: p.metadata.deletion_timestamp.is_some(),
                stamp,
            }
        })
        .collect())
}

/// A bare ReplicaSet `op` standing for an operator: its pods are labelled for pod restarts and carry
/// the reload annotation; the ReplicaSet itself carries none.
fn operator_replica_set(replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "op"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "op"}},
            "template": {
                "metadata": {
                    "labels": {"app": "op", "rekindle.io/restart": "pods"},
                    "annotations": {"reloader.stakater.com/auto": "true"}
                },
                "spec": {"containers": [{"name": "app", "image": "busybox",
                    "envFrom": [{"configMapRef": {"name": "db-config"}}]}]}
            }
        }
    })
}

/// Waits until `n` pods selected by `selector` exist, every one Ready and stamped.
async fn wait_stamped(
    client: &Client,
    ns: &str,
    selector: &str,
    n: usize,
) -> Result<Vec<LabelledPod>> {
    wait_for(
        "the labelled pods, stamped and Ready",
        WALK_TIMEOUT,
        || async {
            let pods = labelled_pods(client, ns, selector).await?;
            let ready = pods.len() == n && pods.iter().all(|p| p.ready && p.stamp.is_some());
            Ok(ready.then_some(pods))
        },
    )
    .await
}

/// Follows the pods of `op` from LIST snapshots every 50 ms until `n` are Ready and `current`: the
/// most seen down at once, and the pods then.
async fn follow_labelled_walk(
    client: &Client,
    ns: &str,
    n: usize,
    current: impl Fn(&LabelledPod) -> bool,
) -> Result<(usize, Vec<LabelledPod>)> {
    let deadline = tokio::time::Instant::now() + WALK_TIMEOUT;
    let mut most_down = 0;
    loop {
        let pods = labelled_pods(client, ns, "app=op").await?;
        let up = pods.iter().filter(|p| p.ready && !p.terminating).count();
        most_down = most_down.max(n.saturating_sub(up));
        if pods.len() == n && pods.iter().all(|p| p.ready && !p.terminating && current(p)) {
            return Ok((most_down, pods));
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the walk did not finish: {pods:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pods of an owner rekindle does not write (a bare ReplicaSet), labelled `rekindle.io/restart: pods`:
/// stamped at creation, evicted one at a time on a change (each once), every replacement stamped with
/// the new hash, Events on the owner, and the owner never written.
#[tokio::test]
async fn labelled_pods_of_another_owner_are_evicted_one_at_a_time_and_the_owner_never_written(
) -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podgroup").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_value(&client, Some(&ns.name), operator_replica_set(3)).await?;
    let before = wait_stamped(&client, &ns.name, "app=op", 3).await?;
    let old = before[0].stamp.clone().unwrap_or_default();
    assert!(
        before
            .iter()
            .all(|p| p.stamp.as_deref() == Some(old.as_str())),
        "stamped at creation with the same hash: {before:?}"
    );

    change(&client, &ns.name, "db-config", "two").await?;
    let (most_down, after) = follow_labelled_walk(&client, &ns.name, 3, |p| {
        p.stamp.as_deref().is_some_and(|s| s != old)
    })
    .await?;
    assert!(most_down <= 1, "one pod down at a time, saw {most_down}");
    let old_uids: BTreeSet<&str> = before.iter().map(|p| p.uid.as_str()).collect();
    assert!(
        after.iter().all(|p| !old_uids.contains(p.uid.as_str())),
        "every pod replaced: {after:?}"
    );
    let wanted: BTreeMap<String, usize> = before.iter().map(|p| (p.name.clone(), 1)).collect();
    assert_eq!(evictions(&ns.name), wanted, "each old pod evicted once");

    let replica_sets = dynamic_api(&client, "apps/v1", "ReplicaSet", Some(&ns.name)).await?;
    let rs = get_json(&replica_sets, "op").await?;
    assert_eq!(generation(&rs), 1, "the owner's spec never written");
    let managers: Vec<&str> = rs
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f["manager"].as_str())
        .collect();
    assert!(
        !managers.contains(&"rekindle"),
        "rekindle never wrote the owner: {managers:?}"
    );
    wait_for("the walk's end to be told", WALK_TIMEOUT, || async {
        let finished = events(&client, &ns.name, "PodRestartsFinished").await?;
        Ok((!finished.is_empty()).then_some(finished))
    })
    .await?;
    let started = events(&client, &ns.name, "PodRestartsStarted").await?;
    assert_eq!(started.len(), 1, "{started:?}");
    let regarding = &started[0].involved_object;
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("ReplicaSet"), Some("op")),
        "told on the owner"
    );
    assert_eq!(
        rk.metric("rekindle_pod_evictions_total{result=\"evicted\"}")
            .await?,
        3.0
    );
    rk.stop().await?;
    ns.cleanup().await
}

/// A labelled pod with no controller owner is stamped but never evicted: evicted, nothing would bring
/// it back. A Warning Event on the pod says why.
#[tokio::test]
async fn a_labelled_pod_without_a_controller_is_never_evicted() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podgroup-bare").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let mut pod = operator_replica_set(1)["spec"]["template"].clone();
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    pod["metadata"]["name"] = json!("lonely");
    apply_value(&client, Some(&ns.name), pod).await?;
    let before = wait_stamped(&client, &ns.name, "app=op", 1).await?;

    change(&client, &ns.name, "db-config", "two").await?;
    let warned = wait_for("the Warning", WALK_TIMEOUT, || async {
        let warned = events(&client, &ns.name, "PodNotRestarted").await?;
        Ok(warned.into_iter().next())
    })
    .await?;
    assert_eq!(warned.involved_object.name.as_deref(), Some("lonely"));
    assert!(
        warned
            .message
            .unwrap_or_default()
            .contains("no controller owner"),
        "says why"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = labelled_pods(&client, &ns.name, "app=op").await?;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].uid, before[0].uid, "not evicted");
    assert!(!after[0].terminating);
    assert!(evictions(&ns.name).is_empty());
    rk.stop().await?;
    ns.cleanup().await
}

/// Pods labelled for pod restarts whose Deployment rekindle reloads itself are left to that reload:
/// the Deployment rolls once, and no pod is evicted.
#[tokio::test]
async fn labelled_pods_of_a_reloaded_deployment_are_never_restarted_twice() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podgroup-deploy").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let mut web = deployment("web")
        .auto()
        .template_annotations(json!({"reloader.stakater.com/auto": "true"}))
        .uses_configmap("db-config")
        .build();
    web["spec"]["template"]["metadata"]["labels"]["rekindle.io/restart"] = json!("pods");
    apply_value(&client, Some(&ns.name), web).await?;
    let before = wait_stamped(&client, &ns.name, "app=web", 1).await?;

    change(&client, &ns.name, "db-config", "two").await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    wait_for("the Deployment's reload", WALK_TIMEOUT, || async {
        Ok((generation(&get_json(&deployments, "web").await?) == 2).then_some(()))
    })
    .await?;
    wait_for("the pod replaced by the rollout", WALK_TIMEOUT, || async {
        let pods = labelled_pods(&client, &ns.name, "app=web").await?;
        let rolled = pods.len() == 1
            && pods[0].ready
            && pods[0].uid != before[0].uid
            && pods[0].stamp != before[0].stamp;
        Ok(rolled.then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        evictions(&ns.name).is_empty(),
        "left to the Deployment's reload"
    );
    assert_eq!(
        rk.metric("rekindle_pod_evictions_total{result=\"evicted\"}")
            .await?,
        0.0
    );
    assert_eq!(
        generation(&get_json(&deployments, "web").await?),
        2,
        "reloaded once"
    );
    rk.stop().await?;
    ns.cleanup().await
}

/// rekindle killed in the middle of a walk over an operator's labelled pods, and started again while
/// the pod it evicted is not re-created yet: the new process reads from the pods' stamps which are
/// behind, watches the owner's pods before its first eviction (so the missing pod is counted once the
/// owner makes it) and evicts none twice. The walk is held after its first eviction by refusing every
/// new pod of the owner until after the restart.
#[tokio::test]
async fn a_walk_over_labelled_pods_continues_across_a_restart_and_evicts_no_pod_twice() -> Result<()>
{
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-podgroup-restart").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_value(&client, Some(&ns.name), operator_replica_set(3)).await?;
    let before = wait_stamped(&client, &ns.name, "app=op", 3).await?;
    let old = before[0].stamp.clone().unwrap_or_default();
    // No marker env var on these pods: every new pod of `op` is refused.
    let policy = refuse_new_pods(&client, &ns.name, &["op"], "NO_MARKER", "-").await?;

    change(&client, &ns.name, "db-config", "two").await?;
    wait_for("the first eviction", WALK_TIMEOUT, || async {
        Ok((!evictions(&ns.name).is_empty()).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        evictions(&ns.name).len(),
        1,
        "held after the first eviction"
    );
    rk.kill().await?;
    let old_uids: BTreeSet<String> = before.iter().map(|p| p.uid.clone()).collect();
    let alive = labelled_pods(&client, &ns.name, "app=op").await?;
    assert_eq!(
        alive.iter().filter(|p| !p.terminating).count(),
        2,
        "the evicted pod is not re-created before the restart: {alive:#?}"
    );

    rk.restart().await?;
    // Two pods alive of three: taken for the owner's whole count, the second eviction would leave one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        evictions(&ns.name).len(),
        1,
        "no eviction while the new process cannot know the owner's count"
    );
    policy.remove(&client).await?;
    // Wake the ReplicaSet controller, which backs off after refused creates.
    Api::<k8s_openapi::api::apps::v1::ReplicaSet>::namespaced(client.clone(), &ns.name)
        .patch(
            "op",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"e2e/wake": "1"}}})),
        )
        .await?;
    let (most_down, _) = follow_labelled_walk(&client, &ns.name, 3, |p| {
        !old_uids.contains(&p.uid) && p.stamp.as_deref() != Some(old.as_str())
    })
    .await?;
    assert!(most_down <= 1, "one pod down at a time, saw {most_down}");
    let wanted: BTreeMap<String, usize> = before.iter().map(|p| (p.name.clone(), 1)).collect();
    assert_eq!(
        evictions(&ns.name),
        wanted,
        "each old pod evicted once across the restart"
    );
    rk.stop().await?;
    ns.cleanup().await
}
