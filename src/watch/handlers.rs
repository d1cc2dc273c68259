//! The handler of each watch: what an object of each kind means to the index and the sink.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::driver::{self, Handler, History, WatchId, Watched};
use super::protobuf::config::Protobuf;
use super::protobuf::workloads::{DaemonSetPb, DeploymentPb, StatefulSetPb};
use super::protobuf::{Decode, Fallback};
use super::workload_object::WorkloadObject;
use super::{wait_for_api, Changed, Ctx, Sink, WatchPart};
use crate::core::keys::KeyDigests;
use crate::core::kinds::csi;
use crate::core::pause;
use crate::core::plan::PlanConfig;
use crate::core::policy::ResourceFlags;
use crate::core::restart::{self, Restarts};
use crate::core::rollout::Progress;
use crate::core::window::RELOAD_WINDOW_ANNOTATION;
use crate::core::{ResourceKind, WorkloadKind};
use crate::index::{ResourceEntry, ResourceKey, WorkloadEntry, WorkloadKey, Written};
use crate::metrics::{FallbackLabels, Processed, Skip, WatchEventType};

fn flags_of<K: Resource>(plan: &PlanConfig, obj: &K) -> ResourceFlags {
    ResourceFlags::from_annotations(&plan.policy.keys, obj.annotations())
}

fn dynamic_api(
    client: Client,
    namespace: Option<&str>,
    ar: &kube::discovery::ApiResource,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client, ns, ar),
        None => Api::all_with(client, ar),
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

/// The resourceVersion of an object, as a number.
fn version(meta: &ObjectMeta) -> Option<u64> {
    crate::core::refs::resource_version(meta.resource_version.as_deref()?)
}

/// Records a resource's hash; `written_at` is `Some` (the time of the write) when a change may
/// trigger reloads, `None` during the first list; `version` is the object's resourceVersion.
fn upsert(
    ctx: &Ctx,
    key: ResourceKey,
    (hash, digests): (String, Option<KeyDigests>),
    flags: ResourceFlags,
    (written_at, version): (Option<i64>, Option<u64>),
    watched: Watched,
) {
    let observed = Instant::now();
    // Remembered only where changes reload (not with --webhook-url, which keeps no markers).
    let written = written_at
        .filter(|_| ctx.sink.triggers().is_some())
        .map(|at| Written {
            at,
            creations: ctx.plan.reload_on_create,
        });
    let update = ctx.index.update_resource_written(
        &key,
        ResourceEntry {
            hash: hash.as_str().into(),
            flags,
        },
        digests,
        written,
    );
    if written_at.is_none() {
        return;
    }
    let created = update.previous.is_none();
    let event_type = if created {
        WatchEventType::Add
    } else {
        WatchEventType::Update
    };
    ctx.metrics.event(event_type, watched);
    if update.previous.is_some_and(|p| p.hash.is(&hash)) {
        // Labels, annotations or metadata only: nothing a pod sees has changed.
        ctx.metrics.skip(Skip::NoDataChange);
        ctx.metrics
            .processed(event_type, watched, Processed::NoDataChange);
        return;
    }
    if created && !ctx.plan.reload_on_create {
        ctx.metrics
            .processed(event_type, watched, Processed::EventDisabled);
        return;
    }
    let result = ctx.triggered(
        &update.dependents,
        Changed {
            key: &key,
            hash: &hash,
            flags,
            observed,
            version,
        },
    );
    ctx.metrics.processed(event_type, watched, result);
    ctx.metrics.reconciled(observed.elapsed().as_secs_f64());
}

fn remove(ctx: &Ctx, key: &ResourceKey, watched: Watched) {
    let observed = Instant::now();
    let update = ctx.index.remove_resource(key);
    ctx.metrics.event(WatchEventType::Delete, watched);
    if !ctx.plan.reload_on_delete {
        ctx.metrics
            .processed(WatchEventType::Delete, watched, Processed::EventDisabled);
        return;
    }
    let hash = crate::core::hash::delete_marker_hash();
    let result = ctx.triggered(
        &update.dependents,
        Changed {
            key,
            hash: &hash,
            flags: update.previous.map(|p| p.flags).unwrap_or_default(),
            observed,
            // A deletion (from a re-list, too) carries no version to trust: it is confirmed.
            version: None,
        },
    );
    ctx.metrics
        .processed(WatchEventType::Delete, watched, result);
    ctx.metrics.reconciled(observed.elapsed().as_secs_f64());
}

