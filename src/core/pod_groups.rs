//! Pods of an owner rekindle does not write (an operator's): pods labelled `rekindle.io/restart: pods`
//! carry the usual reload annotations themselves. The webhook stamps each such pod at creation with
//! `rekindle.io/config-hashes` (the hashes it starts with); on a change, the pods of one controller
//! owner (a *group*, keyed `<Kind>/<name>`) whose stamps are older than the current hashes are
//! evicted one at a time, and the owner is never written.
//!
//! A pod is planned as the pod template of a Deployment ([`as_workload`]) under the annotations
//! strategy and the whole-object hash ([`plan_config`]), so every rule of the reload annotations
//! applies to it unchanged and the stamp is the JSON the annotations strategy writes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::envname::ENV_PREFIX;
use super::keys::{ReloadOn, RELOAD_ON_ANNOTATION};
use super::patch::{self, Place};
use super::plan::{PlanConfig, Strategy};
use super::refs::{self, ResourceRef};
use super::restart::{PodState, RESTART_ANNOTATION};
use super::{ResourceKind, WorkloadKind};

/// The label that opts a pod in (the same key and value as the workload annotation).
pub const POD_LABEL: &str = RESTART_ANNOTATION;
pub const POD_LABEL_VALUE: &str = "pods";
/// The label selector of the pods rekindle stamps and watches.
pub const POD_SELECTOR: &str = "rekindle.io/restart=pods";

/// The kind a pod is planned as.
pub const PLANNED_AS: WorkloadKind = WorkloadKind::Deployment;

/// The name prefix of the token volume the apiserver adds to every pod of a service account.
const SERVICE_ACCOUNT_VOLUME: &str = "kube-api-access-";

/// The owner kind of the group of a pod without a controller owner: that pod alone, never evicted.
pub const NO_OWNER: &str = "Pod";

/// A pod's controller owner, from its `ownerReferences`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    /// The name of the group's key: `<Kind>/<name>`.
    pub fn group(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

/// Whether `pod` is labelled for pod restarts.
pub fn labelled(pod: &Value) -> bool {
    refs::at(pod, "/metadata/labels")
        .and_then(|l| l.get(POD_LABEL))
        .and_then(Value::as_str)
        == Some(POD_LABEL_VALUE)
}

/// The controller owner of `pod`, if it has one.
pub fn controller_owner(pod: &Value) -> Option<Owner> {
    refs::at(pod, "/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|r| {
            let text = |k: &str| r.get(k).and_then(Value::as_str).map(String::from);
            Some(Owner {
                api_version: text("apiVersion")?,
                kind: text("kind")?,
                name: text("name")?,
                uid: text("uid")?,
            })
        })
}

/// The group name of `pod`: its controller owner's `<Kind>/<name>`, or `Pod/<its name>` without one.
pub fn group_of(pod: &Value) -> String {
    match controller_owner(pod) {
        Some(owner) => owner.group(),
        None => format!(
            "{NO_OWNER}/{}",
            refs::at(pod, "/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
        ),
    }
}

/// The built-in workload whose own reload restarts these pods, when the owner is one rekindle can
/// write: a StatefulSet, DaemonSet or Job, or the Deployment (or Argo Rollout) of a ReplicaSet, read
/// from the pod-template-hash label its controller puts on the pods. Such pods are left to it.
pub fn written_workload(pod: &Value, owner: &Owner) -> Option<(WorkloadKind, String)> {
    let label = |k: &str| {
        refs::at(pod, "/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
    };
    let of_replica_set = |label_key: &str| {
        let hash = label(label_key)?;
        owner
            .name
            .strip_suffix(hash)?
            .strip_suffix('-')
            .map(String::from)
    };
    match (owner.api_version.as_str(), owner.kind.as_str()) {
        ("apps/v1", "StatefulSet") => Some((WorkloadKind::StatefulSet, owner.name.clone())),
        ("apps/v1", "DaemonSet") => Some((WorkloadKind::DaemonSet, owner.name.clone())),
        ("batch/v1", "Job") => Some((WorkloadKind::Job, owner.name.clone())),
        ("apps/v1", "ReplicaSet") => of_replica_set("pod-template-hash")
            .map(|n| (WorkloadKind::Deployment, n))
            .or_else(|| {
                of_replica_set("rollouts-pod-template-hash").map(|n| (WorkloadKind::Rollout, n))
            }),
        _ => None,
    }
}

/// The plan configuration pods are stamped and compared with: the annotations strategy (a pod's
/// spec is not changed) and the whole object's hash (keys read one by one are not followed).
pub fn plan_config(cfg: &PlanConfig) -> PlanConfig {
    PlanConfig {
        strategy: Strategy::Annotations,
        reload_on: ReloadOn::AnyKey,
        ..cfg.clone()
    }
}

/// `pod` as a [`PLANNED_AS`] whose metadata and pod template are the pod's own (without
/// `rekindle.io/reload-on`, see [`plan_config`]).
pub fn as_workload(pod: &Value) -> Value {
    let mut metadata = pod.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Some(a) = metadata
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(RELOAD_ON_ANNOTATION);
    }
    let annotations = metadata.get("annotations").cloned().unwrap_or(Value::Null);
    let mut spec = pod.get("spec").cloned().unwrap_or(Value::Null);
    without_injected(&mut spec);
    json!({
        "metadata": metadata,
        "spec": {"template": {
            "metadata": {"annotations": annotations},
            "spec": spec,
        }},
    })
}

/// What a pod carries that is not its config's: the service account's token volume (which the
/// apiserver adds, with its `kube-root-ca.crt` ConfigMap) and the env-var markers of a workload's
/// template (a pod's markers are its stamps only).
fn without_injected(spec: &mut Value) {
    if let Some(volumes) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        volumes.retain(|v| {
            !v.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.starts_with(SERVICE_ACCOUNT_VOLUME))
        });
    }
    for list in ["initContainers", "containers"] {
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for container in containers.into_iter().flatten() {
            if let Some(env) = container.get_mut("env").and_then(Value::as_array_mut) {
                env.retain(|e| {
                    let marker = e
                        .get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| n.starts_with(ENV_PREFIX));
                    !(marker && e.get("value").is_some())
                });
            }
        }
    }
}

