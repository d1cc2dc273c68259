//! Pods labelled `rekindle.io/restart: pods` (`core::pod_groups`), and no others: grouped by their
//! controller owner, each group kept in the index as a workload of kind `Pods` whose markers are the
//! hashes its pods were stamped with. A change of a resource they were stamped for queues the group,
//! and the writer evicts the pods behind it one at a time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use super::driver::{self, Handler, Watched};
use super::{Ctx, Sink};
use crate::core::pod_groups;
use crate::core::refs::ResourceRef;
use crate::core::{ResourceKind, WorkloadKind};
use crate::index::{WorkloadEntry, WorkloadKey};
use crate::reload::queue::Found;

type Stamps = Vec<(ResourceRef, String)>;

/// The labelled pods seen, by namespace and name, with their group and stamps.
struct Pods {
    namespace: Option<String>,
    groups: HashMap<WorkloadKey, BTreeMap<String, Stamps>>,
    group_of: HashMap<(String, String), WorkloadKey>,
}

impl Pods {
    /// Records the group's pods in the index as one workload (or removes it with its last pod).
    fn store(&self, ctx: &Ctx, key: &WorkloadKey) {
        match self.groups.get(key) {
            Some(pods) if !pods.is_empty() => {
                let entry = WorkloadEntry::of_pods(pods.values().map(Vec::as_slice));
                ctx.index.apply_workload(key.clone(), entry);
            }
            _ => ctx.index.delete_workload(key),
        }
    }

    fn forget(&mut self, ctx: &Ctx, pod: &(String, String)) -> Option<WorkloadKey> {
        let key = self.group_of.remove(pod)?;
        if let Some(pods) = self.groups.get_mut(&key) {
            pods.remove(&pod.1);
            if pods.is_empty() {
                self.groups.remove(&key);
            }
        }
        self.store(ctx, &key);
        Some(key)
    }
}

impl Handler<Pod> for Pods {
    type Key = (String, String);

    fn key(&self, pod: &Pod) -> (String, String) {
        (pod.namespace().unwrap_or_default(), pod.name_any())
    }

    fn apply(&mut self, ctx: &Ctx, pod: Pod, live: bool) {
        let Ok(value) = serde_json::to_value(&pod) else {
            return;
        };
        let id = self.key(&pod);
        let group = WorkloadKey {
            kind: WorkloadKind::Pods,
            namespace: id.0.as_str().into(),
            name: pod_groups::group_of(&value).into(),
        };
        let stamps = pod_groups::stamps(&value);
        if self.group_of.get(&id) != Some(&group) {
            self.forget(ctx, &id);
        }
        self.group_of.insert(id.clone(), group.clone());
        let pods = self.groups.entry(group.clone()).or_default();
        let new_group = pods.is_empty();
        if pods.get(&id.1) == Some(&stamps) && !new_group {
            return;
        }
        pods.insert(id.1, stamps);
        self.store(ctx, &group);
        if !live {
            if let Some(catch_up) = &ctx.catch_up {
                catch_up.workload_listed(&group);
            }
            return;
        }
        // A pod created just before a change reached the index was stamped with what is now old.
        if let Sink::Reload { triggers, .. } = &ctx.sink {
            let now = tokio::time::Instant::now();
            for r in ctx.index.stale_markers_of(&group, &ResourceKind::ALL) {
                triggers.push(std::slice::from_ref(&group), &r, now, Found::Compared);
            }
        }
    }

    fn delete(&mut self, ctx: &Ctx, key: &(String, String)) {
        self.forget(ctx, key);
    }

    fn known(&self, _ctx: &Ctx) -> Vec<(String, String)> {
        self.group_of
            .keys()
            .filter(|(ns, _)| self.namespace.as_ref().is_none_or(|n| n == ns))
            .cloned()
            .collect()
    }
}

/// Watches the labelled pods of one namespace, or all.
pub async fn pods(client: Client, namespace: Option<String>, ctx: Arc<Ctx>) {
    let api: Api<Pod> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let config = ctx.list_config(watcher::Config::default().labels(pod_groups::POD_SELECTOR));
    let id = Watched::LabelledPods.in_namespace(namespace.as_deref());
    let handler = Pods {
        namespace,
        groups: HashMap::new(),
        group_of: HashMap::new(),
    };
    driver::run(api, config, id, handler, ctx).await;
}