/// ConfigMaps or Secrets of one namespace (or all).
struct Resources<K> {
    kind: ResourceKind,
    namespace: Option<String>,
    _kind: std::marker::PhantomData<fn(&K)>,
}

/// What the index keeps of a ConfigMap or Secret: its hash, and its value digests only when a
/// workload reads it key by key (they cost a SHA-1 and an allocation per key).
pub trait ConfigData {
    fn hash(&self) -> String;
    fn digests(&self) -> KeyDigests;
}

impl ConfigData for ConfigMap {
    fn hash(&self) -> String {
        crate::core::hash::configmap_hash_typed(self)
    }
    fn digests(&self) -> KeyDigests {
        KeyDigests::of_configmap(self)
    }
}

impl ConfigData for Secret {
    fn hash(&self) -> String {
        crate::core::hash::secret_hash_typed(self)
    }
    fn digests(&self) -> KeyDigests {
        KeyDigests::of_secret(self)
    }
}

impl<K: Resource + ConfigData> Handler<K> for Resources<K>
where
    K: Send,
{
    type Key = ResourceKey;

    fn key(&self, obj: &K) -> ResourceKey {
        ResourceKey::new(
            self.kind,
            &obj.namespace().unwrap_or_default(),
            &obj.name_any(),
        )
    }

    fn apply(&mut self, ctx: &Ctx, obj: K, live: bool) {
        let written_at = live.then(|| last_write(obj.meta()));
        let key = self.key(&obj);
        let hashed = if ctx.index.wants_keys(&key) {
            let digests = obj.digests();
            (digests.of.to_string(), Some(digests))
        } else {
            (obj.hash(), None)
        };
        upsert(
            ctx,
            key,
            hashed,
            flags_of(&ctx.plan, &obj),
            (written_at, version(obj.meta())),
            Watched::Resources(self.kind),
        );
    }

    fn delete(&mut self, ctx: &Ctx, key: &ResourceKey) {
        remove(ctx, key, Watched::Resources(self.kind));
    }

    fn known(&self, ctx: &Ctx) -> Vec<ResourceKey> {
        ctx.index
            .resource_keys(self.kind, self.namespace.as_deref())
    }
}

/// Watches one kind of configuration resource.
pub async fn resources<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: ResourceKind,
    namespace: Option<String>,
    ctx: Arc<Ctx>,
) where
    K: Resource + ConfigData + Protobuf + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let id = Watched::Resources(kind).in_namespace(namespace.as_deref());
    let handler = || Resources {
        kind,
        namespace: namespace.clone(),
        _kind: std::marker::PhantomData,
    };
    protobuf_first::<K::Message, _>(api, config, id, handler, ctx).await;
}

/// A watch in protobuf while the apiserver serves it and lists are streamed (see
/// [`super::protobuf`]: a third of JSON's bytes and far less apiserver CPU), then, or wherever it is
/// not served, kube's JSON watcher.
async fn protobuf_first<M, H>(
    api: Api<M::Object>,
    config: watcher::Config,
    id: WatchId,
    handler: impl Fn() -> H,
    ctx: Arc<Ctx>,
) where
    M: Decode,
    M::Object: Clone + DeserializeOwned + Debug,
    H: Handler<M::Object>,
{
    let mut history = History::New;
    if ctx.streaming_lists {
        let fallbacks = |reason: Fallback| {
            ctx.metrics
                .watch_protobuf_fallbacks
                .get_or_create(&FallbackLabels {
                    resource: id.watched.resource(),
                    reason: reason.label().into(),
                })
                .clone()
        };
        // Both series exist from the start, so "0" reads as "still in protobuf".
        for reason in [Fallback::NotServed, Fallback::Undecodable] {
            fallbacks(reason);
        }
        let (events, ending) = super::protobuf::watch::<M>(
            api.clone().into_client(),
            api.resource_url().to_string(),
            config.label_selector.clone(),
            config.field_selector.clone(),
        );
        history = driver::drive(events, id.clone(), handler(), ctx.clone(), history).await;
        // The stream ends only with a reason.
        let reason = ending.reason().unwrap_or(Fallback::NotServed);
        fallbacks(reason).inc();
        tracing::warn!(
            watch = %id,
            kind = M::KIND,
            reason = reason.label(),
            "the protobuf watch ended; watching this kind in JSON"
        );
    }
    // After a sync in protobuf, the JSON watch's first list is a re-list: what changed or went in
    // between is acted on, not taken as the starting state.
    driver::drive(watcher::watcher(api, config), id, handler(), ctx, history).await;
}

