//! The Events the writer posts: a reload done, an invalid annotation (once per value), and any other.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event as KubeEvent, EventType};

use super::{Writer, WARNED_PRUNE_AT};
use crate::core::plan::Action;
use crate::core::refs::ResourceRef;
use crate::core::restart::{Restarts, RESTART_ANNOTATION};
use crate::index::WorkloadKey;
use crate::metrics::ErrorKind;
use crate::outbound::alert::reload_message;

impl Writer {
    /// One `Reloaded` Event (Reloader's message) and alert per resource that caused the reload.
    pub(super) async fn announce(
        &self,
        key: &WorkloadKey,
        uid: Option<&str>,
        reasons: &[ResourceRef],
        action: Action,
        restarts: Restarts,
    ) {
        for r in reasons {
            let mut note = format!(
                "Changes detected in '{}' of type '{}' in namespace '{}', Updated '{}' of type '{}' in namespace '{}'",
                r.name,
                r.kind.env_suffix(),
                key.namespace,
                key.name,
                key.kind,
                key.namespace
            );
            match restarts {
                Restarts::Controller => {}
                Restarts::Manual => note.push_str(&format!(
                    "; its updateStrategy is OnDelete: no pod restarts until it is deleted (annotate {RESTART_ANNOTATION}: pods to have rekindle evict them one at a time)"
                )),
                Restarts::Evict => note.push_str("; its pods are restarted by eviction, one at a time"),
            }
            tracing::info!(resource = %r.name, kind = %r.kind, action = ?action, "reloaded");
            self.publish(key, uid, EventType::Normal, "Reloaded", note)
                .await;
            if let Some(alerter) = &self.alerter {
                alerter.alert(reload_message(
                    &r.name,
                    r.kind.env_suffix(),
                    &key.namespace,
                    &key.name,
                    key.kind.name(),
                ));
            }
        }
    }

    /// One Warning Event `InvalidAnnotation` per workload and annotation value.
    pub(super) async fn warn_invalid(
        &self,
        key: &WorkloadKey,
        uid: Option<&str>,
        annotation: &str,
        value: &str,
        note: String,
    ) {
        let subject = subject(key, uid);
        self.warn_invalid_on(key, &subject, annotation, value, note)
            .await;
    }

    /// [`Self::warn_invalid`] on another object than the workload `key` (the owner of a group of pods).
    pub(super) async fn warn_invalid_on(
        &self,
        key: &WorkloadKey,
        subject: &ObjectReference,
        annotation: &str,
        value: &str,
        note: String,
    ) {
        if !self.first_time(key, &format!("{annotation}={value}")) {
            return;
        }
        self.metrics.invalid_annotations.inc();
        tracing::warn!(workload = %key, %annotation, %value, "invalid annotation");
        self.publish_on(subject, EventType::Warning, "InvalidAnnotation", note)
            .await;
    }

    /// Whether `what` is told of `key` for the first time (each is told once).
    pub(super) fn first_time(&self, key: &WorkloadKey, what: &str) -> bool {
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: past a thousand entries, forget those of workloads that are gone.
        if warned.len() >= WARNED_PRUNE_AT {
            warned.retain(|(w, _)| self.index.workload(w).is_some());
        }
        warned.insert((key.clone(), what.to_string()))
    }

    pub(super) async fn publish(
        &self,
        key: &WorkloadKey,
        uid: Option<&str>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.publish_on(&subject(key, uid), type_, reason, note)
            .await;
    }

    pub(super) async fn publish_on(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reload".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            self.metrics.error(ErrorKind::Event);
            tracing::debug!(error = %e, "could not record an Event");
        }
    }
}

/// The workload `key` as the object of an Event.
pub(super) fn subject(key: &WorkloadKey, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(key.kind.api_version().to_string()),
        kind: Some(key.kind.name().to_string()),
        name: Some(key.name.to_string()),
        namespace: Some(key.namespace.to_string()),
        uid: uid.map(String::from),
        ..Default::default()
    }
}
