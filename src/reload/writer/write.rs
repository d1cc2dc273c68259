//! One attempt at a workload's reload: what to plan from (the index's skeleton or the object), the
//! plan of every pending change, and the guarded write.

use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::Api;
use serde_json::Value;
use tokio::time::Instant;

use super::{Outcome, Planned, Writer, FIELD_MANAGER, PATCH_TIMEOUT};
use crate::core::keys::{self, Owed, RELOAD_ON_ANNOTATION};
use crate::core::patch::{self, MarkerChange};
use crate::core::pause::{pause_ops, PauseDecision};
use crate::core::plan::{self, Action, Change, Event};
use crate::core::policy::Reason;
use crate::core::policy::ResourceFlags;
use crate::core::refs::ResourceRef;
use crate::core::release::HaltedChange;
use crate::core::restart::{self, Restarts};
use crate::core::skeleton;
use crate::core::{ResourceKind, WorkloadKind};
use crate::index::{ResourceKey, WorkloadEntry, WorkloadKey};
use crate::metrics::{ErrorKind, ReadReason, Skip};
use crate::reload::error::WriteError;
use crate::reload::queue::{Pending, Upkeep};
use crate::watch::digests;
use std::time::Duration;

/// What a write is guarded by (see [`patch::content_guard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guard {
    /// The resourceVersion the plan was made from.
    Version,
    /// The markers the write replaces, when they can be tested; else the resourceVersion. Only for
    /// a plan made on the object as read: the index's skeleton lacks the list positions.
    Content,
}

/// What a reload is planned from, its resourceVersion, the object's uid (Events name it), and
/// whether it is the object as read (`live`) rather than the index's skeleton.
pub(super) struct View {
    pub value: Value,
    pub rv: String,
    pub uid: Option<String>,
    pub live: bool,
}

impl Writer {
    pub(super) async fn attempt(
        &self,
        api: &Api<DynamicObject>,
        key: &WorkloadKey,
        pending: &Pending,
        from_index: bool,
    ) -> Result<Outcome, WriteError> {
        let Some(View {
            value,
            rv,
            uid,
            live,
        }) = self.view(api, key, from_index).await?
        else {
            return Ok(Outcome::Gone);
        };
        let planned = self
            .plan_pending(key, uid.as_deref(), &value, pending)
            .await?;
        if planned.changes.is_empty() {
            return Ok(Outcome::NothingToDo);
        }
        let (changes, action) = (&planned.changes, planned.action);
        // Checked right before the write: leadership ends at the renew deadline, without waiting for the
        // election to run (a write already sent is the only one that may land after it).
        if !self.leadership.is_leader() {
            return Ok(Outcome::NotLeader);
        }
        let written = match action {
            Action::Patch | Action::Restart => {
                let guard = if live { Guard::Content } else { Guard::Version };
                self.patch(
                    api,
                    key,
                    &value,
                    rv,
                    changes,
                    action == Action::Restart,
                    guard,
                )
                .await
            }
            Action::CreateJob => self
                .create_job(api, key, &value, &planned.working, rv, changes)
                .await
                .map(|()| Value::Null),
            Action::RecreateJob => self
                .recreate_job(api, key, &planned.working)
                .await
                .map(|()| Value::Null),
            Action::None => return Ok(Outcome::NothingToDo),
        };
        match written {
            Ok(written) => {
                let accepted = Instant::now();
                let canary = self.index.release_of(key).is_some_and(|r| r.canary);
                self.rollouts
                    .written(key, &written, planned.halted_changes, canary);
                let restarts = restart::restarts(&written, key.kind, self.plan.pod_restarts);
                if restarts == Restarts::Evict {
                    self.upkeep_again(key, Duration::ZERO, Upkeep::RESTART_PODS);
                }
                self.announce(key, uid.as_deref(), &planned.reasons, action, restarts)
                    .await;
                Ok(Outcome::Reloaded { accepted })
            }
            Err(WriteError::Gone) => Ok(Outcome::Gone),
            Err(WriteError::NotLeader) => Ok(Outcome::NotLeader),
            Err(e) => Err(e),
        }
    }

    /// What to plan from: the index's skeleton, or the object read from the API; `None` when the
    /// object is gone.
    pub(super) async fn view(
        &self,
        api: &Api<DynamicObject>,
        key: &WorkloadKey,
        from_index: bool,
    ) -> Result<Option<View>, WriteError> {
        let reason = match self.planning_view(key, from_index) {
            Ok((skeleton, rv)) => {
                return Ok(Some(View {
                    value: skeleton,
                    rv: rv.to_string(),
                    uid: self.index.uid_of(key),
                    live: false,
                }))
            }
            Err(reason) => reason,
        };
        self.metrics.workload_read(reason);
        let Some(obj) = api
            .get_opt(&key.name)
            .await
            .map_err(|e| WriteError::from_kube("GET", e))?
        else {
            return Ok(None);
        };
        let rv = obj
            .metadata
            .resource_version
            .clone()
            .ok_or_else(|| WriteError::Invalid("object has no resourceVersion".into()))?;
        let uid = obj.metadata.uid.clone();
        let value = serde_json::to_value(&obj)
            .map_err(|_| WriteError::Invalid("object does not serialise".into()))?;
        Ok(Some(View {
            value,
            rv,
            uid,
            live: true,
        }))
    }

