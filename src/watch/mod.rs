//! Watches: ConfigMaps and Secrets (hashed on arrival, object dropped), workloads (references and a
//! skeleton kept, object dropped), Namespaces (with `--namespace-selector`) and the CSI driver's
//! objects. Each is a [`driver::Handler`] run by the one [`driver::run`] loop; what a change triggers
//! goes to the [`Sink`] chosen at start-up.

pub mod digests;
mod driver;
mod handlers;
mod pods;
mod protobuf;
mod workload_object;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::discovery::ApiResource;
use kube::runtime::watcher;
use kube::Client;
use tokio::time::Instant;

pub use driver::{WatchId, Watched};
pub use handlers::{namespaces, optional_workloads, resources, spcps, spcs, workloads};
pub use pods::pods;

use crate::config::scope::ScopeFilter;
use crate::core::plan::PlanConfig;
use crate::core::policy::ResourceFlags;
use crate::core::refs::ResourceRef;
use crate::core::ResourceKind;
use crate::index::{Index, ResourceKey, WorkloadKey};
use crate::metrics::{Metrics, Processed};
use crate::outbound::notify::Notifier;
use crate::reload::catch_up::CatchUp;
use crate::reload::queue::Found;
use crate::reload::rollouts::Rollouts;
use crate::reload::triggers::Triggers;

/// What a watch contributes to the first sync, for the catch-up that compares markers with hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchPart {
    /// The namespace watch of `--namespace-selector`: which namespaces are in scope.
    Scope,
    /// A workload watch: the markers.
    Workloads,
    /// A watch of one kind of resource: its current hashes.
    Resources(ResourceKind),
}

/// How far the first sync is: what the housekeeping's catch-up may compare yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncProgress {
    /// Kinds whose markers can be compared before everything has synced: every watch of the kind and
    /// the scope have synced (workloads are compared as they are listed). ConfigMaps and Secrets only
    /// (the CSI watches are not waited for).
    pub listed: Vec<ResourceKind>,
    /// Every workload watch and the scope have synced: every canary and halt is known (the writer
    /// waits for it, so a reload owed from before a start honours them).
    pub workloads: bool,
    /// Every watch of the start-up has synced: ready.
    pub all: bool,
}

/// Counts watches that finished their first list; ready when all have. Watches register with
/// [`ReadyTracker::expect`] and the start-up code [`ReadyTracker::seal`]s the set once every watch is
/// registered: a watch that syncs before the others are registered must not make the process ready.
pub struct ReadyTracker {
    state: Mutex<Expected>,
    /// Called once when ready (the admin server's readiness).
    on_ready: Box<dyn Fn() + Send + Sync>,
    progress: tokio::sync::watch::Sender<SyncProgress>,
}

#[derive(Default)]
struct Expected {
    pending: HashMap<String, WatchPart>,
    sealed: bool,
}

impl Expected {
    fn progress(&self) -> SyncProgress {
        if !self.sealed {
            return SyncProgress::default();
        }
        let waiting = |part: WatchPart| self.pending.values().any(|p| *p == part);
        let scope_known = !waiting(WatchPart::Scope);
        SyncProgress {
            listed: [ResourceKind::ConfigMap, ResourceKind::Secret]
                .into_iter()
                .filter(|k| scope_known && !waiting(WatchPart::Resources(*k)))
                .collect(),
            workloads: scope_known && !waiting(WatchPart::Workloads),
            all: self.pending.is_empty(),
        }
    }
}

impl ReadyTracker {
    pub fn new(on_ready: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            on_ready: Box::new(on_ready),
            progress: tokio::sync::watch::Sender::new(SyncProgress::default()),
        })
    }

    pub fn expect(&self, name: &str, part: WatchPart) {
        self.lock().pending.insert(name.to_string(), part);
    }

    /// Every watch of the start-up is registered: ready as soon as (or if already) all have synced.
    /// Watches registered later (an optional API appearing) never make a ready process unready.
    pub fn seal(&self) {
        let mut state = self.lock();
        state.sealed = true;
        self.publish(&state);
    }

    pub(crate) fn synced(&self, name: &str) {
        let mut state = self.lock();
        if state.pending.remove(name).is_some() {
            self.publish(&state);
        }
    }

    /// The first sync's progress, as it happens.
    pub fn progress(&self) -> tokio::sync::watch::Receiver<SyncProgress> {
        self.progress.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Expected> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the progress once sealed; the first time everything has synced, the process is ready.
    /// Once all has been published, later watches (an optional API appearing) change nothing.
    fn publish(&self, state: &Expected) {
        if self.progress.borrow().all {
            return;
        }
        let progress = state.progress();
        let ready = progress.all;
        self.progress.send_if_modified(|p| {
            let changed = *p != progress;
            *p = progress;
            changed
        });
        if ready {
            (self.on_ready)();
        }
    }
}

