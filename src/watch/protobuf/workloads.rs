//! Deployments, StatefulSets and DaemonSets in protobuf, decoded into the JSON the index reads
//! ([`WorkloadObject`]).
//!
//! The messages below hold what rekindle reads of these kinds and nothing else: the metadata the
//! index and the watcher use, the spec's replicas, pause, selector and update strategy, the status a
//! rollout is judged by, and in the pod template what `core::skeleton` keeps (the reload annotations,
//! and the volumes, env entries, `envFrom` and mounts that can name a ConfigMap, Secret or
//! SecretProviderClass). They serialise to the apiserver's own JSON for those fields (names,
//! `omitempty` as in `k8s.io/api`'s Go tags), so everything downstream is the code the JSON watch
//! runs. A test decodes the same workloads captured in both encodings from a kube-apiserver and
//! compares what the index, rollouts and pod restarts make of them.

use std::collections::BTreeMap;

use prost::Message;
use serde::{Serialize, Serializer};
use serde_json::Value;

use super::{Decode, TimePb};
use crate::watch::workload_object::WorkloadObject;

/// A workload kind's message (`metadata`, `spec`, `status` at tags 1 to 3 in every apps/v1 kind), and
/// its decoding into the JSON the index reads, typed as the JSON watch types it.
macro_rules! workload_message {
    ($name:ident, $kind:literal, $spec:ty, $status:ty) => {
        #[derive(Clone, PartialEq, Message, Serialize)]
        pub struct $name {
            #[prost(message, optional, tag = "1")]
            #[serde(skip_serializing_if = "Option::is_none")]
            metadata: Option<MetaPb>,
            #[prost(message, optional, tag = "2")]
            #[serde(skip_serializing_if = "Option::is_none")]
            spec: Option<$spec>,
            #[prost(message, optional, tag = "3")]
            #[serde(skip_serializing_if = "Option::is_none")]
            status: Option<$status>,
        }

        impl Decode for $name {
            const KIND: &'static str = $kind;
            type Object = WorkloadObject;

            fn bookmark(&self) -> (&str, &BTreeMap<String, String>) {
                bookmark(self.metadata.as_ref())
            }

            fn into_object(self) -> Result<WorkloadObject, String> {
                typed(serde_json::to_value(&self), $kind)
            }
        }
    };
}

workload_message!(
    DeploymentPb,
    "Deployment",
    DeploymentSpecPb,
    DeploymentStatusPb
);
workload_message!(
    StatefulSetPb,
    "StatefulSet",
    StatefulSetSpecPb,
    StatefulSetStatusPb
);
workload_message!(DaemonSetPb, "DaemonSet", DaemonSetSpecPb, DaemonSetStatusPb);

fn bookmark(metadata: Option<&MetaPb>) -> (&str, &BTreeMap<String, String>) {
    static NONE: BTreeMap<String, String> = BTreeMap::new();
    metadata.map_or(("", &NONE), |m| {
        (m.resource_version.as_str(), &m.annotations)
    })
}

/// The decoded fields as an apps/v1 object of `kind`.
fn typed(object: serde_json::Result<Value>, kind: &str) -> Result<WorkloadObject, String> {
    let mut object = object.map_err(|e| e.to_string())?;
    if let Value::Object(o) = &mut object {
        o.insert("apiVersion".into(), "apps/v1".into());
        o.insert("kind".into(), kind.into());
    }
    WorkloadObject::from_value(object).map_err(|e| e.to_string())
}

