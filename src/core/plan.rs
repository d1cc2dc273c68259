//! One decision end to end: policy (behaviour §5), container (§6) and marker changes (§7, §10) for one workload
//! and one changed resource. The webhook, the writer and `rekindle explain` all call this.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use serde::Serialize;
use serde_json::{json, Value};

use super::envname::env_var_name;
use super::hash::delete_marker_hash;
use super::keys::{self, KeyDigests, Owed, ReloadOn, Use};
use super::patch::{
    self, config_hash_key, config_hashes, env_value, first_env_value, MarkerChange, Place,
    ReloadSource,
};
use super::policy::{
    decide, Decision, PolicyConfig, Reason, ResourceFlags, WorkloadPolicy,
    LAST_RELOADED_FROM_ANNOTATION,
};
use super::refs::{self, ContainerRef, ResourceRef};
use super::{ResourceKind, WorkloadKind};
use std::collections::BTreeSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    #[default]
    EnvVars,
    Annotations,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CronJobStrategy {
    /// Create a Job from the template (Reloader's behaviour).
    #[default]
    Job,
    /// Patch the job template; the next scheduled run uses the new config.
    Template,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    Create,
    Update,
    Delete,
}

/// How a reload is carried out for this workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Patch,
    CreateJob,
    RecreateJob,
    Restart,
    None,
}

#[derive(Debug, Clone, Default)]
pub struct PlanConfig {
    pub policy: PolicyConfig,
    pub strategy: Strategy,
    pub cronjob_strategy: CronJobStrategy,
    pub reload_on_create: bool,
    pub reload_on_delete: bool,
    /// `--pod-restarts`: `OnDelete` workloads with `rekindle.io/restart: pods` get their pods evicted.
    pub pod_restarts: bool,
    /// `--reload-on`: the mode of workloads without `rekindle.io/reload-on` (behaviour §14).
    pub reload_on: ReloadOn,
}

/// The changed resource.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    pub kind: ResourceKind,
    pub name: &'a str,
    pub namespace: &'a str,
    /// The hash a reload writes: the resource's current hash (ignored for deletes), or in
    /// `used-keys` mode the hash of the keys the workload reads (behaviour §14).
    pub hash: &'a str,
    /// Another marker that also means the workload is current (`keys::Owed::also_current`).
    pub also_current: Option<&'a str>,
    pub flags: ResourceFlags,
    pub event: Event,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub decision: Decision,
    pub action: Action,
    pub container: Option<ContainerRef>,
    pub changes: Vec<MarkerChange>,
}

impl Plan {
    fn none(decision: Decision, reason: Reason) -> Self {
        Self {
            decision: Decision {
                reload: false,
                reason,
                ..decision
            },
            action: Action::None,
            container: None,
            changes: vec![],
        }
    }
}

/// Where this workload keeps its markers: the pod template, or its metadata when a template change
/// would be wrong (CronJob in `job` mode: the template is copied into Jobs; Rollout restart).
pub fn marker_place(cfg: &PlanConfig, obj: &Value, kind: WorkloadKind) -> Place {
    match (kind, cfg.cronjob_strategy) {
        (WorkloadKind::CronJob, CronJobStrategy::Job) => Place::Metadata,
        (WorkloadKind::Rollout, _) if rollout_restart(cfg, obj) => Place::Metadata,
        _ => Place::Template,
    }
}