    /// Plans every pending change of the workload in turn, each on the result of the ones before.
    pub(super) async fn plan_pending(
        &self,
        key: &WorkloadKey,
        uid: Option<&str>,
        value: &Value,
        pending: &Pending,
    ) -> Result<Planned, WriteError> {
        let now = jiff::Timestamp::now().as_second();
        let mut planned = Planned {
            working: value.clone(),
            changes: Vec::new(),
            reasons: Vec::new(),
            halted_changes: Vec::new(),
            action: Action::None,
        };
        if let Err(value) = keys::reload_on(value, key.kind, self.plan.reload_on) {
            let note = format!(
                "Invalid {RELOAD_ON_ANNOTATION} {value:?} (any-key or used-keys); using --reload-on={}",
                self.plan.reload_on.as_str()
            );
            self.warn_invalid(key, uid, RELOAD_ON_ANNOTATION, &value, note)
                .await;
        }
        for r in &self.owed_refs(key, pending) {
            let rk = ResourceKey::new(r.kind, &key.namespace, &r.name);
            // What is owed is the resource as it is now: its current hash, or its deletion (which
            // only `--reload-on-delete` acts on). A resource deleted and created again since it was
            // queued is an update to the new content.
            let (hash, flags, event) = match self.index.resource(&rk) {
                Some(e) => (e.hash.to_string(), e.flags, Event::Update),
                None => (String::new(), ResourceFlags::default(), Event::Delete),
            };
            let owed = match event {
                Event::Update => self.owed(key, &planned.working, r, &rk, &hash).await,
                _ => Owed::whole(""),
            };
            let change = Change {
                kind: r.kind,
                name: &r.name,
                namespace: &key.namespace,
                hash: &owed.write,
                flags,
                event,
                also_current: owed.also_current.as_deref(),
            };
            let p = plan::plan(&self.plan, &planned.working, key.kind, &change, now);
            if p.decision.reason == Reason::UnusedKeys {
                self.metrics.skip(Skip::UnusedKeys);
            }
            for invalid in &p.decision.invalid_patterns {
                let note = format!(
                    "Invalid pattern {:?} in annotation {} skipped: {}",
                    invalid.pattern, invalid.annotation, invalid.error
                );
                self.warn_invalid(key, uid, &invalid.annotation, &invalid.pattern, note)
                    .await;
            }
            if p.changes.is_empty() {
                continue;
            }
            let indexed = (event == Event::Update).then_some(hash.as_str());
            if !self.trusted(key, r, pending).await && !self.confirm(&rk, indexed).await? {
                continue;
            }
            planned.working = patch::apply(&planned.working, key.kind, &p.changes)
                .map_err(|e| WriteError::Render(e.to_string()))?;
            planned.action = p.action;
            planned.changes.extend(p.changes);
            planned.reasons.push(r.clone());
            planned.halted_changes.push(HaltedChange {
                kind: r.kind,
                name: r.name.to_string(),
                hash: hash.to_string(),
            });
        }
        Ok(planned)
    }

    /// What a due workload is planned for: the changes that queued it, and every other reference
    /// whose marker is not the resource's current hash. Any trigger reloads all the workload owes, so
    /// a change whose event never reached the queue goes with the next one instead of waiting for the
    /// consistency pass. The causes alone time the reload (the latency metrics).
    fn owed_refs(&self, key: &WorkloadKey, pending: &Pending) -> Vec<ResourceRef> {
        let mut refs: Vec<ResourceRef> = pending.causes.keys().cloned().collect();
        for r in self.index.stale_markers_of(key, &ResourceKind::ALL) {
            if !refs.contains(&r) {
                refs.push(r);
            }
        }
        refs
    }

    /// What the workload's marker for `r` must be now (behaviour §14). A workload reading some keys
    /// only needs the resource's value digests: when the index has none of its current content, the
    /// resource is read (and the index keeps what was read); if it cannot be, the whole object's hash
    /// is owed, so that nothing is missed.
    async fn owed(
        &self,
        key: &WorkloadKey,
        obj: &Value,
        r: &ResourceRef,
        rk: &ResourceKey,
        full: &str,
    ) -> Owed {
        let whole = || Owed::whole(full);
        let Some(read) = plan::keys_read(&self.plan, obj, key.kind, r) else {
            return whole();
        };
        if let Some(owed) = keys::owed(Some(&read), full, self.index.key_digests(rk).as_ref()) {
            return owed;
        }
        match digests::read(&self.client, rk).await {
            Ok(Some(digests::Read { digests, .. })) => {
                let owed = keys::owed(Some(&read), &digests.of.clone(), Some(&digests));
                self.index.fill_keys(rk, digests);
                owed.unwrap_or_else(whole)
            }
            Ok(None) => whole(),
            Err(e) => {
                self.metrics.error(ErrorKind::ResourceRead);
                tracing::warn!(resource = %rk.name, namespace = %rk.namespace, error = %e,
                    "could not read the keys of a resource; the whole object's hash is owed");
                whole()
            }
        }
    }