fn is_false(b: &bool) -> bool {
    !b
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// `metav1.Time` as Kubernetes writes it in JSON (RFC 3339, UTC, whole seconds).
fn rfc3339<S: Serializer>(t: &Option<TimePb>, s: S) -> Result<S::Ok, S::Error> {
    match t
        .as_ref()
        .and_then(|t| jiff::Timestamp::from_second(t.seconds).ok())
    {
        Some(ts) => s.collect_str(&ts),
        None => s.serialize_none(),
    }
}

/// A zero `metav1.Time` (a pod template's `creationTimestamp`) is an empty message, and JSON
/// leaves it out.
fn no_time(t: &Option<TimePb>) -> bool {
    t.as_ref().is_none_or(|t| t.seconds == 0)
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct MetaPb {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[prost(string, tag = "3")]
    #[serde(skip_serializing_if = "String::is_empty")]
    namespace: String,
    #[prost(string, tag = "5")]
    #[serde(skip_serializing_if = "String::is_empty")]
    uid: String,
    #[prost(string, tag = "6")]
    #[serde(skip_serializing_if = "String::is_empty")]
    resource_version: String,
    #[prost(int64, tag = "7")]
    #[serde(skip_serializing_if = "is_zero")]
    generation: i64,
    #[prost(message, optional, tag = "8")]
    #[serde(serialize_with = "rfc3339", skip_serializing_if = "no_time")]
    creation_timestamp: Option<TimePb>,
    #[prost(btree_map = "string, string", tag = "11")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct DeploymentSpecPb {
    #[prost(int32, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<i32>,
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<LabelSelectorPb>,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<PodTemplateSpecPb>,
    #[prost(bool, tag = "7")]
    #[serde(skip_serializing_if = "is_false")]
    paused: bool,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct DeploymentStatusPb {
    #[prost(int64, tag = "1")]
    #[serde(skip_serializing_if = "is_zero")]
    observed_generation: i64,
    #[prost(int32, tag = "2")]
    #[serde(skip_serializing_if = "is_zero")]
    replicas: i32,
    #[prost(int32, tag = "3")]
    #[serde(skip_serializing_if = "is_zero")]
    updated_replicas: i32,
    #[prost(int32, tag = "7")]
    #[serde(skip_serializing_if = "is_zero")]
    ready_replicas: i32,
    #[prost(int32, tag = "4")]
    #[serde(skip_serializing_if = "is_zero")]
    available_replicas: i32,
    #[prost(int32, tag = "5")]
    #[serde(skip_serializing_if = "is_zero")]
    unavailable_replicas: i32,
    #[prost(message, repeated, tag = "6")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    conditions: Vec<ConditionPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct ConditionPb {
    #[prost(string, tag = "1")]
    r#type: String,
    #[prost(string, tag = "2")]
    status: String,
    #[prost(string, tag = "4")]
    #[serde(skip_serializing_if = "String::is_empty")]
    reason: String,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct StatefulSetSpecPb {
    #[prost(int32, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<i32>,
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<LabelSelectorPb>,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<PodTemplateSpecPb>,
    #[prost(message, optional, tag = "7")]
    #[serde(skip_serializing_if = "Option::is_none")]
    update_strategy: Option<UpdateStrategyPb>,
}

/// The fields without `omitempty` in `k8s.io/api` are written whatever their value, as JSON does.
#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct StatefulSetStatusPb {
    #[prost(int64, tag = "1")]
    #[serde(skip_serializing_if = "is_zero")]
    observed_generation: i64,
    #[prost(int32, tag = "2")]
    replicas: i32,
    #[prost(int32, tag = "3")]
    #[serde(skip_serializing_if = "is_zero")]
    ready_replicas: i32,
    #[prost(int32, tag = "4")]
    #[serde(skip_serializing_if = "is_zero")]
    current_replicas: i32,
    #[prost(int32, tag = "5")]
    #[serde(skip_serializing_if = "is_zero")]
    updated_replicas: i32,
    #[prost(string, tag = "6")]
    #[serde(skip_serializing_if = "String::is_empty")]
    current_revision: String,
    #[prost(string, tag = "7")]
    #[serde(skip_serializing_if = "String::is_empty")]
    update_revision: String,
    #[prost(int32, tag = "11")]
    available_replicas: i32,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct DaemonSetSpecPb {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<LabelSelectorPb>,
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<PodTemplateSpecPb>,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    update_strategy: Option<UpdateStrategyPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct DaemonSetStatusPb {
    #[prost(int32, tag = "1")]
    current_number_scheduled: i32,
    #[prost(int32, tag = "2")]
    number_misscheduled: i32,
    #[prost(int32, tag = "3")]
    desired_number_scheduled: i32,
    #[prost(int32, tag = "4")]
    number_ready: i32,
    #[prost(int64, tag = "5")]
    #[serde(skip_serializing_if = "is_zero")]
    observed_generation: i64,
    #[prost(int32, tag = "6")]
    #[serde(skip_serializing_if = "is_zero")]
    updated_number_scheduled: i32,
    #[prost(int32, tag = "7")]
    #[serde(skip_serializing_if = "is_zero")]
    number_available: i32,
    #[prost(int32, tag = "8")]
    #[serde(skip_serializing_if = "is_zero")]
    number_unavailable: i32,
}

/// A StatefulSet's or DaemonSet's `updateStrategy`: its type is what rekindle reads (`OnDelete`).
#[derive(Clone, PartialEq, Message, Serialize)]
struct UpdateStrategyPb {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    r#type: String,
}

/// `metav1.LabelSelector`: the pods a walk of pod restarts lists (`core::restart::selector`).
#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct LabelSelectorPb {
    #[prost(btree_map = "string, string", tag = "1")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    match_labels: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    match_expressions: Vec<RequirementPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct RequirementPb {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    operator: String,
    #[prost(string, repeated, tag = "3")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    values: Vec<String>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct PodTemplateSpecPb {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<MetaPb>,
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<PodSpecPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct PodSpecPb {
    #[prost(message, repeated, tag = "1")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    volumes: Vec<VolumePb>,
    #[prost(message, repeated, tag = "20")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    init_containers: Vec<ContainerPb>,
    #[prost(message, repeated, tag = "2")]
    containers: Vec<ContainerPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct VolumePb {
    #[prost(string, tag = "1")]
    name: String,
    /// Inlined in JSON.
    #[prost(message, optional, tag = "2")]
    #[serde(flatten)]
    source: Option<VolumeSourcePb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct VolumeSourcePb {
    #[prost(message, optional, tag = "6")]
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<SecretVolumePb>,
    #[prost(message, optional, tag = "19")]
    #[serde(skip_serializing_if = "Option::is_none")]
    config_map: Option<SourcePb>,
    #[prost(message, optional, tag = "26")]
    #[serde(skip_serializing_if = "Option::is_none")]
    projected: Option<ProjectedPb>,
    #[prost(message, optional, tag = "28")]
    #[serde(skip_serializing_if = "Option::is_none")]
    csi: Option<CsiPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct SecretVolumePb {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    secret_name: String,
    #[prost(message, repeated, tag = "2")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    items: Vec<KeyToPathPb>,
    #[prost(bool, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    optional: Option<bool>,
}

/// A `configMap` volume, or a projected `configMap` or `secret` source: the same fields at the same
/// tags.
#[derive(Clone, PartialEq, Message, Serialize)]
struct SourcePb {
    /// `LocalObjectReference`, inlined in JSON.
    #[prost(message, optional, tag = "1")]
    #[serde(flatten)]
    reference: Option<ReferencePb>,
    #[prost(message, repeated, tag = "2")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    items: Vec<KeyToPathPb>,
    #[prost(bool, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    optional: Option<bool>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct ReferencePb {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct KeyToPathPb {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    path: String,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct ProjectedPb {
    #[prost(message, repeated, tag = "1")]
    sources: Vec<ProjectionPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct ProjectionPb {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<SourcePb>,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    config_map: Option<SourcePb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct CsiPb {
    #[prost(string, tag = "1")]
    driver: String,
    #[prost(btree_map = "string, string", tag = "4")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    volume_attributes: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerPb {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "19")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env_from: Vec<EnvFromPb>,
    #[prost(message, repeated, tag = "7")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<EnvVarPb>,
    #[prost(message, repeated, tag = "9")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    volume_mounts: Vec<MountPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct EnvVarPb {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "String::is_empty")]
    value: String,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    value_from: Option<EnvVarSourcePb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct EnvVarSourcePb {
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    config_map_key_ref: Option<KeySelectorPb>,
    #[prost(message, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_key_ref: Option<KeySelectorPb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct KeySelectorPb {
    #[prost(message, optional, tag = "1")]
    #[serde(flatten)]
    reference: Option<ReferencePb>,
    #[prost(string, tag = "2")]
    key: String,
    #[prost(bool, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    optional: Option<bool>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct EnvFromPb {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "String::is_empty")]
    prefix: String,
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    config_map_ref: Option<EnvSourcePb>,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_ref: Option<EnvSourcePb>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
struct EnvSourcePb {
    #[prost(message, optional, tag = "1")]
    #[serde(flatten)]
    reference: Option<ReferencePb>,
    #[prost(bool, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    optional: Option<bool>,
}

#[derive(Clone, PartialEq, Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct MountPb {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "3")]
    mount_path: String,
    #[prost(string, tag = "4")]
    #[serde(skip_serializing_if = "String::is_empty")]
    sub_path: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::keys::ReloadOn;
    use crate::core::plan::{PlanConfig, Strategy};
    use crate::core::{pause, restart, rollout, WorkloadKind};
    use crate::index::WorkloadEntry;

    // Captured from kube-apiserver 1.35 by testdata/capture.py: the workloads of
    // testdata/objects.json once their controllers had settled, as a protobuf watch's first state and
    // as the JSON list, kind by kind.
    const DEPLOYMENTS: (&[u8], &str) = (
        include_bytes!("testdata/deployments.pb"),
        include_str!("testdata/deployments.json"),
    );
    const STATEFULSETS: (&[u8], &str) = (
        include_bytes!("testdata/statefulsets.pb"),
        include_str!("testdata/statefulsets.json"),
    );
    const DAEMONSETS: (&[u8], &str) = (
        include_bytes!("testdata/daemonsets.pb"),
        include_str!("testdata/daemonsets.json"),
    );

    /// Each workload of a capture in both encodings, paired by name, at the same resourceVersion.
    fn pairs<M: Decode<Object = WorkloadObject>>(
        (pb, json): (&[u8], &str),
    ) -> Vec<(WorkloadObject, WorkloadObject)> {
        let decoded = super::super::first_state::<M>(pb);
        let listed: Value = serde_json::from_str(json).unwrap();
        let listed: Vec<WorkloadObject> = serde_json::from_value(listed["items"].clone()).unwrap();
        assert!(!decoded.is_empty());
        assert_eq!(listed.len(), decoded.len());
        decoded
            .into_iter()
            .map(|pb| {
                let json = listed
                    .iter()
                    .find(|j| j.metadata.name == pb.metadata.name)
                    .expect("the same workload in JSON")
                    .clone();
                assert_eq!(
                    json.metadata.resource_version, pb.metadata.resource_version,
                    "captured at one version"
                );
                (pb, json)
            })
            .collect()
    }

    /// Every captured workload of the three kinds, with its kind.
    fn all_pairs() -> Vec<(WorkloadKind, WorkloadObject, WorkloadObject)> {
        let tag = |kind, pairs: Vec<(WorkloadObject, WorkloadObject)>| {
            pairs.into_iter().map(move |(pb, json)| (kind, pb, json))
        };
        let deployments = pairs::<DeploymentPb>(DEPLOYMENTS);
        let statefulsets = pairs::<StatefulSetPb>(STATEFULSETS);
        let daemonsets = pairs::<DaemonSetPb>(DAEMONSETS);
        assert_eq!(
            (deployments.len(), statefulsets.len(), daemonsets.len()),
            (3, 2, 2)
        );
        tag(WorkloadKind::Deployment, deployments)
            .chain(tag(WorkloadKind::StatefulSet, statefulsets))
            .chain(tag(WorkloadKind::DaemonSet, daemonsets))
            .collect()
    }

    /// Where `part` is not a sub-tree of `whole` (objects: every key of `part` with a sub-tree
    /// value; arrays: element by element, same length).
    fn outside(part: &Value, whole: &Value, at: &str) -> Vec<String> {
        match (part, whole) {
            (Value::Object(p), Value::Object(w)) => p
                .iter()
                .flat_map(|(k, v)| match w.get(k) {
                    Some(wv) => outside(v, wv, &format!("{at}/{k}")),
                    None => vec![format!("{at}/{k} is not in the JSON")],
                })
                .collect(),
            (Value::Array(p), Value::Array(w)) if p.len() == w.len() => p
                .iter()
                .zip(w)
                .enumerate()
                .flat_map(|(i, (pv, wv))| outside(pv, wv, &format!("{at}/{i}")))
                .collect(),
            _ if part == whole => vec![],
            _ => vec![format!("{at}: {part} against {whole}")],
        }
    }

    /// Every field decoded from protobuf is the apiserver's JSON for it: same name, same value, and
    /// nothing the JSON leaves out (`omitempty`).
    #[test]
    fn what_is_decoded_is_the_apiservers_json() {
        for (kind, pb, json) in all_pairs() {
            // List items carry no apiVersion and kind; watch events (and the decoded objects) do.
            let mut object = pb.object.clone();
            assert_eq!(object["kind"], kind.to_string());
            assert_eq!(object["apiVersion"], "apps/v1");
            for typed in ["apiVersion", "kind"] {
                object.as_object_mut().unwrap().remove(typed);
            }
            let wrong = outside(&object, &json.object, "");
            assert!(
                wrong.is_empty(),
                "{kind} {:?}: {wrong:#?}",
                pb.metadata.name
            );
            assert_eq!(pb.metadata, {
                let mut m = json.metadata.clone();
                m.managed_fields = None;
                m
            });
        }
    }

    /// What the index, rollouts, pauses and pod restarts make of a workload is the same from either
    /// encoding, under each strategy and reload mode.
    #[test]
    fn the_index_makes_the_same_of_both_encodings() {
        let mut refs_seen = BTreeMap::new();
        let mut evicting = Vec::new();
        for (strategy, reload_on) in [
            (Strategy::EnvVars, ReloadOn::AnyKey),
            (Strategy::Annotations, ReloadOn::UsedKeys),
        ] {
            let cfg = PlanConfig {
                strategy,
                reload_on,
                pod_restarts: true,
                ..Default::default()
            };
            for (kind, pb, json) in all_pairs() {
                let name = pb.metadata.name.clone().unwrap_or_default();
                let (pb, json) = (&pb.object, &json.object);
                let entry = WorkloadEntry::from_stored(&cfg, pb, kind);
                assert_eq!(
                    entry,
                    WorkloadEntry::from_stored(&cfg, json, kind),
                    "{name}"
                );
                *refs_seen.entry(name.clone()).or_insert(0) += entry.refs.len();
                let keys = &cfg.policy.keys;
                assert_eq!(pause::resume_at(keys, pb), pause::resume_at(keys, json));
                let restarts = restart::restarts(pb, kind, true);
                assert_eq!(restarts, restart::restarts(json, kind, true), "{name}");
                if restarts == restart::Restarts::Evict {
                    evicting.push(name.clone());
                }
                assert_eq!(restart::selector(pb), restart::selector(json), "{name}");
                assert_eq!(
                    restart::desired_pods(pb, kind),
                    restart::desired_pods(json, kind),
                    "{name}"
                );
                assert_eq!(
                    restart::max_unavailable(pb, restart::desired_pods(pb, kind)),
                    restart::max_unavailable(json, restart::desired_pods(json, kind)),
                    "{name}"
                );
                assert_eq!(
                    rollout::progress(kind, pb, true),
                    rollout::progress(kind, json, true),
                    "{name}"
                );
                if name == "paused" {
                    assert!(pause::resume_at(keys, pb).is_some());
                }
                if name == "web" {
                    assert!(entry.markers().count() > 0 || strategy == Strategy::Annotations);
                }
                if name == "queue" {
                    let expected = "tier=back,app in (queue,q),!canary";
                    assert_eq!(restart::selector(pb).as_deref(), Some(expected));
                }
                if name == "logs" {
                    assert_eq!(restart::selector(pb).as_deref(), Some("app in (logs)"));
                }
            }
        }
        // Each name twice, once per strategy: the references of testdata/objects.json.
        let refs: Vec<(&str, usize)> = refs_seen.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        assert_eq!(
            refs,
            [
                ("agent", 4),
                ("bare", 0),
                ("db", 8),
                ("logs", 2),
                ("paused", 2),
                ("queue", 4),
                ("web", 18),
            ]
        );
        assert_eq!(evicting, ["db", "agent", "db", "agent"]);
    }

    #[test]
    fn a_deployment_cut_short_is_an_error() {
        let frame = super::super::frames(DEPLOYMENTS.0)[0].to_vec();
        let cut = bytes::Bytes::from(frame[..frame.len() / 2].to_vec());
        assert!(super::super::decode_frame::<DeploymentPb>(cut).is_err());
    }
}
