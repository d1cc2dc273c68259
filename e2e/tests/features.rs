//! Pause, create/delete handling and scope flags through the real apiserver (behaviour §10–§11).

use std::time::Duration;

use anyhow::Result;
use e2e::fixtures::{deployment, env_value, generation};
use e2e::policy::{refuse_new_pods, Policy};
use e2e::rekindle::{Options, Rekindle};
use e2e::{
    admin_client, apply_value, apply_yaml, dynamic_api, expect_replica_sets, get_json,
    replica_sets, wait_for, wait_replica_sets, TestNamespace, TIMEOUT,
};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

const CM: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config}\ndata: {greeting: hello}\n";

async fn change_cm(client: &Client, ns: &str, name: &str, value: &str) -> Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"greeting": value}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn pause_period_holds_the_rollout_and_survives_a_restart() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-pause").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    deployment("web").annotations(json!({"reloader.stakater.com/auto": "true", "deployment.reloader.stakater.com/pause-period": "15s"})).uses_configmap("app-config").apply(&client, &ns.name).await?;
    deployment("bad").annotations(json!({"reloader.stakater.com/auto": "true", "deployment.reloader.stakater.com/pause-period": "soon"})).uses_configmap("app-config").apply(&client, &ns.name).await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    change_cm(&client, &ns.name, "app-config", "one").await?;
    let paused = wait_for("web to be paused by rekindle", TIMEOUT, || async {
        let d = get_json(&deployments, "web").await?;
        Ok((d.pointer("/spec/paused") == Some(&json!(true))).then_some(d))
    })
    .await?;
    let paused_at: jiff::Timestamp = paused
        .pointer("/metadata/annotations/deployment.reloader.stakater.com~1paused-at")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("no paused-at: {paused}"))?
        .parse()?;
    // Restart rekindle mid-pause: the state is in the object, so it still resumes.
    rk.kill().await?;
    rk.restart().await?;
    // A change during the pause is written to the paused template and rolls out with the resume.
    let first = env_value(&paused, "STAKATER_APP_CONFIG_CONFIGMAP");
    change_cm(&client, &ns.name, "app-config", "two").await?;
    let during = wait_for(
        "the second change in the paused template",
        TIMEOUT,
        || async {
            let d = get_json(&deployments, "web").await?;
            let value = env_value(&d, "STAKATER_APP_CONFIG_CONFIGMAP");
            Ok((value.is_some() && value != first).then_some(d))
        },
    )
    .await?;
    assert_eq!(
        during.pointer("/spec/paused"),
        Some(&json!(true)),
        "still paused"
    );
    wait_for("web to be resumed after the period", TIMEOUT, || async {
        let d = get_json(&deployments, "web").await?;
        let resumed = d.pointer("/spec/paused") != Some(&json!(true))
            && d.pointer("/metadata/annotations/deployment.reloader.stakater.com~1paused-at")
                .is_none();
        Ok(resumed.then_some(()))
    })
    .await?;
    assert!(
        jiff::Timestamp::now() >= paused_at + jiff::SignedDuration::from_secs(15),
        "resumed before its period was over"
    );
    wait_for("web's new ReplicaSet to take over", TIMEOUT, || async {
        let rs = replica_sets(&client, &ns.name, "web").await?;
        Ok(
            (rs.len() == 2 && rs.iter().any(|(_, spec, ready)| *spec == 1 && *ready == 1))
                .then_some(()),
        )
    })
    .await?;
    // An invalid period: Warning Event, reload without pause.
    let bad = get_json(&deployments, "bad").await?;
    assert_ne!(bad.pointer("/spec/paused"), Some(&json!(true)));
    wait_replica_sets(
        &client,
        &ns.name,
        "bad",
        3,
        "bad to roll for each change, without pause",
    )
    .await?;
    let events = Api::<Event>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default().fields("reason=InvalidAnnotation"))
        .await?;
    assert!(
        events
            .items
            .iter()
            .any(|e| e.message.as_deref().unwrap_or("").contains("pause-period")),
        "a Warning Event for the period"
    );
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn reload_on_create_and_delete() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-createdel").await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-on-create=true", "--reload-on-delete=true"],
            ..Default::default()
        },
    )
    .await?;
    deployment("web")
        .auto()
        .uses_configmap("later")
        .apply(&client, &ns.name)
        .await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let env = |d: &Value| {
        d.pointer("/spec/template/spec/containers/0/env/0/name")
            .and_then(Value::as_str)
            .map(String::from)
    };
    assert_eq!(env(&get_json(&deployments, "web").await?), None);
    apply_yaml(
        &client,
        Some(&ns.name),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: later}\ndata: {a: '1'}\n",
    )
    .await?;
    wait_for("the created ConfigMap to reload web", TIMEOUT, || async {
        Ok((env(&get_json(&deployments, "web").await?).as_deref()
            == Some("STAKATER_LATER_CONFIGMAP"))
        .then_some(()))
    })
    .await?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .delete("later", &DeleteParams::default())
        .await?;
    wait_for(
        "the deleted ConfigMap's env var to be removed",
        TIMEOUT,
        || async {
            Ok(env(&get_json(&deployments, "web").await?)
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    rk.stop().await?;
    ns.cleanup().await
}

/// A resource the workload only names in `configmap.reloader.stakater.com/reload` (its pod spec does not
/// use it) and that is then deleted, as Reloader handles it: with env vars the marker its update wrote
/// on the first container is removed; with annotations `last-reloaded-from` records the deletion even
/// though no marker was ever written. Each is one more rollout.
#[tokio::test]
async fn deleting_a_resource_the_workload_only_names_reloads_it_in_both_strategies() -> Result<()> {
    let client = admin_client().await?;
    for strategy in ["env-vars", "annotations"] {
        let ns = TestNamespace::new(&client, "e2e-namedel").await?;
        apply_yaml(&client, Some(&ns.name), CM).await?;
        apply_yaml(
            &client,
            Some(&ns.name),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: named}\ndata: {a: '1'}\n",
        )
        .await?;
        let flag = format!("--reload-strategy={strategy}");
        let rk = Rekindle::start(
            &client,
            &[&ns.name],
            Options {
                args: &["--reload-on-delete=true", &flag],
                ..Default::default()
            },
        )
        .await?;
        deployment("web")
            .annotations(json!({"configmap.reloader.stakater.com/reload": "named"}))
            .uses_configmap("app-config")
            .apply(&client, &ns.name)
            .await?;
        expect_replica_sets(&client, &ns.name, "web", 1).await?;
        let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
        let generation = |d: &Value| d.pointer("/metadata/generation").and_then(Value::as_i64);
        if strategy == "env-vars" {
            change_cm(&client, &ns.name, "named", "changed").await?;
            expect_replica_sets(&client, &ns.name, "web", 2).await?;
        }
        let before = generation(&get_json(&deployments, "web").await?).unwrap_or(0);
        let handled = rk.handled().await?;
        Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
            .delete("named", &DeleteParams::default())
            .await?;
        // One more template change (a rollout): with env vars the template goes back to the first
        // revision, whose ReplicaSet scales up again; with annotations it is a new one.
        let d = wait_for("the deletion to roll web", TIMEOUT, || async {
            let d = get_json(&deployments, "web").await?;
            Ok((generation(&d) == Some(before + 1)).then_some(d))
        })
        .await?;
        let template = d.pointer("/spec/template").cloned().unwrap_or_default();
        match strategy {
            "env-vars" => assert_eq!(
                template.pointer("/spec/containers/0/env"),
                None,
                "{strategy}: the marker is removed"
            ),
            _ => {
                let source: Value = serde_json::from_str(
                    template
                        .pointer("/metadata/annotations/reloader.stakater.com~1last-reloaded-from")
                        .and_then(Value::as_str)
                        .unwrap_or("{}"),
                )?;
                assert_eq!(source["name"], "named", "{strategy}");
                assert_eq!(
                    source["hash"],
                    rekindle::core::hash::delete_marker_hash().as_str(),
                    "{strategy}: the delete marker's hash"
                );
                expect_replica_sets(&client, &ns.name, "web", 2).await?;
            }
        }
        // Exactly one rollout for the deletion.
        rk.settled(handled + 1.0).await?;
        assert_eq!(
            generation(&get_json(&deployments, "web").await?),
            Some(before + 1),
            "{strategy}: one template change"
        );
        rk.stop().await?;
        ns.cleanup().await?;
    }
    Ok(())
}

#[tokio::test]
async fn workloads_outside_the_watched_namespaces_are_untouched() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-scope").await?;
    let other = TestNamespace::new(&client, "e2e-scope-other").await?;
    for n in [&ns.name, &other.name] {
        apply_yaml(&client, Some(n), CM).await?;
    }
    // rekindle watches only `ns`; a Deployment in `other` is never reloaded.
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    for n in [&ns.name, &other.name] {
        deployment("web")
            .auto()
            .uses_configmap("app-config")
            .apply(&client, n)
            .await?;
    }
    // The other namespace's change first: were it watched, it would be handled before ours.
    let handled = rk.handled().await?;
    for n in [&other.name, &ns.name] {
        change_cm(&client, n, "app-config", "changed").await?;
    }
    wait_replica_sets(
        &client,
        &ns.name,
        "web",
        2,
        "web in the watched namespace to roll",
    )
    .await?;
    rk.settled(handled + 1.0).await?;
    let others = dynamic_api(&client, "apps/v1", "Deployment", Some(&other.name)).await?;
    assert_eq!(
        generation(&get_json(&others, "web").await?),
        1,
        "the other namespace is out of scope"
    );
    rk.stop().await?;
    other.cleanup().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn webhook_url_mode_posts_changes_and_touches_no_workload() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-notify").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let (url, mut rx) = e2e::http_receiver().await?;
    let arg = format!("--webhook-url={url}");
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &[&arg],
            webhook: false,
            ..Default::default()
        },
    )
    .await?;
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    rk.wait_indexed(1.0).await?;
    let handled = rk.handled().await?;
    change_cm(&client, &ns.name, "app-config", "notify").await?;
    let (_, body) = tokio::time::timeout(TIMEOUT, rx.recv())
        .await?
        .expect("a notification");
    let payload: Value = serde_json::from_str(&body)?;
    assert_eq!(payload["webhook"], "update successful");
    assert_eq!(payload["kind"], "ConfigMap");
    assert_eq!(payload["name"], "app-config");
    assert_eq!(
        payload["workloads"],
        json!([{"kind": "Deployment", "namespace": ns.name, "name": "web"}])
    );
    rk.settled(handled + 1.0).await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    assert_eq!(
        generation(&get_json(&deployments, "web").await?),
        1,
        "no workload is touched"
    );
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn csi_secret_provider_class_changes_reload_once() -> Result<()> {
    let client = admin_client().await?;
    apply_yaml(&client, None, &e2e::csi::crds()?).await?;
    let ns = TestNamespace::new(&client, "e2e-csi").await?;
    e2e::csi::status_api(&client, &ns.name).await?;
    let spcps = |pod: &str, version: &str| {
        json!({"apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClassPodStatus", "metadata": {"name": format!("{pod}-vault")},
            "status": {"podName": pod, "secretProviderClassName": "vault", "mounted": true, "objects": [{"id": "secret/db", "version": version}]}})
    };
    apply_value(&client, Some(&ns.name), json!({"apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass", "metadata": {"name": "vault"}, "spec": {"provider": "vault"}})).await?;
    apply_value(&client, Some(&ns.name), spcps("pod-a", "v1")).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--enable-csi-integration"],
            ..Default::default()
        },
    )
    .await?;
    apply_value(&client, Some(&ns.name), json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "annotations": {"secretproviderclass.reloader.stakater.com/auto": "true"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
            "containers": [{"name": "app", "image": "busybox", "volumeMounts": [{"name": "secrets", "mountPath": "/mnt/secrets"}]}],
            "volumes": [{"name": "secrets", "csi": {"driver": "secrets-store.csi.k8s.io", "volumeAttributes": {"secretProviderClass": "vault"}}}]}}}})).await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let env = |d: &Value| {
        d.pointer("/spec/template/spec/containers/0/env/0/value")
            .and_then(Value::as_str)
            .map(String::from)
    };
    let h1 = rekindle::core::hash::spcps_hash("vault", [("secret/db", "v1")]);
    // Give the optional watch a moment to list, then check the stamp (the SPC's hash is known).
    wait_for("web to be stamped with the SPC hash", TIMEOUT, || async {
        let d = get_json(&deployments, "web").await?;
        if env(&d).is_none() {
            // The watch may have listed after the create: a template change re-admits it.
            deployments.patch("web", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"template": {"metadata": {"labels": {"tick": format!("{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis())}}}}}))).await?;
        }
        Ok((env(&get_json(&deployments, "web").await?) == Some(h1.clone())).then_some(()))
    })
    .await?;
    let before = generation(&get_json(&deployments, "web").await?);
    let handled = rk.handled().await?;
    // Three pods' statuses move to v2: one new hash, one reload.
    for pod in ["pod-a", "pod-b", "pod-c"] {
        apply_value(&client, Some(&ns.name), spcps(pod, "v2")).await?;
    }
    let h2 = rekindle::core::hash::spcps_hash("vault", [("secret/db", "v2")]);
    wait_for("web to carry the new SPC hash", TIMEOUT, || async {
        Ok((env(&get_json(&deployments, "web").await?) == Some(h2.clone())).then_some(()))
    })
    .await?;
    rk.settled(handled + 3.0).await?;
    // One template write for three status bumps (metadata.generation counts spec writes exactly).
    assert_eq!(
        generation(&get_json(&deployments, "web").await?),
        before + 1,
        "exactly one reload"
    );
    rk.stop().await?;
    ns.cleanup().await
}

async fn deployments_api(client: &Client, ns: &str) -> Result<kube::Api<kube::api::DynamicObject>> {
    dynamic_api(client, "apps/v1", "Deployment", Some(ns)).await
}

#[tokio::test]
async fn with_ha_only_the_leader_writes_and_failover_loses_nothing() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-ha").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let ha = [
        "--enable-ha",
        "--leader-election-lease-duration=3s",
        "--leader-election-renew-deadline=2s",
        "--leader-election-retry-period=250ms",
    ];
    // Under the chart's RBAC the Lease may only live in the chart's namespace.
    let lease_ns = std::env::var("REKINDLE_E2E_POD_NAMESPACE").unwrap_or_else(|_| ns.name.clone());
    let env_a = [
        ("POD_NAMESPACE", lease_ns.as_str()),
        ("POD_NAME", "replica-a"),
    ];
    let env_b = [
        ("POD_NAMESPACE", lease_ns.as_str()),
        ("POD_NAME", "replica-b"),
    ];
    let mut a = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &ha,
            env: &env_a,
            instance: "a",
            ..Default::default()
        },
    )
    .await?;
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), &lease_ns);
    wait_for("replica-a to hold the Lease", TIMEOUT, || async {
        Ok(leases
            .get_opt("rekindle-leader")
            .await?
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| h == "replica-a"))
    })
    .await?;
    let b = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &ha,
            env: &env_b,
            instance: "b",
            ..Default::default()
        },
    )
    .await?;
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    let handled = a.handled().await?;
    change_cm(&client, &ns.name, "app-config", "one").await?;
    wait_replica_sets(&client, &ns.name, "web", 2, "web to roll once").await?;
    a.settled(handled + 1.0).await?;
    let web = get_json(&deployments_api(&client, &ns.name).await?, "web").await?;
    assert_eq!(generation(&web), 2, "one rollout");
    assert_eq!(a.reloads(true).await?, 1.0, "the leader wrote");
    assert_eq!(b.reloads(true).await?, 0.0, "the follower did not");
    assert_eq!(a.metric("rekindle_leader").await?, 1.0);
    assert_eq!(b.metric("rekindle_leader").await?, 0.0);
    // The leader dies in the middle of a burst of changes: the last one is reloaded, none is doubled.
    let burst = 12;
    let handled = b.handled().await?;
    for c in 0..burst {
        change_cm(&client, &ns.name, "app-config", &format!("burst-{c}")).await?;
        if c == burst / 2 {
            a.kill().await?;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let want = rekindle::core::hash::configmap_hash_typed(
        &Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
            .get("app-config")
            .await?,
    );
    wait_for(
        "replica-b to take over and reload the last change",
        TIMEOUT,
        || async {
            let d = get_json(&deployments_api(&client, &ns.name).await?, "web").await?;
            Ok(
                (d.pointer("/spec/template/spec/containers/0/env/0/value") == Some(&json!(want)))
                    .then_some(()),
            )
        },
    )
    .await?;
    b.settled(handled + burst as f64).await?;
    let rollouts =
        generation(&get_json(&deployments_api(&client, &ns.name).await?, "web").await?) - 1;
    assert!(
        (2..=1 + burst as u64).contains(&rollouts),
        "{rollouts} rollouts for 1 + {burst} changes"
    );
    // Read at scrape time: the replica that has just written is the leader.
    assert_eq!(b.metric("rekindle_leader").await?, 1.0);
    b.stop().await?;
    // The last leader out deletes its Lease: nothing is left behind for an uninstalled release.
    assert!(
        leases.get_opt("rekindle-leader").await?.is_none(),
        "the Lease outlived its last leader"
    );
    a.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn namespace_selector_takes_effect_without_restart_and_resource_selector_filters(
) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-nssel").await?;
    apply_yaml(&client, Some(&ns.name), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config, labels: {reload: 'yes'}}\ndata: {greeting: hello}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: unlabelled}\ndata: {a: '1'}\n").await?;
    let selector = format!("--namespace-selector=e2e.rekindle.io/selected:{}", ns.name);
    let args = [selector.as_str(), "--resource-label-selector=reload=yes"];
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &args,
            cluster_wide: true,
            webhook: false,
            ..Default::default()
        },
    )
    .await?;
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    deployment("other")
        .auto()
        .uses_configmap("unlabelled")
        .apply(&client, &ns.name)
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Not selected yet: no reload.
    change_cm(&client, &ns.name, "app-config", "before").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        replica_sets(&client, &ns.name, "web").await?.len(),
        1,
        "namespace not selected yet"
    );
    // Label the namespace: it starts matching without a restart.
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"e2e.rekindle.io/selected": ns.name}}})),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    change_cm(&client, &ns.name, "app-config", "after").await?;
    wait_replica_sets(
        &client,
        &ns.name,
        "web",
        2,
        "web to roll once the namespace matches",
    )
    .await?;
    // A ConfigMap outside the resource label selector never triggers.
    change_cm(&client, &ns.name, "unlabelled", "x").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        replica_sets(&client, &ns.name, "other").await?.len(),
        1,
        "resource label selector filters"
    );
    rk.stop().await?;
    ns.cleanup().await
}

