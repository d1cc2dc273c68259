//! Faults of the control plane itself: kube-apiserver and etcd killed and restarted while changes keep
//! coming, and watches forced to re-list (`410 Gone` after etcd compaction) with changes and deletions
//! made during the gap. These stop the shared cluster, so they run one at a time, in their own test
//! binary (cargo runs test binaries one after another).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::LazyLock;
use std::time::Duration;

use anyhow::{bail, Result};
use e2e::fixtures::{env_value, generation};
use e2e::rekindle::{Options, Rekindle};
use e2e::{
    admin_client, apply_value, dynamic_api, get_json, root, state_dir, wait_for, TestNamespace,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Api;
use rekindle::core::hash::configmap_hash_typed;
use serde_json::{json, Value};

static ONE_AT_A_TIME: LazyLock<tokio::sync::Mutex<()>> =
    LazyLock::new(|| tokio::sync::Mutex::new(()));
const TIMEOUT: Duration = Duration::from_secs(120);

fn cluster(args: &[&str]) -> Result<()> {
    let status = Command::new(root().join("e2e/scripts/cluster.sh"))
        .args(args)
        .env("REKINDLE_E2E_STATE", state_dir())
        .status()?;
    if !status.success() {
        bail!("cluster.sh {args:?} failed");
    }
    Ok(())
}

fn deployment(i: usize) -> Value {
    e2e::fixtures::deployment(&format!("d-{i}"))
        .auto()
        .uses_configmap(&format!("cm-{i}"))
        .build()
}

/// Waits until Deployment `name`'s env var `var` is `want` (`None`: until it is gone).
async fn wait_env(
    what: &str,
    deployments: &Api<DynamicObject>,
    name: &str,
    var: &str,
    want: Option<&str>,
) -> Result<()> {
    wait_for(what, TIMEOUT, || async {
        let d = get_json(deployments, name).await?;
        Ok((env_value(&d, var).as_deref() == want).then_some(()))
    })
    .await
}

async fn setup(
    prefix: &str,
    n: usize,
    args: &'static [&'static str],
) -> Result<(TestNamespace, Api<ConfigMap>, Api<DynamicObject>, Rekindle)> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, prefix).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..n {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "start"}}),
            )?,
        )
        .await?;
    }
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args,
            ..Default::default()
        },
    )
    .await?;
    for i in 0..n {
        apply_value(&client, Some(&ns.name), deployment(i)).await?;
    }
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    Ok((ns, cms, deployments, rk))
}

