//! Faults: rekindle killed in the middle of a burst, its webhook frozen, another writer fighting over the
//! same Deployments; and secret data kept out of the logs. Nothing lost, nothing doubled.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use e2e::fixtures::deployment;
use e2e::rekindle::{Options, Rekindle};
use e2e::{admin_client, apply_value, dynamic_api, get_json, wait_for, TestNamespace, TIMEOUT};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use rekindle::core::hash::configmap_hash_typed;
use serde_json::{json, Value};

#[tokio::test]
async fn sigkill_mid_burst_loses_nothing_and_doubles_nothing() -> Result<()> {
    const WORKLOADS: usize = 50;
    const CHANGES: usize = 200;
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-sigkill").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..WORKLOADS {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "start"}}),
        )?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    for i in 0..WORKLOADS {
        let d = deployment(&format!("d-{i}"))
            .auto()
            .uses_configmap(&format!("cm-{i}"));
        apply_value(&client, Some(&ns.name), d.build()).await?;
    }
    let mut changes_per_cm: BTreeMap<usize, usize> = BTreeMap::new();
    for c in 0..CHANGES {
        let i = (c * 37) % WORKLOADS;
        cms.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": format!("c{c}")}})),
        )
        .await?;
        *changes_per_cm.entry(i).or_default() += 1;
        if c == CHANGES / 2 {
            rk.kill().await?;
        }
        if c == CHANGES / 2 + 20 {
            rk.restart().await?;
        }
    }
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    // Every Deployment ends on its ConfigMap's current hash.
    wait_for(
        "every Deployment to carry its ConfigMap's current hash",
        Duration::from_secs(90),
        || async {
            for i in 0..WORKLOADS {
                let want = configmap_hash_typed(&cms.get(&format!("cm-{i}")).await?);
                let d = get_json(&deployments, &format!("d-{i}")).await?;
                let have = d
                    .pointer("/spec/template/spec/containers/0/env/0/value")
                    .and_then(Value::as_str)
                    .map(String::from);
                if have.as_deref() != Some(want.as_str()) {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    rk.settled(rk.handled().await?).await?;
    // Never doubled: a Deployment rolls at most once per change of its ConfigMap (coalescing may merge).
    // Counted by metadata.generation (every template write bumps it; nothing else writes the spec), which
    // does not depend on how quickly the controller-manager creates ReplicaSets on a loaded machine.
    for (i, changes) in &changes_per_cm {
        let d = get_json(&deployments, &format!("d-{i}")).await?;
        let rollouts = d
            .pointer("/metadata/generation")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .saturating_sub(1) as usize;
        assert!(
            rollouts >= 1 && rollouts <= *changes,
            "d-{i}: {rollouts} rollouts for {changes} changes"
        );
    }
    rk.stop().await?;
    ns.cleanup().await
}

fn first_env(d: &Value) -> Option<String> {
    d.pointer("/spec/template/spec/containers/0/env/0/value")
        .and_then(Value::as_str)
        .map(String::from)
}

#[tokio::test]
async fn a_frozen_webhook_fails_open_and_the_watch_still_reloads() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-sigstop").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"v": "1"}}))?,
    )
    .await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    rk.signal("STOP")?;
    let started = std::time::Instant::now();
    deployment("frozen")
        .auto()
        .uses_configmap("cfg")
        .apply(&client, &ns.name)
        .await?;
    let took = started.elapsed();
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    assert_eq!(
        first_env(&get_json(&deployments, "frozen").await?),
        None,
        "admitted unchanged while the webhook is frozen (failurePolicy Ignore), after {took:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    rk.signal("CONT")?;
    // The watch indexed it: a later change reloads it.
    rk.wait_indexed(1.0).await?;
    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"v": "2"}})),
    )
    .await?;
    let want = configmap_hash_typed(&cms.get("cfg").await?);
    wait_for(
        "the frozen-time Deployment to reload",
        Duration::from_secs(60),
        || async {
            Ok(
                (first_env(&get_json(&deployments, "frozen").await?).as_deref()
                    == Some(want.as_str()))
                .then_some(()),
            )
        },
    )
    .await?;
    println!("create with the webhook frozen took {took:?}");
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn a_conflict_storm_neither_stops_reloads_nor_loses_the_other_writers_changes() -> Result<()>
{
    const WORKLOADS: usize = 5;
    const CHANGES: usize = 3;
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-conflict").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..WORKLOADS {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "0"}}),
            )?,
        )
        .await?;
    }
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    for i in 0..WORKLOADS {
        deployment(&format!("d-{i}"))
            .auto()
            .uses_configmap(&format!("cm-{i}"))
            .apply(&client, &ns.name)
            .await?;
    }
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    // Another writer: a metadata annotation and a pod-template label, on every Deployment, non-stop.
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (deployments, stop) = (deployments.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n: u64 = 0;
            let mut last = BTreeMap::new();
            while !stop.is_cancelled() {
                let i = (n as usize) % WORKLOADS;
                let patch = json!({"metadata": {"annotations": {"other-writer/n": n.to_string()}},
                    "spec": {"template": {"metadata": {"labels": {"other-writer": n.to_string()}}}}});
                if deployments
                    .patch(
                        &format!("d-{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .is_ok()
                {
                    last.insert(i, n);
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            last
        })
    };
    for c in 1..=CHANGES {
        for i in 0..WORKLOADS {
            cms.patch(
                &format!("cm-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&json!({"data": {"v": c.to_string()}})),
            )
            .await?;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    wait_for(
        "every reload to land during the storm",
        Duration::from_secs(60),
        || async {
            for i in 0..WORKLOADS {
                let want = configmap_hash_typed(&cms.get(&format!("cm-{i}")).await?);
                if first_env(&get_json(&deployments, &format!("d-{i}")).await?).as_deref()
                    != Some(want.as_str())
                {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    stop.cancel();
    let last = writer.await?;
    for (i, n) in last {
        let d = get_json(&deployments, &format!("d-{i}")).await?;
        assert_eq!(
            d.pointer("/metadata/annotations/other-writer~1n")
                .and_then(Value::as_str),
            Some(n.to_string().as_str()),
            "d-{i}: the other writer's last annotation survived"
        );
        assert_eq!(
            d.pointer("/spec/template/metadata/labels/other-writer")
                .and_then(Value::as_str),
            Some(n.to_string().as_str()),
            "d-{i}: the other writer's last template label survived"
        );
    }
    let retried = rk
        .metric("rekindle_errors_total{kind=\"reload_attempt\"}")
        .await?;
    let failed = rk.reloads(false).await?;
    println!("attempts retried during the storm: {retried}");
    assert_eq!(failed, 0.0, "no reload gave up");
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn secret_data_never_appears_in_the_logs_even_at_trace_level() -> Result<()> {
    use base64::Engine as _;
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-nolog").await?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let (first, second) = (format!("hunter2-{nanos}-a"), format!("hunter2-{nanos}-b"));
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "creds"}, "stringData": {"password": first}}),
            )?,
        )
        .await?;
    let env = [("REKINDLE_LOG", "trace")];
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--log-level=trace"],
            env: &env,
            ..Default::default()
        },
    )
    .await?;
    deployment("app")
        .auto()
        .env_from(json!([json!({"secretRef": {"name": "creds"}})]))
        .apply(&client, &ns.name)
        .await?;
    secrets
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"password": second}})),
        )
        .await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let want = rekindle::core::hash::secret_hash_typed(&secrets.get("creds").await?);
    wait_for(
        "the Deployment to reload",
        Duration::from_secs(60),
        || async {
            Ok(
                (first_env(&get_json(&deployments, "app").await?).as_deref()
                    == Some(want.as_str()))
                .then_some(()),
            )
        },
    )
    .await?;
    let log_path = rk.log.clone();
    rk.stop().await?;
    let log = std::fs::read_to_string(&log_path)?;
    assert!(log.lines().count() > 50, "a trace-level log was written");
    for value in [&first, &second] {
        let b64 = base64::engine::general_purpose::STANDARD.encode(value);
        assert!(
            !log.contains(value.as_str()),
            "secret value in {}",
            log_path.display()
        );
        assert!(
            !log.contains(&b64),
            "base64 secret value in {}",
            log_path.display()
        );
    }
    ns.cleanup().await
}

