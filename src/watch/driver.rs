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

/// Identifies a watch in logs, readiness (`name`) and `rekindle_watch_restarts_total` (`resource`).
pub struct WatchName {
    pub name: String,
    pub resource: String,
}

/// Watches with kube's watcher.
pub async fn run<K, H>(
    api: Api<K>,
    config: watcher::Config,
    id: WatchName,
    handler: H,
    ctx: Arc<Ctx>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    H: Handler<K>,
{
    drive(watcher(api, config), id, handler, ctx).await;
}

/// Feeds a stream of watcher events to a handler, with kube's backoff after each error; returns
/// when the stream ends.
pub async fn drive<K, H, E>(
    events: impl Stream<Item = Result<WatchEvent<K>, E>> + Send,
    id: WatchName,
    mut handler: H,
    ctx: Arc<Ctx>,
) where
    H: Handler<K>,
    E: std::fmt::Display,
{
    let mut stream = events.default_backoff().boxed();
    let mut first_sync = true;
    let mut seen: HashSet<H::Key> = HashSet::new();
    let restarts = ctx
        .metrics
        .watch_restarts
        .get_or_create(&WatchLabels {
            resource: id.resource.clone(),
        })
        .clone();
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                restarts.inc();
                tracing::warn!(watch = %id.name, error = %e, "watch failed; retrying with backoff");
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
                    tracing::info!(watch = %id.name, "synced");
                    ctx.ready.synced(&id.name);
                }
            }
            WatchEvent::Apply(obj) => handler.apply(&ctx, obj, true),
            WatchEvent::Delete(obj) => {
                let key = handler.key(&obj);
                handler.delete(&ctx, &key);
            }
        }
    }
}
