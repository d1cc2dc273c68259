//! Prometheus metrics: Reloader's names and label values (dashboards and alerts keep working) plus
//! `rekindle_*` for what only rekindle has, the standard `process_*` series and client-go's
//! `rest_client_*`. Every family and its label values are listed in docs/reference.md.

pub mod exposition;
pub mod process;
pub mod rest;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::core::WorkloadKind;
use crate::watch::Watched;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SuccessLabels {
    pub success: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub success: String,
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub workload_kind: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub workload_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub event_type: String,
    pub resource_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub operation: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    pub resource: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
}

/// Reloader's `errors_total{type}` (the derive names the label `type`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadKindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcessedLabels {
    pub event_type: String,
    pub resource_type: String,
    pub result: String,
}

/// Registers each metric under its name and help text: the registrations read as a table.
macro_rules! register {
    ($registry:ident, $($name:literal, $help:literal => $metric:expr;)*) => {
        $($registry.register($name, $help, $metric.clone());)*
    };
}

/// A resource watch event, as `reloader_events_received_total{event_type}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEventType {
    Add,
    Update,
    Delete,
}

impl WatchEventType {
    pub fn label(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Update => "update",
            Self::Delete => "delete",
        }
    }
}

/// What became of a resource watch event (`reloader_events_processed_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processed {
    /// Labels, annotations or metadata only changed.
    NoDataChange,
    /// A create without `--reload-on-create`, a delete without `--reload-on-delete`.
    EventDisabled,
    Notified,
    Queued,
}

impl Processed {
    pub fn label(self) -> &'static str {
        match self {
            Self::NoDataChange => "no_data_change",
            Self::EventDisabled => "event_disabled",
            Self::Notified => "notified",
            Self::Queued => "queued",
        }
    }
}

/// Why a change or a workload was left alone (`reloader_skipped_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    NoDataChange,
    /// Out of scope or of an ignored kind.
    IgnoredOrNotSelected,
    /// Planned, and nothing to write.
    StrategyNotUpdated,
    /// Only keys the workload does not read changed (`used-keys`).
    UnusedKeys,
}

impl Skip {
    pub fn label(self) -> &'static str {
        match self {
            Self::NoDataChange => "no_data_change",
            Self::IgnoredOrNotSelected => "ignored_or_not_selected",
            Self::StrategyNotUpdated => "strategy_not_updated",
            Self::UnusedKeys => "unused_keys",
        }
    }
}

/// Why the writer read a workload instead of planning from the index
/// (`rekindle_workload_reads_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadReason {
    /// The kind is written from the live object: Jobs, CronJobs creating a Job, CRDs, pause periods.
    Kind,
    /// The index has no stored record of it (admission's record only, or none).
    NotIndexed,
    /// An attempt after a failed one plans from the object as it is now.
    Retry,
}

impl ReadReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::Kind => "kind",
            Self::NotIndexed => "not_indexed",
            Self::Retry => "retry",
        }
    }
}

/// The result of one eviction of a pod-restart walk (`rekindle_pod_evictions_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    Evicted,
    /// A PodDisruptionBudget allows no disruption now (429).
    DisruptionBudget,
    Error,
}

impl Eviction {
    pub const ALL: [Eviction; 3] = [Self::Evicted, Self::DisruptionBudget, Self::Error];

    pub fn label(self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::DisruptionBudget => "disruption_budget",
            Self::Error => "error",
        }
    }
}

/// A resource read to confirm the index's view of it before a change the writer may not take on
/// trust is written (`rekindle_resource_confirmations_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// The index is current: the marker is written.
    Current,
    /// The index is behind the apiserver: the change is left to the watch.
    Behind,
}

impl Confirmation {
    pub const ALL: [Confirmation; 2] = [Self::Current, Self::Behind];

    pub fn label(self) -> &'static str {
        match self {
            Self::Current => "current",
            Self::Behind => "behind",
        }
    }
}

