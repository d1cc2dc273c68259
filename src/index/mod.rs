//! The in-memory index: which workloads use which resources, and each resource's current hash.
//!
//! Plain data behind ONE lock; nothing here touches the network, so tests drive it directly.
//! "Read hashes + record workload" (admission) and "update hash + find dependents" (watch) are each one
//! critical section, so no change can fall between them. Secret data is never kept: hashes only.
//!
//! By concern: each resource's hash (here), each workload's record ([`workload`]), the reverse edges
//! from resources to the workloads they may concern ([`dependents`]), and the recent changes that
//! unmarked workloads are checked against ([`changes`]).

mod changes;
mod dependents;
mod workload;

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use changes::ChangeLog;
pub use changes::RECENT_CHANGES_KEPT;
use dependents::Dependents;
pub use workload::{Uid, WorkloadEntry};

use crate::core::hash::StoredHash;
use crate::core::keys::{self, KeyDigests};
use crate::core::policy::ResourceFlags;
use crate::core::refs::{Name, ResourceRef};
use crate::core::release::Release;
use crate::core::{ResourceKind, WorkloadKind};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub kind: WorkloadKind,
    pub namespace: Name,
    pub name: Name,
}

impl std::fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub kind: ResourceKind,
    pub namespace: Name,
    pub name: Name,
}

impl ResourceKey {
    pub fn new(kind: ResourceKind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// What the index keeps of a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceEntry {
    pub hash: StoredHash,
    pub flags: ResourceFlags,
}

#[derive(Debug, Default)]
struct State {
    resources: HashMap<ResourceKey, ResourceEntry>,
    workloads: HashMap<WorkloadKey, WorkloadEntry>,
    /// Admission records not yet confirmed by the watch, with when they were recorded.
    provisional: HashMap<WorkloadKey, (WorkloadEntry, Instant)>,
    /// Of confirmed and provisional records alike.
    dependents: Dependents,
    changes: ChangeLog,
    /// CSI: the ignore/match annotations of SecretProviderClasses (whose hashes come from their pod
    /// statuses, which carry no annotations).
    class_flags: HashMap<ResourceKey, ResourceFlags>,
    /// Namespaces' `rekindle.io/reload-window` annotations (of those that have one): the default
    /// window of their workloads.
    namespace_windows: HashMap<String, Box<str>>,
    /// Confirmed workloads that are canaries or carry a halt: the few a reload's release order
    /// looks at.
    marked: HashSet<WorkloadKey>,
    /// The value digests of the resources some workload reads key by key (behaviour §14), and of no
    /// others.
    key_digests: HashMap<ResourceKey, KeyDigests>,
}

impl State {
    fn mark(&mut self, key: &WorkloadKey, entry: &WorkloadEntry) {
        if entry.release.marked() {
            self.marked.insert(key.clone());
        } else {
            self.marked.remove(key);
        }
    }

    /// The references whose marker on the workload differs from what the resource's current hash
    /// owes it. A marker of some keys only counts as stale when the resource's digests say so, or when
    /// they are missing (the writer reads the resource and finds out).
    fn stale_refs<'a>(
        &'a self,
        key: &'a WorkloadKey,
        entry: &'a WorkloadEntry,
    ) -> impl Iterator<Item = &'a ResourceRef> + 'a {
        entry.markers().filter_map(move |(r, marker)| {
            let rk = ResourceKey::new(r.kind, &key.namespace, &r.name);
            let res = self.resources.get(&rk)?;
            if res.hash == *marker {
                return None;
            }
            let owed = entry.keys_read(key.kind, r).and_then(|read| {
                keys::owed(
                    Some(&read),
                    &res.hash.to_string(),
                    self.key_digests.get(&rk),
                )
            });
            match owed {
                Some(owed) if marker.is(&owed.write) => None,
                _ => Some(r),
            }
        })
    }

    /// Whether a workload reads `key` key by key: then its digests are kept.
    fn wants_keys(&self, key: &ResourceKey) -> bool {
        let reads = |e: &WorkloadEntry| e.reads_keys;
        self.dependents.named(key).any(|w| {
            self.workloads.get(w).is_some_and(reads)
                || self.provisional.get(w).is_some_and(|(e, _)| reads(e))
        })
    }

    /// Removes the edges of `old` that neither the confirmed nor the provisional record still needs.
    fn unlink(&mut self, key: &WorkloadKey, old: &WorkloadEntry) {
        let confirmed = self.workloads.get(key);
        let provisional = self.provisional.get(key).map(|(e, _)| e);
        let records = || confirmed.into_iter().chain(provisional);
        let patterns_still = records().any(|e| e.has_patterns);
        self.dependents.unlink(
            key,
            old,
            |r| records().any(|e| e.references(r)),
            patterns_still,
        );
    }

    /// The workloads a change of `key` may concern.
    fn dependents(&self, key: &ResourceKey) -> Vec<WorkloadKey> {
        let concerned = |e: &WorkloadEntry| e.may_depend_on(key.kind, &key.name);
        self.dependents
            .candidates(key)
            .into_iter()
            .filter(|w| {
                self.workloads.get(w).is_some_and(concerned)
                    || self.provisional.get(w).is_some_and(|(e, _)| concerned(e))
            })
            .collect()
    }
}

/// When the apiserver wrote a change being recorded, for [`Index::update_resource_written`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Unix seconds.
    pub at: i64,
    /// A new resource counts as a change (`--reload-on-create`).
    pub creations: bool,
}

