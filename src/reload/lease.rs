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
