//! Pod restarts: workloads whose controller does not replace pods when the template changes
//! (StatefulSets and DaemonSets with `updateStrategy: OnDelete`). With `rekindle.io/restart: pods`,
//! rekindle writes the template as usual and then evicts the pods still running older config, a few
//! at a time (`rekindle.io/max-unavailable`, default 1), through the Eviction API so that
//! PodDisruptionBudgets are honoured.
//!
//! Which pods run older config is read from the pods themselves (their markers against the
//! template's), never remembered: a restart of rekindle or a new leader continues the walk where the
//! pods say it stands, and a pod already replaced is never evicted again for the same change.

use serde_json::Value;

use super::plan::{self, PlanConfig};
use super::refs::{self, ResourceRef};
use super::WorkloadKind;

/// `rekindle.io/restart: pods` on the workload opts in.
pub const RESTART_ANNOTATION: &str = "rekindle.io/restart";
/// How many of the workload's pods may be down at once during a walk (a number or a percentage).
pub const MAX_UNAVAILABLE_ANNOTATION: &str = "rekindle.io/max-unavailable";

/// How the pods of a workload come to run a new template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Restarts {
    /// The kind's controller replaces them (a rolling update).
    #[default]
    Controller,
    /// `OnDelete`, not opted in (or pod restarts switched off): the template is written and no pod
    /// restarts until someone deletes it. Such a reload counts as finished once written.
    Manual,
    /// `OnDelete` with `rekindle.io/restart: pods`: rekindle evicts the pods behind the template.
    Evict,
}

/// How `obj`'s pods restart; `enabled` is `--pod-restarts`.
pub fn restarts(obj: &Value, kind: WorkloadKind, enabled: bool) -> Restarts {
    if !matches!(kind, WorkloadKind::StatefulSet | WorkloadKind::DaemonSet) {
        return Restarts::Controller;
    }
    let on_delete =
        refs::at(obj, "/spec/updateStrategy/type").and_then(Value::as_str) == Some("OnDelete");
    if !on_delete {
        Restarts::Controller
    } else if enabled && annotation(obj, RESTART_ANNOTATION) == Some("pods") {
        Restarts::Evict
    } else {
        Restarts::Manual
    }
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    refs::at(obj, "/metadata/annotations")?.get(key)?.as_str()
}

/// `rekindle.io/max-unavailable` of `obj` for `desired` pods: a positive number, or a percentage of
/// `desired` rounded down (at least 1). Absent: 1. Invalid: an error saying why (the walk then uses 1).
pub fn max_unavailable(obj: &Value, desired: usize) -> Result<usize, String> {
    let Some(raw) = annotation(obj, MAX_UNAVAILABLE_ANNOTATION) else {
        return Ok(1);
    };
    let invalid = || {
        format!("{MAX_UNAVAILABLE_ANNOTATION}: {raw:?} is not a positive number or a percentage (1..100%)")
    };
    let value = raw.trim();
    if let Some(percent) = value.strip_suffix('%') {
        let p: usize = percent.parse().map_err(|_| invalid())?;
        if p == 0 || p > 100 {
            return Err(invalid());
        }
        return Ok((desired * p / 100).max(1));
    }
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(invalid()),
    }
}

/// The markers of the workload's pod template, to compare its pods with ([`PodState::of`]).
pub type TemplateMarkers = Vec<(ResourceRef, Option<String>)>;

pub fn template_markers(cfg: &PlanConfig, workload: &Value, kind: WorkloadKind) -> TemplateMarkers {
    plan::markers(cfg, workload, kind)
}

/// Whether `pod` runs older config than its workload's template: a marker the template carries that
/// the pod does not carry, or carries at another hash. Markers of StatefulSets and DaemonSets live in
/// the pod template, which the pod copies (env vars and annotations alike); the pod's are read the
/// same way, from the pod as the template of a workload of `kind`.
pub fn pod_behind(
    cfg: &PlanConfig,
    template: &TemplateMarkers,
    kind: WorkloadKind,
    pod: &Value,
) -> bool {
    let as_template = serde_json::json!({
        "metadata": {"annotations": refs::at(pod, "/metadata/annotations").cloned().unwrap_or(Value::Null)},
        "spec": pod.get("spec").cloned().unwrap_or(Value::Null),
    });
    let running = plan::markers(cfg, &kind.under_template_path(as_template), kind);
    template.iter().any(|(r, wanted)| {
        wanted.as_ref().is_some_and(|wanted| {
            let carried = running
                .iter()
                .find(|(p, _)| p == r)
                .and_then(|(_, m)| m.as_ref());
            carried != Some(wanted)
        })
    })
}

