//! Reading a ConfigMap's or Secret's value digests from the API, for a workload that reads it key by
//! key when the index has not kept them (behaviour §14): the webhook stamping such a workload and the
//! writer planning its reload each read the object once, and the index keeps what they read.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};

use crate::core::keys::KeyDigests;
use crate::core::ResourceKind;
use crate::index::ResourceKey;

/// The digests of the object as it is now; `None` when it does not exist (or has no keys to read).
pub async fn read(client: &Client, key: &ResourceKey) -> Result<Option<KeyDigests>, kube::Error> {
    Ok(match key.kind {
        ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), &key.namespace)
            .get_opt(&key.name)
            .await?
            .map(|cm| KeyDigests::of_configmap(&cm)),
        ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), &key.namespace)
            .get_opt(&key.name)
            .await?
            .map(|s| KeyDigests::of_secret(&s)),
        ResourceKind::SecretProviderClass => None,
    })
}
