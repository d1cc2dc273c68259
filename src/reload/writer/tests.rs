//! The writer against a mock apiserver (tower-test): each test scripts the apiserver's answers and
//! asserts the requests the writer sent, their order, methods, paths and bodies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{Writer, WriterParts};
use crate::config::scope::ScopeFilter;
use crate::config::Scope;
use crate::core::plan::PlanConfig;
use crate::core::refs::ResourceRef;
use crate::core::release::HaltedChange;
use crate::core::{ResourceKind, WorkloadKind};
use crate::index::{Index, ResourceEntry, ResourceKey, WorkloadEntry, WorkloadKey};
use crate::metrics::{Metrics, ReasonLabels};
use crate::mock_api::{serve, serve_slow_events, status, ApiServer, Seen};
use crate::reload::lease::Leadership;
use crate::reload::queue::{retry_delay, Deferred, Finished, Pending, Queue, QueueConfig};
use crate::reload::rollouts::Rollouts;

fn deployment(rv: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-web", "resourceVersion": rv,
            "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"template": {"metadata": {}, "spec": {"containers": [{"name": "app", "image": "i",
            "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}}
    })
}

fn job(uid: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "batch", "namespace": "ns", "uid": uid, "resourceVersion": "5",
            "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
            "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": uid}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "app", "image": "i",
            "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}}
    })
}

fn cronjob() -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "ns", "uid": "u-cj", "resourceVersion": "3",
            "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "app", "image": "i", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}}}}
    })
}

/// What the index keeps of a resource with hash `hash`.
fn indexed(hash: &str) -> ResourceEntry {
    ResourceEntry {
        hash: hash.into(),
        flags: Default::default(),
    }
}

/// An apiserver whose every GET answers `object` and every other request the written web.
fn reads_then_patches(object: Value) -> impl FnMut(&Seen) -> (u16, Value) + Send + 'static {
    move |seen| match seen.method {
        Method::GET => (200, object.clone()),
        _ => (200, deployment("8")),
    }
}

/// A Secret with one value, and its hash (Reloader's).
fn secret(name: &str, value: &str) -> (Value, String) {
    let typed = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "key".to_string(),
            k8s_openapi::ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    let hash = crate::core::keys::KeyDigests::of_secret(&typed)
        .of
        .to_string();
    let mut object = serde_json::to_value(&typed).unwrap();
    object["apiVersion"] = json!("v1");
    object["kind"] = json!("Secret");
    (object, hash)
}

/// A ConfigMap `cfg` with one value, and its hash (Reloader's).
fn configmap(value: &str) -> (Value, String) {
    let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "ns", "resourceVersion": "1"},
        "data": {"key": value}});
    let typed: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(object.clone()).unwrap();
    let hash = crate::core::keys::KeyDigests::of_configmap(&typed)
        .of
        .to_string();
    (object, hash)
}

/// The resourceVersion of ConfigMaps and Secrets when the fixture's writer began to lead.
const HORIZON: u64 = 10;

fn cfg() -> ResourceRef {
    ResourceRef {
        kind: ResourceKind::ConfigMap,
        name: "cfg".into(),
    }
}

struct Fixture {
    writer: Arc<Writer>,
    metrics: Arc<Metrics>,
    server: tokio::task::JoinHandle<ApiServer>,
}

/// A writer whose index knows `workload` (using ConfigMap `cfg`, hash "h1" → changed to "h2").
fn fixture(
    kind: WorkloadKind,
    name: &str,
    workload: &Value,
    answer: impl FnMut(&Seen) -> (u16, Value) + Send + 'static,
) -> (Fixture, WorkloadKey, Pending) {
    fixture_leading(kind, name, workload, Leadership::always(), answer)
}

/// As [`fixture`], with the writer leading as `leadership` says.
fn fixture_leading(
    kind: WorkloadKind,
    name: &str,
    workload: &Value,
    leadership: Leadership,
    answer: impl FnMut(&Seen) -> (u16, Value) + Send + 'static,
) -> (Fixture, WorkloadKey, Pending) {
    fixture_served(kind, name, workload, leadership, Duration::ZERO, answer)
}

/// As [`fixture_leading`], the mock apiserver answering each Event `event_delay` late.
fn fixture_served(
    kind: WorkloadKind,
    name: &str,
    workload: &Value,
    leadership: Leadership,
    event_delay: Duration,
    answer: impl FnMut(&Seen) -> (u16, Value) + Send + 'static,
) -> (Fixture, WorkloadKey, Pending) {
    let (client, handle) = crate::mock_api::client();
    let plan = PlanConfig::default();
    let index = Arc::new(Index::new());
    let key = WorkloadKey {
        kind,
        namespace: "ns".into(),
        name: name.into(),
    };
    index.apply_workload(
        key.clone(),
        WorkloadEntry::from_stored(&plan, workload, kind),
    );
    index.update_resource(
        &ResourceKey::new(ResourceKind::ConfigMap, "ns", "cfg"),
        ResourceEntry {
            hash: "h2".into(),
            flags: Default::default(),
        },
        None,
    );
    let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
    let queue = Arc::new(Queue::new(QueueConfig {
        debounce: Default::default(),
        debounce_max: Default::default(),
        min_interval: Default::default(),
    }));
    let reporter = Reporter {
        controller: "rekindle".into(),
        instance: None,
    };
    let writer = Arc::new(Writer::new(parts(
        client,
        plan,
        index,
        queue,
        metrics.clone(),
        reporter,
        leadership,
    )));
    // This replica began to lead at resourceVersion 10 of both kinds.
    writer.horizons.try_lock().unwrap().extend([
        (ResourceKind::ConfigMap, Some(HORIZON)),
        (ResourceKind::Secret, Some(HORIZON)),
    ]);
    let now = Instant::now();
    let pending = Pending {
        failures: 0,
        deferred: None,
        upkeep: Default::default(),
        first: now,
        due: now,
        causes: BTreeMap::from([(cfg(), now)]),
        // Brought by a watch event after this replica began to lead: written from the index
        // without reading the ConfigMap.
        events: BTreeMap::from([(cfg(), HORIZON + 1)]),
    };
    let server = tokio::spawn(serve_slow_events(handle, answer, event_delay));
    (
        Fixture {
            writer,
            metrics,
            server,
        },
        key,
        pending,
    )
}

impl Fixture {
    /// Drops the writer (closing the mock) and returns what the apiserver saw.
    async fn finish(self) -> ApiServer {
        drop(self.writer);
        self.server.await.unwrap()
    }
}