/// `* HH:MM-HH:MM` (UTC) from `opens` for `minutes`.
fn daily_window(opens: jiff::Timestamp, minutes: i64) -> String {
    let closes = opens + jiff::SignedDuration::from_mins(minutes);
    format!("* {}-{}", opens.strftime("%H:%M"), closes.strftime("%H:%M"))
}

/// Reload windows: changes outside a workload's window wait for it, with one `ReloadDeferred` Event
/// and the deferred gauge, and are rolled out once, together, when it opens. A workload without its
/// own window has its namespace's, else `--reload-window`.
#[tokio::test]
async fn a_reload_outside_its_window_waits_for_the_window_to_open() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-window").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let now = jiff::Timestamp::now();
    let default = daily_window(now + jiff::SignedDuration::from_hours(3), 60);
    let mut rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0", &format!("--reload-window={default}")],
            ..Default::default()
        },
    )
    .await?;
    // Opens at the start of a minute at least 40 s away: time to see the deferral, restart rekindle
    // and see it again first.
    let mut opens = jiff::Timestamp::from_second((now.as_second() / 60 + 1) * 60)?;
    if opens.duration_since(now) < jiff::SignedDuration::from_secs(40) {
        opens += jiff::SignedDuration::from_mins(1);
    }
    deployment("soon")
        .annotations(json!({"reloader.stakater.com/auto": "true",
            "rekindle.io/reload-window": daily_window(opens, 10)}))
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    deployment("later")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    rk.wait_indexed(2.0).await?;
    let deferred = "rekindle_reloads_deferred{reason=\"window\"}";
    let handled = rk.handled().await?;
    for v in ["1", "2"] {
        change_cm(&client, &ns.name, "app-config", v).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    rk.settled(handled + 2.0).await?;
    assert_eq!(rk.metric(deferred).await?, 2.0, "both wait");
    let deployments = deployments_api(&client, &ns.name).await?;
    for name in ["soon", "later"] {
        assert_eq!(
            generation(&get_json(&deployments, name).await?),
            1,
            "{name} untouched"
        );
    }
    let events = Api::<Event>::namespaced(client.clone(), &ns.name);
    let deferrals = || async {
        let list = events
            .list(&ListParams::default().fields("reason=ReloadDeferred"))
            .await?;
        anyhow::Ok(list.items)
    };
    let before_restart = deferrals().await?;
    // What is owed lives in the markers and the hashes: a restarted rekindle finds both reloads
    // owed and defers them again, until the same window opens.
    rk.kill().await?;
    rk.restart().await?;
    let handled = rk.handled().await?;
    wait_for("both to wait again after a restart", TIMEOUT, || async {
        Ok((rk.metric(deferred).await? == 2.0).then_some(()))
    })
    .await?;
    for name in ["soon", "later"] {
        assert_eq!(
            generation(&get_json(&deployments, name).await?),
            1,
            "{name} untouched after the restart"
        );
    }
    assert!(
        jiff::Timestamp::now() < opens,
        "the deferral was seen, across a restart, before the window opened"
    );

    wait_for(
        "soon's window to open and the reload",
        Duration::from_secs(120),
        || async {
            let soon = get_json(&deployments, "soon").await?;
            Ok((generation(&soon) > 1).then_some(()))
        },
    )
    .await?;
    assert!(
        jiff::Timestamp::now() >= opens,
        "not before the window opened"
    );
    wait_for("later to be deferred still", TIMEOUT, || async {
        Ok((rk.metric(deferred).await? == 1.0).then_some(()))
    })
    .await?;
    assert_eq!(
        generation(&get_json(&deployments, "soon").await?),
        2,
        "one rollout for both changes"
    );
    assert_eq!(generation(&get_json(&deployments, "later").await?), 1);
    // One Event for each workload from each process, however often it was looked at meanwhile.
    let after_restart = deferrals().await?;
    for (events, posted) in [(&before_restart, 1), (&after_restart, 2)] {
        for name in ["soon", "later"] {
            let count: i32 = events
                .iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(name))
                .map(|e| e.count.unwrap_or(1).max(1))
                .sum();
            assert_eq!(count, posted, "{name}: {events:?}");
        }
    }

    // The namespace's window, open now, wins over --reload-window: the next change reloads `later`
    // at once (and `soon`, whose own window is still open).
    let open_now = daily_window(
        jiff::Timestamp::now() - jiff::SignedDuration::from_mins(5),
        30,
    );
    let namespace_events =
        "reloader_events_received_total{event_type=\"update\",resource_type=\"namespaces\"}";
    let seen = rk.metric(namespace_events).await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {
                "rekindle.io/reload-window": open_now}}})),
        )
        .await?;
    wait_for(
        "rekindle to see the namespace's window",
        TIMEOUT,
        || async { Ok((rk.metric(namespace_events).await? > seen).then_some(())) },
    )
    .await?;
    change_cm(&client, &ns.name, "app-config", "3").await?;
    wait_for("later, under its namespace's window", TIMEOUT, || async {
        let later = get_json(&deployments, "later").await?;
        Ok((generation(&later) == 2).then_some(()))
    })
    .await?;
    rk.settled(handled + 1.0).await?;
    assert_eq!(rk.metric(deferred).await?, 0.0, "nothing waits");
    assert_eq!(generation(&get_json(&deployments, "soon").await?), 3);
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn min_reload_interval_merges_changes_into_one_reload() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-cooldown").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--min-reload-interval=5s", "--reload-debounce=0"],
            ..Default::default()
        },
    )
    .await?;
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    change_cm(&client, &ns.name, "app-config", "1").await?;
    wait_replica_sets(&client, &ns.name, "web", 2, "the first reload").await?;
    // Three changes inside the cooldown: one more reload at its end, carrying the last hash.
    let handled = rk.handled().await?;
    for v in ["2", "3", "4"] {
        change_cm(&client, &ns.name, "app-config", v).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_replica_sets(&client, &ns.name, "web", 3, "the merged reload").await?;
    rk.settled(handled + 3.0).await?;
    let web = get_json(&deployments_api(&client, &ns.name).await?, "web").await?;
    assert_eq!(generation(&web), 3, "two rollouts for four changes");
    assert_eq!(rk.reloads(true).await?, 2.0);
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn absent_markers_are_left_alone_unless_sync_after_restart_replays_them() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-sync").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    // Created while no rekindle runs: no marker.
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        replica_sets(&client, &ns.name, "web").await?.len(),
        1,
        "an absent marker is left alone"
    );
    rk.terminate().await?;
    rk.stop().await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--sync-after-restart", "--reload-on-create=true"],
            ..Default::default()
        },
    )
    .await?;
    wait_replica_sets(&client, &ns.name, "web", 2, "the replay to stamp web").await?;
    rk.settled(rk.handled().await?).await?;
    let web = get_json(&deployments_api(&client, &ns.name).await?, "web").await?;
    assert_eq!(generation(&web), 2, "replayed once");
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn alerts_after_a_reload_use_reloaders_slack_payload() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-alert").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let (url, mut rx) = e2e::http_receiver().await?;
    // Through ALERT_WEBHOOK_PROXY, with credentials.
    let (proxy, mut tunnels) = e2e::connect_proxy().await?;
    let env = [
        ("ALERT_ON_RELOAD", "true"),
        ("ALERT_SINK", "slack"),
        ("ALERT_WEBHOOK_URL", url.as_str()),
        ("ALERT_ADDITIONAL_INFO", "e2e-cluster"),
        ("ALERT_WEBHOOK_PROXY", proxy.as_str()),
    ];
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            env: &env,
            ..Default::default()
        },
    )
    .await?;
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    change_cm(&client, &ns.name, "app-config", "alert").await?;
    let (content_type, body) = tokio::time::timeout(TIMEOUT, rx.recv())
        .await?
        .expect("an alert");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let payload: Value = serde_json::from_str(&body)?;
    let text = payload["attachments"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.starts_with(
            "e2e-cluster : Reloader detected changes in *app-config* of type *CONFIGMAP*"
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "reloaded *web* of type *Deployment* in namespace *{}*",
            ns.name
        )),
        "{text}"
    );
    let tunnel = tunnels
        .try_recv()
        .expect("the alert went through the proxy");
    assert!(url.contains(&tunnel), "{tunnel} is the receiver in {url}");
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn kubernetes_namespace_scopes_and_namespaces_to_ignore_applies_cluster_wide_only(
) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let client = admin_client().await?;
    let a = TestNamespace::new(&client, "e2e-scope-a").await?;
    let b = TestNamespace::new(&client, "e2e-scope-b").await?;
    for ns in [&a, &b] {
        apply_yaml(&client, Some(&ns.name), CM).await?;
        deployment("web")
            .auto()
            .uses_configmap("app-config")
            .apply(&client, &ns.name)
            .await?;
    }
    // KUBERNETES_NAMESPACE=a: rekindle acts in a only, and --namespaces-to-ignore (cluster-wide only)
    // is ignored with a warning, so a still reloads.
    let ignore_a = format!("--namespaces-to-ignore={}", a.name);
    let env = [("KUBERNETES_NAMESPACE", a.name.as_str())];
    let rk = Rekindle::start(
        &client,
        &[&a.name],
        Options {
            args: &[&ignore_a],
            env: &env,
            cluster_wide: true,
            webhook: false,
            ..Default::default()
        },
    )
    .await?;
    change_cm(&client, &a.name, "app-config", "1").await?;
    change_cm(&client, &b.name, "app-config", "1").await?;
    wait_replica_sets(
        &client,
        &a.name,
        "web",
        2,
        "web in the KUBERNETES_NAMESPACE to roll",
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        replica_sets(&client, &b.name, "web").await?.len(),
        1,
        "outside KUBERNETES_NAMESPACE"
    );
    let log = std::fs::read_to_string(&rk.log)?;
    assert!(
        log.contains("--namespaces-to-ignore applies in cluster-wide mode only"),
        "warned"
    );
    rk.stop().await?;

    // Cluster-wide (scoped to this test's two namespaces by a selector): --namespaces-to-ignore=b wins.
    let label = format!("e2e.rekindle.io/scope-{}", std::process::id());
    for ns in [&a, &b] {
        Api::<Namespace>::all(client.clone())
            .patch(
                &ns.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"labels": {label.clone(): "yes"}}})),
            )
            .await?;
    }
    let selector = format!("--namespace-selector={label}=yes");
    let ignore_b = format!("--namespaces-to-ignore={}", b.name);
    let rk = Rekindle::start(
        &client,
        &[&a.name, &b.name],
        Options {
            args: &[&selector, &ignore_b],
            cluster_wide: true,
            webhook: false,
            ..Default::default()
        },
    )
    .await?;
    change_cm(&client, &a.name, "app-config", "2").await?;
    change_cm(&client, &b.name, "app-config", "2").await?;
    wait_replica_sets(&client, &a.name, "web", 3, "web in a to roll again").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        replica_sets(&client, &b.name, "web").await?.len(),
        1,
        "ignored namespace"
    );
    rk.stop().await?;
    a.cleanup().await?;
    b.cleanup().await
}

