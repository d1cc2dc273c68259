//! What runs beside the watches and the writer: the catch-up once every watch has synced (and on
//! becoming leader), the periodic consistency pass, expiry of the index's short-lived records, and
//! handing freed heap back to the OS.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::scope::ScopeFilter;
use crate::core::plan::{Event, PlanConfig};
use crate::core::ResourceKind;
use crate::index::{Index, WorkloadKey};
use crate::metrics::Metrics;
use crate::reload::lease::Leadership;
use crate::reload::queue::Queue;
use crate::watch::ReadyTracker;

/// How long an admission record waits for the watch to confirm it.
const PROVISIONAL_TTL: Duration = Duration::from_secs(60);

/// How often memory freed since the last time is handed back to the OS.
const HEAP_TRIM_INTERVAL: Duration = Duration::from_secs(60);

pub struct Housekeeping {
    pub index: Arc<Index>,
    /// Where catch-ups queue stale workloads; `None` when nothing is reloaded (`--webhook-url`).
    pub catch_up: Option<Arc<Queue>>,
    pub metrics: Arc<Metrics>,
    pub scope: Arc<ScopeFilter>,
    pub plan: PlanConfig,
    pub ready: Arc<ReadyTracker>,
    pub leadership: Leadership,
    pub consistency_interval: Duration,
    /// Reloader's `--sync-after-restart` replay.
    pub replay_creates: bool,
}

