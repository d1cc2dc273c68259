//! The reload queue: one entry per workload, so changes that hit the same workload coalesce; a debounce
//! window (bounded by a maximum) and an optional per-workload cooldown decide when it is due.
//!
//! The debounce exists to turn changes of several resources of one workload (a ConfigMap and a Secret
//! applied together) into one rollout. A change that is the workload's only possible trigger (it uses
//! one resource and has no reload patterns) is due at once, unless the workload is being reloaded or
//! was reloaded within the window: then it waits the window like any other, so a burst of one
//! resource's changes still coalesces behind the first reload.
//!
//! Workloads waiting (not being reloaded) are kept in the order they are due, so taking the next one
//! costs the same with ten thousand queued as with one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::refs::ResourceRef;
use crate::index::WorkloadKey;

#[derive(Debug, Clone)]
pub struct Pending {
    pub first: Instant,
    pub due: Instant,
    /// The resources whose changes make the workload owed, each with when its first change still
    /// pending was seen (the latency metric). What changed is read from the index at planning time.
    pub causes: BTreeMap<ResourceRef, Instant>,
    /// Of the causes, those a watch event brought, with the newest resourceVersion it brought; the
    /// others were found by comparing a workload's marker with the index (see [`Found`]).
    pub events: BTreeMap<ResourceRef, u64>,
    /// Reloads of these changes that failed every attempt so far (each waits longer before the next).
    pub failures: u32,
    /// Why the reload waits though owed, once the writer has deferred it (its Event is posted once).
    pub deferred: Option<Deferred>,
    /// Work no change caused: the end of a pause, a halt to write or to end.
    pub upkeep: Upkeep,
}

impl Pending {
    /// A watch event brought `r` at `version`: the newest is kept.
    fn event_seen(&mut self, r: ResourceRef, version: u64) {
        let newest = self.events.entry(r).or_insert(version);
        *newest = (*newest).max(version);
    }
}

/// How a change came to be owed, which decides whether the writer may replace a marker with the
/// index's hash as it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A watch event of the resource, with its resourceVersion (as a number, when it is one): the
    /// index holds at least what it brought.
    Event(Option<u64>),
    /// The index's hash differed from a workload's marker (the catch-up, a new workload, a pod
    /// group, `--sync-after-restart`). Another replica may have written that marker from a newer
    /// view than this one's watch has caught up with, so the writer reads the resource first.
    Compared,
}

/// Work on a workload that no change caused, reconciled by the writer with its reloads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Upkeep {
    /// A pause rekindle set on the Deployment is to be ended once its period is over.
    pub resume: bool,
    /// Its failed rollout's halt is to be written, or its halt is over and to be removed.
    pub halt: bool,
    /// Its pods still running older config are to be evicted (`core::restart`), the next few.
    pub restart_pods: bool,
}

impl Upkeep {
    pub const RESUME: Upkeep = Upkeep {
        resume: true,
        halt: false,
        restart_pods: false,
    };
    pub const HALT: Upkeep = Upkeep {
        resume: false,
        halt: true,
        restart_pods: false,
    };
    pub const RESTART_PODS: Upkeep = Upkeep {
        resume: false,
        halt: false,
        restart_pods: true,
    };

    fn add(&mut self, other: Upkeep) {
        self.resume |= other.resume;
        self.halt |= other.halt;
        self.restart_pods |= other.restart_pods;
    }
}

/// Why an owed reload waits (`rekindle_reloads_deferred{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deferred {
    /// Outside the workload's reload window.
    Window,
    /// `--max-rollouts-in-progress` rollouts have not finished.
    Budget,
    /// A canary owed the same change has not finished its rollout healthy.
    Canary,
    /// The change is halted: a rollout rekindle started for it failed.
    Halt,
}

impl Deferred {
    pub const ALL: [Deferred; 4] = [
        Deferred::Window,
        Deferred::Budget,
        Deferred::Canary,
        Deferred::Halt,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Deferred::Window => "window",
            Deferred::Budget => "budget",
            Deferred::Canary => "canary",
            Deferred::Halt => "halt",
        }
    }
}

/// How the writer finished a workload it took.
#[derive(Debug)]
pub enum Finished {
    /// Written.
    Reloaded,
    /// Nothing to write, the object gone, or left to the next leader.
    Settled,
    /// Still owed, but not now: `pending` is due again after `after` (a failed reload waits
    /// [`retry_delay`]). A change that arrives meanwhile is not held back by it.
    RequeueAfter { pending: Pending, after: Duration },
}