fn rollout_restart(cfg: &PlanConfig, obj: &Value) -> bool {
    let key = &cfg.policy.keys.rollout_strategy;
    refs::at(obj, "/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        == Some("restart")
}

pub fn action_for(cfg: &PlanConfig, obj: &Value, kind: WorkloadKind) -> Action {
    match kind {
        WorkloadKind::CronJob if cfg.cronjob_strategy == CronJobStrategy::Job => Action::CreateJob,
        WorkloadKind::Job => Action::RecreateJob,
        WorkloadKind::Rollout if rollout_restart(cfg, obj) => Action::Restart,
        _ => Action::Patch,
    }
}

/// The current marker for a resource, read from where this workload keeps it. In the pod template the
/// other strategy's marker counts when this one's is absent: the pods already run with that hash, so
/// switching `--reload-strategy` (or a replica of the other strategy writing during a rolling upgrade)
/// restarts nothing until the resource changes again.
pub fn current_marker(
    cfg: &PlanConfig,
    obj: &Value,
    kind: WorkloadKind,
    res: ResourceKind,
    name: &str,
    container: Option<&ContainerRef>,
) -> Option<String> {
    let place = marker_place(cfg, obj, kind);
    let annotation = || config_hashes(obj, kind, place).remove(&config_hash_key(res, name));
    if place == Place::Metadata {
        return annotation();
    }
    let env = || {
        let env = env_var_name(name, res);
        if res == ResourceKind::SecretProviderClass {
            return first_env_value(obj, kind, &env).map(str::to_string);
        }
        env_value(obj, kind, container?.index, &env).map(str::to_string)
    };
    match cfg.strategy {
        Strategy::Annotations => annotation().or_else(env),
        Strategy::EnvVars => env().or_else(annotation),
    }
}

/// Every resource the workload's pod spec references, sorted, with the marker it carries for it (read
/// from the container [`refs::choose_container`] picks): what the index keeps, and what a pod-restart
/// walk compares a pod with its template by.
pub fn markers(
    cfg: &PlanConfig,
    obj: &Value,
    kind: WorkloadKind,
) -> Vec<(ResourceRef, Option<String>)> {
    let Some(spec) = refs::pod_spec(obj, kind) else {
        return Vec::new();
    };
    refs::references(spec)
        .into_iter()
        .map(|r| {
            let container = refs::choose_container(spec, r.kind, &r.name, true);
            let marker = current_marker(cfg, obj, kind, r.kind, &r.name, container.as_ref());
            (r, marker)
        })
        .collect()
}

/// The keys of `r` whose changes reload the workload (behaviour §14): `None` when every key counts
/// (`any-key` mode, an invalid mode annotation, or a reference that takes the whole object).
pub fn keys_read(
    cfg: &PlanConfig,
    obj: &Value,
    kind: WorkloadKind,
    r: &ResourceRef,
) -> Option<BTreeSet<String>> {
    let mode = keys::reload_on(obj, kind, cfg.reload_on).unwrap_or(cfg.reload_on);
    if mode != ReloadOn::UsedKeys {
        return None;
    }
    match keys::used_keys(refs::pod_spec(obj, kind)?, r.kind, &r.name) {
        Use::Keys(read) => Some(read),
        Use::Whole => None,
    }
}

/// What the workload's marker for `r` must be, given the resource's hash `full` and its value
/// digests; `None` when the workload reads some keys only and `digests` are not of its current
/// content (read the object, then ask again).
pub fn owed(
    cfg: &PlanConfig,
    obj: &Value,
    kind: WorkloadKind,
    r: &ResourceRef,
    full: &str,
    digests: Option<&KeyDigests>,
) -> Option<Owed> {
    keys::owed(keys_read(cfg, obj, kind, r).as_ref(), full, digests)
}

/// Decides and, when the workload must reload, lists the marker changes that bring it up to date.
/// `now` is the unix time written into `last-reloaded-from`.
pub fn plan(
    cfg: &PlanConfig,
    obj: &Value,
    kind: WorkloadKind,
    change: &Change<'_>,
    now: i64,
) -> Plan {
    let policy = WorkloadPolicy::from_workload(&cfg.policy.keys, obj, kind);
    plan_with_policy(cfg, obj, kind, &policy, change, now)
}

pub fn plan_with_policy(
    cfg: &PlanConfig,
    obj: &Value,
    kind: WorkloadKind,
    policy: &WorkloadPolicy,
    change: &Change<'_>,
    now: i64,
) -> Plan {
    let spec = refs::pod_spec(obj, kind);
    let decision = decide(
        &cfg.policy,
        kind,
        policy,
        spec,
        change.kind,
        change.name,
        change.flags,
    );
    if !decision.reload {
        let reason = decision.reason;
        return Plan::none(decision, reason);
    }
    let disabled = match change.event {
        Event::Create => !cfg.reload_on_create,
        Event::Delete => !cfg.reload_on_delete,
        Event::Update => false,
    };
    if disabled {
        return Plan::none(decision, Reason::EventDisabled);
    }
    let Some(spec) = spec else {
        return Plan::none(decision, Reason::NoPodTemplate);
    };
    if kind == WorkloadKind::CronJob
        && cfg.cronjob_strategy == CronJobStrategy::Job
        && obj.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true)
    {
        return Plan::none(decision, Reason::Suspended);
    }
    let Some(container) = refs::choose_container(spec, change.kind, change.name, decision.auto)
    else {
        return Plan::none(decision, Reason::NoContainer);
    };
    let changes = marker_changes(cfg, obj, kind, change, &container, now);
    if changes.is_empty() {
        // Current for the keys it reads, though not for the whole object: only other keys changed.
        let unused_keys = change.also_current.is_some_and(|full| {
            current_marker(cfg, obj, kind, change.kind, change.name, Some(&container)).as_deref()
                != Some(full)
        });
        let reason = if unused_keys {
            Reason::UnusedKeys
        } else {
            Reason::AlreadyCurrent
        };
        return Plan {
            container: Some(container),
            ..Plan::none(decision, reason)
        };
    }
    Plan {
        action: action_for(cfg, obj, kind),
        decision,
        container: Some(container),
        changes,
    }
}

