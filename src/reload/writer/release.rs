//! When a workload owed a reload may be written: its reload window, the rollout budget, and the
//! release order of a change (canaries first, nothing while the change is halted).

use std::ops::ControlFlow;
use std::time::Duration;

use kube::runtime::events::EventType;
use serde_json::Value;

use super::{halted, Writer, BUDGET_RECHECK, RELEASE_RECHECK};
use crate::core::keys::Owed;
use crate::core::plan::{self, Change, Event};
use crate::core::policy::ResourceFlags;
use crate::core::refs::ResourceRef;
use crate::core::release::HALTED_ANNOTATION;
use crate::core::rollout::Progress;
use crate::core::window::{self, Windows};
use crate::index::{ResourceKey, WorkloadKey};
use crate::reload::queue::{Deferred, Finished, Pending};
use crate::reload::rollouts::Admission;

impl Writer {
    /// A reload owed outside the workload's reload window waits until the window opens; its
    /// `ReloadDeferred` Event is posted once, when it starts waiting.
    pub(super) async fn outside_window(
        &self,
        key: &WorkloadKey,
        pending: Pending,
    ) -> ControlFlow<Finished, Pending> {
        let Some(windows) = self.window_of(key).await else {
            return ControlFlow::Continue(pending);
        };
        let now = jiff::Timestamp::now();
        let Some(opens) = windows.opens_at(now) else {
            return ControlFlow::Continue(pending);
        };
        // At least a second, so a clock a hair behind never wakes it into the same answer in a loop.
        let after = Duration::try_from(opens.duration_since(now))
            .unwrap_or_default()
            .max(Duration::from_secs(1));
        let why = format!("outside its reload window {windows} until {opens}");
        self.defer(key, pending, Deferred::Window, &why, after)
            .await
    }

    /// Canaries first, and nothing for a halted change: a reload waits while a change it owes is halted
    /// (a workload names it in `rekindle.io/reload-halted`), and a workload that is not a canary waits
    /// while a canary owed the same change has not finished its rollout healthy.
    pub(super) async fn held_by_release(
        &self,
        key: &WorkloadKey,
        pending: Pending,
    ) -> ControlFlow<Finished, Pending> {
        if !self.index.has_release_marks() && !self.rollouts.has_unwritten_halts() {
            return ControlFlow::Continue(pending);
        }
        let Some((reason, why)) = self.release_hold(key, &pending) else {
            return ControlFlow::Continue(pending);
        };
        self.defer(key, pending, reason, &why, RELEASE_RECHECK)
            .await
    }

    /// Sends an owed reload back to the queue for `reason`, due again after `after`; its
    /// `ReloadDeferred` Event is posted once per reason.
    pub(super) async fn defer(
        &self,
        key: &WorkloadKey,
        mut pending: Pending,
        reason: Deferred,
        why: &str,
        after: Duration,
    ) -> ControlFlow<Finished, Pending> {
        if pending.deferred != Some(reason) {
            tracing::info!(%why, reason = reason.label(), "deferred");
            let note = format!("Reload of {} '{}' deferred: {why}", key.kind, key.name);
            let uid = self.index.uid_of(key);
            self.publish(
                key,
                uid.as_deref(),
                EventType::Normal,
                "ReloadDeferred",
                note,
            )
            .await;
        }
        pending.deferred = Some(reason);
        ControlFlow::Break(Finished::RequeueAfter { pending, after })
    }

    /// Why the release order holds the workload's reload back, if it does.
    pub(super) fn release_hold(
        &self,
        key: &WorkloadKey,
        pending: &Pending,
    ) -> Option<(Deferred, String)> {
        let own_canary = self.index.release_of(key).is_some_and(|r| r.canary);
        for r in pending.causes.keys() {
            let rk = ResourceKey::new(r.kind, &key.namespace, &r.name);
            let Some(resource) = self.index.resource(&rk) else {
                continue;
            };
            let hash = &*resource.hash.to_string();
            if let Some((failed, reason)) = self.rollouts.unwritten_halt(&key.namespace, r, hash) {
                let why = halted(r, &failed, reason.label(), "its halt is being written");
                return Some((Deferred::Halt, why));
            }
            for (peer, release, marker) in self.index.release_peers(&key.namespace, r) {
                if let Some(halt) = release.halt().filter(|h| h.holds(r, hash)) {
                    let see = format!("see its {HALTED_ANNOTATION} annotation");
                    return Some((Deferred::Halt, halted(r, &peer, &halt.reason, &see)));
                }
                // A canary this replica never reloads (a kind it ignores) has nothing to go first with.
                if own_canary || !release.canary || peer == *key || !self.rollouts.serves(&peer) {
                    continue;
                }
                let Some((skeleton, owed)) = self.owed_by(&peer, r, &rk, hash) else {
                    continue;
                };
                let current = marker
                    .as_deref()
                    .is_some_and(|m| m == hash || m == owed.write);
                let waiting = if current {
                    (release.progress != Progress::Finished)
                        .then_some("has not finished its rollout")
                } else {
                    self.owes(&peer, &skeleton, r, &owed, resource.flags)
                        .then_some("has not reloaded yet")
                };
                if let Some(what) = waiting {
                    return Some((
                        Deferred::Canary,
                        format!(
                            "canary {} '{}' {what} for the change of {} '{}'",
                            peer.kind,
                            peer.name,
                            r.kind.kind_name(),
                            r.name
                        ),
                    ));
                }
            }
        }
        None
    }