/// Workloads of one kind: references, policy annotations, markers and a skeleton, kept in the index.
struct Workloads {
    kind: WorkloadKind,
    namespace: Option<String>,
}

impl Handler<WorkloadObject> for Workloads {
    type Key = WorkloadKey;

    fn key(&self, obj: &WorkloadObject) -> WorkloadKey {
        WorkloadKey {
            kind: self.kind,
            namespace: obj.namespace().unwrap_or_default().into(),
            name: obj.name_any().into(),
        }
    }

    /// `live`: a workload of a first list goes to the catch-up; later sightings are checked here.
    fn apply(&mut self, ctx: &Ctx, obj: WorkloadObject, live: bool) {
        let key = self.key(&obj);
        let value = &obj.object;
        let entry = WorkloadEntry::from_stored(&ctx.plan, value, self.kind);
        if let Sink::Reload {
            triggers, rollouts, ..
        } = &ctx.sink
        {
            if key.kind == WorkloadKind::Deployment {
                if let Some(at) = pause::resume_at(&ctx.plan.policy.keys, value) {
                    triggers.resume_at(&key, at);
                }
            }
            let generation = obj.metadata.generation.unwrap_or(0);
            rollouts.observe(&key, &entry, generation);
            if entry.release.progress == Progress::Progressing
                && restart::restarts(value, self.kind, ctx.plan.pod_restarts) == Restarts::Evict
            {
                triggers.restart_pods(&key);
            }
        }
        let new = ctx.index.apply_workload(key.clone(), entry);
        if new && live {
            let created_at = obj.metadata.creation_timestamp.as_ref();
            ctx.reload_if_stale(&key, created_at.map(|t| t.0.as_second()));
        } else if !live {
            if let Some(catch_up) = &ctx.catch_up {
                catch_up.workload_listed(&key);
            }
        }
    }

    fn delete(&mut self, ctx: &Ctx, key: &WorkloadKey) {
        ctx.index.delete_workload(key);
        if let Sink::Reload { rollouts, .. } = &ctx.sink {
            rollouts.forget(key);
        }
    }

    fn known(&self, ctx: &Ctx) -> Vec<WorkloadKey> {
        ctx.index
            .workload_keys(self.kind, self.namespace.as_deref())
    }
}

