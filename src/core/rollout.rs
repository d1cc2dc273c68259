//! Where a workload's rollout stands, read from the kind's own status (what `kubectl rollout status`
//! and Argo Rollouts report), for `--max-rollouts-in-progress`.

use serde_json::Value;

use super::refs;
use super::restart::{self, Restarts};
use super::WorkloadKind;

/// Where a rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// Every replica runs the current template and is available.
    #[default]
    Finished,
    /// Still rolling (or the controller has not seen the latest spec yet).
    Progressing,
    /// The kind's controller gave up on it.
    Failed(Failure),
}

/// Why a rollout failed (`rekindle_rollouts_failed_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// A Deployment's `Progressing` condition says `ProgressDeadlineExceeded`.
    ProgressDeadline,
    /// An Argo Rollout in phase `Degraded`.
    Degraded,
    /// Not finished within `--rollout-timeout`.
    Timeout,
}

impl Failure {
    pub const ALL: [Failure; 3] = [
        Failure::ProgressDeadline,
        Failure::Degraded,
        Failure::Timeout,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Failure::ProgressDeadline => "progress_deadline",
            Failure::Degraded => "degraded",
            Failure::Timeout => "timeout",
        }
    }
}

/// Whether a reload of this kind starts a rollout that takes time: Jobs and CronJobs are done when
/// written, and a DeploymentConfig's rollout is not tracked. The pods of an owner rekindle does not
/// write restart in a walk, which is the rollout.
pub fn tracked(kind: WorkloadKind) -> bool {
    matches!(
        kind,
        WorkloadKind::Deployment
            | WorkloadKind::StatefulSet
            | WorkloadKind::DaemonSet
            | WorkloadKind::Rollout
            | WorkloadKind::Pods
    )
}

/// The object's `metadata.generation` (0 when absent).
pub fn generation(obj: &Value) -> i64 {
    int(obj, "/metadata/generation").unwrap_or(0)
}

/// `status.observedGeneration` (Argo Rollouts writes it as a string).
fn observed_generation(obj: &Value) -> Option<i64> {
    match refs::at(obj, "/status/observedGeneration") {
        Some(Value::String(s)) => s.parse().ok(),
        Some(v) => v.as_i64(),
        None => None,
    }
}

/// Whether the kind's controller has seen the latest spec (the template rekindle wrote).
pub fn caught_up(obj: &Value) -> bool {
    observed_generation(obj).is_some_and(|o| o >= generation(obj))
}

/// Where the rollout of `obj` stands; kinds that are not [`tracked`] are always finished, and so is
/// an `OnDelete` StatefulSet or DaemonSet whose pods nobody restarts once its controller has seen the
/// template (`core::restart`): its pods wait for someone to delete them, which no budget or deadline
/// should wait for. `pod_restarts` is `--pod-restarts`.
pub fn progress(kind: WorkloadKind, obj: &Value, pod_restarts: bool) -> Progress {
    let observed = observed_generation(obj);
    let caught_up = caught_up(obj);
    let replicas = int(obj, "/spec/replicas").unwrap_or(1);
    let status = |field: &str| int(obj, &format!("/status/{field}")).unwrap_or(0);
    if restart::restarts(obj, kind, pod_restarts) == Restarts::Manual {
        return finished_if(caught_up);
    }
    match kind {
        WorkloadKind::Deployment => {
            // Until the controller has seen the latest spec, a deadline exceeded is the previous
            // rollout's (its condition stays until the new ReplicaSet is created).
            if caught_up && condition_reason(obj, "Progressing") == Some("ProgressDeadlineExceeded")
            {
                return Progress::Failed(Failure::ProgressDeadline);
            }
            let done = caught_up
                && status("updatedReplicas") == replicas
                && status("availableReplicas") == replicas
                && status("replicas") == replicas
                && condition_reason(obj, "Progressing") == Some("NewReplicaSetAvailable");
            finished_if(done)
        }
        WorkloadKind::StatefulSet => {
            let revisions = refs::at(obj, "/status/updateRevision")
                .zip(refs::at(obj, "/status/currentRevision"));
            // The controller moves `currentRevision` only in a rolling update: under OnDelete the
            // updated pods tell.
            let on_delete = restart::restarts(obj, kind, pod_restarts) == Restarts::Evict;
            let done = caught_up
                && (on_delete || revisions.is_some_and(|(u, c)| u == c))
                && status("readyReplicas") == replicas
                && status("updatedReplicas") == replicas;
            finished_if(done)
        }
        WorkloadKind::DaemonSet => {
            let desired = status("desiredNumberScheduled");
            let done = caught_up
                && status("updatedNumberScheduled") == desired
                && status("numberAvailable") == desired;
            finished_if(done)
        }
        WorkloadKind::Rollout => match refs::at(obj, "/status/phase").and_then(Value::as_str) {
            Some("Degraded") if caught_up || observed.is_none() => {
                Progress::Failed(Failure::Degraded)
            }
            Some("Healthy") if caught_up || observed.is_none() => Progress::Finished,
            _ => Progress::Progressing,
        },
        _ => Progress::Finished,
    }
}