/// The apiserver's flow-control rejections for one priority level, from its /metrics.
async fn apf_rejections(client: &kube::Client, level: &str) -> Result<f64> {
    let body = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(body
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_flowcontrol_rejected_requests_total")
                && l.contains(&format!("priority_level=\"{level}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[tokio::test]
async fn throttled_by_priority_and_fairness_rekindle_backs_off_and_loses_nothing() -> Result<()> {
    const WORKLOADS: usize = 20;
    const ROUNDS: usize = 3;
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-apf").await?;
    // rekindle as the chart's ServiceAccount (system:masters would be exempt from flow control), in a
    // priority level with a single seat and no queue: excess requests get 429.
    let kubeconfig = e2e::chart::install_identity(&client, "apf", &ns.name).await?;
    let level = format!("rekindle-{}", ns.name);
    apply_value(&client, None, json!({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": level},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}}})).await?;
    apply_value(&client, None, json!({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": level},
        "spec": {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": 50,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [{"kind": "User", "user": {"name": format!("system:serviceaccount:{}:apf-rekindle", ns.name)}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": true}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}})).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..WORKLOADS {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "0"}}),
            )?,
        )
        .await?;
    }
    let env = [("POD_NAMESPACE", ns.name.as_str())];
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            kubeconfig: Some(kubeconfig),
            args: &["--reload-debounce=0", "--max-concurrent-reloads=32"],
            env: &env,
            ..Default::default()
        },
    )
    .await?;
    for i in 0..WORKLOADS {
        deployment(&format!("d-{i}"))
            .auto()
            .uses_configmap(&format!("cm-{i}"))
            .apply(&client, &ns.name)
            .await?;
    }
    // A CronJob on cm-0: each change creates a Job, and a retried create must not make a second one.
    apply_value(&client, Some(&ns.name), json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": "cm-0"}}]}]}}}}}})).await?;
    let rejected_before = apf_rejections(&client, &level).await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let handled = rk.handled().await?;
    for round in 1..=ROUNDS {
        for i in 0..WORKLOADS {
            cms.patch(
                &format!("cm-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&json!({"data": {"v": round.to_string()}})),
            )
            .await?;
        }
        // Each round lands before the next, so every round is a rollout of its own.
        wait_for(
            "the round to be reloaded",
            Duration::from_secs(120),
            || async {
                for i in 0..WORKLOADS {
                    let want = configmap_hash_typed(&cms.get(&format!("cm-{i}")).await?);
                    if first_env(&get_json(&deployments, &format!("d-{i}")).await?).as_deref()
                        != Some(want.as_str())
                    {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
        .await?;
    }
    rk.settled(handled + (ROUNDS * WORKLOADS) as f64).await?;
    for i in 0..WORKLOADS {
        let d = get_json(&deployments, &format!("d-{i}")).await?;
        assert_eq!(
            d.pointer("/metadata/generation").and_then(Value::as_u64),
            Some(1 + ROUNDS as u64),
            "d-{i}: one rollout per change"
        );
    }
    let jobs = dynamic_api(&client, "batch/v1", "Job", Some(&ns.name)).await?;
    let created = jobs.list(&Default::default()).await?.items.len();
    assert_eq!(created, ROUNDS, "one Job per change of cm-0, never two");
    let rejected = apf_rejections(&client, &level).await? - rejected_before;
    println!("requests rejected with 429: {rejected}");
    assert!(rejected > 0.0, "the test really throttled rekindle");
    rk.stop().await?;
    for kind in ["FlowSchema", "PriorityLevelConfiguration"] {
        let api = dynamic_api(&client, "flowcontrol.apiserver.k8s.io/v1", kind, None).await?;
        api.delete(&level, &Default::default()).await?;
    }
    ns.cleanup().await
}

/// A user (named `prefix` and the namespace) whose ClusterRole grants `rules`, plus reading the
/// optional workload kinds other tests may have installed (rekindle lists every workload kind it
/// serves before it is ready or catches up), and a kubeconfig for it.
async fn user_with_rules(
    client: &kube::Client,
    ns: &TestNamespace,
    prefix: &str,
    rules: Value,
) -> Result<(String, std::path::PathBuf)> {
    let user = format!("{prefix}-{}", ns.name);
    let mut rules = rules.as_array().cloned().unwrap_or_default();
    rules.extend([
        json!({"apiGroups": ["apps.openshift.io"], "verbs": ["get", "list", "watch"], "resources": ["deploymentconfigs"]}),
        json!({"apiGroups": ["argoproj.io"], "verbs": ["get", "list", "watch"], "resources": ["rollouts"]}),
    ]);
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": user}, "rules": rules});
    apply_value(client, None, role).await?;
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    apply_value(client, None, binding).await?;
    let kubeconfig = e2e::user_kubeconfig(&user, &ns.name)?;
    Ok((user, kubeconfig))
}

/// Removes what [`user_with_rules`] created.
async fn delete_user(client: &kube::Client, user: &str) -> Result<()> {
    for kind in ["ClusterRoleBinding", "ClusterRole"] {
        let api = dynamic_api(client, "rbac.authorization.k8s.io/v1", kind, None).await?;
        api.delete(user, &Default::default()).await?;
    }
    Ok(())
}

/// rekindle started as a user that may read every workload kind, ConfigMaps and Secrets and record
/// Events, and do what `more` grants; the ConfigMap `cfg` made for the workload to use.
async fn started_as_reader(
    client: &kube::Client,
    ns: &TestNamespace,
    prefix: &str,
    more: Value,
) -> Result<(String, Rekindle)> {
    let mut rules = vec![
        json!({"apiGroups": ["", "apps", "batch"], "verbs": ["get", "list", "watch"],
            "resources": ["configmaps", "secrets", "namespaces", "deployments", "statefulsets", "daemonsets", "cronjobs", "jobs"]}),
        json!({"apiGroups": ["", "events.k8s.io"], "verbs": ["create", "patch"], "resources": ["events"]}),
    ];
    rules.extend(more.as_array().cloned().unwrap_or_default());
    let (user, kubeconfig) = user_with_rules(client, ns, prefix, Value::Array(rules)).await?;
    apply_value(
        client,
        Some(&ns.name),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"v": "1"}}),
    )
    .await?;
    let rk = Rekindle::start(
        client,
        &[&ns.name],
        Options {
            kubeconfig: Some(kubeconfig),
            args: &["--reload-debounce=0"],
            ..Default::default()
        },
    )
    .await?;
    Ok((user, rk))
}

/// Changes `cfg` once its one workload is indexed and checks the reload it triggers is refused as
/// forbidden: one attempt, one failed reload; returns the `ReloadFail` Events.
async fn forbidden_reload(
    client: &kube::Client,
    ns: &TestNamespace,
    rk: &Rekindle,
) -> Result<Vec<k8s_openapi::api::core::v1::Event>> {
    rk.wait_indexed(1.0).await?;
    let handled = rk.handled().await?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": "2"}})),
        )
        .await?;
    // Idle means the reload, with whatever retries it was going to make, is over.
    rk.settled(handled + 1.0).await?;
    let forbidden = "rekindle_reload_attempt_failures_total{reason=\"forbidden\"}";
    assert_eq!(rk.metric(forbidden).await?, 1.0, "one attempt, not retried");
    assert_eq!(rk.reloads(false).await?, 1.0, "one failed reload");
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns.name);
    wait_for("a ReloadFail Warning Event", TIMEOUT, || async {
        let list = events
            .list(&kube::api::ListParams::default().fields("reason=ReloadFail"))
            .await?;
        Ok((!list.items.is_empty()).then_some(list.items))
    })
    .await
}

