//! `rekindle why`: where a workload stands, read from the live cluster with the core the server uses.
//!
//! Everything is read as it is now: the workload, the ConfigMaps, Secrets and
//! SecretProviderClassPodStatuses it references (their hashes and value digests computed here), its
//! Namespace's reload window, the canaries and halted workloads of its namespace, and its Events. The
//! one thing only the leader knows, whether the rollout budget holds a reload, is read from the
//! `ReloadDeferred` Event the leader posts when it starts waiting. Nothing is guessed: a state is
//! only reported when the cluster shows it.

use std::collections::HashMap;

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

use crate::config::{Config, Output};
use crate::core::keys::{self, KeyDigests};
use crate::core::kinds::csi;
use crate::core::plan::{self, Change, Event as PlanEvent, PlanConfig};
use crate::core::policy::{Reason, ResourceFlags};
use crate::core::refs::ResourceRef;
use crate::core::release::Release;
use crate::core::restart::{self, PodState, Restarts, Step};
use crate::core::rollout::Progress;
use crate::core::window::{own_window, window_of, Windows, RELOAD_WINDOW_ANNOTATION};
use crate::core::{ResourceKind, WorkloadKind};
use crate::index::ResourceKey;
use crate::watch::digests;

/// `KIND/NAME` as kubectl takes it: a kind, its plural or short name, optionally with its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: WorkloadKind,
    pub name: String,
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, name) = s
            .split_once('/')
            .filter(|(k, n)| !k.is_empty() && !n.is_empty() && !n.contains('/'))
            .ok_or_else(|| format!("{s:?}: expected KIND/NAME, for example deploy/web"))?;
        let kind = kind_from_kubectl(kind).ok_or_else(|| {
            format!(
                "{kind:?} is not a kind rekindle reloads (deploy, sts, ds, cj, job, rollout, dc)"
            )
        })?;
        Ok(Self {
            kind,
            name: name.to_string(),
        })
    }
}

/// The kinds and names kubectl accepts for the workload kinds: `deploy`, `deployments`,
/// `Deployment`, `deployments.apps`, …
pub fn kind_from_kubectl(s: &str) -> Option<WorkloadKind> {
    let lower = s.to_ascii_lowercase();
    let base = lower.split('.').next().unwrap_or_default();
    Some(match base {
        "deploy" | "deployment" | "deployments" => WorkloadKind::Deployment,
        "sts" | "statefulset" | "statefulsets" => WorkloadKind::StatefulSet,
        "ds" | "daemonset" | "daemonsets" => WorkloadKind::DaemonSet,
        "cj" | "cronjob" | "cronjobs" => WorkloadKind::CronJob,
        "job" | "jobs" => WorkloadKind::Job,
        "ro" | "rollout" | "rollouts" => WorkloadKind::Rollout,
        "dc" | "deploymentconfig" | "deploymentconfigs" => WorkloadKind::DeploymentConfig,
        _ => return None,
    })
}

/// Where the answers are written from: `rekindle why`'s arguments besides the server flags.
pub struct WhyRequest {
    pub target: Option<Target>,
    pub namespace: Option<String>,
    pub all_namespaces: bool,
    pub output: Output,
}

/// Runs `rekindle why`; an error means the workload or the cluster could not be read (exit 1).
pub fn run_why(config: &Config, request: WhyRequest) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (client, default_ns) = client(config).await?;
        let namespace = request.namespace.clone().unwrap_or(default_ns);
        let mut cluster = Cluster::new(client, config);
        let writer = cluster.writer(&config.leader_election.lease_name).await;
        match &request.target {
            Some(target) => {
                let obj = cluster
                    .workload(target.kind, &namespace, &target.name)
                    .await?
                    .ok_or_else(|| {
                        anyhow!(
                            "{} {namespace}/{} not found",
                            target.kind.name(),
                            target.name
                        )
                    })?;
                let mut answer = cluster.assess(target.kind, &obj).await?;
                answer["writer"] = writer.clone();
                print(&answer, request.output, true);
            }
            None => {
                let scope = (!request.all_namespaces).then_some(namespace.as_str());
                let mut found = 0;
                for kind in WorkloadKind::ALL {
                    for obj in cluster.list(kind, scope).await? {
                        let mut answer = cluster.assess(kind, &obj).await?;
                        let state = answer["state"].as_str().unwrap_or_default();
                        if matches!(state, "current" | "not-reloaded") {
                            continue;
                        }
                        answer["writer"] = writer.clone();
                        print(&answer, request.output, false);
                        found += 1;
                    }
                }
                if found == 0 && request.output == Output::Text {
                    let scope =
                        scope.map_or("any namespace".to_string(), |n| format!("namespace {n}"));
                    println!("every workload in {scope} is current: rekindle owes nothing");
                }
                if request.output == Output::Text {
                    println!("{}", writer_line(&writer));
                }
            }
        }
        Ok(())
    })
}