fn failures(metrics: &Metrics, reason: &str) -> u64 {
    metrics
        .reload_attempt_failures
        .get_or_create(&ReasonLabels {
            reason: reason.into(),
        })
        .get()
}

/// Each request as its method and the last segment of its path ("PATCH web", "GET configmaps").
fn short_summary(server: &ApiServer) -> Vec<String> {
    summary(server)
        .into_iter()
        .map(|(method, path)| format!("{method} {}", path.rsplit('/').next().unwrap()))
        .collect()
}

fn summary(server: &ApiServer) -> Vec<(String, String)> {
    server
        .requests
        .iter()
        .map(|s| (s.method.to_string(), s.path.clone()))
        .collect()
}

const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/ns/deployments/web";

#[tokio::test]
async fn a_deployment_gets_one_strategic_patch_and_no_read() {
    let (f, key, pending) = fixture(WorkloadKind::Deployment, "web", &deployment("7"), |_| {
        (200, deployment("8"))
    });
    assert!(f.writer.reload(&key, &pending).await);
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    assert_eq!(summary(&server), [("PATCH".into(), DEPLOYMENT.into())]);
    let patch = &server.requests[0];
    assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
    let env = &patch.body["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env["name"], "app");
    assert_eq!(
        patch.body.pointer("/metadata/resourceVersion"),
        Some(&json!("7")),
        "guarded by the version the index planned from"
    );
    assert_eq!(server.events.len(), 1, "one Reloaded Event");
    assert_eq!(server.events[0]["reason"], "Reloaded");
    assert_eq!(
        server.events[0]["regarding"]["uid"], "u-web",
        "the Event names the workload's uid, from the index entry"
    );
    assert_eq!(failures(&metrics, "transient"), 0);
}

/// `rekindle_reload_latency_seconds` ends at the accepted PATCH: the Event posted after it (here a
/// second late) is not part of it.
#[tokio::test(start_paused = true)]
async fn the_reload_latency_ends_at_the_accepted_patch_not_at_its_event() {
    let (f, key, pending) = fixture_served(
        WorkloadKind::Deployment,
        "web",
        &deployment("7"),
        Leadership::always(),
        Duration::from_secs(1),
        |_| (200, deployment("8")),
    );
    let started = Instant::now();
    assert!(f.writer.reload(&key, &pending).await);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the Event was waited for"
    );
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    assert_eq!(server.events.len(), 1);
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register(
        "rekindle_reload_latency_seconds",
        "",
        metrics.reload_latency.clone(),
    );
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry).unwrap();
    let sum: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("rekindle_reload_latency_seconds_sum "))
        .expect("the histogram's sum")
        .parse()
        .unwrap();
    assert!(
        sum < 0.5,
        "reload latency {sum} s includes the Event's second"
    );
}

/// A patch that lost to another write (the object moved since the index saw it, or the write was held
/// back by the network) or met a transient error is planned again from the object as it is now, and
/// written on that object's version.
#[tokio::test]
async fn a_conflict_or_transient_failure_is_retried_from_the_live_object() {
    for (code, reason, label) in [
        (409, "Conflict", "conflict"),
        (500, "InternalError", "transient"),
    ] {
        let mut n = 0;
        let (f, key, pending) = fixture(
            WorkloadKind::Deployment,
            "web",
            &deployment("7"),
            move |s| {
                n += 1;
                match (n, &s.method) {
                    (1, &Method::PATCH) => (code, status(code, reason, "try again")),
                    (_, &Method::GET) => (200, deployment("8")),
                    _ => (200, deployment("9")),
                }
            },
        );
        assert!(f.writer.reload(&key, &pending).await);
        let metrics = f.metrics.clone();
        let server = f.finish().await;
        assert_eq!(
            summary(&server),
            [
                ("PATCH".into(), DEPLOYMENT.into()),
                ("GET".into(), DEPLOYMENT.into()),
                ("PATCH".into(), DEPLOYMENT.into()),
            ],
            "{label}"
        );
        let versions: Vec<_> = [0, 2]
            .iter()
            .map(|&i| server.requests[i].body["metadata"]["resourceVersion"].clone())
            .collect();
        assert_eq!(versions, [json!("7"), json!("8")], "{label}");
        assert_eq!(failures(&metrics, label), 1);
        assert_eq!(metrics.retries.get(), 1, "{label}");
        assert_eq!(server.events.len(), 1, "{label}: reloaded once");
    }
}