impl Finished {
    /// Every attempt failed: counted, and tried again after [`retry_delay`].
    pub fn failed(mut pending: Pending) -> Self {
        pending.failures += 1;
        let after = retry_delay(pending.failures);
        Finished::RequeueAfter { pending, after }
    }

    /// When the workload is due again, if it is still owed.
    pub fn requeue_after(&self) -> Option<Duration> {
        match self {
            Finished::RequeueAfter { after, .. } => Some(*after),
            Finished::Reloaded | Finished::Settled => None,
        }
    }
}

/// How long changes whose reload failed `failures` times in a row wait before the next try: 30 s,
/// doubling, at most 10 minutes (the consistency pass's default period).
pub fn retry_delay(failures: u32) -> Duration {
    let first = Duration::from_secs(30);
    first
        .saturating_mul(1 << failures.saturating_sub(1).min(5))
        .min(Duration::from_secs(600))
}

#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    pub debounce: Duration,
    pub debounce_max: Duration,
    pub min_interval: Duration,
}

struct State {
    pending: HashMap<WorkloadKey, Pending>,
    /// The pending workloads not taken by the writer, by when they are due.
    waiting: BTreeSet<(Instant, WorkloadKey)>,
    /// Taken by the writer, with when.
    in_flight: HashMap<WorkloadKey, Instant>,
    last_reload: HashMap<WorkloadKey, Instant>,
    /// The last time the writer took or finished a workload.
    last_progress: Instant,
}

impl State {
    /// Sets when a pending workload is due, keeping `waiting` in step; one being reloaded waits
    /// there only once the writer is done with it.
    fn set_due(&mut self, key: &WorkloadKey, due: Instant) {
        let Some(pending) = self.pending.get_mut(key) else {
            return;
        };
        let old = std::mem::replace(&mut pending.due, due);
        if !self.in_flight.contains_key(key) {
            self.waiting.remove(&(old, key.clone()));
            self.waiting.insert((due, key.clone()));
        }
    }
}

impl Default for State {
    fn default() -> Self {
        Self {
            pending: HashMap::new(),
            waiting: BTreeSet::new(),
            in_flight: HashMap::new(),
            last_reload: HashMap::new(),
            last_progress: Instant::now(),
        }
    }
}

pub struct Queue {
    cfg: QueueConfig,
    state: Mutex<State>,
    notify: Notify,
    /// `reloader_workqueue_adds_total`: every push, coalesced ones included.
    adds: Counter,
}

/// Whether a push made a new entry or merged into a queued one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    New,
    Coalesced,
}

impl Queue {
    pub fn new(cfg: QueueConfig) -> Self {
        Self {
            cfg,
            state: Mutex::default(),
            notify: Notify::new(),
            adds: Counter::default(),
        }
    }

