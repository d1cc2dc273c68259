//! The catch-up (behaviour §10): workloads whose marker differs from the current hash of the resource it
//! is for were not reloaded for a change made while rekindle was down (or before this replica led),
//! and are queued as if the change were seen live.
//!
//! During the first sync it runs piecemeal, so that a change made while rekindle starts is not held
//! until every watch has listed: a workload is compared as soon as it is in the index and every kind
//! its markers are for has listed (and the scope is known). Whichever comes last, its workload's
//! listing or its kinds' listing, compares it; each workload is caught up at most once this way, and
//! the catch-up of all that follows the first sync leaves those alone, so a stale workload is reloaded
//! once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::core::refs::ResourceRef;
use crate::core::ResourceKind;
use crate::index::{Index, WorkloadKey};
use crate::reload::lease::Leadership;
use crate::reload::queue::Found;
use crate::reload::triggers::Triggers;

pub struct CatchUp {
    index: Arc<Index>,
    triggers: Arc<Triggers>,
    leadership: Leadership,
    state: Mutex<FirstSync>,
}

#[derive(Default)]
struct FirstSync {
    /// Kinds whose every watch has listed, with the scope known: their markers can be compared.
    listed: Vec<ResourceKind>,
    /// Workloads caught up before the catch-up of all; `None` once that has run.
    early: Option<HashSet<WorkloadKey>>,
}

impl CatchUp {
    pub fn new(index: Arc<Index>, triggers: Arc<Triggers>, leadership: Leadership) -> Arc<Self> {
        Arc::new(Self {
            index,
            triggers,
            leadership,
            state: Mutex::new(FirstSync {
                listed: Vec::new(),
                early: Some(HashSet::new()),
            }),
        })
    }

    /// The first sync has listed these kinds: catches up the indexed workloads whose markers are all
    /// of them (those still to be listed are compared as they come, by [`CatchUp::workload_listed`]).
    pub fn kinds_listed(&self, kinds: &[ResourceKind]) {
        let mut state = self.lock();
        if state.listed.as_slice() == kinds {
            return;
        }
        state.listed = kinds.to_vec();
        if !self.leadership.is_leader() {
            return;
        }
        let stale = self.index.stale_markers(kinds);
        let queued = self.push_stale(stale, state.early.as_ref());
        if let Some(early) = &mut state.early {
            early.extend(queued);
        }
    }

    /// A workload arrived in the first list of its watch (it is in the index): compared now if every
    /// kind its markers are for has listed.
    pub fn workload_listed(&self, key: &WorkloadKey) {
        let mut state = self.lock();
        if state.listed.is_empty()
            || !self.leadership.is_leader()
            || state.early.as_ref().is_some_and(|e| e.contains(key))
        {
            return;
        }
        let stale: Vec<_> = self
            .index
            .stale_markers_of(key, &state.listed)
            .into_iter()
            .map(|r| (key.clone(), r))
            .collect();
        let queued = self.push_stale(stale, None);
        if let Some(early) = &mut state.early {
            early.extend(queued);
        }
    }

    /// The catch-up of all kinds, less what was caught up during the first sync (the first call only);
    /// after it, every kind counts as listed. Does nothing on a replica that does not lead; true if
    /// it compared.
    pub fn all(&self) -> bool {
        let mut state = self.lock();
        state.listed = ResourceKind::ALL.to_vec();
        let early = state.early.take().unwrap_or_default();
        if !self.leadership.is_leader() {
            return false;
        }
        let stale = self.index.stale_markers(&ResourceKind::ALL);
        self.push_stale(stale, Some(&early));
        true
    }

    /// Queues the stale (workload, resource) pairs, less `skip`; returns the workloads queued.
    fn push_stale(
        &self,
        stale: Vec<(WorkloadKey, ResourceRef)>,
        skip: Option<&HashSet<WorkloadKey>>,
    ) -> Vec<WorkloadKey> {
        let now = Instant::now();
        let mut queued: Vec<(WorkloadKey, ResourceRef)> = Vec::new();
        for (key, r) in stale {
            if !skip.is_some_and(|s| s.contains(&key))
                && self
                    .triggers
                    .push(std::slice::from_ref(&key), &r, now, Found::Compared)
                    > 0
            {
                queued.push((key, r));
            }
        }
        match queued.as_slice() {
            [] => {}
            [(key, r)] => {
                tracing::info!(workload = %key, resource = %r.name, "marker differs from the current hash; reloading")
            }
            many => tracing::info!(
                count = many.len(),
                "markers differ from current hashes; reloading"
            ),
        }
        let mut workloads: Vec<WorkloadKey> = queued.into_iter().map(|(key, _)| key).collect();
        workloads.dedup();
        workloads
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FirstSync> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
