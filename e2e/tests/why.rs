//! `rekindle why` (and `kubectl rekindle why`) against the real apiserver, with rekindle running,
//! stopped and back: each state the interface names, read from the cluster as it is.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use e2e::fixtures::{deployment, env_value};
use e2e::policy::refuse_new_pods;
use e2e::rekindle::{Options, Rekindle};
use e2e::{
    admin_client, apply_value, apply_yaml, dynamic_api, get_json, kubeconfig_path, rekindle_binary,
    state_dir, wait_for, TestNamespace, TIMEOUT,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

const CM: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config}\ndata: {greeting: hello}\n";
const MARKER_ENV: &str = "STAKATER_APP_CONFIG_CONFIGMAP";

async fn change_cm(client: &Client, ns: &str, value: &str) -> Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"greeting": value}})),
        )
        .await?;
    Ok(())
}

/// Runs `rekindle why ARGS -o json` (as `program`, with `path_dir` first on PATH): the exit code and
/// the objects printed, one per line.
fn run(
    program: &Path,
    path_dir: Option<&Path>,
    args: &[&str],
) -> Result<(i32, Vec<Value>, String)> {
    let mut cmd = Command::new(program);
    cmd.args(args).arg("--kubeconfig").arg(kubeconfig_path());
    if let Some(dir) = path_dir {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", dir.display()));
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let objects = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), objects, text))
}

fn why(args: &[&str]) -> Result<(i32, Vec<Value>, String)> {
    let mut all = vec!["why"];
    all.extend_from_slice(args);
    run(&rekindle_binary()?, None, &all)
}

/// The one answer about `target` in `ns`.
fn answer(target: &str, ns: &str) -> Result<Value> {
    let (code, objects, text) = why(&[target, "-n", ns, "-o", "json"])?;
    if code != 0 || objects.len() != 1 {
        bail!("why {target} exited {code}: {text}");
    }
    Ok(objects.into_iter().next().unwrap_or_default())
}

/// The names the namespace listing gives, sorted.
fn listed(ns: &str) -> Result<Vec<String>> {
    let (code, objects, text) = why(&["-n", ns, "-o", "json"])?;
    if code != 0 {
        bail!("why -n {ns} exited {code}: {text}");
    }
    let mut names: Vec<String> = objects
        .iter()
        .filter_map(|o| o["workload"]["name"].as_str().map(String::from))
        .collect();
    names.sort();
    Ok(names)
}

fn daily_window(opens: jiff::Timestamp, minutes: i64) -> String {
    let closes = opens + jiff::SignedDuration::from_mins(minutes);
    format!("* {}-{}", opens.strftime("%H:%M"), closes.strftime("%H:%M"))
}

#[tokio::test]
async fn why_answers_from_the_cluster_as_it_is() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-why").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let mut rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    // A window opening on the next whole minute at least two hours away.
    let now = jiff::Timestamp::now();
    let opens = jiff::Timestamp::from_second((now.as_second() / 60 + 121) * 60)?;
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    deployment("plain")
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    deployment("windowed")
        .annotations(json!({"reloader.stakater.com/auto": "true",
            "rekindle.io/reload-window": daily_window(opens, 60)}))
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    rk.wait_indexed(3.0).await?;

    let web = answer("deploy/web", &ns.name)?;
    assert_eq!(web["state"], "current", "{web}");
    assert_eq!(
        web["workload"],
        json!({"kind": "Deployment", "namespace": ns.name, "name": "web"})
    );
    let res = &web["resources"][0];
    assert_eq!(
        (res["kind"].as_str(), res["name"].as_str()),
        (Some("ConfigMap"), Some("app-config"))
    );
    assert_eq!(res["marker"], res["current"], "{web}");
    assert_eq!(res["reload"], true);
    assert_eq!(res["reason"], "already-current");
    assert!(web["deferred"].is_null());
    assert_eq!(listed(&ns.name)?, Vec::<String>::new(), "nothing owed yet");

    let handled = rk.handled().await?;
    change_cm(&client, &ns.name, "one").await?;
    rk.settled(handled + 1.0).await?;
    let web = answer("deployments.apps/web", &ns.name)?;
    assert_eq!(web["state"], "current", "{web}");
    assert!(
        web["lastReload"]["at"].is_string(),
        "the Reloaded Event: {web}"
    );
    let plain = answer("deploy/plain", &ns.name)?;
    assert_eq!(plain["state"], "not-reloaded", "{plain}");
    assert_eq!(plain["resources"][0]["reason"], "no-annotation");
    assert_eq!(plain["resources"][0]["reload"], false);
    let windowed = answer("Deployment/windowed", &ns.name)?;
    assert_eq!(windowed["state"], "deferred", "{windowed}");
    assert_eq!(windowed["deferred"]["reason"], "window");
    let until: jiff::Timestamp = windowed["deferred"]["until"]
        .as_str()
        .context("until")?
        .parse()?;
    assert_eq!(until, opens, "{windowed}");
    assert_eq!(listed(&ns.name)?, ["windowed"]);
    // The text an on-call engineer reads (shown with --nocapture).
    for target in ["deploy/web", "deploy/plain", "deploy/windowed"] {
        println!(
            "$ rekindle why {target}\n{}",
            why(&[target, "-n", &ns.name])?.2
        );
    }

    // Stopped: the change is owed, and nothing is writing.
    rk.kill().await?;
    change_cm(&client, &ns.name, "two").await?;
    let web = wait_for("web to be owed", TIMEOUT, || async {
        let web = answer("deploy/web", &ns.name)?;
        Ok((web["state"] == "owed").then_some(web))
    })
    .await?;
    assert!(web["deferred"].is_null());
    assert!(web["writer"]["leader"].is_null(), "{web}");
    assert_ne!(
        web["resources"][0]["marker"],
        web["resources"][0]["current"]
    );
    assert_eq!(listed(&ns.name)?, ["web", "windowed"]);
    let (_, _, text) = why(&["deploy/web", "-n", &ns.name])?;
    println!("$ rekindle why deploy/web (rekindle stopped)\n{text}");
    println!(
        "$ rekindle why -n {}\n{}",
        ns.name,
        why(&["-n", &ns.name])?.2
    );
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.contains("OWED") && first.contains("app-config"),
        "{text}"
    );

    // Back: the catch-up writes it.
    rk.restart().await?;
    wait_for("web to be current again", TIMEOUT, || async {
        Ok((answer("deploy/web", &ns.name)?["state"] == "current").then_some(()))
    })
    .await?;
    assert_eq!(listed(&ns.name)?, ["windowed"]);

    // kubectl finds the binary as the plugin `kubectl-rekindle`.
    let plugins = tempfile::tempdir()?;
    std::os::unix::fs::symlink(rekindle_binary()?, plugins.path().join("kubectl-rekindle"))?;
    let env = std::fs::read_to_string(state_dir().join("env"))?;
    let bin = env
        .lines()
        .find_map(|l| l.strip_prefix("BIN="))
        .context("no BIN in the cluster's env")?;
    let kubectl = Path::new(bin).join("kubectl");
    let (code, objects, text) = run(
        &kubectl,
        Some(plugins.path()),
        &[
            "rekindle",
            "why",
            "deploy/web",
            "-n",
            &ns.name,
            "-o",
            "json",
        ],
    )?;
    assert_eq!(code, 0, "{text}");
    assert_eq!(objects.len(), 1, "{text}");
    assert_eq!(objects[0]["state"], "current");

    // Exit status: 1 when the workload cannot be read, 2 for bad arguments.
    let (code, _, text) = why(&["deploy/missing", "-n", &ns.name])?;
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("not found"), "{text}");
    let (code, _, text) = why(&["pod/web", "-n", &ns.name])?;
    assert_eq!(code, 2, "{text}");
    rk.stop().await?;
    ns.cleanup().await
}

