//! Which ConfigMaps, Secrets and SecretProviderClasses a pod template uses (behaviour §1), and which container
//! gets the env var for one of them (behaviour §6).

use std::collections::BTreeSet;

use serde_json::Value;

use super::{ResourceKind, WorkloadKind};

/// An object's name or namespace: kept in place up to 24 bytes (most names are), so the index's
/// hundreds of thousands of keys cost no allocation each (docs/scaling.md).
pub type Name = compact_str::CompactString;

/// A resource named by a workload, in the workload's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceRef {
    pub kind: ResourceKind,
    pub name: Name,
}

/// The container the env var goes to: index in `containers` and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    pub index: usize,
    pub name: String,
}

/// The pod template (`{metadata, spec}`) of a workload object, if it has one.
pub fn pod_template(obj: &Value, kind: WorkloadKind) -> Option<&Value> {
    at(obj, kind.template_pointer()).filter(|t| t.is_object())
}

/// The pod spec of a workload object. A Rollout with `workloadRef` has none.
pub fn pod_spec(obj: &Value, kind: WorkloadKind) -> Option<&Value> {
    pod_template(obj, kind)?
        .get("spec")
        .filter(|s| s.is_object())
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// `v.pointer(p)` for the simple pointers used here, without allocating (serde_json's `pointer`
/// allocates per token, which dominated extraction time).
pub fn at<'a>(v: &'a Value, pointer: &str) -> Option<&'a Value> {
    pointer
        .split('/')
        .skip(1)
        .try_fold(v, |node, token| node.get(token))
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    at(v, pointer).and_then(Value::as_str)
}

/// Every resource a pod spec names anywhere, before the container rule of behaviour §1 filters them.
fn named_resources(spec: &Value) -> BTreeSet<ResourceRef> {
    let mut out = BTreeSet::new();
    let mut add = |kind, name: Option<&str>| {
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            out.insert(ResourceRef {
                kind,
                name: name.into(),
            });
        }
    };
    for vol in array(spec, "volumes") {
        add(ResourceKind::ConfigMap, str_at(vol, "/configMap/name"));
        add(ResourceKind::Secret, str_at(vol, "/secret/secretName"));
        for src in vol
            .get("projected")
            .and_then(|p| p.get("sources"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            add(ResourceKind::ConfigMap, str_at(src, "/configMap/name"));
            add(ResourceKind::Secret, str_at(src, "/secret/name"));
        }
        add(
            ResourceKind::SecretProviderClass,
            str_at(vol, "/csi/volumeAttributes/secretProviderClass"),
        );
    }
    for c in array(spec, "containers")
        .iter()
        .chain(array(spec, "initContainers"))
    {
        for value_from in array(c, "env").iter().filter_map(|e| e.get("valueFrom")) {
            add(
                ResourceKind::ConfigMap,
                str_at(value_from, "/configMapKeyRef/name"),
            );
            add(
                ResourceKind::Secret,
                str_at(value_from, "/secretKeyRef/name"),
            );
        }
        for from in array(c, "envFrom") {
            add(ResourceKind::ConfigMap, str_at(from, "/configMapRef/name"));
            add(ResourceKind::Secret, str_at(from, "/secretRef/name"));
        }
    }
    out
}

/// The resources a pod spec references in the sense of behaviour §1: those for which the auto container
/// choice finds a container.
pub fn references(spec: &Value) -> BTreeSet<ResourceRef> {
    named_resources(spec)
        .into_iter()
        .filter(|r| choose_container(spec, r.kind, &r.name, true).is_some())
        .collect()
}

/// Whether the pod spec references `name` of `kind` (behaviour §1).
pub fn is_referenced(spec: &Value, kind: ResourceKind, name: &str) -> bool {
    choose_container(spec, kind, name, true).is_some()
}

/// The name of the first volume that uses the resource.
fn volume_name<'a>(spec: &'a Value, kind: ResourceKind, name: &str) -> Option<&'a str> {
    array(spec, "volumes").iter().find_map(|vol| {
        let uses = match kind {
            ResourceKind::ConfigMap => {
                str_at(vol, "/configMap/name") == Some(name)
                    || projected(vol).any(|s| str_at(s, "/configMap/name") == Some(name))
            }
            ResourceKind::Secret => {
                str_at(vol, "/secret/secretName") == Some(name)
                    || projected(vol).any(|s| str_at(s, "/secret/name") == Some(name))
            }
            ResourceKind::SecretProviderClass => {
                str_at(vol, "/csi/volumeAttributes/secretProviderClass") == Some(name)
            }
        };
        if uses {
            vol.get("name").and_then(Value::as_str)
        } else {
            None
        }
    })
}