/// The workload's `spec.selector` as a label selector query (`matchLabels` and `matchExpressions`);
/// `None` when it has none, or one this cannot express (the walk then waits, it never guesses).
pub fn selector(obj: &Value) -> Option<String> {
    let selector = refs::at(obj, "/spec/selector")?;
    let mut terms: Vec<String> = Vec::new();
    if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            terms.push(format!("{k}={}", v.as_str()?));
        }
    }
    for e in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key")?.as_str()?;
        let values = || -> Option<String> {
            let values: Option<Vec<&str>> = e
                .get("values")?
                .as_array()?
                .iter()
                .map(Value::as_str)
                .collect();
            Some(values?.join(","))
        };
        terms.push(match e.get("operator")?.as_str()? {
            "In" => format!("{key} in ({})", values()?),
            "NotIn" => format!("{key} notin ({})", values()?),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => return None,
        });
    }
    (!terms.is_empty()).then(|| terms.join(","))
}

/// How many pods the workload wants: a StatefulSet's replicas, a DaemonSet's scheduled pods.
pub fn desired_pods(obj: &Value, kind: WorkloadKind) -> usize {
    let pointer = match kind {
        WorkloadKind::DaemonSet => "/status/desiredNumberScheduled",
        _ => "/spec/replicas",
    };
    let default = if kind == WorkloadKind::DaemonSet {
        0
    } else {
        1
    };
    refs::at(obj, pointer)
        .and_then(Value::as_u64)
        .map_or(default, |n| n as usize)
}

/// Whether `pod` belongs to the workload whose uid is `owner`: its controller owner reference.
pub fn owned_by(pod: &Value, owner: &str) -> bool {
    refs::at(pod, "/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| {
            r.get("controller").and_then(Value::as_bool) == Some(true)
                && r.get("uid").and_then(Value::as_str) == Some(owner)
        })
}

/// What the walk needs of one pod of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    pub name: String,
    /// Evicted on this uid: a StatefulSet's replacement has the same name.
    pub uid: Option<String>,
    /// Its `Ready` condition is true.
    pub ready: bool,
    /// It is being deleted.
    pub terminating: bool,
    /// It runs older config than the template ([`pod_behind`]).
    pub behind: bool,
}

impl PodState {
    pub fn of(
        cfg: &PlanConfig,
        template: &TemplateMarkers,
        kind: WorkloadKind,
        pod: &Value,
    ) -> Self {
        Self::with(pod, pod_behind(cfg, template, kind, pod))
    }

    /// `pod`, `behind` or not as the caller found it.
    pub fn with(pod: &Value, behind: bool) -> Self {
        let text = |pointer: &str| {
            refs::at(pod, pointer)
                .and_then(Value::as_str)
                .map(String::from)
        };
        Self {
            name: text("/metadata/name").unwrap_or_default(),
            uid: text("/metadata/uid"),
            ready: ready(pod),
            terminating: refs::at(pod, "/metadata/deletionTimestamp").is_some(),
            behind,
        }
    }
}

fn ready(pod: &Value) -> bool {
    refs::at(pod, "/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
}

/// The next step of a walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Every pod runs the template's config and is Ready.
    Done,
    /// Nothing may be evicted now: `waiting_for` names what the walk waits for.
    Wait { waiting_for: String },
    /// Evict these pods, in this order.
    Evict(Vec<String>),
}

