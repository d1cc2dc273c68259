//! Chart unit tests: `helm lint --strict`, the schema, and the rendered documents for each certificate
//! mode and option. No cluster needed (helm only).

use anyhow::Result;
use e2e::chart::{helm, is_hook, kind_of, name_of, of_kind, render};
use serde_json::Value;

const NS: &str = "rekindle";

fn render_with(sets: &[&str]) -> Result<Vec<Value>> {
    let mut args = Vec::new();
    for s in sets {
        args.push("--set");
        args.push(s);
    }
    render("rekindle", NS, &args)
}

fn webhook(docs: &[Value]) -> &Value {
    let configs = of_kind(docs, "MutatingWebhookConfiguration");
    assert_eq!(configs.len(), 1);
    &configs[0]["webhooks"][0]
}

fn container<'a>(docs: &'a [Value], deployment: &str) -> &'a Value {
    let d = of_kind(docs, "Deployment")
        .into_iter()
        .find(|d| name_of(d) == deployment)
        .expect("deployment");
    &d["spec"]["template"]["spec"]["containers"][0]
}

fn args_of(c: &Value) -> Vec<String> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// Every rule of every ClusterRole/Role bound to the server's ServiceAccount.
fn server_rules(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|d| matches!(kind_of(d), "ClusterRole" | "Role") && name_of(d) == "rekindle")
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn grants(rules: &[Value], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        let has = |field: &str, want: &str| {
            r[field]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == want || v == "*"))
        };
        has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
    })
}

#[test]
fn lint_strict_passes() -> Result<()> {
    let chart = e2e::root().join("charts/rekindle");
    helm(&["lint", "--strict", &chart.to_string_lossy()])?;
    for mode in ["certsGen", "external"] {
        helm(&[
            "lint",
            "--strict",
            &chart.to_string_lossy(),
            "--set",
            &format!("certs.mode={mode}"),
            "--set",
            "certs.external.caBundle=Zm9v",
        ])?;
    }
    Ok(())
}

#[test]
fn schema_refuses_unknown_and_mistyped_keys() {
    for bad in [
        "bogus=1",
        "rekindle.bogus=1",
        "webhook.timeoutSeconds=31",
        "certs.mode=manual",
        "rekindle.reloadStrategy=restart",
        "replicaCount=0",
    ] {
        let err = render_with(&[bad]).expect_err(bad).to_string();
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "{bad}: {err}"
        );
    }
    render_with(&["global.imageRegistry=example"]).expect("global is allowed");
}

