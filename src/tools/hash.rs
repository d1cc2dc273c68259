//! `rekindle hash`: Reloader's hash of each ConfigMap, Secret or SecretProviderClassPodStatus in a file.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::{json, Value};

use crate::config::Output;
use crate::core::envname::env_var_name;
use crate::core::hash::spcps_hash_json;
use crate::core::keys::KeyDigests;
use crate::core::ResourceKind;

use super::{meta_str, read_documents};

/// A hashed configuration resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Hashed {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// The resource a workload names: for an SPCPS, its SecretProviderClass.
    pub resource_kind: ResourceKind,
    pub resource_name: String,
    pub hash: String,
    pub annotations: std::collections::BTreeMap<String, String>,
    /// A ConfigMap's or Secret's value digests (behaviour §14).
    pub digests: Option<KeyDigests>,
}

impl Hashed {
    pub fn env_var(&self) -> String {
        env_var_name(&self.resource_name, self.resource_kind)
    }
}

/// Hashes one ConfigMap, Secret or SecretProviderClassPodStatus document.
pub fn hash_document(doc: &Value) -> Result<Hashed> {
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("document has no kind"))?;
    let name = meta_str(doc, "name").ok_or_else(|| anyhow!("{kind} has no metadata.name"))?;
    let namespace = meta_str(doc, "namespace");
    let annotations = doc
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let (resource_kind, resource_name, hash, digests) = match kind {
        "ConfigMap" => {
            let cm: ConfigMap =
                serde_json::from_value(doc.clone()).with_context(|| format!("ConfigMap {name}"))?;
            let digests = KeyDigests::of_configmap(&cm);
            (
                ResourceKind::ConfigMap,
                name.clone(),
                digests.of.to_string(),
                Some(digests),
            )
        }
        "Secret" => {
            let s: Secret = serde_json::from_value(doc.clone())
                .with_context(|| format!("Secret {name}: data values must be base64"))?;
            let digests = KeyDigests::of_secret(&s);
            (
                ResourceKind::Secret,
                name.clone(),
                digests.of.to_string(),
                Some(digests),
            )
        }
        "SecretProviderClassPodStatus" => {
            let (class, hash) = spcps_hash_json(doc).ok_or_else(|| {
                anyhow!("SecretProviderClassPodStatus {name} has no status.secretProviderClassName")
            })?;
            (ResourceKind::SecretProviderClass, class, hash, None)
        }
        other => {
            bail!("{other} {name}: expected a ConfigMap, Secret or SecretProviderClassPodStatus")
        }
    };
    Ok(Hashed {
        kind: kind.to_string(),
        namespace,
        name,
        resource_kind,
        resource_name,
        hash,
        annotations,
        digests,
    })
}

pub fn run_hash(file: &Path, output: Output) -> Result<()> {
    for doc in read_documents(file)? {
        let h = hash_document(&doc)?;
        match output {
            Output::Text => println!(
                "{}/{}/{} {} {}",
                h.kind,
                h.namespace.as_deref().unwrap_or("-"),
                h.name,
                h.hash,
                h.env_var()
            ),
            Output::Json => println!(
                "{}",
                json!({"kind": h.kind, "namespace": h.namespace, "name": h.name, "hash": h.hash, "envVar": h.env_var()})
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_manifests_with_string_data() {
        let docs: Vec<Value> = serde_saphyr::from_multiple(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {password: initial}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: my.app.config, namespace: ns}\ndata: {test.url: www.stakater.com}\n",
        )
        .unwrap();
        let s = hash_document(&docs[0]).unwrap();
        assert_eq!(s.hash, "c89820d4c89a3faac2e18b569de03dfe4d818f5e");
        assert_eq!(s.env_var(), "STAKATER_S_SECRET");
        let c = hash_document(&docs[1]).unwrap();
        assert_eq!(c.hash, "3c9a892aeaedc759abc3df9884a37b8be5680382");
        assert_eq!(c.env_var(), "STAKATER_MY_APP_CONFIG_CONFIGMAP");
        assert!(hash_document(&json!({"kind": "Pod", "metadata": {"name": "p"}})).is_err());
    }
}
