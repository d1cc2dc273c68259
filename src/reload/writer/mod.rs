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
//! [`super::error::WriteError`]). A write planned on the object read is a JSON patch guarded by the
//! markers it replaces (`core::patch::content_guard`), so another writer's labels or status moving
//! again cannot refuse the retry; where that guard cannot be built, by the resourceVersion.
//! CRD kinds (Rollouts, DeploymentConfigs) have no strategic merge, and a Deployment being paused changes
//! fields a merge cannot guard: those are read and get a JSON patch guarded so (a paused Deployment's
//! by the resourceVersion, a `test` op), re-read and retried on conflict (422 from a failed test, or
//! 409). Jobs and CronJobs
//! creating a Job are read too (the Job is made from the whole template). A change not brought by a
//! watch event newer than this leadership's start (found by comparing a marker with the index, or
//! delivered late) is confirmed by reading its ConfigMap or Secret first (`confirm.rs`). No LIST of
//! workloads is made for a reload;
//! a pod-restart walk lists the workload's own pods (by its selector) at each step.
//!
//! Here: the queue loop and `reconcile` (what a due workload owes, attempts, failures); `release.rs`
//! when an owed reload may be written (window, budget, canaries, halts); `write.rs` one attempt (plan
//! and guarded write); `confirm.rs` whether a change found by comparison may be written from the
//! index; `restarts.rs` one step of a pod-restart walk; `jobs.rs` Job creation and
//! re-creation; `halts.rs` writing and ending halts;
//! `events.rs` the Events posted.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use backon::Retryable;
use std::time::Duration;

use kube::api::DynamicObject;
use kube::runtime::events::{EventType, Recorder};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::WriteError;
use super::pause::{self, Resume};
use super::queue::{Finished, Pending, Queue, Upkeep};
use super::rollouts::Rollouts;
use crate::core::patch::MarkerChange;
use crate::core::plan::{Action, PlanConfig};
use crate::core::refs::ResourceRef;
use crate::core::release::HaltedChange;
use crate::core::window::Windows;
use crate::core::{ResourceKind, WorkloadKind};
use crate::index::{Index, WorkloadKey};
use crate::metrics::{ErrorKind, Metrics, ReasonLabels, Skip};
use crate::outbound::alert::Alerter;
use crate::reload::lease::Leadership;
use crate::reload::recreate::Records;
use crate::retry;
use crate::watch::SyncProgress;

mod confirm;
mod events;
mod halts;
mod jobs;
mod release;
mod restarts;
mod write;

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

/// Everything a writer is made of, given at once: nothing is set on a writer after it is built, so no
/// policy can be switched off by a line forgotten in the wiring.
pub struct WriterParts {
    pub client: Client,
    pub plan: PlanConfig,
    pub index: Arc<Index>,
    pub queue: Arc<Queue>,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// `--max-concurrent-reloads`: writes in flight at once.
    pub max_concurrent: usize,
    /// Only the leader writes.
    pub leadership: Leadership,
    /// Alerts after each reload (`ALERT_ON_RELOAD`).
    pub alerter: Option<Arc<Alerter>>,
    /// `--reload-window`: when reloads of workloads without their own window may start.
    pub default_window: Option<Windows>,
    /// `--max-rollouts-in-progress`, canaries' and halts' rollouts: the rollouts followed.
    pub rollouts: Arc<Rollouts>,
    /// The first sync's progress: the writer starts once every workload watch has listed. None: at once.
    pub sync: Option<tokio::sync::watch::Receiver<SyncProgress>>,
    /// Where Jobs being re-created are recorded (the replica's namespace); None: not recorded, and a
    /// crash between a Job's delete and its create loses it.
    pub recreates: Option<Records>,
}