#[test]
fn cert_manager_mode_issues_through_cert_manager_and_never_renders_the_ca_bundle() -> Result<()> {
    let docs = render_with(&[])?;
    let certs = of_kind(&docs, "Certificate");
    let serving = certs
        .iter()
        .find(|c| name_of(c) == "rekindle-serving")
        .expect("serving certificate");
    assert_eq!(serving["spec"]["privateKey"]["algorithm"], "ECDSA");
    assert_eq!(serving["spec"]["renewBefore"], "720h");
    let dns: Vec<&str> = serving["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        dns,
        [
            "rekindle",
            "rekindle.rekindle",
            "rekindle.rekindle.svc",
            "rekindle.rekindle.svc.cluster.local"
        ]
    );
    let ca = certs.iter().find(|c| name_of(c) == "rekindle-ca").unwrap();
    assert_eq!(ca["spec"]["isCA"], true);
    assert_eq!(ca["spec"]["privateKey"]["rotationPolicy"], "Never");
    let config = &of_kind(&docs, "MutatingWebhookConfiguration")[0];
    assert_eq!(
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "rekindle/rekindle-serving"
    );
    assert!(webhook(&docs)["clientConfig"].get("caBundle").is_none());
    assert!(of_kind(&docs, "Job")
        .iter()
        .all(|j| name_of(j) != "rekindle-certs-gen-secrets"));

    // A user-supplied issuer replaces the chart's own CA.
    let docs = render_with(&[
        "certs.certManager.issuerRef.name=corp",
        "certs.certManager.issuerRef.kind=ClusterIssuer",
    ])?;
    assert!(of_kind(&docs, "Issuer").is_empty());
    let serving = &of_kind(&docs, "Certificate")[0];
    assert_eq!(serving["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    Ok(())
}

#[test]
fn certs_gen_mode_runs_hook_jobs_in_order_with_their_own_rbac() -> Result<()> {
    let docs = render_with(&["certs.mode=certsGen"])?;
    assert!(of_kind(&docs, "Certificate").is_empty());
    assert!(webhook(&docs)["clientConfig"].get("caBundle").is_none());
    let job = |name: &str| {
        of_kind(&docs, "Job")
            .into_iter()
            .find(|j| name_of(j) == name)
            .unwrap_or_else(|| panic!("job {name}"))
            .clone()
    };
    let secrets = job("rekindle-certs-gen-secrets");
    let bundle = job("rekindle-certs-gen-ca-bundle");
    assert_eq!(
        secrets["metadata"]["annotations"]["helm.sh/hook"],
        "pre-install,pre-upgrade"
    );
    assert_eq!(
        bundle["metadata"]["annotations"]["helm.sh/hook"],
        "post-install,post-upgrade"
    );
    let spec = &secrets["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "rekindle-certs-gen");
    assert_eq!(spec["containers"][0]["command"][0], "/certs-gen");
    let job_args = args_of(&spec["containers"][0]);
    assert!(job_args.contains(&"--phase=secrets".to_string()));
    assert!(job_args.contains(&"--service=rekindle".to_string()));
    // The hook RBAC runs before the Jobs (lower weight) in both phases, and is itself a hook.
    for kind in [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    ] {
        let obj = of_kind(&docs, kind)
            .into_iter()
            .find(|d| name_of(d) == "rekindle-certs-gen")
            .unwrap_or_else(|| panic!("{kind} rekindle-certs-gen"));
        let a = &obj["metadata"]["annotations"];
        assert_eq!(
            a["helm.sh/hook"],
            "pre-install,pre-upgrade,post-install,post-upgrade"
        );
        assert_eq!(a["helm.sh/hook-weight"], "-10");
    }
    // Least privilege: only its two Secrets are readable/updatable, only its webhook patchable.
    let role = of_kind(&docs, "Role")
        .into_iter()
        .find(|d| name_of(d) == "rekindle-certs-gen")
        .unwrap();
    let names = &role["rules"][1]["resourceNames"];
    assert_eq!(names, &serde_json::json!(["rekindle-tls", "rekindle-ca"]));
    // Hook Pods never carry the server's selector labels.
    let labels = &secrets["spec"]["template"]["metadata"]["labels"];
    assert_ne!(labels["app.kubernetes.io/name"], "rekindle");
    Ok(())
}

#[test]
fn external_mode_renders_the_given_ca_bundle_and_requires_it() -> Result<()> {
    let docs = render_with(&[
        "certs.mode=external",
        "certs.external.caBundle=Zm9v",
        "certs.secretName=mine",
    ])?;
    assert_eq!(webhook(&docs)["clientConfig"]["caBundle"], "Zm9v");
    assert!(of_kind(&docs, "Certificate").is_empty());
    let volumes = &of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"]["volumes"];
    assert_eq!(volumes[0]["secret"]["secretName"], "mine");
    let err = render_with(&["certs.mode=external"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("certs.external.caBundle is required"), "{err}");
    Ok(())
}

#[test]
fn webhook_follows_the_packaging_rules() -> Result<()> {
    let docs = render_with(&[])?;
    let w = webhook(&docs);
    assert_eq!(w["name"], "workloads.rekindle.io");
    assert_eq!(w["failurePolicy"], "Ignore");
    assert_eq!(w["sideEffects"], "NoneOnDryRun");
    assert_eq!(w["timeoutSeconds"], 2);
    assert_eq!(w["matchPolicy"], "Equivalent");
    assert_eq!(w["reinvocationPolicy"], "IfNeeded");
    let resources: Vec<String> = w["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_array().unwrap().clone())
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        resources,
        [
            "deployments",
            "statefulsets",
            "daemonsets",
            "cronjobs",
            "jobs"
        ]
    );
    let excluded = &w["namespaceSelector"]["matchExpressions"][0]["values"];
    for ns in ["kube-system", "kube-node-lease", "kube-public", NS] {
        assert!(excluded.as_array().unwrap().iter().any(|v| v == ns), "{ns}");
    }
    let conditions = w["matchConditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 2);
    assert!(conditions[0]["expression"]
        .as_str()
        .unwrap()
        .contains("system:serviceaccount:rekindle:rekindle"));
    // Auto-reload-all reloads workloads without annotations: no annotation condition then.
    let docs = render_with(&[
        "rekindle.autoReloadAll=true",
        "rekindle.isArgoRollouts=true",
    ])?;
    let w = webhook(&docs);
    assert_eq!(w["matchConditions"].as_array().unwrap().len(), 1);
    assert!(w["rules"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["apiGroups"][0] == "argoproj.io"));
    Ok(())
}

/// Pod restarts (the default): a second webhook entry for pod creation, sent only pods labelled
/// `rekindle.io/restart: pods`, called as the first; the pods watched and evicted. `podRestarts=false`
/// leaves out the entry and those permissions, and passes the flag.
#[test]
fn pod_restarts_add_a_labelled_pods_webhook_entry_and_their_permissions() -> Result<()> {
    let docs = render_with(&[])?;
    let configs = of_kind(&docs, "MutatingWebhookConfiguration");
    let entries = configs[0]["webhooks"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    let (workloads, pods) = (&entries[0], &entries[1]);
    assert_eq!(pods["name"], "pods.rekindle.io");
    assert_eq!(
        pods["rules"],
        serde_json::json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["pods"], "scope": "Namespaced"}])
    );
    assert_eq!(
        pods["objectSelector"],
        serde_json::json!({"matchLabels": {"rekindle.io/restart": "pods"}})
    );
    for field in [
        "clientConfig",
        "namespaceSelector",
        "failurePolicy",
        "timeoutSeconds",
        "sideEffects",
    ] {
        assert_eq!(pods[field], workloads[field], "{field} as the first entry");
    }
    assert_eq!(pods["matchConditions"][0], workloads["matchConditions"][0]);
    let rules = server_rules(&docs);
    assert!(grants(&rules, "", "pods", "watch"));
    assert!(grants(&rules, "", "pods/eviction", "create"));
    assert!(
        !grants(&rules, "", "pods", "delete"),
        "evicted, never deleted"
    );

    let docs = render_with(&["rekindle.podRestarts=false"])?;
    let configs = of_kind(&docs, "MutatingWebhookConfiguration");
    assert_eq!(configs[0]["webhooks"].as_array().unwrap().len(), 1);
    let rules = server_rules(&docs);
    assert!(!grants(&rules, "", "pods", "watch"));
    assert!(!grants(&rules, "", "pods/eviction", "create"));
    assert!(args_of(container(&docs, "rekindle")).contains(&"--pod-restarts=false".to_string()));
    Ok(())
}

#[test]
fn rbac_is_least_privilege_and_optional_rules_follow_the_options() -> Result<()> {
    let docs = render_with(&[])?;
    let rules = server_rules(&docs);
    assert!(grants(&rules, "apps", "deployments", "patch"));
    assert!(grants(&rules, "batch", "jobs", "create"));
    assert!(grants(&rules, "", "secrets", "watch"));
    assert!(grants(&rules, "events.k8s.io", "events", "create"));
    assert!(
        !grants(&rules, "", "secrets", "patch"),
        "never writes Secrets"
    );
    assert!(!grants(&rules, "apps", "deployments", "delete"));
    assert!(
        grants(&rules, "", "namespaces", "watch") && !grants(&rules, "", "namespaces", "patch"),
        "Namespaces are read, for their default reload window"
    );
    assert!(!grants(&rules, "argoproj.io", "rollouts", "patch"));
    assert!(!grants(
        &rules,
        "secrets-store.csi.x-k8s.io",
        "secretproviderclasspodstatuses",
        "watch"
    ));
    for r in &rules {
        assert!(!r.to_string().contains("\"*\""), "no wildcard: {r}");
    }
    let docs = render_with(&[
        "rekindle.isArgoRollouts=true",
        "rekindle.isOpenshift=true",
        "rekindle.enableCSIIntegration=true",
        "rekindle.namespaceSelector=team=a",
    ])?;
    let rules = server_rules(&docs);
    assert!(grants(&rules, "argoproj.io", "rollouts", "patch"));
    assert!(grants(
        &rules,
        "apps.openshift.io",
        "deploymentconfigs",
        "patch"
    ));
    assert!(grants(
        &rules,
        "secrets-store.csi.x-k8s.io",
        "secretproviderclasspodstatuses",
        "watch"
    ));
    assert!(grants(&rules, "", "namespaces", "watch"));

    // --namespaces: Roles in those namespaces, no ClusterRole for the server but one reading those
    // Namespace objects themselves (their default reload window).
    let docs = render_with(&["rekindle.namespaces={team-a,team-b}"])?;
    let cluster_roles: Vec<&Value> = of_kind(&docs, "ClusterRole")
        .into_iter()
        .filter(|d| name_of(d) != "rekindle-cleanup")
        .collect();
    assert_eq!(
        cluster_roles.iter().map(|d| name_of(d)).collect::<Vec<_>>(),
        ["rekindle-namespaces"]
    );
    assert_eq!(
        cluster_roles[0]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["namespaces"],
            "resourceNames": ["team-a", "team-b"], "verbs": ["get", "list", "watch"]}])
    );
    let roles: Vec<&str> = of_kind(&docs, "Role")
        .into_iter()
        .filter(|d| name_of(d) == "rekindle")
        .map(|d| d["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["team-a", "team-b"]);
    assert!(
        args_of(container(&docs, "rekindle")).contains(&"--namespaces=team-a,team-b".to_string())
    );
    Ok(())
}

#[test]
fn deployment_is_hardened_ha_and_probed_without_leadership() -> Result<()> {
    let docs = render_with(&[])?;
    let d = &of_kind(&docs, "Deployment")[0];
    assert_eq!(d["spec"]["replicas"], 2);
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = container(&docs, "rekindle");
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["runAsUser"], 65532);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    let args = args_of(c);
    assert!(args.contains(&"--enable-ha=true".to_string()));
    assert!(args.contains(&"--tls-cert-file=/tls/tls.crt".to_string()));
    // The whole Secret as a directory, never subPath (kubelet updates would not arrive).
    assert!(c["volumeMounts"][0].get("subPath").is_none());
    let pdb = &of_kind(&docs, "PodDisruptionBudget")[0];
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    // One replica: no PDB (it would block every drain).
    let docs = render_with(&["replicaCount=1"])?;
    assert!(of_kind(&docs, "PodDisruptionBudget").is_empty());
    // Flags map one to one.
    let docs = render_with(&[
        "rekindle.reloadStrategy=annotations",
        "rekindle.reloadOnDelete=true",
        "rekindle.ignoredWorkloadTypes={jobs}",
        "rekindle.annotations.auto=example.com/auto",
    ])?;
    let args = args_of(container(&docs, "rekindle"));
    for want in [
        "--reload-strategy=annotations",
        "--reload-on-delete=true",
        "--ignored-workload-types=jobs",
        "--auto-annotation=example.com/auto",
    ] {
        assert!(args.contains(&want.to_string()), "{want} in {args:?}");
    }
    // A renamed annotation reaches the webhook: the CEL condition tests for it too.
    let conditions = webhook(&docs)["matchConditions"].to_string();
    assert!(
        conditions.contains("k.contains('example.com/auto')"),
        "{conditions}"
    );
    assert!(conditions.contains("k.contains('reloader.stakater.com/')"));
    Ok(())
}

#[test]
fn without_ha_one_replica_runs_and_no_pdb_blocks_drains() -> Result<()> {
    let docs = render_with(&["rekindle.enableHA=false", "replicaCount=3"])?;
    let d = &of_kind(&docs, "Deployment")[0];
    assert_eq!(d["spec"]["replicas"], 1, "every replica would write");
    assert!(!args_of(container(&docs, "rekindle")).contains(&"--enable-ha=true".to_string()));
    assert!(of_kind(&docs, "PodDisruptionBudget").is_empty());
    Ok(())
}

#[test]
fn monitors_point_at_the_port_that_serves_metrics() -> Result<()> {
    let docs = render_with(&[
        "serviceMonitor.enabled=true",
        "podMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "grafanaDashboard.enabled=true",
    ])?;
    let c = container(&docs, "rekindle");
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "http-metrics")
        .expect("metrics port");
    let args = args_of(c);
    assert!(args.contains(&format!("--admin-addr=:{}", port["containerPort"])));
    let svc = &of_kind(&docs, "Service")[0];
    assert!(svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "http-metrics" && p["targetPort"] == "http-metrics"));
    let sm = &of_kind(&docs, "ServiceMonitor")[0]["spec"]["endpoints"][0];
    assert_eq!(
        (sm["port"].as_str(), sm["path"].as_str()),
        (Some("http-metrics"), Some("/metrics"))
    );
    let pm = &of_kind(&docs, "PodMonitor")[0]["spec"]["podMetricsEndpoints"][0];
    assert_eq!(
        (pm["port"].as_str(), pm["path"].as_str()),
        (Some("http-metrics"), Some("/metrics"))
    );
    let rule = &of_kind(&docs, "PrometheusRule")[0];
    let alerts: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(
        alerts,
        [
            "RekindleWebhookFailingOpen",
            "RekindleAdmissionSlow",
            "RekindleReloadsFailing",
            "RekindleCertificateExpiring",
            "RekindleCertificateRefused",
            "RekindleNoReadyReplica",
            "RekindleNoLeader",
            "RekindleReloadHalted"
        ]
    );
    let dashboard = &of_kind(&docs, "ConfigMap")[0]["data"]["rekindle.json"];
    let parsed: Value = serde_json::from_str(dashboard.as_str().unwrap())?;
    assert_eq!(parsed["uid"], "rekindle");
    Ok(())
}

