//! Leader election on a `coordination.k8s.io/v1` Lease (`--enable-ha`): every replica serves the
//! webhook and keeps its index warm; only the leader writes. Failover loses nothing: the new leader
//! runs the catch-up pass, which compares markers with current hashes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::{ErrorKind, Metrics};

/// `--leader-election-lease-name`'s default.
pub const DEFAULT_LEASE_NAME: &str = "rekindle-leader";

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Whether this replica may write: the instant its leadership ends unless renewed (the renew deadline of
/// its last successful renewal, on this replica's monotonic clock), or `None` while it follows. The time
/// is checked on every read, whether or not the election task has run since: a replica cut off from
/// the apiserver stops writing in time, before another can lead. Without HA it leads forever.
#[derive(Clone)]
pub struct Leadership(watch::Receiver<Option<Instant>>);

/// A deadline no process outlives: leadership without HA.
pub fn forever() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

impl Leadership {
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(Some(forever()));
        // Keep the sender alive for the life of the process.
        std::mem::forget(tx);
        Self(rx)
    }

    /// Leadership as a test sets it.
    #[cfg(test)]
    pub fn from_channel(rx: watch::Receiver<Option<Instant>>) -> Self {
        Self(rx)
    }

    /// The end of this replica's leadership, while it leads.
    fn leading_until(&self) -> Option<Instant> {
        (*self.0.borrow()).filter(|until| Instant::now() < *until)
    }

    pub fn is_leader(&self) -> bool {
        self.leading_until().is_some()
    }

    /// Waits until this replica leads.
    pub async fn acquired(&mut self) {
        while !self.is_leader() {
            if self.0.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Waits until this replica stops leading: the election says so, or the deadline passes first.
    pub async fn lost(&mut self) {
        while let Some(until) = self.leading_until() {
            tokio::select! {
                changed = self.0.changed() => if changed.is_err() { return std::future::pending().await },
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// A Lease record as last read, and when this replica saw it change (its own monotonic clock). Another
/// replica's lease is expired once it has not changed for its duration here; the timestamps written in it
/// come from other clocks and are never compared with this one (as client-go's leader election does).
struct Observed {
    record: (String, Option<MicroTime>, Option<i32>),
    at: Instant,
}

/// Runs the election until `shutdown`. Every attempt is bounded: a leader's by its renew deadline, a
/// follower's by one renew deadline. Leadership ends at `shutdown`; a replica that led then waits for
/// `writes_done` (its last write has returned) and deletes the Lease, so the next leader takes over at
/// once instead of after `--leader-election-lease-duration`. The task ends only after `shutdown`.
pub fn start(
    client: Client,
    cfg: LeaseConfig,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    writes_done: CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
        let mut observed = None;
        loop {
            let started = Instant::now();
            if tx.borrow().is_some_and(|until| started >= until) {
                tracing::warn!(
                    "could not renew the Lease within the renew deadline; stepping down"
                );
                tx.send_replace(None);
            }
            let until = *tx.borrow();
            // A leader's attempt may last until its deadline, a follower's one renew deadline.
            let bound = until.unwrap_or(started + cfg.renew_deadline);
            let attempt = try_acquire_or_renew(&api, &cfg, &mut observed);
            match tokio::time::timeout_at(bound, attempt).await {
                Ok(Ok(Attempt::Leads)) => {
                    if until.is_none() {
                        tracing::info!(identity = %cfg.identity, "became the leader");
                    }
                    tx.send_replace(Some(started + cfg.renew_deadline));
                }
                Ok(Ok(Attempt::Follows)) => {
                    if until.is_some() {
                        tracing::warn!("lost the Lease to another replica");
                        tx.send_replace(None);
                    }
                }
                // A leader keeps its deadline, not renewed: whoever wrote learns nothing here, and no
                // other replica can take the Lease before that deadline (see `Observed`).
                Ok(Ok(Attempt::Raced)) => tracing::debug!("the Lease changed while renewing it"),
                // Counted: a replica that can never write the Lease (its Role, its namespace) never
                // leads, and nothing else would say so.
                Ok(Err(e)) => {
                    metrics.error(ErrorKind::Lease);
                    match &e {
                        kube::Error::Api(s) if s.code == 403 || s.code == 404 => {
                            tracing::warn!(error = %e, lease = %cfg.name, namespace = %cfg.namespace, "cannot write the leader Lease");
                        }
                        _ => tracing::debug!(error = %e, "Lease update failed"),
                    }
                }
                Err(_) => {
                    metrics.error(ErrorKind::Lease);
                    tracing::debug!("Lease update timed out");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(cfg.retry_period) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        let leading = tx
            .send_replace(None)
            .is_some_and(|until| Instant::now() < until);
        if leading {
            writes_done.cancelled().await;
            release(&api, &cfg).await;
        }
    });
    (Leadership(rx), task)
}

/// The Lease's `leaseDurationSeconds` for a duration: whole seconds, rounded up.
fn lease_seconds(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX).max(1)
}

/// What one acquire-or-renew found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease, written just now.
    Leads,
    /// Another replica holds a Lease that has not expired.
    Follows,
    /// The Lease changed between the read and the write (another replica, or anyone else, wrote it).
    Raced,
}

async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Option<Observed>,
) -> Result<Attempt, kube::Error> {
    let secs = lease_seconds(cfg.lease_duration);
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": cfg.name},
            "spec": {"holderIdentity": cfg.identity, "leaseDurationSeconds": secs, "acquireTime": now(), "renewTime": now(), "leaseTransitions": 0}
        }))
        .map_err(kube::Error::SerdeError)?;
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Leads),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Raced),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let record = (
        holder.clone(),
        spec.renew_time.clone(),
        spec.lease_duration_seconds,
    );
    let seen = Instant::now();
    let since = match observed {
        Some(o) if o.record == record => o.at,
        _ => observed.insert(Observed { record, at: seen }).at,
    };
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(secs).max(1) as u64);
    let expired = seen >= since + duration;
    if holder != cfg.identity && !holder.is_empty() && !expired {
        return Ok(Attempt::Follows);
    }
    if holder != cfg.identity {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.acquire_time = Some(now());
    }
    spec.holder_identity = Some(cfg.identity.clone());
    spec.lease_duration_seconds = Some(secs);
    spec.renew_time = Some(now());
    // The resourceVersion makes this a compare-and-swap: two replicas cannot both win.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(Attempt::Leads),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Raced),
        Err(e) => Err(e),
    }
}

