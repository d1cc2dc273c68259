//! Deployment pause (`deployment.reloader.stakater.com/pause-period`): the reload patch also pauses the
//! Deployment and records `paused-at`; the Deployment watch resumes it when the period is over. The state
//! lives in the object, so a restart of rekindle mid-pause resumes on time instead of never.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::core::policy::AnnotationKeys;
use crate::core::WorkloadKind;
use crate::duration::parse_go_duration;
use crate::index::WorkloadKey;
use crate::reload::writer::api_resource;

#[derive(Debug, PartialEq)]
pub enum PauseDecision {
    /// No pause-period, or the Deployment is already paused (by the user, or by us earlier).
    None,
    Pause(Vec<PatchOperation>),
    /// The period does not parse: reload without pause and say so.
    Invalid(String),
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn annotation_path(key: &str) -> PointerBuf {
    PointerBuf::from_tokens(["metadata", "annotations", key])
}

/// Ops that pause a Deployment being reloaded, rendered against `obj` (which already has annotations
/// when the marker changes added them; `annotations_exist` says whether they do).
pub fn pause_ops(
    keys: &AnnotationKeys,
    obj: &Value,
    annotations_exist: bool,
    now: jiff::Timestamp,
) -> PauseDecision {
    let Some(period) = annotation(obj, &keys.pause_period) else {
        return PauseDecision::None;
    };
    if let Err(e) = parse_go_duration(period) {
        return PauseDecision::Invalid(e.to_string());
    }
    if obj.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
        return PauseDecision::None;
    }
    let mut ops = Vec::new();
    if !annotations_exist {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations"]),
            value: json!({}),
        }));
    }
    ops.push(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["spec", "paused"]),
        value: json!(true),
    }));
    ops.push(PatchOperation::Add(AddOperation {
        path: annotation_path(&keys.paused_at),
        value: json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
    }));
    PauseDecision::Pause(ops)
}

/// When a Deployment paused by rekindle is due to resume; `None` when it is not paused by rekindle.
pub fn resume_at(keys: &AnnotationKeys, obj: &Value) -> Option<jiff::Timestamp> {
    let paused_at: jiff::Timestamp = annotation(obj, &keys.paused_at)?.parse().ok()?;
    // A missing or invalid period resumes at once rather than never.
    let period = annotation(obj, &keys.pause_period)
        .and_then(|p| parse_go_duration(p).ok())
        .unwrap_or_default();
    let period = jiff::SignedDuration::try_from(period).unwrap_or_default();
    paused_at.checked_add(period).ok()
}

pub fn resume_ops(keys: &AnnotationKeys, obj: &Value) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    if let Some(rv) = obj.pointer("/metadata/resourceVersion") {
        ops.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
            value: rv.clone(),
        }));
    }
    ops.push(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["spec", "paused"]),
        value: json!(false),
    }));
    if annotation(obj, &keys.paused_at).is_some() {
        ops.push(PatchOperation::Remove(RemoveOperation {
            path: annotation_path(&keys.paused_at),
        }));
    }
    ops
}

/// Resumes Deployments paused by rekindle when their period is over; driven by the Deployment watch.
pub struct PauseReconciler {
    client: Client,
    keys: AnnotationKeys,
    scheduled: Mutex<HashMap<WorkloadKey, String>>,
}

impl PauseReconciler {
    pub fn new(client: Client, keys: AnnotationKeys) -> Arc<Self> {
        Arc::new(Self {
            client,
            keys,
            scheduled: Mutex::default(),
        })
    }

