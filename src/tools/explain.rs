//! `rekindle explain`: what rekindle would do to a workload for a change of one resource, and why.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use crate::config::{EventArg, Output};
use crate::core::keys;
use crate::core::patch;
use crate::core::plan::{self, Change, Event, PlanConfig};
use crate::core::policy::ResourceFlags;
use crate::core::refs::ResourceRef;
use crate::core::release::{Release, HALTED_ANNOTATION};
use crate::core::restart::{self, Restarts, RESTART_ANNOTATION};
use crate::core::window::{own_window, window_of, Windows};
use crate::core::WorkloadKind;

use super::{hash_document, meta_str, read_documents};

fn single(path: &Path, what: &str) -> Result<Value> {
    let mut docs = read_documents(path)?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        n => bail!(
            "{}: expected exactly one {what} document, found {n}",
            path.display()
        ),
    }
}

/// Builds the explanation object of `rekindle explain -o json`. `default_window` is
/// `--reload-window`.
pub fn explain(
    cfg: &PlanConfig,
    default_window: Option<&Windows>,
    workload: &Value,
    changed: &Value,
    event: EventArg,
    now: i64,
) -> Result<Value> {
    let kind_name = workload
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("the workload has no kind"))?;
    let kind: WorkloadKind = kind_name.parse()?;
    let res = hash_document(changed)?;
    let flags = ResourceFlags::from_annotations(&cfg.policy.keys, &res.annotations);
    let namespace = res
        .namespace
        .clone()
        .or_else(|| meta_str(workload, "namespace"))
        .unwrap_or_default();
    let event = match event {
        EventArg::Update => Event::Update,
        EventArg::Create => Event::Create,
        EventArg::Delete => Event::Delete,
    };
    let changed_ref = ResourceRef {
        kind: res.resource_kind,
        name: res.resource_name.as_str().into(),
    };
    // Used keys (behaviour §14): the manifest holds the values, so the digests are always there.
    let read = plan::keys_read(cfg, workload, kind, &changed_ref);
    let owed = keys::owed(read.as_ref(), &res.hash, res.digests.as_ref());
    let (hash, also_current) = match &owed {
        Some(o) if event != Event::Delete => (o.write.as_str(), o.also_current.as_deref()),
        _ => (res.hash.as_str(), None),
    };
    let change = Change {
        kind: res.resource_kind,
        name: &res.resource_name,
        namespace: &namespace,
        hash,
        flags,
        event,
        also_current,
    };
    let p = plan::plan(cfg, workload, kind, &change, now);
    let patch = if p.changes.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(patch::render(workload, kind, &p.changes)?)?
    };
    // The namespace's default is not in the manifests: the workload's own window, or the flag's.
    let window = match window_of(own_window(workload), None, default_window) {
        Ok(None) => Value::Null,
        Ok(Some(w)) => {
            let at = jiff::Timestamp::from_second(now).unwrap_or_default();
            let opens = w.opens_at(at);
            json!({"value": w.to_string(), "open": opens.is_none(), "opensAt": opens.map(|t| t.to_string())})
        }
        Err(e) => json!({"error": e.to_string()}),
    };
    // Canaries and halts as far as this one workload tells: the others, and the rollout budget, are
    // known to the running leader only.
    let release = Release::of(workload, kind, cfg.pod_restarts);
    // Who restarts the pods once the template is written.
    let pods = match restart::restarts(workload, kind, cfg.pod_restarts) {
        Restarts::Controller => {
            json!({"restartedBy": "controller", "note": "its controller rolls the pods"})
        }
        Restarts::Manual => json!({"restartedBy": "nobody", "note": format!(
            "its updateStrategy is OnDelete: no pod restarts until it is deleted; annotate {RESTART_ANNOTATION}: pods to have rekindle evict them one at a time"
        )}),
        Restarts::Evict => {
            json!({"restartedBy": "rekindle", "note": "rekindle evicts the pods running older config, one at a time within their PodDisruptionBudgets"})
        }
    };
    let mode = keys::reload_on(workload, kind, cfg.reload_on);
    let keys = json!({
        "reloadOn": mode.as_ref().map_or(cfg.reload_on, |m| *m).as_str(),
        "invalid": mode.as_ref().err(),
        // null: every key counts.
        "read": read,
        "marker": hash,
    });
    let halt = release.halted.as_deref().map(|raw| match release.halt() {
        Some(h) => json!({"reason": h.reason, "holdsThisChange": h.holds(&changed_ref, &res.hash)}),
        None => json!({"error": format!("{HALTED_ANNOTATION} is not rekindle's halt: {raw}")}),
    });
    Ok(json!({
        "workload": {"kind": kind_name, "namespace": meta_str(workload, "namespace"), "name": meta_str(workload, "name")},
        "resource": {"kind": res.resource_kind.kind_name(), "namespace": res.namespace, "name": res.resource_name, "hash": res.hash},
        "reload": p.decision.reload,
        "reason": p.decision.reason.as_str(),
        "action": p.action,
        "container": p.container.map(|c| c.name),
        "patch": patch,
        "window": window,
        "pods": pods,
        "keys": keys,
        "canary": release.canary,
        "halt": halt,
        "invalidPatterns": p.decision.invalid_patterns.iter().map(|i| json!({"annotation": i.annotation, "pattern": i.pattern, "error": i.error})).collect::<Vec<_>>(),
    }))
}