/// Watches one workload kind.
pub async fn workloads(
    client: Client,
    kind: WorkloadKind,
    namespace: Option<String>,
    ctx: Arc<Ctx>,
) {
    let ar = kind.api_resource();
    let api: Api<WorkloadObject> = match namespace.as_deref() {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    };
    let id = Watched::Workloads(kind).in_namespace(namespace.as_deref());
    let config = ctx.list_config(watcher::Config::default());
    let handler = || Workloads {
        kind,
        namespace: namespace.clone(),
    };
    match kind {
        WorkloadKind::Deployment => {
            protobuf_first::<DeploymentPb, _>(api, config, id, handler, ctx).await
        }
        WorkloadKind::StatefulSet => {
            protobuf_first::<StatefulSetPb, _>(api, config, id, handler, ctx).await
        }
        WorkloadKind::DaemonSet => {
            protobuf_first::<DaemonSetPb, _>(api, config, id, handler, ctx).await
        }
        // In JSON: a Job is recreated from its whole object, custom resources (Argo Rollouts) are
        // not served in protobuf, and CronJobs are few.
        _ => driver::run(api, config, id, handler(), ctx).await,
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
    wait_for_api(&client, &kind.api_resource()).await;
    tracing::info!(kind = %kind, "optional API served; watching it");
    let id = Watched::Workloads(kind).in_namespace(namespace.as_deref());
    ctx.ready.expect(&id.to_string(), WatchPart::Workloads);
    workloads(client, kind, namespace, ctx).await;
}

/// Namespaces, for the namespace selector's matching set: namespaces that start or stop matching take
/// effect without a restart.
struct Namespaces;

impl Handler<Namespace> for Namespaces {
    type Key = String;

    fn key(&self, ns: &Namespace) -> String {
        ns.name_any()
    }

    fn apply(&mut self, ctx: &Ctx, ns: Namespace, _live: bool) {
        ctx.metrics
            .event(WatchEventType::Update, Watched::Namespaces);
        let labels: BTreeMap<String, String> = ns
            .labels()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let name = ns.name_any();
        ctx.scope.observe_namespace(&name, &labels);
        let window = ns.annotations().get(RELOAD_WINDOW_ANNOTATION);
        ctx.index
            .set_namespace_window(&name, window.map(String::as_str));
    }

    fn delete(&mut self, ctx: &Ctx, name: &String) {
        ctx.scope.forget_namespace(name);
        ctx.index.set_namespace_window(name, None);
    }

    fn known(&self, _ctx: &Ctx) -> Vec<String> {
        Vec::new()
    }
}

/// Namespaces: every one (`namespace` `None`), or the one named. Their labels feed
/// `--namespace-selector`, their reload window annotations the workloads' default window.
pub async fn namespaces(client: Client, namespace: Option<String>, ctx: Arc<Ctx>) {
    let api: Api<Namespace> = Api::all(client);
    let id = Watched::Namespaces.in_namespace(namespace.as_deref());
    let mut config = ctx.list_config(watcher::Config::default());
    if let Some(ns) = &namespace {
        config = config.fields(&format!("metadata.name={ns}"));
    }
    driver::run(api, config, id, Namespaces, ctx).await;
}

/// CSI: SecretProviderClassPodStatuses give each SecretProviderClass its current hash (that of its most
/// recently updated SPCPS). Many pods of one workload with the same versions make one hash: one reload.
struct PodStatuses;

impl Handler<DynamicObject> for PodStatuses {
    /// Pod statuses leave nothing to clear: a pod going away leaves its class in place.
    type Key = ();

    fn key(&self, _obj: &DynamicObject) {}

    fn apply(&mut self, ctx: &Ctx, obj: DynamicObject, live: bool) {
        let Ok(value) = serde_json::to_value(&obj) else {
            return;
        };
        let Some((class, hash)) = crate::core::hash::spcps_hash_json(&value) else {
            return;
        };
        let key = ResourceKey::new(
            ResourceKind::SecretProviderClass,
            &obj.namespace().unwrap_or_default(),
            &class,
        );
        let flags = ctx.index.class_flags(&key);
        upsert(
            ctx,
            key,
            (hash, None),
            flags,
            (live.then(|| last_write(obj.meta())), version(obj.meta())),
            Watched::ClassPodStatuses,
        );
    }

    fn delete(&mut self, _ctx: &Ctx, _key: &()) {}

    fn known(&self, _ctx: &Ctx) -> Vec<()> {
        Vec::new()
    }
}

pub async fn spcps(
    client: Client,
    namespace: Option<String>,
    labels: Option<String>,
    ctx: Arc<Ctx>,
) {
    let ar = csi::pod_statuses();
    wait_for_api(&client, &ar).await;
    let api = dynamic_api(client, namespace.as_deref(), &ar);
    let mut config = ctx.list_config(watcher::Config::default());
    if let Some(l) = &labels {
        config = config.labels(l);
    }
    let id = Watched::ClassPodStatuses.in_namespace(namespace.as_deref());
    driver::run(api, config, id, PodStatuses, ctx).await;
}

/// CSI: the ignore/match annotations of SecretProviderClasses, kept in the index.
struct Classes {
    namespace: Option<String>,
}

impl Handler<DynamicObject> for Classes {
    type Key = ResourceKey;

    fn key(&self, obj: &DynamicObject) -> ResourceKey {
        ResourceKey::new(
            ResourceKind::SecretProviderClass,
            &obj.namespace().unwrap_or_default(),
            &obj.name_any(),
        )
    }

    fn apply(&mut self, ctx: &Ctx, obj: DynamicObject, _live: bool) {
        ctx.index
            .set_class_flags(self.key(&obj), flags_of(&ctx.plan, &obj));
    }

    fn delete(&mut self, ctx: &Ctx, key: &ResourceKey) {
        ctx.index.remove_class_flags(key);
    }

    fn known(&self, ctx: &Ctx) -> Vec<ResourceKey> {
        ctx.index.class_flag_keys(self.namespace.as_deref())
    }
}

pub async fn spcs(client: Client, namespace: Option<String>, ctx: Arc<Ctx>) {
    let ar = csi::secret_provider_classes();
    wait_for_api(&client, &ar).await;
    let api = dynamic_api(client, namespace.as_deref(), &ar);
    let id = Watched::Classes.in_namespace(namespace.as_deref());
    let config = ctx.list_config(watcher::Config::default());
    driver::run(api, config, id, Classes { namespace }, ctx).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hash::secret_hash_typed;
    use crate::watch::ReadyTracker;
    use hyper::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    /// An apiserver that refuses Secrets in protobuf (406): the same watch goes on in JSON, with the
    /// same selectors and a streamed first state, and its Secrets reach the index.
    #[tokio::test]
    async fn the_secrets_watch_goes_on_in_json_when_protobuf_is_refused() {
        goes_on_in_json((406, b"not acceptable".to_vec()), Fallback::NotServed).await;
    }

    /// A protobuf first state with an event that cannot be decoded: the watch goes on in JSON rather
    /// than reading the same event again forever.
    #[tokio::test]
    async fn the_secrets_watch_goes_on_in_json_after_an_undecodable_event() {
        let body = super::super::protobuf::wire(&[b"\x0a\x05ADDED\x12\x03\x0a\x01x"]);
        goes_on_in_json((200, body), Fallback::Undecodable).await;
    }

    /// The Secrets watch of namespace pbfix, its protobuf request answered with `first`: the JSON
    /// watch that follows lists one Secret, which reaches the index, and the fallback is counted
    /// under `reason` (and only there).
    async fn goes_on_in_json(first: (u16, Vec<u8>), reason: Fallback) {
        let (client, mut handle) = crate::mock_api::client();
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "app", "namespace": "pbfix", "resourceVersion": "11"},
            "data": {"password": "czNjcjN0"}});
        let bookmark = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"resourceVersion": "12",
                "annotations": {"k8s.io/initial-events-end": "true"}}});
        let stream = format!(
            "{}\n{}\n",
            json!({"type": "ADDED", "object": secret}),
            json!({"type": "BOOKMARK", "object": bookmark})
        );
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for (status, body) in [first, (200, stream.into_bytes())] {
                let (request, send) = handle.next_request().await.expect("a request");
                let request: Request<Body> = request;
                let accept = request
                    .headers()
                    .get("accept")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                seen.push((
                    accept,
                    request.uri().query().unwrap_or_default().to_string(),
                ));
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body))
                        .unwrap(),
                );
            }
            // The JSON watch resumes after its first state; that request is left unanswered.
            let resumed = handle.next_request().await.expect("the watch resumes");
            (
                seen,
                resumed.0.uri().query().unwrap_or_default().to_string(),
            )
        });

        let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ready = ReadyTracker::new({
            let synced = synced.clone();
            move || synced.store(true, std::sync::atomic::Ordering::SeqCst)
        });
        ready.expect("secrets/pbfix", WatchPart::Resources(ResourceKind::Secret));
        ready.seal();
        let ctx = Arc::new(Ctx::for_tests(ready, true));
        let config = ctx.list_config(watcher::Config::default().fields("type!=helm.sh/release.v1"));
        let api: Api<Secret> = Api::namespaced(client, "pbfix");
        let watch = tokio::spawn(resources(
            api,
            config,
            ResourceKind::Secret,
            Some("pbfix".into()),
            ctx.clone(),
        ));

        let (seen, resumed) = tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .expect("the watch went on")
            .unwrap();
        watch.abort();
        assert_eq!(seen[0].0, super::super::protobuf::ACCEPT);
        assert!(!seen[1].0.contains("protobuf"), "{:?}", seen[1]);
        for (_, query) in &seen {
            assert!(
                query.contains("fieldSelector=type%21%3Dhelm.sh%2Frelease.v1"),
                "{query}"
            );
            assert!(query.contains("sendInitialEvents=true"), "{query}");
        }
        assert!(resumed.contains("resourceVersion=12"), "{resumed}");
        let want: Secret = serde_json::from_value(secret).unwrap();
        let entry = ctx
            .index
            .resource(&ResourceKey::new(ResourceKind::Secret, "pbfix", "app"))
            .expect("the Secret is indexed");
        assert_eq!(entry.hash.to_string(), secret_hash_typed(&want));
        assert!(synced.load(std::sync::atomic::Ordering::SeqCst));
        for r in [Fallback::NotServed, Fallback::Undecodable] {
            let counted = ctx
                .metrics
                .watch_protobuf_fallbacks
                .get_or_create(&FallbackLabels {
                    resource: "secrets".into(),
                    reason: r.label().into(),
                })
                .get();
            assert_eq!(counted, u64::from(r == reason), "{r:?}");
        }
    }
}