#[test]
fn hooks_and_test_pod_use_the_projects_own_binaries() -> Result<()> {
    let docs = render_with(&[])?;
    let cleanup = of_kind(&docs, "Job")
        .into_iter()
        .find(|j| name_of(j) == "rekindle-cleanup")
        .expect("pre-delete job");
    assert_eq!(
        cleanup["metadata"]["annotations"]["helm.sh/hook"],
        "pre-delete"
    );
    let c = &cleanup["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["command"][0], "/certs-gen");
    assert_eq!(
        args_of(c),
        [
            "cleanup",
            "--webhook-config=rekindle",
            "--namespace=rekindle",
            "--deployment=rekindle",
            "--lease=rekindle-leader"
        ]
    );
    // In certsGen mode the hook also removes the Secrets certs-gen made (Helm does not own them).
    let docs = render_with(&["certs.mode=certsGen"])?;
    let cleanup = of_kind(&docs, "Job")
        .into_iter()
        .find(|j| name_of(j) == "rekindle-cleanup")
        .expect("pre-delete job");
    let args = args_of(&cleanup["spec"]["template"]["spec"]["containers"][0]);
    assert!(
        args.contains(&"--secret=rekindle-tls".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--secret=rekindle-ca".to_string()),
        "{args:?}"
    );
    // The Lease is per release and the server uses that name.
    let server = args_of(container(&docs, "rekindle"));
    assert!(server.contains(&"--leader-election-lease-name=rekindle-leader".to_string()));
    let renew = of_kind(&docs, "CronJob");
    assert_eq!(renew.len(), 1, "certsGen renews from a CronJob");
    let renew_args =
        args_of(&renew[0]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]);
    assert!(renew_args.contains(&"--phase=all".to_string()));
    assert!(of_kind(
        &render_with(&[
            "certs.mode=certsGen",
            "certs.certsGen.renewal.enabled=false"
        ])?,
        "CronJob"
    )
    .is_empty());
    let test = of_kind(&docs, "Pod")
        .into_iter()
        .find(|p| is_hook(p))
        .expect("helm test pod");
    let args = args_of(&test["spec"]["containers"][0]);
    assert_eq!(args[0], "healthcheck");
    assert!(args.iter().any(|a| a.ends_with("/ready")));
    Ok(())
}

#[test]
fn webhook_config_dir_matches_the_chart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    e2e::chart::render_webhook_config(dir.path())?;
    for file in ["rekindle.yaml", "certs-gen.yaml"] {
        let want = std::fs::read_to_string(dir.path().join(file))?;
        let have = std::fs::read_to_string(e2e::chart::webhook_config_dir().join(file))?;
        assert!(
            want == have,
            "webhook-config/{file} differs from the chart's output: run `just webhook-config`"
        );
    }
    Ok(())
}

