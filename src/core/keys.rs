//! Used keys (behaviour §14): with `used-keys`, a workload that reads only some keys of a ConfigMap or
//! Secret carries a marker of those keys, so a change of the others reloads nothing.
//!
//! The index keeps no data, so the marker is computed from a digest per key: each value's SHA-1,
//! then Reloader's method (sort `key=value`, join with `;`, SHA-1) over `key=<value's SHA-1 in hex>`
//! for the used keys present. Values are taken as Reloader hashes them: ConfigMap `data` as is,
//! `binaryData` in base64, Secret values decoded.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use serde_json::Value;
use sha1::{Digest, Sha1};

use super::hash::{configmap_hash_typed, hash_entries, secret_hash_typed, sha1_hex};
use super::refs;
use super::{ResourceKind, WorkloadKind};

/// The annotation that chooses the mode (metadata, else the pod template).
pub const RELOAD_ON_ANNOTATION: &str = "rekindle.io/reload-on";

/// Which changes of a ConfigMap or Secret reload a workload that uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ReloadOn {
    /// Any change of the object (Reloader's behaviour).
    #[default]
    AnyKey,
    /// Only a change of a key the workload reads.
    UsedKeys,
}

impl ReloadOn {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AnyKey => "any-key",
            Self::UsedKeys => "used-keys",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "any-key" => Some(Self::AnyKey),
            "used-keys" => Some(Self::UsedKeys),
            _ => None,
        }
    }
}

/// The workload's mode: its annotation (metadata first, then the pod template), else `default`. An
/// annotation that is neither value is returned as `Err` with the default, for a Warning Event.
pub fn reload_on(obj: &Value, kind: WorkloadKind, default: ReloadOn) -> Result<ReloadOn, String> {
    fn read(a: Option<&Value>) -> Option<&str> {
        a.and_then(|a| a.get(RELOAD_ON_ANNOTATION))
            .and_then(Value::as_str)
    }
    let written = read(refs::at(obj, "/metadata/annotations")).or_else(|| {
        refs::pod_template(obj, kind).and_then(|t| read(refs::at(t, "/metadata/annotations")))
    });
    match written {
        None => Ok(default),
        Some(v) => ReloadOn::parse(v).ok_or_else(|| v.to_string()),
    }
}

/// How a pod spec uses one ConfigMap or Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Use {
    /// Every key: `envFrom`, a volume or projected source without `items` (or a SecretProviderClass).
    Whole,
    /// Only these keys: `configMapKeyRef`/`secretKeyRef` and `items`.
    Keys(BTreeSet<String>),
}

/// The keys of `name` the pod spec reads. Only mounted volumes count, as for references (behaviour §1).
pub fn used_keys(spec: &Value, kind: ResourceKind, name: &str) -> Use {
    let (key_ref, from_ref, volume_ptr, source_ptr) = match kind {
        ResourceKind::ConfigMap => (
            "configMapKeyRef",
            "configMapRef",
            "/configMap/name",
            "/configMap/name",
        ),
        ResourceKind::Secret => (
            "secretKeyRef",
            "secretRef",
            "/secret/secretName",
            "/secret/name",
        ),
        ResourceKind::SecretProviderClass => return Use::Whole,
    };
    let source_kind = if kind == ResourceKind::ConfigMap {
        "configMap"
    } else {
        "secret"
    };
    fn list<'a>(v: &'a Value, k: &str) -> &'a [Value] {
        v.get(k)
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }
    let containers: Vec<&Value> = list(spec, "containers")
        .iter()
        .chain(list(spec, "initContainers"))
        .collect();
    let mounted = |volume: &str| {
        containers.iter().any(|c| {
            list(c, "volumeMounts")
                .iter()
                .any(|m| m.get("name").and_then(Value::as_str) == Some(volume))
        })
    };
    let mut keys = BTreeSet::new();
    // `items` of a volume or projected source naming the object; none means the whole object.
    let mut items = |node: &Value| -> bool {
        match node.get("items").and_then(Value::as_array) {
            Some(items) => {
                keys.extend(
                    items
                        .iter()
                        .filter_map(|i| i.get("key").and_then(Value::as_str))
                        .map(String::from),
                );
                true
            }
            None => false,
        }
    };
    for vol in list(spec, "volumes") {
        let Some(volume) = vol.get("name").and_then(Value::as_str) else {
            continue;
        };
        if !mounted(volume) {
            continue;
        }
        if refs::at(vol, volume_ptr).and_then(Value::as_str) == Some(name)
            && !items(&vol[source_kind])
        {
            return Use::Whole;
        }
        for src in list(vol.get("projected").unwrap_or(&Value::Null), "sources") {
            if refs::at(src, source_ptr).and_then(Value::as_str) == Some(name)
                && !items(&src[source_kind])
            {
                return Use::Whole;
            }
        }
    }
    for c in containers.iter().copied() {
        let named =
            |r: Option<&Value>| r.and_then(|r| r.get("name")).and_then(Value::as_str) == Some(name);
        if list(c, "envFrom").iter().any(|e| named(e.get(from_ref))) {
            return Use::Whole;
        }
        for e in list(c, "env") {
            let r = e.get("valueFrom").and_then(|v| v.get(key_ref));
            if named(r) {
                if let Some(k) = r.and_then(|r| r.get("key")).and_then(Value::as_str) {
                    keys.insert(k.to_string());
                }
            }
        }
    }
    Use::Keys(keys)
}