/// A write that lost to another writer is retried on the object as read, guarded by the marker it
/// replaces rather than by the whole object's version: another writer moving labels or status again
/// between the read and the retry cannot refuse it, while a leader that wrote a newer marker still
/// would (the `test` of the entry).
/// A Deployment at resourceVersion `rv` whose container carries the marker of `cfg` at `hash`.
fn marked(rv: &str, hash: &str) -> Value {
    let mut d = deployment(rv);
    d["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "STAKATER_CFG_CONFIGMAP", "value": hash}]);
    d
}

#[tokio::test]
async fn a_retry_on_the_object_read_is_guarded_by_the_marker_it_replaces() {
    let (read, mut n) = (marked("8", "h1"), 0);
    let (f, key, pending) = fixture(
        WorkloadKind::Deployment,
        "web",
        &marked("7", "h1"),
        move |s| {
            n += 1;
            match (n, &s.method) {
                (1, &Method::PATCH) => {
                    (409, status(409, "Conflict", "the object has been modified"))
                }
                (_, &Method::GET) => (200, read.clone()),
                _ => (200, deployment("9")),
            }
        },
    );
    assert!(f.writer.reload(&key, &pending).await);
    let server = f.finish().await;
    assert_eq!(
        short_summary(&server),
        ["PATCH web", "GET web", "PATCH web"]
    );
    assert_eq!(
        server.requests[0].body["metadata"]["resourceVersion"],
        json!("7"),
        "the first write, planned from the index, is guarded by its version"
    );
    let retry = &server.requests[2];
    assert_eq!(retry.content_type, "application/json-patch+json");
    assert_eq!(
        retry.body,
        json!([
            {"op": "test", "path": "/spec/template/spec/containers/0/name", "value": "app"},
            {"op": "test", "path": "/spec/template/spec/containers/0/env/0",
                "value": {"name": "STAKATER_CFG_CONFIGMAP", "value": "h1"}},
            {"op": "replace", "path": "/spec/template/spec/containers/0/env/0/value", "value": "h2"},
        ]),
        "the retry tests the marker it replaces, not the resourceVersion"
    );
}

#[tokio::test]
async fn a_guarded_retry_refused_because_a_marker_moved_is_planned_again_on_a_new_read() {
    // The apiserver's answer when a JSON patch's `test` fails: a fixed message, no causes.
    let did_not_apply = status(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
    );
    let mut n = 0;
    let (f, key, pending) = fixture(
        WorkloadKind::Deployment,
        "web",
        &marked("7", "h1"),
        move |s| {
            n += 1;
            match (n, &s.method) {
                (1, &Method::PATCH) => (409, status(409, "Conflict", "modified")),
                (2, &Method::GET) => (200, marked("8", "h1")),
                (3, &Method::PATCH) => (422, did_not_apply.clone()),
                (_, &Method::GET) => (200, marked("9", "h0")),
                _ => (200, deployment("10")),
            }
        },
    );
    assert!(f.writer.reload(&key, &pending).await);
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    assert_eq!(
        short_summary(&server),
        ["PATCH web", "GET web", "PATCH web", "GET web", "PATCH web"]
    );
    assert_eq!(
        server.requests[4].body[1]["value"]["value"],
        json!("h0"),
        "the last try tests the marker as read again"
    );
    assert_eq!(failures(&metrics, "conflict"), 2);
    assert_eq!(failures(&metrics, "invalid"), 0);
}

#[tokio::test]
async fn forbidden_is_not_retried_and_reported_once() {
    let (f, key, pending) = fixture(WorkloadKind::Deployment, "web", &deployment("7"), |_| {
        (
            403,
            status(403, "Forbidden", "deployments.apps \"web\" is forbidden"),
        )
    });
    let finished = f.writer.reconcile(&key, pending.clone(), None).await;
    let Finished::RequeueAfter {
        pending: failed,
        after,
    } = finished
    else {
        panic!("{finished:?}")
    };
    assert_eq!((failed.failures, after), (1, retry_delay(1)));
    assert_eq!(
        failed.causes, pending.causes,
        "the changes go back to the queue"
    );
    assert_eq!(
        f.writer.slots.available_permits(),
        f.writer.max_concurrent,
        "no write permit kept"
    );
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    assert_eq!(summary(&server), [("PATCH".into(), DEPLOYMENT.into())]);
    assert_eq!(failures(&metrics, "forbidden"), 1);
    assert_eq!(metrics.retries.get(), 0);
    assert_eq!(server.events.len(), 1);
    assert_eq!(server.events[0]["reason"], "ReloadFail");
    assert_eq!(server.events[0]["type"], "Warning");
    let note = server.events[0]["note"].as_str().unwrap_or_default();
    assert!(note.ends_with("trying again in 30s"), "{note}");
}

#[tokio::test]
async fn an_invalid_patch_from_the_index_is_tried_once_from_the_live_object_then_given_up() {
    let (f, key, pending) = fixture(
        WorkloadKind::Deployment,
        "web",
        &deployment("7"),
        |s| match s.method {
            Method::GET => (200, deployment("8")),
            _ => (
                422,
                status(
                    422,
                    "Invalid",
                    "spec.template.spec.containers[0].image: Required value",
                ),
            ),
        },
    );
    assert!(!f.writer.reload(&key, &pending).await);
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    assert_eq!(
        summary(&server),
        [
            ("PATCH".into(), DEPLOYMENT.into()),
            ("GET".into(), DEPLOYMENT.into()),
            ("PATCH".into(), DEPLOYMENT.into()),
        ]
    );
    assert_eq!(failures(&metrics, "invalid"), 2);
}

#[tokio::test]
async fn a_job_is_deleted_on_its_uid_and_created_again_through_conflicts_refusals_and_transient_errors(
) {
    const JOB: &str = "/apis/batch/v1/namespaces/ns/jobs/batch";
    const JOBS: &str = "/apis/batch/v1/namespaces/ns/jobs";
    let mut creates = 0;
    let (f, key, pending) = fixture(WorkloadKind::Job, "batch", &job("u-old"), move |s| {
        match (&s.method, s.path.as_str()) {
            (&Method::POST, ACCESS_REVIEWS) => (201, access_review(true)),
            (&Method::GET, JOB) => (200, job("u-old")),
            (&Method::DELETE, JOB) => (200, job("u-old")),
            (&Method::POST, JOBS) => {
                creates += 1;
                match creates {
                    // The old Job is still being removed.
                    1 => (
                        409,
                        status(409, "AlreadyExists", "jobs.batch \"batch\" already exists"),
                    ),
                    // The apiserver restarting: the Job exists nowhere but here, so keep trying.
                    2 => (
                        500,
                        status(500, "InternalError", "etcdserver: leader changed"),
                    ),
                    // Its authorizer not synced yet after the restart.
                    3 => (
                        403,
                        status(
                            403,
                            "Forbidden",
                            "jobs.batch is forbidden: User cannot create",
                        ),
                    ),
                    _ => (201, job("u-new")),
                }
            }
            _ => (404, status(404, "NotFound", "unexpected")),
        }
    });
    assert!(f.writer.reload(&key, &pending).await);
    let server = f.finish().await;
    assert_eq!(
        summary(&server),
        [
            ("GET".into(), JOB.into()),
            ("POST".into(), ACCESS_REVIEWS.into()),
            ("DELETE".into(), JOB.into()),
            ("POST".into(), JOBS.into()),
            ("GET".into(), JOB.into()),
            ("POST".into(), JOBS.into()),
            ("POST".into(), JOBS.into()),
            ("POST".into(), JOBS.into()),
        ]
    );
    let asked = &server.requests[1].body["spec"]["resourceAttributes"];
    assert_eq!(
        (
            &asked["namespace"],
            &asked["verb"],
            &asked["group"],
            &asked["resource"]
        ),
        (
            &json!("ns"),
            &json!("create"),
            &json!("batch"),
            &json!("jobs")
        ),
        "asked before the delete whether the Job may be created again"
    );
    assert_eq!(
        server.requests[2].body["preconditions"]["uid"], "u-old",
        "the delete is conditional on the Job that was read"
    );
    let created = &server.requests[7].body;
    assert!(created["metadata"].get("uid").is_none());
    assert!(created["spec"].get("selector").is_none());
    let marked = created["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert!(marked.iter().any(|e| e["value"] == "h2"), "{marked:?}");
}

const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

fn access_review(allowed: bool) -> Value {
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {}, "status": {"allowed": allowed}})
}

