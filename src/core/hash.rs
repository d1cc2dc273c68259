//! Config hashes, byte-identical to Reloader's (behaviour §2).
//!
//! Reloader joins `key=value` strings, sorts them bytewise, joins with `;` and takes SHA-1. We feed the
//! pieces to the hasher one by one instead of building the joined string, so hashing a 1 MiB ConfigMap
//! costs about as much as SHA-1 over its bytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use base64::Engine as _;
use serde_json::Value;
use sha1::{Digest, Sha1};

/// The 40-character lowercase hex SHA-1 of the delete marker (`__RELOADER_EMPTY_DELETE_MARKER__`).
pub fn delete_marker_hash() -> String {
    sha1_hex(b"__RELOADER_EMPTY_DELETE_MARKER__")
}

pub fn sha1_hex(bytes: &[u8]) -> String {
    hex(&Sha1::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    let mut s = String::with_capacity(40);
    for b in digest {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A hash as the index keeps it, for each of its resources and markers: the 40-digit lowercase hex
/// SHA-1 that every hash rekindle computes is, in its 20 bytes (a quarter of a boxed string and its
/// allocation); anything else (a marker someone wrote by hand) as it was written.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum StoredHash {
    Sha1([u8; 20]),
    Text(Box<str>),
}

impl StoredHash {
    pub fn new(text: &str) -> Self {
        Self::sha1(text).map_or_else(|| Self::Text(text.into()), Self::Sha1)
    }

    fn sha1(text: &str) -> Option<[u8; 20]> {
        let digits = text.as_bytes();
        if digits.len() != 40 {
            return None;
        }
        let mut bytes = [0u8; 20];
        for (b, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            *b = (lower_hex_digit(pair[0])? << 4) | lower_hex_digit(pair[1])?;
        }
        Some(bytes)
    }

    /// Whether this is the hash `text` spells (no allocation).
    pub fn is(&self, text: &str) -> bool {
        match self {
            Self::Sha1(bytes) => Self::sha1(text).is_some_and(|b| &b == bytes),
            Self::Text(t) => &**t == text,
        }
    }
}

fn lower_hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl std::fmt::Display for StoredHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sha1(bytes) => bytes.iter().try_for_each(|b| write!(f, "{b:02x}")),
            Self::Text(t) => f.write_str(t),
        }
    }
}

impl std::fmt::Debug for StoredHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl From<&str> for StoredHash {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl PartialEq<str> for StoredHash {
    fn eq(&self, text: &str) -> bool {
        self.is(text)
    }
}

impl PartialEq<&str> for StoredHash {
    fn eq(&self, text: &&str) -> bool {
        self.is(text)
    }
}

/// Hashes `key=value` entries the way Reloader does: sort the joined strings bytewise, join with `;`.
pub fn hash_entries<'a>(entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> String {
    let mut entries: Vec<(&[u8], &[u8])> = entries.into_iter().collect();
    // Comparing `k=v` as one string differs from comparing keys when one key is a prefix of another
    // (`a.b=` sorts before `a=`), so compare the joined form without building it.
    entries.sort_unstable_by(|a, b| joined(a).cmp(joined(b)));
    let mut hasher = Sha1::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            hasher.update(b";");
        }
        hasher.update(k);
        hasher.update(b"=");
        hasher.update(v);
    }
    hex(&hasher.finalize())
}

fn joined<'a>((k, v): &'a (&'a [u8], &'a [u8])) -> impl Iterator<Item = u8> + 'a {
    k.iter()
        .copied()
        .chain(std::iter::once(b'='))
        .chain(v.iter().copied())
}

/// ConfigMap: `data` entries as is, `binaryData` entries base64 (standard, padded).
pub fn configmap_hash<'a>(
    data: impl IntoIterator<Item = (&'a str, &'a str)>,
    binary_data: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> String {
    let encoded: Vec<(&str, String)> = binary_data
        .into_iter()
        .map(|(k, v)| (k, base64::engine::general_purpose::STANDARD.encode(v)))
        .collect();
    hash_entries(
        data.into_iter()
            .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
            .chain(encoded.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes()))),
    )
}

/// Secret: decoded `data` bytes only.
pub fn secret_hash<'a>(data: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    hash_entries(data.into_iter().map(|(k, v)| (k.as_bytes(), v)))
}

/// SecretProviderClassPodStatus: `id=version` per object plus `SecretProviderClassName=<class>`.
pub fn spcps_hash<'a>(
    class_name: &'a str,
    objects: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let entries: Vec<(&[u8], &[u8])> = objects
        .into_iter()
        .map(|(id, version)| (id.as_bytes(), version.as_bytes()))
        .chain(std::iter::once((
            b"SecretProviderClassName".as_slice(),
            class_name.as_bytes(),
        )))
        .collect();
    hash_entries(entries)
}

pub fn configmap_hash_typed(cm: &k8s_openapi::api::core::v1::ConfigMap) -> String {
    let empty = BTreeMap::new();
    let empty_bin = BTreeMap::new();
    configmap_hash(
        cm.data
            .as_ref()
            .unwrap_or(&empty)
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
        cm.binary_data
            .as_ref()
            .unwrap_or(&empty_bin)
            .iter()
            .map(|(k, v)| (k.as_str(), v.0.as_slice())),
    )
}

