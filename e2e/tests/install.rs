//! rekindle installed the way users install it, on the real node (`just node-up`, `e2e/scripts/node.sh`):
//! the image built by `just image` running under containerd and runc, the README's `helm install`
//! commands, and every admission going apiserver → the chart's Service → a pod, with the chart's
//! `matchConditions` and namespace exclusions evaluated by the apiserver.
//!
//! Runs inside the node's network namespace (`node.sh exec -- cargo test -p e2e --features real-node
//! --test install`), where `KUBECONFIG` names the node cluster's admin and kubectl and helm are on PATH.
//! The tests share one cluster-scoped webhook configuration, so they run one at a time (a lock).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use base64::Engine;
use e2e::node::{
    client, diagnose, fresh_start, helm, kubectl, ready_pods, run, wait_rolled_out, RELEASE_NS,
    WORKLOAD_IMAGE,
};
use e2e::{expect_replica_sets, root, wait_for, TestNamespace, TIMEOUT};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};
use tokio::sync::Mutex;

#[path = "install/csi.rs"]
mod csi;
use csi::secrets_store_csi_driver_body;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const WEBHOOK: &str = "workloads.rekindle.io";
/// The apiserver's own count of calls to rekindle's webhook (every operation and outcome).
fn webhook_calls() -> Result<u64> {
    let metrics = kubectl(&["get", "--raw", "/metrics"])?;
    let needle = format!("name=\"{WEBHOOK}\"");
    Ok(metrics
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_admission_webhook_admission_duration_seconds_count{")
                && l.contains(&needle)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// A Deployment of the node's workload image, using `configmap` and `secret`.
fn deployment(name: &str, configmap: &str, secret: &str, labels: Value) -> Result<Deployment> {
    e2e::fixtures::deployment(name)
        .auto()
        .labels(labels)
        .pod_spec(json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": WORKLOAD_IMAGE,
                "imagePullPolicy": "Never",
                "envFrom": [{"configMapRef": {"name": configmap}}, {"secretRef": {"name": secret}}],
            }],
        }))
        .typed()
}

/// The `STAKATER_*` markers in the Deployment's first container, by name.
fn markers(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.first())
        .and_then(|c| c.env.as_ref())
        .map(|env| {
            env.iter()
                .filter(|e| e.name.starts_with("STAKATER_"))
                .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// A ConfigMap, a Secret and a Deployment using both; returns the Deployment as the create answered it
/// (the admission's mutation is in that answer, before any watch could have acted).
async fn workload(client: &Client, ns: &str, name: &str, labels: Value) -> Result<Deployment> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "1"}}))?,
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"s": "1"}}))?,
        )
        .await?;
    // The webhook stamps the hashes its watches have seen: a workload admitted in the same instant as
    // its resources' creation can miss them (the watch reloads it later instead). These tests are
    // about the admission path, so the watches get a moment.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    Ok(deployments
        .create(
            &PostParams::default(),
            &deployment(name, name, name, labels)?,
        )
        .await?)
}

async fn change_configmap(client: &Client, ns: &str, name: &str, value: &str) -> Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": value}})),
        )
        .await?;
    Ok(())
}

async fn change_secret(client: &Client, ns: &str, name: &str, value: &str) -> Result<()> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"s": value}})),
        )
        .await?;
    Ok(())
}

/// A workload in a fresh namespace is stamped at admission, and a ConfigMap change and a Secret change
/// each roll it exactly once.
async fn stamps_and_reloads(client: &Client, prefix: &str) -> Result<()> {
    let ns = TestNamespace::new(client, prefix).await?;
    let created = workload(client, &ns.name, "app", json!({})).await?;
    let stamped = markers(&created);
    ensure!(
        stamped.contains_key("STAKATER_APP_CONFIGMAP")
            && stamped.contains_key("STAKATER_APP_SECRET"),
        "the Deployment was not stamped at admission: {stamped:?}"
    );
    expect_replica_sets(client, &ns.name, "app", 1).await?;
    change_configmap(client, &ns.name, "app", "2").await?;
    expect_replica_sets(client, &ns.name, "app", 2).await?;
    change_secret(client, &ns.name, "app", "2").await?;
    expect_replica_sets(client, &ns.name, "app", 3).await?;
    ns.cleanup().await
}

/// The processes of rekindle's containers, seen from the node: user 65532 and a read-only root.
fn check_container_processes(expected: usize) -> Result<()> {
    let mut seen = 0;
    for entry in std::fs::read_dir("/proc")? {
        let dir = entry?.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if argv0 != b"/rekindle" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status"))?;
        let uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap_or_default();
        ensure!(
            uid.split_whitespace().skip(1).all(|u| u == "65532"),
            "{}: rekindle runs as {uid}",
            dir.display()
        );
        let mountinfo = std::fs::read_to_string(dir.join("mountinfo"))?;
        let root = mountinfo
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some("/"))
            .ok_or_else(|| anyhow!("{}: no root mount", dir.display()))?;
        let options = root.split_whitespace().nth(5).unwrap_or_default();
        ensure!(
            options.split(',').any(|o| o == "ro"),
            "{}: root filesystem is not read-only: {root}",
            dir.display()
        );
        seen += 1;
    }
    ensure!(
        seen >= expected,
        "found {seen} rekindle container process(es), expected {expected}"
    );
    Ok(())
}

async fn leader(client: &Client) -> Result<String> {
    wait_for("a rekindle replica to hold the Lease", TIMEOUT, || async {
        let lease = Api::<Lease>::namespaced(client.clone(), RELEASE_NS)
            .get_opt("rekindle-leader")
            .await?;
        Ok(lease
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty()))
    })
    .await
}

