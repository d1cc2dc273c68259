//! The reverse edges: which workloads a change of a resource may concern — those naming it, and
//! those with reload patterns in its namespace (found by evaluating the pattern, not by name).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::{ResourceKey, WorkloadEntry, WorkloadKey};
use crate::core::refs::ResourceRef;

#[derive(Debug, Default)]
pub(super) struct Dependents {
    /// resource → workloads naming it.
    by_name: HashMap<ResourceKey, HashSet<WorkloadKey>>,
    /// namespace → workloads with reload patterns.
    by_pattern: HashMap<String, HashSet<WorkloadKey>>,
}

impl Dependents {
    /// Adds the edges of a workload's record.
    pub(super) fn link(&mut self, key: &WorkloadKey, entry: &WorkloadEntry) {
        for r in &entry.refs {
            self.by_name
                .entry(ResourceKey::new(r.kind, &key.namespace, &r.name))
                .or_default()
                .insert(key.clone());
        }
        if entry.has_patterns {
            self.by_pattern
                .entry(key.namespace.clone())
                .or_default()
                .insert(key.clone());
        }
    }

    /// Removes the edges of an old record, except the references `still_named` keeps and the
    /// pattern edge when `patterns_still` (another record of the same workload needs them).
    pub(super) fn unlink(
        &mut self,
        key: &WorkloadKey,
        old: &WorkloadEntry,
        still_named: impl Fn(&ResourceRef) -> bool,
        patterns_still: bool,
    ) {
        for r in old.refs.iter().filter(|r| !still_named(r)) {
            let rk = ResourceKey::new(r.kind, &key.namespace, &r.name);
            if let Some(set) = self.by_name.get_mut(&rk) {
                set.remove(key);
                if set.is_empty() {
                    self.by_name.remove(&rk);
                }
            }
        }
        if old.has_patterns && !patterns_still {
            if let Some(set) = self.by_pattern.get_mut(&key.namespace) {
                set.remove(key);
                if set.is_empty() {
                    self.by_pattern.remove(&key.namespace);
                }
            }
        }
    }

    /// The workloads a change of `resource` may concern, sorted.
    pub(super) fn candidates(&self, resource: &ResourceKey) -> BTreeSet<WorkloadKey> {
        let named = self.by_name.get(resource).into_iter().flatten();
        let patterned = self
            .by_pattern
            .get(&resource.namespace)
            .into_iter()
            .flatten();
        named.chain(patterned).cloned().collect()
    }

    /// The workloads naming `resource`.
    pub(super) fn named<'a>(
        &'a self,
        resource: &ResourceKey,
    ) -> impl Iterator<Item = &'a WorkloadKey> + 'a {
        self.by_name.get(resource).into_iter().flatten()
    }

    /// How many (resource, workload) edges are kept.
    pub(super) fn edges(&self) -> usize {
        self.by_name.values().map(HashSet::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::plan::PlanConfig;
    use crate::core::{ResourceKind, WorkloadKind};
    use serde_json::json;

    fn workload(
        name: &str,
        annotations: serde_json::Value,
        cms: &[&str],
    ) -> (WorkloadKey, WorkloadEntry) {
        let env_from: Vec<_> = cms
            .iter()
            .map(|c| json!({"configMapRef": {"name": c}}))
            .collect();
        let obj = json!({"metadata": {"name": name, "namespace": "ns", "annotations": annotations},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "envFrom": env_from}]}}}});
        let key = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: name.into(),
        };
        let entry = WorkloadEntry::from_object(&PlanConfig::default(), &obj, key.kind);
        (key, entry)
    }

    fn cm(ns: &str, name: &str) -> ResourceKey {
        ResourceKey::new(ResourceKind::ConfigMap, ns, name)
    }

    #[test]
    fn found_by_name_in_the_namespace_and_by_pattern() {
        let mut d = Dependents::default();
        let (named, e1) = workload(
            "named",
            json!({"reloader.stakater.com/auto": "true"}),
            &["cfg"],
        );
        let (patterned, e2) = workload(
            "patterned",
            json!({"configmap.reloader.stakater.com/reload": "gen-.*"}),
            &[],
        );
        d.link(&named, &e1);
        d.link(&patterned, &e2);
        assert_eq!(
            d.candidates(&cm("ns", "cfg"))
                .into_iter()
                .collect::<Vec<_>>(),
            [named.clone(), patterned.clone()]
        );
        assert_eq!(
            d.candidates(&cm("ns", "gen-1"))
                .into_iter()
                .collect::<Vec<_>>(),
            std::slice::from_ref(&patterned)
        );
        assert!(d.candidates(&cm("other", "cfg")).is_empty());
        assert_eq!(d.edges(), 1);

        // An edge another record still needs is kept; the rest go, leaving no empty sets behind.
        d.unlink(&named, &e1, |r| r.name == "cfg", false);
        assert_eq!(d.edges(), 1);
        d.unlink(&named, &e1, |_| false, false);
        d.unlink(&patterned, &e2, |_| false, false);
        assert!(d.by_name.is_empty() && d.by_pattern.is_empty());
    }
}
