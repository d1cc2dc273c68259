//! What the index keeps of one workload.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::core::hash::StoredHash;
use crate::core::keys;

use crate::core::plan::{self, PlanConfig};
use crate::core::policy::{AnnotationKeys, WorkloadPolicy};
use crate::core::refs::{self, ResourceRef};
use crate::core::release::Release;
use crate::core::skeleton;
use crate::core::{ResourceKind, WorkloadKind};

/// A workload's uid: the 16 bytes of the UUID the apiserver gives every object, or the text as
/// written when it is not one in canonical form (kept inline: no allocation per workload).
#[derive(Clone, PartialEq, Eq)]
pub enum Uid {
    Uuid([u8; 16]),
    Text(Box<str>),
}

impl Uid {
    pub fn new(text: &str) -> Self {
        match uuid::Uuid::try_parse(text) {
            Ok(u) if u.hyphenated().to_string() == text => Self::Uuid(*u.as_bytes()),
            _ => Self::Text(text.into()),
        }
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Uuid(bytes) => uuid::Uuid::from_bytes(*bytes).hyphenated().fmt(f),
            Self::Text(text) => f.write_str(text),
        }
    }
}

impl std::fmt::Debug for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// What the index keeps of a workload: references and markers, never the object. Sorted boxed slices,
/// not B-trees: a workload has a handful of references, and a B-tree node costs hundreds of bytes.
/// The policy annotations are read from the skeleton when needed (notify mode), not kept twice.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkloadEntry {
    /// Referenced resources, sorted.
    pub refs: Box<[ResourceRef]>,
    /// The marker currently on the workload for `refs[i]` at `markers[i]`; empty when it has none.
    markers: Box<[Option<StoredHash>]>,
    pub has_patterns: bool,
    /// In `used-keys` mode with a reference read key by key (behaviour §14): its markers may be
    /// used-keys hashes, and the resources it names keep their value digests.
    pub reads_keys: bool,
    /// What planning reads of the object (`core::skeleton`, compact JSON); set from the watch and from
    /// the writer's own PATCH response, absent for admission's provisional records.
    pub skeleton: Option<Box<str>>,
    /// The object's uid (Events and halts name it), from a stored object.
    pub uid: Option<Uid>,
    /// The object's resourceVersion when it is a number (etcd's always are), so an older watch event
    /// never replaces what the writer's PATCH response already recorded.
    pub resource_version: Option<u64>,
    /// Canary, halt and rollout progress of a stored object (defaults for admission's records).
    pub release: Release,
}

impl WorkloadEntry {
    /// Which of `chunks` parts of a pass over every workload this one falls in: from its uid, random
    /// and kept in the entry, so telling costs no lookup (without a uid, the first).
    pub fn pass_chunk(&self, chunks: u8) -> u8 {
        match &self.uid {
            Some(Uid::Uuid(bytes)) => bytes[15] % chunks,
            _ => 0,
        }
    }

    pub fn from_object(cfg: &PlanConfig, obj: &Value, kind: WorkloadKind) -> Self {
        Self::with_policy(cfg, obj, kind).0
    }

    /// The entry and the policy annotations it was decided from (admission plans with them).
    pub fn with_policy(
        cfg: &PlanConfig,
        obj: &Value,
        kind: WorkloadKind,
    ) -> (Self, WorkloadPolicy) {
        let policy = WorkloadPolicy::from_workload(&cfg.policy.keys, obj, kind);
        let has_patterns = policy.has_patterns(&cfg.policy.keys);
        let (refs, mut markers): (Vec<ResourceRef>, Vec<Option<StoredHash>>) =
            plan::markers(cfg, obj, kind)
                .into_iter()
                .map(|(r, m)| (r, m.as_deref().map(StoredHash::new)))
                .unzip();
        if markers.iter().all(Option::is_none) {
            markers.clear();
        }
        let markers = markers.into_boxed_slice();
        let reads_keys = refs
            .iter()
            .any(|r| plan::keys_read(cfg, obj, kind, r).is_some());
        let entry = Self {
            refs: refs.into_boxed_slice(),
            markers,
            has_patterns,
            reads_keys,
            ..Default::default()
        };
        (entry, policy)
    }