/// Two replicas, the Lease holder writes: a burst of changes with the leader pod deleted in the middle
/// reloads every change exactly once.
async fn leader_deleted_mid_burst(client: &Client) -> Result<()> {
    let ns = TestNamespace::new(client, "install-ha").await?;
    let names: Vec<String> = (0..6).map(|i| format!("app-{i}")).collect();
    for name in &names {
        workload(client, &ns.name, name, json!({})).await?;
    }
    for name in &names {
        expect_replica_sets(client, &ns.name, name, 1).await?;
    }
    let holder = leader(client).await?;
    for (i, name) in names.iter().enumerate() {
        if i == names.len() / 2 {
            Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
                .delete(&holder, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting the leader pod {holder}"))?;
        }
        change_configmap(client, &ns.name, name, "2").await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for name in &names {
        expect_replica_sets(client, &ns.name, name, 2).await?;
    }
    // The deleted replica released the Lease on its way out; the other one holds it now.
    wait_for("the other replica to hold the Lease", TIMEOUT, || async {
        let next = leader(client).await?;
        Ok((next != holder).then_some(()))
    })
    .await?;
    ns.cleanup().await
}

/// With two Ready replicas and minAvailable 1, of two evictions at once one is allowed and the other
/// refused.
async fn pdb_refuses_the_last_replica(client: &Client) -> Result<()> {
    let pods = wait_for(
        "two Ready rekindle pods",
        Duration::from_secs(120),
        || async {
            let pods = ready_pods(client, RELEASE_NS).await?;
            Ok((pods.len() == 2).then_some(pods))
        },
    )
    .await?;
    // The PDB controller's view must have caught up with the pods (after an upgrade it may still count
    // a replica of the old revision).
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), RELEASE_NS);
    wait_for("the PDB to count two healthy replicas", TIMEOUT, || async {
        let status = pdbs.get("rekindle").await?.status.unwrap_or_default();
        Ok((status.current_healthy == 2 && status.disruptions_allowed == 1).then_some(()))
    })
    .await?;
    // Both evictions at once (as `kubectl drain` of two nodes would ask): the replacement of the first
    // cannot be Ready yet, so exactly one may pass.
    let evict = |pod: String| {
        std::thread::spawn(move || {
            let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                              "metadata": {"name": pod, "namespace": RELEASE_NS}});
            let file = std::env::temp_dir().join(format!("eviction-{pod}.json"));
            std::fs::write(&file, body.to_string())?;
            let path = format!("/api/v1/namespaces/{RELEASE_NS}/pods/{pod}/eviction");
            let out = Command::new("kubectl")
                .args(["create", "--raw", &path, "-f"])
                .arg(&file)
                .output()?;
            anyhow::Ok((
                out.status.success(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ))
        })
    };
    let (a, b) = (evict(pods[0].name_any()), evict(pods[1].name_any()));
    let ra = a
        .join()
        .map_err(|_| anyhow!("eviction thread panicked"))??;
    let rb = b
        .join()
        .map_err(|_| anyhow!("eviction thread panicked"))??;
    let refused = |r: &(bool, String)| !r.0 && r.1.contains("TooManyRequests");
    ensure!(
        ra.0 != rb.0 && (refused(&ra) || refused(&rb)),
        "two simultaneous evictions with minAvailable 1: expected one allowed and one refused (429), got {ra:?} and {rb:?}"
    );
    wait_rolled_out(RELEASE_NS)
}

