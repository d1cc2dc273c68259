//! Watch loops: ConfigMaps and Secrets (hash on arrival, object dropped), workloads (references
//! extracted, object dropped) and, with `--namespace-selector`, Namespaces.
//!
//! Re-list bookkeeping: the first list of a watch never triggers anything; after a watch gap, a re-list
//! triggers for changed hashes and treats anything missing from it as deleted.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use kube::runtime::watcher::{self, watcher, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::scope::ScopeFilter;
use crate::core::kinds::csi;
use crate::core::plan::{Event, PlanConfig};
use crate::core::policy::ResourceFlags;
use crate::core::refs::ResourceRef;
use crate::core::{ResourceKind, WorkloadKind};
use crate::index::{Index, ResourceEntry, ResourceKey, WorkloadEntry, WorkloadKey};
use crate::metrics::{Metrics, WatchLabels};
use crate::outbound::notify::Notifier;
use crate::reload::pause::PauseReconciler;
use crate::reload::queue::{Pushed, Queue};
use crate::server::admin::Health;

/// Counts watches that finished their first list; ready when all have. Watches register with
/// [`ReadyTracker::expect`] and the start-up code [`ReadyTracker::seal`]s the set once every watch is
/// registered: a watch that syncs before the others are registered must not make the process ready.
pub struct ReadyTracker {
    state: Mutex<Expected>,
    health: Arc<Health>,
    pub all_synced: Notify,
}

#[derive(Default)]
struct Expected {
    pending: HashSet<String>,
    sealed: bool,
}

impl ReadyTracker {
    pub fn new(health: Arc<Health>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            health,
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
        self.health.set_ready(true);
        self.all_synced.notify_waiters();
        self.all_synced.notify_one();
    }
}

pub struct Ctx {
    pub plan: PlanConfig,
    pub index: Arc<Index>,
    pub queue: Arc<Queue>,
    pub metrics: Arc<Metrics>,
    pub scope: Arc<ScopeFilter>,
    pub ready: Arc<ReadyTracker>,
    /// Resumes Deployments paused by rekindle (absent when no workload is ever written).
    pub pause: Option<Arc<PauseReconciler>>,
    /// `--webhook-url` mode: changes are POSTed instead of reloading.
    pub notifier: Option<Arc<Notifier>>,
    /// CSI: ignore/match flags of SecretProviderClasses, by (namespace, name).
    pub spc_flags: Mutex<std::collections::HashMap<(String, String), ResourceFlags>>,
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

    fn notify(
        &self,
        dependents: &[WorkloadKey],
        key: &ResourceKey,
        hash: &str,
        flags: ResourceFlags,
    ) -> bool {
        let Some(notifier) = &self.notifier else {
            return false;
        };
        if !self.scope.namespace_in_scope(&key.namespace) {
            return true;
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
            flags,
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
            hash,
            &workloads,
        ));
        true
    }

    /// A workload the index had not confirmed yet may have been created just before a change of a
    /// resource it uses was handled (the two watches are not ordered, and a generateName workload is
    /// unknown until the watch names it): reload it now rather than at the next consistency pass, or
    /// never (a workload without markers).
    fn reload_if_stale(&self, key: &WorkloadKey, created_at: Option<i64>) {
        if self.notifier.is_some() {
            return;
        }
        let now = Instant::now();
        for r in self.index.missed_changes_of(key, created_at) {
            tracing::info!(workload = %key, resource = %r.name, "new workload missed a change of a resource it uses; reloading");
            self.enqueue(
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
            if self.queue.push(w.clone(), r, event, observed, lone) == Pushed::Coalesced {
                self.metrics.reloads_coalesced.inc();
            }
        }
    }
}

fn flags_of<K: Resource>(plan: &PlanConfig, obj: &K) -> ResourceFlags {
    ResourceFlags::from_annotations(&plan.policy.keys, obj.annotations())
}

