//! Reading a ConfigMap's or Secret's value digests from the API, for a workload that reads it key by
//! key when the index has not kept them (behaviour §14): the webhook stamping such a workload and the
//! writer planning its reload each read the object once, and the index keeps what they read;
//! `rekindle why` reads every resource this way.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};

use crate::core::keys::KeyDigests;
use crate::core::ResourceKind;
use crate::index::ResourceKey;

/// A ConfigMap or Secret as read: its value digests (with its hash) and its annotations.
pub struct Read {
    pub digests: KeyDigests,
    pub annotations: BTreeMap<String, String>,
}

/// The object as it is now; `None` when it does not exist (or is not a ConfigMap or Secret).
pub async fn read(client: &Client, key: &ResourceKey) -> Result<Option<Read>, kube::Error> {
    Ok(match key.kind {
        ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), &key.namespace)
            .get_opt(&key.name)
            .await?
            .map(|cm| Read {
                digests: KeyDigests::of_configmap(&cm),
                annotations: cm.metadata.annotations.unwrap_or_default(),
            }),
        ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), &key.namespace)
            .get_opt(&key.name)
            .await?
            .map(|s| Read {
                digests: KeyDigests::of_secret(&s),
                annotations: s.metadata.annotations.unwrap_or_default(),
            }),
        ResourceKind::SecretProviderClass => None,
    })
}