/// An `OnDelete` StatefulSet of three real pods with `rekindle.io/restart: pods` and a PDB allowing
/// one disruption: one change replaces each pod exactly once by eviction, the kubelet stopping each
/// old container gracefully, never more than one pod down, every new pod on the new marker.
async fn on_delete_statefulset_restarted_by_eviction(client: &Client) -> Result<()> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Event;
    let ns = TestNamespace::new(client, "install-podrestart").await?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "db-config"}, "data": {"v": "1"}}),
            )?,
        )
        .await?;
    e2e::apply_value(
        client,
        Some(&ns.name),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "db"},
               "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "db"}}}}),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), &ns.name);
    statefulsets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "db", "annotations": {
                    "reloader.stakater.com/auto": "true", "rekindle.io/restart": "pods"}},
                "spec": {
                    "replicas": 3,
                    "serviceName": "db",
                    "podManagementPolicy": "Parallel",
                    "updateStrategy": {"type": "OnDelete"},
                    "selector": {"matchLabels": {"app": "db"}},
                    "template": {
                        "metadata": {"labels": {"app": "db"}},
                        "spec": {
                            "terminationGracePeriodSeconds": 5,
                            "containers": [{"name": "db", "image": WORKLOAD_IMAGE,
                                "imagePullPolicy": "Never",
                                "envFrom": [{"configMapRef": {"name": "db-config"}}]}],
                        },
                    },
                },
            }))?,
        )
        .await?;
    let marker = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.env.as_ref())
            .and_then(|env| {
                env.iter()
                    .find(|e| e.name == "STAKATER_DB_CONFIG_CONFIGMAP")
            })
            .and_then(|e| e.value.clone())
    };
    let up = |pods: &[Pod]| {
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && e2e::node::is_ready(p))
            .count()
    };
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let before = wait_for("three Ready pods of db, stamped", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=db"))
            .await?
            .items;
        let stamped = list.iter().all(|p| marker(p).is_some());
        Ok((list.len() == 3 && up(&list) == 3 && stamped).then_some(list))
    })
    .await?;
    let old_marker = marker(&before[0]);
    let old_uids: Vec<String> = before.iter().map(|p| p.uid().unwrap_or_default()).collect();
    let pdbs = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        client.clone(),
        &ns.name,
    );
    wait_for("the PDB to allow one disruption", TIMEOUT, || async {
        let status = pdbs.get("db").await?.status.unwrap_or_default();
        Ok((status.disruptions_allowed == 1).then_some(()))
    })
    .await?;

    change_configmap(client, &ns.name, "db-config", "2").await?;
    let mut seen_uids: std::collections::BTreeSet<String> = old_uids.iter().cloned().collect();
    let mut most_down = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    let after = loop {
        let list = pods
            .list(&ListParams::default().labels("app=db"))
            .await?
            .items;
        most_down = most_down.max(3usize.saturating_sub(up(&list)));
        seen_uids.extend(list.iter().filter_map(|p| p.uid()));
        let done = list.len() == 3
            && up(&list) == 3
            && list.iter().all(|p| {
                !old_uids.contains(&p.uid().unwrap_or_default()) && marker(p) != old_marker
            });
        if done {
            break list;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the pods were not all replaced: {:#?}",
            list.iter()
                .map(|p| (p.name_any(), p.uid(), marker(p), e2e::node::is_ready(p)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(
        most_down <= 1,
        "at most one pod down at a time, saw {most_down}"
    );
    ensure!(
        seen_uids.len() == 6,
        "each pod replaced exactly once: {} pods seen, {after:#?}",
        seen_uids.len()
    );
    // The kubelet stopped each old container (graceful termination), and the walk said it finished.
    let events = Api::<Event>::namespaced(client.clone(), &ns.name);
    wait_for("the kubelet's and rekindle's Events", TIMEOUT, || async {
        let all = events.list(&ListParams::default()).await?.items;
        let killed = all
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("Killing")
                    && e.involved_object
                        .uid
                        .as_ref()
                        .is_some_and(|u| old_uids.contains(u))
            })
            .count();
        let finished = all
            .iter()
            .any(|e| e.reason.as_deref() == Some("PodRestartsFinished"));
        Ok((killed == 3 && finished).then_some(()))
    })
    .await?;
    let sts = statefulsets.get("db").await?;
    ensure!(
        sts.metadata.generation == Some(2),
        "the template written once: generation {:?}",
        sts.metadata.generation
    );
    ns.cleanup().await
}

/// Workloads in kube-system, in the release namespace, in a namespace labelled
/// rekindle.io/admission=disabled, or labelled so themselves never reach the webhook.
async fn excluded_never_sent(client: &Client) -> Result<()> {
    let labelled_ns = TestNamespace::new(client, "install-optout").await?;
    kubectl(&[
        "label",
        "namespace",
        &labelled_ns.name,
        "rekindle.io/admission=disabled",
    ])?;
    let plain_ns = TestNamespace::new(client, "install-optin").await?;
    let before = webhook_calls()?;
    let cases = [
        ("kube-system", "excluded-system", json!({})),
        (RELEASE_NS, "excluded-release", json!({})),
        (labelled_ns.name.as_str(), "excluded-ns", json!({})),
        (
            plain_ns.name.as_str(),
            "excluded-label",
            json!({"rekindle.io/admission": "disabled"}),
        ),
    ];
    for (ns, name, labels) in &cases {
        let created = workload(client, ns, name, labels.clone()).await?;
        ensure!(
            markers(&created).is_empty(),
            "{ns}/{name} was stamped: {:?}",
            markers(&created)
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = webhook_calls()?;
    ensure!(
        after == before,
        "the apiserver called the webhook {} time(s) for excluded workloads",
        after - before
    );
    // The positive control: the same workload in a plain namespace is sent and stamped.
    let created = workload(client, &plain_ns.name, "included", json!({})).await?;
    ensure!(
        !markers(&created).is_empty(),
        "a workload in {} was not stamped",
        plain_ns.name
    );
    ensure!(
        webhook_calls()? > after,
        "the apiserver's webhook counter did not move for an included workload"
    );
    for (ns, name, _) in &cases[..2] {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await?;
        Api::<ConfigMap>::namespaced(client.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await?;
        Api::<Secret>::namespaced(client.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await?;
    }
    labelled_ns.cleanup().await?;
    plain_ns.cleanup().await
}

/// The serving certificate a rekindle pod presents on its webhook port, verified against `ca_pem` for
/// the Service's name, as the apiserver verifies it.
async fn served_certificate(pod_ip: &str, ca_pem: &[u8]) -> Result<Vec<u8>> {
    use rustls::pki_types::ServerName;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pem_to_der(ca_pem)?.into())?;
    let config = rustls::ClientConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect((pod_ip, 9443)).await?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(
            ServerName::try_from("rekindle.rekindle.svc")?.to_owned(),
            tcp,
        )
        .await?;
    let (_, conn) = tls.get_ref();
    let chain = conn
        .peer_certificates()
        .ok_or_else(|| anyhow!("no certificate served"))?;
    Ok(chain[0].to_vec())
}

fn pem_to_der(pem: &[u8]) -> Result<Vec<u8>> {
    let text = std::str::from_utf8(pem)?;
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}

async fn tls_secret(client: &Client, name: &str) -> Result<BTreeMap<String, Vec<u8>>> {
    let secret = Api::<Secret>::namespaced(client.clone(), RELEASE_NS)
        .get(name)
        .await?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect())
}

async fn ca_bundle(client: &Client) -> Result<Vec<u8>> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let config = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("rekindle")
        .await?;
    let hook = config
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .find(|w| w.name == WEBHOOK);
    Ok(hook
        .and_then(|w| w.client_config.ca_bundle)
        .map(|b| b.0)
        .unwrap_or_default())
}

fn pod_ip(p: &Pod) -> Result<String> {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or_else(|| anyhow!("{} has no address", p.name_any()))
}

/// After `helm uninstall`: the webhook configuration is gone and a workload is admitted unchanged, and
/// nothing of the release is left in its namespace but `kept`: the Secrets the user made, or those
/// cert-manager keeps after their Certificate is gone (certs-gen's Secrets and the leader Lease are
/// removed by the pre-delete hook).
async fn uninstall_and_check_leftovers(client: &Client, kept: &[&str]) -> Result<()> {
    helm(&["uninstall", "rekindle", "-n", RELEASE_NS, "--wait"])?;
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    wait_for(
        "rekindle's pods to be gone after uninstall",
        TIMEOUT,
        || async {
            Ok(pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=rekindle"))
                .await?
                .items
                .is_empty()
                .then_some(()))
        },
    )
    .await?;
    let webhooks = kubectl(&["get", "mutatingwebhookconfigurations", "-o", "name"])?;
    ensure!(
        !webhooks.contains("rekindle"),
        "webhook configuration left after uninstall: {webhooks}"
    );
    let ns = TestNamespace::new(client, "install-after").await?;
    let created = workload(client, &ns.name, "after", json!({})).await?;
    ensure!(
        markers(&created).is_empty(),
        "a workload created after uninstall was stamped"
    );
    ns.cleanup().await?;
    let left = kubectl(&[
        "-n",
        RELEASE_NS,
        "get",
        "deployments,replicasets,pods,services,endpoints,serviceaccounts,roles,rolebindings,configmaps,secrets,jobs,poddisruptionbudgets,leases",
        "-o",
        "name",
    ])?;
    let left: Vec<&str> = left
        .lines()
        .filter(|l| !l.is_empty())
        .filter(|l| *l != "serviceaccount/default" && *l != "configmap/kube-root-ca.crt")
        .filter(|l| !l.starts_with("pod/") || !l.contains("rekindle-test"))
        .collect();
    eprintln!("left in {RELEASE_NS} after uninstall: {left:?}");
    let expected: Vec<String> = kept.iter().map(|s| format!("secret/{s}")).collect();
    for e in &expected {
        ensure!(left.contains(&e.as_str()), "{e} must stay after uninstall");
    }
    let unexpected: Vec<&&str> = left
        .iter()
        .filter(|l| !expected.iter().any(|e| e == *l))
        .collect();
    ensure!(
        unexpected.is_empty(),
        "left after uninstall: {unexpected:?}"
    );
    let cluster = kubectl(&[
        "get",
        "clusterroles,clusterrolebindings",
        "-l",
        "app.kubernetes.io/instance=rekindle",
        "-o",
        "name",
    ])?;
    ensure!(
        cluster.trim().is_empty(),
        "cluster-scoped objects left after uninstall: {cluster}"
    );
    kubectl(&[
        "delete",
        "namespace",
        RELEASE_NS,
        "--wait=true",
        "--timeout=120s",
    ])?;
    Ok(())
}

/// Runs a test body; when it fails, prints what a user would look at first.
async fn diagnosed(body: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    let result = body.await;
    if result.is_err() {
        diagnose(RELEASE_NS);
    }
    result
}

/// The README's install command, `helm install rekindle charts/rekindle -n rekindle --create-namespace`,
/// with these `--set` values; on failure it prints what a user would look at.
fn helm_install(values: &[&str]) -> Result<()> {
    helm_install_quiet(values).inspect_err(|_| diagnose(RELEASE_NS))?;
    Ok(())
}

/// The same install, its error returned as is (for a test that expects it to fail).
fn helm_install_quiet(values: &[&str]) -> Result<String> {
    let mut args = vec![
        "install",
        "rekindle",
        "charts/rekindle",
        "-n",
        "rekindle",
        "--create-namespace",
    ];
    for v in values {
        args.extend(["--set", v]);
    }
    helm(&args)
}

fn deployment_args(ns: &str) -> Result<String> {
    kubectl(&[
        "-n",
        ns,
        "get",
        "deployment",
        "rekindle",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].args}",
    ])
}

/// The README's default-free install (`certs.mode=certsGen`), then upgrade, rollback, `helm test`, HA,
/// the PDB and uninstall, all through the chart's own webhook.
async fn certs_gen_install_upgrade_rollback_uninstall_body() -> Result<()> {
    let client = client().await?;
    helm_install(&["certs.mode=certsGen"])?;
    wait_rolled_out(RELEASE_NS)?;
    let pods = ready_pods(&client, RELEASE_NS).await?;
    ensure!(
        pods.len() == 2,
        "expected 2 Ready replicas, found {}",
        pods.len()
    );
    check_container_processes(2)?;

    // certs-gen's hook Jobs made the Secret and set the caBundle to its CA.
    let tls = tls_secret(&client, "rekindle-tls").await?;
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        ensure!(
            tls.get(key).is_some_and(|v| !v.is_empty()),
            "rekindle-tls has no {key}"
        );
    }
    ensure!(
        ca_bundle(&client).await? == tls["ca.crt"],
        "the webhook's caBundle is not the Secret's ca.crt"
    );
    let served = served_certificate(&pod_ip(&pods[0])?, &tls["ca.crt"]).await?;
    ensure!(
        served == pem_to_der(&tls["tls.crt"])?,
        "the pod does not serve rekindle-tls's certificate"
    );

    excluded_never_sent(&client).await?;
    stamps_and_reloads(&client, "install-reload").await?;
    leader_deleted_mid_burst(&client).await?;
    wait_rolled_out(RELEASE_NS)?;

    // helm upgrade with a changed value rolls rekindle; a change made while it rolls is reloaded once.
    let ns = TestNamespace::new(&client, "install-upgrade").await?;
    workload(&client, &ns.name, "app", json!({})).await?;
    expect_replica_sets(&client, &ns.name, "app", 1).await?;
    let revision_before = kubectl(&[
        "-n",
        RELEASE_NS,
        "get",
        "deployment",
        "rekindle",
        "-o",
        "jsonpath={.metadata.generation}",
    ])?;
    helm(&[
        "upgrade",
        "rekindle",
        "charts/rekindle",
        "-n",
        "rekindle",
        "--reuse-values",
        "--set",
        "rekindle.reloadStrategy=annotations",
    ])?;
    change_configmap(&client, &ns.name, "app", "2").await?;
    wait_rolled_out(RELEASE_NS)?;
    let revision_after = kubectl(&[
        "-n",
        RELEASE_NS,
        "get",
        "deployment",
        "rekindle",
        "-o",
        "jsonpath={.metadata.generation}",
    ])?;
    ensure!(
        revision_after != revision_before,
        "helm upgrade did not roll rekindle"
    );
    ensure!(
        deployment_args(RELEASE_NS)?.contains("annotations"),
        "the upgraded Deployment does not run the annotations strategy"
    );
    expect_replica_sets(&client, &ns.name, "app", 2).await?;
    // A replica of the old revision leads until it has terminated; the next change is the new one's.
    wait_for(
        "a replica of the upgraded revision to hold the Lease",
        TIMEOUT,
        || async {
            let holder = leader(&client).await?;
            let current = ready_pods(&client, RELEASE_NS).await?;
            Ok(current.iter().any(|p| p.name_any() == holder).then_some(()))
        },
    )
    .await?;
    change_configmap(&client, &ns.name, "app", "3").await?;
    expect_replica_sets(&client, &ns.name, "app", 3).await?;
    let d = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get("app")
        .await?;
    let template_annotations = d
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    ensure!(
        template_annotations.contains_key("reloader.stakater.com/last-reloaded-from"),
        "after the upgrade the reload did not use the annotations strategy: {template_annotations:?}"
    );

    // helm rollback returns to the first revision's values, and reloads keep working.
    helm(&[
        "rollback",
        "rekindle",
        "1",
        "-n",
        "rekindle",
        "--wait",
        "--timeout",
        "180s",
    ])?;
    wait_rolled_out(RELEASE_NS)?;
    ensure!(
        !deployment_args(RELEASE_NS)?.contains("annotations"),
        "rollback left the annotations strategy"
    );
    change_configmap(&client, &ns.name, "app", "4").await?;
    expect_replica_sets(&client, &ns.name, "app", 4).await?;
    ns.cleanup().await?;

    let out = helm(&["test", "rekindle", "-n", "rekindle", "--timeout", "120s"])
        .inspect_err(|_| diagnose(RELEASE_NS))?;
    ensure!(
        out.contains("Succeeded"),
        "helm test did not succeed: {out}"
    );

    pdb_refuses_the_last_replica(&client).await?;
    uninstall_and_check_leftovers(&client, &[]).await
}

