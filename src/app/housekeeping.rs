//! What runs beside the watches and the writer: the catch-up as the first sync proceeds (and on
//! becoming leader), the periodic consistency pass, expiry of the index's short-lived records, and
//! handing freed heap back to the OS.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::index::Index;
use crate::metrics::Metrics;
use crate::reload::catch_up::CatchUp;
use crate::reload::lease::Leadership;
use crate::reload::queue::Found;
use crate::reload::triggers::Triggers;
use crate::watch::ReadyTracker;

/// How long an admission record waits for the watch to confirm it.
const PROVISIONAL_TTL: Duration = Duration::from_secs(60);

/// How often memory freed since the last time is handed back to the OS.
const HEAP_TRIM_INTERVAL: Duration = Duration::from_secs(60);

pub struct Housekeeping {
    pub index: Arc<Index>,
    /// Queues stale workloads; `None` when nothing is reloaded (`--webhook-url`).
    pub catch_up: Option<Arc<CatchUp>>,
    /// Where `--sync-after-restart` replays creates; `None` as for `catch_up`.
    pub triggers: Option<Arc<Triggers>>,
    pub metrics: Arc<Metrics>,
    pub ready: Arc<ReadyTracker>,
    pub leadership: Leadership,
    pub consistency_interval: Duration,
    /// Reloader's `--sync-after-restart` replay.
    pub replay_creates: bool,
}

impl Housekeeping {
    pub async fn run(self, shutdown: CancellationToken) {
        if self.first_sync(&shutdown).await.is_none() {
            return;
        }
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
                // The first tick is the catch-up of all, less what the first sync caught up.
                _ = consistency.tick() => self.catch_up_all().await,
                _ = leader_check.tick() => {
                    let leading = self.leadership.is_leader();
                    // A new leader catches up at once: failover loses nothing.
                    if leading && !was_leader {
                        self.catch_up_all().await;
                    }
                    was_leader = leading;
                }
                _ = trim.tick() => release_free_heap(),
                _ = expiry.tick() => self.expire(),
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// On a blocking thread: at 100,000 workloads a pass is a tenth of a second of CPU, which would
    /// otherwise keep one of the runtime's workers from the watches and the writer.
    async fn catch_up_all(&self) {
        let Some(catch_up) = self.catch_up.clone() else {
            return;
        };
        let metrics = self.metrics.clone();
        let pass = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            if catch_up.all() {
                metrics
                    .consistency_pass_duration
                    .observe(started.elapsed().as_secs_f64());
            }
        });
        match pass.await {
            // Carried on into this task, so that its supervisor sees it as before.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Not started: the runtime is shutting down.
            _ => {}
        }
    }

    /// Existing resources whose marker a workload lacks count as created.
    fn replay(&self) {
        let Some(triggers) = &self.triggers else {
            return;
        };
        let now = tokio::time::Instant::now();
        for (key, r) in self.index.absent_markers() {
            triggers.push(&[key], &r, now, Found::Compared);
        }
    }

    /// Waits for the first sync of every watch, handing each kind to the catch-up as soon as it has
    /// listed (workloads listed later are compared as they arrive). `None` on shutdown.
    async fn first_sync(&self, shutdown: &CancellationToken) -> Option<()> {
        let mut progress = self.ready.progress();
        loop {
            let now = progress.borrow_and_update().clone();
            if now.all {
                return Some(());
            }
            if let Some(catch_up) = &self.catch_up {
                catch_up.kinds_listed(&now.listed);
            }
            tokio::select! {
                changed = progress.changed() => changed.ok()?,
                _ = shutdown.cancelled() => return None,
            }
        }
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
    use crate::core::plan::PlanConfig;
    use crate::core::{ResourceKind, WorkloadKind};
    use crate::index::{ResourceEntry, ResourceKey, WorkloadEntry, WorkloadKey};
    use crate::reload::queue::{Queue, QueueConfig};
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
    async fn workloads_are_caught_up_as_their_kinds_and_they_are_listed_and_only_once() {
        let index = Arc::new(Index::new());
        // Listed before the ConfigMaps: compared when they have listed.
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
            None,
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
        let triggers = Triggers::for_tests(index.clone(), queue.clone());
        let catch_up = CatchUp::new(index.clone(), triggers.clone(), Leadership::always());
        let housekeeping = Housekeeping {
            index: index.clone(),
            catch_up: Some(catch_up.clone()),
            triggers: Some(triggers),
            metrics: Arc::new(Metrics::new(&mut Default::default(), false)),
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

        // ConfigMaps listed, Secrets and Deployments still listing: the workload with a ConfigMap's
        // marker only is reloaded now; the one that also has a Secret's marker waits for the Secrets.
        ready.synced("configmaps/*");
        assert_eq!(next().await, cm_only);
        assert_eq!(queue.depth(), 0);

        // The Deployments' list goes on: a stale workload is queued as it arrives, a current one not.
        let late = deployment(&index, "c", &[("STAKATER_CFG_CONFIGMAP", "old")]);
        catch_up.workload_listed(&late);
        assert_eq!(next().await, late);
        let current = deployment(&index, "d", &[("STAKATER_CFG_CONFIGMAP", "new")]);
        catch_up.workload_listed(&current);
        let late_both = deployment(
            &index,
            "e",
            &[
                ("STAKATER_CFG_CONFIGMAP", "old"),
                ("STAKATER_PW_SECRET", "old"),
            ],
        );
        catch_up.workload_listed(&late_both);
        // Listed twice (its watch restarted within the first list): queued once.
        catch_up.workload_listed(&late);
        assert_eq!(queue.depth(), 0);

        index.update_resource(
            &ResourceKey::new(ResourceKind::Secret, "ns", "pw"),
            hash("new"),
            None,
        );
        ready.synced("secrets/*");
        let mut queued = vec![next().await, next().await];
        queued.sort();
        assert_eq!(queued, [both, late_both]);
        ready.synced("Deployment/*");
        // The catch-up of all left alone every workload queued during the first sync.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(queue.depth(), 0);
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_replica_that_does_not_lead_catches_up_nothing_until_it_leads() {
        let index = Arc::new(Index::new());
        let stale = deployment(&index, "a", &[("STAKATER_CFG_CONFIGMAP", "old")]);
        index.update_resource(
            &ResourceKey::new(ResourceKind::ConfigMap, "ns", "cfg"),
            ResourceEntry {
                hash: "new".into(),
                flags: Default::default(),
            },
            None,
        );
        let queue = Arc::new(Queue::new(QueueConfig {
            debounce: Duration::ZERO,
            debounce_max: Duration::ZERO,
            min_interval: Duration::ZERO,
        }));
        let (lead, leading) = tokio::sync::watch::channel(None);
        let catch_up = CatchUp::new(
            index.clone(),
            Triggers::for_tests(index.clone(), queue.clone()),
            Leadership::from_channel(leading),
        );
        catch_up.kinds_listed(&[ResourceKind::ConfigMap]);
        catch_up.workload_listed(&stale);
        assert!(
            !catch_up.all(),
            "a replica that does not lead compares nothing"
        );
        assert_eq!(queue.depth(), 0);
        lead.send(Some(crate::reload::lease::forever())).unwrap();
        assert!(catch_up.all());
        assert_eq!(queue.next().await.0, stale);
    }
}
