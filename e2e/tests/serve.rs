//! rekindle serve against the real apiserver: admission stamping, the watch, the writer (behaviour §5–§10).
//! Every test runs its own rekindle scoped to its own namespace.

use std::time::Duration;

use anyhow::Result;
use e2e::fixtures::deployment;
use e2e::rekindle::{Options, Rekindle};
use e2e::{
    admin_client, apply_yaml, expect_replica_sets, wait_for, wait_replica_sets, TestNamespace,
    TIMEOUT,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rekindle::core::hash::{configmap_hash_typed, secret_hash_typed};
use serde_json::{json, Value};

async fn setup(prefix: &str) -> Result<(Client, TestNamespace)> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, prefix).await?;
    Ok((client, ns))
}

async fn cm_hash(client: &Client, ns: &str, name: &str) -> Result<String> {
    Ok(configmap_hash_typed(
        &Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get(name)
            .await?,
    ))
}

async fn secret_hash(client: &Client, ns: &str, name: &str) -> Result<String> {
    Ok(secret_hash_typed(
        &Api::<Secret>::namespaced(client.clone(), ns)
            .get(name)
            .await?,
    ))
}

async fn workload_json(
    client: &Client,
    ns: &str,
    api_version: &str,
    kind: &str,
    name: &str,
) -> Result<Value> {
    let api = e2e::dynamic_api(client, api_version, kind, Some(ns)).await?;
    e2e::get_json(&api, name).await
}

fn env_of(obj: &Value, container: usize, name: &str) -> Option<String> {
    obj.pointer(&format!("/spec/template/spec/containers/{container}/env"))?
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map(String::from)
}

async fn deployment_env(
    client: &Client,
    ns: &str,
    name: &str,
    container: usize,
    env: &str,
) -> Result<Option<String>> {
    Ok(env_of(
        &workload_json(client, ns, "apps/v1", "Deployment", name).await?,
        container,
        env,
    ))
}

/// `rekindle_resource_confirmations_total` of `result`: changes confirmed by reading their resource.
async fn confirmations(rk: &Rekindle, result: &str) -> Result<f64> {
    rk.metric(&format!(
        "rekindle_resource_confirmations_total{{result=\"{result}\"}}"
    ))
    .await
}

async fn patch_cm(client: &Client, ns: &str, name: &str, patch: Value) -> Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

const CM: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config}\ndata: {greeting: hello}\n";
const SECRET: &str =
    "apiVersion: v1\nkind: Secret\nmetadata: {name: app-secret}\nstringData: {password: initial}\n";

#[tokio::test]
async fn auto_configmap_is_stamped_and_a_data_change_rolls_exactly_once() -> Result<()> {
    let (client, ns) = setup("e2e-auto").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_yaml(&client, Some(&ns.name), &auto_web()).await?;
    let h1 = cm_hash(&client, &ns.name, "app-config").await?;
    assert_eq!(
        deployment_env(&client, &ns.name, "web", 0, "STAKATER_APP_CONFIG_CONFIGMAP").await?,
        Some(h1.clone()),
        "stamped at admission"
    );
    expect_replica_sets(&client, &ns.name, "web", 1).await?;

    // Labels and annotations only: no reload.
    patch_cm(
        &client,
        &ns.name,
        "app-config",
        json!({"metadata": {"labels": {"x": "y"}, "annotations": {"a": "b"}}}),
    )
    .await?;
    expect_replica_sets(&client, &ns.name, "web", 1).await?;

    patch_cm(
        &client,
        &ns.name,
        "app-config",
        json!({"data": {"greeting": "hi"}}),
    )
    .await?;
    let h2 = cm_hash(&client, &ns.name, "app-config").await?;
    assert_ne!(h1, h2);
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    assert_eq!(
        deployment_env(&client, &ns.name, "web", 0, "STAKATER_APP_CONFIG_CONFIGMAP").await?,
        Some(h2)
    );
    // Counted once the reload (and its Event) is done: wait until rekindle is idle.
    rk.settled(rk.handled().await?).await?;
    assert_eq!(rk.reloads(true).await?, 1.0);

    let events = Api::<Event>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default().fields("reason=Reloaded"))
        .await?;
    assert_eq!(events.items.len(), 1, "one Reloaded event");
    rk.stop().await?;
    ns.cleanup().await
}

