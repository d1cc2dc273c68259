//! Pod restarts (`rekindle.io/restart: pods`, `core::restart`): one step of a walk at a time. Each
//! step reads the workload and its pods, evicts the next pods still running older config if the
//! disruption allowed says so, and answers when to look again. Nothing is remembered between steps
//! but what the Events said: the pods are the state, so a new leader continues where they stand.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, DynamicObject, EvictParams, ListParams, Preconditions};
use kube::runtime::events::EventType;
use kube::Api;
use serde_json::Value;

use super::Writer;
use crate::core::restart::{self, PodState, Restarts, Step};
use crate::core::rollout;
use crate::index::WorkloadKey;
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
}

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
            self.end_walk(key);
            return Ok(None);
        };
        let workload = serde_json::to_value(&obj)
            .map_err(|_| WriteError::Invalid("workload does not serialise".into()))?;
        if restart::restarts(&workload, key.kind, true) != Restarts::Evict {
            self.end_walk(key);
            return Ok(None);
        }
        if !rollout::caught_up(&workload) {
            tracing::debug!("pod restarts wait for the controller to see the template");
            return Ok(Some(WALK_RECHECK));
        }
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let Some(selector) = restart::selector(&workload) else {
            let note =
                "its selector cannot be read as a label query; no pod is restarted".to_string();
            self.warn_invalid(key, Some(&uid), "spec.selector", "", note)
                .await;
            return Ok(None);
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
        let max_unavailable = match restart::max_unavailable(&workload, desired) {
            Ok(n) => n,
            Err(why) => {
                let raw = workload
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(restart::MAX_UNAVAILABLE_ANNOTATION))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let note = format!("{why}; restarting one pod at a time");
                self.warn_invalid(
                    key,
                    Some(&uid),
                    restart::MAX_UNAVAILABLE_ANNOTATION,
                    raw,
                    note,
                )
                .await;
                1
            }
        };
        let started = self.walks().get(key).is_some_and(|w| w.started);
        if !started && states.iter().all(|p| !p.behind || p.terminating) {
            // Nothing behind and no walk of this process to see to its end.
            self.end_walk(key);
            return Ok(None);
        }
        match restart::step(desired, &states, max_unavailable) {
            Step::Done => {
                if self.end_walk(key) {
                    let note = format!(
                        "Every pod of {} '{}' runs the current config",
                        key.kind, key.name
                    );
                    tracing::info!("pod restarts finished");
                    self.publish(
                        key,
                        Some(&uid),
                        EventType::Normal,
                        "PodRestartsFinished",
                        note,
                    )
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
                        "Restarting {behind} of {} pods of {} '{}' by eviction, at most {max_unavailable} at a time",
                        states.len(),
                        key.kind,
                        key.name
                    );
                    self.publish(
                        key,
                        Some(&uid),
                        EventType::Normal,
                        "PodRestartsStarted",
                        note,
                    )
                    .await;
                }
                for name in names {
                    let pod_uid = states
                        .iter()
                        .find(|p| p.name == name)
                        .and_then(|p| p.uid.clone());
                    if let Some(after) = self.evict(key, &uid, &pods, &name, pod_uid).await? {
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
        workload_uid: &str,
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
                    self.publish(
                        key,
                        Some(workload_uid),
                        EventType::Warning,
                        "PodRestartsBlocked",
                        note,
                    )
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