/// A write the apiserver forbids is not retried: one failed attempt, one failed reload, one
/// `ReloadFail` Warning Event, while everything rekindle may do still works. rekindle runs as a user
/// that may read everything and record Events but not patch Deployments.
#[tokio::test]
async fn a_forbidden_patch_is_attempted_once_and_reported() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-forbidden").await?;
    let (user, rk) = started_as_reader(&client, &ns, "e2e-no-patch", json!([])).await?;
    deployment("web")
        .auto()
        .uses_configmap("cfg")
        .apply(&client, &ns.name)
        .await?;
    let fails = forbidden_reload(&client, &ns, &rk).await?;
    assert_eq!(rk.metric("reloader_retries_total").await?, 0.0);
    assert_eq!(rk.reloads(true).await?, 0.0);
    assert_eq!(fails.len(), 1, "one Event: {fails:?}");
    assert_eq!(fails[0].type_.as_deref(), Some("Warning"));
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    assert_eq!(
        e2e::fixtures::generation(&get_json(&deployments, "web").await?),
        1,
        "the Deployment is untouched"
    );
    rk.stop().await?;
    delete_user(&client, &user).await?;
    ns.cleanup().await
}

/// A role that may delete Jobs but not create them: the Job is not deleted (a SelfSubjectAccessReview
/// asks first), so it is not lost; the reload fails as forbidden, once, with a `ReloadFail` Event.
#[tokio::test]
async fn a_job_that_may_not_be_created_again_is_left_in_place() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-job-no-create").await?;
    let may_delete_jobs =
        json!([{"apiGroups": ["batch"], "verbs": ["delete"], "resources": ["jobs"]}]);
    let (user, rk) = started_as_reader(&client, &ns, "e2e-no-job-create", may_delete_jobs).await?;
    apply_value(
        &client,
        Some(&ns.name),
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "migrate", "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "app", "image": "busybox", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}}}),
    )
    .await?;
    let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), &ns.name);
    let uid = jobs.get("migrate").await?.metadata.uid;
    let fails = forbidden_reload(&client, &ns, &rk).await?;
    let note = fails[0].message.clone().unwrap_or_default();
    assert!(note.contains("may not create Jobs"), "{note}");
    assert_eq!(
        jobs.get_opt("migrate").await?.and_then(|j| j.metadata.uid),
        uid,
        "the Job is still there, the same one"
    );
    rk.stop().await?;
    delete_user(&client, &user).await?;
    ns.cleanup().await
}

