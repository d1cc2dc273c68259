use std::sync::Arc;

use crate::core::plan::Strategy;
use base64::Engine as _;
use proptest::prelude::{
    any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest, Just, ProptestConfig,
    Strategy as _,
};
use serde_json::{json, Value};

use super::*;
use crate::config::Scope;
use crate::core::policy::ResourceFlags;
use crate::core::ResourceKind;
use crate::index::ResourceKey;

const H1: &str = "3c9a892aeaedc759abc3df9884a37b8be5680382";
const ENV: &str = "STAKATER_APP_CONFIG_CONFIGMAP";

fn admission(strategy: Strategy) -> Admission {
    let mut registry = prometheus_client::registry::Registry::default();
    let index = Arc::new(Index::new());
    index.update_resource(
        &ResourceKey::new(ResourceKind::ConfigMap, "ns", "app-config"),
        ResourceEntry {
            hash: H1.into(),
            flags: ResourceFlags::default(),
        },
        None,
    );
    Admission {
        plan: PlanConfig {
            strategy,
            ..Default::default()
        },
        scope: Arc::new(ScopeFilter::new(&Scope::default())),
        index,
        metrics: Arc::new(Metrics::new(&mut registry, false)),
        self_username: Some("system:serviceaccount:rekindle:rekindle".into()),
        notify_only: false,
        kinds: WorkloadKind::ALL.to_vec(),
        lookup: None,
    }
}

fn deployment(env: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
            {"name": "app", "image": "busybox:1", "envFrom": [{"configMapRef": {"name": "app-config"}}], "env": env}]}}}})
}

fn review(op: &str, object: &Value, old: Option<&Value>, user: &str, dry_run: bool) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "namespace": "ns", "name": "web", "operation": op, "userInfo": {"username": user},
        "object": object, "oldObject": old, "dryRun": dry_run}}),
    )
    .unwrap()
}

/// Runs the webhook and returns the object as the apiserver would store it.
fn admit(a: &Admission, op: &str, object: &Value, old: Option<&Value>) -> (Value, Value) {
    let resp = a.review(&review(op, object, old, "alice", false)).unwrap();
    let r = &resp["response"];
    assert_eq!(r["uid"], "u-1");
    assert_eq!(r["allowed"], true);
    let mut out = object.clone();
    if let Some(p) = r["patch"].as_str() {
        let ops: json_patch::Patch =
            serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(p).unwrap())
                .unwrap();
        json_patch::patch(&mut out, &ops)
            .expect("the admission patch must apply to the object it was given");
    }
    (out, resp)
}

fn env_of(obj: &Value) -> &Value {
    obj.pointer("/spec/template/spec/containers/0/env")
        .unwrap_or(&Value::Null)
}

#[test]
fn create_stamps_the_current_hash() {
    let a = admission(Strategy::EnvVars);
    let (out, _) = admit(&a, "CREATE", &deployment(Value::Null), None);
    assert_eq!(env_of(&out), &json!([{"name": ENV, "value": H1}]));
    assert_eq!(a.index.sizes().provisional, 1);
}

#[test]
fn create_with_the_annotations_strategy() {
    let a = admission(Strategy::Annotations);
    let (out, _) = admit(&a, "CREATE", &deployment(Value::Null), None);
    assert_eq!(
        out.pointer("/spec/template/metadata/annotations/rekindle.io~1config-hashes")
            .unwrap(),
        &json!(format!(r#"{{"configmap/app-config":"{H1}"}}"#))
    );
    assert!(out
        .pointer("/spec/template/metadata/annotations/reloader.stakater.com~1last-reloaded-from")
        .is_none());
}

#[test]
fn a_marker_in_the_incoming_object_is_never_changed() {
    let a = admission(Strategy::EnvVars);
    let obj = deployment(json!([{"name": ENV, "value": "older"}]));
    let (out, resp) = admit(&a, "CREATE", &obj, None);
    assert!(resp["response"]["patch"].is_null());
    assert_eq!(out, obj);
}

#[test]
fn replace_with_the_original_manifest_restores_the_marker_in_place() {
    let a = admission(Strategy::EnvVars);
    let old = deployment(
        json!([{"name": "A", "value": "1"}, {"name": ENV, "value": "older"}, {"name": "B", "value": "2"}]),
    );
    let incoming = deployment(json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]));
    let (out, _) = admit(&a, "UPDATE", &incoming, Some(&old));
    assert_eq!(
        out, old,
        "the old marker comes back verbatim at its old position"
    );
}

