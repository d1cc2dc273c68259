//! The workload skeleton: the object cut down to exactly what planning and the strategic-merge
//! rendering read, so the writer can plan a reload from the index instead of reading the workload
//! again (one PATCH per reload, no GET).
//!
//! Kept: the reload annotations (metadata and pod template), the markers and
//! `rekindle.io/reload-on`, CronJob's `suspend`, and in the pod spec the volumes, env
//! entries and mounts that name a ConfigMap, Secret or SecretProviderClass (with the keys they read),
//! plus the marker env vars. Every container stays (pruned) so container indexes are the live
//! object's. A unit test checks that planning and rendering on the skeleton give what
//! they give on the full object. The uid and the reload window are the index entry's own fields
//! (`index::WorkloadEntry`), not kept here.

use serde_json::{Map, Value};

use super::envname::ENV_PREFIX;
use super::keys::RELOAD_ON_ANNOTATION;
use super::plan::PlanConfig;
use super::policy::{AnnotationKeys, CONFIG_HASHES_ANNOTATION, LAST_RELOADED_FROM_ANNOTATION};
use super::refs;
use super::WorkloadKind;

/// The skeleton of a workload object.
pub fn skeleton(keys: &AnnotationKeys, obj: &Value, kind: WorkloadKind) -> Value {
    let mut out = Map::new();
    let mut meta = Map::new();
    if let Some(a) = annotations(keys, refs::at(obj, "/metadata/annotations")) {
        meta.insert("annotations".into(), a);
    }
    out.insert("metadata".into(), Value::Object(meta));
    let mut template = Map::new();
    if let Some(t) = refs::pod_template(obj, kind) {
        if let Some(a) = annotations(keys, refs::at(t, "/metadata/annotations")) {
            template.insert("metadata".into(), json_object("annotations", a));
        }
        if let Some(spec) = t.get("spec").filter(|s| s.is_object()) {
            template.insert("spec".into(), pod_spec(spec));
        }
    }
    // Rebuild the path down to the template (`spec.template` or `spec.jobTemplate.spec.template`).
    let node = kind.under_template_path(Value::Object(template));
    let Value::Object(mut spec_root) = node else {
        unreachable!("json_object builds objects")
    };
    if let Some(spec) = spec_root.remove("spec") {
        out.insert("spec".into(), spec);
    }
    if kind == WorkloadKind::CronJob {
        if let Some(suspend) = refs::at(obj, "/spec/suspend") {
            if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("suspend".into(), suspend.clone());
            }
        }
    }
    Value::Object(out)
}

/// Whether a reload of this workload must read the live object rather than plan from its skeleton:
/// kinds without strategic merge (CRDs take a resourceVersion-guarded JSON patch with list positions),
/// Jobs (re-created whole), CronJobs creating a Job (the Job is the whole template), and Deployments
/// with a pause period (the pause writes fields a merge cannot guard).
pub fn needs_live_object(cfg: &PlanConfig, skeleton: &Value, kind: WorkloadKind) -> bool {
    !kind.strategic_merge()
        || super::plan::action_for(cfg, skeleton, kind) != super::plan::Action::Patch
        || (kind == WorkloadKind::Deployment
            && refs::at(skeleton, "/metadata/annotations")
                .and_then(|a| a.get(&cfg.policy.keys.pause_period))
                .is_some())
}

fn json_object(key: &str, value: Value) -> Value {
    let mut m = Map::new();
    m.insert(key.to_string(), value);
    Value::Object(m)
}