/// Deletes the Lease if this replica still holds it (conditional on the version read, so a Lease
/// another replica took over meanwhile stays). Deleting rather than clearing the holder means the last
/// leader out of an uninstalled release leaves nothing behind; the next leader creates a new one.
async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let Ok(Some(lease)) = api.get_opt(&cfg.name).await else {
        return;
    };
    let ours = lease
        .spec
        .as_ref()
        .is_some_and(|s| s.holder_identity.as_deref() == Some(&cfg.identity));
    if !ours {
        return;
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: lease.metadata.resource_version.clone(),
            uid: lease.metadata.uid.clone(),
        }),
        ..Default::default()
    };
    match api.delete(&cfg.name, &params).await {
        Ok(_) => tracing::info!(identity = %cfg.identity, "released the Lease"),
        Err(e) => tracing::debug!(error = %e, "could not delete the Lease on stepping down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock_api::{client, serve, status};
    use hyper::Method;
    use serde_json::Value;

    fn test_metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new(&mut Default::default(), false))
    }

    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/rekindle/leases/rekindle-leader";

    fn config() -> LeaseConfig {
        LeaseConfig {
            namespace: "rekindle".into(),
            name: DEFAULT_LEASE_NAME.into(),
            identity: "pod-a".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn lease(holder: &str, renewed_secs_ago: i64) -> Value {
        let renewed = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(renewed_secs_ago);
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": DEFAULT_LEASE_NAME, "namespace": "rekindle", "resourceVersion": "41",
                "uid": "lease-uid"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 3,
                "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}
        })
    }

    /// Runs one acquire-or-renew against an apiserver answering `answer`; the outcome and the requests.
    async fn acquire(
        answer: impl FnMut(&crate::mock_api::Seen) -> (u16, Value) + Send + 'static,
    ) -> (Result<Attempt, kube::Error>, crate::mock_api::ApiServer) {
        acquire_after(answer, &[]).await
    }

    /// One acquire-or-renew, then one more after each wait (on this replica's clock, paused in the
    /// test); the last outcome and every request.
    async fn acquire_after(
        answer: impl FnMut(&crate::mock_api::Seen) -> (u16, Value) + Send + 'static,
        waits: &[u64],
    ) -> (Result<Attempt, kube::Error>, crate::mock_api::ApiServer) {
        let (client, handle) = client();
        let server = tokio::spawn(serve(handle, answer));
        let api: Api<Lease> = Api::namespaced(client, "rekindle");
        let mut observed = None;
        let mut won = try_acquire_or_renew(&api, &config(), &mut observed).await;
        for wait in waits {
            assert!(
                !won.as_ref().is_ok_and(|w| *w == Attempt::Leads),
                "led before the last wait"
            );
            tokio::time::advance(Duration::from_secs(*wait)).await;
            won = try_acquire_or_renew(&api, &config(), &mut observed).await;
        }
        drop(api);
        (won, server.await.unwrap())
    }

    fn methods(server: &crate::mock_api::ApiServer) -> Vec<String> {
        server
            .requests
            .iter()
            .map(|s| s.method.to_string())
            .collect()
    }

    #[tokio::test]
    async fn no_lease_yet_creates_it_and_leads() {
        let (won, server) = acquire(|s| match s.method {
            Method::GET => (404, status(404, "NotFound", "not found")),
            _ => (201, s.body.clone()),
        })
        .await;
        assert_eq!(won.unwrap(), Attempt::Leads);
        assert_eq!(methods(&server), ["GET", "POST"]);
        assert_eq!(server.requests[1].body["spec"]["holderIdentity"], "pod-a");
    }

    #[tokio::test]
    async fn two_replicas_creating_at_once_one_loses() {
        let (won, _) = acquire(|s| match s.method {
            Method::GET => (404, status(404, "NotFound", "not found")),
            _ => (409, status(409, "AlreadyExists", "leases already exists")),
        })
        .await;
        assert_eq!(won.unwrap(), Attempt::Raced);
    }

    #[tokio::test]
    async fn a_live_lease_of_another_replica_is_left_alone() {
        let (won, server) = acquire(|_| (200, lease("pod-b", 3))).await;
        assert_eq!(won.unwrap(), Attempt::Follows);
        assert_eq!(
            methods(&server),
            ["GET"],
            "no write to a Lease another replica holds"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_unchanged_for_its_duration_on_this_clock_is_taken_over_by_compare_and_swap() {
        let held = lease("pod-b", 0);
        let (won, server) = acquire_after(
            move |s| match s.method {
                Method::GET => (200, held.clone()),
                _ => (200, s.body.clone()),
            },
            &[14, 2],
        )
        .await;
        assert_eq!(
            won.unwrap(),
            Attempt::Leads,
            "15 s without a change, as seen here"
        );
        assert_eq!(methods(&server), ["GET", "GET", "GET", "PUT"]);
        let put = &server.requests[3].body;
        assert_eq!(
            put["metadata"]["resourceVersion"], "41",
            "the swap is conditional on the read"
        );
        assert_eq!(put["spec"]["holderIdentity"], "pod-a");
        assert_eq!(put["spec"]["leaseTransitions"], 4);
    }

    #[tokio::test(start_paused = true)]
    async fn losing_the_swap_to_another_replica_is_not_leading() {
        let held = lease("pod-b", 60);
        let (won, server) = acquire_after(
            move |s| match s.method {
                Method::GET => (200, held.clone()),
                _ => (409, status(409, "Conflict", "the object has been modified")),
            },
            &[16],
        )
        .await;
        assert_eq!(won.unwrap(), Attempt::Raced);
        assert_eq!(methods(&server), ["GET", "GET", "PUT"]);
    }

    /// The renewTime another replica wrote is never compared with this clock: a record stale by an hour
    /// (a clock behind) or an hour in the future (a clock ahead, or a third party) is live until it has
    /// not changed for its duration here, and a record that keeps changing is never taken.
    #[tokio::test(start_paused = true)]
    async fn other_clocks_never_decide_expiry() {
        for offset in [3600, -3600] {
            let held = lease("pod-b", offset);
            let (won, server) = acquire_after(
                move |s| match s.method {
                    Method::GET => (200, held.clone()),
                    _ => (200, s.body.clone()),
                },
                &[14],
            )
            .await;
            assert_eq!(won.unwrap(), Attempt::Follows, "renewTime {offset} s off");
            assert_eq!(methods(&server), ["GET", "GET"]);
        }
        let mut renewals = 0;
        let (won, server) = acquire_after(
            move |s| match s.method {
                Method::GET => {
                    renewals += 1;
                    (200, lease("pod-b", 3600 + renewals))
                }
                _ => (200, s.body.clone()),
            },
            &[10, 10, 10],
        )
        .await;
        assert_eq!(
            won.unwrap(),
            Attempt::Follows,
            "a holder that renews keeps its Lease"
        );
        assert!(methods(&server).iter().all(|m| m == "GET"));
    }

    #[test]
    fn sub_second_durations_round_up_to_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(15)), 15);
        assert_eq!(lease_seconds(Duration::from_millis(300)), 1);
    }

    /// A leader whose apiserver stops answering (a partition: nothing refused, nothing answered) stops
    /// leading at its renew deadline, while its renewal still hangs.
    #[tokio::test(start_paused = true)]
    async fn a_leader_cut_off_from_the_apiserver_stops_leading_at_its_renew_deadline() {
        let (client, mut handle) = client();
        let shutdown = CancellationToken::new();
        let metrics = test_metrics();
        let (mut leadership, _election) = start(
            client,
            config(),
            metrics.clone(),
            shutdown.clone(),
            CancellationToken::new(),
        );
        let answer = |status: u16, body: Value| {
            http::Response::builder()
                .status(status)
                .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap()
        };
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(answer(404, status(404, "NotFound", "not found")));
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.method(), Method::POST);
        let acquired_at = Instant::now();
        send.send_response(answer(201, lease("pod-a", 0)));
        leadership.acquired().await;
        // From now on requests are taken and never answered.
        let hung = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(r) = handle.next_request().await {
                held.push(r);
            }
        });
        tokio::time::timeout(Duration::from_secs(60), leadership.lost())
            .await
            .expect("still leading a minute after the apiserver stopped answering");
        let led_for = acquired_at.elapsed();
        assert!(!leadership.is_leader());
        assert!(
            led_for <= config().renew_deadline,
            "led {led_for:?} after the last renewal"
        );
        assert!(led_for >= config().renew_deadline - Duration::from_millis(10));
        // The attempt ends at the deadline too: it is counted as it times out.
        let failed = || metrics.errors_of(ErrorKind::Lease);
        while failed() == 0 && acquired_at.elapsed() < config().renew_deadline * 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(failed(), 1, "the renewal that timed out is counted");
        shutdown.cancel();
        hung.abort();
    }

    /// At shutdown a leader stops leading at once, but deletes its Lease only after its last write
    /// has returned: the next leader cannot start while this one may still write.
    #[tokio::test(start_paused = true)]
    async fn the_lease_is_released_only_once_the_writes_are_done() {
        let (client, mut handle) = client();
        let (shutdown, writes_done) = (CancellationToken::new(), CancellationToken::new());
        let (mut leadership, election) = start(
            client,
            config(),
            test_metrics(),
            shutdown.clone(),
            writes_done.clone(),
        );
        let respond = |send: tower_test::mock::SendResponse<http::Response<kube::client::Body>>,
                       status: u16,
                       body: Value| {
            send.send_response(
                http::Response::builder()
                    .status(status)
                    .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            )
        };
        let (_, send) = handle.next_request().await.unwrap();
        respond(send, 404, status(404, "NotFound", "not found"));
        let (_, send) = handle.next_request().await.unwrap();
        respond(send, 201, lease("pod-a", 0));
        leadership.acquired().await;
        shutdown.cancel();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!leadership.is_leader(), "still leading after shutdown");
        let early = tokio::time::timeout(Duration::from_secs(60), handle.next_request()).await;
        assert!(
            early.is_err(),
            "the Lease was touched before the writes were done"
        );
        writes_done.cancel();
        let (get, send) = handle.next_request().await.unwrap();
        assert_eq!(get.method(), Method::GET);
        respond(send, 200, lease("pod-a", 0));
        let (delete, send) = handle.next_request().await.unwrap();
        assert_eq!(delete.method(), Method::DELETE);
        respond(send, 200, status(200, "Success", ""));
        election.await.unwrap();
    }

    #[tokio::test]
    async fn the_holder_renews_without_a_transition() {
        let (won, server) = acquire(|s| match s.method {
            Method::GET => (200, lease("pod-a", 2)),
            _ => (200, s.body.clone()),
        })
        .await;
        assert_eq!(won.unwrap(), Attempt::Leads);
        let put = &server.requests[1].body;
        assert_eq!(put["spec"]["leaseTransitions"], 3);
        let renewed: jiff::Timestamp = put["spec"]["renewTime"].as_str().unwrap().parse().unwrap();
        assert!(jiff::Timestamp::now().duration_since(renewed).as_secs() < 5);
    }

    #[tokio::test]
    async fn an_apiserver_error_is_an_error_not_leadership() {
        let (won, _) = acquire(|_| (500, status(500, "InternalError", "etcd down"))).await;
        assert!(won.is_err());
    }

    #[tokio::test]
    async fn stepping_down_deletes_only_a_lease_still_held_on_the_version_read() {
        for (holder, deletes) in [("pod-a", true), ("pod-b", false)] {
            let (client, handle) = client();
            let server = tokio::spawn(serve(handle, move |s| match s.method {
                Method::GET => (200, lease(holder, 1)),
                _ => (200, status(200, "Success", "")),
            }));
            let api: Api<Lease> = Api::namespaced(client, "rekindle");
            release(&api, &config()).await;
            drop(api);
            let server = server.await.unwrap();
            let deleted: Vec<&crate::mock_api::Seen> = server
                .requests
                .iter()
                .filter(|s| s.method == Method::DELETE)
                .collect();
            assert_eq!(deleted.len(), usize::from(deletes), "holder {holder}");
            if let Some(d) = deleted.first() {
                assert_eq!(d.path, LEASE);
                assert_eq!(d.body["preconditions"]["resourceVersion"], "41");
            }
        }
    }
}
