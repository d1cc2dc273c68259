//! The rollouts rekindle started, followed to their end: `--max-rollouts-in-progress` (at most N
//! unfinished; owed reloads past that wait, in the order their changes arrived), and the failures that
//! halt a change (`--halt-on-failed-rollout`, and always a canary's).
//!
//! A rollout counts from the moment the writer takes its slot until the workload watch shows the kind's
//! own status finished or failed (`core::rollout`) for the generation rekindle wrote, or until
//! `--rollout-timeout`. What counts lives in memory: a replica that begins to lead cannot tell who
//! started a rollout still running, so it counts every unfinished rollout of the workloads it serves
//! (the budget is never exceeded across a restart or a leader change; such a rollout frees its slot
//! when it finishes or times out), and follows every canary's: a canary that fails after a leader
//! change still halts the changes its markers carry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::scope::ScopeFilter;
use crate::core::refs::ResourceRef;
use crate::core::release::HaltedChange;
use crate::core::rollout::{self, Failure, Progress};
use crate::index::{WorkloadEntry, WorkloadKey};
use crate::metrics::{Metrics, ReasonLabels};

pub struct Rollouts {
    /// 0: unlimited.
    max: usize,
    timeout: Duration,
    /// `--halt-on-failed-rollout`: follow every rollout rekindle starts (else only with a budget, and
    /// canaries').
    halt_on_failure: bool,
    state: Mutex<State>,
    /// The workloads this replica serves: only their running rollouts count when it begins to lead.
    scope: Arc<ScopeFilter>,
    /// A slot was freed or a rollout failed.
    pub(super) changed: Notify,
    metrics: Arc<Metrics>,
}

/// A rollout rekindle started that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRollout {
    pub key: WorkloadKey,
    pub reason: Failure,
    /// The changes it was written for.
    pub changes: Vec<HaltedChange>,
    /// Whether it halts them: always for a canary, else with `--halt-on-failed-rollout`.
    pub halts: bool,
}

#[derive(Default)]
struct State {
    /// The rollouts counted against the budget.
    in_progress: HashMap<WorkloadKey, Slot>,
    /// Every watched workload whose rollout has not finished: what a replica that begins to lead
    /// counts (with the budget) and follows (a canary's, whose failure halts the changes it carries).
    unfinished: HashMap<WorkloadKey, Running>,
    /// Whether `in_progress` holds this leadership's count (taken once the watches have synced;
    /// until then no budget slot is given).
    seeded: bool,
    /// Failures not yet handed to the writer.
    failed: Vec<FailedRollout>,
    /// Failures that halt their changes, until the halt is in the workload's annotation: the writer
    /// holds those changes meanwhile, so a slot the failure freed goes to no reload of them.
    halting: Vec<FailedRollout>,
}

/// A rollout the watch saw unfinished, started by whoever.
struct Running {
    generation: i64,
    canary: bool,
    /// A canary's markers: the changes its rollout carries.
    changes: Vec<HaltedChange>,
}

struct Slot {
    since: Instant,
    /// The generation whose rollout is awaited; `None` while the write is not made yet.
    generation: Option<i64>,
    changes: Vec<HaltedChange>,
    canary: bool,
}

impl Slot {
    fn reserved(since: Instant) -> Self {
        Self {
            since,
            generation: None,
            changes: Vec::new(),
            canary: false,
        }
    }
}

/// What the writer may do with an owed reload.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Go,
    /// The budget is used up: `in_progress` rollouts run, at most `max`.
    Wait {
        in_progress: usize,
        max: usize,
    },
    /// This leader has not counted the rollouts already running yet (its watches have not synced).
    Counting,
}

impl Rollouts {
    pub fn new(
        max: usize,
        timeout: Duration,
        halt_on_failure: bool,
        scope: Arc<ScopeFilter>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        // Every reason at 0 from the start: canaries' rollouts are followed whatever the flags.
        for reason in Failure::ALL {
            let _ = metrics.rollouts_failed.get_or_create(&ReasonLabels {
                reason: reason.label().into(),
            });
        }
        Arc::new(Self {
            max,
            timeout,
            halt_on_failure,
            state: Mutex::default(),
            scope,
            changed: Notify::new(),
            metrics,
        })
    }