/// A JSON pointer of a patch made on [`as_workload`]'s template metadata, moved onto the pod's
/// own metadata; `None` for any other path (stamping makes none).
pub fn onto_pod(path: &str) -> Option<String> {
    path.strip_prefix("/spec/template/metadata")
        .map(|rest| format!("/metadata{rest}"))
}

/// The hashes `pod` was stamped with, by reference.
pub fn stamps(pod: &Value) -> Vec<(ResourceRef, String)> {
    let template = PLANNED_AS.under_template_path(json!({
        "metadata": {"annotations": refs::at(pod, "/metadata/annotations").cloned().unwrap_or(Value::Null)}
    }));
    parse_stamps(patch::config_hashes(&template, PLANNED_AS, Place::Template))
}

fn parse_stamps(hashes: BTreeMap<String, String>) -> Vec<(ResourceRef, String)> {
    hashes
        .into_iter()
        .filter_map(|(key, hash)| {
            let (prefix, name) = key.split_once('/')?;
            let kind = ResourceKind::ALL
                .into_iter()
                .find(|k| k.hash_key_prefix() == prefix)?;
            Some((
                ResourceRef {
                    kind,
                    name: name.into(),
                },
                hash,
            ))
        })
        .collect()
}

/// Whether a pod stamped with `stamps` runs older config than `current` says: a stamped resource
/// whose current hash is another (a resource gone or not known is no reason to restart).
pub fn behind(
    stamps: &[(ResourceRef, String)],
    current: impl Fn(&ResourceRef) -> Option<String>,
) -> bool {
    stamps
        .iter()
        .any(|(r, stamped)| current(r).is_some_and(|now| &now != stamped))
}

/// How long a replica that has just begun to lead watches a group before its first eviction: a pod
/// its predecessor evicted may not be re-created yet, and the owner's replica count is not read, so
/// only watching shows how many pods the owner keeps.
pub const SETTLE: Duration = Duration::from_secs(10);