async fn client(config: &Config) -> Result<(Client, String)> {
    let kube_config = crate::config::kube_config(config.kubeconfig.as_deref()).await?;
    let namespace = kube_config.default_namespace.clone();
    Ok((Client::try_from(kube_config)?, namespace))
}

/// A resource as it is now: its hash, value digests and reload flags.
#[derive(Clone)]
struct Resource {
    hash: String,
    digests: Option<KeyDigests>,
    flags: ResourceFlags,
}

struct Cluster {
    client: Client,
    cfg: PlanConfig,
    default_window: Option<Windows>,
    now: jiff::Timestamp,
    resources: HashMap<(String, ResourceRef), Option<Resource>>,
    namespace_windows: HashMap<String, Option<String>>,
    /// The canaries and halted workloads of each namespace read so far.
    peers: HashMap<String, Vec<(WorkloadKind, Value)>>,
}

impl Cluster {
    fn new(client: Client, config: &Config) -> Self {
        Self {
            client,
            cfg: config.plan.clone(),
            default_window: config.release.reload_window.clone(),
            now: jiff::Timestamp::now(),
            resources: HashMap::new(),
            namespace_windows: HashMap::new(),
            peers: HashMap::new(),
        }
    }

    fn api(&self, kind: WorkloadKind, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = kind.api_resource();
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    async fn workload(&self, kind: WorkloadKind, ns: &str, name: &str) -> Result<Option<Value>> {
        let obj = self
            .api(kind, Some(ns))
            .get_opt(name)
            .await
            .with_context(|| format!("reading {} {ns}/{name}", kind.name()))?;
        obj.map(serde_json::to_value)
            .transpose()
            .map_err(Into::into)
    }

    /// Every workload of a kind (none when the kind is not served, e.g. no Argo Rollouts).
    async fn list(&self, kind: WorkloadKind, ns: Option<&str>) -> Result<Vec<Value>> {
        match self.api(kind, ns).list(&ListParams::default()).await {
            Ok(list) => Ok(list
                .items
                .into_iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
            Err(e) => Err(e).with_context(|| format!("listing {}s", kind.name())),
        }
    }

    async fn resource(&mut self, ns: &str, r: &ResourceRef) -> Result<Option<Resource>> {
        let key = (ns.to_string(), r.clone());
        if let Some(cached) = self.resources.get(&key) {
            return Ok(cached.clone());
        }
        let read = match r.kind {
            ResourceKind::SecretProviderClass => self.class(ns, &r.name).await?,
            _ => digests::read(&self.client, &ResourceKey::new(r.kind, ns, &r.name))
                .await?
                .map(|read| Resource {
                    hash: read.digests.of.to_string(),
                    flags: ResourceFlags::from_annotations(
                        &self.cfg.policy.keys,
                        &read.annotations,
                    ),
                    digests: Some(read.digests),
                }),
        };
        self.resources.insert(key, read.clone());
        Ok(read)
    }

    /// A SecretProviderClass's hash: that of its most recently written pod status, as the server keeps.
    async fn class(&self, ns: &str, name: &str) -> Result<Option<Resource>> {
        let statuses: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &csi::pod_statuses());
        let list = match statuses.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let newest = list
            .items
            .into_iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .filter_map(|v| {
                let (class, hash) = crate::core::hash::spcps_hash_json(&v)?;
                let rv: u64 = v
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                (class == name).then_some((rv, hash))
            })
            .max();
        let classes: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &csi::secret_provider_classes());
        let flags = match classes.get_opt(name).await {
            Ok(Some(c)) => ResourceFlags::from_annotations(&self.cfg.policy.keys, c.annotations()),
            _ => ResourceFlags::default(),
        };
        Ok(newest.map(|(_, hash)| Resource {
            hash,
            digests: None,
            flags,
        }))
    }