/// Watches one kind of configuration resource. `hash` computes Reloader's hash of an object.
pub async fn resources<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: ResourceKind,
    label: &'static str,
    namespace: Option<String>,
    hash: fn(&K) -> String,
    ctx: Arc<Ctx>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let watch_name = format!("{label}/{}", namespace.as_deref().unwrap_or("*"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut first_sync = true;
    let mut seen: HashSet<ResourceKey> = HashSet::new();
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                ctx.metrics
                    .watch_restarts
                    .get_or_create(&WatchLabels {
                        resource: label.into(),
                    })
                    .inc();
                tracing::warn!(watch = %watch_name, error = %e, "watch failed; retrying with backoff");
                continue;
            }
        };
        match event {
            WatchEvent::Init => seen.clear(),
            WatchEvent::InitApply(obj) => {
                let key =
                    ResourceKey::new(kind, &obj.namespace().unwrap_or_default(), &obj.name_any());
                seen.insert(key.clone());
                upsert(
                    &ctx,
                    key,
                    hash(&obj),
                    flags_of(&ctx.plan, &obj),
                    (!first_sync).then(|| last_write(obj.meta())),
                    label,
                );
            }
            WatchEvent::InitDone => {
                if !first_sync {
                    for key in ctx.index.resource_keys(kind, namespace.as_deref()) {
                        if !seen.contains(&key) {
                            remove(&ctx, &key, label);
                        }
                    }
                }
                seen.clear();
                if first_sync {
                    first_sync = false;
                    tracing::info!(watch = %watch_name, "synced");
                    ctx.ready.synced(&watch_name);
                }
            }
            WatchEvent::Apply(obj) => {
                let key =
                    ResourceKey::new(kind, &obj.namespace().unwrap_or_default(), &obj.name_any());
                upsert(
                    &ctx,
                    key,
                    hash(&obj),
                    flags_of(&ctx.plan, &obj),
                    Some(last_write(obj.meta())),
                    label,
                );
            }
            WatchEvent::Delete(obj) => {
                let key =
                    ResourceKey::new(kind, &obj.namespace().unwrap_or_default(), &obj.name_any());
                remove(&ctx, &key, label);
            }
        }
    }
}

/// When the apiserver last wrote the object (Unix seconds): the newest managedFields time, else now.
fn last_write(meta: &ObjectMeta) -> i64 {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.time.as_ref())
        .map(|t| t.0.as_second())
        .max()
        .unwrap_or_else(|| jiff::Timestamp::now().as_second())
}

/// Records a resource; `written_at` is `Some` (the time of the write) when a change may trigger reloads,
/// `None` during the first list.
fn upsert(
    ctx: &Ctx,
    key: ResourceKey,
    hash: String,
    flags: ResourceFlags,
    written_at: Option<i64>,
    label: &str,
) {
    let observed = Instant::now();
    let update = ctx.index.update_resource(
        &key,
        ResourceEntry {
            hash: hash.as_str().into(),
            flags,
        },
    );
    let Some(written_at) = written_at else {
        return;
    };
    let event = if update.previous.is_some() {
        Event::Update
    } else {
        Event::Create
    };
    ctx.metrics.event(
        if event == Event::Create {
            "add"
        } else {
            "update"
        },
        label,
    );
    let event_type = if event == Event::Create {
        "add"
    } else {
        "update"
    };
    if update.previous.is_some_and(|p| *p.hash == *hash) {
        // Labels, annotations or metadata only: nothing a pod sees has changed.
        ctx.metrics.skip("no_data_change");
        ctx.metrics.processed(event_type, label, "no_data_change");
        return;
    }
    if event == Event::Create && !ctx.plan.reload_on_create {
        ctx.metrics.processed(event_type, label, "event_disabled");
        return;
    }
    if ctx.notify(&update.dependents, &key, &hash, flags) {
        ctx.metrics.processed(event_type, label, "notified");
        ctx.metrics.reconciled(observed.elapsed().as_secs_f64());
        return;
    }
    ctx.index.record_change(&key, written_at);
    ctx.enqueue(&update.dependents, key.kind, &key.name, event, observed);
    ctx.metrics.processed(event_type, label, "queued");
    ctx.metrics.reconciled(observed.elapsed().as_secs_f64());
}

