//! Watches: ConfigMaps and Secrets (hashed on arrival, object dropped), workloads (references and a
//! skeleton kept, object dropped), Namespaces (with `--namespace-selector`) and the CSI driver's
//! objects. Each is a [`driver::Handler`] run by the one [`driver::run`] loop; what a change triggers
//! goes to the [`Sink`] chosen at start-up.

mod driver;
mod handlers;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use kube::discovery::ApiResource;
use kube::runtime::watcher;
use kube::Client;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use handlers::{namespaces, optional_workloads, resources, spcps, spcs, workloads};

use crate::config::scope::ScopeFilter;
use crate::core::plan::{Event, PlanConfig};
use crate::core::policy::ResourceFlags;
use crate::core::refs::ResourceRef;
use crate::core::ResourceKind;
use crate::index::{Index, ResourceKey, WorkloadKey};
use crate::metrics::Metrics;
use crate::outbound::notify::Notifier;
use crate::reload::pause::PauseReconciler;
use crate::reload::queue::{Pushed, Queue};

/// Counts watches that finished their first list; ready when all have. Watches register with
/// [`ReadyTracker::expect`] and the start-up code [`ReadyTracker::seal`]s the set once every watch is
/// registered: a watch that syncs before the others are registered must not make the process ready.
pub struct ReadyTracker {
    state: Mutex<Expected>,
    /// Called once when ready (the admin server's readiness).
    on_ready: Box<dyn Fn() + Send + Sync>,
    pub all_synced: Notify,
}

#[derive(Default)]
struct Expected {
    pending: HashSet<String>,
    sealed: bool,
}

impl ReadyTracker {
    pub fn new(on_ready: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            on_ready: Box::new(on_ready),
            all_synced: Notify::new(),
        })
    }

    pub fn expect(&self, name: &str) {
        self.lock().pending.insert(name.to_string());
    }

    /// Every watch of the start-up is registered: ready as soon as (or if already) all have synced.
    /// Watches registered later (an optional API appearing) never make a ready process unready.
    pub fn seal(&self) {
        let mut state = self.lock();
        state.sealed = true;
        if state.pending.is_empty() {
            self.fire();
        }
    }

    fn synced(&self, name: &str) {
        let mut state = self.lock();
        if state.pending.remove(name) && state.pending.is_empty() && state.sealed {
            self.fire();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Expected> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fire(&self) {
        (self.on_ready)();
        self.all_synced.notify_waiters();
        self.all_synced.notify_one();
    }
}

/// Where the workloads a change triggers go, chosen once at start-up.
pub enum Sink {
    /// Reload them: the coalescing queue in front of the writer, and the resumer of paused Deployments.
    Reload {
        queue: Arc<Queue>,
        pause: Arc<PauseReconciler>,
    },
    /// `--webhook-url`: POST what would reload; no workload is touched.
    Notify(Arc<Notifier>),
}

/// A resource change, as the sink needs it.
struct Changed<'a> {
    key: &'a ResourceKey,
    hash: &'a str,
    flags: ResourceFlags,
    event: Event,
    observed: Instant,
    /// The apiserver's time of the write (absent for deletes).
    written_at: Option<i64>,
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
}

impl Ctx {
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
    fn triggered(&self, dependents: &[WorkloadKey], change: Changed<'_>) -> &'static str {
        match &self.sink {
            Sink::Notify(notifier) => {
                self.notify(notifier, dependents, &change);
                "notified"
            }
            Sink::Reload { queue, .. } => {
                if let Some(at) = change.written_at {
                    self.index.record_change(change.key, at);
                }
                self.enqueue(
                    queue,
                    dependents,
                    change.key.kind,
                    &change.key.name,
                    change.event,
                    change.observed,
                );
                "queued"
            }
        }
    }

    fn notify(&self, notifier: &Notifier, dependents: &[WorkloadKey], change: &Changed<'_>) {
        let key = change.key;
        if !self.scope.namespace_in_scope(&key.namespace) {
            return;
        }
        let in_scope: Vec<WorkloadKey> = dependents
            .iter()
            .filter(|w| !self.plan.policy.ignored_workload_types.contains(&w.kind))
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
            self.metrics.scanned(w.kind.name());
        }
        for w in &workloads {
            self.metrics.matched(w.kind.name());
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
        let Sink::Reload { queue, .. } = &self.sink else {
            return;
        };
        let now = Instant::now();
        for r in self.index.missed_changes_of(key, created_at) {
            tracing::info!(workload = %key, resource = %r.name, "new workload missed a change of a resource it uses; reloading");
            self.enqueue(
                queue,
                std::slice::from_ref(key),
                r.kind,
                &r.name,
                Event::Update,
                now,
            );
        }
    }

    fn enqueue(
        &self,
        queue: &Queue,
        dependents: &[WorkloadKey],
        kind: ResourceKind,
        name: &str,
        event: Event,
        observed: Instant,
    ) {
        for w in dependents {
            self.metrics.scanned(w.kind.name());
            if !self.scope.namespace_in_scope(&w.namespace)
                || self.plan.policy.ignored_workload_types.contains(&w.kind)
            {
                self.metrics.skip("ignored_or_not_selected");
                continue;
            }
            self.metrics.matched(w.kind.name());
            let r = ResourceRef {
                kind,
                name: name.to_string(),
            };
            let lone = self.index.has_one_trigger(w);
            if queue.push(w.clone(), r, event, observed, lone) == Pushed::Coalesced {
                self.metrics.reloads_coalesced.inc();
            }
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
        tracker.expect("configmaps/a");
        // The first watch syncs before the second one registered: not ready.
        tracker.synced("configmaps/a");
        assert!(!health.is_ready());
        tracker.expect("secrets/a");
        tracker.seal();
        assert!(!health.is_ready());
        tracker.synced("secrets/a");
        assert!(health.is_ready());
        // An optional API appearing later does not take readiness away.
        tracker.expect("Rollout/a");
        assert!(health.is_ready());

        let quick_health = Arc::new(Health::default());
        let quick = ReadyTracker::new({
            let health = quick_health.clone();
            move || health.set_ready(true)
        });
        quick.expect("configmaps/*");
        quick.synced("configmaps/*");
        assert!(!quick_health.is_ready());
        quick.seal();
        assert!(quick_health.is_ready());
    }
}