/// A change is written from the index with no read when its watch event is newer than the
/// ConfigMaps' resourceVersion at the start of this leadership, listed once (one item) when first
/// needed. The first change after the start came before that list and is confirmed by a read; the
/// next ones are not read. Against the apiserver's own resourceVersions (under the chart's RBAC in
/// `just test`): the list and the read are allowed, and the versions compare.
#[tokio::test]
async fn after_the_first_change_since_the_start_a_change_costs_no_read() -> Result<()> {
    let (client, ns) = setup("e2e-horizon").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_yaml(&client, Some(&ns.name), &auto_web()).await?;
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    for (n, value) in ["one", "two", "three"].into_iter().enumerate() {
        let data = json!({"data": {"greeting": value}});
        patch_cm(&client, &ns.name, "app-config", data).await?;
        expect_replica_sets(&client, &ns.name, "web", n + 2).await?;
    }
    rk.settled(rk.handled().await?).await?;
    assert_eq!(rk.reloads(true).await?, 3.0);
    assert_eq!(
        confirmations(&rk, "current").await?,
        1.0,
        "the first change only"
    );
    assert_eq!(confirmations(&rk, "behind").await?, 0.0);
    assert_eq!(
        rk.metric("rekindle_errors_total{kind=\"resource_read\"}")
            .await?,
        0.0
    );
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn secret_projected_volume_value_from_and_init_container() -> Result<()> {
    let (client, ns) = setup("e2e-refs").await?;
    apply_yaml(&client, Some(&ns.name), &format!("{SECRET}---\n{CM}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: init-config}}\ndata: {{a: '1'}}\n")).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_yaml(&client, Some(&ns.name), &deployment("web").auto().pod_spec(json!({
        "initContainers": [{"name": "init", "image": "busybox", "envFrom": [{"configMapRef": {"name": "init-config"}}]}],
        "containers": [
            {"name": "main", "image": "busybox", "env": [{"name": "G", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "greeting"}}}]},
            {"name": "side", "image": "busybox", "volumeMounts": [{"name": "s", "mountPath": "/s"}]}],
        "volumes": [{"name": "s", "projected": {"sources": [{"secret": {"name": "app-secret"}}]}}]
    })).manifest()).await?;
    // The first ReplicaSet before the change: a template changed before the Deployment controller
    // saw the first one gets a single ReplicaSet, and the count below would never reach two.
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    let d = workload_json(&client, &ns.name, "apps/v1", "Deployment", "web").await?;
    assert_eq!(
        env_of(&d, 1, "STAKATER_APP_SECRET_SECRET"),
        Some(secret_hash(&client, &ns.name, "app-secret").await?)
    );
    assert_eq!(
        env_of(&d, 0, "STAKATER_APP_CONFIG_CONFIGMAP"),
        Some(cm_hash(&client, &ns.name, "app-config").await?)
    );
    // An init container's resource goes to containers[0].
    assert_eq!(
        env_of(&d, 0, "STAKATER_INIT_CONFIG_CONFIGMAP"),
        Some(cm_hash(&client, &ns.name, "init-config").await?)
    );

    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .patch(
            "app-secret",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"password": "rotated"}})),
        )
        .await?;
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    assert_eq!(
        deployment_env(&client, &ns.name, "web", 1, "STAKATER_APP_SECRET_SECRET").await?,
        Some(secret_hash(&client, &ns.name, "app-secret").await?)
    );
    patch_cm(
        &client,
        &ns.name,
        "init-config",
        json!({"data": {"a": "2"}}),
    )
    .await?;
    expect_replica_sets(&client, &ns.name, "web", 3).await?;
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn statefulset_and_daemonset_reload() -> Result<()> {
    let (client, ns) = setup("e2e-kinds").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let pod = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}});
    for kind in ["StatefulSet", "DaemonSet"] {
        let mut spec = json!({"selector": {"matchLabels": {"app": "x"}}, "template": pod});
        if kind == "StatefulSet" {
            spec["serviceName"] = json!("x");
        }
        let obj = json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": kind.to_lowercase(), "annotations": {"configmap.reloader.stakater.com/auto": "true"}}, "spec": spec});
        e2e::apply_value(&client, Some(&ns.name), obj).await?;
    }
    let h1 = cm_hash(&client, &ns.name, "app-config").await?;
    for kind in ["StatefulSet", "DaemonSet"] {
        let obj = workload_json(&client, &ns.name, "apps/v1", kind, &kind.to_lowercase()).await?;
        assert_eq!(
            env_of(&obj, 0, "STAKATER_APP_CONFIG_CONFIGMAP"),
            Some(h1.clone()),
            "{kind} stamped"
        );
    }
    patch_cm(
        &client,
        &ns.name,
        "app-config",
        json!({"data": {"greeting": "changed"}}),
    )
    .await?;
    let h2 = cm_hash(&client, &ns.name, "app-config").await?;
    for kind in ["StatefulSet", "DaemonSet"] {
        wait_for(
            &format!("{kind} to carry the new hash"),
            TIMEOUT,
            || async {
                let obj =
                    workload_json(&client, &ns.name, "apps/v1", kind, &kind.to_lowercase()).await?;
                Ok(
                    (env_of(&obj, 0, "STAKATER_APP_CONFIG_CONFIGMAP") == Some(h2.clone()))
                        .then_some(()),
                )
            },
        )
        .await?;
    }
    wait_for("two reloads counted", TIMEOUT, || async {
        Ok((rk.reloads(true).await? == 2.0).then_some(()))
    })
    .await?;
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn named_regex_exclude_search_match_and_ignore() -> Result<()> {
    let (client, ns) = setup("e2e-policy").await?;
    apply_yaml(
        &client,
        Some(&ns.name),
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: named-1}
data: {a: '1'}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: excluded}
data: {a: '1'}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: matched, annotations: {reloader.stakater.com/match: "true"}}
data: {a: '1'}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored, annotations: {reloader.stakater.com/ignore: "true"}}
data: {a: '1'}
"#,
    )
    .await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let env_from = |names: &[&str]| {
        json!(names
            .iter()
            .map(|n| json!({"configMapRef": {"name": n}}))
            .collect::<Vec<_>>())
    };
    // Named by a regex, not referenced at all.
    apply_yaml(
        &client,
        Some(&ns.name),
        &deployment("named")
            .annotations(json!({"configmap.reloader.stakater.com/reload": "named-.*"}))
            .manifest(),
    )
    .await?;
    apply_yaml(&client, Some(&ns.name), &deployment("exclude").annotations(json!({"reloader.stakater.com/auto": "true", "configmaps.exclude.reloader.stakater.com/reload": "excluded"})).env_from(json!(env_from(&["excluded", "ignored"]))).manifest()).await?;
    apply_yaml(
        &client,
        Some(&ns.name),
        &deployment("search")
            .annotations(json!({"reloader.stakater.com/search": "true"}))
            .env_from(json!(env_from(&["matched", "named-1"])))
            .manifest(),
    )
    .await?;
    // The first ReplicaSet before the change: a template changed before the Deployment controller
    // saw the first one gets a single ReplicaSet, and the count below would never reach two.
    for name in ["named", "exclude", "search"] {
        wait_replica_sets(
            &client,
            &ns.name,
            name,
            1,
            &format!("{name}'s first ReplicaSet"),
        )
        .await?;
    }

    // Named: the first reload adds the marker on containers[0].
    patch_cm(&client, &ns.name, "named-1", json!({"data": {"a": "2"}})).await?;
    expect_replica_sets(&client, &ns.name, "named", 2).await?;
    assert_eq!(
        deployment_env(&client, &ns.name, "named", 0, "STAKATER_NAMED_1_CONFIGMAP").await?,
        Some(cm_hash(&client, &ns.name, "named-1").await?)
    );
    // search without match: named-1 changed but search does not reload for it.
    expect_replica_sets(&client, &ns.name, "search", 1).await?;
    // Excluded and ignored never trigger.
    patch_cm(&client, &ns.name, "excluded", json!({"data": {"a": "2"}})).await?;
    patch_cm(&client, &ns.name, "ignored", json!({"data": {"a": "2"}})).await?;
    expect_replica_sets(&client, &ns.name, "exclude", 1).await?;
    // Search + match.
    patch_cm(&client, &ns.name, "matched", json!({"data": {"a": "2"}})).await?;
    expect_replica_sets(&client, &ns.name, "search", 2).await?;
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn annotations_strategy_records_config_hashes() -> Result<()> {
    let (client, ns) = setup("e2e-annot").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-strategy=annotations"],
            ..Default::default()
        },
    )
    .await?;
    apply_yaml(&client, Some(&ns.name), &auto_web()).await?;
    // The first ReplicaSet before the change: a template changed before the Deployment controller
    // saw the first one gets a single ReplicaSet, and the count below would never reach two.
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    let hashes = |d: &Value| {
        d.pointer("/spec/template/metadata/annotations/rekindle.io~1config-hashes")
            .and_then(Value::as_str)
            .map(String::from)
    };
    let h1 = cm_hash(&client, &ns.name, "app-config").await?;
    let d = workload_json(&client, &ns.name, "apps/v1", "Deployment", "web").await?;
    assert_eq!(
        hashes(&d),
        Some(format!(r#"{{"configmap/app-config":"{h1}"}}"#))
    );
    patch_cm(
        &client,
        &ns.name,
        "app-config",
        json!({"data": {"greeting": "x"}}),
    )
    .await?;
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    let h2 = cm_hash(&client, &ns.name, "app-config").await?;
    let d = workload_json(&client, &ns.name, "apps/v1", "Deployment", "web").await?;
    assert_eq!(
        hashes(&d),
        Some(format!(r#"{{"configmap/app-config":"{h2}"}}"#))
    );
    let lrf: Value = serde_json::from_str(
        d.pointer("/spec/template/metadata/annotations/reloader.stakater.com~1last-reloaded-from")
            .and_then(Value::as_str)
            .unwrap_or("{}"),
    )?;
    assert_eq!(lrf["hash"], h2);
    assert_eq!(lrf["type"], "CONFIGMAP");
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn a_configmap_and_a_secret_changed_together_give_one_rollout() -> Result<()> {
    let (client, ns) = setup("e2e-coalesce").await?;
    apply_yaml(&client, Some(&ns.name), &format!("{CM}---\n{SECRET}")).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=1s"],
            ..Default::default()
        },
    )
    .await?;
    apply_yaml(&client, Some(&ns.name), &deployment("web").auto().env_from(json!([{"configMapRef": {"name": "app-config"}}, {"secretRef": {"name": "app-secret"}}])).manifest()).await?;
    // The first ReplicaSet before the change: a template changed before the Deployment controller
    // saw the first one gets a single ReplicaSet, and the count below would never reach two.
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    patch_cm(
        &client,
        &ns.name,
        "app-config",
        json!({"data": {"greeting": "both"}}),
    )
    .await?;
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .patch(
            "app-secret",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"password": "both"}})),
        )
        .await?;
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    let d = workload_json(&client, &ns.name, "apps/v1", "Deployment", "web").await?;
    assert_eq!(
        env_of(&d, 0, "STAKATER_APP_CONFIG_CONFIGMAP"),
        Some(cm_hash(&client, &ns.name, "app-config").await?)
    );
    assert_eq!(
        env_of(&d, 0, "STAKATER_APP_SECRET_SECRET"),
        Some(secret_hash(&client, &ns.name, "app-secret").await?)
    );
    // Counted once the reload (and its Event) is done: wait until rekindle is idle.
    rk.settled(rk.handled().await?).await?;
    assert_eq!(rk.reloads(true).await?, 1.0);
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn replacing_with_the_original_manifest_keeps_the_marker() -> Result<()> {
    let (client, ns) = setup("e2e-replace").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let manifest: Deployment = serde_json::from_str(
        &deployment("web")
            .auto()
            .uses_configmap("app-config")
            .manifest(),
    )?;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &manifest).await?;
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    let h1 = cm_hash(&client, &ns.name, "app-config").await?;
    // PUT the original manifest (no marker), as `kubectl replace` does.
    let mut again = manifest.clone();
    again.metadata.resource_version = api.get("web").await?.metadata.resource_version;
    api.replace("web", &PostParams::default(), &again).await?;
    assert_eq!(
        deployment_env(&client, &ns.name, "web", 0, "STAKATER_APP_CONFIG_CONFIGMAP").await?,
        Some(h1)
    );
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn changes_while_stopped_are_caught_up_exactly_once() -> Result<()> {
    let (client, ns) = setup("e2e-catchup").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_yaml(&client, Some(&ns.name), &auto_web()).await?;
    apply_yaml(
        &client,
        Some(&ns.name),
        &deployment("other")
            .auto()
            .uses_configmap("rekindle-probe")
            .manifest(),
    )
    .await?;
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    rk.terminate().await?;
    patch_cm(
        &client,
        &ns.name,
        "app-config",
        json!({"data": {"greeting": "while-down"}}),
    )
    .await?;
    rk.restart().await?;
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    assert_eq!(
        deployment_env(&client, &ns.name, "web", 0, "STAKATER_APP_CONFIG_CONFIGMAP").await?,
        Some(cm_hash(&client, &ns.name, "app-config").await?)
    );
    // Found by comparing the marker with the index, the change was confirmed by reading the
    // ConfigMap (its index current) before it was written.
    assert_eq!(confirmations(&rk, "current").await?, 1.0);
    assert_eq!(confirmations(&rk, "behind").await?, 0.0);
    // Nothing changed for `other`: it does not roll. And a second restart with nothing changed rolls nothing.
    expect_replica_sets(&client, &ns.name, "other", 1).await?;
    rk.terminate().await?;
    rk.restart().await?;
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    rk.stop().await?;
    ns.cleanup().await
}

