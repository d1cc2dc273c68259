//! Marker changes (behaviour §7, §10) and their rendering as RFC 6902 operations against one object.
//!
//! A marker change says what must change ("set env var X=h on container 0"); rendering turns it into
//! JSON-patch ops that apply to exactly the object given: parents are added only when absent, `replace`
//! only targets paths that exist, and rendering emits no `test` op (the webhook's patch must never
//! fail to apply: that would reject the user's request even with `failurePolicy: Ignore`). The
//! writer's guards are separate ops: [`test_resource_version`] and [`content_guard`].

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation};
use serde::Serialize;
use serde_json::{json, Value};

use super::policy::{CONFIG_HASHES_ANNOTATION, LAST_RELOADED_FROM_ANNOTATION};
use super::{ResourceKind, WorkloadKind};

/// Where a marker lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Place {
    /// The pod template: changing it rolls the workload.
    Template,
    /// The workload's own metadata: records state without rolling (CronJob in `job` mode, Rollout restart).
    Metadata,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum MarkerChange {
    SetEnv {
        container: usize,
        name: String,
        value: String,
    },
    RemoveEnv {
        container: usize,
        name: String,
    },
    SetConfigHash {
        place: Place,
        key: String,
        hash: String,
    },
    RemoveConfigHash {
        place: Place,
        key: String,
    },
    SetLastReloadedFrom {
        value: String,
    },
}

/// The key of a resource in `rekindle.io/config-hashes`.
pub fn config_hash_key(kind: ResourceKind, name: &str) -> String {
    format!("{}/{}", kind.hash_key_prefix(), name)
}

/// Reloader's `last-reloaded-from` payload; field order and names as Reloader serialises them.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReloadSource<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub hash: &'a str,
    pub container_refs: Vec<&'a str>,
    pub observed_at: i64,
}

impl ReloadSource<'_> {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

fn annotations_pointer(kind: WorkloadKind, place: Place) -> PointerBuf {
    let mut p = match place {
        Place::Metadata => PointerBuf::root(),
        Place::Template => template_pointer(kind),
    };
    p.push_back("metadata");
    p.push_back("annotations");
    p
}

fn template_pointer(kind: WorkloadKind) -> PointerBuf {
    PointerBuf::from_tokens(kind.template_pointer().split('/').skip(1))
}

fn container_pointer(kind: WorkloadKind, container: usize) -> PointerBuf {
    let mut p = template_pointer(kind);
    p.push_back("spec");
    p.push_back("containers");
    p.push_back(container);
    p
}

fn get<'a>(obj: &'a Value, ptr: &PointerBuf) -> Option<&'a Value> {
    // Walks decoded tokens directly: serde_json's `pointer` allocates for every token.
    ptr.tokens()
        .try_fold(obj, |node, token| match node {
            Value::Object(m) => m.get(token.decoded().as_ref()),
            Value::Array(a) => token
                .to_index()
                .ok()?
                .for_len(a.len())
                .ok()
                .and_then(|i| a.get(i)),
            _ => None,
        })
        .filter(|v| !v.is_null())
}

/// The config-hashes map at a place, empty when absent or unparsable.
pub fn config_hashes(obj: &Value, kind: WorkloadKind, place: Place) -> BTreeMap<String, String> {
    let mut ptr = annotations_pointer(kind, place);
    ptr.push_back(CONFIG_HASHES_ANNOTATION);
    get(obj, &ptr)
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// The value of env var `name` in container `container`, if set with a plain value.
pub fn env_value<'a>(
    obj: &'a Value,
    kind: WorkloadKind,
    container: usize,
    name: &str,
) -> Option<&'a str> {
    let mut ptr = container_pointer(kind, container);
    ptr.push_back("env");
    get(obj, &ptr)?
        .as_array()?
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))?
        .get("value")?
        .as_str()
}