#[tokio::test]
async fn a_job_that_may_not_be_created_again_is_not_deleted() {
    const JOB: &str = "/apis/batch/v1/namespaces/ns/jobs/batch";
    let (f, key, pending) = fixture(WorkloadKind::Job, "batch", &job("u-old"), |s| {
        match (&s.method, s.path.as_str()) {
            (&Method::POST, ACCESS_REVIEWS) => (201, access_review(false)),
            (&Method::GET, JOB) => (200, job("u-old")),
            _ => (500, status(500, "InternalError", "unexpected")),
        }
    });
    assert!(!f.writer.reload(&key, &pending).await);
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    assert_eq!(
        summary(&server),
        [
            ("GET".into(), JOB.into()),
            ("POST".into(), ACCESS_REVIEWS.into())
        ],
        "no delete"
    );
    assert_eq!(failures(&metrics, "forbidden"), 1);
    assert_eq!(server.events.len(), 1);
    assert_eq!(server.events[0]["reason"], "ReloadFail");
    let note = server.events[0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("may not create Jobs in ns"), "{note}");
}

#[tokio::test]
async fn a_cronjob_job_that_already_exists_is_not_created_twice() {
    const JOBS: &str = "/apis/batch/v1/namespaces/ns/jobs";
    const CRONJOB: &str = "/apis/batch/v1/namespaces/ns/cronjobs/nightly";
    let cronjob = cronjob();
    let answer = cronjob.clone();
    let (f, key, pending) = fixture(WorkloadKind::CronJob, "nightly", &cronjob, move |s| match s
        .method
    {
        Method::POST => (
            409,
            status(409, "AlreadyExists", "jobs.batch already exists"),
        ),
        _ => (200, answer.clone()),
    });
    // `job` is the default CronJob strategy (Reloader's).
    assert!(f.writer.reload(&key, &pending).await);
    let server = f.finish().await;
    let seen = summary(&server);
    assert_eq!(
        seen.iter().filter(|(m, _)| m == "POST").count(),
        1,
        "{seen:?}"
    );
    assert_eq!(
        seen.last().unwrap(),
        &("PATCH".into(), CRONJOB.into()),
        "{seen:?}"
    );
    assert!(seen.contains(&("POST".into(), JOBS.into())));
}

/// A replica whose lease runs out between the Job it creates for a CronJob and the CronJob's marker
/// patch stops there: the markers stay stale, and the next leader creates the same Job (its name is
/// derived from the hashes, so the create finds it) and writes them.
#[tokio::test]
async fn a_cronjob_reload_stops_between_its_writes_when_leadership_ends() {
    let cronjob = cronjob();
    let (lead, leading) = tokio::sync::watch::channel(Some(crate::reload::lease::forever()));
    let answer = cronjob.clone();
    let (f, key, pending) = fixture_leading(
        WorkloadKind::CronJob,
        "nightly",
        &cronjob,
        Leadership::from_channel(leading),
        move |s| match s.method {
            Method::POST => {
                // The lease runs out while the Job is being created.
                lead.send_replace(None);
                (
                    201,
                    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}}),
                )
            }
            _ => (200, answer.clone()),
        },
    );
    assert!(
        !f.writer.reload(&key, &pending).await,
        "not reported as written"
    );
    let server = f.finish().await;
    let seen = summary(&server);
    assert!(
        seen.iter().all(|(m, _)| m != "PATCH"),
        "no marker patch: {seen:?}"
    );
    assert!(server.events.is_empty(), "no Reloaded Event");
}

#[tokio::test]
async fn a_crd_kind_is_read_patched_on_its_version_and_retried_after_a_conflict() {
    const ROLLOUT: &str = "/apis/argoproj.io/v1alpha1/namespaces/ns/rollouts/web";
    let rollout = |rv: &str| {
        let mut r = deployment(rv);
        r["apiVersion"] = json!("argoproj.io/v1alpha1");
        r["kind"] = json!("Rollout");
        r
    };
    let mut patches = 0;
    let answer = rollout("7");
    let (f, key, pending) = fixture(WorkloadKind::Rollout, "web", &rollout("7"), move |s| {
        match s.method {
            Method::GET => (200, answer.clone()),
            _ => {
                patches += 1;
                if patches == 1 {
                    // Another writer moved the object between the read and the patch.
                    (409, status(409, "Conflict", "the object has been modified"))
                } else {
                    (200, answer.clone())
                }
            }
        }
    });
    assert!(f.writer.reload(&key, &pending).await);
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    assert_eq!(
        summary(&server),
        [
            ("GET".into(), ROLLOUT.into()),
            ("PATCH".into(), ROLLOUT.into()),
            ("GET".into(), ROLLOUT.into()),
            ("PATCH".into(), ROLLOUT.into()),
        ]
    );
    let patch = &server.requests[3];
    assert_eq!(patch.content_type, "application/json-patch+json");
    assert_eq!(
        patch.body[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"}),
        "the JSON patch is guarded by the version read"
    );
    assert_eq!(failures(&metrics, "conflict"), 1);
    assert_eq!(
        metrics
            .workload_reads
            .get_or_create(&ReasonLabels {
                reason: crate::metrics::ReadReason::Kind.label().into()
            })
            .get(),
        1
    );
}

/// A window `from..to` hours from now, in UTC, every day.
fn window_from_now(from_hours: i64, to_hours: i64) -> String {
    let at = |h: i64| {
        let t = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(h);
        t.strftime("%H:%M").to_string()
    };
    format!("* {}-{}", at(from_hours), at(to_hours))
}

fn deployment_with_window(window: &str) -> Value {
    let mut d = deployment("7");
    d["metadata"]["annotations"]["rekindle.io/reload-window"] = json!(window);
    d
}

/// Outside its window a reload is not written: it waits until the window opens, counted as deferred
/// with one ReloadDeferred Event however often it is looked at meanwhile.
#[tokio::test]
async fn a_reload_outside_the_window_waits_for_it_with_one_event() {
    let window = window_from_now(2, 3);
    let (f, key, pending) = fixture(
        WorkloadKind::Deployment,
        "web",
        &deployment_with_window(&window),
        |_| (200, deployment("8")),
    );
    let finished = f.writer.reconcile(&key, pending, None).await;
    let Finished::RequeueAfter { pending, after } = finished else {
        panic!("{finished:?}")
    };
    assert_eq!(pending.deferred, Some(Deferred::Window));
    assert_eq!(pending.failures, 0, "waiting is not failing");
    let two_hours = Duration::from_secs(7200);
    assert!(
        after <= two_hours && after > two_hours - Duration::from_secs(61),
        "due when the window opens, not {after:?}"
    );
    let again = f.writer.reconcile(&key, pending, None).await;
    assert!(matches!(again, Finished::RequeueAfter { .. }), "{again:?}");
    let server = f.finish().await;
    assert!(
        server.requests.is_empty(),
        "nothing written: {:?}",
        summary(&server)
    );
    assert_eq!(server.events.len(), 1, "{:?}", server.events);
    assert_eq!(server.events[0]["reason"], "ReloadDeferred");
    let note = server.events[0]["note"].as_str().unwrap_or_default();
    assert!(note.contains(&window), "{note}");
}

/// Inside its window a reload is written at once; an invalid window is reported and ignored, never
/// taken as a window that does not open.
#[tokio::test]
async fn inside_the_window_or_with_an_invalid_one_the_reload_is_written() {
    for (window, events) in [
        (window_from_now(-1, 1), vec!["Reloaded"]),
        (
            "Mon-Fri 9-17".to_string(),
            vec!["InvalidAnnotation", "Reloaded"],
        ),
    ] {
        let (f, key, pending) = fixture(
            WorkloadKind::Deployment,
            "web",
            &deployment_with_window(&window),
            |_| (200, deployment("8")),
        );
        assert!(f.writer.reload(&key, &pending).await, "{window}");
        let server = f.finish().await;
        assert_eq!(summary(&server), [("PATCH".into(), DEPLOYMENT.into())]);
        let reasons: Vec<&str> = server
            .events
            .iter()
            .filter_map(|e| e["reason"].as_str())
            .collect();
        assert_eq!(reasons, events, "{window}");
    }
}

/// A canary Deployment using `cfg`, with the marker `marker` (if any), `extra` annotations and a
/// rollout finished or not.
fn canary(marker: Option<&str>, extra: Value, finished: bool) -> Value {
    let mut c = deployment("7");
    c["metadata"]["name"] = json!("canary");
    c["metadata"]["uid"] = json!("u-canary");
    c["metadata"]["annotations"]["rekindle.io/reload-canary"] = json!("true");
    for (k, v) in extra.as_object().unwrap() {
        c["metadata"]["annotations"][k] = v.clone();
    }
    if let Some(m) = marker {
        c["spec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{"name": "STAKATER_CFG_CONFIGMAP", "value": m}]);
    }
    c["metadata"]["generation"] = json!(2);
    let reason = if finished {
        "NewReplicaSetAvailable"
    } else {
        "ReplicaSetUpdated"
    };
    c["status"] = json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
        "availableReplicas": 1, "conditions": [{"type": "Progressing", "reason": reason}]});
    c
}

