//! The change log: when each resource last changed in a way that triggered reloads, kept for
//! [`RECENT_CHANGES_KEPT`]. It answers one question the markers cannot: did a workload that carries
//! no marker for a resource (created while the webhook was down, or before the change reached the
//! index) miss a change of it?

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::ResourceKey;

/// How long a handled change is remembered for workloads the watch has not seen yet. Longer than any
/// watch gap short of a re-list, after which the consistency pass takes over.
pub const RECENT_CHANGES_KEPT: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
pub(super) struct ChangeLog {
    /// The apiserver's time of the last write (Unix seconds) and when it was handled.
    last: HashMap<ResourceKey, (i64, Instant)>,
    /// Every record, oldest first, so expiry is cheap.
    order: VecDeque<(Instant, ResourceKey)>,
}

impl ChangeLog {
    /// Remembers a change of `key` written at `written_at`, handled at `now`.
    pub(super) fn record(&mut self, key: &ResourceKey, written_at: i64, now: Instant) {
        self.forget_before(now);
        self.last.insert(key.clone(), (written_at, now));
        self.order.push_back((now, key.clone()));
    }

    /// Whether `key` changed after `created_at` (Unix seconds). A change within the same second is
    /// taken as older, since the pods may already have it.
    pub(super) fn changed_after(&self, key: &ResourceKey, created_at: i64) -> bool {
        self.last
            .get(key)
            .is_some_and(|(written_at, _)| *written_at > created_at)
    }

    /// Drops the records older than [`RECENT_CHANGES_KEPT`] at `now`, oldest first; a resource changed
    /// again since keeps its newer record.
    pub(super) fn forget_before(&mut self, now: Instant) {
        while let Some((at, old)) = self.order.pop_front() {
            if now.duration_since(at) <= RECENT_CHANGES_KEPT {
                self.order.push_front((at, old));
                break;
            }
            if self.last.get(&old).is_some_and(|(_, t)| *t == at) {
                self.last.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ResourceKind;

    fn cm(name: &str) -> ResourceKey {
        ResourceKey::new(ResourceKind::ConfigMap, "ns", name)
    }

    #[test]
    fn keeps_the_latest_write_per_resource_until_it_expires() {
        let mut log = ChangeLog::default();
        let t0 = Instant::now();
        log.record(&cm("cfg"), 10, t0);
        log.record(&cm("cfg"), 20, t0 + Duration::from_secs(1));
        log.record(&cm("other"), 30, t0 + Duration::from_secs(2));
        assert_eq!(log.last.len(), 2);
        assert!(log.changed_after(&cm("cfg"), 19));
        assert!(!log.changed_after(&cm("cfg"), 20), "same second: older");
        assert!(!log.changed_after(&cm("quiet"), 0));
        // The first record of `cfg` expires, its newer one stays.
        log.forget_before(t0 + RECENT_CHANGES_KEPT + Duration::from_millis(500));
        assert_eq!(log.order.len(), 2);
        assert!(log.changed_after(&cm("cfg"), 19));
        // Past the window everything is forgotten.
        log.forget_before(t0 + RECENT_CHANGES_KEPT + Duration::from_secs(3));
        assert!(log.last.is_empty() && log.order.is_empty());
    }
}