    async fn namespace_window(&mut self, ns: &str) -> Result<Option<String>> {
        if let Some(w) = self.namespace_windows.get(ns) {
            return Ok(w.clone());
        }
        let window = Api::<Namespace>::all(self.client.clone())
            .get_opt(ns)
            .await?
            .and_then(|n| n.annotations().get(RELOAD_WINDOW_ANNOTATION).cloned());
        self.namespace_windows
            .insert(ns.to_string(), window.clone());
        Ok(window)
    }

    /// The canaries and halted workloads of a namespace.
    async fn peers(&mut self, ns: &str) -> Result<Vec<(WorkloadKind, Value)>> {
        if let Some(p) = self.peers.get(ns) {
            return Ok(p.clone());
        }
        let mut out = Vec::new();
        for kind in WorkloadKind::ALL {
            for obj in self.list(kind, Some(ns)).await? {
                if Release::of(&obj, kind, self.cfg.pod_restarts).marked() {
                    out.push((kind, obj));
                }
            }
        }
        self.peers.insert(ns.to_string(), out.clone());
        Ok(out)
    }

    /// The workload's Events by reason, newest last: (time, reason, message).
    async fn events(
        &self,
        kind: WorkloadKind,
        ns: &str,
        name: &str,
    ) -> Result<Vec<(jiff::Timestamp, String, String)>> {
        let list = Api::<Event>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await?;
        let mut out: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some(kind.name()))
            .filter_map(|e| {
                let at = e
                    .series
                    .as_ref()
                    .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
                    .or(e.last_timestamp.as_ref().map(|t| t.0))
                    .or(e.event_time.as_ref().map(|t| t.0))
                    .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
                Some((
                    at,
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                ))
            })
            .collect();
        out.sort_by_key(|(at, _, _)| *at);
        Ok(out)
    }

    /// Who is writing: the leader's Lease, when rekindle runs with `--enable-ha`.
    async fn writer(&self, lease_name: &str) -> Value {
        let leases = Api::<Lease>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={lease_name}")))
            .await;
        let Ok(leases) = leases else {
            return json!({"leader": null, "note": "the leader's Lease could not be read"});
        };
        for lease in leases.items {
            let Some(spec) = lease.spec else { continue };
            let (Some(holder), Some(renewed), Some(duration)) = (
                spec.holder_identity.filter(|h| !h.is_empty()),
                spec.renew_time.map(|t| t.0),
                spec.lease_duration_seconds,
            ) else {
                continue;
            };
            let expires = renewed
                .checked_add(jiff::SignedDuration::from_secs(duration.into()))
                .unwrap_or(renewed);
            let held = expires > self.now;
            return json!({
                "leader": held.then_some(holder.clone()),
                "lease": format!("{}/{lease_name}", lease.metadata.namespace.unwrap_or_default()),
                "renewed": renewed.to_string(),
                "note": if held { format!("{holder} leads and writes") } else {
                    format!("the Lease expired at {expires}: nothing is writing")
                },
            });
        }
        json!({"leader": null, "note": format!("no Lease {lease_name} is held: nothing is writing, unless one rekindle runs without --enable-ha")})
    }

    /// The answer for one workload.
    async fn assess(&mut self, kind: WorkloadKind, obj: &Value) -> Result<Value> {
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let now = self.now.as_second();
        let mut resources = Vec::new();
        // (ref, current hash) of each reference whose marker is out of date.
        let mut owed: Vec<(ResourceRef, String)> = Vec::new();
        let mut reloads_for_any = false;
        for (r, marker) in plan::markers(&self.cfg, obj, kind) {
            let Some(res) = self.resource(&ns, &r).await? else {
                resources.push(
                    json!({"kind": r.kind.kind_name(), "name": r.name, "current": null,
                    "marker": marker, "reload": false, "reason": "not-found"}),
                );
                continue;
            };
            let read = plan::keys_read(&self.cfg, obj, kind, &r);
            let due = keys::owed(read.as_ref(), &res.hash, res.digests.as_ref())
                .ok_or_else(|| anyhow!("no value digests for {} {}", r.kind.kind_name(), r.name))?;
            let change = Change {
                kind: r.kind,
                name: &r.name,
                namespace: &ns,
                hash: &due.write,
                flags: res.flags,
                event: PlanEvent::Update,
                also_current: due.also_current.as_deref(),
            };
            let p = plan::plan(&self.cfg, obj, kind, &change, now);
            let reason = p.decision.reason;
            let reload =
                p.decision.reload || matches!(reason, Reason::AlreadyCurrent | Reason::UnusedKeys);
            reloads_for_any |= reload;
            // A reference without a marker is left alone until the resource changes (behaviour §10).
            if p.decision.reload && marker.is_some() {
                owed.push((r.clone(), res.hash.clone()));
            }
            resources.push(
                json!({"kind": r.kind.kind_name(), "name": r.name, "current": due.write,
                "marker": marker, "reload": reload, "reason": reason.as_str(), "keysRead": read}),
            );
        }
        let mut deferred = Value::Null;
        let state = if !reloads_for_any {
            "not-reloaded"
        } else if owed.is_empty() {
            "current"
        } else if let Some(halt) = self.halt(kind, obj, &ns, &owed).await? {
            deferred = halt;
            "halted"
        } else if let Some(hold) = self.hold(kind, obj, &ns, &name, &owed).await? {
            deferred = hold;
            "deferred"
        } else {
            "owed"
        };
        let pods = self.pod_restarts(kind, obj, &ns).await?;
        let state = match &pods {
            Some(p)
                if state == "current" && p["behind"].as_array().is_some_and(|b| !b.is_empty()) =>
            {
                "restarting"
            }
            _ => state,
        };
        let events = self.events(kind, &ns, &name).await?;
        let last_reload = events
            .iter()
            .rev()
            .find(|(_, reason, _)| reason == "Reloaded")
            .map(|(at, _, message)| json!({"at": at.to_string(), "message": message}));
        Ok(json!({
            "workload": {"kind": kind.name(), "namespace": ns, "name": name},
            "state": state,
            "resources": resources,
            "deferred": deferred,
            "pods": pods,
            "lastReload": last_reload,
        }))
    }

    /// Of a workload whose pods rekindle restarts by eviction: its pods still running older config
    /// than its template, and what the walk does next (evict, or wait for which pod), as the leader's
    /// next step would find them. `None` for any other workload.
    async fn pod_restarts(
        &self,
        kind: WorkloadKind,
        obj: &Value,
        ns: &str,
    ) -> Result<Option<Value>> {
        if restart::restarts(obj, kind, self.cfg.pod_restarts) != Restarts::Evict {
            return Ok(None);
        }
        let uid = obj
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some(selector) = restart::selector(obj) else {
            return Ok(None);
        };
        let listed = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().labels(&selector))
            .await
            .context("listing the workload's pods")?;
        let template = restart::template_markers(&self.cfg, obj, kind);
        let mut states: Vec<PodState> = listed
            .items
            .iter()
            .filter_map(|pod| serde_json::to_value(pod).ok())
            .filter(|pod| restart::owned_by(pod, uid))
            .map(|pod| PodState::of(&self.cfg, &template, kind, &pod))
            .collect();
        states.sort_by(|a, b| a.name.cmp(&b.name));
        let desired = restart::desired_pods(obj, kind);
        let max_unavailable = restart::max_unavailable(obj, desired).unwrap_or(1);
        let behind: Vec<&str> = states
            .iter()
            .filter(|p| p.behind && !p.terminating)
            .map(|p| p.name.as_str())
            .collect();
        let next = match restart::step(desired, &states, max_unavailable) {
            Step::Done => "nothing: every pod runs the template's config".to_string(),
            Step::Wait { waiting_for } => format!("waiting for {waiting_for}"),
            Step::Evict(names) => format!("evict {}", names.join(", ")),
        };
        Ok(Some(
            json!({"restartedBy": "rekindle", "behind": behind, "next": next,
            "maxUnavailable": max_unavailable}),
        ))
    }

    /// The halt holding one of the owed changes: this workload's own or a peer's.
    async fn halt(
        &mut self,
        kind: WorkloadKind,
        obj: &Value,
        ns: &str,
        owed: &[(ResourceRef, String)],
    ) -> Result<Option<Value>> {
        let mut carriers = vec![(kind, obj.clone())];
        carriers.extend(self.peers(ns).await?);
        for (peer_kind, peer) in carriers {
            let Some(halt) = Release::of(&peer, peer_kind, self.cfg.pod_restarts).halt() else {
                continue;
            };
            if let Some((r, _)) = owed.iter().find(|(r, hash)| halt.holds(r, hash)) {
                let carrier = peer
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                return Ok(Some(
                    json!({"reason": "halt", "until": null, "message": format!(
                    "the change of {} '{}' is halted by {} '{carrier}' ({}): reloads owed for it wait until that workload is healthy again, its {} annotation is removed, or the resource changes",
                    r.kind.kind_name(), r.name, peer_kind.name(), halt.reason, crate::core::release::HALTED_ANNOTATION)}),
                ));
            }
        }
        Ok(None)
    }

    /// A window, a canary or the rollout budget holding the owed reload back.
    async fn hold(
        &mut self,
        kind: WorkloadKind,
        obj: &Value,
        ns: &str,
        name: &str,
        owed: &[(ResourceRef, String)],
    ) -> Result<Option<Value>> {
        let ns_window = self.namespace_window(ns).await?;
        if let Ok(Some(window)) = window_of(
            own_window(obj),
            ns_window.as_deref(),
            self.default_window.as_ref(),
        ) {
            if let Some(opens) = window.opens_at(self.now) {
                return Ok(Some(json!({"reason": "window", "until": opens.to_string(),
                    "message": format!("its reload window ({window}) is closed; it opens at {opens}")})));
            }
        }
        if !Release::of(obj, kind, self.cfg.pod_restarts).canary {
            for (peer_kind, peer) in self.peers(ns).await? {
                if !Release::of(&peer, peer_kind, self.cfg.pod_restarts).canary {
                    continue;
                }
                let peer_name = peer
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                for (r, _) in owed {
                    if let Some(what) = self.canary_waits(peer_kind, &peer, ns, r).await? {
                        return Ok(Some(
                            json!({"reason": "canary", "until": null, "message": format!(
                            "canary {} '{peer_name}' {what} for the change of {} '{}'",
                            peer_kind.name(), r.kind.kind_name(), r.name)}),
                        ));
                    }
                }
            }
        }
        // The budget's queue is in the leader's memory: its ReloadDeferred Event, newer than the
        // last reload, says the reload waits for a slot.
        let events = self.events(kind, ns, name).await?;
        let last = events
            .iter()
            .rev()
            .find(|(_, reason, _)| reason == "Reloaded" || reason == "ReloadDeferred");
        if let Some((at, reason, message)) = last {
            if reason == "ReloadDeferred" && message.contains("--max-rollouts-in-progress") {
                return Ok(Some(json!({"reason": "budget", "until": null,
                    "message": format!("{message} (the leader's Event of {at})")})));
            }
        }
        Ok(None)
    }

    /// Whether a canary has not finished the change of `r` (as the leader's release order decides).
    async fn canary_waits(
        &mut self,
        kind: WorkloadKind,
        canary: &Value,
        ns: &str,
        r: &ResourceRef,
    ) -> Result<Option<&'static str>> {
        let Some((_, marker)) = plan::markers(&self.cfg, canary, kind)
            .into_iter()
            .find(|(m, _)| m == r)
        else {
            return Ok(None);
        };
        let Some(res) = self.resource(ns, r).await? else {
            return Ok(None);
        };
        let read = plan::keys_read(&self.cfg, canary, kind, r);
        let Some(due) = keys::owed(read.as_ref(), &res.hash, res.digests.as_ref()) else {
            return Ok(None);
        };
        let current = marker
            .as_deref()
            .is_some_and(|m| m == due.write || Some(m) == due.also_current.as_deref());
        if current {
            let progress = Release::of(canary, kind, self.cfg.pod_restarts).progress;
            return Ok((progress != Progress::Finished).then_some("has not finished its rollout"));
        }
        let change = Change {
            kind: r.kind,
            name: &r.name,
            namespace: ns,
            hash: &due.write,
            flags: res.flags,
            event: PlanEvent::Update,
            also_current: due.also_current.as_deref(),
        };
        let p = plan::plan(&self.cfg, canary, kind, &change, self.now.as_second());
        Ok((!p.changes.is_empty()).then_some("has not reloaded yet"))
    }
}