/// A team coming from Reloader: its values file, converted by `rekindle migrate-values`, installs and
/// renders what it asked for; every key with no equivalent is named on stderr.
#[test]
fn a_reloader_values_file_migrates_and_renders_what_it_set() -> Result<()> {
    let fixture = e2e::root().join("e2e/fixtures/migrate/cases/everything.values.yaml");
    let out = std::process::Command::new(e2e::rekindle_binary()?)
        .args(["migrate-values", "--namespace", NS])
        .arg(&fixture)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // `kubernetes.host` is at the chart's default there: nothing to say about it.
    assert!(!stderr.contains("kubernetes.host"), "{stderr}");
    for dropped in [
        "image",
        "reloader.enablePProf",
        "reloader.serviceMonitor.scheme",
    ] {
        assert!(
            stderr.contains(&format!("warning: {dropped}")),
            "{dropped} in {stderr}"
        );
    }
    assert_eq!(
        stderr.lines().count(),
        4,
        "only what has no equivalent: {stderr}"
    );
    let values = tempfile::NamedTempFile::new()?;
    std::fs::write(values.path(), &out.stdout)?;
    let path = values.path().to_str().unwrap().to_string();
    let docs = render(
        "rekindle",
        NS,
        &["-f", &path, "--set", "certs.mode=certsGen"],
    )?;

    let d = &of_kind(&docs, "Deployment")[0];
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["spec"]["revisionHistoryLimit"], 4);
    assert_eq!(d["metadata"]["labels"]["provider"], "stakater");
    assert_eq!(d["metadata"]["annotations"]["owner"], "platform");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["pool"], "infra");
    assert_eq!(
        pod["tolerations"][0]["key"],
        "node-role.kubernetes.io/infra"
    );
    assert!(pod["affinity"]["podAntiAffinity"].is_object());
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["securityContext"]["runAsUser"], 65534);
    assert_eq!(pod["imagePullSecrets"][0]["name"], "pull-secret");
    assert!(pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["name"] == "extra"));
    assert_eq!(
        d["spec"]["template"]["metadata"]["annotations"]["sidecar.istio.io/inject"],
        "false"
    );
    // nameOverride carried over: the objects are named after it.
    assert_eq!(name_of(d), "rekindle-reloader");
    let c = container(&docs, name_of(d));
    assert!(c["image"]
        .as_str()
        .unwrap()
        .starts_with("registry.example.com/"));
    assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
    // Reloader's probe tuning merges into rekindle's probes.
    assert_eq!(c["livenessProbe"]["timeoutSeconds"], 5);
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/live");
    assert_eq!(c["readinessProbe"]["timeoutSeconds"], 15);
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    assert!(c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["mountPath"] == "/extra"));
    // Reloader's env.secret goes into a Secret of the chart's, never into the Deployment in plain text.
    let env = c["env"].to_string();
    assert!(!env.contains("https://hooks.example.com/x"), "{env}");
    assert!(of_kind(&docs, "Secret")
        .iter()
        .any(|s| s["data"]["ALERT_WEBHOOK_URL"].is_string()));
    for name in [
        "ALERT_ON_RELOAD",
        "ALERT_WEBHOOK_URL",
        "MY_NODE",
        "ALERT_SINK",
        "METRICS_COUNT_BY_NAMESPACE",
    ] {
        assert!(env.contains(name), "{name} in {env}");
    }
    let args = args_of(c);
    for want in [
        "--auto-reload-all=true",
        "--is-Argo-Rollouts=true",
        "--resources-to-ignore=configMaps",
        "--ignored-workload-types=jobs,cronjobs",
        "--reload-on-create=true",
        "--reload-on-delete=true",
        "--sync-after-restart=true",
        "--reload-strategy=annotations",
        "--namespaces-to-ignore=kube-system,tools-ignored",
        "--namespace-selector=team=a",
        "--resource-label-selector=reload=yes",
        "--log-format=json",
        "--log-level=debug",
        "--enable-ha=true",
        "--configmap-annotation=my.company.com/configmap",
        "--secret-annotation=my.company.com/secret",
        "--auto-annotation=my.company.com/auto",
        "--auto-search-annotation=my.company.com/search",
        "--search-match-annotation=my.company.com/match",
    ] {
        assert!(args.contains(&want.to_string()), "{want} in {args:?}");
    }
    let svc = &of_kind(&docs, "Service")[0];
    assert_eq!(svc["metadata"]["labels"]["team"], "platform");
    assert_eq!(svc["metadata"]["annotations"]["svc"], "annotated");
    assert!(of_kind(&docs, "ServiceAccount")
        .iter()
        .any(|sa| name_of(sa) == "reloader-sa"));
    assert_eq!(
        pod["serviceAccountName"], "reloader-sa",
        "the server runs as the migrated ServiceAccount"
    );
    let sm = &of_kind(&docs, "ServiceMonitor")[0];
    assert_eq!(sm["metadata"]["namespace"], "monitoring");
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(sm["spec"]["targetLabels"][0], "team");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["interval"], "15s");
    assert_eq!(ep["scrapeTimeout"], "5s");
    assert_eq!(ep["honorLabels"], true);
    assert_eq!(ep["metricRelabelings"][0]["action"], "keep");
    assert_eq!(ep["relabelings"][0]["targetLabel"], "nodename");
    let pm = &of_kind(&docs, "PodMonitor")[0];
    assert_eq!(pm["spec"]["podTargetLabels"][0], "app");
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["scrapeTimeout"], "6s");
    let pdb = &of_kind(&docs, "PodDisruptionBudget")[0];
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"].get("minAvailable").is_none());
    // autoReloadAll: every workload goes to the webhook, not only annotated ones.
    assert!(!webhook(&docs)["matchConditions"]
        .to_string()
        .contains("has-reload-annotation"));
    Ok(())
}