/// A ConfigMap's or Secret's value digests, by key, with the whole-object hash they were taken with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDigests {
    /// The object's hash (Reloader's), to tell whether these digests are of its current content.
    pub of: Box<str>,
    keys: Box<[(Box<str>, [u8; 20])]>,
}

impl KeyDigests {
    fn new<'a>(of: String, values: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Self {
        let mut keys: Vec<(Box<str>, [u8; 20])> = values
            .into_iter()
            .map(|(k, v)| (k.into(), Sha1::digest(v).into()))
            .collect();
        keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        keys.dedup_by(|a, b| a.0 == b.0);
        Self {
            of: of.into(),
            keys: keys.into_boxed_slice(),
        }
    }

    pub fn of_configmap(cm: &k8s_openapi::api::core::v1::ConfigMap) -> Self {
        let encoded: Vec<(&str, String)> = cm
            .binary_data
            .iter()
            .flatten()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    base64::engine::general_purpose::STANDARD.encode(&v.0),
                )
            })
            .collect();
        let values = cm
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .chain(encoded.iter().map(|(k, v)| (*k, v.as_bytes())));
        Self::new(configmap_hash_typed(cm), values)
    }

    /// As the apiserver stores it: `stringData` merged over `data`.
    pub fn of_secret(secret: &k8s_openapi::api::core::v1::Secret) -> Self {
        let mut merged: BTreeMap<&str, &[u8]> = BTreeMap::new();
        for (k, v) in secret.data.iter().flatten() {
            merged.insert(k, &v.0);
        }
        for (k, v) in secret.string_data.iter().flatten() {
            merged.insert(k, v.as_bytes());
        }
        Self::new(secret_hash_typed(secret), merged)
    }

    /// The marker of a workload that reads `keys`.
    pub fn hash(&self, keys: &BTreeSet<String>) -> String {
        let hexed: Vec<(&str, String)> = self
            .keys
            .iter()
            .filter(|(k, _)| keys.contains(&**k))
            .map(|(k, d)| (&**k, hex(d)))
            .collect();
        hash_entries(hexed.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())))
    }

    /// Bytes kept on the heap (for the index's memory accounting in tests and benchmarks).
    pub fn heap_bytes(&self) -> usize {
        self.of.len() + self.keys.iter().map(|(k, _)| k.len() + 36).sum::<usize>()
    }
}

fn hex(digest: &[u8; 20]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The used-keys marker of `key=value` pairs, computed from the values themselves (what
/// [`KeyDigests::hash`] gives for the same pairs; the documented vectors use this).
pub fn used_keys_hash<'a>(values: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let hexed: Vec<(&str, String)> = values.into_iter().map(|(k, v)| (k, sha1_hex(v))).collect();
    hash_entries(hexed.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())))
}

