//! The packaging against the real apiserver: the chart's objects applied server-side, certs-gen running
//! under the chart's hook RBAC, rekindle under the chart's ServiceAccount RBAC, certificate rotation on
//! disk, and /metrics read by a real Prometheus parser.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use e2e::chart::{
    identity_kubeconfig, install, kind_of, name_of, render, service_account_identity, ALL_FEATURES,
};
use e2e::fixtures::deployment;
use e2e::rekindle::{Options, Rekindle};
use e2e::{
    admin_client, apply_value, apply_yaml, client_from, root, state_dir, wait_for, TestNamespace,
    TIMEOUT,
};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

/// The chart's hook objects of one template other than its Jobs (the RBAC the Jobs run with).
fn hook_rbac(release: &str, ns: &str, template: &str) -> Result<(Vec<Value>, Vec<Value>)> {
    let mut args = ALL_FEATURES.to_vec();
    args.extend(["--show-only", template]);
    let docs = render(release, ns, &args)?;
    Ok(docs.into_iter().partition(|d| kind_of(d) != "Job"))
}

fn job_args(job: &Value) -> Vec<String> {
    job.pointer("/spec/template/spec/containers/0/args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn certs_gen(args: &[String], kubeconfig: &Path) -> Result<String> {
    let out = Command::new(root().join("target/debug/certs-gen"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() {
        bail!("certs-gen {args:?} failed: {stderr}");
    }
    Ok(stderr)
}

fn resource_version<K: kube::Resource>(obj: &K) -> String {
    obj.meta().resource_version.clone().unwrap_or_default()
}

fn is_forbidden<T>(r: &Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403)
}

#[tokio::test]
async fn certs_gen_under_the_charts_hook_rbac_is_idempotent_and_sets_the_ca_bundle() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-pkg").await?;
    let release = "pkg";
    install(&client, release, &ns.name, ALL_FEATURES).await?;
    let (rbac, jobs) = hook_rbac(release, &ns.name, "templates/certs-gen.yaml")?;
    let (cleanup_rbac, cleanup_jobs) = hook_rbac(release, &ns.name, "templates/cleanup.yaml")?;
    for doc in rbac.iter().chain(&cleanup_rbac) {
        apply_value(&client, Some(&ns.name), doc.clone()).await?;
    }
    let identity = |sa: &str| -> Result<PathBuf> {
        let (user, groups) = service_account_identity(&ns.name, sa);
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        identity_kubeconfig(&format!("{sa}-{}", ns.name), &user, &groups)
    };
    let hook_kc = identity("pkg-rekindle-certs-gen")?;
    let job = |name: &str| -> Result<Vec<String>> {
        jobs.iter()
            .find(|j| name_of(j) == name)
            .map(job_args)
            .ok_or_else(|| anyhow!("no Job {name}"))
    };
    let secrets_phase = job("pkg-rekindle-certs-gen-secrets")?;
    let bundle_phase = job("pkg-rekindle-certs-gen-ca-bundle")?;

    // The Jobs' own arguments, in Helm's order, under the hook ServiceAccount's RBAC.
    certs_gen(&secrets_phase, &hook_kc)?;
    certs_gen(&bundle_phase, &hook_kc)?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let tls = secrets.get("pkg-rekindle-tls").await?;
    let ca = secrets.get("pkg-rekindle-ca").await?;
    assert_eq!(tls.type_.as_deref(), Some("kubernetes.io/tls"));
    for s in [&tls, &ca] {
        assert_eq!(
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/managed-by"))
                .map(String::as_str),
            Some("certs-gen")
        );
    }
    let data = tls.data.clone().unwrap_or_default();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(data.contains_key(key), "{key} in the TLS Secret");
    }
    let bundle = data["ca.crt"].0.clone();
    let config = configs.get("pkg-rekindle").await?;
    let webhooks = config.webhooks.clone().unwrap_or_default();
    let names: Vec<&str> = webhooks.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["workloads.rekindle.io", "pods.rekindle.io"]);
    for webhook in &webhooks {
        assert_eq!(
            webhook
                .client_config
                .ca_bundle
                .as_ref()
                .map(|b| b.0.clone()),
            Some(bundle.clone()),
            "the caBundle landed in {}",
            webhook.name
        );
    }
    // Server-side apply: certs-gen owns the caBundle and nothing else.
    let managers: Vec<String> = config
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.manager.as_deref() == Some("certs-gen"))
        .map(|m| serde_json::to_string(&m.fields_v1).unwrap_or_default())
        .collect();
    assert_eq!(managers.len(), 1, "one certs-gen field set");
    assert!(managers[0].contains("caBundle"));
    assert!(!managers[0].contains("failurePolicy") && !managers[0].contains("rules"));

    // A second run writes nothing.
    let before = (
        resource_version(&tls),
        resource_version(&ca),
        resource_version(&configs.get("pkg-rekindle").await?),
    );
    let said = certs_gen(&secrets_phase, &hook_kc)? + &certs_gen(&bundle_phase, &hook_kc)?;
    assert!(said.contains("nothing to do"), "{said}");
    let after = (
        resource_version(&secrets.get("pkg-rekindle-tls").await?),
        resource_version(&secrets.get("pkg-rekindle-ca").await?),
        resource_version(&configs.get("pkg-rekindle").await?),
    );
    assert_eq!(before, after, "a valid certificate is left alone: no write");

    // The hook identity reaches nothing else; an unlabelled Secret is never touched.
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": "not-ours"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "x", "tls.key": "y"}
    }))?;
    secrets.create(&PostParams::default(), &foreign).await?;
    let hook_client = client_from(&hook_kc).await?;
    let hook_secrets: Api<Secret> = Api::namespaced(hook_client, &ns.name);
    assert!(is_forbidden(&hook_secrets.get("not-ours").await));
    let admin_args: Vec<String> = secrets_phase
        .iter()
        .map(|a| {
            if a.starts_with("--secret=") {
                "--secret=not-ours".into()
            } else {
                a.clone()
            }
        })
        .collect();
    let err = certs_gen(&admin_args, &e2e::kubeconfig_path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("not labelled"), "{err}");
    let still = secrets.get("not-ours").await?;
    assert_eq!(
        resource_version(&still),
        resource_version(&secrets.get("not-ours").await?)
    );
    assert_eq!(still.data.unwrap_or_default()["tls.crt"].0, b"x");

    // The pre-delete hook removes the webhook configuration under its own RBAC.
    let cleanup_kc = identity("pkg-rekindle-cleanup")?;
    let cleanup_args = job_args(&cleanup_jobs[0]);
    certs_gen(&cleanup_args, &cleanup_kc)?;
    assert!(configs.get_opt("pkg-rekindle").await?.is_none());
    // And again: already gone is fine.
    certs_gen(&cleanup_args, &cleanup_kc)?;
    ns.cleanup().await
}