impl Housekeeping {
    pub async fn run(self, shutdown: CancellationToken) {
        let Some(mut caught_up) = self.first_sync(&shutdown).await else {
            return;
        };
        tracing::info!(sizes = ?self.index.sizes(), "all watches synced; ready");
        self.metrics.ready.set(1);
        if self.replay_creates {
            self.replay();
        }
        let mut consistency =
            tokio::time::interval_at(tokio::time::Instant::now(), self.consistency_interval);
        let mut expiry = tokio::time::interval(Duration::from_secs(5));
        // Its first tick is immediate: the peak of the first sync is handed back at once.
        let mut trim = tokio::time::interval(HEAP_TRIM_INTERVAL);
        let mut leader_check = tokio::time::interval(Duration::from_millis(500));
        let mut was_leader = self.leadership.is_leader();
        loop {
            tokio::select! {
                _ = consistency.tick() => {
                    // The first tick is the catch-up of all, less what was caught up early.
                    let early = std::mem::take(&mut caught_up);
                    if self.leadership.is_leader() {
                        self.catch_up(&ResourceKind::ALL, &early);
                    }
                }
                _ = leader_check.tick() => {
                    let leading = self.leadership.is_leader();
                    // A new leader catches up at once: failover loses nothing.
                    if leading && !was_leader {
                        self.catch_up(&ResourceKind::ALL, &HashSet::new());
                    }
                    was_leader = leading;
                }
                _ = trim.tick() => release_free_heap(),
                _ = expiry.tick() => self.expire(),
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Existing resources whose marker a workload lacks count as created.
    fn replay(&self) {
        let Some(queue) = &self.catch_up else { return };
        let now = tokio::time::Instant::now();
        for (key, r) in self.index.absent_markers() {
            if self.scope.namespace_in_scope(&key.namespace) {
                queue.push(key, r, Event::Create, now, false);
            }
        }
    }

    /// Waits for the first sync of every watch. A kind whose markers can be compared before that (its
    /// watches and the workloads' have synced: ConfigMaps listed while the Secrets still stream) is
    /// caught up at once. Returns the workloads queued so, which the first catch-up of all leaves alone;
    /// `None` on shutdown.
    async fn first_sync(&self, shutdown: &CancellationToken) -> Option<HashSet<WorkloadKey>> {
        let mut progress = self.ready.progress();
        let mut caught_up = HashSet::new();
        let mut compared = 0;
        loop {
            let now = progress.borrow_and_update().clone();
            if now.all {
                return Some(caught_up);
            }
            if now.comparable.len() > compared && self.leadership.is_leader() {
                compared = now.comparable.len();
                let queued = self.catch_up(&now.comparable, &caught_up);
                caught_up.extend(queued);
            }
            tokio::select! {
                changed = progress.changed() => changed.ok()?,
                _ = shutdown.cancelled() => return None,
            }
        }
    }

    /// Re-queues every workload whose marker differs from the current hash, among those whose markers
    /// are all of `kinds` and not in `skip`; returns the workloads queued.
    fn catch_up(&self, kinds: &[ResourceKind], skip: &HashSet<WorkloadKey>) -> Vec<WorkloadKey> {
        let Some(queue) = &self.catch_up else {
            return Vec::new();
        };
        let stale: Vec<_> = self
            .index
            .stale_markers(kinds)
            .into_iter()
            .filter(|(key, _)| {
                !skip.contains(key)
                    && self.scope.namespace_in_scope(&key.namespace)
                    && !self.plan.policy.ignored_workload_types.contains(&key.kind)
            })
            .collect();
        if !stale.is_empty() {
            tracing::info!(
                count = stale.len(),
                kinds = ?kinds,
                "markers differ from current hashes; reloading"
            );
        }
        let now = tokio::time::Instant::now();
        let mut queued = Vec::new();
        for (key, r) in stale {
            // As for a change seen live: a workload nothing else can trigger is reloaded at once.
            let lone = self.index.has_one_trigger(&key);
            queue.push(key.clone(), r, Event::Update, now, lone);
            queued.push(key);
        }
        queued.dedup();
        queued
    }

    /// Expires the index's short-lived records (the sizes are read at scrape time).
    fn expire(&self) {
        self.index.expire_provisional(PROVISIONAL_TTL);
        self.index.expire_recent_changes();
    }
}

/// Hands freed heap memory back to the OS. A list of tens of thousands of objects (the first sync, or a
/// re-list after a watch gap) peaks far above the steady state, and glibc keeps freed pages mapped, so
/// without this RSS would stay at the peak.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::WorkloadKind;
    use crate::index::{ResourceEntry, ResourceKey, WorkloadEntry};
    use crate::reload::queue::QueueConfig;
    use crate::watch::WatchPart;
    use serde_json::json;

    fn deployment(index: &Index, name: &str, markers: &[(&str, &str)]) -> WorkloadKey {
        let env: Vec<_> = markers
            .iter()
            .map(|(var, value)| json!({"name": var, "value": value}))
            .collect();
        let env_from: Vec<_> = markers
            .iter()
            .map(|(var, _)| match *var {
                "STAKATER_CFG_CONFIGMAP" => json!({"configMapRef": {"name": "cfg"}}),
                _ => json!({"secretRef": {"name": "pw"}}),
            })
            .collect();
        let obj = json!({"metadata": {"name": name, "namespace": "ns",
                "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "app", "envFrom": env_from, "env": env}]}}}});
        let key = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: name.into(),
        };
        let entry =
            WorkloadEntry::from_object(&PlanConfig::default(), &obj, WorkloadKind::Deployment);
        index.apply_workload(key.clone(), entry);
        key
    }

    #[tokio::test]
    async fn a_kind_listed_before_the_rest_is_caught_up_at_once_and_only_once() {
        let index = Arc::new(Index::new());
        let cm_only = deployment(&index, "a", &[("STAKATER_CFG_CONFIGMAP", "old")]);
        let both = deployment(
            &index,
            "b",
            &[
                ("STAKATER_CFG_CONFIGMAP", "old"),
                ("STAKATER_PW_SECRET", "old"),
            ],
        );
        let hash = |h: &str| ResourceEntry {
            hash: h.into(),
            flags: Default::default(),
        };
        index.update_resource(
            &ResourceKey::new(ResourceKind::ConfigMap, "ns", "cfg"),
            hash("new"),
        );
        let queue = Arc::new(Queue::new(QueueConfig {
            debounce: Duration::ZERO,
            debounce_max: Duration::ZERO,
            min_interval: Duration::ZERO,
        }));
        let ready = ReadyTracker::new(|| {});
        ready.expect(
            "configmaps/*",
            WatchPart::Resources(ResourceKind::ConfigMap),
        );
        ready.expect("secrets/*", WatchPart::Resources(ResourceKind::Secret));
        ready.expect("Deployment/*", WatchPart::Workloads);
        ready.seal();
        let housekeeping = Housekeeping {
            index: index.clone(),
            catch_up: Some(queue.clone()),
            metrics: Arc::new(Metrics::new(&mut Default::default(), false)),
            scope: Arc::default(),
            plan: PlanConfig::default(),
            ready: ready.clone(),
            leadership: Leadership::always(),
            consistency_interval: Duration::from_secs(3600),
            replay_creates: false,
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(housekeeping.run(shutdown.clone()));
        let next = || async {
            tokio::time::timeout(Duration::from_secs(5), queue.next())
                .await
                .expect("a workload is queued")
                .0
        };

        // ConfigMaps and workloads listed, Secrets still listing: the workload with a ConfigMap's
        // marker only is reloaded now; the one that also has a Secret's marker waits for the Secrets.
        ready.synced("configmaps/*");
        ready.synced("Deployment/*");
        assert_eq!(next().await, cm_only);
        assert_eq!(queue.depth(), 0);

        index.update_resource(
            &ResourceKey::new(ResourceKind::Secret, "ns", "pw"),
            hash("new"),
        );
        ready.synced("secrets/*");
        assert_eq!(next().await, both);
        // The catch-up of all left the first workload alone: it was caught up already.
        assert_eq!(queue.depth(), 0);
        shutdown.cancel();
        task.await.unwrap();
    }
}
