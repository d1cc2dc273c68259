//! Leader election on a `coordination.k8s.io/v1` Lease (`--enable-ha`): every replica serves the
//! webhook and keeps its index warm; only the leader writes. Failover loses nothing: the new leader
//! runs the catch-up pass, which compares markers with current hashes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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

/// Whether this replica may write. Without HA it is always true.
#[derive(Clone)]
pub struct Leadership(watch::Receiver<bool>);

impl Leadership {
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        // Keep the sender alive for the life of the process.
        std::mem::forget(tx);
        Self(rx)
    }

    /// Leadership as a test sets it.
    #[cfg(test)]
    pub fn from_channel(rx: watch::Receiver<bool>) -> Self {
        Self(rx)
    }

    pub fn is_leader(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until this replica leads.
    pub async fn acquired(&mut self) {
        let _ = self.0.wait_for(|l| *l).await;
    }

    /// Waits until this replica stops leading.
    pub async fn lost(&mut self) {
        let _ = self.0.wait_for(|l| !*l).await;
    }
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// The running election; [`Election::step_down`] releases the Lease once the caller's writes are done.
pub struct Election(tokio::task::JoinHandle<Option<(Api<Lease>, LeaseConfig)>>);

impl Election {
    /// Waits for the election to stop (after `shutdown`) and deletes the Lease if this replica held it,
    /// so the next leader takes over at once instead of after `--leader-election-lease-duration`.
    pub async fn step_down(self) {
        if let Ok(Some((api, cfg))) = self.0.await {
            release(&api, &cfg).await;
            tracing::info!(identity = %cfg.identity, "released the Lease");
        }
    }
}

/// Runs the election until `shutdown`. Leadership ends at `shutdown`; the Lease itself is released by
/// [`Election::step_down`], which the caller awaits after its last write.
pub fn start(
    client: Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
) -> (Leadership, Election) {
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
        let mut last_renew: Option<Instant> = None;
        loop {
            let leading = *tx.borrow();
            match try_acquire_or_renew(&api, &cfg).await {
                Ok(true) => {
                    last_renew = Some(Instant::now());
                    if !leading {
                        tracing::info!(identity = %cfg.identity, "became the leader");
                        let _ = tx.send(true);
                    }
                }
                Ok(false) => {
                    if leading {
                        tracing::warn!("lost the Lease to another replica");
                        let _ = tx.send(false);
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "Lease update failed");
                    if leading && last_renew.is_none_or(|t| t.elapsed() > cfg.renew_deadline) {
                        tracing::warn!(
                            "could not renew the Lease within the deadline; stepping down"
                        );
                        let _ = tx.send(false);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(cfg.retry_period) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        let leading = *tx.borrow();
        let _ = tx.send(false);
        leading.then_some((api, cfg))
    });
    (Leadership(rx), Election(task))
}

async fn try_acquire_or_renew(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<bool, kube::Error> {
    let secs = i32::try_from(cfg.lease_duration.as_secs())
        .unwrap_or(15)
        .max(1);
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": cfg.name},
            "spec": {"holderIdentity": cfg.identity, "leaseDurationSeconds": secs, "acquireTime": now(), "renewTime": now(), "leaseTransitions": 0}
        }))
        .map_err(kube::Error::SerdeError)?;
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(secs).max(1) as u64);
    let expired = spec.renew_time.as_ref().is_none_or(|t| {
        let age = jiff::Timestamp::now().duration_since(t.0);
        age.is_negative() || Duration::try_from(age).unwrap_or_default() > duration
    });
    if holder != cfg.identity && !holder.is_empty() && !expired {
        return Ok(false);
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
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
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
    if let Err(e) = api.delete(&cfg.name, &params).await {
        tracing::debug!(error = %e, "could not delete the Lease on stepping down");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock_api::{client, serve, status};
    use hyper::Method;
    use serde_json::Value;

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
    ) -> (Result<bool, kube::Error>, crate::mock_api::ApiServer) {
        let (client, handle) = client();
        let server = tokio::spawn(serve(handle, answer));
        let api: Api<Lease> = Api::namespaced(client, "rekindle");
        let won = try_acquire_or_renew(&api, &config()).await;
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
        assert!(won.unwrap());
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
        assert!(!won.unwrap());
    }

    #[tokio::test]
    async fn a_live_lease_of_another_replica_is_left_alone() {
        let (won, server) = acquire(|_| (200, lease("pod-b", 3))).await;
        assert!(!won.unwrap());
        assert_eq!(
            methods(&server),
            ["GET"],
            "no write to a Lease another replica holds"
        );
    }

    #[tokio::test]
    async fn an_expired_lease_is_taken_over_by_compare_and_swap() {
        let (won, server) = acquire(|s| match s.method {
            Method::GET => (200, lease("pod-b", 60)),
            _ => (200, s.body.clone()),
        })
        .await;
        assert!(won.unwrap());
        assert_eq!(methods(&server), ["GET", "PUT"]);
        let put = &server.requests[1].body;
        assert_eq!(
            put["metadata"]["resourceVersion"], "41",
            "the swap is conditional on the read"
        );
        assert_eq!(put["spec"]["holderIdentity"], "pod-a");
        assert_eq!(put["spec"]["leaseTransitions"], 4);
    }

    #[tokio::test]
    async fn losing_the_swap_to_another_replica_is_not_leading() {
        let (won, _) = acquire(|s| match s.method {
            Method::GET => (200, lease("pod-b", 60)),
            _ => (409, status(409, "Conflict", "the object has been modified")),
        })
        .await;
        assert!(!won.unwrap());
    }

    #[tokio::test]
    async fn the_holder_renews_without_a_transition() {
        let (won, server) = acquire(|s| match s.method {
            Method::GET => (200, lease("pod-a", 2)),
            _ => (200, s.body.clone()),
        })
        .await;
        assert!(won.unwrap());
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
