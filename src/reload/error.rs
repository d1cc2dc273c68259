//! Why a write failed, and what to do about it: one classification of apiserver errors for the writer,
//! each with its retry policy and its metric label.

use kube::core::Status;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Another writer moved the object (409, or the resourceVersion `test` op failing with 422).
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
            // A JSON patch's `test` (of the resourceVersion, or of a marker) fails with 422 when
            // the object moved; a tested path that is gone too.
            422 if [
                "testing value",
                "test operation does not apply",
                "error in test for path",
            ]
            .iter()
            .any(|m| s.message.contains(m)) =>
            {
                Self::Conflict(message)
            }
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

    #[test]
    fn classifies_apiserver_answers() {
        let table = [
            (404, "not found", "gone", false),
            (409, "the object has been modified", "conflict", true),
            (
                422,
                "the server rejected our request: testing value /metadata/resourceVersion failed",
                "conflict",
                true,
            ),
            (
                422,
                "testing value /spec/template/spec/containers/0/env/3 failed: test failed",
                "conflict",
                true,
            ),
            (
                422,
                "test operation does not apply: is missing path: /spec/template/spec/containers/2/name: missing value",
                "conflict",
                true,
            ),
            (
                422,
                "error in test for path: '/spec/template/spec/containers/0/env/4': Unable to access invalid index: 4",
                "conflict",
                true,
            ),
            (
                422,
                "metadata.resourceVersion: Invalid value: \"x\": must be a number",
                "invalid",
                false,
            ),
            (
                422,
                "spec.template.spec.containers[1].image: Required value",
                "invalid",
                false,
            ),
            (400, "bad patch", "invalid", false),
            (403, "deployments.apps is forbidden", "forbidden", false),
            (401, "Unauthorized", "forbidden", false),
            (429, "too many requests", "transient", true),
            (500, "etcdserver: request timed out", "transient", true),
            (503, "unavailable", "transient", true),
        ];
        for (code, message, label, retryable) in table {
            let e = WriteError::from_status("PATCH", &status(code, message));
            assert_eq!(e.metric_label(), label, "{code} {message}");
            assert_eq!(e.retryable(), retryable, "{code} {message}");
        }
        assert!(!WriteError::Render("x".into()).retryable());
    }
}