/// The pods a group wants: the most seen alive during the walk, or every pod there is now, whichever
/// is more. A terminating pod counts until it is gone (an owner that re-creates pods under their own
/// names, as a StatefulSet does, makes the replacement only then), so the next eviction waits for it.
pub fn wanted(most_alive: usize, pods: &[PodState]) -> usize {
    most_alive.max(pods.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::policy::CONFIG_HASHES_ANNOTATION;

    fn pod(labels: Value, owners: Value, annotations: Value) -> Value {
        json!({"metadata": {"name": "p-0", "labels": labels, "ownerReferences": owners,
            "annotations": annotations}, "spec": {"containers": [{"name": "c"}]}})
    }

    fn owner(api_version: &str, kind: &str, name: &str) -> Value {
        json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": "u1", "controller": true}])
    }

    #[test]
    fn a_pod_is_grouped_by_its_controller_owner_or_alone() {
        let p = pod(
            json!({"rekindle.io/restart": "pods"}),
            owner("kafka.strimzi.io/v1beta2", "StrimziPodSet", "kafka"),
            json!({}),
        );
        assert!(labelled(&p));
        assert_eq!(group_of(&p), "StrimziPodSet/kafka");
        assert_eq!(controller_owner(&p).unwrap().uid, "u1");
        let not_controller = pod(
            json!({}),
            json!([{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u"}]),
            json!({}),
        );
        assert!(!labelled(&not_controller));
        assert_eq!(controller_owner(&not_controller), None);
        assert_eq!(group_of(&not_controller), "Pod/p-0");
    }

    #[test]
    fn pods_of_workloads_rekindle_writes_are_left_to_them() {
        let of = |labels: Value, api: &str, kind: &str, name: &str| {
            let p = pod(labels, owner(api, kind, name), json!({}));
            written_workload(&p, &controller_owner(&p).unwrap())
        };
        assert_eq!(
            of(
                json!({"pod-template-hash": "5d8f"}),
                "apps/v1",
                "ReplicaSet",
                "web-5d8f"
            ),
            Some((WorkloadKind::Deployment, "web".into()))
        );
        assert_eq!(
            of(
                json!({"rollouts-pod-template-hash": "77c"}),
                "apps/v1",
                "ReplicaSet",
                "r-77c"
            ),
            Some((WorkloadKind::Rollout, "r".into()))
        );
        assert_eq!(
            of(json!({}), "apps/v1", "ReplicaSet", "bare"),
            None,
            "a bare ReplicaSet"
        );
        assert_eq!(
            of(
                json!({"pod-template-hash": "zz"}),
                "apps/v1",
                "ReplicaSet",
                "other"
            ),
            None,
            "a hash its name does not end with"
        );
        assert_eq!(
            of(json!({}), "apps/v1", "StatefulSet", "db"),
            Some((WorkloadKind::StatefulSet, "db".into()))
        );
        assert_eq!(of(json!({}), "example.com/v1", "StatefulSet", "db"), None);
    }

    #[test]
    fn a_pod_is_planned_as_a_template_and_stamps_move_onto_its_metadata() {
        let p = pod(
            json!({}),
            json!([]),
            json!({"reloader.stakater.com/auto": "true", RELOAD_ON_ANNOTATION: "used-keys"}),
        );
        let w = as_workload(&p);
        assert_eq!(
            w["metadata"]["annotations"]["reloader.stakater.com/auto"],
            "true"
        );
        assert!(w["metadata"]["annotations"]
            .get(RELOAD_ON_ANNOTATION)
            .is_none());
        assert_eq!(w["spec"]["template"]["spec"], p["spec"]);
        let mut injected = p.clone();
        injected["spec"]["volumes"] = json!([{"name": "kube-api-access-x2", "projected": {"sources": [
            {"configMap": {"name": "kube-root-ca.crt"}}]}}, {"name": "cfg", "configMap": {"name": "app"}}]);
        injected["spec"]["containers"][0]["env"] = json!([{"name": "STAKATER_APP_CONFIGMAP", "value": "h"},
            {"name": "STAKATER_FROM", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "k"}}}]);
        let w = as_workload(&injected);
        assert_eq!(
            w["spec"]["template"]["spec"]["volumes"],
            json!([{"name": "cfg", "configMap": {"name": "app"}}])
        );
        assert_eq!(
            w["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": "STAKATER_FROM", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "k"}}}])
        );
        assert_eq!(
            onto_pod("/spec/template/metadata/annotations/rekindle.io~1config-hashes").as_deref(),
            Some("/metadata/annotations/rekindle.io~1config-hashes")
        );
        assert_eq!(
            onto_pod("/spec/template/metadata").as_deref(),
            Some("/metadata")
        );
        assert_eq!(onto_pod("/spec/template/spec/containers/0/env"), None);
    }

    #[test]
    fn a_pod_is_behind_when_a_stamped_hash_is_not_the_current_one() {
        let hashes = r#"{"configmap/app":"h1","secret/creds":"s1","nonsense":"x"}"#;
        let p = pod(
            json!({}),
            json!([]),
            json!({CONFIG_HASHES_ANNOTATION: hashes}),
        );
        let stamped = stamps(&p);
        assert_eq!(stamped.len(), 2, "{stamped:?}");
        let current = |cm: &'static str| {
            move |r: &ResourceRef| match r.kind {
                ResourceKind::ConfigMap => Some(cm.to_string()),
                _ => None,
            }
        };
        assert!(!behind(&stamped, current("h1")));
        assert!(behind(&stamped, current("h2")));
        assert!(!behind(&[], current("h2")), "a pod with no stamps");
    }
}