#[test]
fn annotation_scraping_and_where_rules_and_dashboards_go() -> Result<()> {
    let annotations = |docs: &[Value]| {
        of_kind(docs, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"].clone()
    };
    let docs = render_with(&[])?;
    let a = annotations(&docs);
    assert_eq!(a["prometheus.io/scrape"], "true");
    assert_eq!(a["prometheus.io/port"], "9090");
    assert_eq!(a["prometheus.io/path"], "/metrics");
    // A monitor scrapes already: no annotations, or Prometheus would scrape twice.
    let docs = render_with(&["serviceMonitor.enabled=true", "podAnnotations.team=a"])?;
    let a = annotations(&docs);
    assert!(a.get("prometheus.io/scrape").is_none(), "{a}");
    assert_eq!(a["team"], "a");
    let docs = render_with(&[
        "prometheusRule.enabled=true",
        "prometheusRule.namespace=monitoring",
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.namespace=grafana",
    ])?;
    assert_eq!(
        of_kind(&docs, "PrometheusRule")[0]["metadata"]["namespace"],
        "monitoring"
    );
    let dashboard = of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("dashboard ConfigMap");
    assert_eq!(dashboard["metadata"]["namespace"], "grafana");
    Ok(())
}

/// The PrometheusRule's rules pass `promtool check rules`, and `promtool test rules` runs a unit test
/// per alert (e2e/fixtures/prometheus/rules-test.yaml) in which it fires and one in which it is silent.
#[test]
fn prometheus_rules_pass_promtool_check_and_a_unit_test_per_alert() -> Result<()> {
    use std::collections::BTreeMap;

    let docs = render_with(&["prometheusRule.enabled=true"])?;
    let rule = of_kind(&docs, "PrometheusRule");
    assert_eq!(rule.len(), 1);
    let groups = rule[0]["spec"]["groups"].clone();
    let annotations: BTreeMap<String, Value> = groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_string(),
                r["annotations"].clone(),
            )
        })
        .collect();
    assert_eq!(annotations.len(), 8, "{:?}", annotations.keys());

    let fixture = e2e::root().join("e2e/fixtures/prometheus/rules-test.yaml");
    let mut tests: Value = serde_saphyr::from_str(&std::fs::read_to_string(&fixture)?)?;
    // Every alert has a case where it fires and one where it is silent.
    let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for case in tests["tests"].as_array_mut().unwrap() {
        for check in case["alert_rule_test"].as_array_mut().unwrap() {
            let alert = check["alertname"].as_str().unwrap().to_string();
            let expected = check["exp_alerts"].as_array_mut().unwrap();
            let entry = seen.entry(alert.clone()).or_default();
            if expected.is_empty() {
                entry.1 = true;
            } else {
                entry.0 = true;
            }
            for e in expected {
                e["exp_annotations"] = annotations[&alert].clone();
            }
        }
    }
    for alert in annotations.keys() {
        assert_eq!(
            seen.get(alert),
            Some(&(true, true)),
            "{alert} needs a case where it fires and one where it is silent"
        );
    }

    let dir = tempfile::tempdir()?;
    // YAML is a superset of JSON: promtool reads both files as written.
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_json::to_string(&serde_json::json!({ "groups": groups }))?,
    )?;
    std::fs::write(dir.path().join("test.yaml"), serde_json::to_string(&tests)?)?;
    let promtool = e2e::companions::bin_dir("prometheus")?.join("promtool");
    let checked = e2e::companions::run(&promtool, &["check", "rules", "rules.yaml"], dir.path())?;
    assert!(checked.contains("SUCCESS: 8 rules found"), "{checked}");
    let tested = e2e::companions::run(&promtool, &["test", "rules", "test.yaml"], dir.path())?;
    assert!(tested.contains("SUCCESS"), "{tested}");
    Ok(())
}

