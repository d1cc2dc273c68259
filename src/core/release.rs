//! Canaries and halts: the annotations that order a fleet's reloads for one change.
//!
//! `rekindle.io/reload-canary: "true"` on a workload makes it reload before the others owed the same
//! change; they wait until its rollout finished healthy. `rekindle.io/reload-halted` is written by
//! rekindle on a workload whose rollout for a change failed: while it names a change (resource and
//! hash) that is still current, the reloads owed for it wait.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::refs::ResourceRef;
use super::rollout::{self, Progress};
use super::window;
use super::{ResourceKind, WorkloadKind};

pub const CANARY_ANNOTATION: &str = "rekindle.io/reload-canary";
pub const HALTED_ANNOTATION: &str = "rekindle.io/reload-halted";

/// What the index keeps of a workload for release policies: canaries, halts and its reload window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Release {
    pub canary: bool,
    /// The `rekindle.io/reload-window` value, as written (parsed when a reload is due: an invalid
    /// one is reported then, on the workload).
    pub window: Option<Box<str>>,
    /// The `rekindle.io/reload-halted` value, as written.
    pub halted: Option<Box<str>>,
    pub progress: Progress,
}

impl Release {
    /// `pod_restarts` is `--pod-restarts` (an `OnDelete` workload's rollout depends on it).
    pub fn of(obj: &Value, kind: WorkloadKind, pod_restarts: bool) -> Self {
        let annotation = |key: &str| {
            obj.pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)
        };
        Self {
            canary: annotation(CANARY_ANNOTATION) == Some("true"),
            window: window::own_window(obj).map(Into::into),
            halted: annotation(HALTED_ANNOTATION).map(Into::into),
            progress: rollout::progress(kind, obj, pod_restarts),
        }
    }

    /// Whether canaries and halts need this workload looked at.
    pub fn marked(&self) -> bool {
        self.canary || self.halted.is_some()
    }

    /// The halt it carries, if its value is rekindle's.
    pub fn halt(&self) -> Option<Halt> {
        serde_json::from_str(self.halted.as_deref()?).ok()
    }
}

/// One change a halt holds back: a resource at a hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltedChange {
    pub kind: ResourceKind,
    pub name: String,
    pub hash: String,
}

impl HaltedChange {
    /// Whether it is the change of `r` to `hash`.
    pub fn is(&self, r: &ResourceRef, hash: &str) -> bool {
        self.kind == r.kind && self.name == r.name && self.hash == hash
    }
}

/// The value of `rekindle.io/reload-halted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Halt {
    /// Why the rollout failed (`core::rollout::Failure`'s label).
    pub reason: String,
    /// The changes its rollout was written for.
    pub changes: Vec<HaltedChange>,
}

impl Halt {
    /// Whether it holds back the change of `r` to `hash`.
    pub fn holds(&self, r: &ResourceRef, hash: &str) -> bool {
        self.changes.iter().any(|c| c.is(r, hash))
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a halt serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_halt_names_its_changes_and_round_trips() {
        let halt = Halt {
            reason: "progress_deadline".into(),
            changes: vec![HaltedChange {
                kind: ResourceKind::ConfigMap,
                name: "app".into(),
                hash: "abc".into(),
            }],
        };
        let obj = json!({"metadata": {"annotations": {HALTED_ANNOTATION: halt.to_annotation()}}});
        let release = Release::of(&obj, WorkloadKind::Deployment, true);
        assert!(release.marked());
        let read = release.halt().unwrap();
        assert_eq!(read, halt);
        let app = ResourceRef {
            kind: ResourceKind::ConfigMap,
            name: "app".into(),
        };
        assert!(read.holds(&app, "abc"));
        assert!(!read.holds(&app, "abd"), "a newer change is not held");
        let secret = ResourceRef {
            kind: ResourceKind::Secret,
            name: "app".into(),
        };
        assert!(!read.holds(&secret, "abc"));
    }

    #[test]
    fn only_true_makes_a_canary_and_a_foreign_halt_value_holds_nothing() {
        let obj = |canary: &str| json!({"metadata": {"annotations": {CANARY_ANNOTATION: canary, HALTED_ANNOTATION: "by hand"}}});
        assert!(Release::of(&obj("true"), WorkloadKind::Deployment, true).canary);
        assert!(!Release::of(&obj("yes"), WorkloadKind::Deployment, true).canary);
        assert_eq!(
            Release::of(&obj("true"), WorkloadKind::Deployment, true).halt(),
            None
        );
        assert!(!Release::of(&json!({}), WorkloadKind::Deployment, true).marked());
    }
}