#[test]
fn an_unchanged_template_never_gets_a_new_marker() {
    let a = admission(Strategy::EnvVars);
    let old = deployment(Value::Null);
    let mut incoming = old.clone();
    incoming["spec"]["replicas"] = json!(3);
    let (out, resp) = admit(&a, "UPDATE", &incoming, Some(&old));
    assert!(resp["response"]["patch"].is_null());
    assert_eq!(out, incoming);
    // A template change does get it.
    let mut changed = incoming.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:2");
    let (out, _) = admit(&a, "UPDATE", &changed, Some(&old));
    assert_eq!(env_of(&out), &json!([{"name": ENV, "value": H1}]));
}

#[test]
fn own_requests_and_dry_runs() {
    let a = admission(Strategy::EnvVars);
    let obj = deployment(Value::Null);
    let resp = a
        .review(&review(
            "CREATE",
            &obj,
            None,
            "system:serviceaccount:rekindle:rekindle",
            false,
        ))
        .unwrap();
    assert!(resp["response"]["patch"].is_null());
    let resp = a
        .review(&review("CREATE", &obj, None, "alice", true))
        .unwrap();
    assert!(
        resp["response"]["patch"].is_string(),
        "a dry-run shows the mutation"
    );
    assert_eq!(
        a.index.sizes().provisional,
        0,
        "but leaves no trace in the index"
    );
}

#[test]
fn malformed_requests_are_refused_with_a_reason() {
    let a = admission(Strategy::EnvVars);
    assert!(a.review(b"{not json").unwrap_err().contains("malformed"));
    assert!(a
        .review(b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\"}")
        .unwrap_err()
        .contains("no request"));
    // The apiserver always sends the resource and the user; a request without them is malformed.
    let mut body: Value = serde_json::from_slice(&review(
        "CREATE",
        &deployment(Value::Null),
        None,
        "a",
        false,
    ))
    .unwrap();
    body["request"].as_object_mut().unwrap().remove("resource");
    let err = a.review(&serde_json::to_vec(&body).unwrap()).unwrap_err();
    assert!(err.contains("resource"), "{err}");
    assert!(a.review(b"[1,2]").is_err());
}

#[test]
fn unknown_kinds_and_out_of_scope_namespaces_pass_unchanged() {
    let mut a = admission(Strategy::EnvVars);
    let mut body: Value = serde_json::from_slice(&review(
        "CREATE",
        &deployment(Value::Null),
        None,
        "alice",
        false,
    ))
    .unwrap();
    body["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    let resp = a.review(&serde_json::to_vec(&body).unwrap()).unwrap();
    assert!(resp["response"]["patch"].is_null());
    a.scope = Arc::new(ScopeFilter::new(&Scope {
        namespaces: Some(["other".to_string()].into()),
        ..Default::default()
    }));
    let resp = a
        .review(&review(
            "CREATE",
            &deployment(Value::Null),
            None,
            "alice",
            false,
        ))
        .unwrap();
    assert!(resp["response"]["patch"].is_null());
    assert_eq!(a.index.sizes().provisional, 0);
}

/// Paths the webhook may touch.
fn is_marker_path(path: &str) -> bool {
    let p = path.replace("~1", "/");
    p.contains("/env")
        || p.contains("rekindle.io/config-hashes")
        || p.ends_with("/annotations")
        || p.ends_with("/metadata")
}

fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z-]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_container() -> impl proptest::strategy::Strategy<Value = Value> {
    (
        prop_oneof![Just(json!("app")), Just(json!("side")), Just(Value::Null)],
        prop_oneof![
            Just(Value::Null),
            Just(json!([])),
            Just(json!([{"name": ENV, "value": "x"}])),
            Just(json!([{"name": ENV, "valueFrom": {"fieldRef": {"fieldPath": "a"}}}])),
            Just(json!("not-a-list")),
            arb_json(),
        ],
        prop_oneof![Just(json!([{"configMapRef": {"name": "app-config"}}])), Just(Value::Null), arb_json()],
        prop_oneof![Just(json!([{"name": "v", "mountPath": "/v"}])), Just(Value::Null)],
    )
        .prop_map(|(name, env, env_from, mounts)| json!({"name": name, "env": env, "envFrom": env_from, "volumeMounts": mounts}))
}

fn arb_workload() -> impl proptest::strategy::Strategy<Value = Value> {
    (
        prop::collection::vec(arb_container(), 0..3),
        // Metadata annotations are strings: the apiserver decodes the object before any webhook sees it.
        prop_oneof![Just(json!({"reloader.stakater.com/auto": "true"})), Just(json!({"configmap.reloader.stakater.com/reload": "app-.*"})), Just(Value::Null), prop::collection::btree_map(".{0,12}", ".{0,12}", 0..3).prop_map(|m| json!(m))],
        prop_oneof![Just(json!({"app": "x"})), Just(Value::Null), Just(json!({"annotations": null})), Just(json!({"annotations": {"rekindle.io/config-hashes": "{not json"}})), arb_json()],
        prop_oneof![Just(json!([{"name": "v", "configMap": {"name": "app-config"}}])), Just(Value::Null), arb_json()],
    )
        .prop_map(|(containers, ann, tmeta, volumes)| {
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "ns", "annotations": ann},
                "spec": {"template": {"metadata": tmeta, "spec": {"containers": containers, "volumes": volumes}}}})
        })
}

