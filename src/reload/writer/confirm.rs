//! Whether a marker may be replaced with the index's hash as it stands.
//!
//! A change a watch event brought while this replica led is taken on trust: the index holds at least
//! what the event brought (1 PATCH, no read, per change). A change found by comparing a workload's
//! marker with the index is not: the marker may have been written by a replica, or stamped by a
//! webhook, whose view was newer than this replica's watches (a replica that takes the Lease just
//! after a partition heals sees the workloads before the ConfigMaps that changed meanwhile). Writing
//! the index's hash then would roll the workload back, and forward again when the watch catches up.
//! So the resource is read first, and the marker replaced only if the index is current; otherwise the
//! change is left to the watch, whose event brings it. A confirmation is reused for a few seconds
//! while the index still holds the hash confirmed, so that a catch-up of many workloads sharing one
//! ConfigMap reads it once, not once per workload.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Writer;
use crate::core::refs::ResourceRef;
use crate::core::ResourceKind;
use crate::index::ResourceKey;
use crate::metrics::{Confirmation, ErrorKind};
use crate::reload::error::WriteError;
use crate::reload::queue::Pending;
use crate::watch::digests;

/// How long a confirmed hash is reused while the index still holds it.
const CONFIRMED_FOR: Duration = Duration::from_secs(5);
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
    /// of it arrived while this replica led.
    pub(super) fn trusted(&self, r: &ResourceRef, pending: &Pending) -> bool {
        let since = self.leading_since();
        pending
            .events
            .get(r)
            .is_some_and(|seen| since.is_none_or(|since| *seen >= since))
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
        let read = digests::read(&self.client, rk).await.map_err(|e| {
            self.metrics.error(ErrorKind::ResourceRead);
            WriteError::from_kube("GET", e)
        })?;
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
