//! Input from the cluster never panics the core: arbitrary JSON through reference extraction, the
//! decision and the rendering; arbitrary strings through the duration, selector and pattern parsers.
//! `PROPTEST_CASES` raises the case count for long runs.

use proptest::prelude::*;
use rekindle::config::selector::Selector;
use rekindle::core::duration::parse_go_duration;
use rekindle::core::plan::{plan, Change, Event, PlanConfig, Strategy as MarkerStrategy};
use rekindle::core::policy::{compile_pattern, ResourceFlags};
use rekindle::core::{patch, refs, ResourceKind, WorkloadKind};
use serde_json::{json, Value};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        prop_oneof![
            Just("cm".to_string()),
            Just("app".to_string()),
            Just("true".to_string()),
            ".{0,12}"
        ]
        .prop_map(Value::String),
    ];
    let keys = prop_oneof![
        Just("spec".to_string()),
        Just("template".to_string()),
        Just("containers".to_string()),
        Just("initContainers".to_string()),
        Just("volumes".to_string()),
        Just("env".to_string()),
        Just("envFrom".to_string()),
        Just("configMapRef".to_string()),
        Just("name".to_string()),
        Just("metadata".to_string()),
        Just("annotations".to_string()),
        Just("volumeMounts".to_string()),
        Just("configMap".to_string()),
        Just("secret".to_string()),
        Just("projected".to_string()),
        Just("sources".to_string()),
        Just("valueFrom".to_string()),
        Just("jobTemplate".to_string()),
        "[a-z]{1,5}",
    ];
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(keys.clone(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn core_never_panics_on_arbitrary_objects(obj in arb_json(), annotations in any::<bool>(), kind_i in 0usize..7) {
        let kind = WorkloadKind::ALL[kind_i];
        if let Some(spec) = refs::pod_spec(&obj, kind) {
            let _ = refs::references(spec);
        }
        let cfg = PlanConfig { strategy: if annotations { MarkerStrategy::Annotations } else { MarkerStrategy::EnvVars }, reload_on_delete: true, ..Default::default() };
        for (event, name) in [(Event::Update, "cm"), (Event::Delete, "app")] {
            let change = Change { kind: ResourceKind::ConfigMap, name, namespace: "ns", hash: "h", flags: ResourceFlags::default(), event, also_current: None };
            let p = plan(&cfg, &obj, kind, &change, 0);
            // Whatever the plan, rendering either works and applies, or is a clean error.
            if let Ok(ops) = patch::render(&obj, kind, &p.changes) {
                let mut out = obj.clone();
                prop_assert!(json_patch::patch(&mut out, &ops).is_ok());
            }
        }
    }

    #[test]
    fn parsers_never_panic(s in ".{0,40}") {
        let _ = parse_go_duration(&s);
        let _ = Selector::parse_legacy(&[s.as_str()]);
        let _ = compile_pattern(&s);
    }
}
