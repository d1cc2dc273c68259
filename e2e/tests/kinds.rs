//! CronJob, Job and Argo Rollout reloads through the real apiserver (behaviour §9).

use std::time::Duration;

use anyhow::Result;
use e2e::rekindle::{Options, Rekindle};
use e2e::{
    admin_client, apply_value, apply_yaml, dynamic_api, get_json, wait_for, TestNamespace, TIMEOUT,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use rekindle::core::hash::configmap_hash_typed;
use rekindle::core::job::strip_job;
use rekindle::reload::recreate::{Record, Records, RECORD_LABEL};
use serde_json::{json, Value};

const CM: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config}\ndata: {greeting: hello}\n";

fn pod_template() -> Value {
    json!({"metadata": {"labels": {"app": "x"}}, "spec": {"restartPolicy": "Never",
        "containers": [{"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}})
}

async fn change_cm(client: &Client, ns: &str, value: &str) -> Result<String> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let cm = api
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"greeting": value}})),
        )
        .await?;
    Ok(configmap_hash_typed(&cm))
}

fn config_hashes(obj: &Value, pointer: &str) -> Value {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn cronjob_job_mode_creates_one_job_and_keeps_markers_in_metadata() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-cronjob").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    for (name, suspend) in [("nightly", false), ("paused", true)] {
        apply_value(&client, Some(&ns.name), json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": name, "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"schedule": "0 0 1 1 *", "suspend": suspend, "jobTemplate": {"spec": {"template": pod_template()}}}})).await?;
    }
    let cronjobs = dynamic_api(&client, "batch/v1", "CronJob", Some(&ns.name)).await?;
    let h1 = configmap_hash_typed(
        &Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
            .get("app-config")
            .await?,
    );
    let cj = get_json(&cronjobs, "nightly").await?;
    assert_eq!(
        config_hashes(&cj, "/metadata/annotations/rekindle.io~1config-hashes"),
        json!({"configmap/app-config": h1}),
        "stamped in metadata"
    );
    assert!(
        cj.pointer("/spec/jobTemplate/spec/template/spec/containers/0/env")
            .is_none(),
        "template untouched in job mode"
    );

    let handled = rk.handled().await?;
    let h2 = change_cm(&client, &ns.name, "changed").await?;
    let jobs = Api::<Job>::namespaced(client.clone(), &ns.name);
    let job = wait_for("a Job created from the CronJob", TIMEOUT, || async {
        Ok(jobs
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .next())
    })
    .await?;
    assert_eq!(
        job.annotations()
            .get("cronjob.kubernetes.io/instantiate")
            .map(String::as_str),
        Some("manual")
    );
    let owner = &job.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("CronJob", "nightly", Some(true))
    );
    let job_json = serde_json::to_value(&job)?;
    let env = job_json
        .pointer("/spec/template/spec/containers/0/env/0")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        env,
        json!({"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": h2})
    );
    wait_for(
        "the CronJob's metadata marker to carry the new hash",
        TIMEOUT,
        || async {
            let cj = get_json(&cronjobs, "nightly").await?;
            Ok(
                (config_hashes(&cj, "/metadata/annotations/rekindle.io~1config-hashes")
                    == json!({"configmap/app-config": h2}))
                .then_some(()),
            )
        },
    )
    .await?;
    rk.settled(handled + 1.0).await?;
    let all = jobs.list(&ListParams::default()).await?.items;
    assert_eq!(
        all.len(),
        1,
        "exactly one Job, none for the suspended CronJob: {:?}",
        all.iter().map(|j| j.name_any()).collect::<Vec<_>>()
    );
    let cj = get_json(&cronjobs, "nightly").await?;
    assert!(
        cj.pointer("/spec/jobTemplate/spec/template/spec/containers/0/env")
            .is_none(),
        "the CronJob's spec is unchanged"
    );
    // A restart of rekindle afterwards creates no second Job: the metadata markers are current.
    let mut rk = rk;
    rk.terminate().await?;
    rk.restart().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        jobs.list(&ListParams::default()).await?.items.len(),
        1,
        "no second Job after a restart"
    );
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn cronjob_template_mode_patches_the_job_template() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-cjtpl").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--cronjob-strategy=template"],
            ..Default::default()
        },
    )
    .await?;
    apply_value(
        &client,
        Some(&ns.name),
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": pod_template()}}}}),
    )
    .await?;
    let h2 = change_cm(&client, &ns.name, "changed").await?;
    let cronjobs = dynamic_api(&client, "batch/v1", "CronJob", Some(&ns.name)).await?;
    wait_for(
        "the job template to carry the new hash",
        TIMEOUT,
        || async {
            let cj = get_json(&cronjobs, "nightly").await?;
            Ok(
                (cj.pointer("/spec/jobTemplate/spec/template/spec/containers/0/env/0/value")
                    == Some(&json!(h2)))
                .then_some(()),
            )
        },
    )
    .await?;
    assert!(
        Api::<Job>::namespaced(client.clone(), &ns.name)
            .list(&ListParams::default())
            .await?
            .items
            .is_empty(),
        "no Job in template mode"
    );
    rk.stop().await?;
    ns.cleanup().await
}