fn remove(ctx: &Ctx, key: &ResourceKey, label: &str) {
    let observed = Instant::now();
    let update = ctx.index.remove_resource(key);
    ctx.metrics.event("delete", label);
    if !ctx.plan.reload_on_delete {
        ctx.metrics.processed("delete", label, "event_disabled");
        return;
    }
    let hash = crate::core::hash::delete_marker_hash();
    let result = if ctx.notify(
        &update.dependents,
        key,
        &hash,
        update.previous.map(|p| p.flags).unwrap_or_default(),
    ) {
        "notified"
    } else {
        ctx.enqueue(
            &update.dependents,
            key.kind,
            &key.name,
            Event::Delete,
            observed,
        );
        "queued"
    };
    ctx.metrics.processed("delete", label, result);
    ctx.metrics.reconciled(observed.elapsed().as_secs_f64());
}

/// Watches one workload kind, keeping only references, policy annotations and markers.
pub async fn workloads(
    client: Client,
    kind: WorkloadKind,
    namespace: Option<String>,
    ctx: Arc<Ctx>,
) {
    let ar = kind.api_resource();
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    };
    let watch_name = format!("{}/{}", kind.name(), namespace.as_deref().unwrap_or("*"));
    let mut stream = watcher(api, ctx.list_config(watcher::Config::default()))
        .default_backoff()
        .boxed();
    let mut first_sync = true;
    let mut seen: HashSet<WorkloadKey> = HashSet::new();
    let key_of = |obj: &DynamicObject| WorkloadKey {
        kind,
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    };
    // `check_stale`: the first sync is followed by a full catch-up; later sightings are checked here.
    let apply = |obj: &DynamicObject, check_stale: bool| match serde_json::to_value(obj) {
        Ok(value) => {
            let key = key_of(obj);
            if let Some(pause) = &ctx.pause {
                pause.observe(&key, &value);
            }
            let new = ctx.index.apply_workload(
                key.clone(),
                WorkloadEntry::from_stored(&ctx.plan, &value, kind),
            );
            if new && check_stale {
                let created_at = obj.metadata.creation_timestamp.as_ref();
                ctx.reload_if_stale(&key, created_at.map(|t| t.0.as_second()));
            }
        }
        Err(e) => tracing::warn!(error = %e, "workload does not serialise; skipped"),
    };
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                ctx.metrics
                    .watch_restarts
                    .get_or_create(&WatchLabels {
                        resource: kind.name().to_ascii_lowercase(),
                    })
                    .inc();
                tracing::warn!(watch = %watch_name, error = %e, "watch failed; retrying with backoff");
                continue;
            }
        };
        match event {
            WatchEvent::Init => seen.clear(),
            WatchEvent::InitApply(obj) => {
                seen.insert(key_of(&obj));
                apply(&obj, !first_sync);
            }
            WatchEvent::InitDone => {
                if !first_sync {
                    for key in ctx.index.workload_keys(kind, namespace.as_deref()) {
                        if !seen.contains(&key) {
                            ctx.index.delete_workload(&key);
                        }
                    }
                }
                seen.clear();
                if first_sync {
                    first_sync = false;
                    tracing::info!(watch = %watch_name, "synced");
                    ctx.ready.synced(&watch_name);
                }
            }
            WatchEvent::Apply(obj) => apply(&obj, !first_sync),
            WatchEvent::Delete(obj) => ctx.index.delete_workload(&key_of(&obj)),
        }
    }
}

/// Watches an optional workload API (Argo Rollouts, DeploymentConfigs): absent is a warning, and the
/// watch starts when the API appears. Readiness never waits for it.
pub async fn optional_workloads(
    client: Client,
    kind: WorkloadKind,
    namespace: Option<String>,
    ctx: Arc<Ctx>,
) {
    let ar = kind.api_resource();
    wait_for_api(&client, &ar).await;
    tracing::info!(kind = %kind, "optional API served; watching it");
    ctx.ready.expect(&format!(
        "{}/{}",
        kind.name(),
        namespace.as_deref().unwrap_or("*")
    ));
    workloads(client, kind, namespace, ctx).await;
}

