//! The guards of the writer's JSON patches, against the real apiserver's JSON-patch `test`.
//!
//! A retry planned on the object as read is guarded by the markers it replaces
//! (`core::patch::content_guard`): it must apply over other writers' labels, replicas and env vars,
//! and be refused, as a conflict the writer retries, when a marker moved or its container did. The
//! patches are built by the same core functions the writer calls, and the refusals classified by the
//! writer's own `WriteError`, so the apiserver's messages are checked here, not copied from its source.

use anyhow::{bail, Result};
use e2e::fixtures::{deployment, env_value};
use e2e::{admin_client, dynamic_api, get_json, TestNamespace};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::Api;
use rekindle::core::kinds::WorkloadKind;
use rekindle::core::patch::{content_guard, render, MarkerChange};
use rekindle::reload::error::WriteError;
use serde_json::{json, Value};

const MARKER: &str = "STAKATER_APP_CONFIG_CONFIGMAP";

/// The retry the writer sends after a conflict: the content guard, then the marker's new value, both
/// planned on `read`.
fn guarded_retry(read: &Value, value: &str) -> Result<json_patch::Patch> {
    let changes = [MarkerChange::SetEnv {
        container: 0,
        name: MARKER.into(),
        value: value.into(),
    }];
    let Some(mut ops) = content_guard(read, WorkloadKind::Deployment, &changes) else {
        bail!("no content guard for a marker that is there");
    };
    ops.extend(render(read, WorkloadKind::Deployment, &changes)?);
    Ok(json_patch::Patch(ops))
}

/// Another client's write, unguarded.
async fn other_writer(api: &Api<DynamicObject>, ops: Value) -> Result<()> {
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(ops)?),
    )
    .await?;
    Ok(())
}

/// Sends `patch` and returns how the writer classifies the apiserver's answer.
async fn send(api: &Api<DynamicObject>, patch: json_patch::Patch) -> Result<(), WriteError> {
    api.patch("web", &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(drop)
        .map_err(|e| WriteError::from_kube("PATCH", e))
}

/// Reads the object, lets another writer apply `moves`, then sends the retry planned on the read:
/// the apiserver must refuse it as a conflict.
async fn refused_after(api: &Api<DynamicObject>, moves: Value, what: &str) -> Result<()> {
    let read = get_json(api, "web").await?;
    other_writer(api, moves).await?;
    assert_conflict(send(api, guarded_retry(&read, "stale")?).await, what);
    Ok(())
}

fn assert_conflict(result: Result<(), WriteError>, what: &str) {
    match result {
        Err(WriteError::Conflict(_)) => {}
        other => panic!("{what}: expected a conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn a_retry_guarded_by_its_markers_is_refused_by_the_apiserver_only_when_one_moved(
) -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-guards").await?;
    let api = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    deployment("web")
        .containers(json!([{"name": "app", "image": "busybox", "env": [
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": MARKER, "value": "aaaa"},
        ]}]))
        .apply(&client, &ns.name)
        .await?;

    // Other writers move labels, replicas and another env var after the read: the retry applies.
    let read = get_json(&api, "web").await?;
    other_writer(
        &api,
        json!([
            {"op": "add", "path": "/metadata/labels", "value": {"team": "payments"}},
            {"op": "replace", "path": "/spec/replicas", "value": 3},
            {"op": "add", "path": "/spec/template/spec/containers/0/env/-",
             "value": {"name": "FEATURE", "value": "on"}},
        ]),
    )
    .await?;
    send(&api, guarded_retry(&read, "bbbb")?).await?;
    let now = get_json(&api, "web").await?;
    assert_eq!(
        env_value(&now, MARKER).as_deref(),
        Some("bbbb"),
        "the retry landed"
    );
    assert_eq!(
        env_value(&now, "FEATURE").as_deref(),
        Some("on"),
        "the other writer's env var kept"
    );
    assert_eq!(now["spec"]["replicas"], 3);
    assert_eq!(now["metadata"]["labels"]["team"], "payments");

    // Another leader wrote a newer marker after the read: refused, and its marker stays.
    refused_after(
        &api,
        json!([{"op": "replace", "path": "/spec/template/spec/containers/0/env/1/value", "value": "cccc"}]),
        "a marker replaced since the read",
    )
    .await?;
    assert_eq!(
        env_value(&get_json(&api, "web").await?, MARKER).as_deref(),
        Some("cccc")
    );
    // The container at the index was renamed: its name is tested.
    refused_after(
        &api,
        json!([{"op": "replace", "path": "/spec/template/spec/containers/0/name", "value": "main"}]),
        "the container renamed",
    )
    .await?;
    // The env entries before the marker were removed: the tested index is past the end.
    refused_after(
        &api,
        json!([{"op": "replace", "path": "/spec/template/spec/containers/0/env",
                "value": [{"name": "ONLY", "value": "x"}]}]),
        "the tested env entry gone",
    )
    .await?;
    let now = get_json(&api, "web").await?;
    assert_eq!(
        env_value(&now, MARKER),
        None,
        "nothing written over the moved env"
    );
    ns.cleanup().await?;
    Ok(())
}

/// Why the content guard leaves values with `<`, `>`, `&` or non-ASCII characters to the
/// resourceVersion guard: the apiserver compares a tested string by its JSON bytes, and its encoder
/// escapes some of those characters where rekindle's does not, so a `test` of an equal value fails.
/// Most non-ASCII text compares equal; U+2028 does not, and the guard keeps to printable ASCII
/// rather than list the exceptions. v1.35 compares `>` equal; the guard leaves it out too, as the
/// HTML escaping that covers `<` and `&` in Go's encoder covers it.
#[tokio::test]
async fn the_apiserver_refuses_a_test_of_an_equal_value_it_encodes_differently() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-guards").await?;
    let api = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let values = [
        "plain-value_1.2",
        "a<b",
        "a&b",
        "grüß",
        "line\u{2028}separator",
    ];
    let env: Vec<Value> = values
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"name": format!("V{i}"), "value": v}))
        .collect();
    deployment("web")
        .containers(json!([{"name": "app", "image": "busybox", "env": env}]))
        .apply(&client, &ns.name)
        .await?;
    let mut refused = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let test: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": format!("/spec/template/spec/containers/0/env/{i}"),
             "value": {"name": format!("V{i}"), "value": v}},
            {"op": "add", "path": "/spec/minReadySeconds", "value": i},
        ]))?;
        match send(&api, test).await {
            Ok(()) => {}
            Err(WriteError::Conflict(_)) => refused.push(*v),
            Err(e) => bail!("testing {v:?}: {e}"),
        }
    }
    assert_eq!(
        refused,
        ["a<b", "a&b", "line\u{2028}separator"],
        "which equal values the apiserver's test refuses"
    );
    ns.cleanup().await?;
    Ok(())
}
