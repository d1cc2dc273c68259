//! A workload as its watch delivers it, decoded straight into the JSON the index reads.
//!
//! kube's `DynamicObject` decodes through a flattened map (every field buffered, then decoded again)
//! and the handler turned it back into JSON: three passes over objects whose `managedFields` are about
//! half their bytes and are never read. Here one pass builds the JSON, `managedFields` skipped
//! without being built, and the metadata the watcher needs is typed from it.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ApiResource, DynamicResourceScope};
use kube::Resource;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

/// The field of the metadata nothing reads, left undecoded.
const SKIPPED: &str = "managedFields";

#[derive(Clone, Debug)]
pub struct WorkloadObject {
    pub metadata: ObjectMeta,
    /// The whole object (its metadata without `managedFields`).
    pub object: Value,
}

impl WorkloadObject {
    /// The object already decoded (from protobuf), its metadata typed from it.
    pub fn from_value(object: Value) -> Result<Self, serde_json::Error> {
        let metadata = match object.get("metadata") {
            Some(meta) => ObjectMeta::deserialize(meta)?,
            None => ObjectMeta::default(),
        };
        Ok(Self { metadata, object })
    }
}

impl<'de> Deserialize<'de> for WorkloadObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let object = d.deserialize_map(ObjectVisitor)?;
        Self::from_value(object).map_err(de::Error::custom)
    }
}

/// The top-level object: every field as JSON, the metadata through [`MetadataSeed`].
struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = if key == "metadata" {
                map.next_value_seed(MetadataSeed)?
            } else {
                map.next_value::<Value>()?
            };
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// The metadata as JSON, without [`SKIPPED`].
struct MetadataSeed;

impl<'de> DeserializeSeed<'de> for MetadataSeed {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("object metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == SKIPPED {
                map.next_value::<IgnoredAny>()?;
            } else {
                out.insert(key, map.next_value()?);
            }
        }
        Ok(Value::Object(out))
    }
}

impl Resource for WorkloadObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The same object as `DynamicObject` serialised back, less `managedFields`.
    #[test]
    fn decodes_the_object_as_json_without_managed_fields() {
        let text = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "uid": "u", "resourceVersion": "12",
                "generation": 3, "creationTimestamp": "2026-01-02T03:04:05Z",
                "annotations": {"reloader.stakater.com/auto": "true"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:replicas": {}}},
                    "time": "2026-01-02T03:04:05Z"}]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "a"}]}}},
            "status": {"observedGeneration": 3}
        })
        .to_string();
        let w: WorkloadObject = serde_json::from_str(&text).unwrap();
        let mut dynamic: Value =
            serde_json::to_value(serde_json::from_str::<kube::api::DynamicObject>(&text).unwrap())
                .unwrap();
        dynamic["metadata"].as_object_mut().unwrap().remove(SKIPPED);
        assert_eq!(w.object, dynamic);
        assert_eq!(w.metadata.name.as_deref(), Some("web"));
        assert_eq!(w.metadata.generation, Some(3));
        assert_eq!(w.metadata.resource_version.as_deref(), Some("12"));
        assert!(w.metadata.managed_fields.is_none());
        assert!(serde_json::from_str::<WorkloadObject>("[1]").is_err());
    }
}