/// The next step for a workload that wants `desired` pods, of which `pods` exist, with at most
/// `max_unavailable` down at once. A pod behind that is not Ready is down already: it is evicted
/// first, whatever the others do, since replacing it takes nothing more down. Pods are evicted by
/// descending ordinal (a StatefulSet's rolling order), then by name.
pub fn step(desired: usize, pods: &[PodState], max_unavailable: usize) -> Step {
    let mut behind: Vec<&PodState> = pods.iter().filter(|p| p.behind && !p.terminating).collect();
    behind.sort_by(|a, b| {
        ordinal(&b.name)
            .cmp(&ordinal(&a.name))
            .then_with(|| a.name.cmp(&b.name))
    });
    let up = pods.iter().filter(|p| p.ready && !p.terminating).count();
    if let Some(down) = behind.iter().find(|p| !p.ready) {
        return Step::Evict(vec![down.name.clone()]);
    }
    if behind.is_empty() && up >= desired {
        return Step::Done;
    }
    let unavailable = desired.saturating_sub(up);
    let room = max_unavailable.saturating_sub(unavailable);
    if room == 0 || behind.is_empty() {
        return Step::Wait {
            waiting_for: waiting_for(desired, pods),
        };
    }
    Step::Evict(behind.iter().take(room).map(|p| p.name.clone()).collect())
}

/// What keeps pods unavailable: the first pod terminating or not Ready, or the pods not created yet.
fn waiting_for(desired: usize, pods: &[PodState]) -> String {
    let mut sorted: Vec<&PodState> = pods.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(p) = sorted.iter().find(|p| p.terminating) {
        return format!("pod {} to terminate", p.name);
    }
    if let Some(p) = sorted.iter().find(|p| !p.ready) {
        return format!("pod {} to be Ready", p.name);
    }
    let alive = pods.iter().filter(|p| !p.terminating).count();
    format!(
        "{} of {desired} pods to be created",
        desired.saturating_sub(alive)
    )
}

