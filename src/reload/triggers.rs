//! The one way into the reload queue. Every route names workloads and the resource that makes them
//! owed — a watched change, a new workload that missed one, the catch-up's stale markers,
//! `--sync-after-restart`'s replay — and this decides which of them rekindle acts on and how soon.
//! The end of a Deployment pause rekindle set goes in the same way, due when the period is over.
//! Only keys go in: what the change was (the new hash, a deletion) is read from the index when the
//! reload is planned, so a trigger can never carry an outdated view of it.

use std::sync::Arc;

use tokio::time::Instant;

use super::queue::{Found, Pushed, Queue, Upkeep};
use crate::config::scope::ScopeFilter;
use crate::core::refs::ResourceRef;
use crate::index::{Index, WorkloadKey};
use crate::metrics::{Metrics, Skip};

pub struct Triggers {
    index: Arc<Index>,
    queue: Arc<Queue>,
    scope: Arc<ScopeFilter>,
    metrics: Arc<Metrics>,
}

impl Triggers {
    pub fn new(
        index: Arc<Index>,
        queue: Arc<Queue>,
        scope: Arc<ScopeFilter>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            index,
            queue,
            scope,
            metrics,
        })
    }

    /// Triggers of `queue` covering every workload, counting on throwaway metrics.
    #[cfg(test)]
    pub fn for_tests(index: Arc<Index>, queue: Arc<Queue>) -> Arc<Self> {
        Self::new(
            index,
            queue,
            Arc::default(),
            Arc::new(Metrics::new(&mut Default::default(), false)),
        )
    }

    pub fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    /// Queues the workloads rekindle covers for a change of `resource` first seen at `observed`, as
    /// `found`; returns how many were queued.
    pub fn push(
        &self,
        workloads: &[WorkloadKey],
        resource: &ResourceRef,
        observed: Instant,
        found: Found,
    ) -> usize {
        let mut queued = 0;
        for w in workloads {
            self.metrics.scanned(w.kind);
            if !self.scope.covers(w.kind, &w.namespace) {
                self.metrics.skip(Skip::IgnoredOrNotSelected);
                continue;
            }
            self.metrics.matched(w.kind);
            // A workload nothing else can trigger has no other change to wait for.
            let lone = self.index.has_one_trigger(w);
            if self
                .queue
                .push(w.clone(), resource.clone(), observed, lone, found)
                == Pushed::Coalesced
            {
                self.metrics.reloads_coalesced.inc();
            }
            queued += 1;
        }
        queued
    }

    /// Queues the end of a pause rekindle set on the Deployment `key`, due `at` (wall clock).
    pub fn resume_at(&self, key: &WorkloadKey, at: jiff::Timestamp) {
        if !self.scope.covers(key.kind, &key.namespace) {
            return;
        }
        let wait = at.duration_since(jiff::Timestamp::now());
        let wait = std::time::Duration::try_from(wait).unwrap_or_default();
        self.queue
            .push_upkeep(key.clone(), Instant::now() + wait, Upkeep::RESUME);
    }

    /// Queues the next step of the pod-restart walk of `key`, whose pods the watch shows not all
    /// replaced yet (its status changes as each pod goes and comes back).
    pub fn restart_pods(&self, key: &WorkloadKey) {
        if !self.scope.covers(key.kind, &key.namespace) {
            return;
        }
        self.queue
            .push_upkeep(key.clone(), Instant::now(), Upkeep::RESTART_PODS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Scope;
    use crate::core::plan::PlanConfig;
    use crate::core::{ResourceKind, WorkloadKind};
    use crate::index::WorkloadEntry;
    use crate::reload::queue::QueueConfig;
    use serde_json::json;
    use std::time::Duration;

    fn key(kind: WorkloadKind, ns: &str, name: &str) -> WorkloadKey {
        WorkloadKey {
            kind,
            namespace: ns.into(),
            name: name.into(),
        }
    }

    /// Out-of-scope namespaces and ignored kinds are never queued, whatever the route; a workload
    /// with one possible trigger is due at once, one with several waits the debounce.
    #[tokio::test(start_paused = true)]
    async fn queues_covered_workloads_lone_ones_at_once() {
        let index = Arc::new(Index::new());
        let queue = Arc::new(Queue::new(QueueConfig {
            debounce: Duration::from_secs(1),
            debounce_max: Duration::from_secs(5),
            min_interval: Duration::ZERO,
        }));
        let scope = Arc::new(
            ScopeFilter::new(&Scope {
                namespaces_to_ignore: ["off".to_string()].into(),
                ..Default::default()
            })
            .ignoring_kinds([WorkloadKind::Job]),
        );
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let triggers = Triggers::new(index.clone(), queue.clone(), scope, metrics);
        let cm = |name: &str| ResourceRef {
            kind: ResourceKind::ConfigMap,
            name: name.into(),
        };
        let lone = key(WorkloadKind::Deployment, "ns", "lone");
        let shared = key(WorkloadKind::Deployment, "ns", "shared");
        for (w, configmaps) in [(&lone, vec!["a"]), (&shared, vec!["a", "b"])] {
            let env_from: Vec<_> = configmaps
                .iter()
                .map(|name| json!({"configMapRef": {"name": name}}))
                .collect();
            let obj = json!({"metadata": {"name": w.name, "namespace": "ns",
                "annotations": {"reloader.stakater.com/auto": "true"}},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "app", "envFrom": env_from}]}}}});
            let entry = WorkloadEntry::from_object(&PlanConfig::default(), &obj, w.kind);
            index.apply_workload(w.clone(), entry);
        }
        let candidates = [
            lone.clone(),
            shared.clone(),
            key(WorkloadKind::Job, "ns", "job"),
            key(WorkloadKind::Deployment, "off", "web"),
        ];
        let t0 = Instant::now();
        assert_eq!(
            triggers.push(&candidates, &cm("a"), t0, Found::Event(Some(1))),
            2
        );
        assert_eq!(queue.depth(), 2);
        let (first, pending) = queue.next().await;
        assert_eq!((first, Instant::now()), (lone, t0), "due at once");
        assert_eq!(pending.causes.keys().collect::<Vec<_>>(), [&cm("a")]);
        let (second, _) = queue.next().await;
        assert_eq!(second, shared);
        assert_eq!(Instant::now() - t0, Duration::from_secs(1), "debounced");
    }
}