pub fn run_explain(
    cfg: &PlanConfig,
    default_window: Option<&Windows>,
    workload: &Path,
    changed: &Path,
    event: EventArg,
    output: Output,
) -> Result<()> {
    let w = single(workload, "workload")?;
    let c = single(changed, "changed resource")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let e = explain(cfg, default_window, &w, &c, event, now)?;
    match output {
        Output::Json => println!("{e}"),
        Output::Text => {
            let w = &e["workload"];
            let r = &e["resource"];
            println!(
                "workload:  {}/{}/{}",
                w["kind"].as_str().unwrap_or(""),
                w["namespace"].as_str().unwrap_or("-"),
                w["name"].as_str().unwrap_or("")
            );
            println!(
                "resource:  {}/{}/{} hash {}",
                r["kind"].as_str().unwrap_or(""),
                r["namespace"].as_str().unwrap_or("-"),
                r["name"].as_str().unwrap_or(""),
                r["hash"].as_str().unwrap_or("")
            );
            println!(
                "reload:    {} ({})",
                if e["reload"] == true { "yes" } else { "no" },
                e["reason"].as_str().unwrap_or("")
            );
            println!("action:    {}", e["action"].as_str().unwrap_or(""));
            if let Some(c) = e["container"].as_str() {
                println!("container: {c}");
            }
            let keys = &e["keys"];
            if let Some(read) = keys["read"].as_array() {
                let names: Vec<&str> = read.iter().filter_map(Value::as_str).collect();
                println!(
                    "keys:      used-keys: reads {} of {}; a change of only other keys reloads nothing",
                    if names.is_empty() { "none".to_string() } else { names.join(", ") },
                    r["name"].as_str().unwrap_or("")
                );
            } else if keys["reloadOn"] == "used-keys" {
                println!("keys:      used-keys, but it takes the whole object: any key reloads");
            }
            if let Some(invalid) = keys["invalid"].as_str() {
                println!(
                    "warning:   invalid rekindle.io/reload-on {invalid:?}: using {}",
                    keys["reloadOn"].as_str().unwrap_or("")
                );
            }
            if e["pods"]["restartedBy"] != "controller" {
                println!("pods:      {}", e["pods"]["note"].as_str().unwrap_or(""));
            }
            let window = &e["window"];
            if let Some(error) = window["error"].as_str() {
                println!("warning:   {error}");
            } else if let Some(value) = window["value"].as_str() {
                match window["opensAt"].as_str() {
                    Some(at) if e["reload"] == true => {
                        println!("window:    closed ({value}): deferred until {at}")
                    }
                    Some(at) => println!("window:    closed ({value}), opens {at}"),
                    None => println!("window:    open ({value})"),
                }
            }
            if e["canary"] == true {
                println!("canary:    reloads before the workloads owed the same change that are not canaries");
            }
            let halt = &e["halt"];
            if let Some(error) = halt["error"].as_str() {
                println!("warning:   {error}");
            } else if halt["holdsThisChange"] == true {
                println!(
                    "halted:    this change is halted here ({}): reloads still owed for it wait until this workload is healthy again",
                    halt["reason"].as_str().unwrap_or("")
                );
            } else if !halt.is_null() {
                println!(
                    "halted:    an earlier change ({}), not this one",
                    halt["reason"].as_str().unwrap_or("")
                );
            }
            for i in e["invalidPatterns"].as_array().into_iter().flatten() {
                println!(
                    "warning:   invalid pattern {} in {}: {}",
                    i["pattern"],
                    i["annotation"],
                    i["error"].as_str().unwrap_or("")
                );
            }
            if !e["patch"].is_null() {
                println!("patch:     {}", serde_json::to_string_pretty(&e["patch"])?);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_reports_patch_and_already_current() {
        let cfg = PlanConfig::default();
        let workload = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ns", "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "c"}}]}]}}}});
        let cm = json!({"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}});
        let e = explain(&cfg, None, &workload, &cm, EventArg::Update, 0).unwrap();
        assert!(e["window"].is_null(), "no window: reloads start at once");
        assert_eq!(e["reload"], true);
        assert_eq!(e["reason"], "auto");
        assert_eq!(e["action"], "patch");
        assert_eq!(e["container"], "app");
        let ops: json_patch::Patch = serde_json::from_value(e["patch"].clone()).unwrap();
        let mut after = workload.clone();
        json_patch::patch(&mut after, &ops).unwrap();
        let again = explain(&cfg, None, &after, &cm, EventArg::Update, 0).unwrap();
        assert_eq!(again["reload"], false);
        assert_eq!(again["reason"], "already-current");
        assert!(again["patch"].is_null());
    }

    /// `used-keys`: the keys read are named, a change of another key reloads nothing (and says why),
    /// a change of a read key reloads with the used-keys hash.
    #[test]
    fn explain_names_the_keys_read_and_skips_other_keys() {
        let cfg = PlanConfig::default();
        let workload = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ns", "annotations": {
                "reloader.stakater.com/auto": "true", "rekindle.io/reload-on": "used-keys"}},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "a"}}}]}]}}}});
        let cm = |a: &str, b: &str| json!({"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": a, "b": b}});
        let e = explain(&cfg, None, &workload, &cm("1", "x"), EventArg::Update, 0).unwrap();
        assert_eq!(e["keys"]["reloadOn"], "used-keys");
        assert_eq!(e["keys"]["read"], json!(["a"]));
        let want = keys::used_keys_hash([("a", b"1".as_slice())]);
        assert_eq!(e["keys"]["marker"], want.as_str());
        assert_eq!(e["reload"], true, "no marker yet");
        let ops: json_patch::Patch = serde_json::from_value(e["patch"].clone()).unwrap();
        let mut after = workload.clone();
        json_patch::patch(&mut after, &ops).unwrap();
        assert!(after.to_string().contains(&want), "{after}");
        let other = explain(&cfg, None, &after, &cm("1", "y"), EventArg::Update, 0).unwrap();
        assert_eq!(other["reload"], false);
        assert_eq!(other["reason"], "unused-keys");
        let used = explain(&cfg, None, &after, &cm("2", "y"), EventArg::Update, 0).unwrap();
        assert_eq!(used["reload"], true);
        // The same workload in any-key mode reloads for the other key.
        let any = PlanConfig::default();
        let mut plain = after.clone();
        plain["metadata"]["annotations"]["rekindle.io/reload-on"] = json!("any-key");
        let e = explain(&any, None, &plain, &cm("1", "y"), EventArg::Update, 0).unwrap();
        assert_eq!(
            (e["reload"].clone(), e["keys"]["read"].clone()),
            (json!(true), Value::Null)
        );
    }

    /// Who restarts the pods: an OnDelete StatefulSet's nobody, unless it opts in (and `--pod-restarts`).
    #[test]
    fn explain_says_who_restarts_the_pods() {
        let sts = |annotations: Value| {
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "db", "namespace": "ns", "annotations": annotations},
                "spec": {"updateStrategy": {"type": "OnDelete"},
                    "template": {"spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "c"}}]}]}}}})
        };
        let cm = json!({"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}});
        let on = PlanConfig {
            pod_restarts: true,
            ..Default::default()
        };
        let manual = sts(json!({"reloader.stakater.com/auto": "true"}));
        let e = explain(&on, None, &manual, &cm, EventArg::Update, 0).unwrap();
        assert_eq!(e["reload"], true, "the template is written all the same");
        assert_eq!(e["pods"]["restartedBy"], "nobody");
        assert!(e["pods"]["note"]
            .as_str()
            .unwrap()
            .contains(RESTART_ANNOTATION));
        let opted_in =
            sts(json!({"reloader.stakater.com/auto": "true", RESTART_ANNOTATION: "pods"}));
        let e = explain(&on, None, &opted_in, &cm, EventArg::Update, 0).unwrap();
        assert_eq!(e["pods"]["restartedBy"], "rekindle");
        let off = PlanConfig::default();
        let e = explain(&off, None, &opted_in, &cm, EventArg::Update, 0).unwrap();
        assert_eq!(e["pods"]["restartedBy"], "nobody", "--pod-restarts=false");
    }

    /// A reload outside the window is explained as deferred until it opens; the workload's own
    /// window wins over `--reload-window`.
    #[test]
    fn explain_reports_the_window_and_when_it_opens() {
        let cfg = PlanConfig::default();
        let workload = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ns", "annotations": {
                "reloader.stakater.com/auto": "true", "rekindle.io/reload-window": "Sat,Sun 02:00-04:00"}},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "c"}}]}]}}}});
        let cm = json!({"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}});
        let default: Windows = "* 00:00-23:59".parse().unwrap();
        // Wednesday 2026-12-02 12:00 UTC.
        let wednesday = 1_796_212_800;
        let e = explain(
            &cfg,
            Some(&default),
            &workload,
            &cm,
            EventArg::Update,
            wednesday,
        )
        .unwrap();
        assert_eq!(e["reload"], true);
        assert_eq!(
            e["window"],
            json!({"value": "Sat,Sun 02:00-04:00", "open": false, "opensAt": "2026-12-05T02:00:00Z"})
        );
    }

    /// A canary and a halt written on the workload are explained; a halt of an older change does not
    /// hold this one.
    #[test]
    fn explain_reports_a_canary_and_whether_a_halt_holds_the_change() {
        let cfg = PlanConfig::default();
        let cm = json!({"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}});
        let hash = hash_document(&cm).unwrap().hash;
        let workload = |halted_hash: &str| {
            let halt = json!({"reason": "progress_deadline",
                "changes": [{"kind": "ConfigMap", "name": "c", "hash": halted_hash}]});
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "d", "namespace": "ns", "annotations": {
                    "reloader.stakater.com/auto": "true", "rekindle.io/reload-canary": "true",
                    "rekindle.io/reload-halted": halt.to_string()}},
                "spec": {"template": {"spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": "c"}}]}]}}}})
        };
        let e = explain(&cfg, None, &workload(&hash), &cm, EventArg::Update, 0).unwrap();
        assert_eq!(e["canary"], true);
        assert_eq!(
            e["halt"],
            json!({"reason": "progress_deadline", "holdsThisChange": true})
        );
        let e = explain(&cfg, None, &workload("older"), &cm, EventArg::Update, 0).unwrap();
        assert_eq!(e["halt"]["holdsThisChange"], false);
    }
}