    /// Counts every push on `adds`.
    pub fn counting_adds(mut self, adds: Counter) -> Self {
        self.adds = adds;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn push(
        &self,
        key: WorkloadKey,
        resource: ResourceRef,
        observed: Instant,
        lone: bool,
        found: Found,
    ) -> Pushed {
        self.adds.inc();
        let now = Instant::now();
        let mut state = self.lock();
        let busy = state.in_flight.contains_key(&key)
            || state
                .last_reload
                .get(&key)
                .is_some_and(|t| now < *t + self.cfg.debounce);
        let cooldown_end = state
            .last_reload
            .get(&key)
            .map(|t| *t + self.cfg.min_interval);
        let pushed = if state.pending.contains_key(&key) {
            Pushed::Coalesced
        } else {
            Pushed::New
        };
        let entry = state.pending.entry(key.clone()).or_insert_with(|| Pending {
            first: now,
            due: now,
            causes: BTreeMap::new(),
            events: BTreeMap::new(),
            failures: 0,
            deferred: None,
            upkeep: Upkeep::default(),
        });
        if let Found::Event(Some(version)) = found {
            entry.event_seen(resource.clone(), version);
        }
        entry.causes.entry(resource).or_insert(observed);
        let mut due = if lone && pushed == Pushed::New && !busy {
            now
        } else {
            (now + self.cfg.debounce).min(entry.first + self.cfg.debounce_max)
        };
        if let Some(end) = cooldown_end.filter(|_| !self.cfg.min_interval.is_zero()) {
            due = due.max(end);
        }
        state.set_due(&key, due);
        drop(state);
        self.notify.notify_one();
        pushed
    }

    /// Schedules `upkeep` on `key`, due at `due` (for the end of a pause, when its period is over:
    /// the writer reads the object then, and asks again if the period was extended). An entry
    /// already queued keeps whichever is sooner. Not counted as an add: no change is behind it.
    pub fn push_upkeep(&self, key: WorkloadKey, due: Instant, upkeep: Upkeep) {
        let mut state = self.lock();
        let entry = state.pending.entry(key.clone()).or_insert_with(|| Pending {
            // Owed from when it is due: the workqueue latency does not measure the pause period.
            first: due,
            due,
            causes: BTreeMap::new(),
            events: BTreeMap::new(),
            failures: 0,
            deferred: None,
            upkeep: Upkeep::default(),
        });
        entry.upkeep.add(upkeep);
        let due = due.min(entry.due);
        state.set_due(&key, due);
        drop(state);
        self.notify.notify_one();
    }

    pub fn depth(&self) -> usize {
        self.lock().pending.len()
    }

    /// Queued workloads whose changes failed to reload and wait to be tried again.
    pub fn awaiting_retry(&self) -> usize {
        self.lock()
            .pending
            .values()
            .filter(|p| p.failures > 0)
            .count()
    }

    /// Queued workloads the writer deferred for `reason`.
    pub fn deferred(&self, reason: Deferred) -> usize {
        self.lock()
            .pending
            .values()
            .filter(|p| p.deferred == Some(reason))
            .count()
    }

    /// Queued workloads deferred for `reason` whose changes arrived before `than` (arrival, then key:
    /// the order in which deferred workloads go).
    pub fn deferred_before(&self, reason: Deferred, than: (Instant, &WorkloadKey)) -> usize {
        self.lock()
            .pending
            .iter()
            .filter(|(k, p)| p.deferred == Some(reason) && (p.first, *k) < than)
            .count()
    }

    /// Makes the `n` workloads deferred for `reason` whose changes arrived first due now.
    pub fn wake_deferred(&self, reason: Deferred, n: usize) {
        let mut state = self.lock();
        let mut deferred: Vec<(Instant, WorkloadKey)> = state
            .pending
            .iter()
            .filter(|(k, p)| p.deferred == Some(reason) && !state.in_flight.contains_key(*k))
            .map(|(k, p)| (p.first, k.clone()))
            .collect();
        deferred.sort_unstable();
        let now = Instant::now();
        let mut woke = false;
        for (_, key) in deferred.into_iter().take(n) {
            if state.pending.get(&key).is_some_and(|p| p.due > now) {
                state.set_due(&key, now);
                woke = true;
            }
        }
        drop(state);
        if woke {
            self.notify.notify_one();
        }
    }

    /// Workloads taken by the writer and not finished yet.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }

    /// The writer starts taking work (it became the leader): what waited meanwhile is not a stall.
    pub fn writer_resumed(&self) {
        self.lock().last_progress = Instant::now();
    }

    /// How long work has been owed (a due workload not taken, or a taken one not finished) while the
    /// writer took and finished nothing; zero while it keeps up. A slow apiserver is not a stall: every
    /// finished workload, failed ones included, is progress.
    pub fn stalled_for(&self) -> Duration {
        let state = self.lock();
        let now = Instant::now();
        let due = state
            .pending
            .values()
            .map(|p| p.due)
            .filter(|due| *due <= now);
        let owed_since = due.chain(state.in_flight.values().copied()).min();
        match owed_since {
            Some(since) => now.duration_since(since.max(state.last_progress)),
            None => Duration::ZERO,
        }
    }

    /// Waits for the next due workload that is not already being reloaded and takes it.
    pub async fn next(&self) -> (WorkloadKey, Pending) {
        loop {
            let notified = self.notify.notified();
            let wait = {
                let mut state = self.lock();
                let now = Instant::now();
                match state.waiting.first().cloned() {
                    Some((due, key)) if due <= now => {
                        state.waiting.pop_first();
                        let pending = state
                            .pending
                            .remove(&key)
                            .expect("a waiting workload is pending");
                        state.in_flight.insert(key.clone(), now);
                        state.last_progress = now;
                        return (key, pending);
                    }
                    Some((due, _)) => Some(due),
                    None => None,
                }
            };
            match wait {
                Some(due) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(due) => {}
                        _ = notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// The writer finished a workload. Failed changes are queued again behind [`retry_delay`]; if others
    /// arrived meanwhile, they ride along with those, when those are due.
    pub fn done(&self, key: &WorkloadKey, finished: Finished) {
        let mut state = self.lock();
        let now = Instant::now();
        state.in_flight.remove(key);
        state.last_progress = now;
        match finished {
            Finished::Reloaded => {
                state.last_reload.insert(key.clone(), now);
            }
            Finished::Settled => {}
            Finished::RequeueAfter {
                pending: back,
                after,
            } => {
                match state.pending.get_mut(key) {
                    // Changes arrived meanwhile: due as they are, carrying these along.
                    Some(entry) => {
                        entry.first = entry.first.min(back.first);
                        entry.failures = back.failures;
                        entry.deferred = entry.deferred.or(back.deferred);
                        entry.upkeep.add(back.upkeep);
                        for (r, observed) in back.causes {
                            let first_seen = entry.causes.entry(r).or_insert(observed);
                            *first_seen = (*first_seen).min(observed);
                        }
                        for (r, version) in back.events {
                            entry.event_seen(r, version);
                        }
                    }
                    None => {
                        state.pending.insert(
                            key.clone(),
                            Pending {
                                due: now + after,
                                ..back
                            },
                        );
                    }
                }
            }
        }
        if let Some(due) = state.pending.get(key).map(|p| p.due) {
            state.waiting.insert((due, key.clone()));
        }
        // A last reload matters for the busy check (the debounce window) and the cooldown, whichever is
        // longer; older ones are dropped so the map does not grow forever.
        if state.last_reload.len() > 10_000 {
            let horizon = self.cfg.min_interval.max(self.cfg.debounce);
            state.last_reload.retain(|_, t| t.elapsed() < horizon);
        }
        drop(state);
        self.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{ResourceKind, WorkloadKind};

    fn key(name: &str) -> WorkloadKey {
        WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn r(name: &str) -> ResourceRef {
        ResourceRef {
            kind: ResourceKind::ConfigMap,
            name: name.into(),
        }
    }

    /// A change of `resource` a watch event brought, queued for workload `workload`.
    fn push(q: &Queue, workload: &str, resource: &str, observed: Instant, lone: bool) -> Pushed {
        q.push(
            key(workload),
            r(resource),
            observed,
            lone,
            Found::Event(Some(1)),
        )
    }

    fn queue(debounce_ms: u64, max_ms: u64, min_ms: u64) -> Queue {
        Queue::new(QueueConfig {
            debounce: Duration::from_millis(debounce_ms),
            debounce_max: Duration::from_millis(max_ms),
            min_interval: Duration::from_millis(min_ms),
        })
    }

    /// A stall is owed work with nothing taken or finished: a due workload left waiting or a taken one
    /// never finished; not a workload in its debounce window, and not what waited while not leading.
    #[test]
    fn failed_reloads_wait_longer_each_time() {
        let delays: Vec<u64> = (1..=7).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [30, 60, 120, 240, 480, 600, 600]);
    }

    /// Changes whose reload failed come back after the retry delay, counted; a change that arrives
    /// meanwhile is not held back by them, and they ride along with it.
    /// The end of a pause is an entry due when the period is over; a change before then is due as
    /// usual and carries it along; scheduled while the writer holds the workload, it waits for it.
    #[tokio::test(start_paused = true)]
    async fn a_resume_is_due_when_scheduled_and_rides_with_changes() {
        let q = queue(0, 0, 0);
        let t0 = Instant::now();
        q.push_upkeep(key("a"), t0 + Duration::from_secs(60), Upkeep::RESUME);
        q.push_upkeep(key("a"), t0 + Duration::from_secs(90), Upkeep::RESUME);
        assert_eq!(q.depth(), 1);
        assert_eq!(q.stalled_for(), Duration::ZERO, "not owed before it is due");
        push(&q, "a", "cm", t0, true);
        let (_, pending) = q.next().await;
        assert_eq!(Instant::now(), t0, "the change is due at once");
        assert!(pending.upkeep.resume, "and carries the resume");
        // The writer finds the period not over and schedules it again while it holds the workload.
        q.push_upkeep(key("a"), t0 + Duration::from_secs(60), Upkeep::RESUME);
        assert_eq!(q.depth(), 1, "queued behind the run");
        q.done(&key("a"), Finished::Reloaded);
        let (_, pending) = q.next().await;
        assert_eq!(Instant::now(), t0 + Duration::from_secs(60));
        assert!(pending.upkeep.resume && pending.causes.is_empty());
    }

    /// A cause keeps the newest resourceVersion a watch event brought for it, through a failed
    /// reload that comes back; a cause found by comparison alone has none (the writer confirms it).
    #[tokio::test(start_paused = true)]
    async fn causes_keep_the_newest_version_their_events_brought() {
        let q = queue(0, 0, 0);
        let t = Instant::now();
        q.push(key("a"), r("one"), t, false, Found::Event(Some(7)));
        q.push(key("a"), r("one"), t, false, Found::Event(Some(5)));
        q.push(key("a"), r("two"), t, false, Found::Compared);
        q.push(key("a"), r("three"), t, false, Found::Event(None));
        let (k, pending) = q.next().await;
        assert_eq!(pending.causes.len(), 3);
        assert_eq!(pending.events, BTreeMap::from([(r("one"), 7)]));
        q.push(key("a"), r("one"), t, false, Found::Event(Some(9)));
        q.done(&k, Finished::failed(pending));
        let (_, pending) = q.next().await;
        assert_eq!(pending.events, BTreeMap::from([(r("one"), 9)]));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_changes_come_back_after_the_retry_delay() {
        let q = queue(0, 0, 0);
        push(&q, "a", "one", Instant::now(), true);
        let (k, pending) = q.next().await;
        q.done(&k, Finished::failed(pending));
        assert_eq!(q.depth(), 1, "kept");
        let taken = tokio::time::timeout(retry_delay(1) - Duration::from_secs(1), q.next()).await;
        assert!(taken.is_err(), "not before the retry delay");
        let (k, pending) = q.next().await;
        assert_eq!(pending.failures, 1);
        q.done(&k, Finished::failed(pending));

        // A new change while they wait: due at once, carrying the failed one.
        push(&q, "a", "two", Instant::now(), false);
        let (_, pending) = tokio::time::timeout(Duration::from_secs(1), q.next())
            .await
            .expect("due with the new change");
        assert_eq!(pending.failures, 2);
        assert_eq!(
            pending.causes.keys().cloned().collect::<Vec<_>>(),
            [r("one"), r("two")]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_is_owed_work_with_no_progress() {
        let q = queue(1_000, 5_000, 0);
        push(&q, "a", "cm", Instant::now(), false);
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(q.stalled_for(), Duration::ZERO, "not due yet");
        tokio::time::advance(Duration::from_secs(10)).await;
        // Owed from when it became due, 1 s after the push.
        assert_eq!(q.stalled_for(), Duration::from_millis(9_900));
        q.writer_resumed();
        assert_eq!(
            q.stalled_for(),
            Duration::ZERO,
            "a new leader starts afresh"
        );
        let (k, _) = q.next().await;
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(
            q.stalled_for(),
            Duration::from_secs(30),
            "a reload that never returns"
        );
        q.done(&k, Finished::Settled);
        assert_eq!(
            q.stalled_for(),
            Duration::ZERO,
            "a failed reload is progress too"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn changes_to_one_workload_coalesce() {
        let q = queue(250, 2000, 0);
        let t = Instant::now();
        assert_eq!(push(&q, "a", "one", t, false), Pushed::New);
        assert_eq!(push(&q, "a", "two", t, false), Pushed::Coalesced);
        assert_eq!(push(&q, "b", "one", t, false), Pushed::New);
        assert_eq!(q.adds.get(), 3, "every push counts, coalesced ones too");
        let (k, p) = q.next().await;
        assert!(
            Instant::now() >= t + Duration::from_millis(250),
            "debounced"
        );
        let second = q.next().await;
        let mut names = [k.name.clone(), second.0.name.clone()];
        names.sort();
        assert_eq!(names, ["a", "b"]);
        let a = if k.name == "a" { p } else { second.1 };
        assert_eq!(a.causes.len(), 2);
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_change_is_due_at_once_and_a_burst_behind_it_coalesces() {
        let q = queue(250, 2000, 0);
        let t0 = Instant::now();
        push(&q, "a", "one", t0, true);
        let (k, _) = q.next().await;
        assert_eq!(Instant::now(), t0, "no debounce for the only trigger");
        // While the first reload is in flight and just after it, changes wait the window.
        tokio::time::sleep(Duration::from_millis(20)).await;
        push(&q, "a", "one", Instant::now(), true);
        q.done(&k, Finished::Reloaded);
        tokio::time::sleep(Duration::from_millis(20)).await;
        push(&q, "a", "one", Instant::now(), true);
        let (_, p) = q.next().await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(40 + 250));
        assert_eq!(p.causes.len(), 1);
        // Once the window after a reload has passed, a lone change is immediate again.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let t1 = Instant::now();
        push(&q, "b", "one", t1, true);
        let _ = q.next().await;
        assert_eq!(Instant::now(), t1);
    }

    /// When the map of last reloads is pruned, a reload still inside the debounce window is kept: a
    /// change right after it waits the window, as it would without the pruning.
    #[tokio::test(start_paused = true)]
    async fn pruning_keeps_the_reloads_the_busy_check_needs() {
        let q = queue(250, 2000, 0);
        for i in 0..10_000 {
            q.lock()
                .last_reload
                .insert(key(&format!("other-{i}")), Instant::now());
        }
        push(&q, "a", "one", Instant::now(), true);
        let (k, _) = q.next().await;
        q.done(&k, Finished::Reloaded);
        assert!(q.lock().last_reload.len() <= 10_001);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t1 = Instant::now();
        push(&q, "a", "one", t1, true);
        let _ = q.next().await;
        assert_eq!(Instant::now() - t1, Duration::from_millis(250));
    }

    /// A deferred reload comes back when asked; a change meanwhile makes it due at once (to be judged
    /// again), still marked deferred, so its Event is not posted twice.
    #[tokio::test(start_paused = true)]
    async fn a_deferred_reload_keeps_its_mark_through_new_changes() {
        let q = queue(0, 0, 0);
        push(&q, "a", "one", Instant::now(), true);
        let (k, mut pending) = q.next().await;
        pending.deferred = Some(Deferred::Window);
        let after = Duration::from_secs(3600);
        q.done(&k, Finished::RequeueAfter { pending, after });
        assert_eq!(q.deferred(Deferred::Window), 1);
        push(&q, "a", "two", Instant::now(), false);
        let (_, pending) = tokio::time::timeout(Duration::from_secs(1), q.next())
            .await
            .expect("due with the new change");
        assert_eq!(pending.deferred, Some(Deferred::Window));
        assert_eq!(pending.failures, 0);
        assert_eq!(pending.causes.len(), 2);
    }

    /// A change that pushes a queued workload's due time back reorders it behind one due sooner.
    #[tokio::test(start_paused = true)]
    async fn workloads_are_taken_in_the_order_they_are_due() {
        let q = queue(250, 2000, 0);
        let t0 = Instant::now();
        push(&q, "a", "one", t0, false);
        tokio::time::sleep(Duration::from_millis(100)).await;
        push(&q, "b", "one", Instant::now(), false);
        tokio::time::sleep(Duration::from_millis(100)).await;
        push(&q, "a", "two", Instant::now(), false);
        let (first, _) = q.next().await;
        assert_eq!(first, key("b"));
        assert_eq!(Instant::now() - t0, Duration::from_millis(350));
        let (second, p) = q.next().await;
        assert_eq!(second, key("a"));
        assert_eq!(Instant::now() - t0, Duration::from_millis(450));
        assert_eq!(p.causes.len(), 2);
        assert_eq!(q.lock().waiting.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn changes_of_several_resources_200ms_apart_are_one_reload() {
        let q = queue(250, 2000, 0);
        let t0 = Instant::now();
        push(&q, "a", "cm", t0, false);
        tokio::time::sleep(Duration::from_millis(200)).await;
        push(&q, "a", "secret", Instant::now(), false);
        let (_, p) = q.next().await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(450));
        assert_eq!(p.causes.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn debounce_is_bounded_by_the_maximum() {
        let q = queue(250, 600, 0);
        let t0 = Instant::now();
        let q = std::sync::Arc::new(q);
        let pusher = {
            let q = q.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    push(&q, "a", "one", Instant::now(), false);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let _ = q.next().await;
        let waited = Instant::now() - t0;
        assert!(
            waited >= Duration::from_millis(600) && waited < Duration::from_millis(700),
            "{waited:?}"
        );
        pusher.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_workloads_wait_and_cooldown_delays() {
        let q = queue(0, 0, 1000);
        push(&q, "a", "one", Instant::now(), false);
        let (k, _) = q.next().await;
        push(&q, "a", "one", Instant::now(), false);
        // Still in flight: not handed out again until done.
        assert!(tokio::time::timeout(Duration::from_millis(50), q.next())
            .await
            .is_err());
        let t = Instant::now();
        q.done(&k, Finished::Reloaded);
        push(&q, "a", "two", Instant::now(), false);
        let (_, p) = q.next().await;
        assert!(
            Instant::now() - t >= Duration::from_millis(1000),
            "cooldown respected"
        );
        assert_eq!(
            p.causes.len(),
            2,
            "changes inside the cooldown merge into one reload"
        );
    }
}
