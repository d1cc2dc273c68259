//! Deployment pause (`deployment.reloader.stakater.com/pause-period`): the reload patch also pauses the
//! Deployment and records `paused-at`; the Deployment watch resumes it when the period is over. The state
//! lives in the object, so a restart of rekindle mid-pause resumes on time instead of never.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use backon::Retryable;

use super::error::WriteError;
use crate::core::pause::{self, resume_at, resume_ops};
use crate::core::policy::AnnotationKeys;
use crate::core::WorkloadKind;
use crate::index::WorkloadKey;
use crate::reload::lease::Leadership;
use crate::retry;

/// Resumes Deployments paused by rekindle when their period is over; driven by the Deployment watch.
/// Only the leader writes: a follower's resume waits until it leads (the resume is conditional on the
/// pause it saw, so one the leader already made is not made twice).
pub struct PauseReconciler {
    client: Client,
    keys: AnnotationKeys,
    leadership: Leadership,
    scheduled: Mutex<HashMap<WorkloadKey, String>>,
}

impl PauseReconciler {
    pub fn new(client: Client, keys: AnnotationKeys, leadership: Leadership) -> Arc<Self> {
        Arc::new(Self {
            client,
            keys,
            leadership,
            scheduled: Mutex::default(),
        })
    }

    /// The watch saw a Deployment: schedule its resume if rekindle paused it.
    pub fn observe(self: &Arc<Self>, key: &WorkloadKey, obj: &Value) {
        if key.kind != WorkloadKind::Deployment {
            return;
        }
        let Some(paused_at) = pause::paused_at(&self.keys, obj).map(String::from) else {
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
            this.leadership.clone().acquired().await;
            this.resume(&key, &paused_at).await;
            this.scheduled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
        });
    }

    async fn resume(&self, key: &WorkloadKey, paused_at: &str) {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &key.namespace,
            &key.kind.api_resource(),
        );
        let attempt = || async {
            let Some(obj) = api
                .get_opt(&key.name)
                .await
                .map_err(|e| WriteError::from_kube("GET", e))?
            else {
                return Ok(());
            };
            let value =
                serde_json::to_value(&obj).map_err(|e| WriteError::Render(e.to_string()))?;
            if pause::paused_at(&self.keys, &value) != Some(paused_at) {
                tracing::debug!(workload = %key, "resumed or re-paused meanwhile");
                return Ok(());
            }
            let params = PatchParams {
                field_manager: Some("rekindle".into()),
                ..Default::default()
            };
            let ops = json_patch::Patch(resume_ops(&self.keys, &value));
            api.patch(&key.name, &params, &Patch::Json::<()>(ops))
                .await
                .map_err(|e| WriteError::from_kube("PATCH", e))?;
            tracing::info!(workload = %key, "pause period over; resumed");
            Ok(())
        };
        let result = attempt
            .retry(retry::backoff(
                Duration::from_millis(200),
                Duration::from_secs(5),
                5,
            ))
            .sleep(tokio::time::sleep)
            .when(WriteError::retryable)
            .notify(|e, _| tracing::debug!(workload = %key, error = %e, "resume failed; retrying"))
            .await;
        if let Err(e) = result {
            if !matches!(e, WriteError::Gone) {
                tracing::warn!(workload = %key, error = %e, "could not resume the Deployment; the next watch event retries");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock_api::client;
    use crate::reload::lease::forever;
    use serde_json::json;
    use tokio::sync::watch;

    /// A follower schedules the resume of a Deployment whose pause is over but sends nothing until it
    /// leads; then it reads the Deployment to resume it.
    #[tokio::test]
    async fn only_the_leader_resumes() {
        let (client, mut handle) = client();
        let (lead, leading) = watch::channel(None);
        let pause = PauseReconciler::new(
            client,
            AnnotationKeys::default(),
            Leadership::from_channel(leading),
        );
        let keys = AnnotationKeys::default();
        let deployment = json!({"metadata": {"name": "web", "namespace": "ns", "annotations": {
            keys.paused_at.as_str(): "2020-01-01T00:00:00Z", keys.pause_period.as_str(): "1m"}}});
        let key = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "web".into(),
        };
        pause.observe(&key, &deployment);
        let early = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
        assert!(early.is_err(), "a follower sent a request");
        lead.send(Some(forever())).unwrap();
        let (request, _) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("the leader resumes")
            .unwrap();
        assert_eq!(request.method(), http::Method::GET);
        assert!(request
            .uri()
            .path()
            .ends_with("/namespaces/ns/deployments/web"));
    }
}
