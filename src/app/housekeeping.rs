//! What runs beside the watches and the writer: the catch-up once every watch has synced (and on
//! becoming leader), the periodic consistency pass, expiry of the index's short-lived records, and
//! handing freed heap back to the OS.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::scope::ScopeFilter;
use crate::core::plan::{Event, PlanConfig};
use crate::index::Index;
use crate::metrics::Metrics;
use crate::reload::lease::Leadership;
use crate::reload::queue::Queue;
use crate::watch::ReadyTracker;

/// How long an admission record waits for the watch to confirm it.
const PROVISIONAL_TTL: Duration = Duration::from_secs(60);

/// How often memory freed since the last time is handed back to the OS.
const HEAP_TRIM_INTERVAL: Duration = Duration::from_secs(60);

pub struct Housekeeping {
    pub index: Arc<Index>,
    /// Where catch-ups queue stale workloads; `None` when nothing is reloaded (`--webhook-url`).
    pub catch_up: Option<Arc<Queue>>,
    pub metrics: Arc<Metrics>,
    pub scope: Arc<ScopeFilter>,
    pub plan: PlanConfig,
    pub ready: Arc<ReadyTracker>,
    pub leadership: Leadership,
    pub consistency_interval: Duration,
    /// Reloader's `--sync-after-restart` replay.
    pub replay_creates: bool,
}

impl Housekeeping {
    pub async fn run(self, shutdown: CancellationToken) {
        tokio::select! {
            _ = self.ready.all_synced.notified() => {}
            _ = shutdown.cancelled() => return,
        }
        tracing::info!(sizes = ?self.index.sizes(), "all watches synced; ready");
        self.metrics.ready.set(1);
        if self.replay_creates {
            self.replay();
        }
        let mut consistency =
            tokio::time::interval_at(tokio::time::Instant::now(), self.consistency_interval);
        let mut expiry = tokio::time::interval(Duration::from_secs(5));
        // Its first tick is immediate: the peak of the first sync is handed back at once.
        let mut trim = tokio::time::interval(HEAP_TRIM_INTERVAL);
        let mut leader_check = tokio::time::interval(Duration::from_millis(500));
        let mut was_leader = self.leadership.is_leader();
        loop {
            tokio::select! {
                _ = consistency.tick() => {
                    if self.leadership.is_leader() {
                        self.catch_up();
                    }
                }
                _ = leader_check.tick() => {
                    let leading = self.leadership.is_leader();
                    self.metrics.leader.set(i64::from(leading));
                    // A new leader catches up at once: failover loses nothing.
                    if leading && !was_leader {
                        self.catch_up();
                    }
                    was_leader = leading;
                }
                _ = trim.tick() => release_free_heap(),
                _ = expiry.tick() => self.expire(),
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Existing resources whose marker a workload lacks count as created.
    fn replay(&self) {
        let Some(queue) = &self.catch_up else { return };
        let now = tokio::time::Instant::now();
        for (key, r) in self.index.absent_markers() {
            if self.scope.namespace_in_scope(&key.namespace) {
                queue.push(key, r, Event::Create, now, false);
            }
        }
    }

    /// Re-queues every workload whose marker differs from the current hash.
    fn catch_up(&self) {
        let Some(queue) = &self.catch_up else { return };
        let stale = self.index.stale_markers();
        if !stale.is_empty() {
            tracing::info!(
                count = stale.len(),
                "markers differ from current hashes; reloading"
            );
        }
        let now = tokio::time::Instant::now();
        for (key, r) in stale {
            if self.scope.namespace_in_scope(&key.namespace)
                && !self.plan.policy.ignored_workload_types.contains(&key.kind)
            {
                queue.push(key, r, Event::Update, now, false);
            }
        }
    }

    /// Expires the index's short-lived records (the sizes are read at scrape time).
    fn expire(&self) {
        self.index.expire_provisional(PROVISIONAL_TTL);
        self.index.expire_recent_changes();
    }
}

/// Hands freed heap memory back to the OS. A list of tens of thousands of objects (the first sync, or a
/// re-list after a watch gap) peaks far above the steady state, and glibc keeps freed pages mapped, so
/// without this RSS would stay at the peak.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}