fn copy_webhook_pki(to: &Path) -> Result<()> {
    let pki = state_dir().join("pki");
    for f in ["ca.crt", "ca.key", "webhook.crt", "webhook.key"] {
        std::fs::copy(pki.join(f), to.join(f)).with_context(|| format!("copying {f}"))?;
    }
    Ok(())
}

/// Creates a Deployment using app-config: whether the webhook stamped it at admission.
async fn created_stamped(client: &Client, ns: &str, name: &str) -> Result<bool> {
    deployment(name)
        .auto()
        .uses_configmap("app-config")
        .apply(client, ns)
        .await?;
    Ok(stamped(client, ns, name).await?.is_some())
}

async fn stamped(client: &Client, ns: &str, name: &str) -> Result<Option<String>> {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await?;
    let v = serde_json::to_value(d)?;
    Ok(v.pointer("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array)
        .and_then(|env| {
            env.iter()
                .find(|e| e["name"] == "STAKATER_APP_CONFIG_CONFIGMAP")
        })
        .and_then(|e| e["value"].as_str())
        .map(String::from))
}

#[tokio::test]
async fn under_the_charts_rbac_rekindle_reloads_serves_a_rotated_certificate_and_exports_valid_metrics(
) -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-rbac").await?;
    let kubeconfig = e2e::chart::install_identity(&client, "rbac", &ns.name).await?;
    let certs = tempfile::tempdir()?;
    copy_webhook_pki(certs.path())?;
    let cert = certs.path().join("webhook.crt");
    let key = certs.path().join("webhook.key");
    let tls_args = [
        format!("--tls-cert-file={}", cert.display()),
        format!("--tls-key-file={}", key.display()),
    ];
    let tls_args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let env = [("POD_NAMESPACE", ns.name.as_str())];
    apply_yaml(
        &client,
        Some(&ns.name),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config}\ndata: {greeting: hello}\n",
    )
    .await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            kubeconfig: Some(kubeconfig.clone()),
            args: &tls_args,
            env: &env,
            ..Default::default()
        },
    )
    .await?;

    // What the chart does not grant fails: rekindle's identity may read Secrets but never write them.
    let sa_client = client_from(&kubeconfig).await?;
    let sa_secrets: Api<Secret> = Api::namespaced(sa_client.clone(), &ns.name);
    let patch = sa_secrets
        .patch(
            "anything",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await;
    assert!(
        is_forbidden(&patch),
        "patching a Secret must be forbidden: {patch:?}"
    );
    let sa_cms: Api<ConfigMap> = Api::namespaced(sa_client, &ns.name);
    assert!(sa_cms.get("app-config").await.is_ok(), "reading is granted");

    // A reload with exactly the chart's permissions.
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    let h1 = wait_for("web stamped", TIMEOUT, || stamped(&client, &ns.name, "web")).await?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"greeting": "hi"}})),
        )
        .await?;
    wait_for("web reloaded", TIMEOUT, || async {
        Ok(stamped(&client, &ns.name, "web")
            .await?
            .filter(|h| *h != h1))
    })
    .await?;
    // Counted once the reload (and its Event) is done: wait until rekindle is idle.
    rk.settled(rk.handled().await?).await?;
    assert_eq!(rk.reloads(true).await?, 1.0);

    // Rotate the certificate on disk (same CA, shorter life): served without a restart.
    let expiry = "rekindle_tls_cert_not_after_timestamp_seconds";
    let before = rk.metric(expiry).await?;
    assert!(before > 0.0, "certificate expiry exported");
    std::fs::remove_file(&cert)?;
    let status = Command::new(root().join("target/debug/certs-gen"))
        .args(["local", "--days", "100", "--out"])
        .arg(certs.path())
        .output()?;
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let after = wait_for("the rotated certificate to be loaded", TIMEOUT, || async {
        let now = rk.metric(expiry).await?;
        Ok((now != before).then_some(now))
    })
    .await?;
    let days = (before - after) / 86_400.0;
    assert!(
        days > 200.0,
        "the 100-day certificate replaced the 365-day one ({days} days earlier)"
    );
    // The apiserver still trusts what is served: a new workload is stamped.
    assert!(
        created_stamped(&client, &ns.name, "web2").await?,
        "stamped with the new certificate"
    );

    // A renewal that leaves a broken pair is refused and counted; the good certificate is still
    // served and trusted. (The rotation above may have been seen half-written: count from here.)
    let refused = "rekindle_errors_total{kind=\"tls_cert\"}";
    let refused_before = rk.metric(refused).await?;
    std::fs::write(&cert, "not a certificate\n")?;
    wait_for("the broken pair to be refused", TIMEOUT, || async {
        Ok((rk.metric(refused).await? > refused_before).then_some(()))
    })
    .await?;
    assert_eq!(rk.metric(expiry).await?, after, "the good certificate kept");
    assert!(
        created_stamped(&client, &ns.name, "web3").await?,
        "stamped with the kept certificate"
    );
    // A client that does not speak TLS to the webhook is a failed handshake, counted.
    let handshakes = "rekindle_errors_total{kind=\"webhook_handshake\"}";
    let handshakes_before = rk.metric(handshakes).await?;
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", rk.webhook_port)).await?;
    tokio::io::AsyncWriteExt::write_all(&mut plain, b"GET /mutate HTTP/1.1\r\n\r\n").await?;
    let mut answer = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut plain, &mut answer).await;
    wait_for("the failed handshake to be counted", TIMEOUT, || async {
        Ok((rk.metric(handshakes).await? > handshakes_before).then_some(()))
    })
    .await?;

    // /metrics as real Prometheus parsers read it: OpenMetrics when asked for (as Prometheus does),
    // the classic text format otherwise (as Reloader serves it).
    let venv = String::from_utf8(
        Command::new(root().join("scripts/install-python-tools.sh"))
            .output()?
            .stdout,
    )?;
    for (accept, parser_module) in [
        (
            Some(e2e::rekindle::OPENMETRICS_ACCEPT),
            "prometheus_client.openmetrics.parser",
        ),
        (None, "prometheus_client.parser"),
    ] {
        let body = rk.metrics_as(accept).await?;
        let mut parser = Command::new(Path::new(venv.trim()).join("bin/python"))
            .args([
                "-c",
                &format!(
                    "import sys\nfrom {parser_module} import text_string_to_metric_families\n\
                     names = sorted(f.name for f in text_string_to_metric_families(sys.stdin.read()))\n\
                     print('\\n'.join(names))"
                ),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        use std::io::Write as _;
        parser.stdin.take().unwrap().write_all(body.as_bytes())?;
        let out = parser.wait_with_output()?;
        assert!(
            out.status.success(),
            "{parser_module} refused /metrics: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let families = String::from_utf8(out.stdout)?;
        for name in [
            "reloader_reload_executed",
            "reloader_workqueue_adds",
            "reloader_action_latency_seconds",
            "rekindle_admission_duration_seconds",
            "rekindle_tls_cert_not_after_timestamp_seconds",
            // An info metric is a gauge named `*_info` in the classic format.
            if accept.is_some() {
                "rekindle_build"
            } else {
                "rekindle_build_info"
            },
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "rest_client_requests",
            "rest_client_request_duration_seconds",
        ] {
            assert!(
                families.lines().any(|l| l == name),
                "{name} in {parser_module}'s {families}"
            );
        }
        if accept.is_none() {
            assert!(body.contains("# TYPE reloader_reload_executed_total counter\n"));
            assert!(!body.contains("# EOF"));
        }
    }
    drop(rk);
    ns.cleanup().await
}

/// Every document of every mode, hooks included, accepted by the apiserver (server-side dry-run):
/// schemas, CEL matchConditions, RBAC rules, cert-manager and Prometheus Operator objects (against
/// fixture CRDs with the real names).
#[tokio::test]
async fn every_chart_document_passes_a_server_side_dry_run() -> Result<()> {
    let client = admin_client().await?;
    // The Prometheus Operator's real CRDs (from its Go module): the ServiceMonitor, PodMonitor and
    // PrometheusRule are validated against their schemas. cert-manager's are fixtures.
    let monitoring =
        e2e::companions::bin_dir("prometheus")?.join("crds/monitoring.coreos.com.yaml");
    for crds in [
        root().join("e2e/fixtures/crds/cert-manager.yaml"),
        monitoring,
    ] {
        apply_yaml(&client, None, &std::fs::read_to_string(crds)?).await?;
    }
    let ns = TestNamespace::new(&client, "e2e-dry").await?;
    // CRDs take a moment to be served.
    wait_for("fixture CRDs served", TIMEOUT, || async {
        Ok(
            e2e::resource_for(&client, "monitoring.coreos.com/v1", "PrometheusRule")
                .await
                .ok()
                .and(
                    e2e::resource_for(&client, "cert-manager.io/v1", "Certificate")
                        .await
                        .ok(),
                )
                .map(|_| ()),
        )
    })
    .await?;
    let everything = [
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "podMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "rekindle.isArgoRollouts=true",
        "--set",
        "rekindle.enableCSIIntegration=true",
        "--set",
        "rekindle.namespaceSelector=team=a",
    ];
    let namespaced = format!("rekindle.namespaces={{{}}}", ns.name);
    let modes: [&[&str]; 4] = [
        &["--set", "certs.mode=certManager"],
        &["--set", "certs.mode=certsGen"],
        &[
            "--set",
            "certs.mode=external",
            "--set",
            "certs.external.caBundle=Zm9v",
        ],
        &["--set", &namespaced, "--set", "rekindle.autoReloadAll=true"],
    ];
    for mode in modes {
        let mut args = everything.to_vec();
        args.extend_from_slice(mode);
        let docs = render("dry", &ns.name, &args)?;
        assert!(docs.len() > 10, "{mode:?}: {} documents", docs.len());
        for doc in docs {
            let (api_version, kind, name) = (
                doc["apiVersion"].as_str().unwrap_or_default().to_string(),
                kind_of(&doc).to_string(),
                name_of(&doc).to_string(),
            );
            let namespace = doc
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or(&ns.name)
                .to_string();
            let api = e2e::dynamic_api(&client, &api_version, &kind, Some(&namespace)).await?;
            let mut params = PatchParams::apply("rekindle-e2e").force();
            params.dry_run = true;
            api.patch(&name, &params, &Patch::Apply(&doc))
                .await
                .with_context(|| format!("{mode:?}: dry-run of {kind}/{name} refused"))?;
        }
    }
    ns.cleanup().await
}