fn finished_if(done: bool) -> Progress {
    if done {
        Progress::Finished
    } else {
        Progress::Progressing
    }
}

fn int(obj: &Value, pointer: &str) -> Option<i64> {
    refs::at(obj, pointer).and_then(Value::as_i64)
}

/// The reason of the status condition of type `kind`.
fn condition_reason<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    refs::at(obj, "/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))?
        .get("reason")?
        .as_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(status: Value) -> Value {
        json!({"metadata": {"generation": 3}, "spec": {"replicas": 2}, "status": status})
    }

    #[test]
    fn a_deployment_finishes_when_every_replica_is_updated_and_available() {
        let done = json!({
            "observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2,
            "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]
        });
        assert_eq!(
            progress(WorkloadKind::Deployment, &deployment(done.clone()), true),
            Progress::Finished
        );
        for (field, value) in [
            ("observedGeneration", json!(2)),
            ("updatedReplicas", json!(1)),
            ("availableReplicas", json!(1)),
            // An old pod still terminating.
            ("replicas", json!(3)),
        ] {
            let mut status = done.clone();
            status[field] = value;
            assert_eq!(
                progress(WorkloadKind::Deployment, &deployment(status), true),
                Progress::Progressing,
                "{field}"
            );
        }
        let mut status = done;
        status["conditions"][0]["reason"] = json!("ReplicaSetUpdated");
        assert_eq!(
            progress(WorkloadKind::Deployment, &deployment(status), true),
            Progress::Progressing
        );
    }

    #[test]
    fn a_deployment_past_its_progress_deadline_failed() {
        let status = json!({
            "observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]
        });
        assert_eq!(
            progress(WorkloadKind::Deployment, &deployment(status.clone()), true),
            Progress::Failed(Failure::ProgressDeadline)
        );
        // Written again (generation 4) before the controller saw it: the condition is the previous
        // rollout's, and the new one has only begun.
        let mut written = deployment(status);
        written["metadata"]["generation"] = json!(4);
        assert_eq!(
            progress(WorkloadKind::Deployment, &written, true),
            Progress::Progressing
        );
    }

    #[test]
    fn a_deployment_without_replicas_counts_one() {
        let obj = json!({"metadata": {"generation": 1}, "spec": {}, "status": {
            "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1,
            "conditions": [{"type": "Progressing", "reason": "NewReplicaSetAvailable"}]}});
        assert_eq!(
            progress(WorkloadKind::Deployment, &obj, true),
            Progress::Finished
        );
        let no_status = json!({"metadata": {"generation": 1}, "spec": {}});
        assert_eq!(
            progress(WorkloadKind::Deployment, &no_status, true),
            Progress::Progressing
        );
    }

    #[test]
    fn a_statefulset_finishes_when_its_revisions_agree_and_all_are_ready() {
        let obj = |update: &str, ready: i64| {
            json!({"metadata": {"generation": 2}, "spec": {"replicas": 2}, "status": {
                "observedGeneration": 2, "updateRevision": update, "currentRevision": "web-1",
                "readyReplicas": ready, "updatedReplicas": 2}})
        };
        assert_eq!(
            progress(WorkloadKind::StatefulSet, &obj("web-1", 2), true),
            Progress::Finished
        );
        assert_eq!(
            progress(WorkloadKind::StatefulSet, &obj("web-2", 2), true),
            Progress::Progressing
        );
        assert_eq!(
            progress(WorkloadKind::StatefulSet, &obj("web-1", 1), true),
            Progress::Progressing
        );
    }

    #[test]
    fn an_on_delete_workload_nobody_restarts_finishes_once_its_controller_saw_the_template() {
        let obj = |observed: i64, restart: Option<&str>| {
            let annotations: serde_json::Map<String, Value> = restart
                .map(|r| {
                    (
                        crate::core::restart::RESTART_ANNOTATION.to_string(),
                        json!(r),
                    )
                })
                .into_iter()
                .collect();
            json!({"metadata": {"generation": 2, "annotations": annotations},
                   "spec": {"replicas": 3, "updateStrategy": {"type": "OnDelete"}},
                   "status": {"observedGeneration": observed, "updateRevision": "db-2",
                              "currentRevision": "db-1", "readyReplicas": 3, "updatedReplicas": 0}})
        };
        let sts = WorkloadKind::StatefulSet;
        assert_eq!(progress(sts, &obj(2, None), true), Progress::Finished);
        assert_eq!(progress(sts, &obj(1, None), true), Progress::Progressing);
        // Opted in: the walk is the rollout, finished when every pod is replaced (the controller
        // leaves `currentRevision` behind under OnDelete).
        assert_eq!(
            progress(sts, &obj(2, Some("pods")), true),
            Progress::Progressing
        );
        let mut replaced = obj(2, Some("pods"));
        replaced["status"]["updatedReplicas"] = json!(3);
        assert_eq!(progress(sts, &replaced, true), Progress::Finished);
        // Pod restarts switched off: nobody restarts them.
        assert_eq!(
            progress(sts, &obj(2, Some("pods")), false),
            Progress::Finished
        );
    }

    #[test]
    fn a_daemonset_finishes_when_updated_and_available_equal_desired() {
        let obj = |updated: i64, available: i64| {
            json!({"metadata": {"generation": 4}, "status": {"observedGeneration": 4,
                "desiredNumberScheduled": 3, "updatedNumberScheduled": updated, "numberAvailable": available}})
        };
        assert_eq!(
            progress(WorkloadKind::DaemonSet, &obj(3, 3), true),
            Progress::Finished
        );
        assert_eq!(
            progress(WorkloadKind::DaemonSet, &obj(2, 3), true),
            Progress::Progressing
        );
        assert_eq!(
            progress(WorkloadKind::DaemonSet, &obj(3, 2), true),
            Progress::Progressing
        );
    }

    #[test]
    fn a_rollout_follows_its_phase_and_string_generation() {
        let obj = |phase: &str, observed: &str| json!({"metadata": {"generation": 5}, "status": {"phase": phase, "observedGeneration": observed}});
        assert_eq!(
            progress(WorkloadKind::Rollout, &obj("Healthy", "5"), true),
            Progress::Finished
        );
        assert_eq!(
            progress(WorkloadKind::Rollout, &obj("Healthy", "4"), true),
            Progress::Progressing
        );
        assert_eq!(
            progress(WorkloadKind::Rollout, &obj("Paused", "5"), true),
            Progress::Progressing
        );
        assert_eq!(
            progress(WorkloadKind::Rollout, &obj("Degraded", "5"), true),
            Progress::Failed(Failure::Degraded)
        );
        assert_eq!(
            progress(WorkloadKind::Rollout, &obj("Degraded", "4"), true),
            Progress::Progressing,
            "the previous spec's"
        );
    }

    #[test]
    fn jobs_cronjobs_and_deploymentconfigs_are_not_tracked() {
        for kind in [
            WorkloadKind::Job,
            WorkloadKind::CronJob,
            WorkloadKind::DeploymentConfig,
        ] {
            assert!(!tracked(kind));
            assert_eq!(progress(kind, &json!({}), true), Progress::Finished);
        }
    }
}