#[tokio::test]
async fn resources_to_ignore_skips_that_kind_only() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-resignore").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    apply_yaml(
        &client,
        Some(&ns.name),
        "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\nstringData: {p: one}\n",
    )
    .await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--resources-to-ignore=secrets"],
            ..Default::default()
        },
    )
    .await?;
    apply_value(&client, Some(&ns.name), json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "busybox",
                "envFrom": [{"configMapRef": {"name": "app-config"}}, {"secretRef": {"name": "creds"}}]}]}}}})).await?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns.name)
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"p": "two"}})),
        )
        .await?;
    // Secrets are not watched, so the ConfigMap change after it is the barrier: once that is
    // reloaded and rekindle is idle, one rollout means the Secret's change was ignored.
    let handled = rk.handled().await?;
    change_cm(&client, &ns.name, "app-config", "changed").await?;
    wait_replica_sets(
        &client,
        &ns.name,
        "web",
        2,
        "a ConfigMap change to roll web",
    )
    .await?;
    rk.settled(handled + 1.0).await?;
    let deployments = deployments_api(&client, &ns.name).await?;
    assert_eq!(
        generation(&get_json(&deployments, "web").await?),
        2,
        "Secrets ignored: one rollout, for the ConfigMap"
    );
    rk.stop().await?;
    ns.cleanup().await
}