/// Keeps the namespace selector's matching set current, so namespaces that start or stop matching take
/// effect without a restart.
pub async fn namespaces(client: Client, ctx: Arc<Ctx>) {
    let api: Api<Namespace> = Api::all(client);
    let mut stream = watcher(api, ctx.list_config(watcher::Config::default()))
        .default_backoff()
        .boxed();
    let mut first_sync = true;
    let labels = |ns: &Namespace| {
        ns.labels()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(WatchEvent::Apply(ns)) | Ok(WatchEvent::InitApply(ns)) => {
                ctx.metrics.event("update", "namespaces");
                ctx.scope.observe_namespace(&ns.name_any(), &labels(&ns));
            }
            Ok(WatchEvent::Delete(ns)) => ctx.scope.forget_namespace(&ns.name_any()),
            Ok(WatchEvent::InitDone) if first_sync => {
                first_sync = false;
                ctx.ready.synced("namespaces");
            }
            Ok(_) => {}
            Err(e) => {
                ctx.metrics
                    .watch_restarts
                    .get_or_create(&WatchLabels {
                        resource: "namespaces".into(),
                    })
                    .inc();
                tracing::warn!(error = %e, "namespace watch failed; retrying with backoff");
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

/// CSI: SecretProviderClassPodStatuses give each SecretProviderClass its current hash (that of its most
/// recently updated SPCPS). Many pods of one workload with the same versions make one hash: one reload.
pub async fn spcps(
    client: Client,
    namespace: Option<String>,
    labels: Option<String>,
    ctx: Arc<Ctx>,
) {
    let ar = csi::pod_statuses();
    wait_for_api(&client, &ar).await;
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    };
    let mut config = ctx.list_config(watcher::Config::default());
    if let Some(l) = &labels {
        config = config.labels(l);
    }
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut first_sync = true;
    while let Some(event) = stream.next().await {
        let obj = match event {
            Ok(WatchEvent::Apply(o)) => Some((o, true)),
            Ok(WatchEvent::InitApply(o)) => Some((o, !first_sync)),
            Ok(WatchEvent::InitDone) => {
                first_sync = false;
                None
            }
            // A pod went away; its SecretProviderClass still exists.
            Ok(_) => None,
            Err(e) => {
                ctx.metrics
                    .watch_restarts
                    .get_or_create(&WatchLabels {
                        resource: "secretproviderclasspodstatuses".into(),
                    })
                    .inc();
                tracing::warn!(error = %e, "SecretProviderClassPodStatus watch failed; retrying with backoff");
                None
            }
        };
        let Some((obj, trigger)) = obj else { continue };
        let Ok(value) = serde_json::to_value(&obj) else {
            continue;
        };
        let Some((class, hash)) = crate::core::hash::spcps_hash_json(&value) else {
            continue;
        };
        let ns = obj.namespace().unwrap_or_default();
        let flags = ctx
            .spc_flags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(ns.clone(), class.clone()))
            .copied()
            .unwrap_or_default();
        upsert(
            &ctx,
            ResourceKey::new(ResourceKind::SecretProviderClass, &ns, &class),
            hash,
            flags,
            trigger.then(|| last_write(obj.meta())),
            "secretproviderclasspodstatuses",
        );
    }
}

/// CSI: the ignore/match annotations of SecretProviderClasses.
pub async fn spcs(client: Client, namespace: Option<String>, ctx: Arc<Ctx>) {
    let ar = csi::secret_provider_classes();
    wait_for_api(&client, &ar).await;
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    };
    let mut stream = watcher(api, ctx.list_config(watcher::Config::default()))
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(WatchEvent::Apply(o)) | Ok(WatchEvent::InitApply(o)) => {
                let flags = flags_of(&ctx.plan, &o);
                ctx.spc_flags
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((o.namespace().unwrap_or_default(), o.name_any()), flags);
            }
            Ok(WatchEvent::Delete(o)) => {
                ctx.spc_flags
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&(o.namespace().unwrap_or_default(), o.name_any()));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "SecretProviderClass watch failed; retrying with backoff")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_once_sealed_and_every_registered_watch_synced() {
        let health = Arc::new(Health::default());
        let tracker = ReadyTracker::new(health.clone());
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

        let quick = ReadyTracker::new(Arc::new(Health::default()));
        quick.expect("configmaps/*");
        quick.synced("configmaps/*");
        assert!(!quick.health.is_ready());
        quick.seal();
        assert!(quick.health.is_ready());
    }
}