fn writer_line(writer: &Value) -> String {
    format!("writer:   {}", writer["note"].as_str().unwrap_or(""))
}

fn print(answer: &Value, output: Output, detail: bool) {
    if output == Output::Json {
        println!("{answer}");
        return;
    }
    let w = &answer["workload"];
    let who = format!(
        "{} {}/{}",
        w["kind"].as_str().unwrap_or(""),
        w["namespace"].as_str().unwrap_or(""),
        w["name"].as_str().unwrap_or("")
    );
    let state = answer["state"].as_str().unwrap_or("");
    let resources = answer["resources"].as_array().cloned().unwrap_or_default();
    let stale: Vec<String> = resources
        .iter()
        .filter(|r| r["reload"] == true && !r["marker"].is_null() && r["marker"] != r["current"])
        .filter(|r| r["reason"] != "unused-keys" && r["reason"] != "already-current")
        .map(|r| {
            format!(
                "{} '{}'",
                r["kind"].as_str().unwrap_or(""),
                r["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    let headline = match state {
        "current" => "CURRENT: its pods run the config it reloads for".to_string(),
        "not-reloaded" => {
            "NOT RELOADED: it reloads for none of the resources it references".to_string()
        }
        "owed" => format!(
            "OWED: {} changed and nothing holds the reload back; the leader should write it",
            stale.join(", ")
        ),
        "restarting" => format!(
            "RESTARTING: its template is current; pods {} run older config, next: {}",
            answer["pods"]["behind"]
                .as_array()
                .map(|b| b
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default(),
            answer["pods"]["next"].as_str().unwrap_or("")
        ),
        "halted" | "deferred" => format!(
            "{}: {}",
            state.to_uppercase(),
            answer["deferred"]["message"].as_str().unwrap_or("")
        ),
        other => other.to_string(),
    };
    println!("{who}: {headline}");
    if !detail {
        return;
    }
    for r in &resources {
        let short = |v: &Value| {
            v.as_str()
                .map_or("-".to_string(), |s| s.chars().take(12).collect())
        };
        let keys = r["keysRead"]
            .as_array()
            .map(|k| {
                let names: Vec<&str> = k.iter().filter_map(Value::as_str).collect();
                format!(", reads keys {}", names.join(", "))
            })
            .unwrap_or_default();
        println!(
            "  {} '{}': {} ({}{keys}); marker {}, now {}",
            r["kind"].as_str().unwrap_or(""),
            r["name"].as_str().unwrap_or(""),
            if r["reload"] == true {
                "reloads"
            } else {
                "does not reload"
            },
            r["reason"].as_str().unwrap_or(""),
            short(&r["marker"]),
            short(&r["current"]),
        );
    }
    if let Some(until) = answer["deferred"]["until"].as_str() {
        println!("  until:    {until}");
    }
    if let Some(pods) = answer["pods"].as_object() {
        let behind = pods["behind"].as_array().map_or(0, Vec::len);
        println!(
            "  pods: restarted by rekindle by eviction, {behind} behind; next: {}",
            pods["next"].as_str().unwrap_or("")
        );
    }
    match answer["lastReload"].as_object() {
        Some(last) => println!(
            "  last reload: {} ({})",
            last["at"].as_str().unwrap_or(""),
            last["message"].as_str().unwrap_or("")
        ),
        None => println!("  last reload: none recorded in its Events"),
    }
    println!("  {}", writer_line(&answer["writer"]));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_as_kubectl_names_them() {
        for (s, kind) in [
            ("deploy/web", WorkloadKind::Deployment),
            ("deployments.apps/web", WorkloadKind::Deployment),
            ("Deployment/web", WorkloadKind::Deployment),
            ("sts/web", WorkloadKind::StatefulSet),
            ("ds/web", WorkloadKind::DaemonSet),
            ("cj/web", WorkloadKind::CronJob),
            ("job/web", WorkloadKind::Job),
            ("rollout/web", WorkloadKind::Rollout),
            ("ro/web", WorkloadKind::Rollout),
            ("dc/web", WorkloadKind::DeploymentConfig),
        ] {
            let t: Target = s.parse().unwrap();
            assert_eq!((t.kind, t.name.as_str()), (kind, "web"), "{s}");
        }
        for bad in ["web", "pod/web", "deploy/", "/web", "deploy/a/b"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }
}