/// A workload the watch first sees after a change of its ConfigMap was handled (the watches are not
/// ordered; a generateName workload is unknown until then) is reloaded at once, not at the next
/// consistency pass (10 minutes). Made deterministic by creating it with a marker that is already stale:
/// the webhook never changes a marker the object carries.
#[tokio::test]
async fn a_new_workload_with_a_stale_marker_is_reloaded_at_once() -> Result<()> {
    let (client, ns) = setup("e2e-newstale").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let mut d: Deployment = serde_json::from_str(&deployment("unused").auto().pod_spec(json!({"containers": [{"name": "app", "image": "busybox",
            "env": [{"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": "0000000000000000000000000000000000000000"}],
            "envFrom": [{"configMapRef": {"name": "app-config"}}]}]})).manifest())?;
    d.metadata.name = None;
    d.metadata.generate_name = Some("gen-".into());
    let created = api.create(&PostParams::default(), &d).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    let want = cm_hash(&client, &ns.name, "app-config").await?;
    wait_for("the stale marker to be replaced", TIMEOUT, || async {
        Ok(
            (deployment_env(&client, &ns.name, &name, 0, "STAKATER_APP_CONFIG_CONFIGMAP").await?
                == Some(want.clone()))
            .then_some(()),
        )
    })
    .await?;
    // Reloaded once: one template change after the creation, and no other a moment later.
    // ReplicaSets are not counted: the reload follows the creation at once, and a Deployment
    // controller that had not yet seen the creation makes one ReplicaSet, of the reloaded template.
    let generation = || async {
        let d = api.get(&name).await?;
        anyhow::Ok(d.metadata.generation.unwrap_or_default())
    };
    assert_eq!(
        generation().await?,
        2,
        "one template change after the creation"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(generation().await?, 2, "and no other");
    rk.stop().await?;
    ns.cleanup().await
}

/// The ConfigMap, and rekindle running without its webhook (workloads are created unstamped).
async fn without_webhook(prefix: &str) -> Result<(Client, TestNamespace, Rekindle)> {
    let (client, ns) = setup(prefix).await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            webhook: false,
            ..Default::default()
        },
    )
    .await?;
    Ok((client, ns, rk))
}

