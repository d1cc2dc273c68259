//! Faults: rekindle killed in the middle of a burst loses no change and doubles none.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use e2e::rekindle::{Options, Rekindle};
use e2e::{admin_client, apply_value, dynamic_api, get_json, wait_for, TestNamespace};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use rekindle::core::hash::configmap_hash_typed;
use serde_json::{json, Value};

#[tokio::test]
async fn sigkill_mid_burst_loses_nothing_and_doubles_nothing() -> Result<()> {
    const WORKLOADS: usize = 50;
    const CHANGES: usize = 200;
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-sigkill").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..WORKLOADS {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "start"}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    for i in 0..WORKLOADS {
        apply_value(&client, Some(&ns.name), json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("d-{i}"), "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": format!("d-{i}")}}, "template": {"metadata": {"labels": {"app": format!("d-{i}")}},
                "spec": {"containers": [{"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": format!("cm-{i}")}}]}]}}}})).await?;
    }
    let mut changes_per_cm: BTreeMap<usize, usize> = BTreeMap::new();
    for c in 0..CHANGES {
        let i = (c * 37) % WORKLOADS;
        cms.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": format!("c{c}")}})),
        )
        .await?;
        *changes_per_cm.entry(i).or_default() += 1;
        if c == CHANGES / 2 {
            rk.kill().await?;
        }
        if c == CHANGES / 2 + 20 {
            rk.restart().await?;
        }
    }
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    // Every Deployment ends on its ConfigMap's current hash.
    wait_for(
        "every Deployment to carry its ConfigMap's current hash",
        Duration::from_secs(90),
        || async {
            for i in 0..WORKLOADS {
                let want = configmap_hash_typed(&cms.get(&format!("cm-{i}")).await?);
                let d = get_json(&deployments, &format!("d-{i}")).await?;
                let have = d
                    .pointer("/spec/template/spec/containers/0/env/0/value")
                    .and_then(Value::as_str)
                    .map(String::from);
                if have.as_deref() != Some(want.as_str()) {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Never doubled: a Deployment rolls at most once per change of its ConfigMap (coalescing may merge).
    // Counted by metadata.generation (every template write bumps it; nothing else writes the spec), which
    // does not depend on how quickly the controller-manager creates ReplicaSets on a loaded machine.
    for (i, changes) in &changes_per_cm {
        let d = get_json(&deployments, &format!("d-{i}")).await?;
        let rollouts = d
            .pointer("/metadata/generation")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .saturating_sub(1) as usize;
        assert!(
            rollouts >= 1 && rollouts <= *changes,
            "d-{i}: {rollouts} rollouts for {changes} changes"
        );
    }
    rk.stop().await?;
    ns.cleanup().await
}