    /// The record of a group of labelled pods (`core::pod_groups`): the resources its pods were
    /// stamped for, each with the hash all of them carry, or an empty marker (never current, so the
    /// consistency pass looks at the group) when they differ.
    pub fn of_pods<'a>(stamps: impl IntoIterator<Item = &'a [(ResourceRef, String)]>) -> Self {
        let mut carried: std::collections::BTreeMap<&ResourceRef, Option<&str>> =
            Default::default();
        for pod in stamps {
            for (r, hash) in pod {
                carried
                    .entry(r)
                    .and_modify(|m| {
                        if *m != Some(hash.as_str()) {
                            *m = None;
                        }
                    })
                    .or_insert(Some(hash));
            }
        }
        let (refs, markers): (Vec<ResourceRef>, Vec<Option<StoredHash>>) = carried
            .into_iter()
            .map(|(r, m)| (r.clone(), Some(StoredHash::new(m.unwrap_or_default()))))
            .unzip();
        Self {
            refs: refs.into_boxed_slice(),
            markers: markers.into_boxed_slice(),
            ..Default::default()
        }
    }

    /// Whether the pod spec references `r`.
    pub fn references(&self, r: &ResourceRef) -> bool {
        self.refs.binary_search(r).is_ok()
    }

    /// The marker the workload carries for `r`.
    pub fn marker(&self, r: &ResourceRef) -> Option<&StoredHash> {
        let i = self.refs.binary_search(r).ok()?;
        self.markers.get(i)?.as_ref()
    }

    /// The markers the workload carries, by resource.
    pub fn markers(&self) -> impl Iterator<Item = (&ResourceRef, &StoredHash)> {
        self.refs
            .iter()
            .zip(self.markers.iter())
            .filter_map(|(r, m)| Some((r, m.as_ref()?)))
    }

    /// The policy annotations, read from the skeleton (none without one).
    pub fn policy(&self, keys: &AnnotationKeys, kind: WorkloadKind) -> WorkloadPolicy {
        self.skeleton
            .as_deref()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .map(|s| WorkloadPolicy::from_workload(keys, &s, kind))
            .unwrap_or_default()
    }

    /// The record of a stored object (the watch's or a PATCH response's): references, markers,
    /// skeleton and resourceVersion.
    pub fn from_stored(cfg: &PlanConfig, obj: &Value, kind: WorkloadKind) -> Self {
        Self::from_object(cfg, obj, kind).with_skeleton(cfg, obj, kind)
    }

    fn with_skeleton(mut self, cfg: &PlanConfig, obj: &Value, kind: WorkloadKind) -> Self {
        self.skeleton = Some(
            skeleton::skeleton(&cfg.policy.keys, obj, kind)
                .to_string()
                .into(),
        );
        self.uid = refs::at(obj, "/metadata/uid")
            .and_then(Value::as_str)
            .map(Uid::new);
        self.resource_version = refs::at(obj, "/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(refs::resource_version);
        self.release = Release::of(obj, kind, cfg.pod_restarts);
        self
    }

    /// The keys of `r` it reads, when it reads some only (from the skeleton; `None` without one).
    pub(super) fn keys_read(
        &self,
        kind: WorkloadKind,
        r: &ResourceRef,
    ) -> Option<BTreeSet<String>> {
        if !self.reads_keys {
            return None;
        }
        let skeleton: Value = serde_json::from_str(self.skeleton.as_deref()?).ok()?;
        match keys::used_keys(refs::pod_spec(&skeleton, kind)?, r.kind, &r.name) {
            keys::Use::Keys(read) => Some(read),
            keys::Use::Whole => None,
        }
    }

    /// Whether this record is older than `other` by resourceVersion (unknown counts as not older).
    pub(super) fn older_than(&self, other: &WorkloadEntry) -> bool {
        matches!((self.resource_version, other.resource_version), (Some(a), Some(b)) if a < b)
    }

    /// Could a change of this resource concern the workload at all?
    pub(super) fn may_depend_on(&self, kind: ResourceKind, name: &str) -> bool {
        self.has_patterns
            || self.references(&ResourceRef {
                kind,
                name: name.into(),
            })
    }
}