    /// Whether this replica serves the workload (its namespace and kind are in scope). Another
    /// installation's workloads in the same cluster are indexed all the same: their rollouts and
    /// halts are that installation's.
    pub fn serves(&self, key: &WorkloadKey) -> bool {
        self.scope.covers(key.kind, &key.namespace)
    }

    /// Whether reloads of this workload take a budget slot.
    pub fn budget_for(&self, key: &WorkloadKey) -> bool {
        self.max > 0 && rollout::tracked(key.kind)
    }

    pub fn has_budget(&self) -> bool {
        self.max > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_gauge(&self, state: &State) {
        self.metrics
            .rollouts_in_progress
            .set(state.in_progress.len() as i64);
    }

    /// Takes a slot for `key` if one is free for it: `earlier` workloads deferred before it go first.
    /// A workload whose own rollout still runs keeps its slot.
    pub fn admit(&self, key: &WorkloadKey, earlier: usize) -> Admission {
        if !self.budget_for(key) {
            return Admission::Go;
        }
        let mut state = self.lock();
        if !state.seeded {
            return Admission::Counting;
        }
        let in_progress = state.in_progress.len();
        let free = self.max.saturating_sub(in_progress);
        if state.in_progress.contains_key(key) {
            return Admission::Go;
        }
        if earlier >= free {
            return Admission::Wait {
                in_progress,
                max: self.max,
            };
        }
        state
            .in_progress
            .insert(key.clone(), Slot::reserved(Instant::now()));
        self.set_gauge(&state);
        Admission::Go
    }

    /// The reload was written for `changes`: its rollout (of the generation written) is followed when
    /// it counts against the budget or a failure would halt it.
    pub fn written(
        &self,
        key: &WorkloadKey,
        obj: &Value,
        changes: Vec<HaltedChange>,
        canary: bool,
    ) {
        let followed = self.max > 0 || self.halt_on_failure || canary;
        if !rollout::tracked(key.kind) || !followed {
            return;
        }
        let mut state = self.lock();
        state.in_progress.insert(
            key.clone(),
            Slot {
                since: Instant::now(),
                generation: Some(rollout::generation(obj)),
                changes,
                canary,
            },
        );
        self.set_gauge(&state);
    }

    /// A walk restarting the pods of an owner rekindle does not write (kind `Pods`) is under way: it
    /// holds its slot, whose `--rollout-timeout` counts from its last eviction ([`Self::progressed`]),
    /// until [`Self::walk_ended`]. Nothing is written, so its failure halts no change.
    pub fn walk_started(&self, key: &WorkloadKey) {
        if !(self.max > 0 || self.halt_on_failure) {
            return;
        }
        let mut state = self.lock();
        let slot = state
            .in_progress
            .entry(key.clone())
            .or_insert_with(|| Slot::reserved(Instant::now()));
        // The walk's slot carries a generation so that it times out; no watch observes it.
        slot.generation.get_or_insert(0);
        self.set_gauge(&state);
    }

    /// The walk of `key` found every pod current (or its pods gone): its slot is free.
    pub fn walk_ended(&self, key: &WorkloadKey) {
        let mut state = self.lock();
        if state.in_progress.remove(key).is_some() {
            self.set_gauge(&state);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// The reload was not written (nothing to do, gone, failed, not leading): its slot is free again.
    pub fn release(&self, key: &WorkloadKey) {
        if !self.budget_for(key) {
            return;
        }
        let mut state = self.lock();
        if state
            .in_progress
            .get(key)
            .is_some_and(|s| s.generation.is_none())
        {
            state.in_progress.remove(key);
            self.set_gauge(&state);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// The watch saw the workload at `generation`, as the index records it (its rollout's progress
    /// read once): a rollout that finished or failed frees its slot.
    pub fn observe(&self, key: &WorkloadKey, entry: &WorkloadEntry, generation: i64) {
        if !rollout::tracked(key.kind) {
            return;
        }
        let progress = entry.release.progress;
        // A canary's first rollout (its creation, generation 1) carries no change to halt.
        let canary = entry.release.canary && generation > 1;
        let mut state = self.lock();
        if progress == Progress::Progressing {
            if self.max > 0 || canary {
                let changes = if canary {
                    entry
                        .markers()
                        .map(|(r, hash)| HaltedChange {
                            kind: r.kind,
                            name: r.name.to_string(),
                            hash: hash.to_string(),
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let running = Running {
                    generation,
                    canary,
                    changes,
                };
                state.unfinished.insert(key.clone(), running);
            }
            return;
        }
        state.unfinished.remove(key);
        let done = state
            .in_progress
            .get(key)
            .and_then(|s| s.generation)
            .is_some_and(|awaited| generation >= awaited);
        if !done {
            return;
        }
        let slot = state.in_progress.remove(key).expect("checked above");
        self.set_gauge(&state);
        if let Progress::Failed(reason) = progress {
            self.failed(&mut state, key.clone(), slot, reason);
        } else {
            tracing::debug!(workload = %key, "rollout finished");
        }
        drop(state);
        self.changed.notify_one();
    }

    /// The rollout made progress rekindle drove itself (a pod of a pod-restart walk evicted): its
    /// `--rollout-timeout` counts from now, so it bounds each replacement, not the whole walk.
    pub fn progressed(&self, key: &WorkloadKey) {
        if let Some(slot) = self.lock().in_progress.get_mut(key) {
            slot.since = Instant::now();
        }
    }

    /// The workload is gone.
    pub fn forget(&self, key: &WorkloadKey) {
        if !rollout::tracked(key.kind) {
            return;
        }
        let mut state = self.lock();
        state.unfinished.remove(key);
        if state.in_progress.remove(key).is_some() {
            self.set_gauge(&state);
            drop(state);
            self.changed.notify_one();
        }
    }

    fn failed(&self, state: &mut State, key: WorkloadKey, slot: Slot, reason: Failure) {
        tracing::warn!(workload = %key, reason = reason.label(), "rollout failed");
        self.metrics
            .rollouts_failed
            .get_or_create(&ReasonLabels {
                reason: reason.label().into(),
            })
            .inc();
        let failure = FailedRollout {
            key,
            reason,
            halts: (self.halt_on_failure || slot.canary) && !slot.changes.is_empty(),
            changes: slot.changes,
        };
        if failure.halts {
            state.halting.push(failure.clone());
        }
        state.failed.push(failure);
    }

    /// The halt of the workload's failure is written (or the workload is gone): the index holds it now.
    pub fn halt_written(&self, key: &WorkloadKey) {
        self.lock().halting.retain(|f| f.key != *key);
    }

    pub fn has_unwritten_halts(&self) -> bool {
        !self.lock().halting.is_empty()
    }

    /// A failure in `namespace` that halts the change of `r` to `hash` and whose halt is not written
    /// yet: the workload that failed, and why.
    pub fn unwritten_halt(
        &self,
        namespace: &str,
        r: &ResourceRef,
        hash: &str,
    ) -> Option<(WorkloadKey, Failure)> {
        self.lock()
            .halting
            .iter()
            .find(|f| f.key.namespace == namespace && f.changes.iter().any(|c| c.is(r, hash)))
            .map(|f| (f.key.clone(), f.reason))
    }

    /// The failure of the workload's rollout whose halt is to be written, if any.
    pub fn halt_owed(&self, key: &WorkloadKey) -> Option<FailedRollout> {
        self.lock().halting.iter().find(|f| f.key == *key).cloned()
    }

    /// The failures since the last call.
    pub fn take_failed(&self) -> Vec<FailedRollout> {
        std::mem::take(&mut self.lock().failed)
    }

    /// Rollouts counted against the budget.
    pub fn in_progress(&self) -> usize {
        self.lock().in_progress.len()
    }

    /// One check at `now` (the writer's, every second and whenever a slot is freed): while leading,
    /// counts what runs once the watches have `synced`, and times rollouts out; how many budget slots
    /// are free.
    pub fn tick(&self, leading: bool, synced: bool, now: Instant) -> usize {
        let mut state = self.lock();
        if !leading {
            state.in_progress.clear();
            state.failed.clear();
            state.halting.clear();
            state.seeded = false;
            self.set_gauge(&state);
            return 0;
        }
        if !state.seeded {
            if !synced {
                return 0;
            }
            let running: Vec<(WorkloadKey, Slot)> = state
                .unfinished
                .iter()
                .filter(|(k, _)| self.serves(k))
                .map(|(k, r)| {
                    let slot = Slot {
                        generation: Some(r.generation),
                        changes: r.changes.clone(),
                        canary: r.canary,
                        ..Slot::reserved(now)
                    };
                    (k.clone(), slot)
                })
                .collect();
            if !running.is_empty() {
                tracing::info!(
                    rollouts = running.len(),
                    "counting the rollouts running as this replica begins to lead"
                );
            }
            for (key, slot) in running {
                state.in_progress.entry(key).or_insert(slot);
            }
            state.seeded = true;
        }
        let timed_out: Vec<WorkloadKey> = state
            .in_progress
            .iter()
            .filter(|(_, s)| s.generation.is_some() && now >= s.since + self.timeout)
            .map(|(k, _)| k.clone())
            .collect();
        for key in timed_out {
            if let Some(slot) = state.in_progress.remove(&key) {
                self.failed(&mut state, key, slot, Failure::Timeout);
            }
        }
        self.set_gauge(&state);
        if self.max == 0 {
            return 0;
        }
        self.max.saturating_sub(state.in_progress.len())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::WorkloadKind;
    use serde_json::json;

    fn key(name: &str) -> WorkloadKey {
        WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    /// Leading, with nothing running when it began to.
    fn rollouts(max: usize) -> Arc<Rollouts> {
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let r = Rollouts::new(
            max,
            Duration::from_secs(600),
            false,
            Arc::default(),
            metrics,
        );
        r.tick(true, true, Instant::now());
        r
    }

    fn deployment(generation: i64, finished: bool) -> serde_json::Value {
        let reason = if finished {
            "NewReplicaSetAvailable"
        } else {
            "ReplicaSetUpdated"
        };
        json!({"metadata": {"generation": generation}, "spec": {"replicas": 1}, "status": {
            "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1,
            "conditions": [{"type": "Progressing", "reason": reason}]}})
    }

    /// The watch delivering `obj`, read as the index reads it.
    pub(crate) fn observe(r: &Rollouts, key: &WorkloadKey, obj: &serde_json::Value) {
        let entry = WorkloadEntry::from_stored(&Default::default(), obj, key.kind);
        r.observe(key, &entry, rollout::generation(obj));
    }

    fn failed(generation: i64) -> serde_json::Value {
        json!({"metadata": {"generation": generation}, "status": {"observedGeneration": generation,
            "conditions": [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]}})
    }

    #[test]
    fn a_slot_is_held_from_admission_until_the_written_generation_finishes() {
        let r = rollouts(1);
        assert_eq!(r.admit(&key("a"), 0), Admission::Go);
        assert_eq!(
            r.admit(&key("b"), 0),
            Admission::Wait {
                in_progress: 1,
                max: 1
            }
        );
        // The object as it was before the write (finished) does not free the slot.
        observe(&r, &key("a"), &deployment(1, true));
        assert_eq!(r.in_progress(), 1);
        r.written(&key("a"), &deployment(2, false), vec![], false);
        observe(&r, &key("a"), &deployment(1, true));
        observe(&r, &key("a"), &deployment(2, false));
        assert_eq!(r.in_progress(), 1);
        observe(&r, &key("a"), &deployment(2, true));
        assert_eq!(r.in_progress(), 0);
        assert_eq!(r.admit(&key("b"), 0), Admission::Go);
    }

    #[test]
    fn earlier_deferred_workloads_go_first() {
        let r = rollouts(2);
        assert_eq!(r.admit(&key("a"), 0), Admission::Go);
        // One slot free, one workload deferred before this one: it waits.
        assert!(matches!(r.admit(&key("b"), 1), Admission::Wait { .. }));
        assert_eq!(r.admit(&key("b"), 0), Admission::Go);
    }

    #[test]
    fn a_reload_not_written_frees_its_slot_and_a_written_one_keeps_it() {
        let r = rollouts(1);
        r.admit(&key("a"), 0);
        r.release(&key("a"));
        assert_eq!(r.in_progress(), 0);
        r.admit(&key("a"), 0);
        r.written(&key("a"), &deployment(2, false), vec![], false);
        r.release(&key("a"));
        assert_eq!(r.in_progress(), 1);
        // Reloaded again while its rollout runs: it keeps its one slot.
        assert_eq!(r.admit(&key("a"), 0), Admission::Go);
        assert_eq!(r.in_progress(), 1);
    }

    #[test]
    fn a_failed_rollout_frees_its_slot_and_is_counted() {
        let r = rollouts(1);
        r.admit(&key("a"), 0);
        r.written(&key("a"), &deployment(2, false), vec![], false);
        observe(&r, &key("a"), &failed(2));
        assert_eq!(r.in_progress(), 0);
        let failed = r
            .metrics
            .rollouts_failed
            .get_or_create(&ReasonLabels {
                reason: "progress_deadline".into(),
            })
            .get();
        assert_eq!(failed, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rollout_that_outlives_the_timeout_frees_its_slot() {
        let r = rollouts(1);
        r.admit(&key("a"), 0);
        r.written(&key("a"), &deployment(2, false), vec![], false);
        let now = Instant::now();
        assert_eq!(r.tick(true, true, now + Duration::from_secs(599)), 0);
        assert_eq!(r.tick(true, true, now + Duration::from_secs(600)), 1);
        assert_eq!(r.in_progress(), 0);
    }

    #[test]
    fn a_new_leader_follows_a_running_canary_and_halts_its_changes_when_it_fails() {
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let r = Rollouts::new(0, Duration::from_secs(600), false, Arc::default(), metrics);
        let canary = |reason: &str| {
            json!({"metadata": {"generation": 3, "annotations": {"rekindle.io/reload-canary": "true"}},
                "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "app",
                    "envFrom": [{"configMapRef": {"name": "cfg"}}],
                    "env": [{"name": "STAKATER_CFG_CONFIGMAP", "value": "h2"}]}]}}},
                "status": {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 0,
                    "availableReplicas": 1, "conditions": [{"type": "Progressing", "reason": reason}]}})
        };
        // Seen rolling before this replica leads (another leader started it).
        observe(&r, &key("canary"), &canary("ReplicaSetUpdated"));
        r.tick(true, true, Instant::now());
        observe(&r, &key("canary"), &canary("ProgressDeadlineExceeded"));
        let failed = r.take_failed();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].halts);
        assert_eq!(
            failed[0].changes,
            [HaltedChange {
                kind: crate::core::ResourceKind::ConfigMap,
                name: "cfg".into(),
                hash: "h2".into(),
            }]
        );
        assert!(r.halt_owed(&key("canary")).is_some());
        // A canary just created (generation 1) that fails its first rollout halts nothing.
        let r = rollouts(0);
        let mut created = canary("ReplicaSetUpdated");
        created["metadata"]["generation"] = json!(1);
        created["status"]["observedGeneration"] = json!(1);
        observe(&r, &key("new"), &created);
        r.tick(false, true, Instant::now());
        r.tick(true, true, Instant::now());
        created["status"]["conditions"][0]["reason"] = json!("ProgressDeadlineExceeded");
        observe(&r, &key("new"), &created);
        assert!(r.take_failed().is_empty());
    }

    #[test]
    fn a_new_leader_counts_only_the_rollouts_of_workloads_it_serves() {
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let scope = ScopeFilter::new(&crate::config::Scope {
            namespaces: Some(["ns".to_string()].into()),
            ..Default::default()
        });
        let r = Rollouts::new(2, Duration::from_secs(600), false, Arc::new(scope), metrics);
        let elsewhere = WorkloadKey {
            namespace: "other".into(),
            ..key("a")
        };
        observe(&r, &key("a"), &deployment(3, false));
        observe(&r, &elsewhere, &deployment(3, false));
        assert_eq!(r.tick(true, true, Instant::now()), 1, "one slot left");
        assert!(r.serves(&key("a")) && !r.serves(&elsewhere));
    }

    #[test]
    fn a_new_leader_counts_the_rollouts_already_running() {
        let r = rollouts(2);
        observe(&r, &key("a"), &deployment(3, false));
        observe(&r, &key("b"), &deployment(1, true));
        assert_eq!(r.tick(false, true, Instant::now()), 0);
        // No slot is given before the rollouts already running are counted, once the watches synced.
        assert_eq!(r.admit(&key("c"), 0), Admission::Counting);
        assert_eq!(r.tick(true, false, Instant::now()), 0);
        assert_eq!(r.admit(&key("c"), 0), Admission::Counting);
        assert_eq!(r.tick(true, true, Instant::now()), 1);
        assert_eq!(r.in_progress(), 1);
        observe(&r, &key("a"), &deployment(3, true));
        assert_eq!(r.in_progress(), 0);
        // Losing the lead forgets the count; the next leadership counts afresh.
        r.admit(&key("c"), 0);
        r.tick(false, true, Instant::now());
        assert_eq!(r.in_progress(), 0);
    }

    fn change() -> Vec<HaltedChange> {
        vec![HaltedChange {
            kind: crate::core::ResourceKind::ConfigMap,
            name: "cfg".into(),
            hash: "h2".into(),
        }]
    }

    #[test]
    fn a_failed_canary_halts_its_changes_and_others_only_with_the_flag() {
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let plain = Rollouts::new(
            0,
            Duration::from_secs(600),
            false,
            Arc::default(),
            metrics.clone(),
        );
        plain.written(&key("web"), &deployment(2, false), change(), false);
        assert_eq!(plain.in_progress(), 0, "nothing to follow it for");
        plain.written(&key("canary"), &deployment(2, false), change(), true);
        observe(&plain, &key("canary"), &failed(2));
        let failed = plain.take_failed();
        assert_eq!(failed.len(), 1);
        assert!(failed[0].halts);
        assert_eq!(failed[0].changes, change());
        assert!(plain.take_failed().is_empty(), "handed over once");

        let halting = Rollouts::new(0, Duration::from_secs(600), true, Arc::default(), metrics);
        halting.written(&key("web"), &deployment(2, false), change(), false);
        observe(&halting, &key("web"), &deployment(2, true));
        assert!(halting.take_failed().is_empty(), "it finished");
        halting.written(&key("web"), &deployment(3, false), change(), false);
        let now = Instant::now();
        halting.tick(true, true, now + Duration::from_secs(601));
        let failed = halting.take_failed();
        assert_eq!(failed[0].reason, Failure::Timeout);
        assert!(failed[0].halts);
    }

    #[test]
    fn a_failure_that_halts_holds_its_change_until_the_halt_is_written() {
        let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
        let r = Rollouts::new(1, Duration::from_secs(600), true, Arc::default(), metrics);
        r.tick(true, true, Instant::now());
        let c = &change()[0];
        let cm = ResourceRef {
            kind: c.kind,
            name: c.name.as_str().into(),
        };
        assert_eq!(r.admit(&key("a"), 0), Admission::Go);
        r.written(&key("a"), &deployment(2, false), change(), false);
        observe(&r, &key("a"), &failed(2));
        // The slot is free at once, but the change is held until the halt is in the annotation.
        assert_eq!(r.in_progress(), 0);
        assert!(r.has_unwritten_halts());
        assert_eq!(
            r.unwritten_halt("ns", &cm, &c.hash),
            Some((key("a"), Failure::ProgressDeadline))
        );
        assert_eq!(r.unwritten_halt("other", &cm, &c.hash), None);
        assert_eq!(r.unwritten_halt("ns", &cm, "another hash"), None);
        assert_eq!(r.take_failed().len(), 1);
        assert!(r.has_unwritten_halts(), "taken, not written yet");
        r.halt_written(&key("a"));
        assert!(!r.has_unwritten_halts());
        // A replica that stops leading forgets halts it did not write.
        r.written(&key("b"), &deployment(2, false), change(), false);
        observe(&r, &key("b"), &failed(2));
        assert!(r.has_unwritten_halts());
        r.tick(false, true, Instant::now());
        assert!(!r.has_unwritten_halts());
    }

    #[test]
    fn unlimited_tracks_nothing() {
        let r = rollouts(0);
        assert_eq!(r.admit(&key("a"), 5), Admission::Go);
        observe(&r, &key("a"), &deployment(3, false));
        assert_eq!(r.in_progress(), 0);
        assert!(r.lock().unfinished.is_empty());
    }
}