/// The value of env var `name` in the first container carrying it (the CSI check of behaviour §7).
pub fn first_env_value<'a>(obj: &'a Value, kind: WorkloadKind, name: &str) -> Option<&'a str> {
    let mut ptr = template_pointer(kind);
    ptr.push_back("spec");
    ptr.push_back("containers");
    let containers = get(obj, &ptr)?.as_array()?;
    containers.iter().find_map(|c| {
        c.get("env")?
            .as_array()?
            .iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
            .map(|e| e.get("value").and_then(Value::as_str).unwrap_or(""))
    })
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("the workload has no container {0}")]
    NoContainer(usize),
    #[error("a parent of {0} is not an object")]
    NotAnObject(String),
    #[error("the rendered patch did not apply: {0}")]
    Apply(#[from] json_patch::PatchError),
}

/// Renders marker changes as RFC 6902 ops against `obj`. Each change is rendered against the result of
/// the previous ones, so the ops apply in order to exactly this object.
pub fn render(
    obj: &Value,
    kind: WorkloadKind,
    changes: &[MarkerChange],
) -> Result<Vec<PatchOperation>, RenderError> {
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    let mut working = obj.clone();
    render_onto(&mut working, kind, changes)
}

/// Renders marker changes against `working` and applies them to it as it goes: the ops apply in
/// order to the object `working` was, and `working` ends as the result.
pub fn render_onto(
    working: &mut Value,
    kind: WorkloadKind,
    changes: &[MarkerChange],
) -> Result<Vec<PatchOperation>, RenderError> {
    let mut all = Vec::new();
    for change in changes {
        let ops = render_one(working, kind, change)?;
        json_patch::patch(working, &ops)?;
        all.extend(ops);
    }
    Ok(all)
}

/// Renders and applies: the object as it will be after the changes.
pub fn apply(
    obj: &Value,
    kind: WorkloadKind,
    changes: &[MarkerChange],
) -> Result<Value, RenderError> {
    let ops = render(obj, kind, changes)?;
    let mut out = obj.clone();
    json_patch::patch(&mut out, &ops)?;
    Ok(out)
}

/// Guards a JSON patch: the apiserver applies it only to the version that was read (422 otherwise).
pub fn test_resource_version(resource_version: &str) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
        value: Value::String(resource_version.to_string()),
    })
}

/// Guards a JSON patch by what it replaces instead of by the whole object's version: a `test` of
/// each marker's current entry (and of the name of the container holding it). Another writer moving
/// anything else (labels, replicas, status, other env vars) does not refuse the write, and a write
/// planned from markers another leader has since replaced still fails (422), as the
/// resourceVersion guard would. `None` when a change adds a marker the object lacks (an absence
/// cannot be tested) or a tested value might be encoded differently by the apiserver, which
/// compares the bytes of strings (see [`comparable`]): the caller guards by the resourceVersion then.
pub fn content_guard(
    obj: &Value,
    kind: WorkloadKind,
    changes: &[MarkerChange],
) -> Option<Vec<PatchOperation>> {
    let mut guard = Guard::default();
    for change in changes {
        match change {
            MarkerChange::SetEnv {
                container, name, ..
            }
            | MarkerChange::RemoveEnv { container, name } => {
                let base = container_pointer(kind, *container);
                let c = get(obj, &base)?;
                let mut name_ptr = base.clone();
                name_ptr.push_back("name");
                guard.test(name_ptr, c.get("name")?)?;
                let env = c.get("env").and_then(Value::as_array);
                match env.and_then(|env| Some((env_position(env, name)?, env))) {
                    Some((i, env)) => {
                        let mut entry = base;
                        entry.push_back("env");
                        entry.push_back(i);
                        guard.test(entry, &env[i])?;
                    }
                    // Removing what is not there renders nothing.
                    _ if matches!(change, MarkerChange::RemoveEnv { .. }) => {}
                    _ => return None,
                }
            }
            MarkerChange::SetConfigHash { place, .. } => {
                guard.annotation(obj, kind, *place, CONFIG_HASHES_ANNOTATION, true)?
            }
            MarkerChange::RemoveConfigHash { place, .. } => {
                guard.annotation(obj, kind, *place, CONFIG_HASHES_ANNOTATION, false)?
            }
            MarkerChange::SetLastReloadedFrom { .. } => guard.annotation(
                obj,
                kind,
                Place::Template,
                LAST_RELOADED_FROM_ANNOTATION,
                true,
            )?,
        }
    }
    (!guard.tests.is_empty()).then_some(guard.tests)
}

