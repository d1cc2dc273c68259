//! What the index and the reload queue hold, and whether this replica leads, read at scrape time (no
//! gauge to keep in step).

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::index::Index;
use crate::metrics::process::{encode_gauges, encode_labelled_gauges};
use crate::reload::lease::Leadership;
use crate::reload::queue::{Deferred, Queue};

pub struct SizesCollector {
    pub index: Arc<Index>,
    pub queue: Arc<Queue>,
    pub leadership: Leadership,
}

impl std::fmt::Debug for SizesCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SizesCollector")
    }
}

impl Collector for SizesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.index.sizes();
        let depth = self.queue.depth() as i64;
        let in_flight = self.queue.in_flight() as i64;
        let awaiting_retry = self.queue.awaiting_retry() as i64;
        let series = [
            (
                "rekindle_index_resources",
                "Resources (hashes) in the index",
                s.resources as i64,
            ),
            (
                "rekindle_index_workloads",
                "Workloads in the index",
                s.workloads as i64,
            ),
            (
                "rekindle_index_key_digests",
                "Resources whose value digests the index keeps (read key by key by a used-keys workload)",
                s.key_digests as i64,
            ),
            (
                "rekindle_index_provisional_workloads",
                "Admission records awaiting the watch",
                s.provisional as i64,
            ),
            (
                "rekindle_queue_depth",
                "Workloads waiting to be reloaded",
                depth,
            ),
            (
                "reloader_workqueue_depth",
                "Workloads waiting to be reloaded",
                depth,
            ),
            (
                "rekindle_reloads_awaiting_retry",
                "Queued workloads whose reload failed every attempt and waits to be tried again",
                awaiting_retry,
            ),
            (
                "rekindle_reloads_in_flight",
                "Workloads being written by the reload writer",
                in_flight,
            ),
            (
                "rekindle_reloads_halted",
                "Workloads carrying a halt (rekindle.io/reload-halted): the reloads owed for its changes wait",
                self.index.halted().len() as i64,
            ),
            (
                "rekindle_leader",
                "1 while this replica is the one that writes",
                i64::from(self.leadership.is_leader()),
            ),
            (
                "rekindle_writer_stalled_seconds",
                "How long the leader's writer has taken and finished nothing while reloads are owed (/live fails past 600)",
                crate::reload::writer::stalled_for(&self.queue, &self.leadership).as_secs() as i64,
            ),
        ];
        encode_gauges(&mut encoder, series)?;
        let deferred =
            Deferred::ALL.map(|reason| (reason.label(), self.queue.deferred(reason) as i64));
        encode_labelled_gauges(
            &mut encoder,
            "rekindle_reloads_deferred",
            "Workloads owed a reload that waits, by reason (window, budget, canary, halt)",
            "reason",
            deferred,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::refs::ResourceRef;
    use crate::core::{ResourceKind, WorkloadKind};
    use crate::index::{ResourceEntry, ResourceKey, WorkloadKey};
    use crate::reload::queue::{Found, QueueConfig};
    use prometheus_client::registry::Registry;

    #[tokio::test]
    async fn sizes_are_read_at_scrape_time() {
        let index = Arc::new(Index::new());
        let queue = Arc::new(Queue::new(QueueConfig {
            debounce: std::time::Duration::from_secs(60),
            debounce_max: std::time::Duration::from_secs(60),
            min_interval: Default::default(),
        }));
        let mut registry = Registry::default();
        let (leading, leadership) = tokio::sync::watch::channel(None);
        registry.register_collector(Box::new(SizesCollector {
            index: index.clone(),
            queue: queue.clone(),
            leadership: Leadership::from_channel(leadership),
        }));
        let scrape = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        assert!(scrape().contains("rekindle_index_resources 0\n"));
        index.update_resource(
            &ResourceKey::new(ResourceKind::ConfigMap, "ns", "cfg"),
            ResourceEntry {
                hash: "h".into(),
                flags: Default::default(),
            },
            None,
        );
        let workload = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "web".into(),
        };
        let r = ResourceRef {
            kind: ResourceKind::ConfigMap,
            name: "cfg".into(),
        };
        // A lone trigger is due at once, so the writer can take it below.
        queue.push(
            workload,
            r,
            tokio::time::Instant::now(),
            true,
            Found::Event(Some(1)),
        );
        let has = |lines: &[&str]| {
            let text = scrape();
            for line in lines {
                assert!(text.contains(line), "{line:?} not in\n{text}");
            }
        };
        has(&[
            "rekindle_index_resources 1\n",
            "rekindle_index_workloads 0\n",
            "rekindle_queue_depth 1\n",
            "reloader_workqueue_depth 1\n",
            "rekindle_reloads_in_flight 0\n",
        ]);
        let (key, _) = queue.next().await;
        has(&["rekindle_queue_depth 0\n", "rekindle_reloads_in_flight 1\n"]);
        queue.done(&key, crate::reload::queue::Finished::Reloaded);
        has(&["rekindle_reloads_in_flight 0\n", "rekindle_leader 0\n"]);
        // Leadership as of the scrape, not of a poll.
        leading.send(Some(crate::reload::lease::forever())).unwrap();
        has(&["rekindle_leader 1\n"]);
    }
}