/// Makes `changes` ConfigMap changes, retrying each until the apiserver accepts it, while `fault` runs
/// in the background after the first third; returns the accepted changes per ConfigMap.
async fn changes_through(
    cms: &Api<ConfigMap>,
    n: usize,
    changes: usize,
    fault: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<BTreeMap<usize, usize>> {
    let mut per_cm: BTreeMap<usize, usize> = BTreeMap::new();
    let mut fault = Some(fault);
    let mut handle = None;
    for c in 0..changes {
        if c == changes / 3 {
            let f = fault.take().expect("once");
            handle = Some(std::thread::spawn(f));
        }
        let i = (c * 7) % n;
        let mut tries = 0;
        loop {
            match cms
                .patch(
                    &format!("cm-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"data": {"v": format!("c{c}")}})),
                )
                .await
            {
                Ok(_) => break,
                Err(e) => {
                    tries += 1;
                    if tries > 600 {
                        bail!("change {c} never accepted: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        *per_cm.entry(i).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(h) = handle {
        h.join().expect("fault thread")?;
    }
    Ok(per_cm)
}

/// Every Deployment ends on its ConfigMap's current hash, with at most one rollout per change.
async fn all_reloaded_once(
    rk: &Rekindle,
    cms: &Api<ConfigMap>,
    deployments: &Api<DynamicObject>,
    per_cm: &BTreeMap<usize, usize>,
) -> Result<()> {
    wait_for(
        "every Deployment to carry its ConfigMap's current hash",
        TIMEOUT,
        || async {
            for i in per_cm.keys() {
                let want = configmap_hash_typed(&cms.get(&format!("cm-{i}")).await?);
                let d = get_json(deployments, &format!("d-{i}")).await?;
                if env_value(&d, &format!("STAKATER_CM_{i}_CONFIGMAP")).as_deref()
                    != Some(want.as_str())
                {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    rk.settled(rk.handled().await?).await?;
    for (i, changes) in per_cm {
        let rollouts =
            generation(&get_json(deployments, &format!("d-{i}")).await?).saturating_sub(1) as usize;
        assert!(
            rollouts >= 1 && rollouts <= *changes,
            "d-{i}: {rollouts} rollouts for {changes} changes"
        );
    }
    Ok(())
}

#[tokio::test]
async fn apiserver_killed_and_restarted_while_changes_keep_coming() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (ns, cms, deployments, rk) = setup("e2e-apiserver", 10, &[]).await?;
    let per_cm = changes_through(&cms, 10, 60, || {
        cluster(&["kill", "kube-apiserver"])?;
        std::thread::sleep(Duration::from_secs(3));
        cluster(&["start", "kube-apiserver"])
    })
    .await?;
    all_reloaded_once(&rk, &cms, &deployments, &per_cm).await?;
    assert!(
        rk.metric("rekindle_watch_restarts_total{resource=\"configmaps\"}")
            .await?
            >= 1.0
    );
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn etcd_killed_and_restarted_while_changes_keep_coming() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (ns, cms, deployments, rk) = setup("e2e-etcd", 10, &[]).await?;
    let per_cm = changes_through(&cms, 10, 60, || {
        cluster(&["kill", "etcd"])?;
        std::thread::sleep(Duration::from_secs(3));
        cluster(&["start", "etcd"])
    })
    .await?;
    all_reloaded_once(&rk, &cms, &deployments, &per_cm).await?;
    rk.stop().await?;
    ns.cleanup().await
}

#[tokio::test]
async fn a_forced_relist_sees_changes_and_deletions_made_during_the_gap() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (ns, cms, deployments, rk) = setup("e2e-relist", 5, &["--reload-on-delete=true"]).await?;
    // Secrets too (their watch is protobuf's, not kube's): one changed and one deleted in the gap.
    let client = admin_client().await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    for i in 0..2 {
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": format!("sec-{i}")}, "stringData": {"v": "start"}}),
                )?,
            )
            .await?;
        let d = e2e::fixtures::deployment(&format!("ds-{i}"))
            .auto()
            .env_from(json!([{"secretRef": {"name": format!("sec-{i}")}}]))
            .build();
        apply_value(&client, Some(&ns.name), d).await?;
    }
    let stamps = (0..2)
        .map(|i| (format!("ds-{i}"), format!("STAKATER_SEC_{i}_SECRET")))
        .chain((0..5).map(|i| (format!("d-{i}"), format!("STAKATER_CM_{i}_CONFIGMAP"))));
    for (name, var) in stamps {
        wait_for("stamped", TIMEOUT, || async {
            Ok(env_value(&get_json(&deployments, &name).await?, &var).map(|_| ()))
        })
        .await?;
    }
    // rekindle's watches stall; meanwhile: changes, a deleted ConfigMap, a deleted Deployment.
    rk.signal("STOP")?;
    for i in 0..3 {
        cms.patch(
            &format!("cm-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"v": "gap"}})),
        )
        .await?;
    }
    cms.delete("cm-3", &DeleteParams::default()).await?;
    secrets
        .patch(
            "sec-0",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"v": "gap"}})),
        )
        .await?;
    secrets.delete("sec-1", &DeleteParams::default()).await?;
    deployments.delete("d-4", &DeleteParams::default()).await?;
    cms.patch(
        "cm-4",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"v": "orphan"}})),
    )
    .await?;
    // History gone and every watch connection dropped: resuming from the old resourceVersion is 410 Gone.
    cluster(&["compact"])?;
    cluster(&["kill", "kube-apiserver"])?;
    cluster(&["start", "kube-apiserver"])?;
    rk.signal("CONT")?;

    for i in 0..3 {
        let want = configmap_hash_typed(&cms.get(&format!("cm-{i}")).await?);
        wait_env(
            "changes made during the gap to reload",
            &deployments,
            &format!("d-{i}"),
            &format!("STAKATER_CM_{i}_CONFIGMAP"),
            Some(&want),
        )
        .await?;
    }
    wait_env(
        "the deletion seen during the gap to remove the env var",
        &deployments,
        "d-3",
        "STAKATER_CM_3_CONFIGMAP",
        None,
    )
    .await?;
    let want = rekindle::core::hash::secret_hash_typed(&secrets.get("sec-0").await?);
    wait_env(
        "the Secret changed during the gap to reload",
        &deployments,
        "ds-0",
        "STAKATER_SEC_0_SECRET",
        Some(&want),
    )
    .await?;
    wait_env(
        "the Secret deleted during the gap to remove its env var",
        &deployments,
        "ds-1",
        "STAKATER_SEC_1_SECRET",
        None,
    )
    .await?;
    // The Secrets watch reconnected after the apiserver's restart: a change made now is seen.
    let changed = secrets
        .patch(
            "sec-0",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"v": "after"}})),
        )
        .await?;
    let want = rekindle::core::hash::secret_hash_typed(&changed);
    wait_env(
        "a Secret changed after the restart to reload",
        &deployments,
        "ds-0",
        "STAKATER_SEC_0_SECRET",
        Some(&want),
    )
    .await?;
    rk.settled(rk.handled().await?).await?;
    for (name, rollouts) in [("ds-0", 2), ("ds-1", 1)] {
        let d = get_json(&deployments, name).await?;
        assert_eq!(
            generation(&d),
            1 + rollouts,
            "{name}: one rollout per change"
        );
    }
    for i in 0..4 {
        let d = get_json(&deployments, &format!("d-{i}")).await?;
        assert_eq!(generation(&d), 2, "d-{i}: exactly one rollout");
    }
    assert_eq!(
        rk.reloads(false).await?,
        0.0,
        "the deleted Deployment caused no failed reload"
    );
    let log = std::fs::read_to_string(&rk.log)?;
    assert!(
        log.contains("too old resource version"),
        "the watches really resumed into 410 Gone and re-listed"
    );
    rk.stop().await?;
    ns.cleanup().await
}
