//! The watch set: resources per watched namespace, workloads, Namespaces, CSI objects and labelled
//! pods, each registered with readiness before it starts and handed to the supervisor by its name.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::core::{ResourceKind, WorkloadKind};
use crate::watch::{self, Ctx, ReadyTracker, WatchId, WatchPart, Watched};

/// ConfigMaps and Secrets per list page at start-up and re-list.
const RESOURCE_LIST_PAGE: u32 = 100;

/// The watches started so far, each by its name (readiness and supervision know it by the same one).
struct Watches<'a> {
    ready: &'a ReadyTracker,
    started: Vec<(String, Option<JoinHandle<()>>)>,
}

impl Watches<'_> {
    /// Starts `watch`, registered first with readiness when its first sync counts there (so a quick
    /// sync is never missed).
    fn start(
        &mut self,
        id: WatchId,
        part: Option<WatchPart>,
        watch: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let name = id.to_string();
        if let Some(part) = part {
            self.ready.expect(&name, part);
        }
        self.started.push((name, Some(tokio::spawn(watch))));
    }

    /// The watches of one namespace (`None`: cluster-wide): ConfigMaps, Secrets, CSI objects and
    /// workloads.
    fn start_in(
        &mut self,
        client: &Client,
        config: &Config,
        ctx: &Arc<Ctx>,
        ns: Option<&str>,
        builtin: &[WorkloadKind],
        optional: &[WorkloadKind],
    ) {
        // Smaller list pages than kube's 500: a page of large Secrets is held whole while it is hashed, and
        // the allocator keeps that high-water mark as RSS. More list requests at start-up, less memory.
        let label_config = |c: watcher::Config| {
            let c = ctx.list_config(c.page_size(RESOURCE_LIST_PAGE));
            match &config.resource_label_selector {
                Some(sel) => c.labels(&sel.to_string()),
                None => c,
            }
        };
        let in_ns = |watched: Watched| watched.in_namespace(ns);
        if !config.ignore_configmaps {
            let api: Api<ConfigMap> = match ns {
                Some(n) => Api::namespaced(client.clone(), n),
                None => Api::all(client.clone()),
            };
            self.start(
                in_ns(Watched::Resources(ResourceKind::ConfigMap)),
                Some(WatchPart::Resources(ResourceKind::ConfigMap)),
                watch::resources(
                    api,
                    label_config(watcher::Config::default()),
                    ResourceKind::ConfigMap,
                    ns.map(String::from),
                    ctx.clone(),
                ),
            );
        }
        if !config.ignore_secrets {
            // Helm release blobs are large and never mounted: keep them out of the watch.
            let wc = label_config(watcher::Config::default().fields("type!=helm.sh/release.v1"));
            let api: Api<Secret> = match ns {
                Some(n) => Api::namespaced(client.clone(), n),
                None => Api::all(client.clone()),
            };
            self.start(
                in_ns(Watched::Resources(ResourceKind::Secret)),
                Some(WatchPart::Resources(ResourceKind::Secret)),
                watch::resources(
                    api,
                    wc,
                    ResourceKind::Secret,
                    ns.map(String::from),
                    ctx.clone(),
                ),
            );
        }
        if config.enable_csi {
            let labels = config
                .resource_label_selector
                .as_ref()
                .map(|s| s.to_string());
            self.start(
                in_ns(Watched::ClassPodStatuses),
                None,
                watch::spcps(client.clone(), ns.map(String::from), labels, ctx.clone()),
            );
            self.start(
                in_ns(Watched::Classes),
                None,
                watch::spcs(client.clone(), ns.map(String::from), ctx.clone()),
            );
        }
        for kind in optional {
            self.start(
                in_ns(Watched::Workloads(*kind)),
                None,
                watch::optional_workloads(client.clone(), *kind, ns.map(String::from), ctx.clone()),
            );
        }
        for kind in builtin {
            self.start(
                in_ns(Watched::Workloads(*kind)),
                Some(WatchPart::Workloads),
                watch::workloads(client.clone(), *kind, ns.map(String::from), ctx.clone()),
            );
        }
        // Not waited for by readiness: an install whose RBAC predates pod restarts (no `watch` on
        // pods) keeps reloading workloads, with this watch retrying and logging why.
        if ctx.plan.pod_restarts && ctx.sink.triggers().is_some() {
            self.start(
                in_ns(Watched::LabelledPods),
                None,
                watch::pods(client.clone(), ns.map(String::from), ctx.clone()),
            );
        }
    }
}

/// Starts every watch of the configuration (resources per watched namespace, workloads, the namespace
/// selector's Namespaces, CSI), each registered with the readiness tracker first.
pub(super) fn spawn_watches(
    client: &Client,
    config: &Config,
    ctx: &Arc<Ctx>,
    builtin: &[WorkloadKind],
    optional: &[WorkloadKind],
) -> Vec<(String, Option<JoinHandle<()>>)> {
    let scope = &ctx.scope;
    let namespaces: Vec<Option<String>> = match scope.watched_namespaces() {
        Some(list) => list.iter().cloned().map(Some).collect(),
        None => vec![None],
    };
    let mut watches = Watches {
        ready: &ctx.ready,
        started: Vec::new(),
    };
    // Namespaces: the selector's labels (the scope waits for them) and the default reload windows;
    // one by one in a scoped install, which may read only its own namespaces.
    if scope.watched_namespaces().is_none() {
        let part = scope.selector().is_some().then_some(WatchPart::Scope);
        watches.start(
            Watched::Namespaces.in_namespace(None),
            part,
            watch::namespaces(client.clone(), None, ctx.clone()),
        );
    }
    for ns in namespaces.iter().flatten() {
        watches.start(
            Watched::Namespaces.in_namespace(Some(ns)),
            None,
            watch::namespaces(client.clone(), Some(ns.clone()), ctx.clone()),
        );
    }
    for ns in &namespaces {
        watches.start_in(client, config, ctx, ns.as_deref(), builtin, optional);
    }
    watches.started
}
