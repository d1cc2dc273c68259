//! Deployment pause (`deployment.reloader.stakater.com/pause-period`): the reload patch also pauses the
//! Deployment and records `paused-at` (`core::pause`). Its end is an entry of the reload queue, due when
//! the period is over: the Deployment watch schedules it (`Triggers::resume_at`) and the writer makes
//! it like any other write, on the leader only. The state lives in the object, so a restart of
//! rekindle, or a new leader, resumes on time instead of never.

use std::time::Duration;

use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};

use super::error::WriteError;
use crate::core::pause::{resume_at, resume_ops};
use crate::core::policy::AnnotationKeys;
use crate::index::WorkloadKey;
use crate::reload::lease::Leadership;

/// What is left of a pause after [`resume_if_due`].
#[derive(Debug, PartialEq, Eq)]
pub enum Resume {
    /// Resumed, not paused by rekindle, gone, or left to the leader.
    Done,
    /// The period (as the object says now) is over in this long.
    DueIn(Duration),
}

/// Ends the pause rekindle set on the Deployment `key` if its period is over, read from the live
/// object; the PATCH is guarded by the resourceVersion read. One attempt: a failure goes back to the
/// queue like any other write's.
pub async fn resume_if_due(
    client: &Client,
    keys: &AnnotationKeys,
    leadership: &Leadership,
    key: &WorkloadKey,
) -> Result<Resume, WriteError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &key.namespace, &key.kind.api_resource());
    let Some(obj) = api
        .get_opt(&key.name)
        .await
        .map_err(|e| WriteError::from_kube("GET", e))?
    else {
        return Ok(Resume::Done);
    };
    let value = serde_json::to_value(&obj).map_err(|e| WriteError::Render(e.to_string()))?;
    let Some(due) = resume_at(keys, &value) else {
        return Ok(Resume::Done);
    };
    let wait = due.duration_since(jiff::Timestamp::now());
    if wait.is_positive() {
        return Ok(Resume::DueIn(Duration::try_from(wait).unwrap_or_default()));
    }
    if !leadership.is_leader() {
        tracing::info!("not leading any more; the resume is left to the leader");
        return Ok(Resume::Done);
    }
    let params = PatchParams {
        field_manager: Some("rekindle".into()),
        ..Default::default()
    };
    let ops = json_patch::Patch(resume_ops(keys, &value));
    api.patch(&key.name, &params, &Patch::Json::<()>(ops))
        .await
        .map_err(|e| WriteError::from_kube("PATCH", e))?;
    tracing::info!("pause period over; resumed");
    Ok(Resume::Done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::WorkloadKind;
    use crate::mock_api::{client, serve};
    use crate::reload::lease::forever;
    use serde_json::json;
    use tokio::sync::watch;

    fn paused_at(at: jiff::Timestamp) -> serde_json::Value {
        let keys = AnnotationKeys::default();
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web",
            "namespace": "ns", "resourceVersion": "9", "annotations": {
            keys.paused_at.as_str(): at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            keys.pause_period.as_str(): "1m"}}, "spec": {"paused": true}})
    }

    fn key() -> WorkloadKey {
        WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "web".into(),
        }
    }

    /// Over: one read, then the resume guarded by the version read. Not over: one read, and how long
    /// is left. Over on a replica that does not lead: nothing written.
    #[tokio::test]
    async fn resumes_when_the_period_read_from_the_object_is_over() {
        let keys = AnnotationKeys::default();
        let now = jiff::Timestamp::now();
        let long_ago = paused_at(now - jiff::SignedDuration::from_mins(5));
        let (lead, leading) = watch::channel(Some(forever()));
        let leadership = Leadership::from_channel(leading);
        for (object, leads, expected) in [
            (long_ago.clone(), true, Resume::Done),
            (paused_at(now), true, Resume::DueIn(Duration::from_secs(60))),
            (long_ago, false, Resume::Done),
        ] {
            lead.send(leads.then(forever)).unwrap();
            let (client, handle) = client();
            let answer = object.clone();
            let server = tokio::spawn(serve(handle, move |_| (200, answer.clone())));
            let resume = resume_if_due(&client, &keys, &leadership, &key())
                .await
                .unwrap();
            drop(client);
            let seen = server.await.unwrap().requests;
            let methods: Vec<String> = seen.iter().map(|s| s.method.to_string()).collect();
            match (&expected, leads) {
                (Resume::Done, true) => {
                    assert_eq!(resume, Resume::Done);
                    assert_eq!(methods, ["GET", "PATCH"]);
                    assert_eq!(
                        seen[1].body,
                        json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "9"},
                            {"op": "add", "path": "/spec/paused", "value": false},
                            {"op": "remove", "path": "/metadata/annotations/deployment.reloader.stakater.com~1paused-at"}])
                    );
                }
                (Resume::DueIn(full), _) => {
                    let Resume::DueIn(left) = resume else {
                        panic!("{resume:?}")
                    };
                    assert!(
                        left <= *full && left > *full - Duration::from_secs(5),
                        "{left:?}"
                    );
                    assert_eq!(methods, ["GET"]);
                }
                (Resume::Done, false) => {
                    assert_eq!(resume, Resume::Done);
                    assert_eq!(methods, ["GET"], "a replica not leading writes nothing");
                }
            }
        }
    }
}
