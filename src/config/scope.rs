//! Which workloads rekindle acts on: the namespaces (behaviour §11: `--namespaces` >
//! KUBERNETES_NAMESPACE > cluster-wide, with `--namespaces-to-ignore` and `--namespace-selector` in
//! cluster-wide mode) and the kinds (`--ignored-workload-types`). Every route that reloads, notifies
//! or stamps asks [`ScopeFilter::covers`], so the rule has one home.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::RwLock;

use crate::config::selector::Selector;
use crate::config::Scope;
use crate::core::WorkloadKind;

#[derive(Debug, Default)]
pub struct ScopeFilter {
    namespaces: Option<BTreeSet<String>>,
    ignored: BTreeSet<String>,
    selector: Option<Selector>,
    /// Namespaces whose labels match the selector, kept current by the namespace watch.
    matching: RwLock<HashSet<String>>,
    /// `--ignored-workload-types`.
    ignored_kinds: BTreeSet<WorkloadKind>,
}

impl ScopeFilter {
    pub fn new(scope: &Scope) -> Self {
        Self {
            namespaces: scope.namespaces.clone(),
            ignored: scope.namespaces_to_ignore.clone(),
            selector: scope.namespace_selector.clone(),
            matching: RwLock::default(),
            ignored_kinds: BTreeSet::new(),
        }
    }

    /// Leaves workloads of these kinds alone.
    pub fn ignoring_kinds(mut self, kinds: impl IntoIterator<Item = WorkloadKind>) -> Self {
        self.ignored_kinds = kinds.into_iter().collect();
        self
    }

    /// Whether rekindle acts on a workload of `kind` in `namespace`.
    pub fn covers(&self, kind: WorkloadKind, namespace: &str) -> bool {
        !self.ignored_kinds.contains(&kind) && self.namespace_in_scope(namespace)
    }

    /// The namespaces to watch one by one, or `None` for a cluster-wide watch.
    pub fn watched_namespaces(&self) -> Option<&BTreeSet<String>> {
        self.namespaces.as_ref()
    }

    pub fn selector(&self) -> Option<&Selector> {
        self.selector.as_ref()
    }

    pub fn namespace_in_scope(&self, ns: &str) -> bool {
        if let Some(list) = &self.namespaces {
            return list.contains(ns);
        }
        if self.ignored.contains(ns) {
            return false;
        }
        match &self.selector {
            None => true,
            Some(_) => self
                .matching
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains(ns),
        }
    }

    /// The namespace watch saw a namespace; returns true when it started matching.
    pub fn observe_namespace(&self, ns: &str, labels: &BTreeMap<String, String>) -> bool {
        let Some(selector) = &self.selector else {
            return false;
        };
        let mut matching = self.matching.write().unwrap_or_else(|e| e.into_inner());
        if selector.matches(labels) {
            matching.insert(ns.to_string())
        } else {
            matching.remove(ns);
            false
        }
    }

    pub fn forget_namespace(&self, ns: &str) {
        self.matching
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_selector() {
        let list = ScopeFilter::new(&Scope {
            namespaces: Some(["a".to_string()].into()),
            ..Default::default()
        });
        assert!(list.namespace_in_scope("a") && !list.namespace_in_scope("b"));
        let wide = ScopeFilter::new(&Scope {
            namespaces_to_ignore: ["x".to_string()].into(),
            ..Default::default()
        });
        assert!(wide.namespace_in_scope("a") && !wide.namespace_in_scope("x"));
        let sel = ScopeFilter::new(&Scope {
            namespace_selector: Some(Selector::parse_legacy(&["team:a"]).unwrap()),
            ..Default::default()
        });
        assert!(!sel.namespace_in_scope("n"));
        let labels: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
        assert!(sel.observe_namespace("n", &labels));
        assert!(sel.namespace_in_scope("n"));
        sel.observe_namespace("n", &BTreeMap::new());
        assert!(!sel.namespace_in_scope("n"));
    }

    #[test]
    fn covers_in_scope_namespaces_and_kinds_not_ignored() {
        let scope = ScopeFilter::new(&Scope {
            namespaces_to_ignore: ["x".to_string()].into(),
            ..Default::default()
        })
        .ignoring_kinds([WorkloadKind::Job]);
        assert!(scope.covers(WorkloadKind::Deployment, "a"));
        assert!(!scope.covers(WorkloadKind::Job, "a"), "kind ignored");
        assert!(
            !scope.covers(WorkloadKind::Deployment, "x"),
            "namespace ignored"
        );
    }
}
