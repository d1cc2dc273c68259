//! Pod restarts (`rekindle.io/restart: pods`, `core::restart`): one step of a walk at a time. Each
//! step reads the workload and its pods, evicts the next pods still running older config if the
//! disruption allowed says so, and answers when to look again. Nothing is remembered between steps
//! but what the Events said: the pods are the state, so a new leader continues where they stand.

use std::ops::ControlFlow;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, DynamicObject, EvictParams, ListParams, Preconditions};
use kube::runtime::events::EventType;
use kube::Api;
use serde_json::Value;

use super::{events, Writer};
use crate::core::pod_groups;
use crate::core::refs::ResourceRef;
use crate::core::restart::{self, PodState, Restarts, Step};
use crate::core::{rollout, WorkloadKind};
use crate::index::{ResourceKey, WorkloadKey};
use crate::metrics::{ErrorKind, Eviction};
use crate::reload::error::WriteError;

/// How soon a walk looks again while it waits for pods (the workload's status changes wake it
/// sooner), after an eviction, and after a refusal or a failure.
const WALK_RECHECK: Duration = Duration::from_secs(2);
const WALK_RETRY: Duration = Duration::from_secs(5);

/// What a walk in progress has told: posted once each, not again while it stays so.
#[derive(Debug, Default, Clone)]
pub(super) struct Walk {
    /// It has evicted a pod (in this process): `PodRestartsStarted` was posted.
    started: bool,
    /// What it waits for, last logged.
    waiting_for: Option<String>,
    /// The PodDisruptionBudget that refused its last eviction, as its Event named it.
    blocked_by: Option<String>,
    /// Of a group of labelled pods: the most pods seen alive (its owner's replicas are not read).
    most_pods: usize,
}

/// What one step of a walk reads: the object its Events go to, its pods and how many may be down.
struct WalkInput {
    subject: ObjectReference,
    pods: Api<Pod>,
    states: Vec<PodState>,
    desired: usize,
    max_unavailable: usize,
}

/// A walk to take one step on, or when to look again (`None`: never, the walk has ended).
type Read = ControlFlow<Option<Duration>, WalkInput>;

impl Writer {
    /// One step of the pod-restart walk of `key`; when to look again, or `None` when every pod runs
    /// the template's config (or the workload is not one whose pods rekindle restarts).
    pub(super) async fn restart_pods(&self, key: &WorkloadKey) -> Option<Duration> {
        if !self.plan.pod_restarts {
            return None;
        }
        match self.walk_step(key).await {
            Ok(after) => after,
            Err(e) => {
                tracing::warn!(error = %e, after = ?WALK_RETRY, "pod restarts: step failed; trying again");
                self.metrics.error(ErrorKind::PodRestart);
                Some(WALK_RETRY)
            }
        }
    }

    async fn walk_step(&self, key: &WorkloadKey) -> Result<Option<Duration>, WriteError> {
        let read = if key.kind == WorkloadKind::Pods {
            self.read_group(key).await?
        } else {
            self.read_workload(key).await?
        };
        match read {
            ControlFlow::Continue(walk) => self.walk(key, walk).await,
            ControlFlow::Break(after) => {
                if after.is_none() {
                    self.end_walk(key);
                }
                Ok(after)
            }
        }
    }