/// certsGen with a certificate inside its renewal window: the renewal CronJob renews it without a
/// `helm upgrade`, and the running pods serve the new one without a restart.
async fn certs_gen_renewal_is_served_without_restart_body() -> Result<()> {
    let client = client().await?;
    helm_install(&["certs.mode=certsGen", "certs.certsGen.days=20"])?;
    wait_rolled_out(RELEASE_NS)?;
    let before = tls_secret(&client, "rekindle-tls").await?;
    let pods: BTreeMap<String, String> = ready_pods(&client, RELEASE_NS)
        .await?
        .iter()
        .map(|p| Ok((p.uid().unwrap_or_default(), pod_ip(p)?)))
        .collect::<Result<_>>()?;
    // The renewal CronJob's run, now rather than at its schedule: no `helm upgrade` involved.
    kubectl(&[
        "-n",
        RELEASE_NS,
        "create",
        "job",
        "renew-now",
        "--from=cronjob/rekindle-certs-gen-renew",
    ])?;
    kubectl(&[
        "-n",
        RELEASE_NS,
        "wait",
        "--for=condition=complete",
        "job/renew-now",
        "--timeout=120s",
    ])?;
    kubectl(&[
        "-n",
        RELEASE_NS,
        "delete",
        "job",
        "renew-now",
        "--wait=true",
    ])?;
    let after = tls_secret(&client, "rekindle-tls").await?;
    ensure!(
        after["tls.crt"] != before["tls.crt"],
        "a certificate 20 days from expiry was not renewed by the CronJob"
    );
    let renewed = pem_to_der(&after["tls.crt"])?;
    // The kubelet updates the mounted Secret, rekindle reloads the pair from its files.
    for ip in pods.values() {
        wait_for(
            &format!("the pod at {ip} to serve the renewed certificate"),
            Duration::from_secs(150),
            || async {
                let served = served_certificate(ip, &after["ca.crt"]).await?;
                Ok((served == renewed).then_some(()))
            },
        )
        .await?;
    }
    let now: Vec<Pod> = ready_pods(&client, RELEASE_NS).await?;
    for p in &now {
        ensure!(
            pods.contains_key(&p.uid().unwrap_or_default()),
            "pod {} is new: rekindle was restarted",
            p.name_any()
        );
        let restarts: i32 = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0);
        ensure!(
            restarts == 0,
            "pod {} restarted {restarts} time(s)",
            p.name_any()
        );
    }
    stamps_and_reloads(&client, "install-renewed").await?;
    uninstall_and_check_leftovers(&client, &[]).await
}

/// `certs.mode=external` with a certificate made by certs-gen.
async fn external_certificate_install_body() -> Result<()> {
    let client = client().await?;
    let dir = tempfile::tempdir()?;
    let certs_gen = root().join("target/debug/certs-gen");
    run(
        certs_gen.to_str().unwrap_or_default(),
        &[
            "local",
            "--out",
            dir.path().to_str().unwrap_or_default(),
            "--webhook-host",
            "rekindle.rekindle.svc",
        ],
    )?;
    kubectl(&["create", "namespace", RELEASE_NS])?;
    let path = |f: &str| dir.path().join(f).to_string_lossy().into_owned();
    kubectl(&[
        "-n",
        RELEASE_NS,
        "create",
        "secret",
        "tls",
        "corp-webhook-tls",
        &format!("--cert={}", path("webhook.crt")),
        &format!("--key={}", path("webhook.key")),
    ])?;
    let ca =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(dir.path().join("ca.crt"))?);
    let ca_value = format!("certs.external.caBundle={ca}");
    helm_install(&[
        "certs.mode=external",
        "certs.secretName=corp-webhook-tls",
        &ca_value,
    ])?;
    wait_rolled_out(RELEASE_NS)?;
    stamps_and_reloads(&client, "install-external").await?;
    on_delete_statefulset_restarted_by_eviction(&client).await?;
    uninstall_and_check_leftovers(&client, &["corp-webhook-tls"]).await
}