/// The marker changes for one resource on one chosen container; empty when already current.
pub fn marker_changes(
    cfg: &PlanConfig,
    obj: &Value,
    kind: WorkloadKind,
    change: &Change<'_>,
    container: &ContainerRef,
    now: i64,
) -> Vec<MarkerChange> {
    let place = marker_place(cfg, obj, kind);
    let key = config_hash_key(change.kind, change.name);
    let current = current_marker(cfg, obj, kind, change.kind, change.name, Some(container));
    let deleting = change.event == Event::Delete;
    if deleting && current.is_none() {
        // Reloader's annotations strategy writes `last-reloaded-from` with the delete marker whether or
        // not a marker was there (a workload that only names the resource never had one); once.
        let annotations_in_template =
            cfg.strategy == Strategy::Annotations && place == Place::Template;
        if !annotations_in_template || last_reloaded_from_delete_of(obj, kind, change) {
            return Vec::new();
        }
        return vec![last_reloaded_from(
            change,
            &delete_marker_hash(),
            container,
            now,
        )];
    }
    if !deleting
        && current
            .as_deref()
            .is_some_and(|c| c == change.hash || Some(c) == change.also_current)
    {
        return Vec::new();
    }

    let mut out = Vec::new();
    if place == Place::Metadata {
        out.push(config_hash_marker(
            place,
            key.clone(),
            change.hash,
            deleting,
        ));
        // A Rollout restart only records the marker; the writer sets spec.restartAt.
        if kind == WorkloadKind::Rollout {
            return out;
        }
    }
    match cfg.strategy {
        Strategy::EnvVars => {
            let name = env_var_name(change.name, change.kind);
            out.push(env_marker(container.index, name, change.hash, deleting));
        }
        Strategy::Annotations => {
            let hash = if deleting {
                delete_marker_hash()
            } else {
                change.hash.to_string()
            };
            if place == Place::Template {
                out.push(config_hash_marker(place, key, &hash, deleting));
            }
            out.push(last_reloaded_from(change, &hash, container, now));
        }
    }
    if place == Place::Template {
        out.extend(other_strategy_marker(cfg, obj, kind, change, container));
    }
    out
}

/// Whether the template's `last-reloaded-from` already records the deletion of this resource.
fn last_reloaded_from_delete_of(obj: &Value, kind: WorkloadKind, change: &Change<'_>) -> bool {
    let Some(text) = refs::pod_template(obj, kind)
        .and_then(|t| refs::at(t, "/metadata/annotations"))
        .and_then(|a| a.get(LAST_RELOADED_FROM_ANNOTATION))
        .and_then(Value::as_str)
    else {
        return false;
    };
    let Ok(source) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    source["type"] == change.kind.env_suffix()
        && source["name"] == change.name
        && source["hash"] == delete_marker_hash().as_str()
}

/// Reloader's `last-reloaded-from` annotation for a reload of `change` with `hash`.
fn last_reloaded_from(
    change: &Change<'_>,
    hash: &str,
    container: &ContainerRef,
    now: i64,
) -> MarkerChange {
    let source = ReloadSource {
        kind: change.kind.env_suffix(),
        name: change.name,
        namespace: change.namespace,
        hash,
        container_refs: vec![container.name.as_str()],
        observed_at: now,
    };
    MarkerChange::SetLastReloadedFrom {
        value: source.to_json(),
    }
}