    /// An `OnDelete` StatefulSet or DaemonSet with `rekindle.io/restart: pods`, and its own pods.
    async fn read_workload(&self, key: &WorkloadKey) -> Result<Read, WriteError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &key.namespace,
            &key.kind.api_resource(),
        );
        let Some(obj) = api
            .get_opt(&key.name)
            .await
            .map_err(|e| WriteError::from_kube("GET", e))?
        else {
            return Ok(ControlFlow::Break(None));
        };
        let workload = serde_json::to_value(&obj)
            .map_err(|_| WriteError::Invalid("workload does not serialise".into()))?;
        if restart::restarts(&workload, key.kind, true) != Restarts::Evict {
            return Ok(ControlFlow::Break(None));
        }
        if !rollout::caught_up(&workload) {
            tracing::debug!("pod restarts wait for the controller to see the template");
            return Ok(ControlFlow::Break(Some(WALK_RECHECK)));
        }
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let subject = events::subject(key, Some(&uid));
        let Some(selector) = restart::selector(&workload) else {
            let note =
                "its selector cannot be read as a label query; no pod is restarted".to_string();
            self.warn_invalid(key, Some(&uid), "spec.selector", "", note)
                .await;
            return Ok(ControlFlow::Break(None));
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let listed = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| WriteError::from_kube("LIST", e))?;
        let template = restart::template_markers(&self.plan, &workload, key.kind);
        let states: Vec<PodState> = listed
            .items
            .iter()
            .filter_map(|pod| serde_json::to_value(pod).ok())
            .filter(|pod| restart::owned_by(pod, &uid))
            .map(|pod| PodState::of(&self.plan, &template, key.kind, &pod))
            .collect();
        let desired = restart::desired_pods(&workload, key.kind);
        let max_unavailable = self
            .max_unavailable(key, &subject, &workload, desired)
            .await;
        Ok(ControlFlow::Continue(WalkInput {
            subject,
            pods,
            states,
            desired,
            max_unavailable,
        }))
    }

    /// The labelled pods of one controller owner rekindle does not write (`core::pod_groups`): each
    /// is behind when a hash it was stamped with is not the current one. The owner is never read or
    /// written; Events go to it by the pods' owner reference.
    async fn read_group(&self, key: &WorkloadKey) -> Result<Read, WriteError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let listed = pods
            .list(&ListParams::default().labels(pod_groups::POD_SELECTOR))
            .await
            .map_err(|e| WriteError::from_kube("LIST", e))?;
        let members: Vec<Value> = listed
            .items
            .iter()
            .filter_map(|pod| serde_json::to_value(pod).ok())
            .filter(|pod| pod_groups::group_of(pod) == key.name)
            .collect();
        let Some(first) = members.first() else {
            return Ok(ControlFlow::Break(None));
        };
        let Some(owner) = pod_groups::controller_owner(first) else {
            let text = |pointer: &str| {
                first
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .map(String::from)
            };
            let name = text("/metadata/name").unwrap_or_default();
            let pod = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.clone()),
                namespace: Some(key.namespace.to_string()),
                uid: text("/metadata/uid"),
                ..Default::default()
            };
            if self.first_time(key, "no controller owner") {
                let note = format!(
                    "Pod {name} runs older config but has no controller owner: evicted, it would not come back. It is not restarted; delete it to restart it"
                );
                tracing::warn!(pod = %name, "labelled for pod restarts without a controller owner; not evicted");
                self.publish_on(&pod, EventType::Warning, "PodNotRestarted", note)
                    .await;
            }
            return Ok(ControlFlow::Break(None));
        };
        let subject = ObjectReference {
            api_version: Some(owner.api_version.clone()),
            kind: Some(owner.kind.clone()),
            name: Some(owner.name.clone()),
            namespace: Some(key.namespace.to_string()),
            uid: Some(owner.uid.clone()),
            ..Default::default()
        };
        if let Some((kind, name)) = pod_groups::written_workload(first, &owner) {
            let workload = WorkloadKey {
                kind,
                namespace: key.namespace.clone(),
                name: name.into(),
            };
            if self.index.workload(&workload).is_some() {
                if self.first_time(key, "left to its workload") {
                    let note = format!(
                        "Its pods are labelled {}={} but belong to {workload}, which rekindle reloads itself: they are left to its reload, never restarted twice (annotate {kind} '{}' to reload it)",
                        pod_groups::POD_LABEL, pod_groups::POD_LABEL_VALUE, workload.name
                    );
                    tracing::info!(%workload, "labelled pods left to their workload's reload");
                    self.publish_on(
                        &subject,
                        EventType::Normal,
                        "PodRestartsLeftToWorkload",
                        note,
                    )
                    .await;
                }
                return Ok(ControlFlow::Break(None));
            }
        }
        let current = |r: &ResourceRef| {
            self.index
                .resource(&ResourceKey::new(r.kind, &key.namespace, &r.name))
                .map(|e| e.hash.to_string())
        };
        let states: Vec<PodState> = members
            .iter()
            .filter(|pod| restart::owned_by(pod, &owner.uid))
            .map(|pod| PodState::with(pod, pod_groups::behind(&pod_groups::stamps(pod), current)))
            .collect();
        // An operator's replicas are not read (its kind is anyone's): the most pods seen alive
        // during the walk, and every pod until a terminating one is gone.
        let alive = states.iter().filter(|p| !p.terminating).count();
        let desired = {
            let mut walks = self.walks();
            let walk = walks.entry(key.clone()).or_default();
            walk.most_pods = walk.most_pods.max(alive);
            pod_groups::wanted(walk.most_pods, &states)
        };
        if let Some(left) = self.settling() {
            tracing::debug!(?left, "pod restarts watch the owner's pods before evicting: this replica has just begun to lead");
            return Ok(ControlFlow::Break(Some(left.min(WALK_RECHECK))));
        }
        let max_unavailable = self.max_unavailable(key, &subject, first, desired).await;
        Ok(ControlFlow::Continue(WalkInput {
            subject,
            pods,
            states,
            desired,
            max_unavailable,
        }))
    }

    /// `rekindle.io/max-unavailable` of `obj`; an invalid value is warned of once, and 1 is used.
    async fn max_unavailable(
        &self,
        key: &WorkloadKey,
        subject: &ObjectReference,
        obj: &Value,
        desired: usize,
    ) -> usize {
        match restart::max_unavailable(obj, desired) {
            Ok(n) => n,
            Err(why) => {
                let raw = obj
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(restart::MAX_UNAVAILABLE_ANNOTATION))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let note = format!("{why}; restarting one pod at a time");
                self.warn_invalid_on(key, subject, restart::MAX_UNAVAILABLE_ANNOTATION, raw, note)
                    .await;
                1
            }
        }
    }

    /// One step on what was read: evict the next pods behind, or wait, or finish.
    async fn walk(
        &self,
        key: &WorkloadKey,
        walk: WalkInput,
    ) -> Result<Option<Duration>, WriteError> {
        let WalkInput {
            subject,
            pods,
            states,
            desired,
            max_unavailable,
        } = walk;
        let what = format!(
            "{} '{}'",
            subject.kind.as_deref().unwrap_or_default(),
            subject.name.as_deref().unwrap_or_default()
        );
        let started = self.walks().get(key).is_some_and(|w| w.started);
        if !started && states.iter().all(|p| !p.behind || p.terminating) {
            // Nothing behind and no walk of this process to see to its end.
            self.end_walk(key);
            return Ok(None);
        }
        match restart::step(desired, &states, max_unavailable) {
            Step::Done => {
                if self.end_walk(key) {
                    let note = format!("Every pod of {what} runs the current config");
                    tracing::info!("pod restarts finished");
                    self.publish_on(&subject, EventType::Normal, "PodRestartsFinished", note)
                        .await;
                }
                Ok(None)
            }
            Step::Wait { waiting_for } => {
                let mut walks = self.walks();
                let walk = walks.entry(key.clone()).or_default();
                if walk.waiting_for.as_ref() != Some(&waiting_for) {
                    tracing::info!(waiting_for = %waiting_for, "pod restarts waiting");
                    walk.waiting_for = Some(waiting_for);
                }
                self.metrics
                    .pod_restarts_in_progress
                    .set(walks.len() as i64);
                Ok(Some(WALK_RECHECK))
            }
            Step::Evict(names) => {
                let behind = states.iter().filter(|p| p.behind && !p.terminating).count();
                if self.start_walk(key) {
                    let note = format!(
                        "Restarting {behind} of {} pods of {what} by eviction, at most {max_unavailable} at a time",
                        states.len(),
                    );
                    self.publish_on(&subject, EventType::Normal, "PodRestartsStarted", note)
                        .await;
                }
                for name in names {
                    let pod_uid = states
                        .iter()
                        .find(|p| p.name == name)
                        .and_then(|p| p.uid.clone());
                    if let Some(after) = self.evict(key, &subject, &pods, &name, pod_uid).await? {
                        return Ok(Some(after));
                    }
                }
                Ok(Some(WALK_RECHECK))
            }
        }
    }

    /// Evicts one pod (only the pod listed: a StatefulSet's replacement has the same name); when to
    /// look again if the eviction was refused.
    async fn evict(
        &self,
        key: &WorkloadKey,
        subject: &ObjectReference,
        pods: &Api<Pod>,
        name: &str,
        pod_uid: Option<String>,
    ) -> Result<Option<Duration>, WriteError> {
        self.still_leading()?;
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: Some(Preconditions {
                    uid: pod_uid,
                    resource_version: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        match pods.evict(name, &params).await {
            Ok(_) => {
                self.metrics.eviction(Eviction::Evicted);
                self.rollouts.progressed(key);
                if let Some(walk) = self.walks().get_mut(key) {
                    walk.blocked_by = None;
                }
                tracing::info!(pod = %name, "pod evicted: it ran older config");
                Ok(None)
            }
            // Gone, or already replaced: nothing of this pod is left to restart.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(None),
            Err(kube::Error::Api(s)) if s.code == 429 => {
                self.metrics.eviction(Eviction::DisruptionBudget);
                let (budget, why) = disruption_budget(&s)
                    .unwrap_or_else(|| ("a PodDisruptionBudget".into(), s.message.clone()));
                let first = self.walks().get_mut(key).is_some_and(|w| {
                    w.blocked_by.replace(budget.clone()).as_ref() != Some(&budget)
                });
                if first {
                    let note = format!(
                        "Pod restarts wait for PodDisruptionBudget {budget}: evicting pod {name} now would violate it ({why}); trying again"
                    );
                    tracing::info!(pod = %name, %budget, "eviction refused by a disruption budget");
                    self.publish_on(subject, EventType::Warning, "PodRestartsBlocked", note)
                        .await;
                }
                Ok(Some(WALK_RETRY))
            }
            Err(e) => {
                self.metrics.eviction(Eviction::Error);
                Err(WriteError::from_kube("evict", e))
            }
        }
    }

    /// How long this replica still watches groups before it evicts ([`pod_groups::SETTLE`] from the
    /// start of its leadership), or `None`.
    fn settling(&self) -> Option<Duration> {
        let since = (*self.leading_since.lock().unwrap_or_else(|e| e.into_inner()))?;
        pod_groups::SETTLE
            .checked_sub(since.elapsed())
            .filter(|left| !left.is_zero())
    }

    fn walks(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<WorkloadKey, Walk>> {
        self.walks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this starts the walk of `key` (its first eviction in this process).
    fn start_walk(&self, key: &WorkloadKey) -> bool {
        let mut walks = self.walks();
        let walk = walks.entry(key.clone()).or_default();
        let new = !std::mem::replace(&mut walk.started, true);
        self.metrics
            .pod_restarts_in_progress
            .set(walks.len() as i64);
        new
    }

    /// Whether a walk of `key` that evicted pods was in progress (in this process).
    fn end_walk(&self, key: &WorkloadKey) -> bool {
        if key.kind == WorkloadKind::Pods {
            self.rollouts.walk_ended(key);
        }
        let mut walks = self.walks();
        let ended = walks.remove(key).is_some_and(|w| w.started);
        self.metrics
            .pod_restarts_in_progress
            .set(walks.len() as i64);
        ended
    }
}

/// The PodDisruptionBudget named by an eviction's refusal, and the apiserver's word on it: its cause
/// reads "The disruption budget NAME needs …" (or "… NAME does not allow …").
fn disruption_budget(status: &kube::core::Status) -> Option<(String, String)> {
    status
        .details
        .as_ref()?
        .causes
        .iter()
        .filter(|c| c.reason == "DisruptionBudget")
        .find_map(|c| {
            let rest = c.message.strip_prefix("The disruption budget ")?;
            Some((
                rest.split_whitespace().next()?.to_string(),
                c.message.clone(),
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusing_budget_is_read_from_the_cause() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "status": "Failure", "code": 429, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget db-pdb needs 3 healthy pods and has 3 currently"}]}
        }))
        .unwrap();
        let (name, why) = disruption_budget(&status).unwrap();
        assert_eq!(name, "db-pdb");
        assert!(why.contains("needs 3 healthy pods"), "{why}");
        let bare: kube::core::Status =
            serde_json::from_value(serde_json::json!({"code": 429, "message": "slow down"}))
                .unwrap();
        assert_eq!(disruption_budget(&bare), None);
    }
}