/// Where the workloads a change triggers go, chosen once at start-up.
pub enum Sink {
    /// Reload them: the triggers of the coalescing queue in front of the writer (changes, and the
    /// ends of pauses), and the rollout budget (which follows workload status).
    Reload {
        triggers: Arc<Triggers>,
        rollouts: Arc<Rollouts>,
    },
    /// `--webhook-url`: POST what would reload; no workload is touched.
    Notify(Arc<Notifier>),
}

impl Sink {
    /// The way into the reload queue; none when changes are only notified.
    pub fn triggers(&self) -> Option<&Arc<Triggers>> {
        match self {
            Sink::Reload { triggers, .. } => Some(triggers),
            Sink::Notify(_) => None,
        }
    }
}

/// A resource change, as the sink needs it.
struct Changed<'a> {
    key: &'a ResourceKey,
    hash: &'a str,
    flags: ResourceFlags,
    observed: Instant,
    /// The object's resourceVersion, as a number.
    version: Option<u64>,
}

pub struct Ctx {
    pub plan: PlanConfig,
    pub index: Arc<Index>,
    pub sink: Sink,
    pub metrics: Arc<Metrics>,
    pub scope: Arc<ScopeFilter>,
    pub ready: Arc<ReadyTracker>,
    /// First state streamed as watch events (`--streaming-lists`) rather than listed in pages.
    pub streaming_lists: bool,
    /// Compares each workload of a first list with the current hashes; `None` with `--webhook-url`.
    pub catch_up: Option<Arc<CatchUp>>,
}

impl Ctx {
    /// A context that reloads through a queue without debounce and plans with the defaults.
    #[cfg(test)]
    pub(crate) fn for_tests(ready: Arc<ReadyTracker>, streaming_lists: bool) -> Self {
        use crate::reload::queue::{Queue, QueueConfig};
        use std::time::Duration;
        let index = Arc::new(Index::new());
        let scope = Arc::new(ScopeFilter::default());
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let queue = Arc::new(Queue::new(QueueConfig {
            debounce: Duration::ZERO,
            debounce_max: Duration::ZERO,
            min_interval: Duration::ZERO,
        }));
        Self {
            plan: PlanConfig::default(),
            index: index.clone(),
            sink: Sink::Reload {
                triggers: Triggers::new(index, queue, scope.clone(), metrics.clone()),
                rollouts: Rollouts::new(0, Duration::ZERO, false, scope.clone(), metrics.clone()),
            },
            metrics,
            scope,
            ready,
            streaming_lists,
            catch_up: None,
        }
    }

    /// A watcher configuration with the first-state strategy of `--streaming-lists`.
    pub fn list_config(&self, config: watcher::Config) -> watcher::Config {
        if self.streaming_lists {
            config.streaming_lists()
        } else {
            config
        }
    }

    /// Hands the workloads a change triggers to the sink; returns the `result` label of
    /// `reloader_events_processed_total`.
    fn triggered(&self, dependents: &[WorkloadKey], change: Changed<'_>) -> Processed {
        match &self.sink {
            Sink::Notify(notifier) => {
                self.notify(notifier, dependents, &change);
                Processed::Notified
            }
            Sink::Reload { triggers, .. } => {
                let resource = ResourceRef {
                    kind: change.key.kind,
                    name: change.key.name.clone(),
                };
                triggers.push(
                    dependents,
                    &resource,
                    change.observed,
                    Found::Event(change.version),
                );
                Processed::Queued
            }
        }
    }

    fn notify(&self, notifier: &Notifier, dependents: &[WorkloadKey], change: &Changed<'_>) {
        let key = change.key;
        let in_scope: Vec<WorkloadKey> = dependents
            .iter()
            .filter(|w| self.scope.covers(w.kind, &w.namespace))
            .cloned()
            .collect();
        let workloads = Notifier::would_reload(
            &self.plan.policy,
            &self.index,
            &in_scope,
            key.kind,
            &key.name,
            change.flags,
        );
        for w in dependents {
            self.metrics.scanned(w.kind);
        }
        for w in &workloads {
            self.metrics.matched(w.kind);
        }
        notifier.send(Notifier::payload(
            key.kind,
            &key.namespace,
            &key.name,
            change.hash,
            &workloads,
        ));
    }

    /// A workload the index had not confirmed yet may have been created just before a change of a
    /// resource it uses was handled (the two watches are not ordered, and a generateName workload is
    /// unknown until the watch names it): reload it now rather than at the next consistency pass, or
    /// never (a workload without markers).
    fn reload_if_stale(&self, key: &WorkloadKey, created_at: Option<i64>) {
        let Sink::Reload { triggers, .. } = &self.sink else {
            return;
        };
        let now = Instant::now();
        for r in self.index.missed_changes_of(key, created_at) {
            tracing::info!(workload = %key, resource = %r.name, "new workload missed a change of a resource it uses; reloading");
            triggers.push(std::slice::from_ref(key), &r, now, Found::Compared);
        }
    }
}