/// The annotations planning reads: the reload keys and the markers.
fn annotations(keys: &AnnotationKeys, annotations: Option<&Value>) -> Option<Value> {
    let kept: Map<String, Value> = annotations?
        .as_object()?
        .iter()
        .filter(|(k, _)| {
            k.as_str() == CONFIG_HASHES_ANNOTATION
                || k.as_str() == LAST_RELOADED_FROM_ANNOTATION
                || k.as_str() == keys.paused_at
                || k.as_str() == RELOAD_ON_ANNOTATION
                || keys.is_workload_key(k)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!kept.is_empty()).then_some(Value::Object(kept))
}

fn pod_spec(spec: &Value) -> Value {
    let mut out = Map::new();
    let volumes: Vec<Value> = list(spec, "volumes").filter_map(volume).collect();
    if !volumes.is_empty() {
        out.insert("volumes".into(), Value::Array(volumes));
    }
    for key in ["containers", "initContainers"] {
        if spec.get(key).is_some_and(Value::is_array) {
            out.insert(key.into(), list(spec, key).map(container).collect());
        }
    }
    Value::Object(out)
}

fn list<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v.get(key).and_then(Value::as_array).into_iter().flatten()
}

/// A volume that can name a resource, with only the fields that name it and the keys its `items`
/// read (behaviour §14).
fn volume(vol: &Value) -> Option<Value> {
    let mut out = Map::new();
    let name = vol.get("name")?.clone();
    if let Some(cm) = vol.get("configMap").filter(|c| c.get("name").is_some()) {
        out.insert("configMap".into(), source(cm, "name"));
    }
    if let Some(sec) = vol.get("secret").filter(|c| c.get("secretName").is_some()) {
        out.insert("secret".into(), source(sec, "secretName"));
    }
    if let Some(n) = refs::at(vol, "/csi/volumeAttributes/secretProviderClass") {
        let attrs = json_object("secretProviderClass", n.clone());
        out.insert("csi".into(), json_object("volumeAttributes", attrs));
    }
    let sources: Vec<Value> = list(vol.get("projected").unwrap_or(&Value::Null), "sources")
        .filter_map(|s| {
            ["configMap", "secret"].into_iter().find_map(|kind| {
                let src = s.get(kind).filter(|c| c.get("name").is_some())?;
                Some(json_object(kind, source(src, "name")))
            })
        })
        .collect();
    if !sources.is_empty() {
        out.insert(
            "projected".into(),
            json_object("sources", Value::Array(sources)),
        );
    }
    if out.is_empty() {
        return None;
    }
    out.insert("name".into(), name);
    Some(Value::Object(out))
}

/// A `configMap`/`secret` volume or projected source: its name field and its items' keys.
fn source(src: &Value, name_field: &str) -> Value {
    let mut out = Map::new();
    if let Some(n) = src.get(name_field) {
        out.insert(name_field.into(), n.clone());
    }
    if let Some(items) = src.get("items").and_then(Value::as_array) {
        let keys = items
            .iter()
            .filter_map(|i| Some(json_object("key", i.get("key")?.clone())))
            .collect();
        out.insert("items".into(), Value::Array(keys));
    }
    Value::Object(out)
}