/// `kubectl apply -f webhook-config/` (the README's install without Helm) on a clean cluster.
async fn webhook_config_manifests_install_body() -> Result<()> {
    let client = client().await?;
    kubectl(&["create", "namespace", RELEASE_NS])?;
    kubectl(&["apply", "-f", "webhook-config/rekindle.yaml"])?;
    kubectl(&["apply", "-f", "webhook-config/certs-gen.yaml"])?;
    kubectl(&[
        "-n",
        RELEASE_NS,
        "wait",
        "--for=condition=complete",
        "job",
        "--all",
        "--timeout=180s",
    ])
    .inspect_err(|_| diagnose(RELEASE_NS))?;
    wait_rolled_out(RELEASE_NS)?;
    wait_for("the caBundle to be set", TIMEOUT, || async {
        Ok((!ca_bundle(&client).await?.is_empty()).then_some(()))
    })
    .await?;
    stamps_and_reloads(&client, "install-manifests").await?;
    kubectl(&[
        "delete",
        "-f",
        "webhook-config/certs-gen.yaml",
        "--ignore-not-found",
        "--wait=true",
    ])?;
    kubectl(&[
        "delete",
        "-f",
        "webhook-config/rekindle.yaml",
        "--ignore-not-found",
        "--wait=true",
    ])?;
    kubectl(&[
        "delete",
        "namespace",
        RELEASE_NS,
        "--wait=true",
        "--timeout=120s",
    ])?;
    Ok(())
}

/// The chart's default mode (`certs.mode=certManager`) on a cluster without cert-manager: the install
/// stops before creating anything, with a message that names cert-manager and the other modes.
async fn cert_manager_mode_without_cert_manager_body() -> Result<()> {
    let err = match helm_install_quiet(&[]) {
        Ok(out) => anyhow::bail!("installed without cert-manager: {out}"),
        Err(e) => format!("{e:#}"),
    };
    for want in [
        "needs cert-manager",
        "certs.mode=certsGen",
        "certs.mode=external",
    ] {
        ensure!(err.contains(want), "{want:?} not in: {err}");
    }
    ensure!(
        !err.contains("no matches for kind"),
        "the raw API error reached the user: {err}"
    );
    let releases = helm(&["list", "-n", RELEASE_NS, "-q"])?;
    ensure!(releases.trim().is_empty(), "a release was left: {releases}");
    Ok(())
}