/// Polls discovery until `ar` is served: an absent optional API is a warning, not a failure.
pub async fn wait_for_api(client: &Client, ar: &ApiResource) {
    let mut warned = false;
    loop {
        match client.list_api_group_resources(&ar.api_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == ar.plural) => return,
            Ok(_) | Err(_) => {
                if !warned {
                    tracing::warn!(api = %ar.api_version, resource = %ar.plural, "optional API not served; its watch starts when it appears");
                    warned = true;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::admin::Health;

    #[test]
    fn ready_only_once_sealed_and_every_registered_watch_synced() {
        let health = Arc::new(Health::default());
        let tracker = ReadyTracker::new({
            let health = health.clone();
            move || health.set_ready(true)
        });
        let cms = WatchPart::Resources(ResourceKind::ConfigMap);
        tracker.expect("configmaps/a", cms);
        // The first watch syncs before the second one registered: not ready.
        tracker.synced("configmaps/a");
        assert!(!health.is_ready());
        tracker.expect("secrets/a", WatchPart::Resources(ResourceKind::Secret));
        tracker.seal();
        assert!(!health.is_ready());
        tracker.synced("secrets/a");
        assert!(health.is_ready());
        assert!(tracker.progress().borrow().all);
        // An optional API appearing later does not take readiness away.
        tracker.expect("Rollout/a", WatchPart::Workloads);
        assert!(health.is_ready());
        assert!(tracker.progress().borrow().all);

        let quick_health = Arc::new(Health::default());
        let quick = ReadyTracker::new({
            let health = quick_health.clone();
            move || health.set_ready(true)
        });
        quick.expect("configmaps/*", cms);
        quick.synced("configmaps/*");
        assert!(!quick_health.is_ready());
        quick.seal();
        assert!(quick_health.is_ready());
    }

    #[test]
    fn a_kind_is_listed_once_its_watches_and_the_scope_synced() {
        let tracker = ReadyTracker::new(|| {});
        let progress = tracker.progress();
        let listed = || progress.borrow().listed.clone();
        tracker.expect("namespaces", WatchPart::Scope);
        for ns in ["a", "b"] {
            tracker.expect(
                &format!("configmaps/{ns}"),
                WatchPart::Resources(ResourceKind::ConfigMap),
            );
            tracker.expect(
                &format!("secrets/{ns}"),
                WatchPart::Resources(ResourceKind::Secret),
            );
            tracker.expect(&format!("Deployment/{ns}"), WatchPart::Workloads);
        }
        tracker.synced("configmaps/a");
        tracker.synced("configmaps/b");
        tracker.synced("Deployment/a");
        // Not sealed: more watches may come.
        assert!(listed().is_empty());
        tracker.seal();
        // The scope is not known yet.
        assert!(listed().is_empty());
        tracker.synced("namespaces");
        assert_eq!(listed(), [ResourceKind::ConfigMap]);
        // One workload watch still lists: a canary or a halt there is not known yet.
        assert!(!progress.borrow().workloads);
        tracker.synced("Deployment/b");
        assert!(progress.borrow().workloads);
        tracker.synced("secrets/a");
        assert_eq!(listed(), [ResourceKind::ConfigMap]);
        assert!(!progress.borrow().all);
        tracker.synced("secrets/b");
        assert_eq!(listed(), [ResourceKind::ConfigMap, ResourceKind::Secret]);
        assert!(progress.borrow().all);
    }

    #[test]
    fn a_kind_is_listed_while_the_workload_watches_still_list() {
        let tracker = ReadyTracker::new(|| {});
        tracker.expect(
            "configmaps/*",
            WatchPart::Resources(ResourceKind::ConfigMap),
        );
        tracker.expect("secrets/*", WatchPart::Resources(ResourceKind::Secret));
        tracker.expect("Deployment/*", WatchPart::Workloads);
        tracker.seal();
        tracker.synced("configmaps/*");
        assert_eq!(
            tracker.progress().borrow().listed,
            [ResourceKind::ConfigMap]
        );
        tracker.synced("secrets/*");
        assert_eq!(
            tracker.progress().borrow().listed,
            [ResourceKind::ConfigMap, ResourceKind::Secret]
        );
        // Listed is not ready: the workloads are still listing.
        assert!(!tracker.progress().borrow().all);
        tracker.synced("Deployment/*");
        assert!(tracker.progress().borrow().all);
    }
}