    /// A peer's skeleton and what its marker for `r` must be when `r`'s hash is `hash` (from the
    /// index's digests only: without them the whole hash is owed, so a canary is never skipped).
    fn owed_by(
        &self,
        peer: &WorkloadKey,
        r: &ResourceRef,
        rk: &ResourceKey,
        hash: &str,
    ) -> Option<(Value, Owed)> {
        let (skeleton, _) = self.index.skeleton(peer)?;
        let digests = self.index.key_digests(rk);
        let owed = plan::owed(&self.plan, &skeleton, peer.kind, r, hash, digests.as_ref())
            .unwrap_or_else(|| Owed::whole(hash));
        Some((skeleton, owed))
    }

    /// Whether the workload of `skeleton` reloads for the change of `r` that owes it `owed`.
    fn owes(
        &self,
        peer: &WorkloadKey,
        skeleton: &Value,
        r: &ResourceRef,
        owed: &Owed,
        flags: ResourceFlags,
    ) -> bool {
        let change = Change {
            kind: r.kind,
            name: &r.name,
            namespace: &peer.namespace,
            hash: &owed.write,
            flags,
            event: Event::Update,
            also_current: owed.also_current.as_deref(),
        };
        let now = jiff::Timestamp::now().as_second();
        !plan::plan(&self.plan, skeleton, peer.kind, &change, now)
            .changes
            .is_empty()
    }

    /// A reload past `--max-rollouts-in-progress` waits until a slot is free for it (the writer wakes
    /// it: [`Rollouts::run`]); its `ReloadDeferred` Event is posted once, when it starts waiting.
    pub(super) async fn over_budget(
        &self,
        key: &WorkloadKey,
        pending: Pending,
    ) -> ControlFlow<Finished, Pending> {
        if !self.rollouts.budget_for(key) {
            return ControlFlow::Continue(pending);
        }
        let earlier = self
            .queue
            .deferred_before(Deferred::Budget, (pending.first, key));
        let why = match self.rollouts.admit(key, earlier) {
            Admission::Go => return ControlFlow::Continue(pending),
            Admission::Wait { in_progress, max } => format!(
                "{in_progress} rollouts in progress, at most {max} (--max-rollouts-in-progress); {earlier} deferred before it"
            ),
            Admission::Counting => {
                "the rollouts already running are counted first (--max-rollouts-in-progress)".into()
            }
        };
        // Woken when a slot is free for it; the wait bounds a wake that never came.
        self.defer(key, pending, Deferred::Budget, &why, BUDGET_RECHECK)
            .await
    }

    /// The workload's reload window (`core::window::window_of`: its own, its namespace's, or
    /// `--reload-window`); an invalid value is reported once on the workload.
    pub(super) async fn window_of(&self, key: &WorkloadKey) -> Option<Windows> {
        let own = self.index.window_of(key);
        let namespace = self.index.namespace_window(&key.namespace);
        match window::window_of(
            own.as_deref(),
            namespace.as_deref(),
            self.default_window.as_ref(),
        ) {
            Ok(windows) => windows,
            Err(e) => {
                // The error names the value and whose it is: reported once per workload and error.
                let note = format!("{e}; reloading without a window");
                self.warn_invalid(
                    key,
                    self.index.uid_of(key).as_deref(),
                    window::RELOAD_WINDOW_ANNOTATION,
                    &e.0,
                    note,
                )
                .await;
                None
            }
        }
    }
}