/// `/ready` means every watch has synced, also with many namespaces (one watch per kind and
/// namespace) and optional APIs: in the JSON log, each watch's "synced" comes before "ready".
#[tokio::test]
async fn ready_comes_after_every_watch_of_many_namespaces_synced() -> Result<()> {
    let client = admin_client().await?;
    let mut namespaces = Vec::new();
    for _ in 0..6 {
        namespaces.push(TestNamespace::new(&client, "e2e-manyns").await?);
    }
    let names: Vec<&str> = namespaces.iter().map(|n| n.name.as_str()).collect();
    for _ in 0..3 {
        let rk = Rekindle::start(
            &client,
            &names,
            Options {
                webhook: false,
                args: &["--log-format=json"],
                ..Default::default()
            },
        )
        .await?;
        let log = std::fs::read_to_string(&rk.log)?;
        let lines: Vec<Value> = log
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let ready = lines
            .iter()
            .position(|l| l["message"] == "all watches synced; ready")
            .expect("a ready line");
        let synced: std::collections::BTreeSet<String> = lines[..ready]
            .iter()
            .filter(|l| l["message"] == "synced")
            .filter_map(|l| l["watch"].as_str().map(String::from))
            .collect();
        for ns in &names {
            for watch in [
                "configmaps",
                "secrets",
                "Deployment",
                "StatefulSet",
                "DaemonSet",
                "CronJob",
                "Job",
            ] {
                let name = format!("{watch}/{ns}");
                assert!(synced.contains(&name), "{name} not synced before ready");
            }
        }
        rk.stop().await?;
    }
    for ns in namespaces {
        ns.cleanup().await?;
    }
    Ok(())
}

