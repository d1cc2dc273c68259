//! Objects that exist in real clusters, through the real apiserver and the webhook: 200 containers,
//! thousands of env entries, annotations near the 256 KiB limit, non-ASCII data, dotted names,
//! generateName. Each is admitted (never a patch that fails to apply) and stamped where it can be.

use anyhow::Result;
use e2e::fixtures::deployment;
use e2e::rekindle::{Options, Rekindle};
use e2e::{admin_client, dynamic_api, get_json, wait_for, TestNamespace, TIMEOUT};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::Api;
use rekindle::core::hash::configmap_hash_typed;
use serde_json::{json, Value};

fn env_of(d: &Value, container: usize, name: &str) -> Option<String> {
    d.pointer(&format!("/spec/template/spec/containers/{container}/env"))?
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map(String::from)
}

/// Annotation values adding up to `bytes`, in 60 KiB pieces.
fn filler(bytes: usize) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    let mut left = bytes;
    let mut i = 0;
    while left > 0 {
        let key = format!("example.com/filler-{i}");
        let n = left.saturating_sub(key.len()).min(60 * 1024);
        out.insert(key.clone(), Value::String("x".repeat(n)));
        left = left.saturating_sub(key.len() + n);
        i += 1;
        if n == 0 {
            break;
        }
    }
    out
}

#[tokio::test]
async fn objects_from_real_clusters_are_admitted_and_stamped_where_possible() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-real").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    // A dotted name and non-ASCII data.
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "app.config-v2"},
            "data": {"greeting": "grüß dich ✓ 你好", "emoji": "🔥"}}))?,
    )
    .await?;
    let hash = configmap_hash_typed(&cms.get("app.config-v2").await?);
    let var = "STAKATER_APP_CONFIG_V2_CONFIGMAP";
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    let uses_cm = json!([{"configMapRef": {"name": "app.config-v2"}}]);

    // 200 containers, the 150th the only one that uses the ConfigMap.
    let containers: Vec<Value> = (0..200)
        .map(|i| {
            let mut c = json!({"name": format!("c{i}"), "image": "busybox"});
            if i == 150 {
                c["envFrom"] = uses_cm.clone();
            }
            c
        })
        .collect();
    deployment("many")
        .annotations(auto.clone())
        .containers(json!(containers))
        .apply(&client, &ns.name)
        .await?;
    let d = get_json(&deployments, "many").await?;
    assert_eq!(
        env_of(&d, 150, var),
        Some(hash.clone()),
        "stamped into the container that uses it"
    );
    assert_eq!(env_of(&d, 0, var), None);

    // 3,000 env entries.
    let env: Vec<Value> = (0..3000)
        .map(|i| json!({"name": format!("VAR_{i}"), "value": format!("value-{i}")}))
        .collect();
    deployment("big-env")
        .annotations(auto.clone())
        .containers(json!([{"name": "app", "image": "busybox", "env": env, "envFrom": uses_cm}]))
        .apply(&client, &ns.name)
        .await?;
    let d = get_json(&deployments, "big-env").await?;
    assert_eq!(env_of(&d, 0, var), Some(hash.clone()));
    assert_eq!(
        env_of(&d, 0, "VAR_2999").as_deref(),
        Some("value-2999"),
        "the user's env kept"
    );

    // Metadata annotations 1 KiB short of the limit: the env-var stamp does not touch them.
    let mut annotations = filler(255 * 1024);
    annotations.insert("reloader.stakater.com/auto".into(), json!("true"));
    deployment("big-annotations")
        .annotations(Value::Object(annotations))
        .containers(json!([{"name": "app", "image": "busybox", "envFrom": uses_cm}]))
        .apply(&client, &ns.name)
        .await?;
    let d = get_json(&deployments, "big-annotations").await?;
    assert_eq!(env_of(&d, 0, var), Some(hash.clone()));

    // generateName: the name is not known at admission; the stamp is.
    let api: Api<DynamicObject> = deployments.clone();
    let mut generated: DynamicObject = serde_json::from_value(
        deployment("x")
            .annotations(auto.clone())
            .containers(json!([{"name": "app", "image": "busybox", "envFrom": uses_cm}]))
            .build(),
    )?;
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let created = api.create(&PostParams::default(), &generated).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    assert!(name.starts_with("gen-"));
    let d = serde_json::to_value(&created)?;
    assert_eq!(
        env_of(&d, 0, var),
        Some(hash.clone()),
        "generateName workload stamped"
    );

    // And all of them reload on a change of the non-ASCII data.
    cms.patch(
        "app.config-v2",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"greeting": "¡hola! ✓✓"}})),
    )
    .await?;
    let new_hash = configmap_hash_typed(&cms.get("app.config-v2").await?);
    for (name, container) in [
        ("many", 150),
        ("big-env", 0),
        ("big-annotations", 0),
        (name.as_str(), 0),
    ] {
        wait_for(&format!("{name} to reload"), TIMEOUT, || async {
            let d = get_json(&deployments, name).await?;
            Ok((env_of(&d, container, var).as_deref() == Some(new_hash.as_str())).then_some(()))
        })
        .await?;
    }
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn a_stamp_that_would_break_the_annotation_limit_is_not_made_and_the_create_succeeds(
) -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-limit").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"k": "v"}}))?,
    )
    .await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-strategy=annotations"],
            ..Default::default()
        },
    )
    .await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    // Pod-template annotations 40 bytes short of 256 KiB: the annotations-strategy stamp cannot fit.
    let template = Value::Object(filler(256 * 1024 - 40));
    deployment("full").auto().template_annotations(template).containers(json!([{"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": "cfg"}}]}])).apply(&client, &ns.name).await?;
    let d = get_json(&deployments, "full").await?;
    assert!(
        d.pointer("/spec/template/metadata/annotations/rekindle.io~1config-hashes")
            .is_none(),
        "no stamp past the limit"
    );
    // Room to spare: stamped.
    let template = Value::Object(filler(200 * 1024));
    deployment("roomy").auto().template_annotations(template).containers(json!([{"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": "cfg"}}]}])).apply(&client, &ns.name).await?;
    let d = get_json(&deployments, "roomy").await?;
    assert!(d
        .pointer("/spec/template/metadata/annotations/rekindle.io~1config-hashes")
        .is_some());
    // The refused stamp is counted (and returned to the client as an admission warning).
    assert_eq!(
        rk.metric("rekindle_admission_requests_total{operation=\"create\",result=\"error\"}")
            .await?,
        1.0
    );
    rk.stop().await?;
    ns.cleanup().await
}