/// Waits until each CRD is served (`kubectl wait` fails on a CRD whose status is not written yet).
async fn crds_established(names: &[&str]) -> Result<()> {
    for name in names {
        wait_for(&format!("CRD {name} established"), TIMEOUT, || async {
            let status = kubectl(&[
                "get",
                "crd",
                name,
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#,
            ])?;
            Ok((status.trim() == "True").then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// The kubeconfig's client certificate, key and CA files (the node's admin), for scraping the
/// apiserver.
fn admin_credentials(kubeconfig: &std::path::Path) -> Result<(String, String, String)> {
    let kc: Value = serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig)?)?;
    let user = &kc["users"][0]["user"];
    let cluster = &kc["clusters"][0]["cluster"];
    let field = |v: &Value, k: &str| {
        v[k].as_str()
            .map(String::from)
            .ok_or_else(|| anyhow!("kubeconfig has no {k} file"))
    };
    Ok((
        field(user, "client-certificate")?,
        field(user, "client-key")?,
        field(cluster, "certificate-authority")?,
    ))
}

/// Prometheus, configured from the chart's ServiceMonitor and PrometheusRule as stored in the API (the
/// scrape jobs the Prometheus Operator would generate; the operator itself does not run here), scrapes
/// every series the README lists from the real pods in both formats, answers every dashboard panel's
/// query after a reload, and fires RekindleReloadsFailing when the chart's RBAC in one namespace is
/// narrowed so rekindle may no longer patch there.
async fn prometheus_scrapes_the_chart_and_fires_its_alert_body() -> Result<()> {
    let client = client().await?;
    let companions = e2e::companions::bin_dir("prometheus")?;
    let crds = companions.join("crds/monitoring.coreos.com.yaml");
    kubectl(&["apply", "--server-side", "-f", &crds.to_string_lossy()])?;
    crds_established(&[
        "servicemonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
    ])
    .await?;
    let (app_ns, denied_ns) = ("prom-app", "prom-denied");
    for ns in [app_ns, denied_ns] {
        kubectl(&[
            "delete",
            "namespace",
            ns,
            "--ignore-not-found",
            "--wait=true",
        ])?;
        kubectl(&["create", "namespace", ns])?;
    }
    helm_install(&[
        "certs.mode=certsGen",
        &format!("rekindle.namespaces={{{app_ns},{denied_ns}}}"),
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        // Fires at the first evaluation that sees a failure: the test cannot wait the default 5m.
        "prometheusRule.alertFor.RekindleReloadsFailing=0s",
        "rekindle.metricsCountByNamespace=true",
    ])?;
    wait_rolled_out(RELEASE_NS)?;
    // Someone narrows rekindle's Role in one namespace: it may read there but no longer patch.
    kubectl(&[
        "-n",
        denied_ns,
        "patch",
        "role",
        "rekindle",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/rules/0/verbs","value":["get","list","watch"]}]"#,
    ])?;

    let monitor: Value = serde_json::from_str(&kubectl(&[
        "-n",
        RELEASE_NS,
        "get",
        "servicemonitor",
        "rekindle",
        "-o",
        "json",
    ])?)?;
    let rule: Value = serde_json::from_str(&kubectl(&[
        "-n",
        RELEASE_NS,
        "get",
        "prometheusrule",
        "rekindle",
        "-o",
        "json",
    ])?)?;
    let kubeconfig = PathBuf::from(std::env::var("KUBECONFIG")?);
    let (cert, key, ca) = admin_credentials(&kubeconfig)?;
    let mut jobs = e2e::prometheus::service_monitor_jobs(
        &monitor,
        &kubeconfig,
        &["OpenMetricsText1.0.0"],
        "1s",
        "/openmetrics",
    )?;
    jobs.extend(e2e::prometheus::service_monitor_jobs(
        &monitor,
        &kubeconfig,
        &["PrometheusText0.0.4"],
        "1s",
        "/classic",
    )?);
    jobs.push(json!({
        "job_name": "apiserver", "scheme": "https",
        "static_configs": [{"targets": ["127.0.0.1:6443"]}],
        "tls_config": {"cert_file": cert, "key_file": key, "ca_file": ca},
    }));
    // The kubelet's resource metrics carry container_memory_working_set_bytes by pod and container
    // (its cAdvisor endpoint cannot name containerd's containers on this node).
    jobs.push(json!({
        "job_name": "kubelet", "scheme": "https", "metrics_path": "/metrics/resource",
        "static_configs": [{"targets": ["10.200.0.1:10250"]}],
        "tls_config": {"insecure_skip_verify": true},
    }));
    let config = json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": jobs,
    });
    let dir = tempfile::tempdir()?;
    let prometheus = e2e::prometheus::Prometheus::start(
        &companions.join("prometheus"),
        dir.path(),
        &config,
        &rule["spec"]["groups"],
    )
    .await?;
    let result = prometheus_checks(&client, &prometheus, app_ns, denied_ns).await;
    if result.is_err() {
        eprintln!("--- prometheus log ---\n{}", prometheus.log_tail());
    }
    drop(prometheus);
    for ns in [app_ns, denied_ns] {
        kubectl(&[
            "delete",
            "namespace",
            ns,
            "--ignore-not-found",
            "--wait=false",
        ])?;
    }
    result
}

async fn prometheus_checks(
    client: &Client,
    prometheus: &e2e::prometheus::Prometheus,
    app_ns: &str,
    denied_ns: &str,
) -> Result<()> {
    // Both replicas, in both formats, and the apiserver and the kubelet.
    wait_for(
        "every scrape target up",
        Duration::from_secs(60),
        || async {
            let targets = prometheus.targets().await?;
            let up = |job: &str| {
                targets
                    .iter()
                    .filter(|t| {
                        t["labels"]["job"].as_str().is_some_and(|j| j == job)
                            || t["scrapePool"].as_str().is_some_and(|p| p.ends_with(job))
                    })
                    .filter(|t| t["health"] == "up")
                    .count()
            };
            let counts = [
                up("/0/openmetrics"),
                up("/0/classic"),
                up("apiserver"),
                up("kubelet"),
            ];
            if counts != [2, 2, 1, 1] {
                bail!("up per job: {counts:?}; targets: {targets:?}");
            }
            Ok(Some(()))
        },
    )
    .await?;

    // The webhook failing open once (no replica to answer), for the fail-open panel.
    kubectl(&[
        "-n",
        RELEASE_NS,
        "scale",
        "deployment",
        "rekindle",
        "--replicas=0",
    ])?;
    kubectl(&[
        "-n",
        RELEASE_NS,
        "wait",
        "--for=delete",
        "pod",
        "-l",
        "app.kubernetes.io/name=rekindle",
        "--timeout=120s",
    ])?;
    let unstamped = deployment("unstamped", "absent", "absent", json!({}))?;
    Api::<Deployment>::namespaced(client.clone(), app_ns)
        .create(&PostParams::default(), &unstamped)
        .await?;
    kubectl(&[
        "-n",
        RELEASE_NS,
        "scale",
        "deployment",
        "rekindle",
        "--replicas=2",
    ])?;
    wait_rolled_out(RELEASE_NS)?;
    ready_pods(client, RELEASE_NS).await?;
    wait_for(
        "rekindle scraped again",
        Duration::from_secs(60),
        || async {
            let ready = prometheus
                .query(r#"sum(rekindle_ready{namespace="rekindle",format="OpenMetricsText1.0.0"})"#)
                .await?;
            let n = ready
                .first()
                .and_then(|r| r["value"][1].as_str())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            if n < 1.0 {
                bail!("rekindle_ready sum {n}");
            }
            Ok(Some(()))
        },
    )
    .await?;

    // What makes every series appear: a reload, a label-only change, an admission lookup of a
    // resource that does not exist, a CronJob Job (read first), and reloads RBAC now forbids.
    workload(client, app_ns, "app", json!({})).await?;
    expect_replica_sets(client, app_ns, "app", 1).await?;
    // Admitted while its resources do not exist: the webhook looks them up (absent).
    Api::<Deployment>::namespaced(client.clone(), app_ns)
        .create(
            &PostParams::default(),
            &deployment("early", "not-yet", "not-yet", json!({}))?,
        )
        .await?;
    change_configmap(client, app_ns, "app", "2").await?;
    expect_replica_sets(client, app_ns, "app", 2).await?;
    Api::<ConfigMap>::namespaced(client.clone(), app_ns)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await?;
    let cronjob: k8s_openapi::api::batch::v1::CronJob = serde_json::from_value(json!({
        "metadata": {"name": "nightly", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}}}
    }))?;
    Api::<k8s_openapi::api::batch::v1::CronJob>::namespaced(client.clone(), app_ns)
        .create(&PostParams::default(), &cronjob)
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    change_configmap(client, app_ns, "app", "3").await?;
    workload(client, denied_ns, "app", json!({})).await?;
    for v in ["2", "3"] {
        change_configmap(client, denied_ns, "app", v).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let series = e2e::documented_series()?;
    for format in ["OpenMetricsText1.0.0", "PrometheusText0.0.4"] {
        wait_for(
            &format!("every documented series scraped as {format}"),
            Duration::from_secs(90),
            || async {
                let mut missing = Vec::new();
                for name in &series {
                    let q = format!(
                        r#"count({{__name__=~"{name}(_bucket|_count|_sum)?",namespace="rekindle",format="{format}"}})"#
                    );
                    if prometheus.query(&q).await?.is_empty() {
                        missing.push(name.clone());
                    }
                }
                if !missing.is_empty() {
                    bail!("missing {missing:?}");
                }
                Ok(Some(()))
            },
        )
        .await?;
    }

    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(
        root().join("charts/rekindle/dashboards/rekindle.json"),
    )?)?;
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| {
            t["expr"]
                .as_str()
                .map(|e| e.replace("$namespace", RELEASE_NS))
        })
        .collect();
    ensure!(queries.len() >= 10, "dashboard queries: {queries:?}");
    wait_for(
        "every dashboard query returns data",
        Duration::from_secs(90),
        || async {
            let mut empty = Vec::new();
            for q in &queries {
                if prometheus.query(q).await?.is_empty() {
                    empty.push(q.clone());
                }
            }
            if !empty.is_empty() {
                bail!("no data for {empty:#?}");
            }
            Ok(Some(()))
        },
    )
    .await?;

    wait_for(
        "RekindleReloadsFailing firing",
        Duration::from_secs(90),
        || async {
            let alerts = prometheus.alerts().await?;
            let firing = alerts.iter().any(|a| {
                a["labels"]["alertname"] == "RekindleReloadsFailing" && a["state"] == "firing"
            });
            if !firing {
                bail!("alerts: {alerts:?}");
            }
            Ok(Some(()))
        },
    )
    .await?;
    // And nothing else is firing: a healthy release raises no other alert.
    let others: Vec<Value> = prometheus
        .alerts()
        .await?
        .into_iter()
        .filter(|a| a["state"] == "firing" && a["labels"]["alertname"] != "RekindleReloadsFailing")
        .collect();
    ensure!(others.is_empty(), "other alerts firing: {others:?}");
    Ok(())
}

fn rollout(name: &str, configmap: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"canary": {}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                        "envFrom": [{"configMapRef": {"name": configmap}}]}],
                },
            },
        },
    })
}

/// The running pods of a Rollout: (pod UID, ReplicaSet name).
async fn rollout_pods(client: &Client, ns: &str, app: &str) -> Result<Vec<(String, String)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| {
            let owner = p
                .metadata
                .owner_references
                .as_ref()
                .and_then(|o| o.first())
                .map(|o| o.name.clone())
                .unwrap_or_default();
            (p.metadata.uid.unwrap_or_default(), owner)
        })
        .collect())
}