/// Where a Deployment's rollout stands by its own status: every replica updated and available for the
/// latest generation, `Progressing` with reason `NewReplicaSetAvailable`.
fn rollout_finished(d: &Value) -> bool {
    let int = |p: &str| d.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let replicas = d
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let progressing = d
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Progressing")
        .and_then(|c| c["reason"].as_str());
    int("/status/observedGeneration") >= int("/metadata/generation")
        && int("/status/updatedReplicas") == replicas
        && int("/status/availableReplicas") == replicas
        && int("/status/replicas") == replicas
        && progressing == Some("NewReplicaSetAvailable")
}

/// `--max-rollouts-in-progress`: a fleet sharing one ConfigMap never has more than N rollouts that
/// rekindle started unfinished (checked on consistent LIST snapshots, each at one resourceVersion),
/// the rest wait with one `ReloadDeferred` Event each, and every workload reloads exactly once.
#[tokio::test]
async fn the_rollout_budget_bounds_the_rollouts_in_progress() -> Result<()> {
    const BUDGET: usize = 2;
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-budget").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0", "--max-rollouts-in-progress=2"],
            ..Default::default()
        },
    )
    .await?;
    let fleet = ["a", "b", "c", "d", "e"];
    for name in fleet {
        let mut d = deployment(name).auto().uses_configmap("app-config").build();
        // Each rollout takes a few seconds, so overlapping ones are seen.
        d["spec"]["minReadySeconds"] = json!(3);
        apply_value(&client, Some(&ns.name), d).await?;
    }
    rk.wait_indexed(fleet.len() as f64).await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let snapshot = || all_deployments(&deployments);
    wait_rollouts_finished(&deployments, fleet.len()).await?;

    change_cm(&client, &ns.name, "app-config", "budgeted").await?;
    let deferred = "rekindle_reloads_deferred{reason=\"budget\"}";
    let (mut most_in_progress, mut most_deferred) = (0, 0.0_f64);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let all = snapshot().await?;
        let reloaded = all.iter().filter(|d| generation(d) > 1);
        let in_progress = reloaded.clone().filter(|d| !rollout_finished(d)).count();
        assert!(
            in_progress <= BUDGET,
            "{in_progress} rollouts in progress: {all:#?}"
        );
        most_in_progress = most_in_progress.max(in_progress);
        most_deferred = most_deferred.max(rk.metric(deferred).await?);
        if reloaded.count() == fleet.len() && all.iter().all(rollout_finished) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fleet did not reload: {all:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(most_in_progress, BUDGET, "the budget was used");
    assert_eq!(
        most_deferred,
        (fleet.len() - BUDGET) as f64,
        "the rest waited"
    );
    for d in snapshot().await? {
        assert_eq!(generation(&d), 2, "reloaded once: {d:#}");
    }
    let events = Api::<Event>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default().fields("reason=ReloadDeferred"))
        .await?;
    assert_eq!(events.items.len(), fleet.len() - BUDGET, "{events:#?}");
    assert!(events.items.iter().all(|e| e.count.unwrap_or(1) == 1));
    wait_for("the slots to be free", TIMEOUT, || async {
        let free = rk.metric("rekindle_rollouts_in_progress ").await? == 0.0
            && rk.metric(deferred).await? == 0.0;
        Ok(free.then_some(()))
    })
    .await?;
    Ok(())
}

