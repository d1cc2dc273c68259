//! Why a write failed, and what to do about it: one classification of apiserver errors for the writer,
//! each with its retry policy and its metric label.

use kube::core::Status;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Another writer moved the object (409, or a JSON patch that no longer applies: 422).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The object is gone (404): nothing left to reload.
    #[error("the object is gone")]
    Gone,
    /// RBAC forbids the write (401/403): retrying cannot help until the permissions change.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The apiserver refused the object (400, 422): the same request fails the same way.
    #[error("rejected: {0}")]
    Invalid(String),
    /// The patch could not be built from the object.
    #[error("rendering the patch: {0}")]
    Render(String),
    /// Timeouts, throttling, 5xx, connection errors: worth another try.
    #[error("{0}")]
    Transient(String),
    /// Leadership ended between two writes of one reload; the leader's catch-up finishes it.
    #[error("not leading any more")]
    NotLeader,
}

impl WriteError {
    /// Classifies a kube error of the request `what` (e.g. "PATCH").
    pub fn from_kube(what: &str, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => Self::from_status(what, &s),
            other => Self::Transient(format!("{what}: {other}")),
        }
    }

    pub fn from_status(what: &str, s: &Status) -> Self {
        let message = format!("{what}: {} ({})", s.message, s.code);
        match s.code {
            404 => Self::Gone,
            409 => Self::Conflict(message),
            422 if patch_did_not_apply(s) => Self::Conflict(message),
            401 | 403 => Self::Forbidden(message),
            400 | 405 | 415 | 422 => Self::Invalid(message),
            _ => Self::Transient(message),
        }
    }

    /// Whether the same request may succeed later. The writer also retries an invalid patch once from
    /// the live object when it planned from the index (the index may have been behind it).
    pub fn retryable(&self) -> bool {
        matches!(self, Self::Conflict(_) | Self::Transient(_))
    }

    /// The `reason` label of `rekindle_reload_attempt_failures_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Conflict(_) => "conflict",
            Self::Gone => "gone",
            Self::Forbidden(_) => "forbidden",
            Self::Invalid(_) => "invalid",
            Self::Render(_) => "render",
            Self::Transient(_) => "transient",
            Self::NotLeader => "not_leader",
        }
    }
}

/// The apiserver's whole answer when a JSON patch does not apply to the object as it is now: a `test`
/// op failed (the resourceVersion, or a marker another writer replaced) or a path is gone. It drops
/// the patch library's reason, so the answer is a fixed message with no causes, where a patched
/// object failing validation names its fields. rekindle renders every JSON patch against the object
/// it read, so a patch the apiserver cannot apply means the object moved since.
fn patch_did_not_apply(s: &Status) -> bool {
    const MESSAGE: &str = "the server rejected our request due to an error in our request";
    s.message == MESSAGE && s.details.as_ref().is_none_or(|d| d.causes.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> Status {
        Status {
            message: message.into(),
            code,
            ..Status::default()
        }
    }

    /// Answers of kube-apiserver v1.35 as sent (e2e/tests/guards.rs sees them live).
    fn sent(json: &str) -> Status {
        serde_json::from_str(json).expect("a Status")
    }

    #[test]
    fn classifies_apiserver_answers() {
        let patch_did_not_apply = sent(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message":"the server rejected our request due to an error in our request",
            "reason":"Invalid","details":{},"code":422}"#,
        );
        let object_invalid = sent(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message":"Deployment.apps \"web\" is invalid: spec.template.spec.containers[0].image: Required value",
            "reason":"Invalid","details":{"name":"web","group":"apps","kind":"Deployment",
            "causes":[{"reason":"FieldValueRequired","message":"Required value",
            "field":"spec.template.spec.containers[0].image"}]},"code":422}"#,
        );
        // The generic message with causes is a validation failure, not a patch that did not apply.
        let mut generic_with_causes = patch_did_not_apply.clone();
        generic_with_causes.details = object_invalid.details.clone();
        let table = [
            (status(404, "not found"), "gone", false),
            (
                status(409, "the object has been modified"),
                "conflict",
                true,
            ),
            (patch_did_not_apply, "conflict", true),
            (object_invalid, "invalid", false),
            (generic_with_causes, "invalid", false),
            (
                status(422, "the server rejected our request"),
                "invalid",
                false,
            ),
            (status(400, "bad patch"), "invalid", false),
            (
                status(403, "deployments.apps is forbidden"),
                "forbidden",
                false,
            ),
            (status(401, "Unauthorized"), "forbidden", false),
            (status(429, "too many requests"), "transient", true),
            (
                status(500, "etcdserver: request timed out"),
                "transient",
                true,
            ),
            (status(503, "unavailable"), "transient", true),
        ];
        for (s, label, retryable) in table {
            let e = WriteError::from_status("PATCH", &s);
            assert_eq!(e.metric_label(), label, "{} {}", s.code, s.message);
            assert_eq!(e.retryable(), retryable, "{} {}", s.code, s.message);
        }
        assert!(!WriteError::Render("x".into()).retryable());
    }
}
