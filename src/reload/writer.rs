//! The writer: takes due workloads from the queue, asks the core what to change and writes it.
//!
//! Deployments, StatefulSets, DaemonSets and CronJobs (patched in place) are planned from the index's
//! skeleton of the object (`core::skeleton`) and get one strategic-merge patch (containers and env vars
//! keyed by name, annotations by key), no GET. Every write carries the resourceVersion it was planned
//! from: a write the network held back until after another leader moved the object is refused (409)
//! rather than putting older markers back, which would roll the workload twice. The index follows the
//! watch, so a guard is stale only when the object changed in the last moments (status, an HPA's
//! replicas); that conflict is retried once after reading the object. The PATCH response replaces the
//! index's record, so a reload right after plans from what was written. Conflicts and transient
//! errors are retried after reading the object; what would fail the same way again is not (see
//! [`super::error::WriteError`]).
//! CRD kinds (Rollouts, DeploymentConfigs) have no strategic merge, and a Deployment being paused changes
//! fields a merge cannot guard: those are read and get a JSON patch guarded by the resourceVersion (a
//! `test` op), re-read and retried on conflict (422 from the failed test, or 409). Jobs and CronJobs
//! creating a Job are read too (the Job is made from the whole template). No LIST is ever made.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use backon::Retryable;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::WriteError;
use super::pause::{self, Resume};
use super::queue::{Deferred, Finished, Pending, Queue, Upkeep};
use super::rollouts::{Admission, FailedRollout, Rollouts};
use crate::core::job::{job_from_cronjob, strip_job};
use crate::core::patch::{self, MarkerChange, Place};
use crate::core::pause::{pause_ops, PauseDecision};
use crate::core::plan::{self, Action, Change, Event, PlanConfig};
use crate::core::policy::ResourceFlags;
use crate::core::refs::ResourceRef;
use crate::core::release::{Halt, HaltedChange, Release, HALTED_ANNOTATION};
use crate::core::rollout::Progress;
use crate::core::skeleton;
use crate::core::window::{self, Windows};
use crate::core::WorkloadKind;
use crate::index::{Index, ResourceKey, WorkloadEntry, WorkloadKey};
use crate::metrics::{Metrics, ReasonLabels, Skip};
use crate::outbound::alert::{reload_message, Alerter};
use crate::reload::lease::Leadership;
use crate::reload::recreate::{self, Leftover, Record, Records};
use crate::retry;
use crate::watch::SyncProgress;

const MAX_ATTEMPTS: usize = 6;

/// How long a leader's writer may take and finish nothing while work is owed before `/live` fails and the
/// kubelet restarts the replica. Longer than one workload's every attempt (6 × the 60 s write timeout,
/// plus backoff), so a slow apiserver alone never restarts it.
pub const STALL_LIMIT: Duration = Duration::from_secs(600);

/// How long this replica's writer has been stalled (see [`Queue::stalled_for`]); zero on a follower,
/// which owes nothing.
pub fn stalled_for(queue: &Queue, leadership: &Leadership) -> Duration {
    if leadership.is_leader() {
        queue.stalled_for()
    } else {
        Duration::ZERO
    }
}
const PATCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Tries at creating a Job again after deleting it (backoff to 5 s: about five minutes in all).
const JOB_CREATE_RETRIES: usize = 60;
/// When a resume, or a halt's write or removal, that failed is tried again; a resume that lost to
/// another write, sooner.
const UPKEEP_RETRY: Duration = Duration::from_secs(5);
const RESUME_CONFLICT_RETRY: Duration = Duration::from_millis(200);

/// How often a reload held back by a canary or a halt looks again.
const RELEASE_RECHECK: Duration = Duration::from_secs(5);
/// How long a reload deferred by the rollout budget waits if no freed slot wakes it first.
const BUDGET_RECHECK: Duration = Duration::from_secs(60);
/// How long the writer waits at start for every workload watch to list (the canaries and halts
/// known) before it writes without the kinds still listing: a watch that cannot list must not stop
/// every reload.
const RELEASE_ORDER_WAIT: Duration = Duration::from_secs(60);
/// Size of the set of invalid annotations already reported at which deleted workloads are forgotten.
const WARNED_PRUNE_AT: usize = 1024;

pub struct Writer {
    pub client: Client,
    pub plan: PlanConfig,
    pub index: Arc<Index>,
    pub queue: Arc<Queue>,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub max_concurrent: usize,
    /// One permit per write in flight (`--max-concurrent-reloads`); never held while waiting to retry.
    slots: Arc<Semaphore>,
    /// Only the leader writes.
    pub leadership: Leadership,
    /// Alerts after each reload (`ALERT_ON_RELOAD`).
    pub alerter: Option<Arc<Alerter>>,
    /// `--reload-window`: when reloads of workloads without their own window may start.
    pub default_window: Option<Windows>,
    /// `--max-rollouts-in-progress`: the slots reloads take (unlimited unless set).
    pub rollouts: Arc<Rollouts>,
    /// The first sync's progress: the writer starts once every workload watch has listed. None: at once.
    pub sync: Option<tokio::sync::watch::Receiver<SyncProgress>>,
    /// Where Jobs being re-created are recorded (the replica's namespace); None: not recorded, and a
    /// crash between a Job's delete and its create loses it.
    pub recreates: Option<Records>,
    /// (workload, annotation value) pairs already reported as invalid: one Warning Event each.
    warned: Mutex<HashSet<(WorkloadKey, String)>>,
}

