//! Used keys (`rekindle.io/reload-on: used-keys`, `--reload-on`) through the real apiserver: a
//! workload reading some keys of a ConfigMap or Secret is rolled by a change of those keys only.

use std::collections::BTreeMap;

use anyhow::Result;
use e2e::fixtures::{deployment, env_value, generation};
use e2e::rekindle::{Options, Rekindle};
use e2e::{admin_client, apply_yaml, dynamic_api, get_json, TestNamespace};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

const CM: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shared}\ndata: {used: a, other: x}\n";
const SECRET: &str =
    "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\nstringData: {password: p, unused: u}\n";

fn used_keys() -> Value {
    json!({"reloader.stakater.com/auto": "true", "rekindle.io/reload-on": "used-keys"})
}

fn auto() -> Value {
    json!({"reloader.stakater.com/auto": "true"})
}

fn key_ref(kind: &str, name: &str, key: &str) -> Value {
    json!([{"name": "app", "image": "busybox",
        "env": [{"name": "V", "valueFrom": {kind: {"name": name, "key": key}}}]}])
}

fn items_volume() -> Value {
    json!({
        "volumes": [{"name": "conf", "configMap": {"name": "shared", "items": [{"key": "used", "path": "u"}]}}],
        "containers": [{"name": "app", "image": "busybox", "volumeMounts": [{"name": "conf", "mountPath": "/c"}]}]
    })
}

async fn patch_cm(client: &Client, ns: &str, key: &str, value: &str) -> Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {key: value}})),
        )
        .await?;
    Ok(())
}

async fn patch_secret(client: &Client, ns: &str, key: &str, value: &str) -> Result<()> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {key: value}})),
        )
        .await?;
    Ok(())
}

async fn generations(api: &Api<DynamicObject>, names: &[&str]) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for name in names {
        out.insert(name.to_string(), generation(&get_json(api, name).await?));
    }
    Ok(out)
}

/// Makes one change and waits until rekindle has handled it and written what it owes.
async fn settle_after(
    rk: &Rekindle,
    change: impl std::future::Future<Output = Result<()>>,
) -> Result<()> {
    let handled = rk.handled().await?;
    change.await?;
    rk.settled(handled + 1.0).await
}

/// Which of `names` were rolled (generation up by one) since `before`; fails on any other step.
async fn rolled(api: &Api<DynamicObject>, before: &BTreeMap<String, u64>) -> Result<Vec<String>> {
    let names: Vec<&str> = before.keys().map(String::as_str).collect();
    let now = generations(api, &names).await?;
    let mut out = Vec::new();
    for (name, g) in &now {
        match g - before[name] {
            0 => {}
            1 => out.push(name.clone()),
            n => anyhow::bail!("{name} rolled {n} times for one change"),
        }
    }
    Ok(out)
}