/// The Job `migrate` (auto-annotated, using `app-config`): its API and first UID.
async fn create_job(client: &Client, ns: &str) -> Result<(Api<Job>, Option<String>)> {
    apply_value(
        client,
        Some(ns),
        json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"template": pod_template()}}),
    )
    .await?;
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    let uid = jobs.get("migrate").await?.uid();
    Ok((jobs, uid))
}

#[tokio::test]
async fn a_job_is_recreated_under_the_same_name() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-job").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let (jobs, first_uid) = create_job(&client, &ns.name).await?;
    let h2 = change_cm(&client, &ns.name, "changed").await?;
    let job = wait_for("the Job to be re-created", TIMEOUT, || async {
        Ok(jobs
            .get_opt("migrate")
            .await?
            .filter(|j| j.uid() != first_uid))
    })
    .await?;
    let v = serde_json::to_value(&job)?;
    assert_eq!(
        v.pointer("/spec/template/spec/containers/0/env/0/value"),
        Some(&json!(h2))
    );
    // A Job is re-created from the whole object, so it is read first (the metric says why).
    assert_eq!(
        rk.metric("rekindle_workload_reads_total{reason=\"kind\"}")
            .await?,
        1.0
    );
    rk.stop().await?;
    ns.cleanup().await
}

/// Two writers (two replicas without leader election) handle the same change of a Job's ConfigMap:
/// the delete is conditional on the UID each read, so the Job is re-created once, never twice.
#[tokio::test]
async fn two_writers_re_create_a_job_only_once() -> Result<()> {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, watcher};
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-job2").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let a = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            instance: "a",
            ..Default::default()
        },
    )
    .await?;
    let b = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            instance: "b",
            ..Default::default()
        },
    )
    .await?;
    let (jobs, first_uid) = create_job(&client, &ns.name).await?;
    let uids = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let seen = {
        let (jobs, uids) = (jobs.clone(), uids.clone());
        tokio::spawn(async move {
            let mut stream = watcher(jobs, watcher::Config::default()).boxed();
            while let Some(Ok(event)) = stream.next().await {
                if let watcher::Event::Apply(j) | watcher::Event::InitApply(j) = event {
                    uids.lock().unwrap().insert(j.uid());
                }
            }
        })
    };
    let handled = [a.handled().await?, b.handled().await?];
    let h2 = change_cm(&client, &ns.name, "changed").await?;
    wait_for("the Job to be re-created", TIMEOUT, || async {
        Ok(jobs.get_opt("migrate").await?.filter(|j| {
            j.uid() != first_uid
                && serde_json::to_value(j).ok().and_then(|v| {
                    v.pointer("/spec/template/spec/containers/0/env/0/value")
                        .cloned()
                }) == Some(json!(h2))
        }))
    })
    .await?;
    // Both writers have had their go at it once both are idle.
    a.settled(handled[0] + 1.0).await?;
    b.settled(handled[1] + 1.0).await?;
    seen.abort();
    let uids = uids.lock().unwrap().clone();
    assert_eq!(
        uids.len(),
        2,
        "the original Job and one re-creation: {uids:?}"
    );
    a.stop().await?;
    b.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn argo_rollout_restart_and_workload_ref() -> Result<()> {
    let client = admin_client().await?;
    let crd = std::fs::read_to_string(e2e::root().join("e2e/fixtures/crds/argo-rollouts.yaml"))?;
    apply_yaml(&client, None, &crd).await?;
    let ns = TestNamespace::new(&client, "e2e-rollout").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    wait_for("the Rollout CRD to be served", TIMEOUT, || async {
        Ok(
            dynamic_api(&client, "argoproj.io/v1alpha1", "Rollout", Some(&ns.name))
                .await
                .ok(),
        )
    })
    .await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--is-Argo-Rollouts=true"],
            ..Default::default()
        },
    )
    .await?;
    apply_value(&client, Some(&ns.name), json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "restart", "annotations": {"reloader.stakater.com/auto": "true", "reloader.stakater.com/rollout-strategy": "restart"}},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": pod_template()}})).await?;
    apply_value(
        &client,
        Some(&ns.name),
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "rolling", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": pod_template()}}),
    )
    .await?;
    apply_value(&client, Some(&ns.name), json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "by-ref", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "elsewhere"}}})).await?;
    let rollouts = dynamic_api(&client, "argoproj.io/v1alpha1", "Rollout", Some(&ns.name)).await?;
    // Wait until rekindle's watch has the three Rollouts (the optional API is discovered at start).
    rk.wait_indexed(3.0).await?;
    let h2 = change_cm(&client, &ns.name, "changed").await?;
    wait_for(
        "spec.restartAt and the metadata marker on the restart Rollout",
        TIMEOUT,
        || async {
            let ro = get_json(&rollouts, "restart").await?;
            let ok = ro.pointer("/spec/restartAt").is_some()
                && config_hashes(&ro, "/metadata/annotations/rekindle.io~1config-hashes")
                    == json!({"configmap/app-config": h2});
            Ok(ok.then_some(ro))
        },
    )
    .await?;
    wait_for(
        "the template marker on the rolling Rollout",
        TIMEOUT,
        || async {
            let ro = get_json(&rollouts, "rolling").await?;
            Ok(
                (ro.pointer("/spec/template/spec/containers/0/env/0/value") == Some(&json!(h2)))
                    .then_some(()),
            )
        },
    )
    .await?;
    let by_ref = get_json(&rollouts, "by-ref").await?;
    assert!(
        by_ref.pointer("/spec/template").is_none(),
        "a Rollout with workloadRef is left alone"
    );
    let (_, log) = (rk.metrics().await?, std::fs::read_to_string(&rk.log)?);
    assert!(!log.contains("panicked"), "no panic in rekindle's log");
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn deployment_config_is_reloaded_when_the_api_is_served() -> Result<()> {
    let client = admin_client().await?;
    apply_yaml(&client, None, &e2e::companions::deployment_config_crd()?).await?;
    let ns = TestNamespace::new(&client, "e2e-dc").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let dcs = wait_for("the DeploymentConfig CRD to be served", TIMEOUT, || async {
        Ok(dynamic_api(
            &client,
            "apps.openshift.io/v1",
            "DeploymentConfig",
            Some(&ns.name),
        )
        .await
        .ok())
    })
    .await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    apply_value(
        &client,
        Some(&ns.name),
        json!({"apiVersion": "apps.openshift.io/v1", "kind": "DeploymentConfig",
        "metadata": {"name": "legacy", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"replicas": 1, "selector": {"app": "x"}, "template": pod_template()}}),
    )
    .await?;
    rk.wait_indexed(1.0).await?;
    let h2 = change_cm(&client, &ns.name, "changed").await?;
    wait_for(
        "the DeploymentConfig's template to carry the new hash",
        TIMEOUT,
        || async {
            let dc = get_json(&dcs, "legacy").await?;
            Ok(
                (dc.pointer("/spec/template/spec/containers/0/env/0/value") == Some(&json!(h2)))
                    .then_some(()),
            )
        },
    )
    .await?;
    rk.stop().await?;
    ns.cleanup().await
}