#[tokio::test]
async fn workloads_wait_for_their_canary_and_for_a_halt_of_the_change() {
    let (f, key, pending) = fixture(WorkloadKind::Deployment, "web", &deployment("1"), |_| {
        (500, json!({}))
    });
    let canary_key = WorkloadKey {
        kind: WorkloadKind::Deployment,
        namespace: "ns".into(),
        name: "canary".into(),
    };
    let hold = |c: Value| {
        f.writer.index.apply_workload(
            canary_key.clone(),
            WorkloadEntry::from_stored(&f.writer.plan, &c, WorkloadKind::Deployment),
        );
        f.writer
            .release_hold(&key, &pending)
            .map(|(reason, _)| reason)
    };
    assert_eq!(hold(deployment("2")), None, "no canary: no hold");
    assert_eq!(
        hold(canary(Some("h1"), json!({}), true)),
        Some(Deferred::Canary),
        "the canary has not reloaded yet"
    );
    assert_eq!(
        hold(canary(Some("h2"), json!({}), false)),
        Some(Deferred::Canary),
        "its rollout has not finished"
    );
    assert_eq!(hold(canary(Some("h2"), json!({}), true)), None);
    // A canary that does not reload for this change (it uses the ConfigMap but asks for no reloads,
    // or excludes it) has nothing to go first with: it holds nothing.
    let mut unannotated = canary(Some("h1"), json!({}), true);
    let annotations = unannotated["metadata"]["annotations"]
        .as_object_mut()
        .unwrap();
    annotations.remove("reloader.stakater.com/auto");
    assert_eq!(hold(unannotated), None, "a canary that never reloads");
    let excluding = json!({"configmaps.exclude.reloader.stakater.com/reload": "cfg"});
    assert_eq!(
        hold(canary(Some("h1"), excluding, true)),
        None,
        "a canary excluding the change"
    );
    let halt = |hash: &str| {
        json!({"rekindle.io/reload-halted": json!({"reason": "progress_deadline",
            "changes": [{"kind": "ConfigMap", "name": "cfg", "hash": hash}]}).to_string()})
    };
    assert_eq!(
        hold(canary(Some("h2"), halt("h2"), false)),
        Some(Deferred::Halt)
    );
    assert_eq!(
        hold(canary(Some("h2"), halt("h1"), true)),
        None,
        "a halt of an older change holds nothing"
    );
    // The canary itself goes first.
    hold(canary(Some("h1"), json!({}), true));
    assert!(f.writer.release_hold(&canary_key, &pending).is_none());
    // A canary's rollout seen failing holds the change before its halt is written (the workload
    // stands as a plain Deployment in the index here, so that only the unwritten halt can hold).
    let rollouts = &f.writer.rollouts;
    let changed = vec![HaltedChange {
        kind: ResourceKind::ConfigMap,
        name: "cfg".into(),
        hash: "h2".into(),
    }];
    rollouts.written(
        &canary_key,
        &canary(Some("h2"), json!({}), false),
        changed,
        true,
    );
    let mut failing = canary(Some("h2"), json!({}), false);
    failing["status"]["conditions"][0]["reason"] = json!("ProgressDeadlineExceeded");
    crate::reload::rollouts::tests::observe(rollouts, &canary_key, &failing);
    assert_eq!(
        hold(deployment("8")),
        Some(Deferred::Halt),
        "not written yet"
    );
    rollouts.halt_written(&canary_key);
    assert_eq!(hold(deployment("9")), None);
}

