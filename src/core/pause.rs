//! Deployment pause (`deployment.reloader.stakater.com/pause-period`) as patch operations: the reload
//! patch also pauses the Deployment and records `paused-at`; once the period is over, the resume ops
//! unpause it. The state lives in the object, so a restart of rekindle mid-pause resumes on time.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
use serde_json::{json, Value};

use super::duration::parse_go_duration;
use super::policy::AnnotationKeys;

#[derive(Debug, PartialEq)]
pub enum PauseDecision {
    /// No pause-period, or the Deployment is already paused (by the user, or by us earlier).
    None,
    Pause(Vec<PatchOperation>),
    /// The period does not parse: reload without pause and say so.
    Invalid(String),
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn annotation_path(key: &str) -> PointerBuf {
    PointerBuf::from_tokens(["metadata", "annotations", key])
}

/// Ops that pause a Deployment being reloaded, rendered against `obj` (which already has annotations
/// when the marker changes added them; `annotations_exist` says whether they do).
pub fn pause_ops(
    keys: &AnnotationKeys,
    obj: &Value,
    annotations_exist: bool,
    now: jiff::Timestamp,
) -> PauseDecision {
    let Some(period) = annotation(obj, &keys.pause_period) else {
        return PauseDecision::None;
    };
    if let Err(e) = parse_go_duration(period) {
        return PauseDecision::Invalid(e.to_string());
    }
    if obj.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
        return PauseDecision::None;
    }
    let mut ops = Vec::new();
    if !annotations_exist {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations"]),
            value: json!({}),
        }));
    }
    ops.push(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["spec", "paused"]),
        value: json!(true),
    }));
    ops.push(PatchOperation::Add(AddOperation {
        path: annotation_path(&keys.paused_at),
        value: json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
    }));
    PauseDecision::Pause(ops)
}

/// The `paused-at` annotation rekindle set when it paused the Deployment.
pub fn paused_at<'a>(keys: &AnnotationKeys, obj: &'a Value) -> Option<&'a str> {
    annotation(obj, &keys.paused_at)
}

/// When a Deployment paused by rekindle is due to resume; `None` when it is not paused by rekindle.
pub fn resume_at(keys: &AnnotationKeys, obj: &Value) -> Option<jiff::Timestamp> {
    let paused_at: jiff::Timestamp = annotation(obj, &keys.paused_at)?.parse().ok()?;
    // A missing or invalid period resumes at once rather than never.
    let period = annotation(obj, &keys.pause_period)
        .and_then(|p| parse_go_duration(p).ok())
        .unwrap_or_default();
    let period = jiff::SignedDuration::try_from(period).unwrap_or_default();
    paused_at.checked_add(period).ok()
}

pub fn resume_ops(keys: &AnnotationKeys, obj: &Value) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    if let Some(rv) = obj.pointer("/metadata/resourceVersion") {
        ops.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
            value: rv.clone(),
        }));
    }
    ops.push(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["spec", "paused"]),
        value: json!(false),
    }));
    if annotation(obj, &keys.paused_at).is_some() {
        ops.push(PatchOperation::Remove(RemoveOperation {
            path: annotation_path(&keys.paused_at),
        }));
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(annotations: Value, paused: Option<bool>) -> Value {
        let mut d = json!({"metadata": {"name": "d", "resourceVersion": "7", "annotations": annotations}, "spec": {}});
        if let Some(p) = paused {
            d["spec"]["paused"] = json!(p);
        }
        d
    }

    #[test]
    fn pause_then_resume() {
        let keys = AnnotationKeys::default();
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let d = deploy(
            json!({"deployment.reloader.stakater.com/pause-period": "1m30s"}),
            None,
        );
        let PauseDecision::Pause(ops) = pause_ops(&keys, &d, true, now) else {
            panic!("expected a pause")
        };
        let mut paused = d.clone();
        json_patch::patch(&mut paused, &ops).unwrap();
        assert_eq!(paused["spec"]["paused"], true);
        assert_eq!(
            paused["metadata"]["annotations"]["deployment.reloader.stakater.com/paused-at"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            resume_at(&keys, &paused),
            Some("2026-01-01T00:01:30Z".parse().unwrap())
        );
        // Already paused (by us): nothing more; changes accumulate.
        assert_eq!(pause_ops(&keys, &paused, true, now), PauseDecision::None);
        let mut resumed = paused.clone();
        json_patch::patch(&mut resumed, &resume_ops(&keys, &paused)).unwrap();
        assert_eq!(resumed["spec"]["paused"], false);
        assert!(resumed["metadata"]["annotations"]
            .get("deployment.reloader.stakater.com/paused-at")
            .is_none());
    }

    #[test]
    fn user_paused_and_invalid_periods() {
        let keys = AnnotationKeys::default();
        let now = jiff::Timestamp::now();
        let user = deploy(
            json!({"deployment.reloader.stakater.com/pause-period": "1m"}),
            Some(true),
        );
        assert_eq!(pause_ops(&keys, &user, true, now), PauseDecision::None);
        assert_eq!(
            resume_at(&keys, &user),
            None,
            "a user-paused Deployment is never resumed by rekindle"
        );
        let bad = deploy(
            json!({"deployment.reloader.stakater.com/pause-period": "soon"}),
            None,
        );
        assert!(matches!(
            pause_ops(&keys, &bad, true, now),
            PauseDecision::Invalid(_)
        ));
        assert_eq!(
            pause_ops(&keys, &deploy(json!({}), None), true, now),
            PauseDecision::None
        );
    }
}