/// What failed (`rekindle_errors_total{kind}` and `reloader_errors_total{type}`): one variant per
/// failure mode, so a new one is a compile-time choice, not a new series from a typo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// An admission request could not be answered as planned.
    Admission,
    /// An alert was not delivered after its tries.
    Alert,
    /// An alert was dropped: its queue was full.
    AlertDropped,
    /// A Kubernetes Event could not be recorded.
    Event,
    /// A halt could not be written or removed.
    Halt,
    /// A `--webhook-url` notification was not delivered after its tries.
    Notify,
    /// A `--webhook-url` notification was dropped: its queue was full.
    NotifyDropped,
    /// A step of a pod-restart walk could not read the workload or its pods, or an eviction failed.
    PodRestart,
    /// A Job re-create record could not be finished.
    Recreate,
    /// A Job re-create could not be recorded first.
    RecreateRecord,
    /// A reload failed after every attempt (it goes back to the queue).
    Reload,
    /// One attempt at a reload failed.
    ReloadAttempt,
    /// A Deployment's pause could not be ended.
    Resume,
    /// A ConfigMap or Secret read key by key could not be read for its value digests.
    ResourceRead,
    /// An attempt to take or renew the leader Lease failed or timed out.
    Lease,
    /// A changed webhook certificate pair could not be loaded; the old one is still served.
    TlsCert,
    /// A connection to the webhook closed before its TLS handshake completed, or timed out in it.
    WebhookHandshake,
    /// A connection to the webhook refused: over the connection bound, or not accepted.
    WebhookOverload,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 18] = [
        Self::Admission,
        Self::Alert,
        Self::AlertDropped,
        Self::Event,
        Self::Halt,
        Self::Notify,
        Self::NotifyDropped,
        Self::PodRestart,
        Self::Recreate,
        Self::RecreateRecord,
        Self::Reload,
        Self::ReloadAttempt,
        Self::Resume,
        Self::ResourceRead,
        Self::Lease,
        Self::TlsCert,
        Self::WebhookHandshake,
        Self::WebhookOverload,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Admission => "admission",
            Self::Alert => "alert",
            Self::AlertDropped => "alert_dropped",
            Self::Event => "event",
            Self::Halt => "halt",
            Self::Notify => "notify",
            Self::NotifyDropped => "notify_dropped",
            Self::PodRestart => "pod_restart",
            Self::Recreate => "recreate",
            Self::RecreateRecord => "recreate_record",
            Self::Reload => "reload",
            Self::ReloadAttempt => "reload_attempt",
            Self::Resume => "resume",
            Self::ResourceRead => "resource_read",
            Self::Lease => "lease",
            Self::TlsCert => "tls_cert",
            Self::WebhookHandshake => "webhook_handshake",
            Self::WebhookOverload => "webhook_overload",
        }
    }
}

pub struct Metrics {
    pub reload_executed: Family<SuccessLabels, Counter>,
    pub reload_executed_by_namespace: Family<NamespaceLabels, Counter>,
    pub count_by_namespace: bool,
    pub action: Family<ActionLabels, Counter>,
    pub action_latency: Family<KindLabels, Histogram>,
    pub skipped: Family<ReasonLabels, Counter>,
    pub events_received: Family<EventLabels, Counter>,
    pub admission_requests: Family<AdmissionLabels, Counter>,
    pub admission_duration: Histogram,
    pub reloads_coalesced: Counter,
    pub workload_reads: Family<ReasonLabels, Counter>,
    pub reload_attempt_failures: Family<ReasonLabels, Counter>,
    pub admission_lookups: Family<ResultLabels, Counter>,
    pub reload_latency: Histogram,
    pub watch_restarts: Family<WatchLabels, Counter>,
    pub watch_protobuf_fallbacks: Family<FallbackLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub invalid_annotations: Counter,
    pub rollouts_in_progress: Gauge,
    pub rollouts_failed: Family<ReasonLabels, Counter>,
    pub reload_halts: Counter,
    pub pod_evictions: Family<ResultLabels, Counter>,
    pub resource_confirmations: Family<ResultLabels, Counter>,
    pub pod_restarts_in_progress: Gauge,
    pub consistency_pass_duration: Histogram,
    pub ready: Gauge,
    pub tls_cert_not_after: Gauge,
    pub reconcile: Family<ResultLabels, Counter>,
    pub reconcile_duration: Family<ResultLabels, Histogram>,
    pub workqueue_adds: Counter,
    pub workqueue_latency: Histogram,
    pub errors_by_type: Family<TypeLabels, Counter>,
    pub retries: Counter,
    pub events_processed: Family<ProcessedLabels, Counter>,
    pub workloads_scanned: Family<WorkloadKindLabels, Counter>,
    pub workloads_matched: Family<WorkloadKindLabels, Counter>,
    pub rest_requests: Family<rest::RequestLabels, Counter>,
    pub rest_duration: Family<rest::DurationLabels, Histogram>,
}

impl Metrics {
    /// The metrics, registered in `registry` (with the process collector and build information).
    pub fn new(registry: &mut Registry, count_by_namespace: bool) -> Self {
        let m = Self::unregistered(count_by_namespace);
        m.register(registry);
        m
    }