/// The end of a pause is reconciled like a reload: resumed when the period read from the object is
/// over, else queued again for when it is, with nothing written.
#[tokio::test]
async fn a_pause_is_resumed_by_the_writer_when_its_period_is_over() {
    let keys = crate::core::policy::AnnotationKeys::default();
    let paused = |minutes_ago: i64| {
        let at = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(minutes_ago);
        let mut d = deployment("7");
        d["metadata"]["annotations"][keys.paused_at.as_str()] =
            json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        d["metadata"]["annotations"][keys.pause_period.as_str()] = json!("2m");
        d["spec"]["paused"] = json!(true);
        d
    };
    for (minutes_ago, written) in [(5, true), (0, false)] {
        let object = paused(minutes_ago);
        let answer = object.clone();
        let (f, key, mut pending) = fixture(WorkloadKind::Deployment, "web", &object, move |_| {
            (200, answer.clone())
        });
        pending.causes.clear();
        pending.upkeep.resume = true;
        let finished = f.writer.reconcile(&key, pending, None).await;
        assert!(matches!(finished, Finished::Settled), "{finished:?}");
        let queued_again = f.writer.queue.depth();
        let server = f.finish().await;
        let methods: Vec<String> = server
            .requests
            .iter()
            .map(|s| s.method.to_string())
            .collect();
        if written {
            assert_eq!(methods, ["GET", "PATCH"]);
            assert_eq!(queued_again, 0);
        } else {
            assert_eq!(
                methods,
                ["GET"],
                "nothing written before the period is over"
            );
            assert_eq!(queued_again, 1, "queued for when it is");
        }
    }
}

/// A halt is upkeep the writer reconciles: a failed canary's halt is written on it (Warning Event),
/// and removed once the workload is healthy again (Normal Event), each one merge PATCH.
#[tokio::test]
async fn the_writer_writes_a_failed_rollouts_halt_and_ends_it_when_healthy() {
    let failing = {
        let mut c = canary(Some("h2"), json!({}), false);
        c["metadata"]["name"] = json!("web");
        c["status"]["conditions"][0]["reason"] = json!("ProgressDeadlineExceeded");
        c
    };
    let answer = failing.clone();
    let (f, key, mut pending) = fixture(WorkloadKind::Deployment, "web", &failing, move |_| {
        (200, answer.clone())
    });
    let rollouts = &f.writer.rollouts;
    let changes = vec![HaltedChange {
        kind: ResourceKind::ConfigMap,
        name: "cfg".into(),
        hash: "h2".into(),
    }];
    rollouts.written(&key, &failing, changes, true);
    crate::reload::rollouts::tests::observe(rollouts, &key, &failing);
    assert_eq!(rollouts.take_failed().len(), 1);
    pending.causes.clear();
    pending.upkeep.halt = true;
    let finished = f.writer.reconcile(&key, pending.clone(), None).await;
    assert!(matches!(finished, Finished::Settled), "{finished:?}");
    assert!(rollouts.halt_owed(&key).is_none(), "written");
    // Healthy again, still carrying the halt (as the watch delivers it): the halt is over.
    let mut healthy = canary(Some("h2"), json!({}), true);
    healthy["metadata"]["name"] = json!("web");
    healthy["metadata"]["annotations"]["rekindle.io/reload-halted"] = json!(json!({
        "reason": "progress_deadline", "changes": [{"kind": "ConfigMap", "name": "cfg", "hash": "h2"}]
    }).to_string());
    f.writer.index.apply_workload(
        key.clone(),
        WorkloadEntry::from_stored(&f.writer.plan, &healthy, WorkloadKind::Deployment),
    );
    f.writer.reconcile(&key, pending, None).await;
    let server = f.finish().await;
    let patches: Vec<&Value> = server
        .requests
        .iter()
        .map(|s| &s.body["metadata"]["annotations"]["rekindle.io/reload-halted"])
        .collect();
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert!(patches[0]
        .as_str()
        .is_some_and(|v| v.contains("progress_deadline")));
    assert!(patches[1].is_null(), "removed");
    let reasons: Vec<&str> = server
        .events
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert_eq!(reasons, ["ReloadHalted", "ReloadResumed"]);
}

/// A halt is judged over only by a replica serving the workload, and only on evidence: the workload
/// healthy again, or the change's resource at another hash. A resource the index lacks (a kind not
/// watched, outside the label selector, deleted) proves nothing; another installation's halt in a
/// namespace this replica does not serve is that installation's.
#[tokio::test]
async fn a_halt_is_over_only_on_evidence_and_only_where_the_replica_serves() {
    let serving = |namespace: &str| {
        writer_serving(ScopeFilter::new(&Scope {
            namespaces: Some([namespace.to_string()].into()),
            ..Default::default()
        }))
    };
    let key = WorkloadKey {
        kind: WorkloadKind::Deployment,
        namespace: "ns".into(),
        name: "canary".into(),
    };
    let cfg = ResourceKey::new(ResourceKind::ConfigMap, "ns", "cfg");
    let halted = |healthy: bool| {
        let halt = json!({"reason": "progress_deadline",
            "changes": [{"kind": "ConfigMap", "name": "cfg", "hash": "h2"}]});
        let mut c = canary(
            Some("h2"),
            json!({"rekindle.io/reload-halted": halt.to_string()}),
            healthy,
        );
        if !healthy {
            c["status"]["conditions"][0]["reason"] = json!("ProgressDeadlineExceeded");
        }
        c
    };
    let over = |w: &Writer, object: &Value, hash: Option<&str>| {
        let entry = WorkloadEntry::from_stored(&w.plan, object, WorkloadKind::Deployment);
        w.index.apply_workload(key.clone(), entry);
        match hash {
            Some(h) => {
                w.index.update_resource(
                    &cfg,
                    ResourceEntry {
                        hash: h.into(),
                        flags: Default::default(),
                    },
                    None,
                );
            }
            None => {
                w.index.remove_resource(&cfg);
            }
        }
        let release = w.index.release_of(&key).unwrap();
        w.halt_over(&key, &release)
    };
    let here = serving("ns");
    assert_eq!(
        over(&here, &halted(false), Some("h2")),
        None,
        "still current"
    );
    assert_eq!(
        over(&here, &halted(false), Some("h3")),
        Some("the resource changed again")
    );
    assert_eq!(
        over(&here, &halted(false), None),
        None,
        "a resource it does not see"
    );
    assert_eq!(
        over(&here, &halted(true), Some("h2")),
        Some("its rollout is healthy again")
    );
    let elsewhere = serving("other");
    for (healthy, hash) in [(true, Some("h2")), (false, Some("h3")), (false, None)] {
        assert_eq!(
            over(&elsewhere, &halted(healthy), hash),
            None,
            "another installation's halt ({healthy}, {hash:?})"
        );
    }
}

