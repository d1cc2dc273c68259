//! Jobs are not patched: a CronJob's reload creates a Job from its template, and a Job's re-creates
//! it (recorded first, so a re-create a crash interrupts is finished by the next leader).

use std::time::Duration;

use backon::Retryable;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::Api;
use serde_json::Value;

use super::write::Guard;
use super::{Writer, FIELD_MANAGER, JOB_CREATE_RETRIES};
use crate::core::job::{job_from_cronjob, strip_job};
use crate::core::patch::{MarkerChange, Place};
use crate::core::WorkloadKind;
use crate::index::WorkloadKey;
use crate::metrics::ErrorKind;
use crate::reload::error::WriteError;
use crate::reload::recreate::{self, Leftover, Record};
use crate::retry;

impl Writer {
    /// CronJob in `job` mode: a Job from the (marked) job template under a deterministic name, then the
    /// CronJob's metadata markers. A retried create answers AlreadyExists: done, never a second Job.
    pub(super) async fn create_job(
        &self,
        cronjobs: &Api<DynamicObject>,
        key: &WorkloadKey,
        value: &Value,
        working: &Value,
        rv: String,
        changes: &[MarkerChange],
    ) -> Result<(), WriteError> {
        let hashes: Vec<&str> = changes
            .iter()
            .filter_map(|c| match c {
                MarkerChange::SetConfigHash {
                    place: Place::Metadata,
                    hash,
                    ..
                } => Some(hash.as_str()),
                _ => None,
            })
            .collect();
        let job = job_from_cronjob(working, &key.name, &hashes.concat())
            .ok_or_else(|| WriteError::Render("the CronJob has no job template".into()))?;
        let jobs: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &key.namespace,
            &WorkloadKind::Job.api_resource(),
        );
        let job: DynamicObject =
            serde_json::from_value(job).map_err(|e| WriteError::Render(e.to_string()))?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match jobs.create(&params, &job).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {}
            Err(e) => return Err(WriteError::from_kube("creating the Job", e)),
        }
        // The create may have taken long (a slow or cut-off apiserver): the second write is the
        // leader's only. One that stops here leaves the CronJob's markers stale, and the next leader
        // creates the same Job (its name is derived from the hashes, so the create finds it) and
        // writes them.
        self.still_leading()?;
        let metadata_changes: Vec<MarkerChange> = changes
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    MarkerChange::SetConfigHash {
                        place: Place::Metadata,
                        ..
                    } | MarkerChange::RemoveConfigHash {
                        place: Place::Metadata,
                        ..
                    }
                )
            })
            .cloned()
            .collect();
        // On the version: the Job was made from the whole template, not only from the markers.
        self.patch(
            cronjobs,
            key,
            value,
            rv,
            &metadata_changes,
            false,
            Guard::Version,
        )
        .await
        .map(|_| ())
    }

    /// Job: delete (background propagation) and create again under the same name from its JSON,
    /// only if this identity may create Jobs there ([`Self::may_create_job`]). The delete is conditional on the UID that was read: if another writer (a second replica
    /// without leader election, say) re-created the Job since, it answers 409 and this reload is
    /// already done; a create meeting a Job with another UID is done the same way. Once the delete has
    /// gone through, the create is retried on transient errors and refusals for minutes (an apiserver
    /// restarting answers 500, then 403 until its authorizer has synced, for a few seconds): a read
    /// would find no Job and nothing left to reload, so this is
    /// the only place the Job still exists. For the same reason it is finished even if this replica's
    /// lease runs out meanwhile; with the name fixed it cannot be created twice. A crash between the
    /// two is covered by the record written before the delete ([`crate::reload::recreate`]).
    pub(super) async fn recreate_job(
        &self,
        jobs: &Api<DynamicObject>,
        key: &WorkloadKey,
        working: &Value,
    ) -> Result<(), WriteError> {
        let uid = working
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(String::from);
        let fresh = strip_job(working);
        let job: DynamicObject =
            serde_json::from_value(fresh.clone()).map_err(|e| WriteError::Render(e.to_string()))?;
        if !self.may_create_job(&key.namespace).await {
            return Err(WriteError::Forbidden(format!(
                "may not create Jobs in {}: the Job is left as it is rather than deleted",
                key.namespace
            )));
        }
        // The UID the record is kept under, if one was written.
        let recorded = match uid.as_deref() {
            Some(uid) if self.record_recreate(key, uid, fresh).await? => Some(uid),
            _ => None,
        };
        let delete = DeleteParams {
            preconditions: uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match jobs.delete(&key.name, &delete).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::info!("the Job was re-created by another writer; nothing to do");
                self.forget_recreate(recorded).await;
                return Ok(());
            }
            Err(e) => return Err(WriteError::from_kube("deleting the Job", e)),
        }
        self.create_again(jobs, &job, uid.as_deref()).await?;
        self.forget_recreate(recorded).await;
        Ok(())
    }

    /// Whether this identity may create Jobs in `namespace`, asked before a Job is deleted to be
    /// created again: a role that may delete Jobs but not create them would otherwise lose the Job.
    /// Only a review answering "denied" says no; one that fails (RBAC on the reviews themselves
    /// withheld, say) lets the re-create go on, its create retried on refusals as before.
    async fn may_create_job(&self, namespace: &str) -> bool {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_string()),
                    verb: Some("create".into()),
                    group: Some("batch".into()),
                    resource: Some("jobs".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviews: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        match reviews.create(&PostParams::default(), &review).await {
            Ok(answer) => answer.status.is_none_or(|s| s.allowed),
            Err(e) => {
                tracing::debug!(error = %e, "could not ask whether Jobs may be created; going on");
                true
            }
        }
    }

    /// Records the Job about to be re-created (see [`crate::reload::recreate`]); whether it was.
    /// Without RBAC for the records, the re-create goes on unrecorded (a warning says so); any other
    /// error fails this attempt, before anything was deleted.
    pub(super) async fn record_recreate(
        &self,
        key: &WorkloadKey,
        old_uid: &str,
        job: Value,
    ) -> Result<bool, WriteError> {
        let Some(records) = &self.recreates else {
            return Ok(false);
        };
        let record = Record {
            namespace: key.namespace.to_string(),
            name: key.name.to_string(),
            old_uid: old_uid.to_string(),
            job,
        };
        match records.write(&record).await {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 403 => {
                self.metrics.error(ErrorKind::RecreateRecord);
                tracing::warn!(namespace = %records.namespace, error = %s.message,
                    "cannot record the Job before re-creating it: a crash before the create would lose it");
                Ok(false)
            }
            Err(e) => Err(WriteError::from_kube("recording the Job to re-create", e)),
        }
    }

    /// Removes the record of a finished re-create (kept under `old_uid`; None: none was written); one
    /// left behind is removed by the next leader.
    pub(super) async fn forget_recreate(&self, old_uid: Option<&str>) {
        let (Some(records), Some(uid)) = (&self.recreates, old_uid) else {
            return;
        };
        if let Err(e) = records.remove(uid).await {
            self.metrics.error(ErrorKind::RecreateRecord);
            tracing::warn!(error = %e, "could not remove the record of a finished re-create; the next leader will");
        }
    }

    /// Finishes the re-creates a leader recorded and did not finish (it stopped between a Job's
    /// delete and its create): each Job gone is created from its record, then the record goes.
    pub(super) async fn finish_recreates(&self) {
        let Some(records) = &self.recreates else {
            return;
        };
        let (left, invalid) = match records.list().await {
            Ok(found) => found,
            Err(e) => {
                self.metrics.error(ErrorKind::RecreateRecord);
                tracing::warn!(error = %e, "could not list the Jobs left to re-create");
                return;
            }
        };
        for (name, why) in invalid {
            self.metrics.error(ErrorKind::RecreateRecord);
            tracing::warn!(configmap = %name, %why, "not a record of a Job to re-create; left alone");
        }
        for record in left {
            let key = WorkloadKey {
                kind: WorkloadKind::Job,
                namespace: record.namespace.as_str().into(),
                name: record.name.as_str().into(),
            };
            if !self.rollouts.serves(&key) {
                // Another installation sharing this namespace for its records, scoped elsewhere:
                // the Job is its to create.
                continue;
            }
            let jobs: Api<DynamicObject> = Api::namespaced_with(
                self.client.clone(),
                &record.namespace,
                &WorkloadKind::Job.api_resource(),
            );
            let current = match jobs.get_opt(&record.name).await {
                Ok(current) => current,
                Err(e) => {
                    self.metrics.error(ErrorKind::Recreate);
                    tracing::warn!(job = %record.name, namespace = %record.namespace, error = %e,
                        "could not read a Job left to re-create");
                    continue;
                }
            };
            let now = current.as_ref().map(|j| {
                (
                    j.metadata.uid.as_deref().unwrap_or_default(),
                    j.metadata.deletion_timestamp.is_some(),
                )
            });
            if recreate::leftover(&record, now) == Leftover::Create {
                let job = serde_json::from_value::<DynamicObject>(record.job.clone());
                let created = match job {
                    Ok(job) => self.create_again(&jobs, &job, Some(&record.old_uid)).await,
                    Err(e) => Err(WriteError::Render(e.to_string())),
                };
                if let Err(e) = created {
                    self.metrics.error(ErrorKind::Recreate);
                    tracing::error!(job = %record.name, namespace = %record.namespace, error = %e,
                        "could not create a Job left deleted by the previous leader; its record stays");
                    continue;
                }
                tracing::warn!(job = %record.name, namespace = %record.namespace,
                    "created a Job the previous leader deleted and did not create again");
            }
            self.forget_recreate(Some(&record.old_uid)).await;
        }
    }

    /// Creates `job` again after its predecessor (`old_uid`) was deleted: retried on transient errors
    /// and while the old Job is still there, for minutes, since nothing else would create it.
    pub(super) async fn create_again(
        &self,
        jobs: &Api<DynamicObject>,
        job: &DynamicObject,
        old_uid: Option<&str>,
    ) -> Result<(), WriteError> {
        let name = job.metadata.name.clone().unwrap_or_default();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        // The old Job is removed in the background; until it is gone the create meets AlreadyExists
        // (`Err(None)`: wait and try again), as it does a transient error.
        let create = || async {
            match jobs.create(&params, job).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // Still the old Job, or one another writer created meanwhile (then: done).
                    let current = jobs.get_opt(&name).await.ok().flatten();
                    match current {
                        Some(j) if j.metadata.uid.as_deref() != old_uid => Ok(()),
                        _ => Err(None),
                    }
                }
                Err(e) => Err(Some(WriteError::from_kube("re-creating the Job", e))),
            }
        };
        create
            .retry(retry::backoff(
                Duration::from_millis(100),
                Duration::from_secs(5),
                JOB_CREATE_RETRIES,
            ))
            .sleep(tokio::time::sleep)
            // Forbidden too: an apiserver just restarted refuses until its authorizer has synced,
            // and the Job exists nowhere else. A refusal that lasts ends the tries, and the record
            // left behind has the next leader create it.
            .when(|e| {
                e.as_ref()
                    .is_none_or(|e| e.retryable() || matches!(e, WriteError::Forbidden(_)))
            })
            .await
            .map_err(|e| {
                let e = e.unwrap_or_else(|| {
                    WriteError::Transient("the old Job was not removed in time".into())
                });
                tracing::error!(error = %e, job = %serde_json::to_string(&job).unwrap_or_default(),
                    "the Job was deleted and could not be created again; its manifest follows");
                e
            })
    }
}