/// The result of recording a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceUpdate {
    pub previous: Option<ResourceEntry>,
    /// Workloads that may depend on the resource (empty when the hash did not change).
    pub dependents: Vec<WorkloadKey>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexSizes {
    pub resources: usize,
    /// Resources whose value digests are kept.
    pub key_digests: usize,
    pub workloads: usize,
    pub provisional: usize,
    pub reverse_edges: usize,
}

/// The parts a pass over every workload takes the lock for one at a time: at 100,000 workloads a
/// whole pass held it for 121 ms (docs/scaling.md), a part for about a sixteenth of that.
const PASS_CHUNKS: u8 = 16;

#[derive(Debug, Default)]
pub struct Index {
    state: RwLock<State>,
}

impl Index {
    pub fn new() -> Self {
        Self::default()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that matters more
        // than stopping the process would, so keep serving.
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Admission: records the workload provisionally (unless `record` is false: dry-run, generateName)
    /// and returns the current entries of the resources it references, in one critical section.
    pub fn admit(
        &self,
        key: &WorkloadKey,
        entry: &WorkloadEntry,
        record: bool,
    ) -> HashMap<ResourceRef, ResourceEntry> {
        let mut state = self.write();
        let hashes = entry
            .refs
            .iter()
            .filter_map(|r| {
                state
                    .resources
                    .get(&ResourceKey::new(r.kind, &key.namespace, &r.name))
                    .map(|e| (r.clone(), e.clone()))
            })
            .collect();
        if record {
            let old = state
                .provisional
                .insert(key.clone(), (entry.clone(), Instant::now()));
            state.dependents.link(key, entry);
            if let Some((old, _)) = old {
                state.unlink(key, &old);
            }
        }
        hashes
    }

    /// The watch saw the workload: the authoritative record. True when the index had not confirmed it
    /// before.
    pub fn apply_workload(&self, key: WorkloadKey, entry: WorkloadEntry) -> bool {
        let mut state = self.write();
        if state
            .workloads
            .get(&key)
            .is_some_and(|current| entry.older_than(current))
        {
            // The writer's PATCH response got here before the watch delivered this older state.
            return false;
        }
        let provisional = state.provisional.remove(&key).map(|(e, _)| e);
        state.mark(&key, &entry);
        let old = state.workloads.insert(key.clone(), entry.clone());
        state.dependents.link(&key, &entry);
        for old in old.iter().chain(provisional.iter()) {
            state.unlink(&key, old);
        }
        old.is_none()
    }

    /// The writer's PATCH response: replaces the confirmed record (unless the watch already delivered
    /// something newer), so the next reload plans from what was written. A workload the watch has not
    /// confirmed yet is left to the watch, which also checks what a new workload missed.
    pub fn record_written(&self, key: &WorkloadKey, entry: WorkloadEntry) {
        let mut state = self.write();
        let Some(current) = state.workloads.get(key) else {
            return;
        };
        if entry.older_than(current) {
            return;
        }
        state.mark(key, &entry);
        let old = state.workloads.insert(key.clone(), entry.clone());
        state.dependents.link(key, &entry);
        if let Some(old) = old {
            state.unlink(key, &old);
        }
    }

    pub fn delete_workload(&self, key: &WorkloadKey) {
        let mut state = self.write();
        state.marked.remove(key);
        let old = state.workloads.remove(key);
        let provisional = state.provisional.remove(key).map(|(e, _)| e);
        for old in old.iter().chain(provisional.iter()) {
            state.unlink(key, old);
        }
    }

    /// Drops admission records the watch has not confirmed within `max_age` (a later webhook may have
    /// rejected the object). Returns how many were dropped.
    pub fn expire_provisional(&self, max_age: Duration) -> usize {
        let mut state = self.write();
        let now = Instant::now();
        let expired: Vec<WorkloadKey> = state
            .provisional
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) > max_age)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &expired {
            if let Some((old, _)) = state.provisional.remove(key) {
                state.unlink(key, &old);
            }
        }
        expired.len()
    }

    /// Whether the value digests of `key` are wanted (a workload reads it key by key): the watch
    /// computes them for [`Index::update_resource`] only then.
    pub fn wants_keys(&self, key: &ResourceKey) -> bool {
        self.read().wants_keys(key)
    }

    /// Records a resource's hash, and its value digests when they are wanted; when it changed (or is
    /// new), returns the workloads that may depend on it.
    pub fn update_resource(
        &self,
        key: &ResourceKey,
        entry: ResourceEntry,
        digests: Option<KeyDigests>,
    ) -> ResourceUpdate {
        self.update_resource_written(key, entry, digests, None)
    }

    /// [`Index::update_resource`] for a change the apiserver wrote at `written`'s time (Unix
    /// seconds): a changed hash is also remembered as a recent change ([`Index::missed_changes_of`]),
    /// in the same lock section, so no workload can be confirmed between the two and miss it. A new
    /// resource is remembered only when `written` says creations count.
    pub fn update_resource_written(
        &self,
        key: &ResourceKey,
        entry: ResourceEntry,
        digests: Option<KeyDigests>,
        written: Option<Written>,
    ) -> ResourceUpdate {
        let mut state = self.write();
        match digests.filter(|_| state.wants_keys(key)) {
            Some(d) => state.key_digests.insert(key.clone(), d),
            None => state.key_digests.remove(key),
        };
        let previous = state.resources.insert(key.clone(), entry.clone());
        let changed = previous.as_ref().is_none_or(|p| p.hash != entry.hash);
        if let Some(w) = written.filter(|w| changed && (previous.is_some() || w.creations)) {
            state.changes.record(key, w.at, Instant::now());
        }
        let dependents = if changed {
            state.dependents(key)
        } else {
            Vec::new()
        };
        ResourceUpdate {
            previous,
            dependents,
        }
    }

    pub fn remove_resource(&self, key: &ResourceKey) -> ResourceUpdate {
        let mut state = self.write();
        state.key_digests.remove(key);
        let previous = state.resources.remove(key);
        let dependents = if previous.is_some() {
            state.dependents(key)
        } else {
            Vec::new()
        };
        ResourceUpdate {
            previous,
            dependents,
        }
    }

    pub fn resource(&self, key: &ResourceKey) -> Option<ResourceEntry> {
        self.read().resources.get(key).cloned()
    }

    /// The resource's value digests, when they are of its current content.
    pub fn key_digests(&self, key: &ResourceKey) -> Option<KeyDigests> {
        let state = self.read();
        let current = state.resources.get(key)?;
        state
            .key_digests
            .get(key)
            .filter(|d| current.hash.is(&d.of))
            .cloned()
    }

    /// Keeps digests read from the API (by the webhook or the writer) when they are of the content
    /// the index has and a workload reads the resource key by key; the watch keeps them current
    /// from then on.
    pub fn fill_keys(&self, key: &ResourceKey, digests: KeyDigests) {
        let mut state = self.write();
        let current = state
            .resources
            .get(key)
            .is_some_and(|e| e.hash.is(&digests.of));
        if current && state.wants_keys(key) {
            state.key_digests.insert(key.clone(), digests);
        }
    }

    /// Keys of the resources of one kind, optionally in one namespace (for re-list bookkeeping).
    /// CSI: a SecretProviderClass's ignore/match annotations.
    pub fn set_class_flags(&self, key: ResourceKey, flags: ResourceFlags) {
        self.write().class_flags.insert(key, flags);
    }

    pub fn remove_class_flags(&self, key: &ResourceKey) {
        self.write().class_flags.remove(key);
    }

    pub fn class_flags(&self, key: &ResourceKey) -> ResourceFlags {
        self.read()
            .class_flags
            .get(key)
            .copied()
            .unwrap_or_default()
    }

    /// A namespace's reload window annotation, as written (`None`: it has none).
    pub fn set_namespace_window(&self, namespace: &str, window: Option<&str>) {
        let mut state = self.write();
        match window {
            Some(w) => {
                state
                    .namespace_windows
                    .insert(namespace.to_string(), w.into());
            }
            None => {
                state.namespace_windows.remove(namespace);
            }
        }
    }

    pub fn namespace_window(&self, namespace: &str) -> Option<String> {
        self.read()
            .namespace_windows
            .get(namespace)
            .map(|w| w.to_string())
    }

    pub fn class_flag_keys(&self, namespace: Option<&str>) -> Vec<ResourceKey> {
        self.read()
            .class_flags
            .keys()
            .filter(|k| namespace.is_none_or(|ns| k.namespace == ns))
            .cloned()
            .collect()
    }

    pub fn resource_keys(&self, kind: ResourceKind, namespace: Option<&str>) -> Vec<ResourceKey> {
        self.read()
            .resources
            .keys()
            .filter(|k| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
            .cloned()
            .collect()
    }

    pub fn workload_keys(&self, kind: WorkloadKind, namespace: Option<&str>) -> Vec<WorkloadKey> {
        self.read()
            .workloads
            .keys()
            .filter(|k| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
            .cloned()
            .collect()
    }

    /// Whether one resource is all that can trigger this workload (one reference, no reload patterns):
    /// then there is nothing for a debounce to coalesce with.
    pub fn has_one_trigger(&self, key: &WorkloadKey) -> bool {
        let state = self.read();
        let one = |e: &WorkloadEntry| e.refs.len() <= 1 && !e.has_patterns;
        state.workloads.get(key).is_some_and(one)
            && state.provisional.get(key).is_none_or(|(e, _)| one(e))
    }

    /// The confirmed workload's skeleton and the resourceVersion it was taken at, to plan a reload
    /// from (and guard its write with) without reading the object.
    pub fn skeleton(&self, key: &WorkloadKey) -> Option<(Value, Option<u64>)> {
        // Copied out first: parsing under the lock would hold up admission's writes.
        let (text, rv) = {
            let state = self.read();
            let entry = state.workloads.get(key)?;
            (entry.skeleton.clone()?, entry.resource_version)
        };
        Some((serde_json::from_str(&text).ok()?, rv))
    }

    pub fn workload(&self, key: &WorkloadKey) -> Option<WorkloadEntry> {
        self.read().workloads.get(key).cloned()
    }

    /// Workloads whose marker for a resource differs from the resource's current hash (catch-up, behaviour §10),
    /// among the workloads whose every marker is for a resource of one of `kinds`: a catch-up of some
    /// kinds leaves a workload that also has markers of others to the catch-up of all, so that it is
    /// reloaded once. Absent markers are left alone.
    ///
    /// The lock is taken once per [`PASS_CHUNKS`]th of the workloads, not for the whole pass: a change
    /// or an admission that arrives meanwhile waits for one chunk. A workload added or removed
    /// between chunks is compared or not, as it would be by a pass just before or after.
    pub fn stale_markers(&self, kinds: &[ResourceKind]) -> Vec<(WorkloadKey, ResourceRef)> {
        let mut out = Vec::new();
        for chunk in 0..PASS_CHUNKS {
            let state = self.read();
            out.extend(
                state
                    .workloads
                    .iter()
                    .filter(|(_, entry)| entry.pass_chunk(PASS_CHUNKS) == chunk)
                    .filter(|(_, entry)| entry.markers().all(|(r, _)| kinds.contains(&r.kind)))
                    .flat_map(|(key, entry)| {
                        state
                            .stale_refs(key, entry)
                            .map(move |r| (key.clone(), r.clone()))
                    }),
            );
        }
        out.sort();
        out
    }

    /// The stale markers of one workload, when its every marker is for a resource of one of `kinds`
    /// (as [`Index::stale_markers`] for a single workload); empty when it is unknown.
    pub fn stale_markers_of(&self, key: &WorkloadKey, kinds: &[ResourceKind]) -> Vec<ResourceRef> {
        let state = self.read();
        let Some(entry) = state.workloads.get(key) else {
            return Vec::new();
        };
        if !entry.markers().all(|(r, _)| kinds.contains(&r.kind)) {
            return Vec::new();
        }
        state.stale_refs(key, entry).cloned().collect()
    }

    /// Remembers that a change of `key`, written by the apiserver at `written_at` (Unix seconds),
    /// triggered reloads of the workloads known then.
    #[cfg(test)]
    pub fn record_change(&self, key: &ResourceKey, written_at: i64) {
        self.write().changes.record(key, written_at, Instant::now());
    }

    /// Forgets handled changes older than [`RECENT_CHANGES_KEPT`] (also done on each record; the
    /// housekeeping calls this every 5 s to cover quiet periods).
    pub fn expire_recent_changes(&self) {
        self.write().changes.forget_before(Instant::now());
    }

    /// What a workload the watch sees for the first time missed (the watches are not ordered, and a
    /// generateName workload is unknown until the watch names it): references whose marker differs
    /// from the resource's current hash, and references without a marker (the webhook was down or
    /// skipped it) whose resource changed after the workload was created (`created_at`, Unix seconds;
    /// a change within the same second is taken as older, since the pods may already have it).
    pub fn missed_changes_of(
        &self,
        key: &WorkloadKey,
        created_at: Option<i64>,
    ) -> Vec<ResourceRef> {
        let state = self.read();
        let Some(entry) = state.workloads.get(key) else {
            return Vec::new();
        };
        let mut out: Vec<ResourceRef> = state.stale_refs(key, entry).cloned().collect();
        let Some(created_at) = created_at else {
            return out;
        };
        out.extend(
            entry
                .refs
                .iter()
                .filter(|r| entry.marker(r).is_none())
                .filter(|r| {
                    let rk = ResourceKey::new(r.kind, &key.namespace, &r.name);
                    state.changes.changed_after(&rk, created_at)
                })
                .cloned(),
        );
        out
    }

    /// Referenced resources that exist but whose marker the workload lacks (`--sync-after-restart` with
    /// `--reload-on-create` treats these as created at start-up, as Reloader's replay does).
    pub fn absent_markers(&self) -> Vec<(WorkloadKey, ResourceRef)> {
        let state = self.read();
        let mut out = Vec::new();
        for (key, entry) in &state.workloads {
            for r in entry.refs.iter().filter(|r| entry.marker(r).is_none()) {
                if state
                    .resources
                    .contains_key(&ResourceKey::new(r.kind, &key.namespace, &r.name))
                {
                    out.push((key.clone(), r.clone()));
                }
            }
        }
        out.sort();
        out
    }

    /// Whether any workload is a canary or carries a halt (else the release order has nothing to do).
    pub fn has_release_marks(&self) -> bool {
        !self.read().marked.is_empty()
    }

    /// The canaries and halted workloads in `namespace` that may depend on `r`, each with its
    /// release state and its marker for `r`.
    pub fn release_peers(
        &self,
        namespace: &str,
        r: &ResourceRef,
    ) -> Vec<(WorkloadKey, Release, Option<Box<str>>)> {
        let state = self.read();
        state
            .marked
            .iter()
            .filter(|k| k.namespace == namespace)
            .filter_map(|k| {
                let e = state.workloads.get(k)?;
                e.may_depend_on(r.kind, &r.name).then(|| {
                    (
                        k.clone(),
                        e.release.clone(),
                        e.marker(r).map(|m| m.to_string().into()),
                    )
                })
            })
            .collect()
    }

    /// The canary, halt and rollout progress of a confirmed workload.
    /// The confirmed workload's uid, as the apiserver wrote it.
    pub fn uid_of(&self, key: &WorkloadKey) -> Option<String> {
        Some(self.read().workloads.get(key)?.uid.as_ref()?.to_string())
    }

    /// The confirmed workload's own reload window, as written.
    pub fn window_of(&self, key: &WorkloadKey) -> Option<Box<str>> {
        self.read().workloads.get(key)?.release.window.clone()
    }

    pub fn release_of(&self, key: &WorkloadKey) -> Option<Release> {
        Some(self.read().workloads.get(key)?.release.clone())
    }

    /// The workloads carrying a halt, with their release state.
    pub fn halted(&self) -> Vec<(WorkloadKey, Release)> {
        let state = self.read();
        state
            .marked
            .iter()
            .filter_map(|k| {
                let e = state.workloads.get(k)?;
                e.release
                    .halted
                    .is_some()
                    .then(|| (k.clone(), e.release.clone()))
            })
            .collect()
    }

    pub fn sizes(&self) -> IndexSizes {
        let state = self.read();
        IndexSizes {
            resources: state.resources.len(),
            key_digests: state.key_digests.len(),
            workloads: state.workloads.len(),
            provisional: state.provisional.len(),
            reverse_edges: state.dependents.edges(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::plan::PlanConfig;
    use serde_json::json;

    fn cfg() -> PlanConfig {
        PlanConfig::default()
    }

    fn mk_deploy(
        ns: &str,
        name: &str,
        cm: &str,
        env: Option<&str>,
    ) -> (WorkloadKey, WorkloadEntry) {
        let mut container = json!({"name": "app", "envFrom": [{"configMapRef": {"name": cm}}]});
        if let Some(v) = env {
            container["env"] = json!([{"name": crate::core::envname::env_var_name(cm, ResourceKind::ConfigMap), "value": v}]);
        }
        let obj = json!({"metadata": {"name": name, "namespace": ns, "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"template": {"spec": {"containers": [container]}}}});
        let key = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: ns.into(),
            name: name.into(),
        };
        (
            key,
            WorkloadEntry::from_object(&cfg(), &obj, WorkloadKind::Deployment),
        )
    }

    fn cm_key(ns: &str, name: &str) -> ResourceKey {
        ResourceKey::new(ResourceKind::ConfigMap, ns, name)
    }

    fn entry(hash: &str) -> ResourceEntry {
        ResourceEntry {
            hash: hash.into(),
            flags: ResourceFlags::default(),
        }
    }

    fn written(marker: &str, rv: &str) -> WorkloadEntry {
        let obj = json!({"metadata": {"name": "a", "namespace": "ns", "resourceVersion": rv,
                "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"template": {"spec": {"containers": [{"name": "app",
                "envFrom": [{"configMapRef": {"name": "cfg"}}],
                "env": [{"name": "STAKATER_CFG_CONFIGMAP", "value": marker}]}]}}}});
        WorkloadEntry::from_stored(&cfg(), &obj, WorkloadKind::Deployment)
    }

    #[test]
    fn the_writers_record_is_never_replaced_by_an_older_watch_event() {
        let index = Index::new();
        let (key, _) = mk_deploy("ns", "a", "cfg", None);
        // Not confirmed by the watch yet: the PATCH response is left to the watch.
        index.record_written(&key, written("h1", "10"));
        assert!(index.workload(&key).is_none());

        index.apply_workload(key.clone(), written("h0", "9"));
        index.record_written(&key, written("h1", "12"));
        // The watch delivers the state before the PATCH (11), then the PATCH itself (12).
        assert!(!index.apply_workload(key.clone(), written("h0", "11")));
        let marker = |i: &Index| {
            i.workload(&key)
                .unwrap()
                .markers()
                .map(|(_, m)| m.to_string())
                .next()
        };
        assert_eq!(marker(&index).as_deref(), Some("h1"));
        index.apply_workload(key.clone(), written("h1", "12"));
        index.apply_workload(key.clone(), written("h2", "13"));
        assert_eq!(marker(&index).as_deref(), Some("h2"));
        let (skeleton, rv) = index.skeleton(&key).unwrap();
        assert_eq!(rv, Some(13));
        assert_eq!(
            skeleton.pointer("/spec/template/spec/containers/0/env/0/value"),
            Some(&json!("h2"))
        );
        // An older PATCH response (a slow one) does not win over the watch either.
        index.record_written(&key, written("h1", "12"));
        assert_eq!(marker(&index).as_deref(), Some("h2"));
    }

    #[test]
    fn the_uid_and_the_reload_window_are_the_entrys_own_fields() {
        let index = Index::new();
        let (key, _) = mk_deploy("ns", "a", "cfg", None);
        let uid = "0f6a3c2e-5b7d-4e8f-9a1b-2c3d4e5f6a7b";
        let obj = json!({"metadata": {"name": "a", "namespace": "ns", "uid": uid, "resourceVersion": "5",
                "annotations": {"reloader.stakater.com/auto": "true",
                    "rekindle.io/reload-window": "Mon-Fri 09:00-17:00 UTC"}},
            "spec": {"template": {"spec": {"containers": [{"name": "app",
                "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}}});
        let entry = WorkloadEntry::from_stored(&cfg(), &obj, WorkloadKind::Deployment);
        let bytes = *uuid::Uuid::parse_str(uid).unwrap().as_bytes();
        assert_eq!(entry.uid, Some(Uid::Uuid(bytes)));
        index.apply_workload(key.clone(), entry);
        assert_eq!(index.uid_of(&key).as_deref(), Some(uid));
        assert_eq!(
            index.window_of(&key).as_deref(),
            Some("Mon-Fri 09:00-17:00 UTC")
        );
        // Not kept twice: the skeleton has neither.
        let (skeleton, _) = index.skeleton(&key).unwrap();
        let text = skeleton.to_string();
        assert!(
            !text.contains(uid) && !text.contains("reload-window"),
            "{text}"
        );
        // A uid that is not a UUID in canonical form is kept as written.
        for odd in ["u-1", "0F6A3C2E-5B7D-4E8F-9A1B-2C3D4E5F6A7B", ""] {
            assert_eq!(Uid::new(odd).to_string(), odd);
        }
        assert_eq!(Uid::new(uid).to_string(), uid);
    }

    #[test]
    fn dependents_found_by_reference_only_in_the_same_namespace() {
        let index = Index::new();
        let (a, ea) = mk_deploy("ns1", "a", "cfg", None);
        let (b, eb) = mk_deploy("ns2", "b", "cfg", None);
        index.apply_workload(a.clone(), ea);
        index.apply_workload(b, eb);
        index.update_resource(&cm_key("ns1", "cfg"), entry("h1"), None);
        let upd = index.update_resource(&cm_key("ns1", "cfg"), entry("h2"), None);
        assert_eq!(upd.dependents, vec![a.clone()]);
        assert_eq!(upd.previous.unwrap().hash.to_string(), "h1");
        // Same hash again: nothing to do.
        assert!(index
            .update_resource(&cm_key("ns1", "cfg"), entry("h2"), None)
            .dependents
            .is_empty());
        // Removed workload: no longer a dependent, and no edges left behind.
        index.delete_workload(&a);
        assert!(index
            .update_resource(&cm_key("ns1", "cfg"), entry("h3"), None)
            .dependents
            .is_empty());
        assert_eq!(index.sizes().reverse_edges, 1);
    }

    #[test]
    fn a_newly_confirmed_workload_reports_its_stale_markers() {
        let index = Index::new();
        index.update_resource(&cm_key("ns", "cfg"), entry("h2"), None);
        index.update_resource(&cm_key("ns", "other"), entry("o1"), None);
        // Stamped with h1 before the change, seen by the watch after it.
        let (a, ea) = mk_deploy("ns", "a", "cfg", Some("h1"));
        assert!(
            index.apply_workload(a.clone(), ea.clone()),
            "first sighting"
        );
        let cfg_ref = ResourceRef {
            kind: ResourceKind::ConfigMap,
            name: "cfg".into(),
        };
        assert_eq!(index.missed_changes_of(&a, None), vec![cfg_ref]);
        assert!(!index.apply_workload(a.clone(), ea), "seen before");
        // Current marker, or no marker at all: nothing stale.
        let (b, eb) = mk_deploy("ns", "b", "cfg", Some("h2"));
        let (c, ec) = mk_deploy("ns", "c", "other", None);
        index.apply_workload(b.clone(), eb);
        index.apply_workload(c.clone(), ec);
        assert!(index.missed_changes_of(&b, None).is_empty());
        assert!(index.missed_changes_of(&c, None).is_empty());
        let unknown = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "unknown".into(),
        };
        assert!(index.missed_changes_of(&unknown, None).is_empty());
    }

    #[test]
    fn a_newly_seen_unmarked_workload_reports_changes_made_after_its_creation() {
        let index = Index::new();
        index.update_resource(&cm_key("ns", "cfg"), entry("h2"), None);
        index.update_resource(&cm_key("ns", "quiet"), entry("q1"), None);
        index.record_change(&cm_key("ns", "cfg"), 1_000);
        index.record_change(&cm_key("other", "cfg"), 5_000);
        let cfg_ref = ResourceRef {
            kind: ResourceKind::ConfigMap,
            name: "cfg".into(),
        };
        // No marker (created while the webhook was down), seen only after the change was handled.
        let (a, ea) = mk_deploy("ns", "a", "cfg", None);
        index.apply_workload(a.clone(), ea);
        assert_eq!(index.missed_changes_of(&a, Some(999)), vec![cfg_ref]);
        // Created in the same second as the write, or after it: its pods may have the new data.
        assert!(index.missed_changes_of(&a, Some(1_000)).is_empty());
        assert!(index.missed_changes_of(&a, Some(1_001)).is_empty());
        // Unknown creation time: only markers count.
        assert!(index.missed_changes_of(&a, None).is_empty());
        // A resource that did not change, or changed in another namespace.
        let (b, eb) = mk_deploy("ns", "b", "quiet", None);
        index.apply_workload(b.clone(), eb);
        assert!(index.missed_changes_of(&b, Some(0)).is_empty());
        // A current marker wins over the recorded change.
        let (c, ec) = mk_deploy("ns", "c", "cfg", Some("h2"));
        index.apply_workload(c.clone(), ec);
        assert!(index.missed_changes_of(&c, Some(0)).is_empty());
    }

    /// A change is remembered in the lock section that stores it: a workload seen right after misses
    /// nothing. An unchanged hash is no change, and a creation counts only when creations do.
    #[test]
    fn a_written_change_is_remembered_as_it_is_stored() {
        let index = Index::new();
        let written = |at, creations| Some(Written { at, creations });
        index.update_resource_written(&cm_key("ns", "cfg"), entry("h1"), None, written(900, false));
        index.update_resource_written(&cm_key("ns", "new"), entry("n1"), None, written(950, true));
        let (a, ea) = mk_deploy("ns", "a", "cfg", None);
        index.apply_workload(a.clone(), ea);
        assert!(
            index.missed_changes_of(&a, Some(800)).is_empty(),
            "a creation with creations off is no change"
        );
        index.update_resource_written(
            &cm_key("ns", "cfg"),
            entry("h2"),
            None,
            written(1_000, false),
        );
        let cfg_ref = ResourceRef {
            kind: ResourceKind::ConfigMap,
            name: "cfg".into(),
        };
        assert_eq!(index.missed_changes_of(&a, Some(999)), vec![cfg_ref]);
        let (b, eb) = mk_deploy("ns", "b", "new", None);
        index.apply_workload(b.clone(), eb);
        assert_eq!(
            index.missed_changes_of(&b, Some(900)).len(),
            1,
            "a creation that counts"
        );
        // The same hash written again is not a change.
        let (c, ec) = mk_deploy("ns", "c", "cfg", None);
        index.apply_workload(c.clone(), ec);
        index.update_resource_written(
            &cm_key("ns", "cfg"),
            entry("h2"),
            None,
            written(2_000, false),
        );
        assert!(index.missed_changes_of(&c, Some(1_500)).is_empty());
    }

    #[test]
    fn admission_reads_hashes_and_records_provisionally() {
        let index = Index::new();
        index.update_resource(&cm_key("ns", "cfg"), entry("h1"), None);
        let (a, ea) = mk_deploy("ns", "a", "cfg", None);
        let dry = index.admit(&a, &ea, false);
        assert_eq!(
            dry[&ResourceRef {
                kind: ResourceKind::ConfigMap,
                name: "cfg".into()
            }]
                .hash
                .to_string(),
            "h1"
        );
        assert_eq!(index.sizes().provisional, 0, "dry-run leaves no trace");
        index.admit(&a, &ea, true);
        assert_eq!(index.sizes().provisional, 1);
        assert_eq!(
            index
                .update_resource(&cm_key("ns", "cfg"), entry("h2"), None)
                .dependents,
            vec![a.clone()]
        );
        // Unconfirmed records expire.
        assert_eq!(index.expire_provisional(Duration::ZERO), 1);
        assert!(index
            .update_resource(&cm_key("ns", "cfg"), entry("h3"), None)
            .dependents
            .is_empty());
        // The watch confirms: the record is authoritative and does not expire.
        index.admit(&a, &ea, true);
        index.apply_workload(a.clone(), ea);
        assert_eq!(index.expire_provisional(Duration::ZERO), 0);
        assert_eq!(
            index
                .update_resource(&cm_key("ns", "cfg"), entry("h4"), None)
                .dependents,
            vec![a]
        );
    }

    #[test]
    fn changed_references_move_edges() {
        let index = Index::new();
        let (a, e1) = mk_deploy("ns", "a", "one", None);
        index.apply_workload(a.clone(), e1);
        let (_, e2) = mk_deploy("ns", "a", "two", None);
        index.apply_workload(a.clone(), e2);
        index.update_resource(&cm_key("ns", "one"), entry("x"), None);
        index.update_resource(&cm_key("ns", "two"), entry("x"), None);
        assert!(index
            .update_resource(&cm_key("ns", "one"), entry("y"), None)
            .dependents
            .is_empty());
        assert_eq!(
            index
                .update_resource(&cm_key("ns", "two"), entry("y"), None)
                .dependents,
            vec![a]
        );
    }

    #[test]
    fn pattern_workloads_are_found_without_a_reference() {
        let index = Index::new();
        let obj = json!({"metadata": {"annotations": {"configmap.reloader.stakater.com/reload": "gen-.*"}},
            "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}});
        let key = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "p".into(),
        };
        index.apply_workload(
            key.clone(),
            WorkloadEntry::from_object(&cfg(), &obj, WorkloadKind::Deployment),
        );
        assert_eq!(
            index
                .update_resource(&cm_key("ns", "gen-1"), entry("h"), None)
                .dependents,
            vec![key]
        );
        assert!(index
            .update_resource(&cm_key("other", "gen-1"), entry("h"), None)
            .dependents
            .is_empty());
    }

    #[test]
    fn keys_keep_names_of_up_to_24_bytes_in_place() {
        let key = ResourceKey::new(ResourceKind::ConfigMap, "kube-system", "coredns-config");
        assert!(!key.namespace.is_heap_allocated() && !key.name.is_heap_allocated());
        let long = "a-configmap-name-longer-than-24-bytes";
        let key = ResourceKey::new(ResourceKind::ConfigMap, "ns", long);
        assert_eq!(key.name, long);
        assert!(key.name.is_heap_allocated());
    }

    #[test]
    fn a_pass_in_chunks_compares_every_workload_once() {
        let index = Index::new();
        let mut all = Vec::new();
        // Uids that fall in every chunk, and a workload without one.
        for i in 0..=2 * PASS_CHUNKS {
            let (key, mut e) = mk_deploy("ns", &format!("w-{i}"), "cfg", Some("old"));
            e.uid = (i > 0).then_some(Uid::Uuid([i; 16]));
            index.apply_workload(key.clone(), e);
            all.push(key);
        }
        index.update_resource(&cm_key("ns", "cfg"), entry("new"), None);
        let stale: Vec<WorkloadKey> = index
            .stale_markers(&ResourceKind::ALL)
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        all.sort();
        assert_eq!(stale, all);
    }

    #[test]
    fn stale_markers_for_catch_up() {
        let index = Index::new();
        let (a, ea) = mk_deploy("ns", "a", "cfg", Some("old"));
        let (b, eb) = mk_deploy("ns", "b", "cfg", Some("new"));
        let (c, ec) = mk_deploy("ns", "c", "cfg", None);
        index.apply_workload(a.clone(), ea);
        index.apply_workload(b, eb);
        index.apply_workload(c, ec);
        index.update_resource(&cm_key("ns", "cfg"), entry("new"), None);
        // Only the workload whose marker differs; the one without a marker is left alone.
        assert_eq!(
            index.stale_markers(&ResourceKind::ALL),
            vec![(
                a,
                ResourceRef {
                    kind: ResourceKind::ConfigMap,
                    name: "cfg".into()
                }
            )]
        );
        // The workload without a marker is what --sync-after-restart replays.
        assert_eq!(index.absent_markers().len(), 1);
        assert_eq!(index.absent_markers()[0].0.name, "c");
    }

    #[test]
    fn a_catch_up_of_one_kind_leaves_workloads_with_markers_of_others_to_the_full_one() {
        let index = Index::new();
        let (a, ea) = mk_deploy("ns", "a", "cfg", Some("old"));
        index.apply_workload(a.clone(), ea);
        let both = WorkloadKey {
            name: "both".into(),
            ..a.clone()
        };
        let obj = json!({"metadata": {"name": "both", "namespace": "ns",
                "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"template": {"spec": {"containers": [{"name": "app",
                "envFrom": [{"configMapRef": {"name": "cfg"}}, {"secretRef": {"name": "pw"}}],
                "env": [{"name": "STAKATER_CFG_CONFIGMAP", "value": "old"},
                        {"name": "STAKATER_PW_SECRET", "value": "old"}]}]}}}});
        index.apply_workload(
            both.clone(),
            WorkloadEntry::from_object(&cfg(), &obj, WorkloadKind::Deployment),
        );
        index.update_resource(&cm_key("ns", "cfg"), entry("new"), None);
        let names = |stale: Vec<(WorkloadKey, ResourceRef)>| -> Vec<String> {
            stale.into_iter().map(|(w, _)| w.name.to_string()).collect()
        };
        // ConfigMaps listed, Secrets not yet: the workload that also has a Secret's marker waits, even
        // though only its ConfigMap's marker is stale so far.
        assert_eq!(
            names(index.stale_markers(&[ResourceKind::ConfigMap])),
            ["a"]
        );
        assert_eq!(
            names(index.stale_markers(&ResourceKind::ALL)),
            ["a", "both"]
        );
    }

    /// A `used-keys` workload reading key `a` of `cfg`, with `marker` (as stored by the watch).
    fn key_reader(name: &str, marker: &str) -> (WorkloadKey, WorkloadEntry) {
        let obj = json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1",
                "annotations": {"reloader.stakater.com/auto": "true", "rekindle.io/reload-on": "used-keys"}},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a"}}},
                {"name": "STAKATER_CFG_CONFIGMAP", "value": marker}]}]}}}});
        let key = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: name.into(),
        };
        (
            key,
            WorkloadEntry::from_stored(&cfg(), &obj, WorkloadKind::Deployment),
        )
    }

    fn digests(a: &str, b: &str) -> KeyDigests {
        let cm: k8s_openapi::api::core::v1::ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"a": a, "b": b}}))
                .unwrap();
        KeyDigests::of_configmap(&cm)
    }

    #[test]
    fn used_keys_markers_are_stale_only_when_a_read_key_changed() {
        let index = Index::new();
        let v1 = digests("1", "x");
        let read_a: std::collections::BTreeSet<String> = ["a".to_string()].into();
        // Nobody reads cfg key by key yet: its digests are not kept.
        assert!(!index.wants_keys(&cm_key("ns", "cfg")));
        index.update_resource(&cm_key("ns", "cfg"), entry(&v1.of), Some(v1.clone()));
        assert_eq!(index.sizes().key_digests, 0);
        let (a, ea) = key_reader("a", &v1.hash(&read_a));
        assert!(ea.reads_keys);
        index.apply_workload(a.clone(), ea);
        assert!(index.wants_keys(&cm_key("ns", "cfg")));
        // Digests missing: a marker other than the whole hash is a candidate (the writer reads).
        assert_eq!(index.stale_markers(&ResourceKind::ALL).len(), 1);
        index.fill_keys(&cm_key("ns", "cfg"), v1.clone());
        assert!(index.stale_markers(&ResourceKind::ALL).is_empty());
        // Only `b` changes: current. `a` changes: stale.
        let v2 = digests("1", "y");
        index.update_resource(&cm_key("ns", "cfg"), entry(&v2.of), Some(v2.clone()));
        assert!(index.stale_markers(&ResourceKind::ALL).is_empty());
        let v3 = digests("2", "y");
        index.update_resource(&cm_key("ns", "cfg"), entry(&v3.of), Some(v3.clone()));
        assert_eq!(index.stale_markers(&ResourceKind::ALL).len(), 1);
        // Digests of other content are never used or kept.
        index.fill_keys(&cm_key("ns", "cfg"), v1.clone());
        assert_eq!(index.key_digests(&cm_key("ns", "cfg")), Some(v3.clone()));
        // The whole object's hash counts as current (stamped before the switch to used-keys).
        let (b, eb) = key_reader("b", &v3.of);
        index.apply_workload(b.clone(), eb);
        assert_eq!(
            index
                .stale_markers(&ResourceKind::ALL)
                .into_iter()
                .map(|(w, _)| w.name)
                .collect::<Vec<_>>(),
            ["a"]
        );
        // Once no workload reads it key by key, the next update drops the digests.
        index.delete_workload(&a);
        index.delete_workload(&b);
        index.update_resource(&cm_key("ns", "cfg"), entry(&v3.of), Some(v3));
        assert_eq!(index.sizes().key_digests, 0);
    }
}