/// Every Deployment of the namespace, from one LIST (one resourceVersion).
async fn all_deployments(api: &Api<DynamicObject>) -> Result<Vec<Value>> {
    let list = api.list(&ListParams::default()).await?;
    list.items
        .into_iter()
        .map(|d| Ok(serde_json::to_value(d)?))
        .collect()
}

async fn wait_rollouts_finished(api: &Api<DynamicObject>, count: usize) -> Result<()> {
    wait_for("the Deployments' rollouts to finish", TIMEOUT, || async {
        let all = all_deployments(api).await?;
        Ok((all.len() == count && all.iter().all(rollout_finished)).then_some(()))
    })
    .await
}

/// A canary with a progress deadline of `deadline` seconds and the `others`, all using `app-config`,
/// indexed with their first rollouts finished; then the canary's new pods are refused. Returns the
/// Deployments' API, the canary's marker and the policy refusing its new pods.
async fn canary_fleet(
    client: &Client,
    ns: &str,
    rk: &Rekindle,
    others: &[&str],
    deadline: i64,
) -> Result<(Api<DynamicObject>, String, Policy)> {
    let mut canary = deployment("canary")
        .annotations(
            json!({"reloader.stakater.com/auto": "true", "rekindle.io/reload-canary": "true"}),
        )
        .uses_configmap("app-config")
        .build();
    canary["spec"]["progressDeadlineSeconds"] = json!(deadline);
    apply_value(client, Some(ns), canary).await?;
    for name in others {
        deployment(name)
            .auto()
            .uses_configmap("app-config")
            .apply(client, ns)
            .await?;
    }
    let count = others.len() + 1;
    rk.wait_indexed(count as f64).await?;
    let deployments = dynamic_api(client, "apps/v1", "Deployment", Some(ns)).await?;
    wait_rollouts_finished(&deployments, count).await?;
    let stamped = env_value(&get_json(&deployments, "canary").await?, MARKER_ENV)
        .ok_or_else(|| anyhow::anyhow!("the canary was not stamped"))?;
    let policy = refuse_new_pods(client, ns, &["canary"], MARKER_ENV, &stamped).await?;
    Ok((deployments, stamped, policy))
}

const HALTED: &str = "/metadata/annotations/rekindle.io~1reload-halted";

/// Canaries and halts: a canary whose new pods are refused (a ValidatingAdmissionPolicy admits only
/// the configuration it started with) fails its rollout at its progress deadline; the change is
/// halted (the annotation, a Warning Event, the metric) and the other workloads wait. When the canary
/// recovers (the policy goes), the halt ends and each of the others reloads once. Another
/// installation in the cluster, which indexes the workloads but serves none of this namespace (nor
/// sees its ConfigMap), leaves the halt alone.
#[tokio::test]
async fn a_failed_canary_halts_the_change_until_it_recovers() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-canary").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let mut rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0"],
            ..Default::default()
        },
    )
    .await?;
    let (deployments, stamped, policy) =
        canary_fleet(&client, &ns.name, &rk, &["b", "c"], 5).await?;
    let elsewhere = format!(
        "--namespace-selector=e2e.rekindle.io/selected:none-{}",
        ns.name
    );
    let another = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &[
                &elsewhere,
                "--resource-label-selector=e2e.rekindle.io/another=yes",
            ],
            cluster_wide: true,
            webhook: false,
            instance: "another",
            ..Default::default()
        },
    )
    .await?;

    change_cm(&client, &ns.name, "app-config", "broken").await?;
    let halted = wait_for("the canary's halt", Duration::from_secs(90), || async {
        let c = get_json(&deployments, "canary").await?;
        Ok(c.pointer(HALTED).and_then(Value::as_str).map(String::from))
    })
    .await;
    let halted = described(halted, &rk, &deployments).await?;
    let halt: Value = serde_json::from_str(&halted)?;
    assert_eq!(halt["reason"], "progress_deadline", "{halt}");
    assert_eq!(halt["changes"][0]["kind"], "ConfigMap", "{halt}");
    assert_eq!(halt["changes"][0]["name"], "app-config", "{halt}");
    halt_holds(&rk, &deployments, 2.0, "the others to wait for the halt").await?;
    assert_eq!(rk.metric("rekindle_reloads_halted ").await?, 1.0);
    assert_eq!(rk.metric("rekindle_reload_halts_total ").await?, 1.0);
    for name in ["b", "c"] {
        assert_eq!(
            generation(&get_json(&deployments, name).await?),
            1,
            "{name} waits"
        );
    }
    let halts = Api::<Event>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default().fields("reason=ReloadHalted"))
        .await?;
    assert_eq!(halts.items.len(), 1, "{halts:#?}");
    assert_eq!(
        halts.items[0].involved_object.name.as_deref(),
        Some("canary")
    );
    assert_eq!(halts.items[0].type_.as_deref(), Some("Warning"));
    another.stop().await?;
    // The halt lives in the annotation: a restarted rekindle holds the others back all the same
    // (its writer waits for every workload watch to list before it writes what is owed).
    rk.kill().await?;
    rk.restart().await?;
    halt_holds(
        &rk,
        &deployments,
        2.0,
        "the others to wait for the halt after a restart",
    )
    .await?;
    for name in ["b", "c"] {
        assert_eq!(
            generation(&get_json(&deployments, name).await?),
            1,
            "{name} still waits"
        );
    }
    // The canary recovers: its new pod is admitted, its rollout finishes, the halt ends.
    policy.remove(&client).await?;
    let resumed = wait_for(
        "the halt to end and the others to reload",
        Duration::from_secs(120),
        || async {
            let all = all_deployments(&deployments).await?;
            let reloaded = |d: &Value| env_value(d, MARKER_ENV) != Some(stamped.clone());
            let done = all.iter().all(|d| reloaded(d) && rollout_finished(d))
                && all.iter().all(|d| d.pointer(HALTED).is_none());
            Ok(done.then_some(()))
        },
    )
    .await;
    described(resumed, &rk, &deployments).await?;
    rk.settled(0.0).await?;
    // Annotation writes count as generations of a Deployment: the canary's template changed once,
    // so it has one ReplicaSet for its start and one for the reload.
    expect_replica_sets(&client, &ns.name, "canary", 2).await?;
    for name in ["b", "c"] {
        assert_eq!(
            generation(&get_json(&deployments, name).await?),
            2,
            "{name} reloaded once"
        );
    }
    assert_eq!(rk.metric("rekindle_reloads_halted ").await?, 0.0);
    Ok(())
}