fn env_marker(container: usize, name: String, hash: &str, deleting: bool) -> MarkerChange {
    if deleting {
        MarkerChange::RemoveEnv { container, name }
    } else {
        MarkerChange::SetEnv {
            container,
            name,
            value: hash.to_string(),
        }
    }
}

fn config_hash_marker(place: Place, key: String, hash: &str, deleting: bool) -> MarkerChange {
    if deleting {
        MarkerChange::RemoveConfigHash { place, key }
    } else {
        MarkerChange::SetConfigHash {
            place,
            key,
            hash: hash.to_string(),
        }
    }
}

/// The other strategy's marker for the same resource, kept in step when the template carries one (left
/// by an earlier `--reload-strategy`, or by a replica of the other strategy during a rolling upgrade):
/// [`current_marker`] falls back to it, so it must never fall behind.
fn other_strategy_marker(
    cfg: &PlanConfig,
    obj: &Value,
    kind: WorkloadKind,
    change: &Change<'_>,
    container: &ContainerRef,
) -> Option<MarkerChange> {
    let deleting = change.event == Event::Delete;
    match cfg.strategy {
        Strategy::EnvVars => {
            let key = config_hash_key(change.kind, change.name);
            config_hashes(obj, kind, Place::Template)
                .contains_key(&key)
                .then(|| config_hash_marker(Place::Template, key, change.hash, deleting))
        }
        Strategy::Annotations => {
            let name = env_var_name(change.name, change.kind);
            env_value(obj, kind, container.index, &name)?;
            Some(env_marker(container.index, name, change.hash, deleting))
        }
    }
}

/// Ops that put back markers the old object had and the incoming one dropped (a `kubectl replace` or a
/// GitOps re-apply of the original manifest): old value, old position.
pub fn restore_markers(
    cfg: &PlanConfig,
    kind: WorkloadKind,
    old: &Value,
    new: &Value,
) -> Result<Vec<PatchOperation>, String> {
    let mut ops = Vec::new();
    if cfg.strategy == Strategy::EnvVars && marker_place(cfg, new, kind) == Place::Template {
        restore_env_markers(kind, old, new, &mut ops);
    }
    for place in [Place::Template, Place::Metadata] {
        let old_map = config_hashes(old, kind, place);
        if old_map.is_empty() {
            continue;
        }
        let new_map = config_hashes(new, kind, place);
        let missing: BTreeMap<String, String> = old_map
            .into_iter()
            .filter(|(k, _)| !new_map.contains_key(k))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let changes: Vec<MarkerChange> = missing
            .into_iter()
            .map(|(key, hash)| MarkerChange::SetConfigHash { place, key, hash })
            .collect();
        let mut working = new.clone();
        json_patch::patch(&mut working, &ops).map_err(|e| e.to_string())?;
        ops.extend(patch::render(&working, kind, &changes).map_err(|e| e.to_string())?);
    }
    Ok(ops)
}

