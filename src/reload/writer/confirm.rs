//! Whether a marker may be replaced with the index's hash as it stands.
//!
//! A marker may have been written by another replica, or stamped by a webhook, from a newer view than
//! this replica's watches hold: a replica that takes the Lease just after a partition heals sees the
//! workloads before the ConfigMaps that changed meanwhile, and its watch may still deliver changes the
//! last leader already wrote. Writing the index's hash then would roll the workload back, and forward
//! again when the watch catches up.
//!
//! So a change is taken on trust only when a watch event brought it with a resourceVersion newer
//! than the resource's horizon: the collection's resourceVersion read (a LIST of one item) when this
//! replica began to lead. Nothing another leader wrote can be newer than that, so such a change is
//! written with no read: 1 PATCH per change. Any other change (found by comparing a marker with
//! the index, or an event from before the horizon) is confirmed first: the resource is read, and the
//! marker replaced only if the index holds what was read; otherwise the change is left to the watch,
//! whose event brings it. A confirmation is reused for a few seconds while the index still holds the
//! hash confirmed, so that a catch-up of many workloads sharing one ConfigMap reads it once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ListParams;
use kube::Api;

use super::Writer;
use crate::core::refs::{self, ResourceRef};
use crate::core::ResourceKind;
use crate::index::{ResourceKey, WorkloadKey};
use crate::metrics::{Confirmation, ErrorKind};
use crate::reload::error::WriteError;
use crate::reload::queue::Pending;
use crate::watch::digests;

/// How long a confirmed hash is reused while the index still holds it.
const CONFIRMED_FOR: Duration = Duration::from_secs(5);
/// How long a read of a resource, or of its kind's resourceVersion, may take: the writer's other
/// reloads wait for the horizon's.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Size of the cache at which expired confirmations are dropped.
const CONFIRMED_PRUNE_AT: usize = 1024;

/// A resource as read: its hash (`None`: gone), and when.
struct Read {
    hash: Option<Box<str>>,
    at: Instant,
}

/// Resources read lately, to confirm the index's view of them.
#[derive(Default)]
pub(super) struct Confirmed(Mutex<HashMap<ResourceKey, Read>>);

impl Confirmed {
    /// Whether `rk` was read as `hash` in the last [`CONFIRMED_FOR`], and not before `since`.
    fn lately(&self, rk: &ResourceKey, hash: Option<&str>, since: Option<Instant>) -> bool {
        let cache = self.0.lock().unwrap_or_else(|e| e.into_inner());
        cache.get(rk).is_some_and(|read| {
            read.hash.as_deref() == hash
                && read.at.elapsed() < CONFIRMED_FOR
                && since.is_none_or(|since| read.at >= since)
        })
    }

    fn record(&self, rk: &ResourceKey, hash: Option<Box<str>>) {
        let mut cache = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CONFIRMED_PRUNE_AT {
            cache.retain(|_, read| read.at.elapsed() < CONFIRMED_FOR);
        }
        let at = Instant::now();
        cache.insert(rk.clone(), Read { hash, at });
    }
}

impl Writer {
    /// Whether `r`'s change may be written from the index without reading the resource: a watch event
    /// brought it, newer than the horizon of its kind.
    pub(super) async fn trusted(
        &self,
        key: &WorkloadKey,
        r: &ResourceRef,
        pending: &Pending,
    ) -> bool {
        let Some(version) = pending.events.get(r) else {
            return false;
        };
        self.horizon(&key.namespace, r.kind)
            .await
            .is_some_and(|horizon| *version > horizon)
    }

    /// The resourceVersion of `kind`'s collection when this replica began to lead, read in
    /// `namespace` (where this replica watches it) the first time it is needed. `None` if it cannot
    /// be read (the changes are then confirmed, and it is read again next time) or is not a number
    /// (recorded: every change of that kind is confirmed for this leadership, with no more lists).
    async fn horizon(&self, namespace: &str, kind: ResourceKind) -> Option<u64> {
        let mut horizons = self.horizons.lock().await;
        if let Some(horizon) = horizons.get(&kind) {
            return *horizon;
        }
        let params = ListParams::default().limit(1);
        let client = self.client.clone();
        let list = async {
            match kind {
                ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client, namespace)
                    .list_metadata(&params)
                    .await
                    .map(|l| l.metadata.resource_version),
                ResourceKind::Secret => Api::<Secret>::namespaced(client, namespace)
                    .list_metadata(&params)
                    .await
                    .map(|l| l.metadata.resource_version),
                ResourceKind::SecretProviderClass => Ok(None),
            }
        };
        let error = match tokio::time::timeout(READ_TIMEOUT, list).await {
            Ok(Ok(version)) => {
                let horizon = version.as_deref().and_then(refs::resource_version);
                if horizon.is_none() {
                    tracing::warn!(?kind, ?version, "the apiserver's resourceVersions do not compare as numbers; every change of this kind is confirmed by a read");
                }
                horizons.insert(kind, horizon);
                return horizon;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        self.metrics.error(ErrorKind::ResourceRead);
        tracing::warn!(?kind, %error, "could not read the resourceVersion changes are trusted after; confirming them by reads");
        None
    }

    /// This replica begins to lead: every horizon is read again.
    pub(super) async fn forget_horizons(&self) {
        self.horizons.lock().await.clear();
    }

    /// Whether the resource is as the index holds it: `hash`, or gone when `None`. Read from the
    /// API, unless confirmed moments ago. SecretProviderClasses are not read (their hash is that of
    /// their pods' status objects, which only a list would give) and count as confirmed.
    pub(super) async fn confirm(
        &self,
        rk: &ResourceKey,
        hash: Option<&str>,
    ) -> Result<bool, WriteError> {
        if rk.kind == ResourceKind::SecretProviderClass
            || self.confirmed.lately(rk, hash, self.leading_since())
        {
            return Ok(true);
        }
        let read =
            match tokio::time::timeout(READ_TIMEOUT, digests::read(&self.client, rk)).await {
                Ok(read) => read.map_err(|e| WriteError::from_kube("GET", e)),
                Err(_) => Err(WriteError::Transient("GET timed out".into())),
            }
            .inspect_err(|_| self.metrics.error(ErrorKind::ResourceRead))?;
        let current = read.map(|r| r.digests.of);
        let confirmed = current.as_deref() == hash;
        if confirmed {
            self.metrics.confirmation(Confirmation::Current);
            self.confirmed.record(rk, current);
        } else {
            self.metrics.confirmation(Confirmation::Behind);
            tracing::info!(resource = %rk.name, namespace = %rk.namespace, kind = ?rk.kind,
                "this replica's watch has not caught up with the resource; its change is left to the watch");
        }
        Ok(confirmed)
    }

    fn leading_since(&self) -> Option<Instant> {
        *self.leading_since.lock().unwrap_or_else(|e| e.into_inner())
    }
}