/// PROPTEST_CASES scales these up for long runs (`just fuzz`); 2,000 by default.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Arbitrary bytes on the wire: an answer or a clean refusal, never a panic.
    #[test]
    fn review_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let a = admission(Strategy::EnvVars);
        let _ = a.review(&bytes);
    }

    /// Arbitrary JSON in every field of the request: an answer or a clean refusal, never a panic.
    #[test]
    fn review_never_panics_on_arbitrary_requests(request in arb_json(), object in arb_json(), op in prop_oneof![Just("CREATE"), Just("UPDATE"), Just("DELETE"), Just("CONNECT")]) {
        let a = admission(Strategy::Annotations);
        let _ = a.review(&serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})).unwrap());
        let _ = a.review(&review(op, &object, Some(&object), "bob", false));
    }

    /// For any workload JSON the returned patch applies to it and touches only marker paths.
    #[test]
    fn admission_patch_always_applies(obj in arb_workload(), old in prop::option::of(arb_workload()), annotations in any::<bool>()) {
        let a = admission(if annotations { Strategy::Annotations } else { Strategy::EnvVars });
        let op = if old.is_some() { "UPDATE" } else { "CREATE" };
        let resp = a.review(&review(op, &obj, old.as_ref(), "alice", false)).unwrap();
        prop_assert_eq!(&resp["response"]["allowed"], &json!(true));
        if let Some(p) = resp["response"]["patch"].as_str() {
            let ops: json_patch::Patch = serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(p).unwrap()).unwrap();
            let mut out = obj.clone();
            prop_assert!(json_patch::patch(&mut out, &ops).is_ok(), "patch failed to apply: {:?}", ops);
            for op in &ops.0 {
                let v = serde_json::to_value(op).unwrap();
                prop_assert!(v["op"] != "test" && v["op"] != "remove", "unexpected op {}", v);
                let path = v["path"].as_str().unwrap();
                prop_assert!(is_marker_path(path), "op outside marker paths: {}", v);
            }
        }
    }
}

fn pod_review(op: &str, pod: &Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ns", "name": "", "operation": op, "userInfo": {"username": "operator"},
        "object": pod, "dryRun": false}}),
    )
    .unwrap()
}

fn pod(labels: Value, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "kafka-", "namespace": "ns", "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "busybox:1",
            "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}})
}

/// A labelled pod gets `rekindle.io/config-hashes` in its own annotations, under either strategy, its
/// spec untouched; an unlabelled pod, an update, or `--pod-restarts=false` get nothing.
#[test]
fn a_labelled_pod_is_stamped_with_the_hashes_it_starts_with() {
    let auto = json!({"reloader.stakater.com/auto": "true"});
    let labelled = pod(json!({"rekindle.io/restart": "pods"}), auto.clone());
    for strategy in [Strategy::EnvVars, Strategy::Annotations] {
        let mut a = admission(strategy);
        a.plan.pod_restarts = true;
        let resp = a.review(&pod_review("CREATE", &labelled)).unwrap();
        let ops: json_patch::Patch = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(resp["response"]["patch"].as_str().expect("a patch"))
                .unwrap(),
        )
        .unwrap();
        let mut out = labelled.clone();
        json_patch::patch(&mut out, &ops).unwrap();
        let hashes: Value = serde_json::from_str(
            out["metadata"]["annotations"]["rekindle.io/config-hashes"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(hashes, json!({"configmap/app-config": H1}));
        assert_eq!(out["spec"], labelled["spec"], "the spec is not changed");
        assert_eq!(
            out["metadata"]["annotations"]["reloader.stakater.com/auto"],
            "true"
        );
        // Nothing is recorded: a pod is not a workload of the index.
        assert_eq!(a.index.sizes().provisional, 0);
    }
    let mut a = admission(Strategy::EnvVars);
    a.plan.pod_restarts = true;
    let unpatched = |body: Vec<u8>| a.review(&body).unwrap()["response"].get("patch").is_none();
    assert!(unpatched(pod_review(
        "CREATE",
        &pod(json!({}), auto.clone())
    )));
    assert!(unpatched(pod_review("UPDATE", &labelled)));
    assert!(unpatched(pod_review(
        "CREATE",
        &pod(json!({"rekindle.io/restart": "pods"}), json!({}))
    )));
    let mut off = admission(Strategy::EnvVars);
    off.plan.pod_restarts = false;
    assert!(
        off.review(&pod_review("CREATE", &labelled)).unwrap()["response"]
            .get("patch")
            .is_none()
    );
}