/// A writer (no apiserver behind it) serving the workloads `scope` covers, its index empty.
fn writer_serving(scope: ScopeFilter) -> Writer {
    let (client, _) = crate::mock_api::client();
    let metrics = Arc::new(Metrics::new(&mut Default::default(), false));
    let reporter = Reporter {
        controller: "rekindle".into(),
        instance: None,
    };
    let queue = Arc::new(Queue::new(QueueConfig {
        debounce: Default::default(),
        debounce_max: Default::default(),
        min_interval: Default::default(),
    }));
    let index = Arc::new(Index::new());
    let plan = PlanConfig::default();
    let serving = Rollouts::new(0, Duration::ZERO, false, Arc::new(scope), metrics.clone());
    Writer::new(WriterParts {
        rollouts: serving,
        ..parts(
            client,
            plan,
            index,
            queue,
            metrics,
            reporter,
            Leadership::always(),
        )
    })
}

/// A writer's parts with one write at a time and no optional policy; `rollouts` follows nothing.
fn parts(
    client: kube::Client,
    plan: PlanConfig,
    index: Arc<Index>,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
    reporter: Reporter,
    leadership: Leadership,
) -> WriterParts {
    WriterParts {
        client: client.clone(),
        plan,
        index,
        queue,
        rollouts: Rollouts::new(0, Duration::ZERO, false, Arc::default(), metrics.clone()),
        metrics,
        recorder: Recorder::new(client, reporter),
        max_concurrent: 1,
        leadership,
        alerter: None,
        default_window: None,
        sync: None,
        recreates: None,
    }
}

/// A canary of a kind this replica ignores never reloads here: the others do not wait for it.
#[tokio::test]
async fn a_canary_the_replica_does_not_serve_holds_nothing() {
    for (ignored, holds) in [(vec![], true), (vec![WorkloadKind::Deployment], false)] {
        let w = writer_serving(ScopeFilter::new(&Scope::default()).ignoring_kinds(ignored));
        w.index.update_resource(
            &ResourceKey::new(ResourceKind::ConfigMap, "ns", "cfg"),
            ResourceEntry {
                hash: "h2".into(),
                flags: Default::default(),
            },
            None,
        );
        for (name, object) in [
            ("canary", canary(Some("h1"), json!({}), true)),
            ("web", deployment("1")),
        ] {
            let key = WorkloadKey {
                kind: WorkloadKind::Deployment,
                namespace: "ns".into(),
                name: name.into(),
            };
            let entry = WorkloadEntry::from_stored(&w.plan, &object, WorkloadKind::Deployment);
            w.index.apply_workload(key, entry);
        }
        let web = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "web".into(),
        };
        let pending = Pending {
            failures: 0,
            deferred: None,
            upkeep: Default::default(),
            first: Instant::now(),
            due: Instant::now(),
            causes: BTreeMap::from([(cfg(), Instant::now())]),
            events: BTreeMap::new(),
        };
        let hold = w.release_hold(&web, &pending).map(|(reason, _)| reason);
        assert_eq!(hold.is_some(), holds, "{hold:?}");
    }
}

/// Level-triggered: a workload queued by one change is planned for everything it owes, including a
/// reference whose marker is behind the resource's current hash though its change never queued it.
#[tokio::test]
async fn a_reload_also_writes_a_stale_marker_its_causes_did_not_name() {
    let mut workload = deployment("7");
    workload["spec"]["template"]["spec"]["containers"][0]["envFrom"] =
        json!([{"configMapRef": {"name": "cfg"}}, {"secretRef": {"name": "creds"}}]);
    workload["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "STAKATER_CREDS_SECRET", "value": "s1"}]);
    let (creds, creds_hash) = secret("creds", "s2");
    let (f, key, pending) = fixture(
        WorkloadKind::Deployment,
        "web",
        &workload,
        reads_then_patches(creds),
    );
    f.writer.index.update_resource(
        &ResourceKey::new(ResourceKind::Secret, "ns", "creds"),
        indexed(&creds_hash),
        None,
    );
    assert!(f.writer.reload(&key, &pending).await);
    let server = f.finish().await;
    assert_eq!(
        summary(&server),
        [
            ("GET".into(), "/api/v1/namespaces/ns/secrets/creds".into()),
            ("PATCH".into(), DEPLOYMENT.into())
        ],
        "the marker no event named is confirmed by a read first"
    );
    let env = server.requests[1].body["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    let value = |name: &str| {
        env.as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(value("STAKATER_CFG_CONFIGMAP"), Some(json!("h2")), "{env}");
    assert_eq!(
        value("STAKATER_CREDS_SECRET"),
        Some(json!(creds_hash)),
        "{env}"
    );
    assert_eq!(server.events.len(), 2, "one Reloaded Event per resource");
}

/// A record left in a records namespace shared with another installation: a Job outside this
/// replica's scope is left to that installation (not read, not created), one inside is finished.
#[tokio::test]
async fn records_of_jobs_outside_the_scope_are_left_alone() {
    use crate::reload::recreate::{Record, Records};
    let (client, handle) = crate::mock_api::client();
    let record = |namespace: &str| {
        Record {
            namespace: namespace.into(),
            name: "migrate".into(),
            old_uid: format!("uid-{namespace}"),
            job: json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "migrate", "namespace": namespace}}),
        }
        .to_configmap()
    };
    let list = json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {},
        "items": [record("theirs"), record("ours")]});
    let server = tokio::spawn(serve(handle, move |seen| match seen.method {
        Method::GET if seen.path.contains("/configmaps") => (200, list.clone()),
        // The Job is still there under its old uid: nothing to create, the record goes.
        Method::GET => (
            200,
            json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "migrate", "namespace": "ours", "uid": "uid-ours"}}),
        ),
        _ => (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        ),
    }));
    let writer = writer_serving(ScopeFilter::new(&Scope {
        namespaces: Some(["ours".to_string()].into()),
        ..Default::default()
    }));
    let writer = Writer {
        client: client.clone(),
        recreates: Some(Records::new(client, "rekindle-system")),
        ..writer
    };
    writer.finish_recreates().await;
    drop(writer);
    let seen = server.await.unwrap();
    let paths = summary(&seen);
    assert!(
        paths
            .iter()
            .all(|(_, p)| !p.contains("/namespaces/theirs/")),
        "{paths:?}"
    );
    assert!(
        paths
            .iter()
            .any(|(m, p)| m == "GET" && p.ends_with("/namespaces/ours/jobs/migrate")),
        "{paths:?}"
    );
}