/// The two other ends of a halt. A new change of the halted resource ends the halt and starts a new
/// wave, canary first: the canary (whose new pods are still refused) reloads alone and fails again, and
/// the change is halted anew at its new hash, the others still waiting. An operator then removes the
/// annotation: rekindle does not write it back, and the others now wait for the canary, which has not
/// finished healthy; once the operator takes the canary annotation off too, they reload once each, to
/// the newest change.
#[tokio::test]
async fn a_new_change_starts_a_new_wave_and_an_operator_can_lift_a_halt() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-wave").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0"],
            ..Default::default()
        },
    )
    .await?;
    let (deployments, _, policy) = canary_fleet(&client, &ns.name, &rk, &["b", "c"], 5).await?;
    let halt_of =
        |d: &Value| -> Option<Value> { serde_json::from_str(d.pointer(HALTED)?.as_str()?).ok() };
    let halted_at = |hash: Option<String>| {
        let deployments = deployments.clone();
        async move {
            let c = get_json(&deployments, "canary").await?;
            let halt = halt_of(&c);
            let at = halt.as_ref().and_then(|h| h["changes"][0]["hash"].as_str());
            let marker = env_value(&c, MARKER_ENV);
            // A halt of the change the canary now carries, other than `hash`.
            let new = at.is_some() && at == marker.as_deref() && at != hash.as_deref();
            Ok(new.then(|| at.unwrap_or_default().to_string()))
        }
    };

    change_cm(&client, &ns.name, "app-config", "broken").await?;
    let first = wait_for("the first halt", Duration::from_secs(90), || {
        halted_at(None)
    })
    .await;
    let first = described(first, &rk, &deployments).await?;
    halt_holds(
        &rk,
        &deployments,
        2.0,
        "the others to wait for the first halt",
    )
    .await?;

    change_cm(&client, &ns.name, "app-config", "broken again").await?;
    let second = wait_for("the new wave's halt", Duration::from_secs(90), || {
        halted_at(Some(first.clone()))
    })
    .await;
    let second = described(second, &rk, &deployments).await?;
    assert_ne!(second, first);
    halt_holds(
        &rk,
        &deployments,
        2.0,
        "the others to wait for the new halt",
    )
    .await?;
    // The canary reloaded once per change; the others never.
    expect_replica_sets(&client, &ns.name, "canary", 3).await?;
    for name in ["b", "c"] {
        assert_eq!(
            generation(&get_json(&deployments, name).await?),
            1,
            "{name} waits"
        );
    }
    let events = |reason: &'static str| {
        let events = Api::<Event>::namespaced(client.clone(), &ns.name);
        async move {
            let listed = events
                .list(&ListParams::default().fields(&format!("reason={reason}")))
                .await?;
            // The recorder folds a repeated Event into a series: count its occurrences.
            let occurrences = |e: &Event| {
                let series = e.series.as_ref().and_then(|s| s.count).unwrap_or(0);
                e.count.unwrap_or(0).max(series).max(1)
            };
            Ok::<_, anyhow::Error>(listed.items.iter().map(occurrences).sum::<i32>())
        }
    };
    assert_eq!(events("ReloadHalted").await?, 2);
    assert_eq!(events("ReloadResumed").await?, 1, "the first halt ended");

    // An operator lifts the halt while the canary still fails: the halt is not written again, and the
    // others wait for the canary instead.
    let lift = |annotation: &str| {
        let patch = json!({"metadata": {"annotations": {annotation: null}}});
        let deployments = deployments.clone();
        async move {
            deployments
                .patch("canary", &PatchParams::default(), &Patch::Merge(patch))
                .await
        }
    };
    lift("rekindle.io/reload-halted").await?;
    let waiting = wait_for("the others to wait for the canary", TIMEOUT, || async {
        let canary = rk
            .metric("rekindle_reloads_deferred{reason=\"canary\"}")
            .await?;
        let halt = rk
            .metric("rekindle_reloads_deferred{reason=\"halt\"}")
            .await?;
        Ok((canary == 2.0 && halt == 0.0).then_some(()))
    })
    .await;
    described(waiting, &rk, &deployments).await?;
    for name in ["b", "c"] {
        assert_eq!(
            generation(&get_json(&deployments, name).await?),
            1,
            "{name} still waits"
        );
    }
    assert!(
        get_json(&deployments, "canary")
            .await?
            .pointer(HALTED)
            .is_none(),
        "not written back"
    );
    // Without its canary annotation the failed workload orders nothing: the others reload once, to the
    // newest change.
    lift("rekindle.io/reload-canary").await?;
    let reloaded = wait_for("the others to reload", TIMEOUT, || async {
        let mut done = true;
        for name in ["b", "c"] {
            let d = get_json(&deployments, name).await?;
            done &= env_value(&d, MARKER_ENV).as_deref() == Some(second.as_str());
        }
        Ok(done.then_some(()))
    })
    .await;
    described(reloaded, &rk, &deployments).await?;
    rk.settled(0.0).await?;
    for name in ["b", "c"] {
        expect_replica_sets(&client, &ns.name, name, 2).await?;
    }
    let canary = get_json(&deployments, "canary").await?;
    assert!(canary.pointer(HALTED).is_none(), "not written back");
    assert_eq!(events("ReloadHalted").await?, 2);
    assert_eq!(rk.metric("rekindle_reloads_halted ").await?, 0.0);
    policy.remove(&client).await?;
    rk.stop().await?;
    ns.cleanup().await
}

/// A canary's rollout started by one rekindle process fails after a restart: the new process follows
/// the rollout it finds running (the changes are the canary's markers) and halts the change when the
/// rollout fails, so the others still wait for the halt, not only for the canary.
#[tokio::test]
async fn a_canary_failing_after_a_restart_still_halts_its_change() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-canary-restart").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let mut rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0"],
            ..Default::default()
        },
    )
    .await?;
    // Long enough for the restart to come before the deadline.
    let (deployments, stamped, policy) = canary_fleet(&client, &ns.name, &rk, &["b"], 15).await?;

    change_cm(&client, &ns.name, "app-config", "broken").await?;
    wait_for("the canary's reload", TIMEOUT, || async {
        let c = get_json(&deployments, "canary").await?;
        Ok(env_value(&c, MARKER_ENV)
            .filter(|m| *m != stamped)
            .map(|_| ()))
    })
    .await?;
    rk.kill().await?;
    rk.restart().await?;
    let halted = wait_for("the canary's halt", Duration::from_secs(90), || async {
        let c = get_json(&deployments, "canary").await?;
        Ok(c.pointer(HALTED).and_then(Value::as_str).map(String::from))
    })
    .await;
    let halted = described(halted, &rk, &deployments).await?;
    let halt: Value = serde_json::from_str(&halted)?;
    let marker = env_value(&get_json(&deployments, "canary").await?, MARKER_ENV);
    assert_eq!(halt["reason"], "progress_deadline", "{halt}");
    assert_eq!(halt["changes"][0]["name"], "app-config", "{halt}");
    assert_eq!(
        halt["changes"][0]["hash"].as_str(),
        marker.as_deref(),
        "{halt}"
    );
    halt_holds(&rk, &deployments, 1.0, "b to wait for the halt").await?;
    assert_eq!(
        generation(&get_json(&deployments, "b").await?),
        1,
        "b waits"
    );
    policy.remove(&client).await?;
    rk.stop().await?;
    ns.cleanup().await
}