/// Hashes a Secret as stored by the apiserver: `stringData` (present only in manifests) merged over `data`.
pub fn secret_hash_typed(secret: &k8s_openapi::api::core::v1::Secret) -> String {
    let mut merged: BTreeMap<&str, &[u8]> = BTreeMap::new();
    if let Some(data) = &secret.data {
        for (k, v) in data {
            merged.insert(k, &v.0);
        }
    }
    if let Some(string_data) = &secret.string_data {
        for (k, v) in string_data {
            merged.insert(k, v.as_bytes());
        }
    }
    secret_hash(merged)
}

/// The hash of an SPCPS object given as JSON, with its SecretProviderClass name.
pub fn spcps_hash_json(obj: &Value) -> Option<(String, String)> {
    let status = obj.get("status")?;
    let class = status.get("secretProviderClassName")?.as_str()?;
    let objects: Vec<(&str, &str)> = status
        .get("objects")
        .and_then(Value::as_array)
        .map(|objs| {
            objs.iter()
                .map(|o| {
                    (
                        o.get("id").and_then(Value::as_str).unwrap_or(""),
                        o.get("version").and_then(Value::as_str).unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Some((class.to_string(), spcps_hash(class, objects)))
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_stored_hash_keeps_a_sha1_in_its_bytes_and_anything_else_as_written() {
        let h = sha1_hex(b"x");
        let stored = StoredHash::new(&h);
        assert!(matches!(stored, StoredHash::Sha1(_)));
        assert_eq!(stored.to_string(), h);
        assert!(stored.is(&h));
        assert!(
            !stored.is(&h.to_uppercase()),
            "an upper-case spelling is another marker"
        );
        assert!(!stored.is("h1"));
        for other in ["h1", "", &h.to_uppercase(), &format!("{h}0")] {
            let stored = StoredHash::new(other);
            assert!(matches!(stored, StoredHash::Text(_)), "{other}");
            assert_eq!(stored.to_string(), other);
            assert!(stored.is(other));
        }
        assert_eq!(std::mem::size_of::<StoredHash>(), 24);
    }

    use super::*;

    #[test]
    fn public_vectors() {
        assert_eq!(
            configmap_hash([("test.url", "www.stakater.com")], []),
            "3c9a892aeaedc759abc3df9884a37b8be5680382"
        );
        assert_eq!(
            configmap_hash([], []),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        assert_eq!(secret_hash([]), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(
            configmap_hash([("b", "2"), ("a", "1")], []),
            "f83e99e324ba68ccc373a58ef1eb42f8ab88646a"
        );
        assert_eq!(
            configmap_hash([("test", "test")], [("bintest", b"test".as_slice())]),
            "0d58150de76a895b24f4ca213f590766160c4349"
        );
        assert_eq!(
            secret_hash([("password", b"initial".as_slice())]),
            "c89820d4c89a3faac2e18b569de03dfe4d818f5e"
        );
        assert_eq!(
            spcps_hash("my-spc", [("parameter1", "v1")]),
            "eaf5523e4ff6005490a1bf250d6efdcf9b1b9b9c"
        );
    }

    /// docs/behaviour.md §2 states these vectors: each documented string hashes to its documented
    /// SHA-1, and the functions give those SHA-1s for the documented inputs, in the table's order.
    #[test]
    fn the_documented_vectors_hold() {
        let rows = crate::core::behaviour_doc::table("2.");
        for row in &rows {
            let string = if row[1] == "(empty)" { "" } else { &row[1] };
            assert_eq!(sha1_hex(string.as_bytes()), row[2], "row {row:?}");
        }
        let computed = [
            configmap_hash([("test.url", "www.stakater.com")], []),
            configmap_hash([], []),
            configmap_hash([("b", "2"), ("a", "1")], []),
            configmap_hash([("test", "test")], [("bintest", b"test".as_slice())]),
            secret_hash([("password", b"initial".as_slice())]),
            spcps_hash("my-spc", [("parameter1", "v1")]),
        ];
        let documented: Vec<&str> = rows.iter().map(|r| r[2].as_str()).collect();
        assert_eq!(computed.as_slice(), documented.as_slice());
    }

    #[test]
    fn hashed_string_is_the_joined_sorted_form() {
        // A key that is a prefix of another: `a.b=x` < `a=y` bytewise ('.' < '=').
        let got = configmap_hash([("a", "y"), ("a.b", "x")], []);
        assert_eq!(got, sha1_hex(b"a.b=x;a=y"));
    }

    #[test]
    fn delete_marker() {
        assert_eq!(
            delete_marker_hash(),
            sha1_hex(b"__RELOADER_EMPTY_DELETE_MARKER__")
        );
        assert_eq!(delete_marker_hash().len(), 40);
    }

    #[test]
    fn secret_string_data_wins_over_data() {
        let secret: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "s"},
                "data": {"password": "b2xk", "user": "YWRtaW4="},
                "stringData": {"password": "initial"}
            }))
            .unwrap();
        assert_eq!(
            secret_hash_typed(&secret),
            secret_hash([
                ("password", b"initial".as_slice()),
                ("user", b"admin".as_slice())
            ])
        );
    }

    #[test]
    fn spcps_json() {
        let obj = serde_json::json!({"status": {"secretProviderClassName": "my-spc",
            "objects": [{"id": "parameter1", "version": "v1"}]}});
        let (class, hash) = spcps_hash_json(&obj).unwrap();
        assert_eq!(class, "my-spc");
        assert_eq!(hash, "eaf5523e4ff6005490a1bf250d6efdcf9b1b9b9c");
    }
}
