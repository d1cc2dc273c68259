//! Halts: the supervision of the rollouts rekindle started queues a failed rollout's halt and the end
//! of one that is over; the writer writes and removes the `rekindle.io/reload-halted` annotation.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::Api;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Writer, FIELD_MANAGER, UPKEEP_RETRY};
use crate::core::release::{Halt, Release, HALTED_ANNOTATION};
use crate::core::rollout::Progress;
use crate::index::{ResourceKey, WorkloadKey};
use crate::metrics::ErrorKind;
use crate::reload::error::WriteError;
use crate::reload::queue::{Deferred, Upkeep};
use crate::reload::rollouts::FailedRollout;

impl Writer {
    /// Follows the rollouts rekindle started, every second and whenever one ends: hands freed budget
    /// slots to the workloads deferred longest, and queues the halts of failed rollouts and the end of
    /// halts whose workload is healthy again or whose change is no longer current. Only the leader acts.
    /// `synced` says whether the watches have synced (the rollouts running are counted then).
    pub async fn supervise_rollouts(
        self: Arc<Self>,
        synced: impl Fn() -> bool + Send + 'static,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = self.rollouts.changed.notified() => {}
                _ = shutdown.cancelled() => return,
            }
            let leading = self.leadership.is_leader();
            let free = self.rollouts.tick(leading, synced(), Instant::now());
            if free > 0 {
                self.queue.wake_deferred(Deferred::Budget, free);
            }
            if !leading {
                continue;
            }
            // The writes themselves are the writer's, reconciled with the workload's reloads.
            let now = Instant::now();
            for failed in self.rollouts.take_failed() {
                if failed.halts {
                    self.queue.push_upkeep(failed.key, now, Upkeep::HALT);
                }
            }
            if self.index.has_release_marks() {
                for (key, release) in self.index.halted() {
                    if self.halt_over(&key, &release).is_some() {
                        self.queue.push_upkeep(key, now, Upkeep::HALT);
                    }
                }
            }
        }
    }

    /// Writes the halt of the workload's failed rollout, or removes a halt that is over; after a
    /// failure, when to try again.
    pub(super) async fn reconcile_halt(&self, key: &WorkloadKey) -> Option<Duration> {
        if !self.leadership.is_leader() {
            return None;
        }
        let written = match self.rollouts.halt_owed(key) {
            Some(failed) => self.halt(&failed).await,
            None => match self.index.release_of(key) {
                Some(release) => match self.halt_over(key, &release) {
                    Some(why) => self.end_halt(key, why, &release).await,
                    None => Ok(()),
                },
                None => Ok(()),
            },
        };
        let e = written.err()?;
        tracing::warn!(error = %e, after = ?UPKEEP_RETRY, "could not write or remove the halt; trying again");
        self.metrics.error(ErrorKind::Halt);
        Some(UPKEEP_RETRY)
    }

    /// Writes the halt of a failed rollout on its workload, with a Warning Event and an alert.
    pub(super) async fn halt(&self, failed: &FailedRollout) -> Result<(), WriteError> {
        let key = &failed.key;
        let halt = Halt {
            reason: failed.reason.label().into(),
            changes: failed.changes.clone(),
        };
        let body = serde_json::json!({"metadata": {"annotations": {HALTED_ANNOTATION: halt.to_annotation()}}});
        match self.annotate(key, body).await {
            Ok(()) => {}
            Err(WriteError::Gone) => {
                self.rollouts.halt_written(key);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        self.rollouts.halt_written(key);
        self.metrics.reload_halts.inc();
        let changes: Vec<String> = halt
            .changes
            .iter()
            .map(|c| format!("{} '{}'", c.kind.kind_name(), c.name))
            .collect();
        let note = format!(
            "Rollout of {} '{}' failed ({}): reloads owed for the change of {} are halted until it is healthy again, {HALTED_ANNOTATION} is removed, or the resource changes again",
            key.kind,
            key.name,
            halt.reason,
            changes.join(", ")
        );
        tracing::warn!(workload = %key, reason = %halt.reason, "rollout failed; change halted");
        self.publish(
            key,
            self.index.uid_of(key).as_deref(),
            EventType::Warning,
            "ReloadHalted",
            note.clone(),
        )
        .await;
        if let Some(alerter) = &self.alerter {
            alerter.alert(note);
        }
        Ok(())
    }

    /// Why the halt the workload carries is over, if it is: the workload is healthy again, or none of
    /// its changes is current any more. Only for a workload this replica serves: a halt in a namespace
    /// it does not serve was written by another installation, which judges it.
    pub(super) fn halt_over(&self, key: &WorkloadKey, release: &Release) -> Option<&'static str> {
        if !self.rollouts.serves(key) {
            return None;
        }
        let halt = release.halt()?;
        if release.progress == Progress::Finished {
            return Some("its rollout is healthy again");
        }
        // A resource missing from the index (a kind not watched, outside the label selector, or
        // deleted) is no evidence of a newer change: only another hash is.
        let current = halt.changes.iter().any(|c| {
            self.index
                .resource(&ResourceKey::new(c.kind, &key.namespace, &c.name))
                .is_none_or(|r| r.hash.is(&c.hash))
        });
        (!current).then_some("the resource changed again")
    }

    /// Removes a halt that is over, with a `ReloadResumed` Event.
    pub(super) async fn end_halt(
        &self,
        key: &WorkloadKey,
        why: &str,
        release: &Release,
    ) -> Result<(), WriteError> {
        tracing::info!(workload = %key, why, progress = ?release.progress, "ending the halt");
        let body = serde_json::json!({"metadata": {"annotations": {HALTED_ANNOTATION: null}}});
        match self.annotate(key, body).await {
            Ok(()) | Err(WriteError::Gone) => {}
            Err(e) => return Err(e),
        }
        tracing::info!(workload = %key, why, "halt ended");
        let note = format!("Halt on {} '{}' ended: {why}", key.kind, key.name);
        self.publish(
            key,
            self.index.uid_of(key).as_deref(),
            EventType::Normal,
            "ReloadResumed",
            note,
        )
        .await;
        Ok(())
    }

    /// A merge patch of the workload's metadata; the response goes into the index.
    pub(super) async fn annotate(&self, key: &WorkloadKey, body: Value) -> Result<(), WriteError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &key.namespace,
            &key.kind.api_resource(),
        );
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let written = Self::send(&api, &key.name, &params, &Patch::Merge(body)).await?;
        self.record_written(key, &written);
        Ok(())
    }
}