/// A replica that takes the Lease while its ConfigMap watch lags (a partition just healed) finds a
/// marker that the last leader wrote from a newer ConfigMap than its index holds. It reads the
/// ConfigMap, sees that its index is behind, and writes nothing: rolling the workload back to the
/// older hash would roll it a second time when the watch catches up. The watch's event then finds
/// the marker current.
#[tokio::test]
async fn a_marker_newer_than_the_index_is_not_rolled_back() {
    let (older, older_hash) = configmap("v2");
    let (newer, newer_hash) = configmap("v3");
    assert_ne!(older_hash, newer_hash);
    let mut workload = deployment("7");
    workload["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "STAKATER_CFG_CONFIGMAP", "value": newer_hash}]);
    let (f, key, mut pending) = fixture(
        WorkloadKind::Deployment,
        "web",
        &workload,
        reads_then_patches(newer),
    );
    let cfg_key = ResourceKey::new(ResourceKind::ConfigMap, "ns", "cfg");
    f.writer
        .index
        .update_resource(&cfg_key, indexed(&older_hash), None);
    // Found by the catch-up: the marker differs from the index, no event named it.
    pending.events.clear();
    assert!(!f.writer.reload(&key, &pending).await, "nothing written");
    assert_eq!(
        f.metrics
            .resource_confirmations
            .get_or_create(&crate::metrics::ResultLabels {
                result: "behind".into()
            })
            .get(),
        1
    );

    // The watch catches up: its event finds the marker current, with no read.
    f.writer
        .index
        .update_resource(&cfg_key, indexed(&newer_hash), None);
    pending.events.insert(cfg(), HORIZON + 2);
    assert!(!f.writer.reload(&key, &pending).await, "nothing written");
    let server = f.finish().await;
    assert_eq!(
        summary(&server),
        [("GET".into(), "/api/v1/namespaces/ns/configmaps/cfg".into())],
        "one read, no write"
    );
    drop(older);
}

/// A writer that has just begun to lead, whose Deployments `web` and `api` use ConfigMap `cfg`
/// (indexed as it is: "v2"). A list of ConfigMaps answers `collection_version`; reads fail (500)
/// while `failing` is set.
async fn leading_with_two_users_of_cfg(
    collection_version: &str,
    failing: Arc<std::sync::atomic::AtomicBool>,
) -> (Fixture, WorkloadKey, WorkloadKey, Pending) {
    let (current, current_hash) = configmap("v2");
    let list = json!({"apiVersion": "v1", "kind": "ConfigMapList",
        "metadata": {"resourceVersion": collection_version}, "items": []});
    let (f, key, pending) = fixture(
        WorkloadKind::Deployment,
        "web",
        &deployment("7"),
        move |seen| match seen.method {
            Method::GET if failing.load(std::sync::atomic::Ordering::SeqCst) => {
                (500, status(500, "InternalError", "etcd is down"))
            }
            Method::GET if seen.path.ends_with("/configmaps") => (200, list.clone()),
            Method::GET => (200, current.clone()),
            _ => (200, deployment("8")),
        },
    );
    f.writer.forget_horizons().await;
    f.writer.index.update_resource(
        &ResourceKey::new(ResourceKind::ConfigMap, "ns", "cfg"),
        indexed(&current_hash),
        None,
    );
    let other = WorkloadKey {
        name: "api".into(),
        ..key.clone()
    };
    let mut api = deployment("7");
    api["metadata"]["name"] = json!("api");
    f.writer.index.apply_workload(
        other.clone(),
        WorkloadEntry::from_stored(&f.writer.plan, &api, WorkloadKind::Deployment),
    );
    (f, key, other, pending)
}

/// A change is taken on trust only if its watch event is newer than the resourceVersion of its
/// kind when this replica began to lead, read once (a LIST of one item) when first needed: an
/// older event (queued on a follower, or delivered late by a lagging watch) is confirmed by a read.
/// A confirmation serves the other workloads using the ConfigMap for a few seconds, then the
/// ConfigMap is read again; a read that fails fails the attempt (retried), and writes nothing.
#[tokio::test(start_paused = true)]
async fn only_events_newer_than_the_leaders_horizon_are_trusted() {
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (f, key, other, mut pending) = leading_with_two_users_of_cfg("20", failing.clone()).await;
    // An event older than the horizon.
    pending.events.insert(cfg(), 19);
    assert!(f.writer.reload(&key, &pending).await);
    assert!(f.writer.reload(&other, &pending).await, "confirmed lately");
    tokio::time::advance(Duration::from_secs(6)).await;
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        !f.writer.reload(&other, &pending).await,
        "read again, and failed"
    );
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    // Newer than the horizon: trusted, no read.
    pending.events.insert(cfg(), 21);
    assert!(f.writer.reload(&other, &pending).await);
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    let requests = short_summary(&server);
    assert_eq!(
        &requests[..4],
        ["GET configmaps", "GET cfg", "PATCH web", "PATCH api"],
        "{requests:?}"
    );
    assert!(
        server.requests[0].query.contains("limit=1"),
        "the horizon is a list of one item: {}",
        server.requests[0].query
    );
    assert_eq!(
        requests.iter().filter(|r| *r == "GET configmaps").count(),
        1,
        "the horizon is read once: {requests:?}"
    );
    assert!(
        requests.iter().filter(|r| *r == "GET cfg").count() >= 2,
        "read again once the confirmation expired: {requests:?}"
    );
    assert_eq!(
        requests.iter().filter(|r| r.starts_with("PATCH")).count(),
        3,
        "no write after the failed read: {requests:?}"
    );
    assert_eq!(requests.last().unwrap(), "PATCH api", "{requests:?}");
    assert!(metrics.errors_of(crate::metrics::ErrorKind::ResourceRead) >= 1);
}

/// An apiserver whose resourceVersions are not numbers gives no horizon: every change is confirmed by
/// a read, and the collection is listed once for the leadership, not again at each reload.
#[tokio::test(start_paused = true)]
async fn versions_that_are_not_numbers_confirm_every_change_listing_once() {
    let never = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (f, key, other, mut pending) = leading_with_two_users_of_cfg("opaque-20", never).await;
    pending.events.insert(cfg(), 21);
    assert!(f.writer.reload(&key, &pending).await);
    tokio::time::advance(Duration::from_secs(6)).await;
    pending.events.insert(cfg(), 22);
    assert!(f.writer.reload(&other, &pending).await);
    let metrics = f.metrics.clone();
    let server = f.finish().await;
    let requests = short_summary(&server);
    assert_eq!(
        requests,
        [
            "GET configmaps",
            "GET cfg",
            "PATCH web",
            "GET cfg",
            "PATCH api"
        ],
        "listed once, every change read"
    );
    assert_eq!(
        metrics.errors_of(crate::metrics::ErrorKind::ResourceRead),
        0
    );
}
