//! The one watch loop every watch runs: restart counting and logging, first sync and readiness, and the
//! re-list bookkeeping. What a watch does with its objects is its [`Handler`] (the index's half of each
//! kind); the driver never looks inside an object.
//!
//! Re-list bookkeeping: the first list of a watch never triggers anything; after a watch gap, a re-list
//! triggers for what changed and treats anything the handler knows but the re-list lacks as deleted.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, watcher, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use super::Ctx;
use crate::core::{ResourceKind, WorkloadKind};
use crate::metrics::WatchLabels;

/// What one watch does with the objects it sees.
pub trait Handler<K>: Send {
    /// The handler's key of an object, for the re-list bookkeeping.
    type Key: Eq + Hash + Send;

    fn key(&self, obj: &K) -> Self::Key;

    /// The object exists (listed or changed). `live` is false during the first list, when nothing
    /// may trigger.
    fn apply(&mut self, ctx: &Ctx, obj: K, live: bool);

    /// The object is gone.
    fn delete(&mut self, ctx: &Ctx, key: &Self::Key);

    /// Everything the handler holds for this watch, to find what a re-list no longer has; empty for
    /// handlers that keep nothing a deletion must clear.
    fn known(&self, ctx: &Ctx) -> Vec<Self::Key>;
}

/// What a watch watches, in one namespace or all. Its name (`configmaps/team-a`, `Deployment/*`)
/// identifies it in logs, readiness and supervision; [`Watched::resource`] labels
/// `rekindle_watch_restarts_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WatchId {
    pub watched: Watched,
    /// `None`: every namespace.
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Watched {
    /// Namespaces (their labels for `--namespace-selector`, their default reload windows): all, or
    /// one watched namespace.
    Namespaces,
    /// ConfigMaps or Secrets.
    Resources(ResourceKind),
    Workloads(WorkloadKind),
    /// The CSI driver's SecretProviderClassPodStatuses.
    ClassPodStatuses,
    /// SecretProviderClasses (their annotations).
    Classes,
    /// Pods labelled `rekindle.io/restart: pods`.
    LabelledPods,
}

impl Watched {
    /// In one namespace, or all.
    pub fn in_namespace(self, namespace: Option<&str>) -> WatchId {
        WatchId {
            watched: self,
            namespace: namespace.map(String::from),
        }
    }

    /// The metric label: the API's plural, or the workload kind in lower case.
    pub fn resource(self) -> String {
        match self {
            Watched::Namespaces => "namespaces".into(),
            Watched::Resources(ResourceKind::ConfigMap) => "configmaps".into(),
            Watched::Resources(ResourceKind::Secret) => "secrets".into(),
            Watched::Resources(ResourceKind::SecretProviderClass) | Watched::Classes => {
                "secretproviderclasses".into()
            }
            Watched::ClassPodStatuses => "secretproviderclasspodstatuses".into(),
            Watched::LabelledPods => "pods".into(),
            Watched::Workloads(kind) => kind.name().to_ascii_lowercase(),
        }
    }
}

impl std::fmt::Display for WatchId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match (self.watched, &self.namespace) {
            (Watched::Namespaces, None) => return f.write_str("namespaces"),
            (Watched::Namespaces, Some(ns)) => return write!(f, "namespaces/{ns}"),
            (Watched::Workloads(kind), _) => kind.name().to_string(),
            (other, _) => other.resource(),
        };
        write!(f, "{what}/{}", self.namespace.as_deref().unwrap_or("*"))
    }
}

/// Whether a stream is the first of its watch (its first list triggers nothing) or takes over from one
/// that had synced (its first list is a re-list: changes trigger, what it lacks was deleted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum History {
    New,
    SyncedBefore,
}