    /// The watch saw a Deployment: schedule its resume if rekindle paused it.
    pub fn observe(self: &Arc<Self>, key: &WorkloadKey, obj: &Value) {
        if key.kind != WorkloadKind::Deployment {
            return;
        }
        let Some(paused_at) = annotation(obj, &self.keys.paused_at).map(String::from) else {
            self.scheduled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
            return;
        };
        let Some(due) = resume_at(&self.keys, obj) else {
            return;
        };
        tracing::debug!(workload = %key, %due, "paused by rekindle; resume scheduled");
        {
            let mut scheduled = self.scheduled.lock().unwrap_or_else(|e| e.into_inner());
            if scheduled.get(key) == Some(&paused_at) {
                return;
            }
            scheduled.insert(key.clone(), paused_at.clone());
        }
        let this = self.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let wait = due.duration_since(jiff::Timestamp::now());
            if wait.is_positive() {
                tokio::time::sleep(Duration::try_from(wait).unwrap_or_default()).await;
            }
            this.resume(&key, &paused_at).await;
            this.scheduled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
        });
    }

    async fn resume(&self, key: &WorkloadKey, paused_at: &str) {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &api_resource(key.kind));
        for attempt in 0..6u32 {
            let obj = match api.get_opt(&key.name).await {
                Ok(Some(o)) => o,
                Ok(None) => return,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    continue;
                }
            };
            let Ok(value) = serde_json::to_value(&obj) else {
                return;
            };
            if annotation(&value, &self.keys.paused_at) != Some(paused_at) {
                tracing::debug!(workload = %key, "resumed or re-paused meanwhile");
                return;
            }
            let params = PatchParams {
                field_manager: Some("rekindle".into()),
                ..Default::default()
            };
            match api
                .patch(
                    &key.name,
                    &params,
                    &Patch::Json::<()>(json_patch::Patch(resume_ops(&self.keys, &value))),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(workload = %key, "pause period over; resumed");
                    return;
                }
                Err(e) => {
                    tracing::debug!(workload = %key, error = %e, "resume failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
        tracing::warn!(workload = %key, "could not resume the Deployment; the next watch event retries");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(annotations: Value, paused: Option<bool>) -> Value {
        let mut d = json!({"metadata": {"name": "d", "resourceVersion": "7", "annotations": annotations}, "spec": {}});
        if let Some(p) = paused {
            d["spec"]["paused"] = json!(p);
        }
        d
    }

    #[test]
    fn pause_then_resume() {
        let keys = AnnotationKeys::default();
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let d = deploy(
            json!({"deployment.reloader.stakater.com/pause-period": "1m30s"}),
            None,
        );
        let PauseDecision::Pause(ops) = pause_ops(&keys, &d, true, now) else {
            panic!("expected a pause")
        };
        let mut paused = d.clone();
        json_patch::patch(&mut paused, &ops).unwrap();
        assert_eq!(paused["spec"]["paused"], true);
        assert_eq!(
            paused["metadata"]["annotations"]["deployment.reloader.stakater.com/paused-at"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            resume_at(&keys, &paused),
            Some("2026-01-01T00:01:30Z".parse().unwrap())
        );
        // Already paused (by us): nothing more; changes accumulate.
        assert_eq!(pause_ops(&keys, &paused, true, now), PauseDecision::None);
        let mut resumed = paused.clone();
        json_patch::patch(&mut resumed, &resume_ops(&keys, &paused)).unwrap();
        assert_eq!(resumed["spec"]["paused"], false);
        assert!(resumed["metadata"]["annotations"]
            .get("deployment.reloader.stakater.com/paused-at")
            .is_none());
    }

    #[test]
    fn user_paused_and_invalid_periods() {
        let keys = AnnotationKeys::default();
        let now = jiff::Timestamp::now();
        let user = deploy(
            json!({"deployment.reloader.stakater.com/pause-period": "1m"}),
            Some(true),
        );
        assert_eq!(pause_ops(&keys, &user, true, now), PauseDecision::None);
        assert_eq!(
            resume_at(&keys, &user),
            None,
            "a user-paused Deployment is never resumed by rekindle"
        );
        let bad = deploy(
            json!({"deployment.reloader.stakater.com/pause-period": "soon"}),
            None,
        );
        assert!(matches!(
            pause_ops(&keys, &bad, true, now),
            PauseDecision::Invalid(_)
        ));
        assert_eq!(
            pause_ops(&keys, &deploy(json!({}), None), true, now),
            PauseDecision::None
        );
    }
}