/// `prometheusRule.alertFor` replaces an alert's `for` and leaves the others at their defaults.
#[test]
fn prometheus_rule_for_durations_can_be_overridden_per_alert() -> Result<()> {
    let docs = render_with(&[
        "prometheusRule.enabled=true",
        "prometheusRule.alertFor.RekindleReloadsFailing=15m",
    ])?;
    let rules = &of_kind(&docs, "PrometheusRule")[0]["spec"]["groups"][0]["rules"];
    let for_of = |alert: &str| {
        rules
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["alert"] == alert)
            .map(|r| r["for"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(for_of("RekindleReloadsFailing"), "15m");
    assert_eq!(for_of("RekindleNoReadyReplica"), "10m");
    assert!(render_with(&[
        "prometheusRule.enabled=true",
        "prometheusRule.alertFor.RekindleReloadsFailing=soon",
    ])
    .is_err());
    Ok(())
}

/// For each values file of e2e/fixtures/migrate/cases/, the controller rekindle's chart runs from the
/// values `rekindle migrate-values` makes of it behaves as the one Reloader's chart rendered from it (the
/// recorded facts beside it): the same configuration once both command lines and environments are
/// parsed by rekindle's flag parser, the same extra environment, replicas, pod fields and IP families,
/// Roles in the same namespaces, and every permission Reloader's ServiceAccount had.
#[test]
fn migrated_values_run_the_controller_reloaders_chart_ran() -> Result<()> {
    use e2e::migration::{
        api_version_args, behaviour, cases, differences, facts, missing_grants, Facts, NAMESPACE,
        RELEASE,
    };
    let mut failures = Vec::new();
    let cases = cases()?;
    assert!(cases.len() >= 15, "{} cases", cases.len());
    for case in cases {
        let text = std::fs::read_to_string(&case.recorded)?;
        let reloader: Facts = serde_saphyr::from_str(&text)?;
        let given: Value = serde_saphyr::from_str(&std::fs::read_to_string(&case.values)?)?;
        let out = std::process::Command::new(e2e::rekindle_binary()?)
            .args(["migrate-values", "--namespace", NAMESPACE])
            .arg(&case.values)
            .output()?;
        assert!(
            out.status.success(),
            "{}: {}",
            case.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let values = tempfile::NamedTempFile::new()?;
        std::fs::write(values.path(), &out.stdout)?;
        let path = values.path().to_string_lossy().into_owned();
        let mut args = vec!["-f", path.as_str()];
        args.extend(api_version_args());
        let rekindle = facts(&render(RELEASE, NAMESPACE, &args)?)?;

        let (mut want, mut got) = (behaviour(&reloader)?, behaviour(&rekindle)?);
        // The charts' own defaults for these differ (Reloader's runs as 65534, rekindle's as 65532;
        // rekindle's spreads replicas over nodes): compared only when the values set them.
        for (field, key) in [
            ("securityContext", "securityContext"),
            ("topologySpreadConstraints", "topologySpreadConstraints"),
        ] {
            let set = given
                .pointer(&format!("/reloader/deployment/{key}"))
                .is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()));
            if !set {
                want.pod.remove(field);
                got.pod.remove(field);
            }
        }
        // replicas > 1 without enableHA: Reloader's chart passes --enable-ha but not its node
        // preference; rekindle's adds the preference, which places nothing with one replica.
        let elects_alone = want.replicas == 1 && want.config["leader election"] == "true";
        if elects_alone && !want.pod.contains_key("affinity") {
            got.pod.remove("affinity");
        }
        for difference in differences(&want, &got)? {
            failures.push(format!("{}: {difference}", case.name));
        }
        // rekindle's root filesystem is read-only whatever Reloader's was.
        if reloader.read_only_root && !rekindle.read_only_root {
            failures.push(format!("{}: the root filesystem is writable", case.name));
        }
        let missing = missing_grants(&reloader, &rekindle);
        if !missing.is_empty() {
            failures.push(format!("{}: permissions missing: {missing:?}", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