/// Watches with kube's watcher.
pub async fn run<K, H>(api: Api<K>, config: watcher::Config, id: WatchId, handler: H, ctx: Arc<Ctx>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    H: Handler<K>,
{
    drive(watcher(api, config), id, handler, ctx, History::New).await;
}

/// Feeds a stream of watcher events to a handler, with kube's backoff after each error; returns
/// when the stream ends, saying whether the watch has synced by then.
pub async fn drive<K, H, E>(
    events: impl Stream<Item = Result<WatchEvent<K>, E>> + Send,
    id: WatchId,
    mut handler: H,
    ctx: Arc<Ctx>,
    history: History,
) -> History
where
    H: Handler<K>,
    E: std::fmt::Display,
{
    let mut stream = events.default_backoff().boxed();
    let mut first_sync = history == History::New;
    let mut seen: HashSet<H::Key> = HashSet::new();
    let restarts = ctx
        .metrics
        .watch_restarts
        .get_or_create(&WatchLabels {
            resource: id.watched.resource(),
        })
        .clone();
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                restarts.inc();
                tracing::warn!(watch = %id, error = %e, "watch failed; retrying with backoff");
                continue;
            }
        };
        match event {
            WatchEvent::Init => seen.clear(),
            WatchEvent::InitApply(obj) => {
                seen.insert(handler.key(&obj));
                handler.apply(&ctx, obj, !first_sync);
            }
            WatchEvent::InitDone => {
                if !first_sync {
                    for key in handler.known(&ctx) {
                        if !seen.contains(&key) {
                            handler.delete(&ctx, &key);
                        }
                    }
                }
                seen.clear();
                if first_sync {
                    first_sync = false;
                    tracing::info!(watch = %id, "synced");
                    ctx.ready.synced(&id.to_string());
                }
            }
            WatchEvent::Apply(obj) => handler.apply(&ctx, obj, true),
            WatchEvent::Delete(obj) => {
                let key = handler.key(&obj);
                handler.delete(&ctx, &key);
            }
        }
    }
    if first_sync {
        History::New
    } else {
        History::SyncedBefore
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::ReadyTracker;
    use std::collections::BTreeMap;

    /// Objects are (name, content); the handler keeps the last content and records what it was told.
    #[derive(Default)]
    struct Seen {
        objects: BTreeMap<String, u32>,
        triggered: Vec<String>,
    }

    #[derive(Clone, Default)]
    struct Recorder(Arc<std::sync::Mutex<Seen>>);

    impl Recorder {
        fn triggered(&self) -> Vec<String> {
            self.0.lock().unwrap().triggered.clone()
        }
    }

    impl Handler<(String, u32)> for Recorder {
        type Key = String;
        fn key(&self, obj: &(String, u32)) -> String {
            obj.0.clone()
        }
        fn apply(&mut self, _: &Ctx, (name, content): (String, u32), live: bool) {
            let mut seen = self.0.lock().unwrap();
            let changed = seen.objects.insert(name.clone(), content) != Some(content);
            if live && changed {
                seen.triggered.push(format!("changed {name}"));
            }
        }
        fn delete(&mut self, _: &Ctx, key: &String) {
            let mut seen = self.0.lock().unwrap();
            seen.objects.remove(key);
            seen.triggered.push(format!("deleted {key}"));
        }
        fn known(&self, _: &Ctx) -> Vec<String> {
            self.0.lock().unwrap().objects.keys().cloned().collect()
        }
    }

    fn listing(objects: &[(&str, u32)]) -> Vec<Result<WatchEvent<(String, u32)>, String>> {
        let mut events = vec![Ok(WatchEvent::Init)];
        events.extend(
            objects
                .iter()
                .map(|(n, c)| Ok(WatchEvent::InitApply((n.to_string(), *c)))),
        );
        events.push(Ok(WatchEvent::InitDone));
        events
    }

    /// Names as logs, readiness and supervision know them; labels as the restart metric has them.
    #[test]
    fn watch_names_and_labels() {
        let names: Vec<(String, String)> = [
            Watched::Resources(ResourceKind::ConfigMap).in_namespace(None),
            Watched::Resources(ResourceKind::Secret).in_namespace(Some("team-a")),
            Watched::Workloads(WorkloadKind::Deployment).in_namespace(None),
            Watched::Namespaces.in_namespace(None),
            Watched::ClassPodStatuses.in_namespace(Some("a")),
            Watched::Classes.in_namespace(None),
        ]
        .iter()
        .map(|id| (id.to_string(), id.watched.resource()))
        .collect();
        let expected = [
            ("configmaps/*", "configmaps"),
            ("secrets/team-a", "secrets"),
            ("Deployment/*", "deployment"),
            ("namespaces", "namespaces"),
            (
                "secretproviderclasspodstatuses/a",
                "secretproviderclasspodstatuses",
            ),
            ("secretproviderclasses/*", "secretproviderclasses"),
        ];
        assert_eq!(names, expected.map(|(n, r)| (n.to_string(), r.to_string())));
    }

    fn id() -> WatchId {
        Watched::Resources(ResourceKind::ConfigMap).in_namespace(None)
    }

    /// A watch that goes on in another stream (a protobuf stream ending, JSON taking over)
    /// treats the new stream's first list as a re-list: what changed or went meanwhile is acted on.
    #[tokio::test]
    async fn a_stream_taking_over_from_a_synced_one_relists() {
        let ctx = Arc::new(Ctx::for_tests(ReadyTracker::new(|| {}), false));
        let handler = Recorder::default();
        let first = futures::stream::iter(listing(&[("a", 1), ("b", 1)]));
        let history = drive(first, id(), handler.clone(), ctx.clone(), History::New).await;
        assert_eq!(history, History::SyncedBefore);
        assert!(
            handler.triggered().is_empty(),
            "a first list triggers nothing"
        );

        // Meanwhile: a changed, b deleted, c created.
        let second = futures::stream::iter(listing(&[("a", 2), ("c", 1)]));
        let history = drive(second, id(), handler.clone(), ctx.clone(), history).await;
        assert_eq!(history, History::SyncedBefore);
        assert_eq!(
            handler.triggered(),
            ["changed a", "changed c", "deleted b"],
            "the re-list acts on the gap"
        );

        // A stream that ends before its first sync says so, and the next one starts afresh.
        let fresh = Recorder::default();
        let unsynced = futures::stream::iter(listing(&[]).into_iter().take(1));
        let history = drive(unsynced, id(), fresh.clone(), ctx.clone(), History::New).await;
        assert_eq!(history, History::New);
        let listed = futures::stream::iter(listing(&[("a", 1)]));
        drive(listed, id(), fresh.clone(), ctx, history).await;
        assert!(fresh.triggered().is_empty());
    }
}