/// The ordinal of a StatefulSet pod (`web-2` → 2); pods without one sort first.
fn ordinal(name: &str) -> Option<u64> {
    name.rsplit_once('-')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::plan::Strategy;
    use crate::core::pod_groups;
    use crate::core::policy::CONFIG_HASHES_ANNOTATION;
    use serde_json::json;

    fn pod(name: &str, ready: bool, terminating: bool, behind: bool) -> PodState {
        PodState {
            name: name.into(),
            uid: None,
            ready,
            terminating,
            behind,
        }
    }

    #[test]
    fn a_terminating_pod_is_wanted_until_it_is_gone() {
        // db-0 was evicted and still terminates; its namesake comes only once it is gone. Counting
        // the pods alive (2) would allow the next eviction with 2 of 3 up.
        let pods = [
            pod("db-0", false, true, true),
            pod("db-1", true, false, true),
            pod("db-2", true, false, true),
        ];
        assert_eq!(pod_groups::wanted(0, &pods), 3);
        assert!(matches!(
            step(pod_groups::wanted(0, &pods), &pods, 1),
            Step::Wait { .. }
        ));
        assert!(
            matches!(step(2, &pods, 1), Step::Evict(_)),
            "what counting the alive would do"
        );
        // Gone, and its replacement Ready and current: the walk goes on, at 3 wanted.
        let pods = [
            pod("db-0", true, false, false),
            pod("db-1", true, false, true),
            pod("db-2", true, false, true),
        ];
        assert_eq!(
            step(pod_groups::wanted(3, &pods), &pods, 1),
            Step::Evict(vec!["db-2".into()])
        );
        // An owner that makes the replacement under a new name at once: 4 pods while the evicted one
        // terminates, 3 wanted again once it is gone (never held by the count of a pod that left).
        let during = [
            pod("op-a", false, true, true),
            pod("op-d", true, false, false),
            pod("op-b", true, false, true),
            pod("op-c", true, false, true),
        ];
        assert!(matches!(
            step(pod_groups::wanted(3, &during), &during, 1),
            Step::Wait { .. }
        ));
        let after = &during[1..];
        assert!(matches!(
            step(pod_groups::wanted(3, after), after, 1),
            Step::Evict(_)
        ));
    }

    #[test]
    fn only_on_delete_statefulsets_and_daemonsets_opted_in_restart_pods() {
        let obj = |strategy: &str, restart: Option<&str>| {
            let mut annotations = serde_json::Map::new();
            if let Some(r) = restart {
                annotations.insert(RESTART_ANNOTATION.into(), r.into());
            }
            json!({"metadata": {"annotations": annotations}, "spec": {"updateStrategy": {"type": strategy}}})
        };
        let sts = WorkloadKind::StatefulSet;
        assert_eq!(
            restarts(&obj("OnDelete", Some("pods")), sts, true),
            Restarts::Evict
        );
        assert_eq!(
            restarts(
                &obj("OnDelete", Some("pods")),
                WorkloadKind::DaemonSet,
                true
            ),
            Restarts::Evict
        );
        assert_eq!(
            restarts(&obj("OnDelete", Some("pods")), sts, false),
            Restarts::Manual,
            "--pod-restarts=false"
        );
        assert_eq!(
            restarts(&obj("OnDelete", None), sts, true),
            Restarts::Manual
        );
        assert_eq!(
            restarts(&obj("OnDelete", Some("yes")), sts, true),
            Restarts::Manual
        );
        assert_eq!(
            restarts(&obj("RollingUpdate", Some("pods")), sts, true),
            Restarts::Controller
        );
        assert_eq!(
            restarts(&json!({}), sts, true),
            Restarts::Controller,
            "RollingUpdate is the default"
        );
        assert_eq!(
            restarts(
                &obj("OnDelete", Some("pods")),
                WorkloadKind::Deployment,
                true
            ),
            Restarts::Controller
        );
    }

    #[test]
    fn max_unavailable_takes_a_number_or_a_percentage() {
        let obj = |v: &str| json!({"metadata": {"annotations": {MAX_UNAVAILABLE_ANNOTATION: v}}});
        assert_eq!(max_unavailable(&json!({}), 3), Ok(1));
        assert_eq!(max_unavailable(&obj("2"), 3), Ok(2));
        assert_eq!(max_unavailable(&obj("50%"), 5), Ok(2));
        assert_eq!(max_unavailable(&obj("10%"), 3), Ok(1), "at least one");
        for bad in ["0", "-1", "two", "0%", "150%", ""] {
            let err = max_unavailable(&obj(bad), 3).unwrap_err();
            assert!(err.contains(MAX_UNAVAILABLE_ANNOTATION), "{bad}: {err}");
        }
    }

    #[test]
    fn a_pod_is_behind_when_a_template_marker_differs_or_is_missing() {
        let workload = json!({"spec": {"template": {"spec": {"containers": [{
            "name": "app",
            "envFrom": [{"configMapRef": {"name": "cfg"}}],
            "env": [{"name": "STAKATER_CFG_CONFIGMAP", "value": "new"}]
        }]}}}});
        let pod = |marker: Option<&str>| {
            let env: Vec<Value> = marker
                .map(|m| json!({"name": "STAKATER_CFG_CONFIGMAP", "value": m}))
                .into_iter()
                .collect();
            json!({"metadata": {"name": "db-0"}, "spec": {"containers": [{
                "name": "app", "envFrom": [{"configMapRef": {"name": "cfg"}}], "env": env
            }]}})
        };
        let cfg = PlanConfig::default();
        let sts = WorkloadKind::StatefulSet;
        assert!(!pod_behind(
            &cfg,
            &template_markers(&cfg, &workload, sts),
            sts,
            &pod(Some("new"))
        ));
        assert!(pod_behind(
            &cfg,
            &template_markers(&cfg, &workload, sts),
            sts,
            &pod(Some("old"))
        ));
        assert!(pod_behind(
            &cfg,
            &template_markers(&cfg, &workload, sts),
            sts,
            &pod(None)
        ));
        // The annotations strategy: the marker is the template's annotation, copied to the pod.
        let annotated = json!({"spec": {"template": {
            "metadata": {"annotations": {CONFIG_HASHES_ANNOTATION: "{\"configmap/cfg\":\"new\"}"}},
            "spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}
        }}});
        let cfg = PlanConfig {
            strategy: Strategy::Annotations,
            ..Default::default()
        };
        let annotated_pod = |hash: &str| {
            json!({"metadata": {"annotations": {CONFIG_HASHES_ANNOTATION: format!("{{\"configmap/cfg\":\"{hash}\"}}")}},
                   "spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}})
        };
        assert!(!pod_behind(
            &cfg,
            &template_markers(&cfg, &annotated, sts),
            sts,
            &annotated_pod("new")
        ));
        assert!(pod_behind(
            &cfg,
            &template_markers(&cfg, &annotated, sts),
            sts,
            &annotated_pod("old")
        ));
        // A template without markers (never reloaded) leaves every pod as it is.
        let unmarked = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}}});
        let cfg = PlanConfig::default();
        assert!(!pod_behind(
            &cfg,
            &template_markers(&cfg, &unmarked, sts),
            sts,
            &pod(Some("old"))
        ));
    }

    #[test]
    fn the_selector_is_written_as_a_label_query() {
        let obj = json!({"spec": {"selector": {
            "matchLabels": {"app": "db"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"}
            ]
        }}});
        assert_eq!(
            selector(&obj).as_deref(),
            Some("app=db,tier in (a,b),!canary")
        );
        assert_eq!(selector(&json!({"spec": {}})), None);
        let odd =
            json!({"spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}});
        assert_eq!(
            selector(&odd),
            None,
            "an operator it cannot write is not guessed"
        );
    }

    #[test]
    fn pods_are_the_workloads_by_controller_owner_uid() {
        let pod = |uid: &str, controller: bool| json!({"metadata": {"ownerReferences": [{"uid": uid, "controller": controller}]}});
        assert!(owned_by(&pod("u1", true), "u1"));
        assert!(!owned_by(&pod("u1", false), "u1"));
        assert!(!owned_by(&pod("u2", true), "u1"));
        assert!(!owned_by(&json!({}), "u1"));
    }

    #[test]
    fn the_walk_evicts_one_ready_pod_at_a_time_highest_ordinal_first() {
        let pods = [
            pod("db-0", true, false, true),
            pod("db-1", true, false, true),
            pod("db-2", true, false, true),
        ];
        assert_eq!(step(3, &pods, 1), Step::Evict(vec!["db-2".into()]));
        assert_eq!(
            step(3, &pods, 2),
            Step::Evict(vec!["db-2".into(), "db-1".into()])
        );
        // db-2 evicted and terminating: nothing more goes down.
        let terminating = [
            pods[0].clone(),
            pods[1].clone(),
            pod("db-2", true, true, true),
        ];
        assert_eq!(
            step(3, &terminating, 1),
            Step::Wait {
                waiting_for: "pod db-2 to terminate".into()
            }
        );
        // Gone, not re-created yet.
        assert_eq!(
            step(3, &pods[..2], 1),
            Step::Wait {
                waiting_for: "1 of 3 pods to be created".into()
            }
        );
        // Its replacement runs the new config but is not Ready yet.
        let starting = [
            pods[0].clone(),
            pods[1].clone(),
            pod("db-2", false, false, false),
        ];
        assert_eq!(
            step(3, &starting, 1),
            Step::Wait {
                waiting_for: "pod db-2 to be Ready".into()
            }
        );
        let replaced = [
            pods[0].clone(),
            pods[1].clone(),
            pod("db-2", true, false, false),
        ];
        assert_eq!(step(3, &replaced, 1), Step::Evict(vec!["db-1".into()]));
        let all_new = [
            pod("db-0", true, false, false),
            pod("db-1", true, false, false),
            pod("db-2", true, false, false),
        ];
        assert_eq!(step(3, &all_new, 1), Step::Done);
        assert_eq!(step(0, &[], 1), Step::Done);
    }

    #[test]
    fn a_pod_behind_that_is_down_already_goes_first() {
        let pods = [
            pod("db-0", true, false, true),
            pod("db-1", false, false, true),
            pod("db-2", true, false, false),
        ];
        assert_eq!(step(3, &pods, 1), Step::Evict(vec!["db-1".into()]));
        // A pod up to date but not Ready holds the others: never two down.
        let pods = [
            pod("db-0", true, false, true),
            pod("db-1", false, false, false),
        ];
        assert_eq!(
            step(2, &pods, 1),
            Step::Wait {
                waiting_for: "pod db-1 to be Ready".into()
            }
        );
    }
}