/// The `test` ops of a content guard, one per path.
#[derive(Default)]
struct Guard {
    tests: Vec<PatchOperation>,
}

impl Guard {
    fn test(&mut self, path: PointerBuf, value: &Value) -> Option<()> {
        if !comparable(value) {
            return None;
        }
        let seen = self
            .tests
            .iter()
            .any(|t| matches!(t, PatchOperation::Test(t) if t.path == path));
        if !seen {
            self.tests.push(PatchOperation::Test(TestOperation {
                path,
                value: value.clone(),
            }));
        }
        Some(())
    }

    /// Tests annotation `key` at `place`; `None` if it is absent and `required` (it is being added).
    fn annotation(
        &mut self,
        obj: &Value,
        kind: WorkloadKind,
        place: Place,
        key: &str,
        required: bool,
    ) -> Option<()> {
        let mut ptr = annotations_pointer(kind, place);
        ptr.push_back(key);
        match get(obj, &ptr) {
            Some(value) => self.test(ptr, value),
            None if required => None,
            None => Some(()),
        }
    }
}

/// Whether the apiserver's `test` is sure to find `value` equal to its own copy: it compares strings
/// and numbers by their JSON bytes, and its encoder escapes `<`, `&` and some non-ASCII characters
/// (U+2028) where serde_json does not (and HTML escaping covers `>` too), and writes fractions its
/// own way, so only printable ASCII without those, and integers, are compared (e2e/tests/guards.rs
/// checks this against the real apiserver).
fn comparable(value: &Value) -> bool {
    let plain = |s: &str| {
        s.bytes()
            .all(|b| (b' '..=b'~').contains(&b) && !matches!(b, b'<' | b'>' | b'&'))
    };
    match value {
        Value::Null | Value::Bool(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        Value::String(s) => plain(s),
        Value::Array(a) => a.iter().all(comparable),
        Value::Object(m) => m.iter().all(|(k, v)| plain(k) && comparable(v)),
    }
}

/// Argo Rollouts' restart strategy: `spec.restartAt`, whole seconds in UTC, which the Rollouts
/// controller compares with its pods' creation times.
pub fn restart_at(now: jiff::Timestamp) -> PatchOperation {
    let now = now.round(jiff::Unit::Second).unwrap_or(now);
    add(
        PointerBuf::from_tokens(["spec", "restartAt"]),
        json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
    )
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// Ops that create the missing objects along `ptr` (each parent added as `{}` only when absent).
fn ensure_objects(
    obj: &Value,
    ptr: &PointerBuf,
    ops: &mut Vec<PatchOperation>,
) -> Result<(), RenderError> {
    let mut current = PointerBuf::root();
    let mut node = Some(obj);
    for token in ptr.tokens() {
        current.push_back(token.clone());
        let next = node
            .and_then(|n| n.as_object())
            .and_then(|m| m.get(token.decoded().as_ref()));
        match next {
            Some(v) if v.is_object() => node = Some(v),
            Some(Value::Null) | None => {
                if node.is_some_and(|n| !n.is_object()) {
                    return Err(RenderError::NotAnObject(current.to_string()));
                }
                ops.push(add(current.clone(), json!({})));
                node = None;
            }
            Some(_) => return Err(RenderError::NotAnObject(current.to_string())),
        }
    }
    Ok(())
}

fn set_annotation(
    obj: &Value,
    ann: PointerBuf,
    key: &str,
    value: String,
) -> Result<Vec<PatchOperation>, RenderError> {
    let mut ops = Vec::new();
    ensure_objects(obj, &ann, &mut ops)?;
    let mut path = ann;
    path.push_back(key);
    // `add` on an existing member replaces it, so it is right whether or not the key exists.
    ops.push(add(path, Value::String(value)));
    Ok(ops)
}

/// Where env var `name` is in the env list `env`: its first entry of that name, the one rendering
/// replaces or removes and the content guard tests.
fn env_position(env: &[Value], name: &str) -> Option<usize> {
    env.iter()
        .position(|e| e.get("name").and_then(Value::as_str) == Some(name))
}

/// Sets env var `name` of container `container` to `value`: replaces a plain value in place, an entry
/// with `valueFrom` whole, and appends one that is missing.
fn set_env(
    obj: &Value,
    kind: WorkloadKind,
    container: usize,
    name: &str,
    value: &str,
) -> Result<Vec<PatchOperation>, RenderError> {
    let base = container_pointer(kind, container);
    let c = get(obj, &base)
        .filter(|c| c.is_object())
        .ok_or(RenderError::NoContainer(container))?;
    let mut env_ptr = base.clone();
    env_ptr.push_back("env");
    let entry = json!({"name": name, "value": value});
    let Some(env) = c.get("env").and_then(Value::as_array) else {
        return Ok(vec![add(env_ptr, json!([entry]))]);
    };
    let Some(i) = env_position(env, name) else {
        env_ptr.push_back("-");
        return Ok(vec![add(env_ptr, entry)]);
    };
    let mut path = env_ptr;
    path.push_back(i);
    let plain = env[i].get("value").is_some() && env[i].get("valueFrom").is_none();
    let value = if plain {
        path.push_back("value");
        json!(value)
    } else {
        entry
    };
    Ok(vec![PatchOperation::Replace(ReplaceOperation {
        path,
        value,
    })])
}

/// Removes env var `name` of container `container`, if it is there.
fn remove_env(
    obj: &Value,
    kind: WorkloadKind,
    container: usize,
    name: &str,
) -> Vec<PatchOperation> {
    let mut env_ptr = container_pointer(kind, container);
    env_ptr.push_back("env");
    let pos = get(obj, &env_ptr)
        .and_then(Value::as_array)
        .and_then(|env| env_position(env, name));
    pos.map(|i| {
        env_ptr.push_back(i);
        vec![PatchOperation::Remove(RemoveOperation { path: env_ptr })]
    })
    .unwrap_or_default()
}

fn render_one(
    obj: &Value,
    kind: WorkloadKind,
    change: &MarkerChange,
) -> Result<Vec<PatchOperation>, RenderError> {
    match change {
        MarkerChange::SetEnv {
            container,
            name,
            value,
        } => set_env(obj, kind, *container, name, value),
        MarkerChange::RemoveEnv { container, name } => Ok(remove_env(obj, kind, *container, name)),
        MarkerChange::SetConfigHash { place, key, hash } => {
            let mut hashes = config_hashes(obj, kind, *place);
            hashes.insert(key.clone(), hash.clone());
            let value = serde_json::to_string(&hashes).unwrap_or_default();
            set_annotation(
                obj,
                annotations_pointer(kind, *place),
                CONFIG_HASHES_ANNOTATION,
                value,
            )
        }
        MarkerChange::RemoveConfigHash { place, key } => {
            let mut hashes = config_hashes(obj, kind, *place);
            if hashes.remove(key).is_none() {
                return Ok(Vec::new());
            }
            let mut path = annotations_pointer(kind, *place);
            if hashes.is_empty() {
                path.push_back(CONFIG_HASHES_ANNOTATION);
                return Ok(vec![PatchOperation::Remove(RemoveOperation { path })]);
            }
            let value = serde_json::to_string(&hashes).unwrap_or_default();
            set_annotation(obj, path, CONFIG_HASHES_ANNOTATION, value)
        }
        MarkerChange::SetLastReloadedFrom { value } => set_annotation(
            obj,
            annotations_pointer(kind, Place::Template),
            LAST_RELOADED_FROM_ANNOTATION,
            value.clone(),
        ),
    }
}

/// Renders marker changes as one strategic-merge patch, for the built-in kinds. Containers merge by
/// name, env vars by name and annotations by key, so the patch names no list position. It carries the
/// resourceVersion of the object it was planned from, which the apiserver checks: a write delayed in
/// the network (sent by a leader just before a partition, delivered at its heal) is refused with 409
/// instead of putting older markers back over a newer leader's. Annotation values are those of the
/// JSON-patch rendering applied to `obj`, so both agree.
pub fn render_strategic(
    obj: &Value,
    kind: WorkloadKind,
    changes: &[MarkerChange],
    resource_version: &str,
) -> Result<Value, RenderError> {
    let after = apply(obj, kind, changes)?;
    let mut patch = json!({"metadata": {"resourceVersion": resource_version}});
    // Env entries per container name, in the order the changes name them; the last one per var wins.
    let mut containers: Vec<(String, Vec<Value>)> = Vec::new();
    let mut env_entry = |container: usize, name: &str, entry: Value| -> Result<(), RenderError> {
        let mut ptr = container_pointer(kind, container);
        ptr.push_back("name");
        let cname = get(obj, &ptr)
            .and_then(Value::as_str)
            .ok_or(RenderError::NoContainer(container))?
            .to_string();
        let pos = containers.iter().position(|(n, _)| *n == cname);
        let envs = match pos {
            Some(i) => &mut containers[i].1,
            None => {
                containers.push((cname, Vec::new()));
                &mut containers.last_mut().expect("just pushed").1
            }
        };
        envs.retain(|e| e.get("name").and_then(Value::as_str) != Some(name));
        envs.push(entry);
        Ok(())
    };
    for change in changes {
        match change {
            MarkerChange::SetEnv {
                container,
                name,
                value,
            } => env_entry(*container, name, json!({"name": name, "value": value}))?,
            MarkerChange::RemoveEnv { container, name } => {
                env_entry(*container, name, json!({"name": name, "$patch": "delete"}))?
            }
            MarkerChange::SetConfigHash { place, .. }
            | MarkerChange::RemoveConfigHash { place, .. } => {
                merge_annotation(&mut patch, &after, kind, *place, CONFIG_HASHES_ANNOTATION)
            }
            MarkerChange::SetLastReloadedFrom { .. } => merge_annotation(
                &mut patch,
                &after,
                kind,
                Place::Template,
                LAST_RELOADED_FROM_ANNOTATION,
            ),
        }
    }
    if !containers.is_empty() {
        let list = containers
            .into_iter()
            .map(|(name, env)| json!({"name": name, "env": env}))
            .collect();
        let mut ptr = template_pointer(kind);
        ptr.push_back("spec");
        object_at(&mut patch, &ptr).insert("containers".into(), Value::Array(list));
    }
    Ok(patch)
}

/// Sets `key` at `place` in the merge patch to its value in `after` (null when it was removed).
fn merge_annotation(patch: &mut Value, after: &Value, kind: WorkloadKind, place: Place, key: &str) {
    let ptr = annotations_pointer(kind, place);
    let value = get(after, &ptr)
        .and_then(|a| a.get(key))
        .cloned()
        .unwrap_or(Value::Null);
    object_at(patch, &ptr).insert(key.into(), value);
}

/// The object at `ptr` in `root`, created (as objects) along the way.
fn object_at<'a>(root: &'a mut Value, ptr: &PointerBuf) -> &'a mut serde_json::Map<String, Value> {
    let mut node = root;
    for token in ptr.tokens() {
        let map = match node {
            Value::Object(m) => m,
            other => {
                *other = json!({});
                other.as_object_mut().expect("just made an object")
            }
        };
        node = map
            .entry(token.decoded().into_owned())
            .or_insert_with(|| json!({}));
    }
    if !node.is_object() {
        *node = json!({});
    }
    node.as_object_mut().expect("an object")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container with a marker among other env vars, and its config-hashes annotation.
    fn marked(hash: &str) -> Value {
        json!({
            "metadata": {"resourceVersion": "7", "labels": {"busy": "1"}},
            "spec": {"replicas": 1, "template": {
                "metadata": {"annotations": {CONFIG_HASHES_ANNOTATION: format!("{{\"configmap/cfg\":\"{hash}\"}}")}},
                "spec": {"containers": [
                    {"name": "side", "image": "s"},
                    {"name": "app", "image": "i", "env": [
                        {"name": "LOG", "value": "debug"},
                        {"name": "STAKATER_CFG_CONFIGMAP", "value": hash},
                    ]},
                ]}}}
        })
    }

    fn guarded(obj: &Value, changes: &[MarkerChange]) -> Vec<PatchOperation> {
        let mut ops =
            content_guard(obj, WorkloadKind::Deployment, changes).expect("a content guard");
        ops.extend(render(obj, WorkloadKind::Deployment, changes).unwrap());
        ops
    }

    #[test]
    fn a_content_guard_refuses_only_writes_over_markers_that_moved() {
        let changes = [
            MarkerChange::SetEnv {
                container: 1,
                name: "STAKATER_CFG_CONFIGMAP".into(),
                value: "bbb".into(),
            },
            MarkerChange::SetConfigHash {
                place: Place::Template,
                key: "configmap/cfg".into(),
                hash: "bbb".into(),
            },
        ];
        let obj = marked("aaa");
        let ops = guarded(&obj, &changes);
        let paths: Vec<String> = ops
            .iter()
            .filter_map(|op| match op {
                PatchOperation::Test(t) => Some(t.path.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            paths,
            [
                "/spec/template/spec/containers/1/name",
                "/spec/template/spec/containers/1/env/1",
                "/spec/template/metadata/annotations/rekindle.io~1config-hashes",
            ]
        );
        // Another writer moved everything but the markers: the write applies, and sets them.
        let mut busy = obj.clone();
        busy["metadata"]["resourceVersion"] = json!("9");
        busy["metadata"]["labels"]["busy"] = json!("2");
        busy["spec"]["replicas"] = json!(3);
        busy["status"] = json!({"observedGeneration": 4});
        busy["spec"]["template"]["spec"]["containers"][1]["env"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "MORE", "value": "x"}));
        json_patch::patch(&mut busy, &ops).unwrap();
        assert_eq!(
            env_value(&busy, WorkloadKind::Deployment, 1, "STAKATER_CFG_CONFIGMAP"),
            Some("bbb")
        );
        // Another leader wrote a newer marker: the write would put an older one back, and fails.
        let newer = marked("ccc");
        assert!(json_patch::patch(&mut newer.clone(), &ops).is_err());
        // The container was replaced by another at its index: refused too.
        let mut renamed = obj.clone();
        renamed["spec"]["template"]["spec"]["containers"][1]["name"] = json!("other");
        assert!(json_patch::patch(&mut renamed, &ops).is_err());
    }

    #[test]
    fn without_a_testable_marker_the_version_guards_instead() {
        let set = |name: &str| MarkerChange::SetEnv {
            container: 1,
            name: name.into(),
            value: "bbb".into(),
        };
        let obj = marked("aaa");
        // A marker being added: its absence cannot be tested.
        assert!(content_guard(
            &obj,
            WorkloadKind::Deployment,
            &[set("STAKATER_NEW_SECRET")]
        )
        .is_none());
        let adds_annotation = MarkerChange::SetLastReloadedFrom { value: "{}".into() };
        assert!(content_guard(&obj, WorkloadKind::Deployment, &[adds_annotation]).is_none());
        // A value the apiserver encodes in its own way (`&` as \u0026) is not compared byte for byte.
        let mut escaped = obj.clone();
        escaped["spec"]["template"]["spec"]["containers"][1]["env"][1]["value"] = json!("a&b");
        assert!(content_guard(
            &escaped,
            WorkloadKind::Deployment,
            &[set("STAKATER_CFG_CONFIGMAP")]
        )
        .is_none());
        // Removing a marker that is not there needs no test of its entry (its container's name is
        // still tested); with no container there, no guard; with no change, none either.
        let remove_absent = MarkerChange::RemoveEnv {
            container: 1,
            name: "STAKATER_GONE_SECRET".into(),
        };
        assert!(content_guard(&obj, WorkloadKind::Deployment, &[remove_absent]).is_some());
        let no_container = MarkerChange::RemoveEnv {
            container: 5,
            name: "STAKATER_CFG_CONFIGMAP".into(),
        };
        assert!(content_guard(&obj, WorkloadKind::Deployment, &[no_container]).is_none());
        assert!(content_guard(&obj, WorkloadKind::Deployment, &[]).is_none());
    }

    #[test]
    fn guard_and_restart_ops() {
        let mut obj = json!({"metadata": {"resourceVersion": "41"}, "spec": {}});
        let now: jiff::Timestamp = "2026-03-04T05:06:07.89Z".parse().unwrap();
        let ops = vec![test_resource_version("41"), restart_at(now)];
        json_patch::patch(&mut obj, &ops).unwrap();
        // Rounded to whole seconds: the Rollouts controller's time format has no fraction.
        assert_eq!(obj["spec"]["restartAt"], "2026-03-04T05:06:08Z");
        let mut moved = json!({"metadata": {"resourceVersion": "42"}, "spec": {}});
        assert!(json_patch::patch(&mut moved, &[test_resource_version("41")]).is_err());
    }

    #[test]
    fn strategic_patch_names_containers_and_env_vars_not_positions() {
        let obj = json!({"spec": {"template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [
            {"name": "main", "image": "i"},
            {"name": "side", "image": "i", "env": [{"name": "A", "value": "1"}, {"name": "STAKATER_OLD_SECRET", "value": "s"}]}
        ]}}}});
        let changes = vec![
            MarkerChange::SetEnv {
                container: 1,
                name: "STAKATER_APP_CONFIGMAP".into(),
                value: "h1".into(),
            },
            MarkerChange::RemoveEnv {
                container: 1,
                name: "STAKATER_OLD_SECRET".into(),
            },
            MarkerChange::SetConfigHash {
                place: Place::Template,
                key: "configmap/app".into(),
                hash: "h1".into(),
            },
            MarkerChange::SetLastReloadedFrom { value: "{}".into() },
        ];
        let patch = render_strategic(&obj, WorkloadKind::Deployment, &changes, "41").unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "41"}, "spec": {"template": {
                "metadata": {"annotations": {
                    "rekindle.io/config-hashes": r#"{"configmap/app":"h1"}"#,
                    "reloader.stakater.com/last-reloaded-from": "{}"
                }},
                "spec": {"containers": [{"name": "side", "env": [
                    {"name": "STAKATER_APP_CONFIGMAP", "value": "h1"},
                    {"name": "STAKATER_OLD_SECRET", "$patch": "delete"}
                ]}]}
            }}})
        );
        // Metadata markers (CronJob in job mode) and a removed config hash (null deletes the key).
        let cron = json!({"metadata": {"annotations": {"rekindle.io/config-hashes": r#"{"secret/s":"h"}"#}},
                          "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}}});
        let remove = vec![MarkerChange::RemoveConfigHash {
            place: Place::Metadata,
            key: "secret/s".into(),
        }];
        let patch = render_strategic(&cron, WorkloadKind::CronJob, &remove, "7").unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "7", "annotations": {"rekindle.io/config-hashes": null}}})
        );
        // A container index the object does not have is an error, not a patch for a new container.
        let missing = vec![MarkerChange::SetEnv {
            container: 5,
            name: "X".into(),
            value: "v".into(),
        }];
        assert!(render_strategic(&obj, WorkloadKind::Deployment, &missing, "41").is_err());
    }

    fn deploy(containers: Value) -> Value {
        json!({"metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": containers}}}})
    }

    fn set_env(c: usize, name: &str, value: &str) -> MarkerChange {
        MarkerChange::SetEnv {
            container: c,
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn env_added_to_container_without_env() {
        let obj = deploy(json!([{"name": "a"}]));
        let out = apply(
            &obj,
            WorkloadKind::Deployment,
            &[set_env(0, "X", "h1"), set_env(0, "Y", "h2")],
        )
        .unwrap();
        assert_eq!(
            out.pointer("/spec/template/spec/containers/0/env").unwrap(),
            &json!([{"name": "X", "value": "h1"}, {"name": "Y", "value": "h2"}])
        );
    }

    #[test]
    fn env_replaced_in_place_and_appended() {
        let obj = deploy(
            json!([{"name": "a", "env": [{"name": "A", "value": "1"}, {"name": "X", "value": "old"}]}]),
        );
        let ops = render(&obj, WorkloadKind::Deployment, &[set_env(0, "X", "new")]).unwrap();
        assert_eq!(serde_json::to_value(&ops).unwrap()[0]["op"], "replace");
        let out = apply(
            &obj,
            WorkloadKind::Deployment,
            &[set_env(0, "X", "new"), set_env(0, "Z", "z")],
        )
        .unwrap();
        assert_eq!(
            out.pointer("/spec/template/spec/containers/0/env").unwrap(),
            &json!([{"name": "A", "value": "1"}, {"name": "X", "value": "new"}, {"name": "Z", "value": "z"}])
        );
    }

    #[test]
    fn env_with_value_from_is_replaced_whole() {
        let obj = deploy(
            json!([{"name": "a", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}]),
        );
        let out = apply(&obj, WorkloadKind::Deployment, &[set_env(0, "X", "h")]).unwrap();
        assert_eq!(
            out.pointer("/spec/template/spec/containers/0/env/0")
                .unwrap(),
            &json!({"name": "X", "value": "h"})
        );
    }

    #[test]
    fn env_removed() {
        let obj = deploy(
            json!([{"name": "a", "env": [{"name": "A", "value": "1"}, {"name": "X", "value": "h"}]}]),
        );
        let rm = MarkerChange::RemoveEnv {
            container: 0,
            name: "X".into(),
        };
        let out = apply(&obj, WorkloadKind::Deployment, std::slice::from_ref(&rm)).unwrap();
        assert_eq!(
            out.pointer("/spec/template/spec/containers/0/env").unwrap(),
            &json!([{"name": "A", "value": "1"}])
        );
        // Removing again is nothing to do.
        assert!(render(&out, WorkloadKind::Deployment, &[rm])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn missing_container_is_an_error_not_a_panic() {
        let obj = deploy(json!([]));
        assert!(matches!(
            render(&obj, WorkloadKind::Deployment, &[set_env(0, "X", "h")]),
            Err(RenderError::NoContainer(0))
        ));
    }

    #[test]
    fn config_hashes_create_parents_and_keep_other_annotations() {
        let set = |k: &str, h: &str| MarkerChange::SetConfigHash {
            place: Place::Template,
            key: k.into(),
            hash: h.into(),
        };
        // No template metadata at all.
        let obj = deploy(json!([{"name": "a"}]));
        let out = apply(
            &obj,
            WorkloadKind::Deployment,
            &[set("secret/s", "2"), set("configmap/c", "1")],
        )
        .unwrap();
        assert_eq!(
            out.pointer("/spec/template/metadata/annotations/rekindle.io~1config-hashes")
                .unwrap(),
            r#"{"configmap/c":"1","secret/s":"2"}"#
        );
        // Existing annotations survive.
        let mut obj = deploy(json!([{"name": "a"}]));
        obj["spec"]["template"]["metadata"] = json!({"annotations": {"keep": "me"}});
        let out = apply(&obj, WorkloadKind::Deployment, &[set("configmap/c", "1")]).unwrap();
        assert_eq!(
            out.pointer("/spec/template/metadata/annotations/keep")
                .unwrap(),
            "me"
        );
        // Removal of the last entry removes the annotation.
        let rm = MarkerChange::RemoveConfigHash {
            place: Place::Template,
            key: "configmap/c".into(),
        };
        let out = apply(&out, WorkloadKind::Deployment, &[rm]).unwrap();
        assert!(out
            .pointer("/spec/template/metadata/annotations/rekindle.io~1config-hashes")
            .is_none());
    }

    #[test]
    fn metadata_place_for_cronjob() {
        let obj = json!({"metadata": {"name": "c", "annotations": null}, "spec": {"jobTemplate": {"spec": {"template": {"spec": {}}}}}});
        let set = MarkerChange::SetConfigHash {
            place: Place::Metadata,
            key: "configmap/c".into(),
            hash: "h".into(),
        };
        let out = apply(&obj, WorkloadKind::CronJob, &[set]).unwrap();
        assert_eq!(
            config_hashes(&out, WorkloadKind::CronJob, Place::Metadata)["configmap/c"],
            "h"
        );
        assert!(out
            .pointer("/spec/jobTemplate/spec/template/metadata")
            .is_none());
    }

    #[test]
    fn last_reloaded_from_json_shape() {
        let s = ReloadSource {
            kind: "CONFIGMAP",
            name: "c",
            namespace: "ns",
            hash: "h",
            container_refs: vec!["app"],
            observed_at: 42,
        };
        assert_eq!(
            s.to_json(),
            r#"{"type":"CONFIGMAP","name":"c","namespace":"ns","hash":"h","containerRefs":["app"],"observedAt":42}"#
        );
    }
}
