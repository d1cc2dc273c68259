//! Deployment pause (`deployment.reloader.stakater.com/pause-period`): the reload patch also pauses the
//! Deployment and records `paused-at`; the Deployment watch resumes it when the period is over. The state
//! lives in the object, so a restart of rekindle mid-pause resumes on time instead of never.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::core::pause::{self, resume_at, resume_ops};
use crate::core::policy::AnnotationKeys;
use crate::core::WorkloadKind;
use crate::index::WorkloadKey;

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
            if pause::paused_at(&self.keys, &value) != Some(paused_at) {
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