    /// Every series at its start, with its buckets.
    fn unregistered(count_by_namespace: bool) -> Self {
        let latency_buckets = || Histogram::new(exponential_buckets(0.001, 2.0, 16));
        // Reloader's own buckets, so its dashboards' histogram_quantile reads the same.
        let action_buckets =
            || Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]);
        let reconcile_buckets = || {
            Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ])
        };
        // client-go's rest_client_request_duration_seconds buckets.
        let rest_buckets = || {
            Histogram::new([
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ])
        };
        let m = Self {
            reload_executed: Family::default(),
            reload_executed_by_namespace: Family::default(),
            count_by_namespace,
            action: Family::default(),
            action_latency: Family::new_with_constructor(action_buckets),
            skipped: Family::default(),
            events_received: Family::default(),
            admission_requests: Family::default(),
            // Finer than the apiserver's own webhook buckets, so p99 under 1 ms is visible.
            admission_duration: Histogram::new([
                0.00005, 0.000075, 0.0001, 0.00015, 0.0002, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            reloads_coalesced: Counter::default(),
            workload_reads: Family::default(),
            reload_attempt_failures: Family::default(),
            admission_lookups: Family::default(),
            reload_latency: latency_buckets(),
            watch_restarts: Family::default(),
            watch_protobuf_fallbacks: Family::default(),
            errors: Family::default(),
            invalid_annotations: Counter::default(),
            rollouts_in_progress: Gauge::default(),
            rollouts_failed: Family::default(),
            reload_halts: Counter::default(),
            pod_evictions: Family::default(),
            resource_confirmations: Family::default(),
            pod_restarts_in_progress: Gauge::default(),
            consistency_pass_duration: Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            ready: Gauge::default(),
            tls_cert_not_after: Gauge::default(),
            reconcile: Family::default(),
            reconcile_duration: Family::new_with_constructor(reconcile_buckets),
            workqueue_adds: Counter::default(),
            workqueue_latency: Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            errors_by_type: Family::default(),
            retries: Counter::default(),
            events_processed: Family::default(),
            workloads_scanned: Family::default(),
            workloads_matched: Family::default(),
            rest_requests: Family::default(),
            rest_duration: Family::new_with_constructor(rest_buckets),
        };
        // Reloader starts both series at 0.
        for s in ["true", "false"] {
            let _ = m
                .reload_executed
                .get_or_create(&SuccessLabels { success: s.into() });
        }
        for result in Eviction::ALL {
            let _ = m.pod_evictions.get_or_create(&ResultLabels {
                result: result.label().into(),
            });
        }
        for result in Confirmation::ALL {
            let _ = m.resource_confirmations.get_or_create(&ResultLabels {
                result: result.label().into(),
            });
        }
        m
    }

    /// Each series under its name and help text.
    fn register(&self, registry: &mut Registry) {
        let m = self;
        // prometheus-client appends `_total` to counters itself.
        register! { registry,
            "reloader_reload_executed", "Reloads executed, by success" => m.reload_executed;
            "reloader_action", "Workload actions, by kind and result" => m.action;
            "reloader_action_latency_seconds", "Time to act on a workload" => m.action_latency;
            "reloader_skipped", "Skipped reloads, by reason" => m.skipped;
            "reloader_events_received", "Watch events received" => m.events_received;
            "rekindle_admission_requests", "Admission requests, by operation and result" => m.admission_requests;
            "rekindle_admission_duration_seconds", "Admission handling time" => m.admission_duration;
            "rekindle_reloads_coalesced", "Changes merged into an already queued reload" => m.reloads_coalesced;
            "rekindle_reload_latency_seconds", "From the watch event of a change to the accepted PATCH (reloads that waited for their window not counted)" => m.reload_latency;
            "rekindle_watch_restarts", "Watch streams restarted after an error" => m.watch_restarts;
            "rekindle_watch_protobuf_fallbacks", "Watches that went on in JSON after their protobuf watch ended, by reason (not_served: the apiserver refused protobuf; undecodable: an event could not be decoded)" => m.watch_protobuf_fallbacks;
            "rekindle_workload_reads", "Workloads read before a reload instead of planned from the index, by reason" => m.workload_reads;
            "rekindle_reload_attempt_failures", "Failed reload attempts by cause (conflict and transient are retried; forbidden, invalid and render are not)" => m.reload_attempt_failures;
            "rekindle_admission_lookups", "Resources the index missed at admission and that were read, by result" => m.admission_lookups;
            "rekindle_errors", "Failures, by kind" => m.errors;
            "rekindle_invalid_annotations", "Invalid annotations reported as Warning Events" => m.invalid_annotations;
            "rekindle_rollouts_in_progress", "Rollouts counted against --max-rollouts-in-progress (started by rekindle, or running when this replica began to lead)" => m.rollouts_in_progress;
            "rekindle_rollouts_failed", "Rollouts counted against --max-rollouts-in-progress that failed, by reason (progress_deadline, degraded, timeout)" => m.rollouts_failed;
            "rekindle_reload_halts", "Changes halted because a rollout rekindle started for them failed (rekindle.io/reload-halted written)" => m.reload_halts;
            "rekindle_pod_evictions", "Pod evictions of pod-restart walks, by result (evicted, disruption_budget: refused by a PodDisruptionBudget, error)" => m.pod_evictions;
            "rekindle_resource_confirmations", "ConfigMaps and Secrets read before a change not brought by a watch event newer than this leadership's start (the catch-up, a new workload, a late event) was written, by result (current: written; behind: this replica's watch had not caught up, the change left to it)" => m.resource_confirmations;
            "rekindle_pod_restarts_in_progress", "Workloads whose pods are being restarted by eviction (rekindle.io/restart: pods)" => m.pod_restarts_in_progress;
            "rekindle_consistency_pass_duration_seconds", "Time to compare every indexed workload's markers with the current hashes (the consistency pass, and the catch-up on becoming leader), on the leader" => m.consistency_pass_duration;
            "rekindle_ready", "1 when every watch has synced" => m.ready;
            "rekindle_tls_cert_not_after_timestamp_seconds", "Expiry of the webhook certificate being served" => m.tls_cert_not_after;
            "reloader_reconcile", "Resource changes handled (dependents looked up in the index and queued), by result" => m.reconcile;
            "reloader_reconcile_duration_seconds", "Time to handle one resource change, by result" => m.reconcile_duration;
            "reloader_workqueue_adds", "Changes pushed to the reload queue (coalesced ones included)" => m.workqueue_adds;
            "reloader_workqueue_latency_seconds", "Time a workload waited in the queue (debounce and cooldown included)" => m.workqueue_latency;
            "reloader_errors", "Failures, by type (the same values as rekindle_errors_total's kind)" => m.errors_by_type;
            "reloader_retries", "Reload attempts retried after a failure" => m.retries;
            "reloader_events_processed", "Resource watch events after handling, by type, resource and result" => m.events_processed;
            "reloader_workloads_scanned", "Index candidates examined for a change, by workload kind (Reloader: every workload listed)" => m.workloads_scanned;
            "reloader_workloads_matched", "Candidates queued for reload (or notified), by workload kind" => m.workloads_matched;
            "rest_client_requests", "Requests to the apiserver, by status code, host and method" => m.rest_requests;
            "rest_client_request_duration_seconds", "Request latency to response headers, by host and verb" => m.rest_duration;
        }
        if m.count_by_namespace {
            // A counter; `exposition` keeps Reloader's exact name (no second `_total`).
            registry.register(
                exposition::BY_NAMESPACE,
                "Reloads executed, by success and namespace",
                m.reload_executed_by_namespace.clone(),
            );
        }
        registry.register_collector(Box::new(process::ProcessCollector));
        registry.register(
            "rekindle_build",
            "Build information",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", env!("REKINDLE_GIT_COMMIT")),
            ]),
        );
    }

    pub fn workload_read(&self, reason: ReadReason) {
        self.workload_reads
            .get_or_create(&ReasonLabels {
                reason: reason.label().into(),
            })
            .inc();
    }

    pub fn confirmation(&self, result: Confirmation) {
        self.resource_confirmations
            .get_or_create(&ResultLabels {
                result: result.label().into(),
            })
            .inc();
    }

    pub fn eviction(&self, result: Eviction) {
        self.pod_evictions
            .get_or_create(&ResultLabels {
                result: result.label().into(),
            })
            .inc();
    }

    pub fn reload_done(&self, namespace: &str, kind: WorkloadKind, ok: bool, seconds: f64) {
        let success = if ok { "true" } else { "false" };
        self.reload_executed
            .get_or_create(&SuccessLabels {
                success: success.into(),
            })
            .inc();
        if self.count_by_namespace {
            self.reload_executed_by_namespace
                .get_or_create(&NamespaceLabels {
                    success: success.into(),
                    namespace: namespace.into(),
                })
                .inc();
        }
        let result = if ok { "success" } else { "error" };
        self.action
            .get_or_create(&ActionLabels {
                workload_kind: kind.name().into(),
                result: result.into(),
            })
            .inc();
        self.action_latency
            .get_or_create(&KindLabels {
                workload_kind: kind.name().into(),
            })
            .observe(seconds);
    }

    pub fn skip(&self, reason: Skip) {
        self.skipped
            .get_or_create(&ReasonLabels {
                reason: reason.label().into(),
            })
            .inc();
    }

    pub fn event(&self, event: WatchEventType, watched: Watched) {
        self.events_received
            .get_or_create(&EventLabels {
                event_type: event.label().into(),
                resource_type: watched.resource(),
            })
            .inc();
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&ErrorLabels {
                kind: kind.label().into(),
            })
            .inc();
        self.errors_by_type
            .get_or_create(&TypeLabels {
                r#type: kind.label().into(),
            })
            .inc();
    }

    /// How many failures of this kind were counted.
    #[cfg(test)]
    pub fn errors_of(&self, kind: ErrorKind) -> u64 {
        self.errors
            .get_or_create(&ErrorLabels {
                kind: kind.label().into(),
            })
            .get()
    }

    /// A resource watch event after handling.
    pub fn processed(&self, event: WatchEventType, watched: Watched, result: Processed) {
        self.events_processed
            .get_or_create(&ProcessedLabels {
                event_type: event.label().into(),
                resource_type: watched.resource(),
                result: result.label().into(),
            })
            .inc();
    }

    /// One change handled: its dependents looked up and queued (or notified) in `seconds`.
    pub fn reconciled(&self, seconds: f64) {
        let labels = ResultLabels {
            result: "success".into(),
        };
        self.reconcile.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(seconds);
    }

    pub fn scanned(&self, kind: WorkloadKind) {
        self.workloads_scanned
            .get_or_create(&WorkloadKindLabels {
                kind: kind.name().into(),
            })
            .inc();
    }

    pub fn matched(&self, kind: WorkloadKind) {
        self.workloads_matched
            .get_or_create(&WorkloadKindLabels {
                kind: kind.name().into(),
            })
            .inc();
    }

    /// The client layer recording `rest_client_*` against `host`.
    pub fn rest_layer(&self, host: String) -> rest::RestLayer {
        rest::RestLayer {
            requests: self.rest_requests.clone(),
            duration: self.rest_duration.clone(),
            host,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ResourceKind;

    /// The metrics reference's `rekindle_errors_total` row names every failure mode the code counts.
    #[test]
    fn the_reference_lists_every_error_kind() {
        let reference = include_str!("../../docs/reference.md");
        let row = reference
            .lines()
            .find(|l| l.starts_with("| `rekindle_errors_total` |"))
            .expect("docs/reference.md: the rekindle_errors_total row");
        for kind in ErrorKind::ALL {
            let label = format!("`{}`", kind.label());
            assert!(row.contains(&label), "the errors row lacks {label}");
        }
    }

    #[test]
    fn reloader_names_are_exact() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry, true);
        m.reload_done("ns", WorkloadKind::Deployment, true, 0.01);
        m.skip(Skip::NoDataChange);
        m.event(
            WatchEventType::Update,
            Watched::Resources(ResourceKind::ConfigMap),
        );
        m.error(ErrorKind::Reload);
        m.processed(
            WatchEventType::Update,
            Watched::Resources(ResourceKind::ConfigMap),
            Processed::Queued,
        );
        m.scanned(WorkloadKind::Deployment);
        m.reconciled(0.0001);
        let out = exposition::encode(&registry, exposition::Format::Classic).unwrap();
        for line in [
            "reloader_errors_total{type=\"reload\"} 1",
            "reloader_events_processed_total{event_type=\"update\",resource_type=\"configmaps\",result=\"queued\"} 1",
            "reloader_workloads_scanned_total{kind=\"Deployment\"} 1",
            "reloader_reconcile_total{result=\"success\"} 1",
            "reloader_reconcile_duration_seconds_bucket{result=\"success\",le=\"0.001\"} 1",
            "# TYPE reloader_reload_executed_total_by_namespace counter",
            "reloader_action_latency_seconds_bucket{workload_kind=\"Deployment\",le=\"0.01\"} 1",
            "reloader_action_latency_seconds_bucket{workload_kind=\"Deployment\",le=\"60\"} 1",
            "reloader_reload_executed_total{success=\"true\"} 1",
            "reloader_reload_executed_total{success=\"false\"} 0",
            "reloader_reload_executed_total_by_namespace{success=\"true\",namespace=\"ns\"} 1",
            "reloader_action_total{workload_kind=\"Deployment\",result=\"success\"} 1",
            "reloader_skipped_total{reason=\"no_data_change\"} 1",
            "reloader_events_received_total{event_type=\"update\",resource_type=\"configmaps\"} 1",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        assert!(out.contains("reloader_action_latency_seconds_bucket"));
    }
}
