//! The control plane itself: version, rollouts through the controller-manager and kwok, CRDs, RBAC.

use anyhow::Result;
use e2e::{
    admin_client, apply_yaml, client_with_cert, dynamic_api, replica_sets, state_dir, wait_for,
    TestNamespace, TIMEOUT,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use serde_json::json;

#[tokio::test]
async fn server_reports_v1_35() -> Result<()> {
    let client = admin_client().await?;
    let v = client.apiserver_version().await?;
    assert_eq!(v.major, "1");
    assert_eq!(v.minor, "35", "git version {}", v.git_version);
    assert!(v.git_version.starts_with("v1.35."), "{}", v.git_version);
    Ok(())
}

#[tokio::test]
async fn deployment_runs_and_a_template_change_rolls_it() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "smoke-roll").await?;
    apply_yaml(
        &client,
        Some(&ns.name),
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: app, image: busybox}]}
"#,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    wait_for(
        "2 pods of web to be Running on the kwok node",
        TIMEOUT,
        || async {
            let list = pods.list(&ListParams::default().labels("app=web")).await?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("kwok-node-0")
                })
                .count();
            Ok((running == 2).then_some(()))
        },
    )
    .await?;
    let first = replica_sets(&client, &ns.name, "web").await?;
    assert_eq!(first.len(), 1, "{first:?}");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "env": [{"name": "X", "value": "1"}]}]}}}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    let old = first[0].0.clone();
    wait_for(
        "a second ReplicaSet of web to become the active one",
        TIMEOUT,
        || async {
            let rs = replica_sets(&client, &ns.name, "web").await?;
            let new_active = rs
                .iter()
                .any(|(n, spec, ready)| *n != old && *spec == 2 && *ready == 2);
            let old_scaled_down = rs.iter().any(|(n, spec, _)| *n == old && *spec == 0);
            Ok((rs.len() == 2 && new_active && old_scaled_down).then_some(()))
        },
    )
    .await?;
    ns.cleanup().await
}

#[tokio::test]
async fn a_crd_can_be_installed_and_used() -> Result<()> {
    let client = admin_client().await?;
    let crd = std::fs::read_to_string(e2e::root().join("e2e/fixtures/crds/argo-rollouts.yaml"))?;
    apply_yaml(&client, None, &crd).await?;
    let ns = TestNamespace::new(&client, "smoke-crd").await?;
    let rollouts = wait_for("the Rollout CRD to be served", TIMEOUT, || async {
        Ok(
            dynamic_api(&client, "argoproj.io/v1alpha1", "Rollout", Some(&ns.name))
                .await
                .ok(),
        )
    })
    .await?;
    apply_yaml(
        &client,
        Some(&ns.name),
        r#"
apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: ro}
spec:
  selector: {matchLabels: {app: ro}}
  template:
    metadata: {labels: {app: ro}}
    spec: {containers: [{name: app, image: busybox}]}
"#,
    )
    .await?;
    let got = e2e::get_json(&rollouts, "ro").await?;
    assert_eq!(
        got.pointer("/spec/template/spec/containers/0/name"),
        Some(&json!("app"))
    );
    ns.cleanup().await
}

#[tokio::test]
async fn rbac_is_enforced_for_a_service_account_without_rights() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "smoke-rbac").await?;
    let pki = state_dir().join("pki");
    let certs_gen = e2e::root().join("target/debug/certs-gen");
    let status = std::process::Command::new(&certs_gen)
        .args(["client", "--out"])
        .arg(&pki)
        .args([
            "--name",
            "sa-nobody",
            "--cn",
            &format!("system:serviceaccount:{}:nobody", ns.name),
        ])
        .status()?;
    assert!(status.success(), "certs-gen client failed");
    let nobody = client_with_cert(&pki.join("sa-nobody.crt"), &pki.join("sa-nobody.key")).await?;
    let err = Api::<ConfigMap>::namespaced(nobody, &ns.name)
        .list(&ListParams::default())
        .await
        .expect_err("a ServiceAccount without rights must be refused");
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 Forbidden, got {other}"),
    }
    // The admin still can.
    Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await?;
    ns.cleanup().await
}