/// `web`: auto-reload, all of `app-config` as environment.
fn auto_web() -> String {
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .manifest()
}

/// Without the webhook a new workload has no marker; when its watch event is handled after a change of
/// its ConfigMap written after its creation (the two watches are not ordered), it is reloaded when seen,
/// once. rekindle is frozen across the create and the change so both events arrive together; either
/// order must give exactly one reload.
#[tokio::test]
async fn an_unmarked_workload_created_before_a_change_it_was_seen_after_is_reloaded_once(
) -> Result<()> {
    let (client, ns, rk) = without_webhook("e2e-unmarked").await?;
    rk.signal("STOP")?;
    let resumed = async {
        apply_yaml(&client, Some(&ns.name), &auto_web()).await?;
        expect_replica_sets(&client, &ns.name, "web", 1).await?;
        // The change is written in a later second than the creation (the apiserver's timestamps are
        // whole seconds).
        tokio::time::sleep(Duration::from_millis(1100)).await;
        patch_cm(
            &client,
            &ns.name,
            "app-config",
            json!({"data": {"greeting": "x"}}),
        )
        .await
    }
    .await;
    rk.signal("CONT")?;
    resumed?;
    let want = cm_hash(&client, &ns.name, "app-config").await?;
    wait_for("web to carry the new hash", TIMEOUT, || async {
        Ok(
            (deployment_env(&client, &ns.name, "web", 0, "STAKATER_APP_CONFIG_CONFIGMAP").await?
                == Some(want.clone()))
            .then_some(()),
        )
    })
    .await?;
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    // Counted once the reload (and its Event) is done: wait until rekindle is idle.
    rk.settled(rk.handled().await?).await?;
    assert_eq!(rk.reloads(true).await?, 1.0);
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn with_the_webhook_down_workloads_are_created_and_still_reloaded() -> Result<()> {
    let (client, ns, rk) = without_webhook("e2e-nowebhook").await?;
    apply_yaml(&client, Some(&ns.name), &auto_web()).await?;
    assert_eq!(
        deployment_env(&client, &ns.name, "web", 0, "STAKATER_APP_CONFIG_CONFIGMAP").await?,
        None,
        "nothing stamped"
    );
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    patch_cm(
        &client,
        &ns.name,
        "app-config",
        json!({"data": {"greeting": "x"}}),
    )
    .await?;
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn invalid_regex_gives_a_warning_event_and_the_rest_works() -> Result<()> {
    let (client, ns) = setup("e2e-invalid").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_yaml(
        &client,
        Some(&ns.name),
        &deployment("web")
            .annotations(json!({"configmap.reloader.stakater.com/reload": "([, app-config"}))
            .manifest(),
    )
    .await?;
    // The first ReplicaSet before the change: a template changed before the Deployment controller
    // saw the first one gets a single ReplicaSet, and the count below would never reach two.
    expect_replica_sets(&client, &ns.name, "web", 1).await?;
    patch_cm(
        &client,
        &ns.name,
        "app-config",
        json!({"data": {"greeting": "x"}}),
    )
    .await?;
    expect_replica_sets(&client, &ns.name, "web", 2).await?;
    let events = Api::<Event>::namespaced(client.clone(), &ns.name);
    wait_for("a Warning InvalidAnnotation event", TIMEOUT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=InvalidAnnotation"))
            .await?;
        Ok(list
            .items
            .into_iter()
            .find(|e| e.type_.as_deref() == Some("Warning")))
    })
    .await?;
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn a_dry_run_leaves_no_trace_in_the_index() -> Result<()> {
    let (client, ns) = setup("e2e-dryrun").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let d: Deployment = serde_json::from_str(
        &deployment("ghost")
            .auto()
            .uses_configmap("app-config")
            .manifest(),
    )?;
    let created = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &d,
        )
        .await?;
    assert!(
        serde_json::to_string(&created)?.contains("STAKATER_APP_CONFIG_CONFIGMAP"),
        "the dry-run shows the stamp"
    );
    // The index sizes are read at scrape time.
    assert_eq!(
        rk.metric("rekindle_index_provisional_workloads").await?,
        0.0
    );
    assert!(
        rk.metric("rekindle_admission_requests_total{operation=\"create\",result=\"patched\"}")
            .await?
            >= 1.0
    );
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn ready_is_503_until_the_watches_sync() -> Result<()> {
    let (client, ns) = setup("e2e-ready").await?;
    // An identity without rights: the watches can never list, so rekindle never becomes ready.
    let path = e2e::user_kubeconfig("nobody", &ns.name)?;
    let mut rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            kubeconfig: Some(path),
            wait_ready: false,
            webhook: false,
            ..Default::default()
        },
    )
    .await?;
    let port = rk.admin_port;
    wait_for("/live to answer", TIMEOUT, || async move {
        Ok(matches!(e2e::rekindle::http_get(port, "/live").await, Ok((200, _))).then_some(()))
    })
    .await?;
    // The watches have tried to list, and failed (forbidden), before /ready is asked.
    wait_for("a watch to fail and restart", TIMEOUT, || async {
        let restarts = rk.metric_sum("rekindle_watch_restarts_total").await?;
        Ok((restarts >= 1.0).then_some(()))
    })
    .await?;
    assert_eq!(e2e::rekindle::http_get(port, "/ready").await?.0, 503);
    rk.terminate().await?;
    rk.stop().await?;
    ns.cleanup().await
}

