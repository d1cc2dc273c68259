//! The reverse edges: which workloads a change of a resource may concern — those naming it, and
//! those with reload patterns in its namespace (found by evaluating the pattern, not by name).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::{ResourceKey, WorkloadEntry, WorkloadKey};
use crate::core::refs::{Name, ResourceRef};

#[derive(Debug, Default)]
pub(super) struct Dependents {
    /// resource → workloads naming it.
    by_name: HashMap<ResourceKey, Named>,
    /// namespace → workloads with reload patterns.
    by_pattern: HashMap<Name, HashSet<WorkloadKey>>,
}

impl Dependents {
    /// Adds the edges of a workload's record.
    pub(super) fn link(&mut self, key: &WorkloadKey, entry: &WorkloadEntry) {
        for r in &entry.refs {
            self.by_name
                .entry(ResourceKey::new(r.kind, &key.namespace, &r.name))
                .and_modify(|named| named.insert(key))
                .or_insert_with(|| Named::One(key.clone()));
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
                if set.remove(key) {
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
        let named = self.by_name.get(resource).into_iter().flat_map(Named::iter);
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
        self.by_name.get(resource).into_iter().flat_map(Named::iter)
    }

    /// How many (resource, workload) edges are kept.
    pub(super) fn edges(&self) -> usize {
        self.by_name.values().map(Named::len).sum()
    }
}

/// The workloads naming one resource. Most resources are named by one workload, and a set of one
/// costs its table (about 250 bytes) on top of the key: at 100,000 workloads that was a tenth of the
/// process (docs/scaling.md).
#[derive(Debug)]
enum Named {
    One(WorkloadKey),
    Many(HashSet<WorkloadKey>),
}

impl Named {
    fn insert(&mut self, key: &WorkloadKey) {
        match self {
            Named::One(one) if one == key => {}
            Named::One(one) => {
                let set = HashSet::from([one.clone(), key.clone()]);
                *self = Named::Many(set);
            }
            Named::Many(set) => {
                set.insert(key.clone());
            }
        }
    }

    /// Removes `key`; true when none is left.
    fn remove(&mut self, key: &WorkloadKey) -> bool {
        let Named::Many(set) = self else {
            return matches!(self, Named::One(one) if one == key);
        };
        set.remove(key);
        if set.len() == 1 {
            if let Some(last) = set.iter().next().cloned() {
                *self = Named::One(last);
            }
            return false;
        }
        set.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = &WorkloadKey> + '_ {
        let (one, many) = match self {
            Named::One(one) => (Some(one), None),
            Named::Many(set) => (None, Some(set)),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    fn len(&self) -> usize {
        match self {
            Named::One(_) => 1,
            Named::Many(set) => set.len(),
        }
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

    #[test]
    fn a_resource_named_by_one_then_three_then_none() {
        let mut d = Dependents::default();
        let auto = json!({"reloader.stakater.com/auto": "true"});
        let ws: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| workload(n, auto.clone(), &["shared"]))
            .collect();
        let names = |d: &Dependents| -> Vec<String> {
            let mut v: Vec<String> = d
                .named(&cm("ns", "shared"))
                .map(|k| k.name.to_string())
                .collect();
            v.sort();
            v
        };
        d.link(&ws[0].0, &ws[0].1);
        d.link(&ws[0].0, &ws[0].1);
        assert_eq!(names(&d), ["a"]);
        assert_eq!(d.edges(), 1);
        for (k, e) in &ws[1..] {
            d.link(k, e);
        }
        assert_eq!(names(&d), ["a", "b", "c"]);
        assert_eq!(d.edges(), 3);
        d.unlink(&ws[0].0, &ws[0].1, |_| false, false);
        d.unlink(&ws[2].0, &ws[2].1, |_| false, false);
        assert_eq!(names(&d), ["b"]);
        assert!(matches!(
            d.by_name.get(&cm("ns", "shared")),
            Some(Named::One(_))
        ));
        d.unlink(&ws[0].0, &ws[0].1, |_| false, false);
        assert_eq!(
            names(&d),
            ["b"],
            "unlinking a workload not named leaves the others"
        );
        d.unlink(&ws[1].0, &ws[1].1, |_| false, false);
        assert!(d.by_name.is_empty());
        assert_eq!(d.edges(), 0);
    }
}