pub struct Writer {
    client: Client,
    plan: PlanConfig,
    index: Arc<Index>,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    max_concurrent: usize,
    /// One permit per write in flight (`--max-concurrent-reloads`); never held while waiting to retry.
    slots: Arc<Semaphore>,
    leadership: Leadership,
    alerter: Option<Arc<Alerter>>,
    default_window: Option<Windows>,
    rollouts: Arc<Rollouts>,
    sync: Option<tokio::sync::watch::Receiver<SyncProgress>>,
    recreates: Option<Records>,
    /// (workload, annotation value) pairs already reported as invalid: one Warning Event each.
    warned: Mutex<HashSet<(WorkloadKey, String)>>,
    /// Pod-restart walks this process has started, and what their Events said.
    walks: Mutex<HashMap<WorkloadKey, restarts::Walk>>,
    /// When this replica's current leadership began (set by `run`).
    leading_since: Mutex<Option<tokio::time::Instant>>,
    /// Resources read lately to confirm the index's view of them (`confirm.rs`): what they were
    /// (`None`: gone), and when.
    confirmed: confirm::Confirmed,
    /// Per kind of resource, the resourceVersion after which a watch event is taken on trust
    /// (`confirm.rs`); read once per leadership. `None`: its versions are not numbers, and every
    /// change of that kind is confirmed.
    horizons: tokio::sync::Mutex<HashMap<ResourceKind, Option<u64>>>,
}

const FIELD_MANAGER: &str = "rekindle";

enum Outcome {
    /// Written; `accepted` is when the apiserver accepted the write (before its Event was posted).
    Reloaded {
        accepted: Instant,
    },
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
    pub fn new(parts: WriterParts) -> Self {
        let WriterParts {
            client,
            plan,
            index,
            queue,
            metrics,
            recorder,
            max_concurrent,
            leadership,
            alerter,
            default_window,
            rollouts,
            sync,
            recreates,
        } = parts;
        Self {
            client,
            plan,
            index,
            queue,
            metrics,
            recorder,
            max_concurrent,
            slots: Arc::new(Semaphore::new(max_concurrent)),
            leadership,
            alerter,
            default_window,
            rollouts,
            sync,
            recreates,
            warned: Mutex::default(),
            walks: Mutex::default(),
            leading_since: Mutex::default(),
            confirmed: Default::default(),
            horizons: Default::default(),
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
                *self.leading_since.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(tokio::time::Instant::now());
                self.forget_horizons().await;
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
        // After the reload, so that the pods are restarted into what it wrote.
        if upkeep.restart_pods {
            if let Some(after) = self.restart_pods(key).await {
                self.upkeep_again(key, after, Upkeep::RESTART_PODS);
            }
        }
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
        if key.kind == WorkloadKind::Pods {
            // Pods of an owner rekindle does not write: nothing is written, the walk is the reload.
            self.rollouts.walk_started(key);
            if let Some(after) = self.restart_pods(key).await {
                self.upkeep_again(key, after, Upkeep::RESTART_PODS);
            }
            return Finished::Settled;
        }
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
            Ok(Outcome::Reloaded { accepted }) => {
                self.count_reloaded(key, &pending, started, accepted);
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
        self.metrics.error(ErrorKind::ReloadAttempt);
        self.metrics
            .reload_attempt_failures
            .get_or_create(&ReasonLabels {
                reason: error.metric_label().into(),
            })
            .inc();
    }

    fn count_reloaded(
        &self,
        key: &WorkloadKey,
        pending: &Pending,
        started: Instant,
        accepted: Instant,
    ) {
        let seconds = started.elapsed().as_secs_f64();
        self.metrics
            .reload_done(&key.namespace, key.kind, true, seconds);
        // A reload that waited for its window would measure the window, not rekindle.
        let waited = pending.deferred.is_some();
        if let Some(first) = pending.causes.values().min().filter(|_| !waited) {
            self.metrics
                .reload_latency
                .observe(accepted.saturating_duration_since(*first).as_secs_f64());
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
            key.kind,
            false,
            started.elapsed().as_secs_f64(),
        );
        self.metrics.error(ErrorKind::Reload);
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
                self.metrics.error(ErrorKind::Resume);
                Some(UPKEEP_RETRY)
            }
        }
    }
}

#[cfg(test)]
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