/// Another client relabels the Deployment in a tight loop (as a GitOps controller, an HPA or a status
/// writer keeps a busy workload's resourceVersion moving): every ConfigMap change is still reloaded in
/// its round. A write planned from the index is guarded by the version the index saw and may lose to
/// the other writer; its retry, on the object as read, is guarded by the marker it replaces, which
/// the other writer never touches, so it lands. None of the other writer's changes is lost.
#[tokio::test]
async fn a_busy_workload_is_reloaded_while_another_client_writes_it() -> Result<()> {
    let (client, ns) = setup("e2e-busy").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_yaml(&client, Some(&ns.name), &auto_web()).await?;
    expect_replica_sets(&client, &ns.name, "web", 1).await?;

    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (deployments, stop) = (
            Api::<Deployment>::namespaced(client.clone(), &ns.name),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                n += 1;
                let patch = json!({"metadata": {"labels": {"busy": n.to_string()}}});
                deployments
                    .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            anyhow::Ok(n)
        })
    };
    for (i, greeting) in ["one", "two", "three"].iter().enumerate() {
        patch_cm(
            &client,
            &ns.name,
            "app-config",
            json!({"data": {"greeting": greeting}}),
        )
        .await?;
        let want = cm_hash(&client, &ns.name, "app-config").await?;
        wait_for(
            &format!(
                "change {} to be reloaded while the Deployment is being relabelled",
                i + 1
            ),
            TIMEOUT,
            || async {
                let env =
                    deployment_env(&client, &ns.name, "web", 0, "STAKATER_APP_CONFIG_CONFIGMAP")
                        .await?;
                Ok((env.as_deref() == Some(want.as_str())).then_some(()))
            },
        )
        .await?;
    }
    stop.cancel();
    let writes = writer.await??;
    let labels = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get("web")
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels.get("busy"),
        Some(&writes.to_string()),
        "the other writer's last label was kept"
    );
    expect_replica_sets(&client, &ns.name, "web", 4).await?;
    // Counted once the reload (and its Event) is done: wait until rekindle is idle.
    rk.settled(rk.handled().await?).await?;
    assert_eq!(rk.reloads(true).await?, 3.0);
    // Only a write planned from the index (guarded by its version) can lose to the other writer:
    // at most one conflict per reload, retried from the object as it is then.
    let conflicts = rk
        .metric("rekindle_reload_attempt_failures_total{reason=\"conflict\"}")
        .await?;
    assert!(
        conflicts <= 3.0,
        "{conflicts} conflicts: a retry guarded by the marker lost to a writer of labels"
    );
    assert_eq!(
        rk.metric("rekindle_errors_total{kind=\"reload_attempt\"}")
            .await?,
        conflicts,
        "every failed attempt was a conflict"
    );
    assert_eq!(rk.reloads(false).await?, 0.0, "no reload gave up");
    assert_eq!(
        rk.metric("rekindle_workload_reads_total{reason=\"retry\"}")
            .await?,
        conflicts,
        "one read per conflict, tried again in the same round"
    );
    println!("{conflicts} conflicts over 3 reloads of a workload relabelled in a tight loop");
    for reason in ["not_indexed", "kind"] {
        assert_eq!(
            rk.metric(&format!(
                "rekindle_workload_reads_total{{reason=\"{reason}\"}}"
            ))
            .await?,
            0.0,
            "planned from the index, never read ({reason})"
        );
    }
    rk.stop().await?;
    ns.cleanup().await
}