/// Where the rekindle under test keeps its records: the chart's namespace in the chart-identity
/// run, else the test's own.
fn records_namespace(ns: &str) -> String {
    std::env::var("REKINDLE_E2E_POD_NAMESPACE").unwrap_or_else(|_| ns.to_string())
}

/// The records of re-creates of Jobs in `ns` (records of other tests' Jobs may share the namespace).
async fn records_of(client: &Client, records_ns: &str, ns: &str) -> Result<Vec<ConfigMap>> {
    let list = Api::<ConfigMap>::namespaced(client.clone(), records_ns)
        .list(&ListParams::default().labels(RECORD_LABEL))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|cm| cm.data.as_ref().and_then(|d| d.get("namespace")) == Some(&ns.to_string()))
        .collect())
}

/// rekindle acting in `ns`, keeping its Job re-create records in `records_ns` (its own namespace).
async fn start_keeping_records_in(client: &Client, ns: &str, records_ns: &str) -> Result<Rekindle> {
    let options = Options {
        env: &[("POD_NAMESPACE", records_ns)],
        ..Default::default()
    };
    Rekindle::start(client, &[ns], options).await
}

/// Before deleting the Job, the leader records the Job it is about to create (a ConfigMap in its own
/// namespace), and removes the record once the Job exists again.
#[tokio::test]
async fn a_job_re_create_is_recorded_until_the_job_exists_again() -> Result<()> {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, watcher};
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-job-record").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let records_ns = records_namespace(&ns.name);
    let rk = start_keeping_records_in(&client, &ns.name, &records_ns).await?;
    let (jobs, first_uid) = create_job(&client, &ns.name).await?;
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = {
        let api = Api::<ConfigMap>::namespaced(client.clone(), &records_ns);
        let (recorded, ns) = (recorded.clone(), ns.name.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().labels(RECORD_LABEL);
            let mut stream = watcher(api, config).boxed();
            while let Some(Ok(event)) = stream.next().await {
                if let watcher::Event::Apply(cm) | watcher::Event::InitApply(cm) = event {
                    if let Ok(record) = Record::from_configmap(&cm) {
                        if record.namespace == ns {
                            recorded.lock().unwrap().push(record);
                        }
                    }
                }
            }
        })
    };
    let h2 = change_cm(&client, &ns.name, "changed").await?;
    wait_for("the Job to be re-created", TIMEOUT, || async {
        Ok(jobs
            .get_opt("migrate")
            .await?
            .filter(|j| j.uid() != first_uid))
    })
    .await?;
    wait_for("the record to be removed", TIMEOUT, || async {
        Ok(records_of(&client, &records_ns, &ns.name)
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;
    seen.abort();
    let recorded = recorded.lock().unwrap().clone();
    assert_eq!(recorded.len(), 1, "one record: {recorded:?}");
    assert_eq!(recorded[0].name, "migrate");
    assert_eq!(Some(&recorded[0].old_uid), first_uid.as_ref());
    assert_eq!(
        recorded[0]
            .job
            .pointer("/spec/template/spec/containers/0/env/0/value"),
        Some(&json!(h2)),
        "the record holds the Job to create"
    );
    rk.stop().await?;
    ns.cleanup().await
}

/// A leader that deleted a Job and stopped before creating it left its record: the next one to lead
/// creates the Job from the record, once, and removes the record.
#[tokio::test]
async fn a_job_left_deleted_by_a_stopped_leader_is_created_by_the_next() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-job-leftover").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let (jobs, first_uid) = create_job(&client, &ns.name).await?;
    let h2 = change_cm(&client, &ns.name, "changed").await?;
    // What the stopped leader did: the record (as the writer writes it), then the delete.
    let old = serde_json::to_value(jobs.get("migrate").await?)?;
    let mut job = strip_job(&old);
    job["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": h2}]);
    let records_ns = records_namespace(&ns.name);
    let record = Record {
        namespace: ns.name.clone(),
        name: "migrate".into(),
        old_uid: first_uid.clone().unwrap_or_default(),
        job,
    };
    Records::new(client.clone(), &records_ns)
        .write(&record)
        .await?;
    jobs.delete("migrate", &DeleteParams::background()).await?;
    wait_for("the old Job to be gone", TIMEOUT, || async {
        Ok(jobs.get_opt("migrate").await?.is_none().then_some(()))
    })
    .await?;

    let rk = start_keeping_records_in(&client, &ns.name, &records_ns).await?;
    let created = wait_for("the Job to be created from the record", TIMEOUT, || async {
        Ok(jobs.get_opt("migrate").await?)
    })
    .await?;
    let v = serde_json::to_value(&created)?;
    assert_eq!(
        v.pointer("/spec/template/spec/containers/0/env/0/value"),
        Some(&json!(h2))
    );
    wait_for("the record to be removed", TIMEOUT, || async {
        Ok(records_of(&client, &records_ns, &ns.name)
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;
    // Its marker is current: nothing more to do, and the Job stays the one created.
    rk.settled(0.0).await?;
    assert_eq!(jobs.get("migrate").await?.uid(), created.uid());
    rk.stop().await?;
    ns.cleanup().await
}