/// `--halt-on-failed-rollout` with the rollout budget: two workloads are owed a change and the new
/// pods of both are refused. Whichever takes the only slot first fails its rollout; the change is
/// halted on it without any canary, and the other, which waited for the slot, waits for the halt
/// (held from the moment the failure is seen, though the failure freed the slot). When the failed one
/// recovers, the other reloads once.
#[tokio::test]
async fn with_halt_on_failed_rollout_any_failed_rollout_halts_its_change() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-halt-any").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &[
                "--reload-debounce=0",
                "--halt-on-failed-rollout",
                "--max-rollouts-in-progress=1",
            ],
            ..Default::default()
        },
    )
    .await?;
    for name in ["first", "second"] {
        let mut d = deployment(name).auto().uses_configmap("app-config").build();
        d["spec"]["progressDeadlineSeconds"] = json!(5);
        apply_value(&client, Some(&ns.name), d).await?;
    }
    rk.wait_indexed(2.0).await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    wait_rollouts_finished(&deployments, 2).await?;
    let stamped = env_value(&get_json(&deployments, "first").await?, MARKER_ENV)
        .ok_or_else(|| anyhow::anyhow!("first was not stamped"))?;
    let policy = refuse_new_pods(
        &client,
        &ns.name,
        &["first", "second"],
        MARKER_ENV,
        &stamped,
    )
    .await?;

    change_cm(&client, &ns.name, "app-config", "broken").await?;
    let halted = wait_for("a halt", Duration::from_secs(90), || async {
        let all = all_deployments(&deployments).await?;
        Ok(all.into_iter().find_map(|d| {
            let halt = d.pointer(HALTED).and_then(Value::as_str)?.to_string();
            Some((d["metadata"]["name"].as_str()?.to_string(), halt))
        }))
    })
    .await;
    let (failed, halted) = described(halted, &rk, &deployments).await?;
    let other = if failed == "first" { "second" } else { "first" };
    let halt: Value = serde_json::from_str(&halted)?;
    assert_eq!(halt["reason"], "progress_deadline", "{halt}");
    assert_eq!(halt["changes"][0]["name"], "app-config", "{halt}");
    halt_holds(&rk, &deployments, 1.0, "the other to wait for the halt").await?;
    assert_eq!(
        rk.metric("rekindle_rollouts_failed_total{reason=\"progress_deadline\"}")
            .await?,
        1.0
    );
    assert_eq!(
        generation(&get_json(&deployments, other).await?),
        1,
        "{other} waits"
    );

    policy.remove(&client).await?;
    let resumed = wait_for(
        "the halt to end and the other to reload",
        Duration::from_secs(120),
        || async {
            let all = all_deployments(&deployments).await?;
            let done = all.iter().all(|d| {
                env_value(d, MARKER_ENV) != Some(stamped.clone())
                    && rollout_finished(d)
                    && d.pointer(HALTED).is_none()
            });
            Ok(done.then_some(()))
        },
    )
    .await;
    described(resumed, &rk, &deployments).await?;
    rk.settled(0.0).await?;
    assert_eq!(
        generation(&get_json(&deployments, other).await?),
        2,
        "{other} reloaded once"
    );
    assert_eq!(rk.metric("rekindle_reload_halts_total ").await?, 1.0);
    Ok(())
}

const MARKER_ENV: &str = "STAKATER_APP_CONFIG_CONFIGMAP";

/// A wait's result, with the canary test's state added to its error.
async fn described<T>(
    waited: Result<T>,
    rk: &Rekindle,
    deployments: &Api<DynamicObject>,
) -> Result<T> {
    match waited {
        Ok(v) => Ok(v),
        Err(e) => Err(e.context(canary_state(rk, deployments).await)),
    }
}

/// Waits until `waiting` reloads are deferred for a halt (`what` names the step); on a timeout, says
/// what the canary test waits on.
async fn halt_holds(
    rk: &Rekindle,
    deployments: &Api<DynamicObject>,
    waiting: f64,
    what: &str,
) -> Result<()> {
    let waited = wait_for(what, TIMEOUT, || async {
        let deferred = rk
            .metric("rekindle_reloads_deferred{reason=\"halt\"}")
            .await?;
        Ok((deferred == waiting).then_some(()))
    })
    .await;
    described(waited, rk, deployments).await
}

/// What the canary test waits on, for a wait that timed out: the deferral gauges, the halt, and each
/// Deployment's generation and rollout.
async fn canary_state(rk: &Rekindle, deployments: &Api<DynamicObject>) -> String {
    let mut state = Vec::new();
    for reason in ["canary", "halt", "budget", "window"] {
        let series = format!("rekindle_reloads_deferred{{reason=\"{reason}\"}}");
        match rk.metric(&series).await {
            Ok(v) => state.push(format!("deferred {reason}: {v}")),
            Err(e) => state.push(format!("deferred {reason}: {e:#}")),
        }
    }
    match all_deployments(deployments).await {
        Ok(all) => state.extend(all.iter().map(|d| {
            format!(
                "{}: generation {}, finished {}, halt {:?}, conditions {}",
                d["metadata"]["name"],
                generation(d),
                rollout_finished(d),
                d.pointer(HALTED),
                d.pointer("/status/conditions").unwrap_or(&Value::Null)
            )
        })),
        Err(e) => state.push(format!("deployments: {e:#}")),
    }
    if let Ok(ns) = deployments
        .get_opt("canary")
        .await
        .map(|d| d.and_then(|d| d.metadata.namespace))
    {
        state.push(format!(
            "writes: {}",
            workload_writes(ns.as_deref().unwrap_or_default())
        ));
    }
    state.push(format!("rekindle's log: {}", rk.log.display()));
    state.join("; ")
}

/// Who wrote the namespace's workloads, in order, from the cluster's audit log (cluster.sh).
fn workload_writes(ns: &str) -> String {
    let log = std::fs::read_to_string(e2e::state_dir().join("logs/audit.log")).unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e.pointer("/objectRef/namespace").and_then(Value::as_str) == Some(ns))
        .map(|e| {
            let asked: String = e
                .get("requestObject")
                .map(Value::to_string)
                .unwrap_or_default()
                .chars()
                .take(400)
                .collect();
            format!(
                "{} {} {} by {} ({}) {asked}",
                e["stageTimestamp"].as_str().unwrap_or_default(),
                e["verb"].as_str().unwrap_or_default(),
                e.pointer("/objectRef/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                e.pointer("/user/username")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                e.pointer("/responseStatus/code").unwrap_or(&Value::Null)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
