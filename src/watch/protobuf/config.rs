//! ConfigMaps and Secrets in protobuf: identity, annotations, write times and data, as the
//! k8s-openapi objects the handler hashes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};
use k8s_openapi::ByteString;
use prost::Message;

use super::{Decode, TimePb};

/// The k8s-openapi kinds watched in protobuf, and their message.
pub trait Protobuf: Sized {
    type Message: Decode<Object = Self>;
}

impl Protobuf for Secret {
    type Message = SecretPb;
}

impl Protobuf for ConfigMap {
    type Message = ConfigMapPb;
}

#[derive(Clone, PartialEq, Message)]
pub struct SecretPb {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMetaPb>,
    #[prost(btree_map = "string, bytes", tag = "2")]
    data: BTreeMap<String, Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    r#type: Option<String>,
    #[prost(btree_map = "string, string", tag = "4")]
    string_data: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ConfigMapPb {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMetaPb>,
    #[prost(btree_map = "string, string", tag = "2")]
    data: BTreeMap<String, String>,
    #[prost(btree_map = "string, bytes", tag = "3")]
    binary_data: BTreeMap<String, Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct ObjectMetaPb {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "3")]
    namespace: String,
    #[prost(string, tag = "6")]
    resource_version: String,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "17")]
    managed_fields: Vec<ManagedFieldsEntryPb>,
}

#[derive(Clone, PartialEq, Message)]
struct ManagedFieldsEntryPb {
    #[prost(message, optional, tag = "4")]
    time: Option<TimePb>,
}

static NONE: BTreeMap<String, String> = BTreeMap::new();

fn bookmark(meta: Option<&ObjectMetaPb>) -> (&str, &BTreeMap<String, String>) {
    meta.map_or(("", &NONE), |m| {
        (m.resource_version.as_str(), &m.annotations)
    })
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn non_empty_map<V>(m: BTreeMap<String, V>) -> Option<BTreeMap<String, V>> {
    (!m.is_empty()).then_some(m)
}

/// The metadata the handler reads: identity, annotations and write times.
fn object_meta(meta: Option<ObjectMetaPb>) -> ObjectMeta {
    let meta = meta.unwrap_or_default();
    let managed_fields = meta
        .managed_fields
        .into_iter()
        .map(|f| ManagedFieldsEntry {
            time: f
                .time
                .and_then(|t| jiff::Timestamp::from_second(t.seconds).ok())
                .map(Time),
            ..Default::default()
        })
        .collect::<Vec<_>>();
    ObjectMeta {
        name: non_empty(meta.name),
        namespace: non_empty(meta.namespace),
        resource_version: non_empty(meta.resource_version),
        annotations: non_empty_map(meta.annotations),
        managed_fields: (!managed_fields.is_empty()).then_some(managed_fields),
        ..Default::default()
    }
}

impl Decode for SecretPb {
    const KIND: &'static str = "Secret";
    type Object = Secret;

    fn bookmark(&self) -> (&str, &BTreeMap<String, String>) {
        bookmark(self.metadata.as_ref())
    }

    fn into_object(self) -> Result<Secret, String> {
        Ok(Secret {
            metadata: object_meta(self.metadata),
            data: Some(
                self.data
                    .into_iter()
                    .map(|(k, v)| (k, ByteString(v)))
                    .collect(),
            ),
            string_data: non_empty_map(self.string_data),
            type_: self.r#type,
            ..Default::default()
        })
    }
}

impl Decode for ConfigMapPb {
    const KIND: &'static str = "ConfigMap";
    type Object = ConfigMap;

    fn bookmark(&self) -> (&str, &BTreeMap<String, String>) {
        bookmark(self.metadata.as_ref())
    }

    fn into_object(self) -> Result<ConfigMap, String> {
        Ok(ConfigMap {
            metadata: object_meta(self.metadata),
            data: non_empty_map(self.data),
            binary_data: non_empty_map(
                self.binary_data
                    .into_iter()
                    .map(|(k, v)| (k, ByteString(v)))
                    .collect(),
            ),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::keys::KeyDigests;
    use crate::watch::handlers::ConfigData;

    // Captured from kube-apiserver 1.35 by testdata/capture.py: the ConfigMaps of
    // testdata/objects.json (text, binaryData, empty) and the namespace's kube-root-ca.crt, as a protobuf watch's first state and as the
    // JSON list.
    const PB: &[u8] = include_bytes!("testdata/configmaps.pb");
    const JSON: &str = include_str!("testdata/configmaps.json");

    fn newest_write(meta: &ObjectMeta) -> Option<i64> {
        meta.managed_fields
            .iter()
            .flatten()
            .filter_map(|f| f.time.as_ref())
            .map(|t| t.0.as_second())
            .max()
    }

    /// The hash, the value digests, the annotations and the write time are the same from either
    /// encoding.
    #[test]
    fn a_configmap_is_the_same_in_both_encodings() {
        let decoded = super::super::first_state::<ConfigMapPb>(PB);
        let listed: serde_json::Value = serde_json::from_str(JSON).unwrap();
        let listed: Vec<ConfigMap> = serde_json::from_value(listed["items"].clone()).unwrap();
        assert_eq!(decoded.len(), 4);
        assert_eq!(listed.len(), decoded.len());
        let mut hashes = std::collections::BTreeSet::new();
        // An object created without fields ("empty") has no managedFields.
        let mut written = 0;
        for pb in decoded {
            let json = listed
                .iter()
                .find(|j| j.metadata.name == pb.metadata.name)
                .expect("the same ConfigMap in JSON");
            let name = pb.metadata.name.clone().unwrap_or_default();
            assert_eq!(pb.hash(), json.hash(), "{name}");
            let (a, b): (KeyDigests, KeyDigests) = (pb.digests(), json.digests());
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{name}");
            assert_eq!(pb.metadata.annotations, json.metadata.annotations, "{name}");
            assert_eq!(pb.metadata.namespace, json.metadata.namespace);
            assert_eq!(pb.metadata.resource_version, json.metadata.resource_version);
            assert_eq!(newest_write(&pb.metadata), newest_write(&json.metadata));
            written += usize::from(newest_write(&pb.metadata).is_some());
            hashes.insert(pb.hash());
        }
        assert_eq!(hashes.len(), 4, "four different ConfigMaps");
        assert_eq!(written, 3);
    }
}