/// The start-up catch-up of ConfigMaps does not wait for the Secrets: with a role that may not list
/// Secrets, the Secrets watch never syncs and rekindle never turns ready, yet a ConfigMap changed while
/// it was down is reloaded, once.
#[tokio::test]
async fn a_configmap_changed_while_down_is_reloaded_before_the_secrets_are_listed() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-early-catch-up").await?;
    let (user, kubeconfig) = user_with_rules(
        &client,
        &ns,
        "e2e-no-secrets",
        json!([
            {"apiGroups": ["", "apps", "batch"], "verbs": ["get", "list", "watch"],
             "resources": ["configmaps", "namespaces", "deployments", "statefulsets", "daemonsets", "cronjobs", "jobs"]},
            {"apiGroups": ["apps"], "verbs": ["patch"], "resources": ["deployments"]},
            {"apiGroups": ["", "events.k8s.io"], "verbs": ["create", "patch"], "resources": ["events"]},
        ]),
    )
    .await?;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"v": "1"}}))?;
    let before = configmap_hash_typed(&cms.create(&PostParams::default(), &cm).await?);
    // Stamped with the hash of the first content, as rekindle's webhook would have.
    let env_var =
        rekindle::core::envname::env_var_name("cfg", rekindle::core::ResourceKind::ConfigMap);
    deployment("web")
        .auto()
        .containers(json!([{"name": "app", "image": "busybox",
            "envFrom": [{"configMapRef": {"name": "cfg"}}],
            "env": [{"name": env_var, "value": before}]}]))
        .apply(&client, &ns.name)
        .await?;
    let changed = cms
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": "2"}})),
        )
        .await?;
    let after = configmap_hash_typed(&changed);
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            webhook: false,
            wait_ready: false,
            kubeconfig: Some(kubeconfig),
            args: &["--reload-debounce=0"],
            ..Default::default()
        },
    )
    .await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    wait_for("the catch-up to reload web", TIMEOUT, || async {
        let d = get_json(&deployments, "web").await?;
        let value = d.pointer("/spec/template/spec/containers/0/env/0/value");
        Ok((value == Some(&json!(after))).then_some(()))
    })
    .await?;
    assert_eq!(
        rk.metric("rekindle_ready").await?,
        0.0,
        "the Secrets never listed"
    );
    assert!(
        rk.metric("rekindle_watch_restarts_total{resource=\"secrets\"}")
            .await?
            >= 1.0,
        "the Secrets watch was refused"
    );
    // Counted once the reload (and its Event) is done: wait until rekindle is idle.
    rk.settled(rk.handled().await?).await?;
    assert_eq!(rk.reloads(true).await?, 1.0);
    assert_eq!(
        e2e::fixtures::generation(&get_json(&deployments, "web").await?),
        2
    );
    rk.stop().await?;
    delete_user(&client, &user).await?;
    ns.cleanup().await
}