/// `kubectl apply -f` of one file holding a ConfigMap and the Deployment that uses it: created
/// milliseconds apart, the Deployment is often admitted before the ConfigMap's watch event arrives.
/// The webhook reads what the index misses, so every Deployment is stamped at creation.
#[tokio::test]
async fn a_workload_created_right_after_its_configmap_is_stamped_at_admission() -> Result<()> {
    let (client, ns) = setup("e2e-justmade").await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let pp = PostParams::default();
    let mut unstamped = Vec::new();
    for i in 0..30 {
        let name = format!("cfg-{i}");
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": name}, "data": {"v": format!("{i}")}}),
        )?;
        let cm = cms.create(&pp, &cm).await?;
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": format!("web-{i}"), "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": format!("web-{i}")}},
                "template": {"metadata": {"labels": {"app": format!("web-{i}")}},
                    "spec": {"containers": [{"name": "app", "image": "busybox",
                        "envFrom": [{"configMapRef": {"name": name}}]}]}}}}))?;
        // The create's answer is the object as admitted.
        let created = serde_json::to_value(deployments.create(&pp, &d).await?)?;
        let env = format!("STAKATER_CFG_{i}_CONFIGMAP");
        let marker = created
            .pointer("/spec/template/spec/containers/0/env")
            .and_then(Value::as_array)
            .and_then(|env_list| env_list.iter().find(|e| e["name"] == env.as_str()))
            .and_then(|e| e["value"].as_str())
            .map(String::from);
        if marker.as_deref() != Some(configmap_hash_typed(&cm).as_str()) {
            unstamped.push(i);
        }
    }
    assert!(
        unstamped.is_empty(),
        "created without their marker: {unstamped:?}"
    );
    rk.stop().await?;
    ns.cleanup().await
}