/// The Argo Rollouts controller (built from its Go module, run as a host process with the node's
/// kubeconfig) and rekindle installed with `rekindle.isArgoRollouts=true`: a Rollout with
/// `rollout-strategy: restart` has its pods really restarted on a ConfigMap change (new pods, the same
/// ReplicaSet), and one with the default strategy rolls out a new ReplicaSet.
async fn argo_rollouts_restart_and_rollout_body() -> Result<()> {
    let client = client().await?;
    let companions = e2e::companions::bin_dir("rollouts")?;
    let crds = companions.join("crds/argoproj.io.yaml");
    kubectl(&["apply", "--server-side", "-f", &crds.to_string_lossy()])?;
    crds_established(&["rollouts.argoproj.io", "analysisruns.argoproj.io"]).await?;
    let kubeconfig = std::env::var("KUBECONFIG")?;
    let dir = tempfile::tempdir()?;
    let [metrics, healthz] = e2e::rekindle::free_ports()?.map(|p| p.to_string());
    let mut controller = e2e::companions::HostProcess::start(
        &companions.join("rollouts-controller"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--leader-elect=false",
            "--metricsPort",
            &metrics,
            "--healthzPort",
            &healthz,
        ],
        dir.path().join("rollouts-controller.log"),
    )?;
    let result = async {
        helm_install(&["certs.mode=certsGen", "rekindle.isArgoRollouts=true"])?;
        wait_rolled_out(RELEASE_NS)?;
        let ns = TestNamespace::new(&client, "rollouts").await?;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
        for name in ["restart-cfg", "template-cfg"] {
            cms.create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "1"}}))?,
            )
            .await?;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (rollouts, _) = e2e::resource_for(&client, "argoproj.io/v1alpha1", "Rollout").await?;
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(client.clone(), &ns.name, &rollouts);
        for (name, cm, annotations) in [
            (
                "restarted",
                "restart-cfg",
                json!({"configmap.reloader.stakater.com/reload": "restart-cfg",
                       "reloader.stakater.com/rollout-strategy": "restart"}),
            ),
            (
                "rolled",
                "template-cfg",
                json!({"configmap.reloader.stakater.com/reload": "template-cfg"}),
            ),
        ] {
            api.create(
                &PostParams::default(),
                &serde_json::from_value(rollout(name, cm, annotations))?,
            )
            .await?;
        }
        let mut before = BTreeMap::new();
        for app in ["restarted", "rolled"] {
            let pods = wait_for(&format!("{app}'s 2 pods running"), TIMEOUT, || async {
                let pods = rollout_pods(&client, &ns.name, app).await?;
                Ok((pods.len() == 2).then_some(pods))
            })
            .await?;
            before.insert(app, pods);
        }

        change_configmap(&client, &ns.name, "restart-cfg", "2").await?;
        change_configmap(&client, &ns.name, "template-cfg", "2").await?;

        // restart: every pod replaced, by pods of the same ReplicaSet.
        let old_restarted: Vec<String> = before["restarted"].iter().map(|p| p.0.clone()).collect();
        let rs = before["restarted"][0].1.clone();
        wait_for("the restart strategy's pods replaced", TIMEOUT, || async {
            let pods = rollout_pods(&client, &ns.name, "restarted").await?;
            let replaced =
                pods.len() == 2 && pods.iter().all(|(uid, _)| !old_restarted.contains(uid));
            Ok(replaced.then_some(pods))
        })
        .await
        .and_then(|pods| {
            ensure!(
                pods.iter().all(|(_, owner)| *owner == rs),
                "restart made another ReplicaSet: {pods:?} (was {rs})"
            );
            Ok(())
        })?;
        let restarted = api.get("restarted").await?;
        ensure!(
            restarted.data.pointer("/spec/restartAt").is_some(),
            "rekindle did not set spec.restartAt"
        );

        // Default strategy: a new ReplicaSet whose pods replace the old ones.
        let old_rs = before["rolled"][0].1.clone();
        wait_for("the default strategy's new ReplicaSet", TIMEOUT, || async {
            let pods = rollout_pods(&client, &ns.name, "rolled").await?;
            let moved = pods.len() == 2 && pods.iter().all(|(_, owner)| *owner != old_rs);
            Ok(moved.then_some(()))
        })
        .await?;
        ns.cleanup().await
    }
    .await;
    if result.is_err() {
        eprintln!("--- rollouts-controller ---\n{}", controller.log_tail());
        if let Some(status) = controller.exited() {
            eprintln!("the Rollouts controller exited: {status}");
        }
    }
    drop(controller);
    result
}

const CERT_MANAGER_CRDS: [&str; 6] = [
    "certificates.cert-manager.io",
    "certificaterequests.cert-manager.io",
    "issuers.cert-manager.io",
    "clusterissuers.cert-manager.io",
    "orders.acme.cert-manager.io",
    "challenges.acme.cert-manager.io",
];

/// cert-manager's controller and cainjector (its own packages, `e2e/companions/cert-manager`), run as
/// host processes with the node's kubeconfig, over its real CRDs; stopped, and the CRDs removed, on drop
/// (so a later test sees a cluster without cert-manager).
struct CertManager {
    controller: e2e::companions::HostProcess,
    cainjector: e2e::companions::HostProcess,
    _dir: tempfile::TempDir,
}

impl CertManager {
    async fn start() -> Result<Self> {
        let bin = e2e::companions::bin_dir("cert-manager")?;
        kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &bin.join("crds/cert-manager.io.yaml").to_string_lossy(),
        ])?;
        crds_established(&CERT_MANAGER_CRDS).await?;
        // A namespace an earlier run left terminating refuses new objects: start from none.
        kubectl(&[
            "delete",
            "namespace",
            "cert-manager",
            "--ignore-not-found",
            "--wait=true",
        ])?;
        kubectl(&["create", "namespace", "cert-manager"])?;
        let kubeconfig = std::env::var("KUBECONFIG")?;
        let dir = tempfile::tempdir()?;
        let run = |what: &str| {
            e2e::companions::HostProcess::start(
                &bin.join("cert-manager-e2e"),
                &[what, "--kubeconfig", &kubeconfig],
                dir.path().join(format!("{what}.log")),
            )
        };
        Ok(Self {
            controller: run("controller")?,
            cainjector: run("cainjector")?,
            _dir: dir,
        })
    }

    fn logs(&self) -> String {
        format!(
            "--- cert-manager controller ---\n{}\n--- cainjector ---\n{}",
            self.controller.log_tail(),
            self.cainjector.log_tail()
        )
    }
}

impl Drop for CertManager {
    fn drop(&mut self) {
        let _ = kubectl(&[
            "delete",
            "namespace",
            "cert-manager",
            "--ignore-not-found",
            "--wait=false",
        ]);
        let mut args = vec!["delete", "crd", "--ignore-not-found", "--wait=true"];
        args.extend(CERT_MANAGER_CRDS);
        let _ = kubectl(&args);
    }
}