    /// The skeleton to plan from and its resourceVersion, or why the object must be read instead (the
    /// metric's reason).
    pub(super) fn planning_view(
        &self,
        key: &WorkloadKey,
        from_index: bool,
    ) -> Result<(Value, u64), ReadReason> {
        if !from_index {
            return Err(ReadReason::Retry);
        }
        let (skeleton, rv) = self.index.skeleton(key).ok_or(ReadReason::NotIndexed)?;
        // Only a record with no resourceVersion to guard the write with (never seen stored).
        let rv = rv.ok_or(ReadReason::NotIndexed)?;
        if skeleton::needs_live_object(&self.plan, &skeleton, key.kind) {
            return Err(ReadReason::Kind);
        }
        Ok((skeleton, rv))
    }

    /// A JSON patch guarded by the markers it replaces, when `guard` allows it and they can be
    /// tested; otherwise a strategic-merge patch for built-in kinds, or a JSON patch (CRDs, a
    /// Deployment being paused, a Rollout restart, which also sets `spec.restartAt`), guarded by the
    /// resourceVersion the plan was made from.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn patch(
        &self,
        api: &Api<DynamicObject>,
        key: &WorkloadKey,
        value: &Value,
        rv: String,
        changes: &[MarkerChange],
        restart: bool,
        guard: Guard,
    ) -> Result<Value, WriteError> {
        let pause = if key.kind == WorkloadKind::Deployment {
            let annotations_exist = value
                .pointer("/metadata/annotations")
                .is_some_and(Value::is_object);
            pause_ops(
                &self.plan.policy.keys,
                value,
                annotations_exist,
                jiff::Timestamp::now(),
            )
        } else {
            PauseDecision::None
        };
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let pausing = matches!(pause, PauseDecision::Pause(_));
        // A pause writes fields beyond the markers, which only the version guards.
        let content = match guard {
            Guard::Content if !pausing => patch::content_guard(value, key.kind, changes),
            _ => None,
        };
        let strategic = content.is_none() && key.kind.strategic_merge() && !restart && !pausing;
        if let PauseDecision::Invalid(why) = &pause {
            let note = format!(
                "Invalid {}: {why}; reloading without pause",
                self.plan.policy.keys.pause_period
            );
            self.metrics.invalid_annotations.inc();
            self.publish(
                key,
                value.pointer("/metadata/uid").and_then(Value::as_str),
                EventType::Warning,
                "InvalidAnnotation",
                note,
            )
            .await;
        }
        if strategic {
            let body = patch::render_strategic(value, key.kind, changes, &rv)
                .map_err(|e| WriteError::Render(e.to_string()))?;
            let written = Self::send(api, &key.name, &params, &Patch::Strategic(body)).await?;
            return Ok(self.record_written(key, &written));
        }
        let mut ops = patch::render(value, key.kind, changes)
            .map_err(|e| WriteError::Render(e.to_string()))?;
        match content {
            Some(tests) => drop(ops.splice(0..0, tests)),
            None => ops.insert(0, patch::test_resource_version(&rv)),
        }
        if let PauseDecision::Pause(more) = pause {
            ops.extend(more);
        }
        if restart {
            ops.push(patch::restart_at(jiff::Timestamp::now()));
        }
        let written = Self::send(
            api,
            &key.name,
            &params,
            &Patch::Json::<()>(json_patch::Patch(ops)),
        )
        .await?;
        Ok(self.record_written(key, &written))
    }

    /// Keeps the index's record as written, so a reload right after this one plans from it; the
    /// object as written (`Null` if it does not serialise).
    pub(super) fn record_written(&self, key: &WorkloadKey, written: &DynamicObject) -> Value {
        let Ok(value) = serde_json::to_value(written) else {
            return Value::Null;
        };
        self.index.record_written(
            key,
            WorkloadEntry::from_stored(&self.plan, &value, key.kind),
        );
        value
    }

    pub(super) async fn send<P: serde::Serialize + std::fmt::Debug>(
        api: &Api<DynamicObject>,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<DynamicObject, WriteError> {
        match tokio::time::timeout(PATCH_TIMEOUT, api.patch(name, params, patch)).await {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(e)) => Err(WriteError::from_kube("PATCH", e)),
            Err(_) => Err(WriteError::Transient("PATCH timed out".into())),
        }
    }

    /// Between the writes of one reload: leadership ends at the renew deadline, and a replica that
    /// was frozen or cut off in the middle must not carry on as if it still led.
    pub(super) fn still_leading(&self) -> Result<(), WriteError> {
        if self.leadership.is_leader() {
            Ok(())
        } else {
            Err(WriteError::NotLeader)
        }
    }
}