fn projected(vol: &Value) -> impl Iterator<Item = &Value> {
    vol.get("projected")
        .and_then(|p| p.get("sources"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn mounts(container: &Value, volume: &str) -> bool {
    array(container, "volumeMounts")
        .iter()
        .any(|m| m.get("name").and_then(Value::as_str) == Some(volume))
}

fn env_references(container: &Value, kind: ResourceKind, name: &str) -> bool {
    let (key_ref, from_ref) = match kind {
        ResourceKind::ConfigMap => ("configMapKeyRef", "configMapRef"),
        ResourceKind::Secret => ("secretKeyRef", "secretRef"),
        ResourceKind::SecretProviderClass => return false,
    };
    let named =
        |v: Option<&Value>| v.and_then(|r| r.get("name")).and_then(Value::as_str) == Some(name);
    // Direct lookups: most env entries are plain values, and this runs per entry per candidate.
    array(container, "env")
        .iter()
        .any(|e| named(e.get("valueFrom").and_then(|v| v.get(key_ref))))
        || array(container, "envFrom")
            .iter()
            .any(|e| named(e.get(from_ref)))
}

fn container_ref(containers: &[Value], index: usize) -> Option<ContainerRef> {
    let c = containers.get(index)?;
    Some(ContainerRef {
        index,
        name: c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    })
}

/// behaviour §6. `auto` is true for auto/search decisions, which need a real reference; a named decision
/// falls back to the first container.
pub fn choose_container(
    spec: &Value,
    kind: ResourceKind,
    name: &str,
    auto: bool,
) -> Option<ContainerRef> {
    let containers = array(spec, "containers");
    let init = array(spec, "initContainers");
    if let Some(volume) = volume_name(spec, kind, name) {
        if let Some(i) = containers.iter().position(|c| mounts(c, volume)) {
            return container_ref(containers, i);
        }
        if init.iter().any(|c| mounts(c, volume)) {
            return container_ref(containers, 0);
        }
    }
    if let Some(i) = containers
        .iter()
        .position(|c| env_references(c, kind, name))
    {
        return container_ref(containers, i);
    }
    if init.iter().any(|c| env_references(c, kind, name)) {
        return container_ref(containers, 0);
    }
    if auto {
        None
    } else {
        container_ref(containers, 0)
    }
}

/// A resourceVersion as a number: versions of one resource compare as integers (Kubernetes'
/// comparable resource versions); `None` if it is not one.
pub fn resource_version(text: &str) -> Option<u64> {
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn r(kind: ResourceKind, name: &str) -> ResourceRef {
        ResourceRef {
            kind,
            name: name.into(),
        }
    }

    fn every_reference_kind() -> Value {
        json!({
            "volumes": [
                {"name": "v-cm", "configMap": {"name": "cm-vol"}},
                {"name": "v-sec", "secret": {"secretName": "sec-vol"}},
                {"name": "v-proj", "projected": {"sources": [
                    {"configMap": {"name": "cm-proj"}}, {"secret": {"name": "sec-proj"}}]}},
                {"name": "v-csi", "csi": {"driver": "any", "volumeAttributes": {"secretProviderClass": "spc"}}},
                {"name": "v-unmounted", "configMap": {"name": "cm-unmounted"}}
            ],
            "initContainers": [
                {"name": "init", "envFrom": [{"secretRef": {"name": "sec-init"}}],
                 "volumeMounts": [{"name": "v-csi", "mountPath": "/s"}]}
            ],
            "containers": [
                {"name": "app", "envFrom": [{"configMapRef": {"name": "cm-envfrom"}}],
                 "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "k"}}},
                         {"name": "P", "valueFrom": {"secretKeyRef": {"name": "sec-key", "key": "p"}}}],
                 "volumeMounts": [{"name": "v-cm", "mountPath": "/a"}, {"name": "v-sec", "mountPath": "/b"}]},
                {"name": "side", "envFrom": [{"secretRef": {"name": "sec-envfrom"}}],
                 "volumeMounts": [{"name": "v-proj", "mountPath": "/c"}]}
            ]
        })
    }

    #[test]
    fn every_reference_kind_is_found() {
        let got = references(&every_reference_kind());
        let want: BTreeSet<_> = [
            r(ResourceKind::ConfigMap, "cm-vol"),
            r(ResourceKind::ConfigMap, "cm-proj"),
            r(ResourceKind::ConfigMap, "cm-envfrom"),
            r(ResourceKind::ConfigMap, "cm-key"),
            r(ResourceKind::Secret, "sec-vol"),
            r(ResourceKind::Secret, "sec-proj"),
            r(ResourceKind::Secret, "sec-key"),
            r(ResourceKind::Secret, "sec-envfrom"),
            r(ResourceKind::Secret, "sec-init"),
            r(ResourceKind::SecretProviderClass, "spc"),
        ]
        .into_iter()
        .collect();
        // cm-unmounted has a volume nobody mounts: not a reference.
        assert_eq!(got, want);
    }

    #[test]
    fn container_choice() {
        let spec = every_reference_kind();
        let pick = |k, n, auto| choose_container(&spec, k, n, auto).map(|c| (c.index, c.name));
        assert_eq!(
            pick(ResourceKind::ConfigMap, "cm-vol", true),
            Some((0, "app".into()))
        );
        assert_eq!(
            pick(ResourceKind::ConfigMap, "cm-proj", true),
            Some((1, "side".into()))
        );
        assert_eq!(
            pick(ResourceKind::Secret, "sec-envfrom", true),
            Some((1, "side".into()))
        );
        // Only an init container uses it: the env var goes to containers[0].
        assert_eq!(
            pick(ResourceKind::Secret, "sec-init", true),
            Some((0, "app".into()))
        );
        assert_eq!(
            pick(ResourceKind::SecretProviderClass, "spc", true),
            Some((0, "app".into()))
        );
        // Not referenced: auto finds nothing, a named decision falls back to the first container.
        assert_eq!(pick(ResourceKind::ConfigMap, "other", true), None);
        assert_eq!(
            pick(ResourceKind::ConfigMap, "other", false),
            Some((0, "app".into()))
        );
        assert_eq!(pick(ResourceKind::ConfigMap, "cm-unmounted", true), None);
    }

    #[test]
    fn first_volume_wins_and_falls_through_to_env() {
        let spec = json!({
            "volumes": [{"name": "a", "configMap": {"name": "cm"}}, {"name": "b", "configMap": {"name": "cm"}}],
            "containers": [
                {"name": "x", "volumeMounts": [{"name": "b"}]},
                {"name": "y", "envFrom": [{"configMapRef": {"name": "cm"}}]}
            ]
        });
        // Volume "a" is first but unmounted: the env reference decides.
        assert_eq!(
            choose_container(&spec, ResourceKind::ConfigMap, "cm", true)
                .unwrap()
                .name,
            "y"
        );
    }

    #[test]
    fn no_containers_never_panics() {
        let spec = json!({"initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "cm"}}]}]});
        assert_eq!(
            choose_container(&spec, ResourceKind::ConfigMap, "cm", true),
            None
        );
        assert_eq!(
            choose_container(&spec, ResourceKind::ConfigMap, "cm", false),
            None
        );
        assert_eq!(
            choose_container(&json!({}), ResourceKind::Secret, "s", false),
            None
        );
        assert!(references(&json!({"volumes": 3, "containers": "x"})).is_empty());
    }

    #[test]
    fn pod_spec_per_kind() {
        let spec = json!({"containers": [{"name": "c"}]});
        let templated = json!({"spec": {"template": {"spec": spec}}});
        for kind in [
            WorkloadKind::Deployment,
            WorkloadKind::StatefulSet,
            WorkloadKind::DaemonSet,
            WorkloadKind::Job,
            WorkloadKind::Rollout,
            WorkloadKind::DeploymentConfig,
        ] {
            assert_eq!(pod_spec(&templated, kind), Some(&spec), "{kind}");
        }
        let cron = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}});
        assert_eq!(pod_spec(&cron, WorkloadKind::CronJob), Some(&spec));
        let workload_ref = json!({"spec": {"workloadRef": {"kind": "Deployment", "name": "d"}}});
        assert_eq!(pod_spec(&workload_ref, WorkloadKind::Rollout), None);
    }
}