/// The `STAKATER_*` env entries of each container that the new object dropped, at their old position.
fn restore_env_markers(
    kind: WorkloadKind,
    old: &Value,
    new: &Value,
    ops: &mut Vec<PatchOperation>,
) {
    let tpl = kind.template_pointer();
    let containers = |o: &Value| {
        o.pointer(&format!("{tpl}/spec/containers"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (old_cs, new_cs) = (containers(old), containers(new));
    for old_c in &old_cs {
        let Some(cname) = old_c.get("name").and_then(Value::as_str) else {
            continue;
        };
        let Some(ci) = new_cs
            .iter()
            .position(|c| c.get("name").and_then(Value::as_str) == Some(cname))
        else {
            continue;
        };
        let new_env: Vec<Value> = new_cs[ci]
            .get("env")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let had_env_array = new_cs[ci].get("env").is_some_and(Value::is_array);
        let mut len = new_env.len();
        let mut created = had_env_array;
        for (pos, e) in old_c
            .get("env")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let Some(ename) = e
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| n.starts_with("STAKATER_"))
            else {
                continue;
            };
            if new_env
                .iter()
                .any(|n| n.get("name").and_then(Value::as_str) == Some(ename))
            {
                continue;
            }
            let mut path = PointerBuf::from_tokens(tpl.split('/').skip(1));
            for t in ["spec", "containers"] {
                path.push_back(t);
            }
            path.push_back(ci);
            path.push_back("env");
            if !created {
                ops.push(PatchOperation::Add(AddOperation {
                    path: path.clone(),
                    value: json!([]),
                }));
                created = true;
            }
            path.push_back(pos.min(len));
            ops.push(PatchOperation::Add(AddOperation {
                path,
                value: e.clone(),
            }));
            len += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::patch::apply;
    use serde_json::json;

    const H1: &str = "3c9a892aeaedc759abc3df9884a37b8be5680382";
    const H2: &str = "f83e99e324ba68ccc373a58ef1eb42f8ab88646a";

    #[test]
    fn a_replace_that_drops_markers_gets_them_back_where_they_were() {
        let container = |env: Value| json!({"name": "app", "image": "i", "env": env});
        let old = json!({"spec": {"template": {"metadata": {}, "spec": {"containers": [container(json!([
            {"name": "A", "value": "1"},
            {"name": "STAKATER_CFG_CONFIGMAP", "value": H1},
            {"name": "B", "value": "2"}
        ]))]}}}});
        // The original manifest re-applied: no marker.
        let new = json!({"spec": {"template": {"metadata": {}, "spec": {"containers": [container(json!([
            {"name": "A", "value": "1"},
            {"name": "B", "value": "3"}
        ]))]}}}});
        let cfg = PlanConfig::default();
        let ops = restore_markers(&cfg, WorkloadKind::Deployment, &old, &new).unwrap();
        let mut restored = new.clone();
        json_patch::patch(&mut restored, &ops).unwrap();
        let env = &restored["spec"]["template"]["spec"]["containers"][0]["env"];
        assert_eq!(
            env[1],
            json!({"name": "STAKATER_CFG_CONFIGMAP", "value": H1})
        );
        assert_eq!(
            env[2],
            json!({"name": "B", "value": "3"}),
            "the new value of B is kept"
        );
        // Nothing dropped, nothing to restore; a container without env gets the array first.
        assert!(restore_markers(&cfg, WorkloadKind::Deployment, &old, &old)
            .unwrap()
            .is_empty());
        let bare = json!({"spec": {"template": {"metadata": {}, "spec": {"containers": [
            {"name": "app", "image": "i"}]}}}});
        let ops = restore_markers(&cfg, WorkloadKind::Deployment, &old, &bare).unwrap();
        let mut restored = bare.clone();
        json_patch::patch(&mut restored, &ops).unwrap();
        assert_eq!(
            restored["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": "STAKATER_CFG_CONFIGMAP", "value": H1}])
        );
    }

    fn workload(kind: WorkloadKind, annotations: Value) -> Value {
        let template = json!({"metadata": {"labels": {"app": "x"}}, "spec": {
            "initContainers": [{"name": "init", "envFrom": [{"secretRef": {"name": "init-secret"}}]}],
            "containers": [
                {"name": "main", "image": "busybox"},
                {"name": "side", "envFrom": [{"configMapRef": {"name": "app-config"}}],
                 "volumeMounts": [{"name": "v", "mountPath": "/v"}]}
            ],
            "volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "proj-secret"}}]}}]
        }});
        let spec = match kind {
            WorkloadKind::CronJob => {
                json!({"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}})
            }
            _ => json!({"template": template}),
        };
        json!({"apiVersion": kind.api_version(), "kind": kind.name(),
               "metadata": {"name": "w", "namespace": "ns", "annotations": annotations}, "spec": spec})
    }

    fn update<'a>(kind: ResourceKind, name: &'a str, hash: &'a str) -> Change<'a> {
        Change {
            kind,
            name,
            namespace: "ns",
            hash,
            flags: ResourceFlags::default(),
            event: Event::Update,
            also_current: None,
        }
    }

    fn auto() -> Value {
        json!({"reloader.stakater.com/auto": "true"})
    }

    /// Plans, applies the ops, and checks that planning again on the result has nothing to do.
    fn reload_and_check_idempotent(
        cfg: &PlanConfig,
        obj: &Value,
        kind: WorkloadKind,
        change: &Change<'_>,
    ) -> Value {
        let p = plan(cfg, obj, kind, change, 100);
        assert!(
            p.decision.reload,
            "{kind}: expected a reload, got {:?}",
            p.decision.reason
        );
        let out = apply(obj, kind, &p.changes).unwrap();
        let again = plan(cfg, &out, kind, change, 200);
        assert_eq!(
            again.decision.reason,
            Reason::AlreadyCurrent,
            "{kind}: not idempotent"
        );
        assert!(again.changes.is_empty());
        out
    }

    #[test]
    fn env_vars_on_every_kind_and_reference() {
        let cfg = PlanConfig {
            cronjob_strategy: CronJobStrategy::Template,
            ..Default::default()
        };
        for kind in WorkloadKind::ALL {
            let obj = workload(kind, auto());
            let tpl = kind.template_pointer();
            for (res, name, container, env) in [
                (
                    ResourceKind::ConfigMap,
                    "app-config",
                    1,
                    "STAKATER_APP_CONFIG_CONFIGMAP",
                ),
                (
                    ResourceKind::Secret,
                    "proj-secret",
                    1,
                    "STAKATER_PROJ_SECRET_SECRET",
                ),
                (
                    ResourceKind::Secret,
                    "init-secret",
                    0,
                    "STAKATER_INIT_SECRET_SECRET",
                ),
            ] {
                let out = reload_and_check_idempotent(&cfg, &obj, kind, &update(res, name, H1));
                let env_ptr = format!("{tpl}/spec/containers/{container}/env");
                assert_eq!(
                    out.pointer(&env_ptr).unwrap(),
                    &json!([{"name": env, "value": H1}]),
                    "{kind} {name}"
                );
                // A new hash replaces the value in place.
                let out2 = reload_and_check_idempotent(&cfg, &out, kind, &update(res, name, H2));
                assert_eq!(
                    out2.pointer(&env_ptr).unwrap(),
                    &json!([{"name": env, "value": H2}])
                );
            }
        }
    }

    #[test]
    fn annotations_strategy_is_idempotent_and_writes_last_reloaded_from() {
        let cfg = PlanConfig {
            strategy: Strategy::Annotations,
            ..Default::default()
        };
        let obj = workload(WorkloadKind::Deployment, auto());
        let out = reload_and_check_idempotent(
            &cfg,
            &obj,
            WorkloadKind::Deployment,
            &update(ResourceKind::ConfigMap, "app-config", H1),
        );
        let ann = out.pointer("/spec/template/metadata/annotations").unwrap();
        assert_eq!(
            ann["rekindle.io/config-hashes"],
            format!(r#"{{"configmap/app-config":"{H1}"}}"#)
        );
        let lrf: Value = serde_json::from_str(
            ann["reloader.stakater.com/last-reloaded-from"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            lrf,
            json!({"type": "CONFIGMAP", "name": "app-config", "namespace": "ns", "hash": H1, "containerRefs": ["side"], "observedAt": 100})
        );
        // The env is untouched under the annotations strategy.
        assert!(out
            .pointer("/spec/template/spec/containers/1/env")
            .is_none());
    }

    #[test]
    fn switching_strategy_keeps_the_other_strategys_marker_current() {
        let env_vars = PlanConfig::default();
        let annotations = PlanConfig {
            strategy: Strategy::Annotations,
            ..Default::default()
        };
        let obj = workload(WorkloadKind::Deployment, auto());
        let kind = WorkloadKind::Deployment;
        for (first, then) in [(&env_vars, &annotations), (&annotations, &env_vars)] {
            let marked = reload_and_check_idempotent(
                first,
                &obj,
                kind,
                &update(ResourceKind::ConfigMap, "app-config", H1),
            );
            // The same hash under the other strategy: the pods already have it.
            let same = plan(
                then,
                &marked,
                kind,
                &update(ResourceKind::ConfigMap, "app-config", H1),
                100,
            );
            assert!(
                same.changes.is_empty(),
                "{:?} after {:?}",
                then.strategy,
                first.strategy
            );
            // A new hash reloads, written the new strategy's way.
            let changed = plan(
                then,
                &marked,
                kind,
                &update(ResourceKind::ConfigMap, "app-config", H2),
                100,
            );
            assert!(!changed.changes.is_empty());
            let out = apply(&marked, kind, &changed.changes).unwrap();
            // Both markers moved together: back on the first strategy nothing is owed either.
            for cfg in [then, first] {
                let again = plan(
                    cfg,
                    &out,
                    kind,
                    &update(ResourceKind::ConfigMap, "app-config", H2),
                    100,
                );
                assert!(again.changes.is_empty(), "{:?}", cfg.strategy);
            }
        }
    }

    #[test]
    fn delete_handling() {
        let change = |event, hash| Change {
            event,
            also_current: None,
            ..update(ResourceKind::ConfigMap, "app-config", hash)
        };
        for strategy in [Strategy::EnvVars, Strategy::Annotations] {
            let cfg = PlanConfig {
                strategy,
                reload_on_delete: true,
                ..Default::default()
            };
            let obj = workload(WorkloadKind::Deployment, auto());
            let unmarked = plan(
                &cfg,
                &obj,
                WorkloadKind::Deployment,
                &change(Event::Delete, ""),
                1,
            );
            match strategy {
                // Nothing to remove on a workload without the marker.
                Strategy::EnvVars => assert_eq!(unmarked.decision.reason, Reason::AlreadyCurrent),
                // Reloader writes last-reloaded-from with the delete marker all the same, once.
                Strategy::Annotations => {
                    assert_eq!(unmarked.changes.len(), 1);
                    let out = apply(&obj, WorkloadKind::Deployment, &unmarked.changes).unwrap();
                    let lrf: Value = serde_json::from_str(
                        out.pointer("/spec/template/metadata/annotations/reloader.stakater.com~1last-reloaded-from")
                            .and_then(Value::as_str)
                            .unwrap(),
                    )
                    .unwrap();
                    assert_eq!(lrf["hash"], json!(delete_marker_hash()));
                    assert_eq!(lrf["name"], json!("app-config"));
                    let again = plan(
                        &cfg,
                        &out,
                        WorkloadKind::Deployment,
                        &change(Event::Delete, ""),
                        2,
                    );
                    assert!(again.changes.is_empty(), "idempotent");
                }
            }
            let stamped = apply(
                &obj,
                WorkloadKind::Deployment,
                &plan(
                    &cfg,
                    &obj,
                    WorkloadKind::Deployment,
                    &change(Event::Update, H1),
                    1,
                )
                .changes,
            )
            .unwrap();
            let p = plan(
                &cfg,
                &stamped,
                WorkloadKind::Deployment,
                &change(Event::Delete, ""),
                2,
            );
            assert!(p.decision.reload, "{strategy:?}");
            let out = apply(&stamped, WorkloadKind::Deployment, &p.changes).unwrap();
            match strategy {
                Strategy::EnvVars => assert_eq!(
                    out.pointer("/spec/template/spec/containers/1/env").unwrap(),
                    &json!([])
                ),
                Strategy::Annotations => {
                    let ann = out.pointer("/spec/template/metadata/annotations").unwrap();
                    assert!(ann.get("rekindle.io/config-hashes").is_none());
                    let lrf: Value = serde_json::from_str(
                        ann["reloader.stakater.com/last-reloaded-from"]
                            .as_str()
                            .unwrap(),
                    )
                    .unwrap();
                    assert_eq!(lrf["hash"], delete_marker_hash());
                }
            }
            // Without --reload-on-delete the delete is not acted on.
            let off = PlanConfig {
                reload_on_delete: false,
                ..cfg.clone()
            };
            assert_eq!(
                plan(
                    &off,
                    &stamped,
                    WorkloadKind::Deployment,
                    &change(Event::Delete, ""),
                    2
                )
                .decision
                .reason,
                Reason::EventDisabled
            );
        }
    }

    #[test]
    fn create_needs_reload_on_create() {
        let obj = workload(WorkloadKind::Deployment, auto());
        let c = Change {
            event: Event::Create,
            also_current: None,
            ..update(ResourceKind::ConfigMap, "app-config", H1)
        };
        assert_eq!(
            plan(
                &PlanConfig::default(),
                &obj,
                WorkloadKind::Deployment,
                &c,
                0
            )
            .decision
            .reason,
            Reason::EventDisabled
        );
        let cfg = PlanConfig {
            reload_on_create: true,
            ..Default::default()
        };
        assert!(
            plan(&cfg, &obj, WorkloadKind::Deployment, &c, 0)
                .decision
                .reload
        );
    }

    #[test]
    fn cronjob_job_mode_keeps_markers_in_metadata() {
        let cfg = PlanConfig::default();
        let obj = workload(WorkloadKind::CronJob, auto());
        let p = plan(
            &cfg,
            &obj,
            WorkloadKind::CronJob,
            &update(ResourceKind::ConfigMap, "app-config", H1),
            0,
        );
        assert_eq!(p.action, Action::CreateJob);
        let out = reload_and_check_idempotent(
            &cfg,
            &obj,
            WorkloadKind::CronJob,
            &update(ResourceKind::ConfigMap, "app-config", H1),
        );
        assert_eq!(
            config_hashes(&out, WorkloadKind::CronJob, Place::Metadata)["configmap/app-config"],
            H1
        );
        let mut suspended = obj.clone();
        suspended["spec"]["suspend"] = json!(true);
        assert_eq!(
            plan(
                &cfg,
                &suspended,
                WorkloadKind::CronJob,
                &update(ResourceKind::ConfigMap, "app-config", H1),
                0
            )
            .decision
            .reason,
            Reason::Suspended
        );
    }

    #[test]
    fn rollout_restart_and_workload_ref() {
        let cfg = PlanConfig::default();
        let mut ann = auto();
        ann["reloader.stakater.com/rollout-strategy"] = json!("restart");
        let obj = workload(WorkloadKind::Rollout, ann);
        let p = plan(
            &cfg,
            &obj,
            WorkloadKind::Rollout,
            &update(ResourceKind::ConfigMap, "app-config", H1),
            0,
        );
        assert_eq!(p.action, Action::Restart);
        assert_eq!(
            p.changes,
            vec![MarkerChange::SetConfigHash {
                place: Place::Metadata,
                key: "configmap/app-config".into(),
                hash: H1.into()
            }]
        );
        let workload_ref = json!({"metadata": {"name": "r", "annotations": auto()}, "spec": {"workloadRef": {"kind": "Deployment", "name": "d"}}});
        assert_eq!(
            plan(
                &cfg,
                &workload_ref,
                WorkloadKind::Rollout,
                &update(ResourceKind::ConfigMap, "app-config", H1),
                0
            )
            .decision
            .reason,
            Reason::NotReferenced
        );
    }

    #[test]
    fn named_unreferenced_goes_to_first_container_and_no_containers_is_no_reload() {
        let cfg = PlanConfig::default();
        let obj = workload(
            WorkloadKind::Deployment,
            json!({"configmap.reloader.stakater.com/reload": "other"}),
        );
        let out = reload_and_check_idempotent(
            &cfg,
            &obj,
            WorkloadKind::Deployment,
            &update(ResourceKind::ConfigMap, "other", H1),
        );
        assert_eq!(
            out.pointer("/spec/template/spec/containers/0/env/0/name")
                .unwrap(),
            "STAKATER_OTHER_CONFIGMAP"
        );
        let empty = json!({"metadata": {"annotations": {"configmap.reloader.stakater.com/reload": "other"}}, "spec": {"template": {"spec": {"containers": []}}}});
        assert_eq!(
            plan(
                &cfg,
                &empty,
                WorkloadKind::Deployment,
                &update(ResourceKind::ConfigMap, "other", H1),
                0
            )
            .decision
            .reason,
            Reason::NoContainer
        );
    }

    #[test]
    fn csi_checks_first_container_carrying_the_name() {
        let cfg = PlanConfig::default();
        let obj = json!({"metadata": {"annotations": auto()}, "spec": {"template": {"spec": {
            "volumes": [{"name": "s", "csi": {"driver": "d", "volumeAttributes": {"secretProviderClass": "spc"}}}],
            "containers": [{"name": "a", "env": [{"name": "STAKATER_SPC_SECRETPROVIDERCLASS", "value": H1}]},
                           {"name": "b", "volumeMounts": [{"name": "s"}]}]}}}});
        let p = plan(
            &cfg,
            &obj,
            WorkloadKind::Deployment,
            &update(ResourceKind::SecretProviderClass, "spc", H1),
            0,
        );
        assert_eq!(p.decision.reason, Reason::AlreadyCurrent);
        let p = plan(
            &cfg,
            &obj,
            WorkloadKind::Deployment,
            &update(ResourceKind::SecretProviderClass, "spc", H2),
            0,
        );
        assert_eq!(p.container.unwrap().name, "b");
    }
}