const FIELD_MANAGER: &str = "rekindle";

enum Outcome {
    Reloaded,
    NothingToDo,
    Gone,
    /// Leadership ended before the write: the next leader's catch-up makes it.
    NotLeader,
}

/// The pending changes planned on the object: the marker changes, the object with them applied, the
/// resources that caused them and what to do.
struct Planned {
    working: Value,
    changes: Vec<MarkerChange>,
    reasons: Vec<ResourceRef>,
    /// The reasons with the hashes planned: what a failed rollout of this reload halts.
    halted_changes: Vec<HaltedChange>,
    action: Action,
}

/// A failed attempt, and whether it was planned from the index (whose record may be behind the object).
struct Failure {
    error: WriteError,
    from_index: bool,
}

impl Failure {
    /// Conflicts and transient errors are retried; an invalid or unrenderable patch planned from the
    /// index is retried once from the live object; anything else fails the same way again.
    fn retryable(&self) -> bool {
        self.error.retryable()
            || (self.from_index
                && matches!(self.error, WriteError::Invalid(_) | WriteError::Render(_)))
    }
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        plan: PlanConfig,
        index: Arc<Index>,
        queue: Arc<Queue>,
        metrics: Arc<Metrics>,
        recorder: Recorder,
        max_concurrent: usize,
        leadership: Leadership,
    ) -> Self {
        Self {
            client,
            plan,
            index,
            queue,
            metrics: metrics.clone(),
            recorder,
            max_concurrent,
            slots: Arc::new(Semaphore::new(max_concurrent)),
            leadership,
            alerter: None,
            default_window: None,
            rollouts: Rollouts::new(0, Duration::ZERO, false, metrics.clone()),
            sync: None,
            recreates: None,
            warned: Mutex::default(),
        }
    }

    /// Runs until `shutdown`; then waits (up to 10 s) for reloads in flight.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        self.wait_for_release_order(&shutdown).await;
        let slots = self.slots.clone();
        let mut leadership = self.leadership.clone();
        let mut leading = false;
        loop {
            // A follower keeps its queue but never writes; the leader's catch-up covers its work.
            if !leadership.is_leader() {
                leading = false;
                tokio::select! {
                    _ = leadership.acquired() => {}
                    _ = shutdown.cancelled() => break,
                }
                self.queue.writer_resumed();
            }
            if !leading {
                leading = true;
                // Before any reload, so that none of them races a record being finished.
                self.finish_recreates().await;
            }
            let (key, pending) = tokio::select! {
                next = self.queue.next() => next,
                _ = leadership.lost() => continue,
                _ = shutdown.cancelled() => break,
            };
            self.metrics
                .workqueue_latency
                .observe(pending.first.elapsed().as_secs_f64());
            let Ok(permit) = slots.clone().acquire_owned().await else {
                break;
            };
            let this = self.clone();
            // The span is attached to the task, not entered: an entered guard held across awaits
            // would tag whatever else runs on this thread meanwhile.
            let span = tracing::info_span!("reload", workload = %key);
            tokio::spawn(
                async move {
                    let finished = this.reconcile(&key, pending, Some(permit)).await;
                    this.queue.done(&key, finished);
                }
                .instrument(span),
            );
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            slots.acquire_many(self.max_concurrent as u32),
        )
        .await;
    }

    /// Waits until every workload watch has listed, so that the release order is known: a reload owed
    /// from before a start must not go ahead of a canary, or through a halt, on a workload not listed
    /// yet. Changes queue meanwhile. Past [`RELEASE_ORDER_WAIT`], the writer starts all the same.
    async fn wait_for_release_order(&self, shutdown: &CancellationToken) {
        let Some(mut progress) = self.sync.clone() else {
            return;
        };
        let listed = async {
            let _ = progress.wait_for(|p| p.workloads).await;
        };
        tokio::select! {
            waited = tokio::time::timeout(RELEASE_ORDER_WAIT, listed) => {
                if waited.is_err() {
                    tracing::warn!(
                        waited = ?RELEASE_ORDER_WAIT,
                        "some workload watches have not listed; reloading without their canaries and halts"
                    );
                }
            }
            _ = shutdown.cancelled() => {}
        }
    }

    /// Reloads one workload, taking a write permit for each attempt; whether it was written.
    #[cfg(test)]
    async fn reload(&self, key: &WorkloadKey, pending: &Pending) -> bool {
        matches!(
            self.reconcile(key, pending.clone(), None).await,
            Finished::Reloaded
        )
    }

    /// Reconciles one workload: what its pending changes owe is written now, or goes back to the queue
    /// with when to try again ([`Finished::RequeueAfter`]): outside its reload window, past the
    /// rollout budget, or after a failure.
    async fn reconcile(
        &self,
        key: &WorkloadKey,
        mut pending: Pending,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Finished {
        let upkeep = std::mem::take(&mut pending.upkeep);
        if upkeep.halt {
            if let Some(after) = self.reconcile_halt(key).await {
                self.upkeep_again(key, after, Upkeep::HALT);
            }
        }
        let finished = if pending.causes.is_empty() {
            Finished::Settled
        } else {
            self.reload_owed(key, pending, permit).await
        };
        // After the reload, so that what it wrote rolls out with the resume, in one rollout.
        if upkeep.resume {
            if let Some(after) = self.resume_if_due(key).await {
                self.upkeep_again(key, after, Upkeep::RESUME);
            }
        }
        finished
    }

    /// Queues `upkeep` again after `after`, behind this run (`Queue::done` keeps it).
    fn upkeep_again(&self, key: &WorkloadKey, after: Duration, upkeep: Upkeep) {
        self.queue
            .push_upkeep(key.clone(), Instant::now() + after, upkeep);
    }

    /// What the pending changes owe is written now, or goes back to the queue: outside the reload
    /// window, held by the release order, past the rollout budget, or after a failure.
    async fn reload_owed(
        &self,
        key: &WorkloadKey,
        pending: Pending,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Finished {
        let pending = match self.outside_window(key, pending).await {
            ControlFlow::Continue(pending) => pending,
            ControlFlow::Break(deferred) => return deferred,
        };
        let pending = match self.held_by_release(key, pending).await {
            ControlFlow::Continue(pending) => pending,
            ControlFlow::Break(deferred) => return deferred,
        };
        let pending = match self.over_budget(key, pending).await {
            ControlFlow::Continue(pending) => pending,
            ControlFlow::Break(deferred) => return deferred,
        };
        let finished = self.write_owed(key, pending, permit).await;
        if !matches!(finished, Finished::Reloaded) {
            self.rollouts.release(key);
        }
        finished
    }

    /// Writes what the pending changes owe; a final failure goes back to the queue with a backoff.
    async fn write_owed(
        &self,
        key: &WorkloadKey,
        pending: Pending,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Finished {
        let started = Instant::now();
        match self.attempts(key, &pending, permit).await {
            Ok(Outcome::Reloaded) => {
                self.count_reloaded(key, &pending, started);
                Finished::Reloaded
            }
            Ok(Outcome::NothingToDo) => {
                self.metrics.skip(Skip::StrategyNotUpdated);
                Finished::Settled
            }
            Ok(Outcome::Gone) => Finished::Settled,
            Ok(Outcome::NotLeader) => {
                tracing::info!("not leading any more; left to the leader");
                Finished::Settled
            }
            Err(f) => self.failed_for_now(key, pending, started, f.error).await,
        }
    }

    /// The write, in attempts with backoff, each holding a write permit (`permit` is the first's),
    /// none held while waiting for the next. The first attempt plans from the index.
    async fn attempts(
        &self,
        key: &WorkloadKey,
        pending: &Pending,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<Outcome, Failure> {
        let first_permit = Mutex::new(permit);
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &key.namespace,
            &key.kind.api_resource(),
        );
        let from_index = AtomicBool::new(true);
        (|| async {
            let taken = first_permit
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            let _permit = match taken {
                Some(p) => p,
                None => self
                    .slots
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| Failure {
                        error: WriteError::Transient("the writer is stopping".into()),
                        from_index: false,
                    })?,
            };
            let planned_from_index = from_index.swap(false, Ordering::Relaxed);
            self.attempt(&api, key, pending, planned_from_index)
                .await
                .map_err(|error| {
                    self.count_failed_attempt(&error);
                    Failure {
                        error,
                        from_index: planned_from_index,
                    }
                })
        })
        .retry(retry::backoff(
            Duration::from_millis(100),
            Duration::from_secs(5),
            MAX_ATTEMPTS - 1,
        ))
        .sleep(tokio::time::sleep)
        .when(Failure::retryable)
        .notify(|f, wait| {
            self.metrics.retries.inc();
            tracing::debug!(error = %f.error, ?wait, "reload attempt failed; retrying");
        })
        .await
    }

    /// Every failed attempt counts here; the final outcome is counted by the caller.
    fn count_failed_attempt(&self, error: &WriteError) {
        self.metrics.error("reload_attempt");
        self.metrics
            .reload_attempt_failures
            .get_or_create(&ReasonLabels {
                reason: error.metric_label().into(),
            })
            .inc();
    }

    fn count_reloaded(&self, key: &WorkloadKey, pending: &Pending, started: Instant) {
        let seconds = started.elapsed().as_secs_f64();
        self.metrics
            .reload_done(&key.namespace, key.kind.name(), true, seconds);
        // A reload that waited for its window would measure the window, not rekindle.
        let waited = pending.deferred.is_some();
        if let Some(first) = pending.causes.values().min().filter(|_| !waited) {
            self.metrics
                .reload_latency
                .observe(first.elapsed().as_secs_f64());
        }
    }

    /// Every attempt failed: counted, a Warning Event `ReloadFail`, and back to the queue with a
    /// backoff (or at once with the workload's next change).
    async fn failed_for_now(
        &self,
        key: &WorkloadKey,
        pending: Pending,
        started: Instant,
        last_error: WriteError,
    ) -> Finished {
        let finished = Finished::failed(pending);
        let retry_in = finished.requeue_after().unwrap_or_default();
        tracing::warn!(error = %last_error, ?retry_in, "reload failed; tried again later");
        self.metrics.reload_done(
            &key.namespace,
            key.kind.name(),
            false,
            started.elapsed().as_secs_f64(),
        );
        self.metrics.error("reload");
        let note = format!(
            "Reload of {} '{}' failed: {last_error}; trying again in {}s",
            key.kind,
            key.name,
            retry_in.as_secs()
        );
        self.publish(key, None, EventType::Warning, "ReloadFail", note)
            .await;
        finished
    }

    /// Ends the pause rekindle set on the Deployment if its period is over; how long until it is, if
    /// not, or until the next try after a failure (at once on a conflict).
    async fn resume_if_due(&self, key: &WorkloadKey) -> Option<Duration> {
        let keys = &self.plan.policy.keys;
        match pause::resume_if_due(&self.client, keys, &self.leadership, key).await {
            Ok(Resume::Done) | Err(WriteError::Gone) => None,
            Ok(Resume::DueIn(after)) => Some(after),
            Err(WriteError::Conflict(_)) => Some(RESUME_CONFLICT_RETRY),
            Err(e) => {
                tracing::warn!(error = %e, after = ?UPKEEP_RETRY, "could not resume the Deployment; trying again");
                self.metrics.error("resume");
                Some(UPKEEP_RETRY)
            }
        }
    }

    /// A reload owed outside the workload's reload window waits until the window opens; its
    /// `ReloadDeferred` Event is posted once, when it starts waiting.
    async fn outside_window(
        &self,
        key: &WorkloadKey,
        mut pending: Pending,
    ) -> ControlFlow<Finished, Pending> {
        let Some((windows, uid)) = self.window_of(key).await else {
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
        if pending.deferred != Some(Deferred::Window) {
            tracing::info!(%opens, window = %windows, "outside the reload window; deferred");
            let note = format!(
                "Reload of {} '{}' deferred until {opens}: outside its reload window {windows}",
                key.kind, key.name
            );
            self.publish(
                key,
                uid.as_deref(),
                EventType::Normal,
                "ReloadDeferred",
                note,
            )
            .await;
        }
        pending.deferred = Some(Deferred::Window);
        ControlFlow::Break(Finished::RequeueAfter { pending, after })
    }

    /// Canaries first, and nothing for a halted change: a reload waits while a change it owes is halted
    /// (a workload names it in `rekindle.io/reload-halted`), and a workload that is not a canary waits
    /// while a canary owed the same change has not finished its rollout healthy.
    async fn held_by_release(
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
    async fn defer(
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
            let uid = self.uid_of(key);
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
    fn release_hold(&self, key: &WorkloadKey, pending: &Pending) -> Option<(Deferred, String)> {
        let own_canary = self.index.release_of(key).is_some_and(|r| r.canary);
        for r in pending.causes.keys() {
            let rk = ResourceKey::new(r.kind, &key.namespace, &r.name);
            let Some(resource) = self.index.resource(&rk) else {
                continue;
            };
            let hash = &*resource.hash;
            if let Some((failed, reason)) = self.rollouts.unwritten_halt(&key.namespace, r, hash) {
                let why = halted(r, &failed, reason.label(), "its halt is being written");
                return Some((Deferred::Halt, why));
            }
            for (peer, release, marker) in self.index.release_peers(&key.namespace, r) {
                if let Some(halt) = release.halt().filter(|h| h.holds(r, hash)) {
                    let see = format!("see its {HALTED_ANNOTATION} annotation");
                    return Some((Deferred::Halt, halted(r, &peer, &halt.reason, &see)));
                }
                if own_canary || !release.canary || peer == *key {
                    continue;
                }
                let waiting = if marker.as_deref() == Some(hash) {
                    (release.progress != Progress::Finished)
                        .then_some("has not finished its rollout")
                } else {
                    self.owes(&peer, r, hash, resource.flags)
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

    /// Whether `key` reloads for the change of `r` to `hash` (planned on its skeleton).
    fn owes(&self, key: &WorkloadKey, r: &ResourceRef, hash: &str, flags: ResourceFlags) -> bool {
        let Some((skeleton, _)) = self.index.skeleton(key) else {
            return false;
        };
        let change = Change {
            kind: r.kind,
            name: &r.name,
            namespace: &key.namespace,
            hash,
            flags,
            event: Event::Update,
        };
        let now = jiff::Timestamp::now().as_second();
        !plan::plan(&self.plan, &skeleton, key.kind, &change, now)
            .changes
            .is_empty()
    }

    fn uid_of(&self, key: &WorkloadKey) -> Option<String> {
        self.index.skeleton(key).and_then(|(s, _)| {
            s.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(String::from)
        })
    }

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
    async fn reconcile_halt(&self, key: &WorkloadKey) -> Option<Duration> {
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
        self.metrics.error("halt");
        Some(UPKEEP_RETRY)
    }

    /// Writes the halt of a failed rollout on its workload, with a Warning Event and an alert.
    async fn halt(&self, failed: &FailedRollout) -> Result<(), WriteError> {
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
            self.uid_of(key).as_deref(),
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
    /// its changes is current any more.
    fn halt_over(&self, key: &WorkloadKey, release: &Release) -> Option<&'static str> {
        let halt = release.halt()?;
        if release.progress == Progress::Finished {
            return Some("its rollout is healthy again");
        }
        let current = halt.changes.iter().any(|c| {
            self.index
                .resource(&ResourceKey::new(c.kind, &key.namespace, &c.name))
                .is_some_and(|r| *r.hash == c.hash)
        });
        (!current).then_some("the resource changed again")
    }

    /// Removes a halt that is over, with a `ReloadResumed` Event.
    async fn end_halt(
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
            self.uid_of(key).as_deref(),
            EventType::Normal,
            "ReloadResumed",
            note,
        )
        .await;
        Ok(())
    }

    /// A merge patch of the workload's metadata; the response goes into the index.
    async fn annotate(&self, key: &WorkloadKey, body: Value) -> Result<(), WriteError> {
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

    /// A reload past `--max-rollouts-in-progress` waits until a slot is free for it (the writer wakes
    /// it: [`Rollouts::run`]); its `ReloadDeferred` Event is posted once, when it starts waiting.
    async fn over_budget(
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
    /// `--reload-window`) and uid; an invalid value is reported once on the workload.
    async fn window_of(&self, key: &WorkloadKey) -> Option<(Windows, Option<String>)> {
        let skeleton = self.index.skeleton(key).map(|(s, _)| s);
        let uid = skeleton
            .as_ref()
            .and_then(|s| s.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(String::from);
        let annotations = skeleton
            .as_ref()
            .and_then(|s| s.pointer("/metadata/annotations"));
        let namespace = self.index.namespace_window(&key.namespace);
        match window::window_of(
            annotations,
            namespace.as_deref(),
            self.default_window.as_ref(),
        ) {
            Ok(windows) => windows.map(|w| (w, uid)),
            Err(e) => {
                // The error names the value and whose it is: reported once per workload and error.
                let note = format!("{e}; reloading without a window");
                self.warn_invalid(
                    key,
                    uid.as_deref(),
                    window::RELOAD_WINDOW_ANNOTATION,
                    &e.0,
                    note,
                )
                .await;
                None
            }
        }
    }

    async fn attempt(
        &self,
        api: &Api<DynamicObject>,
        key: &WorkloadKey,
        pending: &Pending,
        from_index: bool,
    ) -> Result<Outcome, WriteError> {
        let Some((value, rv)) = self.view(api, key, from_index).await? else {
            return Ok(Outcome::Gone);
        };
        let uid = value
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(String::from);
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
                self.patch(api, key, &value, rv, changes, action == Action::Restart)
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
                let canary = self.index.release_of(key).is_some_and(|r| r.canary);
                self.rollouts
                    .written(key, &written, planned.halted_changes, canary);
                self.announce(key, uid.as_deref(), &planned.reasons, action)
                    .await;
                Ok(Outcome::Reloaded)
            }
            Err(WriteError::Gone) => Ok(Outcome::Gone),
            Err(WriteError::NotLeader) => Ok(Outcome::NotLeader),
            Err(e) => Err(e),
        }
    }

    /// What to plan from, and the resourceVersion that guards the write: the index's skeleton, or the
    /// object read from the API; `None` when the object is gone.
    async fn view(
        &self,
        api: &Api<DynamicObject>,
        key: &WorkloadKey,
        from_index: bool,
    ) -> Result<Option<(Value, String)>, WriteError> {
        let reason = match self.planning_view(key, from_index) {
            Ok((skeleton, rv)) => return Ok(Some((skeleton, rv.to_string()))),
            Err(reason) => reason,
        };
        self.metrics
            .workload_reads
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
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
        let value = serde_json::to_value(&obj)
            .map_err(|_| WriteError::Invalid("object does not serialise".into()))?;
        Ok(Some((value, rv)))
    }

    /// Plans every pending change of the workload in turn, each on the result of the ones before.
    async fn plan_pending(
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
        for r in pending.causes.keys() {
            let rk = ResourceKey::new(r.kind, &key.namespace, &r.name);
            // What is owed is the resource as it is now: its current hash, or its deletion (which
            // only `--reload-on-delete` acts on). A resource deleted and created again since it was
            // queued is an update to the new content.
            let (hash, flags, event) = match self.index.resource(&rk) {
                Some(e) => (e.hash, e.flags, Event::Update),
                None => (Box::default(), ResourceFlags::default(), Event::Delete),
            };
            let change = Change {
                kind: r.kind,
                name: &r.name,
                namespace: &key.namespace,
                hash: &hash,
                flags,
                event,
            };
            let p = plan::plan(&self.plan, &planned.working, key.kind, &change, now);
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
            planned.working = patch::apply(&planned.working, key.kind, &p.changes)
                .map_err(|e| WriteError::Render(e.to_string()))?;
            planned.action = p.action;
            planned.changes.extend(p.changes);
            planned.reasons.push(r.clone());
            planned.halted_changes.push(HaltedChange {
                kind: r.kind,
                name: r.name.clone(),
                hash: hash.to_string(),
            });
        }
        Ok(planned)
    }

    /// One `Reloaded` Event (Reloader's message) and alert per resource that caused the reload.
    async fn announce(
        &self,
        key: &WorkloadKey,
        uid: Option<&str>,
        reasons: &[ResourceRef],
        action: Action,
    ) {
        for r in reasons {
            let note = format!(
                "Changes detected in '{}' of type '{}' in namespace '{}', Updated '{}' of type '{}' in namespace '{}'",
                r.name,
                r.kind.env_suffix(),
                key.namespace,
                key.name,
                key.kind,
                key.namespace
            );
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

    /// The skeleton to plan from and its resourceVersion, or why the object must be read instead (the
    /// metric's reason).
    fn planning_view(
        &self,
        key: &WorkloadKey,
        from_index: bool,
    ) -> Result<(Value, u64), &'static str> {
        if !from_index {
            return Err("retry");
        }
        let (skeleton, rv) = self.index.skeleton(key).ok_or("not_indexed")?;
        // Only a record with no resourceVersion to guard the write with (never seen stored).
        let rv = rv.ok_or("not_indexed")?;
        if skeleton::needs_live_object(&self.plan, &skeleton, key.kind) {
            return Err("kind");
        }
        Ok((skeleton, rv))
    }

    /// A strategic-merge patch for built-in kinds; otherwise (CRDs, a Deployment being paused, a Rollout
    /// restart, which also sets `spec.restartAt`) a JSON patch. Both are guarded by the resourceVersion
    /// the plan was made from.
    async fn patch(
        &self,
        api: &Api<DynamicObject>,
        key: &WorkloadKey,
        value: &Value,
        rv: String,
        changes: &[MarkerChange],
        restart: bool,
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
        let strategic =
            key.kind.strategic_merge() && !restart && !matches!(pause, PauseDecision::Pause(_));
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
        ops.insert(0, patch::test_resource_version(&rv));
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
    fn record_written(&self, key: &WorkloadKey, written: &DynamicObject) -> Value {
        let Ok(value) = serde_json::to_value(written) else {
            return Value::Null;
        };
        self.index.record_written(
            key,
            WorkloadEntry::from_stored(&self.plan, &value, key.kind),
        );
        value
    }

    async fn send<P: serde::Serialize + std::fmt::Debug>(
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

    /// CronJob in `job` mode: a Job from the (marked) job template under a deterministic name, then the
    /// CronJob's metadata markers. A retried create answers AlreadyExists: done, never a second Job.
    async fn create_job(
        &self,
        cronjobs: &Api<DynamicObject>,
        key: &WorkloadKey,
        value: &Value,
        working: &Value,
        rv: String,
        changes: &[MarkerChange],
    ) -> Result<(), WriteError> {
        let hashes: Vec<&str> = changes
            .iter()
            .filter_map(|c| match c {
                MarkerChange::SetConfigHash {
                    place: Place::Metadata,
                    hash,
                    ..
                } => Some(hash.as_str()),
                _ => None,
            })
            .collect();
        let job = job_from_cronjob(working, &key.name, &hashes.concat())
            .ok_or_else(|| WriteError::Render("the CronJob has no job template".into()))?;
        let jobs: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &key.namespace,
            &WorkloadKind::Job.api_resource(),
        );
        let job: DynamicObject =
            serde_json::from_value(job).map_err(|e| WriteError::Render(e.to_string()))?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match jobs.create(&params, &job).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {}
            Err(e) => return Err(WriteError::from_kube("creating the Job", e)),
        }
        // The create may have taken long (a slow or cut-off apiserver): the second write is the
        // leader's only. One that stops here leaves the CronJob's markers stale, and the next leader
        // creates the same Job (its name is derived from the hashes, so the create finds it) and
        // writes them.
        self.still_leading()?;
        let metadata_changes: Vec<MarkerChange> = changes
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    MarkerChange::SetConfigHash {
                        place: Place::Metadata,
                        ..
                    } | MarkerChange::RemoveConfigHash {
                        place: Place::Metadata,
                        ..
                    }
                )
            })
            .cloned()
            .collect();
        self.patch(cronjobs, key, value, rv, &metadata_changes, false)
            .await
            .map(|_| ())
    }

    /// Between the writes of one reload: leadership ends at the renew deadline, and a replica that
    /// was frozen or cut off in the middle must not carry on as if it still led.
    fn still_leading(&self) -> Result<(), WriteError> {
        if self.leadership.is_leader() {
            Ok(())
        } else {
            Err(WriteError::NotLeader)
        }
    }

    /// Job: delete (background propagation) and create again under the same name from its JSON.
    /// The delete is conditional on the UID that was read: if another writer (a second replica
    /// without leader election, say) re-created the Job since, it answers 409 and this reload is
    /// already done; a create meeting a Job with another UID is done the same way. Once the delete has
    /// gone through, the create is retried on transient errors for minutes (an apiserver restarting
    /// answers 500 for a few seconds): a read would find no Job and nothing left to reload, so this is
    /// the only place the Job still exists. For the same reason it is finished even if this replica's
    /// lease runs out meanwhile; with the name fixed it cannot be created twice. A crash between the
    /// two is covered by the record written before the delete ([`crate::reload::recreate`]).
    async fn recreate_job(
        &self,
        jobs: &Api<DynamicObject>,
        key: &WorkloadKey,
        working: &Value,
    ) -> Result<(), WriteError> {
        let uid = working
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(String::from);
        let fresh = strip_job(working);
        let job: DynamicObject =
            serde_json::from_value(fresh.clone()).map_err(|e| WriteError::Render(e.to_string()))?;
        // The UID the record is kept under, if one was written.
        let recorded = match uid.as_deref() {
            Some(uid) if self.record_recreate(key, uid, fresh).await? => Some(uid),
            _ => None,
        };
        let delete = DeleteParams {
            preconditions: uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match jobs.delete(&key.name, &delete).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::info!("the Job was re-created by another writer; nothing to do");
                self.forget_recreate(recorded).await;
                return Ok(());
            }
            Err(e) => return Err(WriteError::from_kube("deleting the Job", e)),
        }
        self.create_again(jobs, &job, uid.as_deref()).await?;
        self.forget_recreate(recorded).await;
        Ok(())
    }

    /// Records the Job about to be re-created (see [`crate::reload::recreate`]); whether it was.
    /// Without RBAC for the records, the re-create goes on unrecorded (a warning says so); any other
    /// error fails this attempt, before anything was deleted.
    async fn record_recreate(
        &self,
        key: &WorkloadKey,
        old_uid: &str,
        job: Value,
    ) -> Result<bool, WriteError> {
        let Some(records) = &self.recreates else {
            return Ok(false);
        };
        let record = Record {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            old_uid: old_uid.to_string(),
            job,
        };
        match records.write(&record).await {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 403 => {
                self.metrics.error("recreate_record");
                tracing::warn!(namespace = %records.namespace, error = %s.message,
                    "cannot record the Job before re-creating it: a crash before the create would lose it");
                Ok(false)
            }
            Err(e) => Err(WriteError::from_kube("recording the Job to re-create", e)),
        }
    }

    /// Removes the record of a finished re-create (kept under `old_uid`; None: none was written); one
    /// left behind is removed by the next leader.
    async fn forget_recreate(&self, old_uid: Option<&str>) {
        let (Some(records), Some(uid)) = (&self.recreates, old_uid) else {
            return;
        };
        if let Err(e) = records.remove(uid).await {
            self.metrics.error("recreate_record");
            tracing::warn!(error = %e, "could not remove the record of a finished re-create; the next leader will");
        }
    }

    /// Finishes the re-creates a leader recorded and did not finish (it stopped between a Job's
    /// delete and its create): each Job gone is created from its record, then the record goes.
    async fn finish_recreates(&self) {
        let Some(records) = &self.recreates else {
            return;
        };
        let (left, invalid) = match records.list().await {
            Ok(found) => found,
            Err(e) => {
                self.metrics.error("recreate_record");
                tracing::warn!(error = %e, "could not list the Jobs left to re-create");
                return;
            }
        };
        for (name, why) in invalid {
            self.metrics.error("recreate_record");
            tracing::warn!(configmap = %name, %why, "not a record of a Job to re-create; left alone");
        }
        for record in left {
            let jobs: Api<DynamicObject> = Api::namespaced_with(
                self.client.clone(),
                &record.namespace,
                &WorkloadKind::Job.api_resource(),
            );
            let current = match jobs.get_opt(&record.name).await {
                Ok(current) => current,
                Err(e) => {
                    self.metrics.error("recreate");
                    tracing::warn!(job = %record.name, namespace = %record.namespace, error = %e,
                        "could not read a Job left to re-create");
                    continue;
                }
            };
            let now = current.as_ref().map(|j| {
                (
                    j.metadata.uid.as_deref().unwrap_or_default(),
                    j.metadata.deletion_timestamp.is_some(),
                )
            });
            if recreate::leftover(&record, now) == Leftover::Create {
                let job = serde_json::from_value::<DynamicObject>(record.job.clone());
                let created = match job {
                    Ok(job) => self.create_again(&jobs, &job, Some(&record.old_uid)).await,
                    Err(e) => Err(WriteError::Render(e.to_string())),
                };
                if let Err(e) = created {
                    self.metrics.error("recreate");
                    tracing::error!(job = %record.name, namespace = %record.namespace, error = %e,
                        "could not create a Job left deleted by the previous leader; its record stays");
                    continue;
                }
                tracing::warn!(job = %record.name, namespace = %record.namespace,
                    "created a Job the previous leader deleted and did not create again");
            }
            self.forget_recreate(Some(&record.old_uid)).await;
        }
    }

    /// Creates `job` again after its predecessor (`old_uid`) was deleted: retried on transient errors
    /// and while the old Job is still there, for minutes, since nothing else would create it.
    async fn create_again(
        &self,
        jobs: &Api<DynamicObject>,
        job: &DynamicObject,
        old_uid: Option<&str>,
    ) -> Result<(), WriteError> {
        let name = job.metadata.name.clone().unwrap_or_default();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        // The old Job is removed in the background; until it is gone the create meets AlreadyExists
        // (`Err(None)`: wait and try again), as it does a transient error.
        let create = || async {
            match jobs.create(&params, job).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // Still the old Job, or one another writer created meanwhile (then: done).
                    let current = jobs.get_opt(&name).await.ok().flatten();
                    match current {
                        Some(j) if j.metadata.uid.as_deref() != old_uid => Ok(()),
                        _ => Err(None),
                    }
                }
                Err(e) => Err(Some(WriteError::from_kube("re-creating the Job", e))),
            }
        };
        create
            .retry(retry::backoff(
                Duration::from_millis(100),
                Duration::from_secs(5),
                JOB_CREATE_RETRIES,
            ))
            .sleep(tokio::time::sleep)
            .when(|e| e.as_ref().is_none_or(WriteError::retryable))
            .await
            .map_err(|e| {
                let e = e.unwrap_or_else(|| {
                    WriteError::Transient("the old Job was not removed in time".into())
                });
                tracing::error!(error = %e, job = %serde_json::to_string(&job).unwrap_or_default(),
                    "the Job was deleted and could not be created again; its manifest follows");
                e
            })
    }

    /// One Warning Event `InvalidAnnotation` per workload and annotation value.
    async fn warn_invalid(
        &self,
        key: &WorkloadKey,
        uid: Option<&str>,
        annotation: &str,
        value: &str,
        note: String,
    ) {
        let first = {
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            // Bounded: past a thousand entries, forget those of workloads that are gone.
            if warned.len() >= WARNED_PRUNE_AT {
                warned.retain(|(w, _)| self.index.workload(w).is_some());
            }
            warned.insert((key.clone(), format!("{annotation}={value}")))
        };
        if !first {
            return;
        }
        self.metrics.invalid_annotations.inc();
        tracing::warn!(workload = %key, %annotation, %value, "invalid annotation");
        self.publish(key, uid, EventType::Warning, "InvalidAnnotation", note)
            .await;
    }

    async fn publish(
        &self,
        key: &WorkloadKey,
        uid: Option<&str>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let reference = ObjectReference {
            api_version: Some(key.kind.api_version().to_string()),
            kind: Some(key.kind.name().to_string()),
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            uid: uid.map(String::from),
            ..Default::default()
        };
        let event = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reload".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            self.metrics.error("event");
            tracing::debug!(error = %e, "could not record an Event");
        }
    }
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;

/// Why a reload owed the change of `r` waits: the rollout of `failed` failed for `reason`.
fn halted(r: &ResourceRef, failed: &WorkloadKey, reason: &str, more: &str) -> String {
    format!(
        "the change of {} '{}' is halted: the rollout of {} '{}' failed ({reason}); {more}",
        r.kind.kind_name(),
        r.name,
        failed.kind,
        failed.name
    )
}