/// A container with its name, the env entries that reference a resource or are markers, its
/// `envFrom` references and the names of its mounts.
fn container(c: &Value) -> Value {
    let mut out = Map::new();
    if let Some(name) = c.get("name") {
        out.insert("name".into(), name.clone());
    }
    let env: Vec<Value> = list(c, "env")
        .filter(|e| {
            let marker = e
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.starts_with(ENV_PREFIX));
            let reference = e.get("valueFrom").is_some_and(|v| {
                v.get("configMapKeyRef").is_some() || v.get("secretKeyRef").is_some()
            });
            marker || reference
        })
        .cloned()
        .collect();
    if !env.is_empty() {
        out.insert("env".into(), Value::Array(env));
    }
    let env_from: Vec<Value> = list(c, "envFrom")
        .filter(|e| e.get("configMapRef").is_some() || e.get("secretRef").is_some())
        .cloned()
        .collect();
    if !env_from.is_empty() {
        out.insert("envFrom".into(), Value::Array(env_from));
    }
    let mounts: Vec<Value> = list(c, "volumeMounts")
        .filter_map(|m| Some(json_object("name", m.get("name")?.clone())))
        .collect();
    if !mounts.is_empty() {
        out.insert("volumeMounts".into(), Value::Array(mounts));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::keys::ReloadOn;
    use crate::core::patch::render_strategic;
    use crate::core::plan::{plan, Change, CronJobStrategy, Event, Strategy};
    use crate::core::policy::ResourceFlags;
    use crate::core::ResourceKind;
    use serde_json::json;

    fn workloads() -> Vec<(WorkloadKind, Value)> {
        let pod = |annotations: Value| {
            json!({
                "metadata": {"labels": {"app": "x"}, "annotations": annotations},
                "spec": {
                    "serviceAccountName": "sa",
                    "volumes": [
                        {"name": "v-cm", "configMap": {"name": "cm-vol", "items": [{"key": "a", "path": "a"}]}},
                        {"name": "v-sec", "secret": {"secretName": "sec-vol", "defaultMode": 420}},
                        {"name": "v-proj", "projected": {"sources": [
                            {"serviceAccountToken": {"path": "t"}},
                            {"configMap": {"name": "cm-proj"}}, {"secret": {"name": "sec-proj"}}]}},
                        {"name": "v-csi", "csi": {"driver": "secrets-store.csi.k8s.io",
                            "volumeAttributes": {"secretProviderClass": "spc"}}},
                        {"name": "scratch", "emptyDir": {}}
                    ],
                    "initContainers": [{"name": "init", "image": "i",
                        "envFrom": [{"secretRef": {"name": "sec-init"}}]}],
                    "containers": [
                        {"name": "app", "image": "a", "args": ["--x"],
                         "envFrom": [{"configMapRef": {"name": "cm-envfrom"}}, {"prefix": "P_"}],
                         "env": [
                            {"name": "PLAIN", "value": "1"},
                            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "k"}}},
                            {"name": "STAKATER_CM_KEY_CONFIGMAP", "value": "old"}
                         ],
                         "volumeMounts": [{"name": "v-cm", "mountPath": "/a"}, {"name": "scratch", "mountPath": "/s"}]},
                        {"name": "side", "image": "s",
                         "volumeMounts": [{"name": "v-sec", "mountPath": "/b"},
                                          {"name": "v-proj", "mountPath": "/c"},
                                          {"name": "v-csi", "mountPath": "/d"}]}
                    ]
                }
            })
        };
        let auto = json!({"reloader.stakater.com/auto": "true", "kubectl.kubernetes.io/last-applied-configuration": "{}"});
        let named = json!({"configmap.reloader.stakater.com/reload": "cm-vol,unreferenced",
                           "secret.reloader.stakater.com/reload": "sec-.*"});
        let marked = json!({"reloader.stakater.com/auto": "true",
                            "rekindle.io/config-hashes": "{\"configmap/cm-vol\":\"old\"}"});
        let mut out = Vec::new();
        for ann in [auto, named, marked] {
            let meta = json!({"name": "w", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                              "annotations": ann, "managedFields": [{"manager": "kubectl"}]});
            for kind in [
                WorkloadKind::Deployment,
                WorkloadKind::StatefulSet,
                WorkloadKind::DaemonSet,
            ] {
                let in_template = json!({"metadata": meta, "spec": {"replicas": 2,
                    "template": pod(json!({"reloader.stakater.com/auto": "true"}))}, "status": {"replicas": 2}});
                let in_metadata = json!({"metadata": meta, "spec": {"template": pod(json!({}))}});
                out.push((kind, in_template));
                out.push((kind, in_metadata));
            }
            out.push((
                WorkloadKind::CronJob,
                json!({"metadata": meta, "spec": {"schedule": "* * * * *", "suspend": false,
                    "jobTemplate": {"spec": {"template": pod(json!({}))}}}}),
            ));
        }
        out
    }

    #[test]
    fn planning_on_the_skeleton_matches_planning_on_the_object() {
        let resources = [
            (ResourceKind::ConfigMap, "cm-vol"),
            (ResourceKind::ConfigMap, "cm-proj"),
            (ResourceKind::ConfigMap, "cm-envfrom"),
            (ResourceKind::ConfigMap, "cm-key"),
            (ResourceKind::ConfigMap, "unreferenced"),
            (ResourceKind::Secret, "sec-vol"),
            (ResourceKind::Secret, "sec-proj"),
            (ResourceKind::Secret, "sec-init"),
            (ResourceKind::SecretProviderClass, "spc"),
        ];
        let mut compared = 0;
        for (strategy, reload_on) in [
            (Strategy::EnvVars, ReloadOn::AnyKey),
            (Strategy::Annotations, ReloadOn::UsedKeys),
        ] {
            let cfg = PlanConfig {
                strategy,
                cronjob_strategy: CronJobStrategy::Template,
                reload_on_delete: true,
                reload_on,
                ..Default::default()
            };
            for (kind, obj) in workloads() {
                let skel = skeleton(&cfg.policy.keys, &obj, kind);
                assert!(!needs_live_object(&cfg, &skel, kind), "{kind}");
                for (res, name) in resources {
                    let r = crate::core::refs::ResourceRef {
                        kind: res,
                        name: name.into(),
                    };
                    let read = crate::core::plan::keys_read(&cfg, &obj, kind, &r);
                    assert_eq!(read, crate::core::plan::keys_read(&cfg, &skel, kind, &r));
                    if reload_on == ReloadOn::UsedKeys && name == "cm-vol" {
                        assert_eq!(read, Some(["a".to_string()].into()), "{kind}");
                    }
                    for event in [Event::Update, Event::Delete] {
                        let change = Change {
                            kind: res,
                            name,
                            namespace: "ns",
                            hash: "new",
                            flags: ResourceFlags::default(),
                            event,
                            also_current: None,
                        };
                        let full = plan(&cfg, &obj, kind, &change, 5);
                        let cut = plan(&cfg, &skel, kind, &change, 5);
                        assert_eq!(full.changes, cut.changes, "{kind} {res} {name} {event:?}");
                        assert_eq!(full.action, cut.action);
                        assert_eq!(full.decision.reload, cut.decision.reload);
                        let a = render_strategic(&obj, kind, &full.changes, "1").unwrap();
                        let b = render_strategic(&skel, kind, &cut.changes, "1").unwrap();
                        assert_eq!(a, b, "{kind} {res} {name} {event:?}");
                        compared += usize::from(!full.changes.is_empty());
                    }
                }
            }
        }
        assert!(compared > 100, "only {compared} non-empty plans compared");
    }

    #[test]
    fn the_skeleton_drops_what_planning_never_reads() {
        let cfg = PlanConfig::default();
        let (kind, obj) = workloads().remove(0);
        let skel = skeleton(&cfg.policy.keys, &obj, kind);
        let text = skel.to_string();
        for gone in [
            "managedFields",
            "last-applied-configuration",
            "image",
            "PLAIN",
            "fieldRef",
            "emptyDir",
            "serviceAccountToken",
            "replicas",
            "labels",
            "mountPath",
        ] {
            assert!(!text.contains(gone), "{gone} kept in {text}");
        }
        // Kept as typed fields of the index entry, not in the skeleton.
        assert_eq!(skel.pointer("/metadata/uid"), None);
    }

    #[test]
    fn reads_are_needed_for_jobs_crds_job_mode_and_pause() {
        let mut cfg = PlanConfig::default();
        let plain = json!({"metadata": {}, "spec": {"template": {"spec": {"containers": []}}}});
        assert!(!needs_live_object(&cfg, &plain, WorkloadKind::Deployment));
        for kind in [
            WorkloadKind::Job,
            WorkloadKind::Rollout,
            WorkloadKind::DeploymentConfig,
        ] {
            assert!(needs_live_object(&cfg, &plain, kind), "{kind}");
        }
        cfg.cronjob_strategy = CronJobStrategy::Job;
        assert!(needs_live_object(&cfg, &plain, WorkloadKind::CronJob));
        let paused = json!({"metadata": {"annotations": {
            "deployment.reloader.stakater.com/pause-period": "5m"}}});
        assert!(needs_live_object(
            &PlanConfig::default(),
            &paused,
            WorkloadKind::Deployment
        ));
    }
}
