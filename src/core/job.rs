//! Jobs a reload creates: the Job a CronJob reload starts, and a Job made fit for re-creation.

use serde_json::{json, Value};

/// The Job a CronJob reload creates: the job template with its markers, `instantiate: manual`, a
/// controller ownerRef, and a name derived from the CronJob's name and the new hashes.
pub fn job_from_cronjob(cronjob: &Value, name: &str, hashes: &str) -> Option<Value> {
    let template = cronjob.pointer("/spec/jobTemplate")?;
    let suffix = &crate::core::hash::sha1_hex(hashes.as_bytes())[..8];
    let base: String = name.chars().take(63 - 9).collect();
    let job_name = format!("{}-{suffix}", base.trim_end_matches(['-', '.']));
    let mut annotations = template
        .pointer("/metadata/annotations")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    annotations["cronjob.kubernetes.io/instantiate"] = json!("manual");
    Some(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": cronjob.pointer("/metadata/namespace"),
            "labels": template.pointer("/metadata/labels").cloned().unwrap_or(Value::Null),
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "CronJob", "name": name,
                "uid": cronjob.pointer("/metadata/uid"), "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({}))
    }))
}

/// A Job's JSON made fit for re-creation: server-set fields and the controller's selector labels removed.
pub fn strip_job(job: &Value) -> Value {
    let mut out = job.clone();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        for f in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            meta.remove(f);
        }
    }
    if let Some(obj) = out.as_object_mut() {
        obj.remove("status");
    }
    if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("selector");
        spec.remove("manualSelector");
    }
    for labels in ["/spec/template/metadata/labels", "/metadata/labels"] {
        if let Some(map) = out.pointer_mut(labels).and_then(Value::as_object_mut) {
            for l in [
                "controller-uid",
                "job-name",
                "batch.kubernetes.io/controller-uid",
                "batch.kubernetes.io/job-name",
            ] {
                map.remove(l);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cronjob() -> Value {
        json!({
            "metadata": {"name": "nightly", "namespace": "ns", "uid": "u-1"},
            "spec": {"jobTemplate": {
                "metadata": {"labels": {"app": "a"}, "annotations": {"team": "x"}},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
            }}
        })
    }

    #[test]
    fn a_cronjobs_job_is_named_by_the_hashes_owned_and_marked_manual() {
        let job = job_from_cronjob(&cronjob(), "nightly", "abc").unwrap();
        let suffix = &crate::core::hash::sha1_hex(b"abc")[..8];
        assert_eq!(job["metadata"]["name"], format!("nightly-{suffix}"));
        assert_eq!(job["metadata"]["namespace"], "ns");
        assert_eq!(job["metadata"]["labels"]["app"], "a");
        assert_eq!(job["metadata"]["annotations"]["team"], "x");
        assert_eq!(
            job["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"],
            "manual"
        );
        let owner = &job["metadata"]["ownerReferences"][0];
        assert_eq!(
            (&owner["kind"], &owner["uid"], &owner["controller"]),
            (&json!("CronJob"), &json!("u-1"), &json!(true))
        );
        assert_eq!(
            job["spec"]["template"]["spec"]["containers"][0]["name"],
            "c"
        );
        // Same hashes, same name (a retried create meets AlreadyExists); other hashes, another Job.
        assert_eq!(
            job_from_cronjob(&cronjob(), "nightly", "abc").unwrap()["metadata"]["name"],
            job["metadata"]["name"]
        );
        assert_ne!(
            job_from_cronjob(&cronjob(), "nightly", "abd").unwrap()["metadata"]["name"],
            job["metadata"]["name"]
        );
        assert!(job_from_cronjob(&json!({"spec": {}}), "nightly", "abc").is_none());
    }

    #[test]
    fn long_cronjob_names_are_cut_to_a_valid_job_name() {
        let name = format!("{}-.x", "a".repeat(52));
        let job = job_from_cronjob(&cronjob(), &name, "abc").unwrap();
        let job_name = job["metadata"]["name"].as_str().unwrap();
        assert!(job_name.len() <= 63, "{job_name}");
        assert!(
            !job_name.contains("--") && !job_name.contains(".-"),
            "{job_name}"
        );
    }

    #[test]
    fn a_stripped_job_keeps_its_spec_and_loses_what_the_server_set() {
        let job = json!({
            "metadata": {"name": "j", "uid": "u", "resourceVersion": "9", "creationTimestamp": "t",
                "managedFields": [], "generation": 2,
                "labels": {"app": "a", "controller-uid": "u", "batch.kubernetes.io/job-name": "j"}},
            "spec": {"selector": {"matchLabels": {"controller-uid": "u"}}, "manualSelector": false,
                "template": {"metadata": {"labels": {"job-name": "j", "app": "a",
                    "batch.kubernetes.io/controller-uid": "u"}},
                    "spec": {"containers": [{"name": "c"}]}}},
            "status": {"succeeded": 1}
        });
        assert_eq!(
            strip_job(&job),
            json!({
                "metadata": {"name": "j", "labels": {"app": "a"}},
                "spec": {"template": {"metadata": {"labels": {"app": "a"}},
                    "spec": {"containers": [{"name": "c"}]}}}
            })
        );
    }
}