/// A Certificate is Ready (cert-manager issued it).
async fn certificate_ready(name: &str) -> Result<()> {
    wait_for(&format!("Certificate {name} Ready"), TIMEOUT, || async {
        let status = kubectl(&[
            "-n",
            RELEASE_NS,
            "get",
            "certificate",
            name,
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
        ])
        .unwrap_or_default();
        Ok((status.trim() == "True").then_some(()))
    })
    .await
}

/// cainjector put the Secret's CA into the webhook configuration.
async fn ca_injected(client: &Client, tls: &BTreeMap<String, Vec<u8>>) -> Result<()> {
    wait_for("cainjector to set the caBundle", TIMEOUT, || async {
        Ok((ca_bundle(client).await? == tls["ca.crt"]).then_some(()))
    })
    .await
}

/// The README's default install, `helm install rekindle charts/rekindle -n rekindle --create-namespace`
/// (certs.mode=certManager), against real cert-manager: the self-signed CA, the CA Issuer and the
/// serving Certificate are issued, cainjector fills the caBundle, reloads work through the webhook, and
/// a renewal (1h certificates renewed 15 s after issue) is served without a restart.
async fn cert_manager_default_install_issues_injects_and_renews_body() -> Result<()> {
    let client = client().await?;
    let cm = CertManager::start().await?;
    let result = async {
        helm_install(&[
            "certs.certManager.duration=1h",
            "certs.certManager.renewBefore=59m45s",
        ])?;
        certificate_ready("rekindle-ca").await?;
        certificate_ready("rekindle-serving").await?;
        wait_rolled_out(RELEASE_NS)?;
        let tls = tls_secret(&client, "rekindle-tls").await?;
        for key in ["tls.crt", "tls.key", "ca.crt"] {
            ensure!(
                tls.get(key).is_some_and(|v| !v.is_empty()),
                "rekindle-tls has no {key}"
            );
        }
        let ca = tls_secret(&client, "rekindle-ca").await?;
        ensure!(
            ca["tls.crt"] == tls["ca.crt"],
            "the serving certificate is not signed by the chart's CA"
        );
        ca_injected(&client, &tls).await?;
        stamps_and_reloads(&client, "cm-reload").await?;

        // Renewal: cert-manager rotates the Secret; the same pods serve the new certificate.
        let pods = ready_pods(&client, RELEASE_NS).await?;
        let uids: Vec<String> = pods.iter().map(|p| p.uid().unwrap_or_default()).collect();
        let first = pem_to_der(&tls["tls.crt"])?;
        let renewed = wait_for(
            "cert-manager to renew the serving certificate",
            TIMEOUT,
            || async {
                let now = tls_secret(&client, "rekindle-tls").await?;
                Ok((pem_to_der(&now["tls.crt"])? != first).then_some(now))
            },
        )
        .await?;
        for p in &pods {
            let ip = pod_ip(p)?;
            wait_for(
                &format!("the pod at {ip} to serve a renewed certificate"),
                Duration::from_secs(150),
                || async {
                    let served = served_certificate(&ip, &renewed["ca.crt"]).await?;
                    Ok((served != first).then_some(()))
                },
            )
            .await?;
        }
        let now: Vec<String> = ready_pods(&client, RELEASE_NS)
            .await?
            .iter()
            .map(|p| p.uid().unwrap_or_default())
            .collect();
        ensure!(
            now == uids,
            "rekindle's pods were replaced: {uids:?} → {now:?}"
        );
        stamps_and_reloads(&client, "cm-renewed").await?;
        // cert-manager keeps a Certificate's Secret when the Certificate goes (its default; the README
        // says so): exactly those two stay.
        uninstall_and_check_leftovers(&client, &["rekindle-tls", "rekindle-ca"]).await
    }
    .await;
    if result.is_err() {
        eprintln!("{}", cm.logs());
    }
    result
}

/// `certs.certManager.issuerRef` naming your own ClusterIssuer (a CA made by cert-manager): the serving
/// certificate comes from it, the chart makes no Issuer of its own, and reloads work.
async fn cert_manager_with_your_cluster_issuer_body() -> Result<()> {
    let client = client().await?;
    let cm = CertManager::start().await?;
    let result = async {
        let issuers = r#"
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: bootstrap}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: platform-ca, namespace: cert-manager}
spec:
  isCA: true
  commonName: platform-ca
  secretName: platform-ca
  privateKey: {algorithm: ECDSA, size: 256}
  issuerRef: {name: bootstrap, kind: ClusterIssuer, group: cert-manager.io}
---
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: platform}
spec: {ca: {secretName: platform-ca}}
"#;
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("issuers.yaml");
        std::fs::write(&file, issuers)?;
        kubectl(&["apply", "-f", &file.to_string_lossy()])?;
        helm_install(&[
            "certs.certManager.issuerRef.name=platform",
            "certs.certManager.issuerRef.kind=ClusterIssuer",
            "certs.certManager.issuerRef.group=cert-manager.io",
        ])?;
        certificate_ready("rekindle-serving").await?;
        wait_rolled_out(RELEASE_NS)?;
        let issuers_made = kubectl(&["-n", RELEASE_NS, "get", "issuers", "-o", "name"])?;
        ensure!(
            issuers_made.trim().is_empty(),
            "the chart made Issuers beside the given ClusterIssuer: {issuers_made}"
        );
        let platform_ca = Api::<Secret>::namespaced(client.clone(), "cert-manager")
            .get("platform-ca")
            .await?
            .data
            .unwrap_or_default();
        let tls = tls_secret(&client, "rekindle-tls").await?;
        ensure!(
            platform_ca.get("tls.crt").map(|b| &b.0) == tls.get("ca.crt"),
            "the serving certificate is not signed by the ClusterIssuer's CA"
        );
        ca_injected(&client, &tls).await?;
        stamps_and_reloads(&client, "cm-issuer").await?;
        uninstall_and_check_leftovers(&client, &["rekindle-tls"]).await?;
        for name in ["platform", "bootstrap"] {
            kubectl(&["delete", "clusterissuer", name, "--ignore-not-found"])?;
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("{}", cm.logs());
    }
    result
}

macro_rules! install_test {
    ($($name:ident => $body:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() -> Result<()> {
            let _one = ONE_AT_A_TIME.lock().await;
            fresh_start()?;
            diagnosed($body()).await
        }
    )*};
}

install_test! {
    certs_gen_install_upgrade_rollback_uninstall => certs_gen_install_upgrade_rollback_uninstall_body,
    certs_gen_renewal_is_served_without_restart => certs_gen_renewal_is_served_without_restart_body,
    external_certificate_install => external_certificate_install_body,
    webhook_config_manifests_install => webhook_config_manifests_install_body,
    cert_manager_mode_without_cert_manager => cert_manager_mode_without_cert_manager_body,
    prometheus_scrapes_the_chart_and_fires_its_alert => prometheus_scrapes_the_chart_and_fires_its_alert_body,
    argo_rollouts_restart_and_rollout => argo_rollouts_restart_and_rollout_body,
    cert_manager_default_install_issues_injects_and_renews => cert_manager_default_install_issues_injects_and_renews_body,
    cert_manager_with_your_cluster_issuer => cert_manager_with_your_cluster_issuer_body,
    secrets_store_csi_driver => secrets_store_csi_driver_body,
}