/// What a workload's marker for one resource must be to be current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owed {
    /// The hash a reload writes.
    pub write: String,
    /// Another marker that also counts as current: in `used-keys` mode the whole object's hash (a
    /// workload stamped before it switched modes carries every key's current values, so its used keys
    /// too).
    pub also_current: Option<String>,
}

impl Owed {
    /// The whole object's hash: what every key counts for, and the fallback that misses nothing.
    pub fn whole(full: &str) -> Self {
        Self {
            write: full.to_string(),
            also_current: None,
        }
    }
}

/// The marker owed for a resource whose whole-object hash is `full`, to a workload that reads the
/// keys `read` of it (`None`: every key counts). `None` when it reads some keys only and `digests` are
/// not of the current content (the caller reads the object).
pub fn owed(
    read: Option<&BTreeSet<String>>,
    full: &str,
    digests: Option<&KeyDigests>,
) -> Option<Owed> {
    match read {
        Some(keys) => {
            let digests = digests.filter(|d| *d.of == *full)?;
            Some(Owed {
                write: digests.hash(keys),
                also_current: Some(full.to_string()),
            })
        }
        None => Some(Owed::whole(full)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(k: &[&str]) -> Use {
        Use::Keys(k.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn what_a_pod_spec_reads() {
        let spec = json!({
            "volumes": [
                {"name": "items", "configMap": {"name": "vol", "items": [{"key": "a.conf", "path": "a"}]}},
                {"name": "whole", "configMap": {"name": "whole"}},
                {"name": "unmounted", "configMap": {"name": "keyed"}},
                {"name": "proj", "projected": {"sources": [
                    {"secret": {"name": "s", "items": [{"key": "tls.crt", "path": "c"}]}},
                    {"configMap": {"name": "pwhole"}}]}}
            ],
            "initContainers": [{"name": "i", "env": [
                {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "user"}}}]}],
            "containers": [{"name": "app",
                "volumeMounts": [{"name": "items"}, {"name": "whole"}, {"name": "proj"}],
                "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "keyed", "key": "one"}}},
                        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "keyed", "key": "two"}}},
                        {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "vol", "key": "b"}}}],
                "envFrom": [{"secretRef": {"name": "all"}}]}]
        });
        let cm = ResourceKind::ConfigMap;
        assert_eq!(used_keys(&spec, cm, "vol"), keys(&["a.conf", "b"]));
        // An unmounted volume without items does not make it whole.
        assert_eq!(used_keys(&spec, cm, "keyed"), keys(&["one", "two"]));
        assert_eq!(used_keys(&spec, cm, "whole"), Use::Whole);
        assert_eq!(used_keys(&spec, cm, "pwhole"), Use::Whole);
        assert_eq!(
            used_keys(&spec, ResourceKind::Secret, "s"),
            keys(&["tls.crt", "user"])
        );
        assert_eq!(used_keys(&spec, ResourceKind::Secret, "all"), Use::Whole);
        // Used both ways: every key.
        let both = json!({"containers": [{"name": "c",
            "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "k"}}}],
            "envFrom": [{"configMapRef": {"name": "x"}}]}]});
        assert_eq!(used_keys(&both, cm, "x"), Use::Whole);
        assert_eq!(used_keys(&json!({}), cm, "x"), keys(&[]));
    }

    #[test]
    fn the_mode_from_annotations_and_default() {
        let d = WorkloadKind::Deployment;
        let obj = |meta: Value, tpl: Value| {
            json!({"metadata": {"annotations": meta},
                "spec": {"template": {"metadata": {"annotations": tpl}, "spec": {}}}})
        };
        let on = |v: &str| json!({RELOAD_ON_ANNOTATION: v});
        assert_eq!(
            reload_on(&obj(json!({}), json!({})), d, ReloadOn::AnyKey),
            Ok(ReloadOn::AnyKey)
        );
        assert_eq!(
            reload_on(&obj(json!({}), json!({})), d, ReloadOn::UsedKeys),
            Ok(ReloadOn::UsedKeys)
        );
        assert_eq!(
            reload_on(&obj(json!({}), on("used-keys")), d, ReloadOn::AnyKey),
            Ok(ReloadOn::UsedKeys)
        );
        // Metadata wins over the template; any-key opts out of the flag's default.
        assert_eq!(
            reload_on(&obj(on("any-key"), on("used-keys")), d, ReloadOn::UsedKeys),
            Ok(ReloadOn::AnyKey)
        );
        assert_eq!(
            reload_on(&obj(on("some-keys"), json!({})), d, ReloadOn::AnyKey),
            Err("some-keys".into())
        );
    }

    fn cm(data: Value, binary: Value) -> k8s_openapi::api::core::v1::ConfigMap {
        serde_json::from_value(
            json!({"metadata": {"name": "c"}, "data": data, "binaryData": binary}),
        )
        .unwrap()
    }

    /// docs/behaviour.md §14 states these vectors.
    #[test]
    fn the_documented_vectors_hold() {
        let rows = crate::core::behaviour_doc::table("14.");
        let computed = [
            used_keys_hash([("a", b"1".as_slice())]),
            used_keys_hash([("a", b"1".as_slice()), ("b", b"2".as_slice())]),
            used_keys_hash([]),
        ];
        let documented: Vec<&str> = rows.iter().map(|r| r[2].as_str()).collect();
        assert_eq!(computed.as_slice(), documented.as_slice());
        for row in &rows {
            let string = if row[1] == "(empty)" { "" } else { &row[1] };
            assert_eq!(sha1_hex(string.as_bytes()), row[2], "row {row:?}");
        }
    }

    #[test]
    fn digests_give_the_marker_of_the_used_keys_only() {
        let one = KeyDigests::of_configmap(&cm(json!({"a": "1", "b": "2"}), json!({})));
        let other_changed = KeyDigests::of_configmap(&cm(json!({"a": "1", "b": "3"}), json!({})));
        let used: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(one.hash(&used), used_keys_hash([("a", b"1".as_slice())]));
        assert_eq!(one.hash(&used), other_changed.hash(&used));
        assert_ne!(one.of, other_changed.of);
        let both: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        assert_ne!(one.hash(&both), other_changed.hash(&both));
        // A used key that is absent is left out; binaryData is hashed as its base64 text.
        let missing: BTreeSet<String> = ["zz".to_string()].into();
        assert_eq!(one.hash(&missing), used_keys_hash([]));
        let bin = KeyDigests::of_configmap(&cm(json!({}), json!({"bin": "dGVzdA=="})));
        let b: BTreeSet<String> = ["bin".to_string()].into();
        assert_eq!(
            bin.hash(&b),
            used_keys_hash([("bin", b"dGVzdA==".as_slice())])
        );
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {"name": "s"}, "data": {"password": "b2xk"}, "stringData": {"password": "new"}}))
        .unwrap();
        let p: BTreeSet<String> = ["password".to_string()].into();
        assert_eq!(
            KeyDigests::of_secret(&secret).hash(&p),
            used_keys_hash([("password", b"new".as_slice())])
        );
    }

    #[test]
    fn what_is_owed_for_the_keys_read() {
        let d = KeyDigests::of_configmap(&cm(json!({"a": "1", "b": "2"}), json!({})));
        let full = d.of.to_string();
        let a: BTreeSet<String> = ["a".to_string()].into();
        let whole = owed(None, &full, None).unwrap();
        assert_eq!(
            (whole.write.as_str(), whole.also_current),
            (full.as_str(), None)
        );
        let used = owed(Some(&a), &full, Some(&d)).unwrap();
        assert_eq!(used.write, used_keys_hash([("a", b"1".as_slice())]));
        assert_eq!(used.also_current.as_deref(), Some(full.as_str()));
        // Digests of other content, or none: the object must be read.
        assert_eq!(owed(Some(&a), "other", Some(&d)), None);
        assert_eq!(owed(Some(&a), &full, None), None);
    }
}