#[tokio::test]
async fn key_references_reload_only_for_the_keys_they_read() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-used-keys").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    apply_yaml(&client, Some(&ns.name), SECRET).await?;
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let workloads = [
        (
            "env-key",
            used_keys(),
            json!({"containers": key_ref("configMapKeyRef", "shared", "used")}),
        ),
        ("vol-items", used_keys(), items_volume()),
        (
            "secret-key",
            used_keys(),
            json!({"containers": key_ref("secretKeyRef", "creds", "password")}),
        ),
        (
            "env-from",
            used_keys(),
            json!({"containers": [{"name": "app", "image": "busybox",
            "envFrom": [{"configMapRef": {"name": "shared"}}, {"secretRef": {"name": "creds"}}]}]}),
        ),
        (
            "plain",
            auto(),
            json!({"containers": key_ref("configMapKeyRef", "shared", "used")}),
        ),
        (
            "plain-secret",
            auto(),
            json!({"containers": key_ref("secretKeyRef", "creds", "password")}),
        ),
    ];
    for (name, annotations, spec) in &workloads {
        deployment(name)
            .annotations(annotations.clone())
            .pod_spec(spec.clone())
            .apply(&client, &ns.name)
            .await?;
    }
    rk.wait_indexed(workloads.len() as f64).await?;
    let api = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let names: Vec<&str> = workloads.iter().map(|(n, _, _)| *n).collect();

    // Stamped at admission with the used-keys hash: a SHA-1 of `used=<SHA-1 of "a">`.
    let stamped = env_value(
        &get_json(&api, "env-key").await?,
        "STAKATER_SHARED_CONFIGMAP",
    );
    let want = rekindle::core::keys::used_keys_hash([("used", b"a".as_slice())]);
    assert_eq!(stamped.as_deref(), Some(want.as_str()));

    let before = generations(&api, &names).await?;
    settle_after(&rk, patch_cm(&client, &ns.name, "other", "y")).await?;
    assert_eq!(rolled(&api, &before).await?, ["env-from", "plain"]);

    let before = generations(&api, &names).await?;
    settle_after(&rk, patch_secret(&client, &ns.name, "unused", "v")).await?;
    assert_eq!(rolled(&api, &before).await?, ["env-from", "plain-secret"]);
    let skipped = rk
        .metric("reloader_skipped_total{reason=\"unused_keys\"}")
        .await?;
    assert!(skipped >= 3.0, "unused-key skips counted: {skipped}");

    let before = generations(&api, &names).await?;
    settle_after(&rk, patch_cm(&client, &ns.name, "used", "b")).await?;
    assert_eq!(
        rolled(&api, &before).await?,
        ["env-from", "env-key", "plain", "vol-items"]
    );

    let before = generations(&api, &names).await?;
    settle_after(&rk, patch_secret(&client, &ns.name, "password", "q")).await?;
    assert_eq!(
        rolled(&api, &before).await?,
        ["env-from", "plain-secret", "secret-key"]
    );

    // Down while only an unused key changes: the catch-up at start-up compares the used-keys
    // markers with what the index reads (the digests are read from the API) and rolls only the
    // workloads that read every key or run in any-key mode.
    rk.kill().await?;
    let before = generations(&api, &names).await?;
    patch_cm(&client, &ns.name, "other", "z").await?;
    rk.restart().await?;
    rk.settled(0.0).await?;
    e2e::wait_for("the catch-up's reloads", e2e::TIMEOUT, || async {
        let rolled = rolled(&api, &before).await?;
        Ok((rolled.len() >= 2).then_some(()))
    })
    .await?;
    rk.settled(0.0).await?;
    assert_eq!(rolled(&api, &before).await?, ["env-from", "plain"]);
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn the_flag_sets_the_default_and_any_key_opts_out() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-reload-on-flag").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    apply_yaml(&client, Some(&ns.name), SECRET).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-on=used-keys"],
            ..Default::default()
        },
    )
    .await?;
    let opted_out =
        json!({"reloader.stakater.com/auto": "true", "rekindle.io/reload-on": "any-key"});
    let invalid =
        json!({"reloader.stakater.com/auto": "true", "rekindle.io/reload-on": "some-keys"});
    let spec = json!({"containers": key_ref("configMapKeyRef", "shared", "used")});
    // The mode in the pod template's annotations counts too.
    deployment("by-default")
        .auto()
        .pod_spec(spec.clone())
        .apply(&client, &ns.name)
        .await?;
    deployment("in-template")
        .auto()
        .template_annotations(json!({"rekindle.io/reload-on": "any-key"}))
        .pod_spec(spec.clone())
        .apply(&client, &ns.name)
        .await?;
    deployment("opted-out")
        .annotations(opted_out)
        .pod_spec(spec.clone())
        .apply(&client, &ns.name)
        .await?;
    deployment("invalid")
        .annotations(invalid)
        .pod_spec(spec)
        .apply(&client, &ns.name)
        .await?;
    rk.wait_indexed(4.0).await?;
    let api = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let names = ["by-default", "in-template", "opted-out", "invalid"];

    let before = generations(&api, &names).await?;
    settle_after(&rk, patch_cm(&client, &ns.name, "other", "y")).await?;
    // An invalid mode falls back to the flag's default (used-keys here), with a Warning Event.
    assert_eq!(rolled(&api, &before).await?, ["in-template", "opted-out"]);
    let warnings = Api::<Event>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default().fields("reason=InvalidAnnotation"))
        .await?;
    let notes: Vec<String> = warnings
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("invalid"))
        .filter_map(|e| e.message.clone())
        .collect();
    assert!(
        notes.iter().any(|n| n.contains("some-keys")),
        "a Warning Event names the invalid value: {notes:?}"
    );

    let before = generations(&api, &names).await?;
    settle_after(&rk, patch_cm(&client, &ns.name, "used", "b")).await?;
    assert_eq!(
        rolled(&api, &before).await?,
        ["by-default", "in-template", "invalid", "opted-out"]
    );
    rk.stop().await?;
    ns.cleanup().await
}