/// Whether a Deployment's rollout finished (its controller saw the spec, every replica updated and
/// available).
fn finished(d: &Value) -> bool {
    let n = |p: &str| d.pointer(p).and_then(Value::as_i64).unwrap_or(-1);
    n("/status/observedGeneration") == n("/metadata/generation")
        && n("/status/updatedReplicas") == n("/spec/replicas")
        && n("/status/availableReplicas") == n("/spec/replicas")
}

/// A canary whose new pods are refused: while its rollout runs, its sibling is `deferred` (canary);
/// once it fails at its progress deadline and halts the change, the sibling is `halted`, naming it.
#[tokio::test]
async fn the_siblings_of_a_failing_canary_are_deferred_then_halted() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-why-canary").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let rk = Rekindle::start(
        &client,
        &[&ns.name],
        Options {
            args: &["--reload-debounce=0"],
            ..Default::default()
        },
    )
    .await?;
    let mut canary = deployment("canary")
        .annotations(
            json!({"reloader.stakater.com/auto": "true", "rekindle.io/reload-canary": "true"}),
        )
        .uses_configmap("app-config")
        .build();
    canary["spec"]["progressDeadlineSeconds"] = json!(20);
    apply_value(&client, Some(&ns.name), canary).await?;
    deployment("sibling")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    rk.wait_indexed(2.0).await?;
    let deployments: Api<DynamicObject> =
        dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    for name in ["canary", "sibling"] {
        wait_for("the first rollouts", TIMEOUT, || async {
            Ok(finished(&get_json(&deployments, name).await?).then_some(()))
        })
        .await?;
    }
    let stamped = env_value(&get_json(&deployments, "canary").await?, MARKER_ENV)
        .context("the canary was not stamped")?;
    let _policy = refuse_new_pods(&client, &ns.name, &["canary"], MARKER_ENV, &stamped).await?;

    change_cm(&client, &ns.name, "broken").await?;
    let deferred = wait_for("the sibling to wait for the canary", TIMEOUT, || async {
        let s = answer("deploy/sibling", &ns.name)?;
        Ok((s["state"] == "deferred").then_some(s))
    })
    .await?;
    assert_eq!(deferred["deferred"]["reason"], "canary", "{deferred}");
    assert!(
        deferred["deferred"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("canary"),
        "{deferred}"
    );
    let halted = wait_for("the canary's halt", Duration::from_secs(120), || async {
        let s = answer("deploy/sibling", &ns.name)?;
        Ok((s["state"] == "halted").then_some(s))
    })
    .await?;
    assert_eq!(halted["deferred"]["reason"], "halt", "{halted}");
    assert!(
        halted["deferred"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("'canary'"),
        "the message names the workload carrying the halt: {halted}"
    );
    // The canary itself carries the new marker: it is current, however its rollout went.
    assert_eq!(listed(&ns.name)?, ["sibling"]);
    rk.stop().await?;
    ns.cleanup().await
}
