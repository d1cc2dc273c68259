//! The real node's cluster (`e2e/scripts/node.sh`), as the tests that run inside its network namespace
//! reach it: `KUBECONFIG` names its admin, kubectl and helm are on PATH, commands run from the workspace
//! root.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::{client_from, root};

pub const RELEASE_NS: &str = "rekindle";
/// The node's sandbox image, imported by node.sh: a process that blocks until SIGTERM.
pub const WORKLOAD_IMAGE: &str = "rekindle.local/pause:e2e";

pub async fn client() -> Result<Client> {
    let kc = std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("KUBECONFIG is not set: run through e2e/scripts/node.sh exec"))?;
    client_from(&kc).await
}

/// Runs a command from the workspace root (the README's commands are relative to it).
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn helm(args: &[&str]) -> Result<String> {
    run("helm", args)
}

pub fn kubectl(args: &[&str]) -> Result<String> {
    run("kubectl", args)
}

/// What a user would look at when rekindle's pods do not come up: pods, events and container logs.
pub fn diagnose(ns: &str) {
    let show = |args: &[&str]| match Command::new("kubectl").args(args).output() {
        Ok(o) => eprintln!(
            "--- kubectl {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => eprintln!("--- kubectl {}: {e}", args.join(" ")),
    };
    show(&["-n", ns, "get", "pods,jobs,deployments", "-o", "wide"]);
    show(&["-n", ns, "get", "events", "--sort-by=.lastTimestamp"]);
    show(&[
        "-n",
        ns,
        "logs",
        "--all-containers",
        "--prefix",
        "--tail=40",
        "-l",
        "app.kubernetes.io/instance=rekindle",
    ]);
    show(&[
        "-n",
        ns,
        "logs",
        "--all-containers",
        "--prefix",
        "--tail=40",
        "--previous",
        "-l",
        "app.kubernetes.io/instance=rekindle",
    ]);
}

/// Waits for rekindle's Deployment to be rolled out and all its pods Ready through their own probes.
pub fn wait_rolled_out(ns: &str) -> Result<()> {
    kubectl(&[
        "-n",
        ns,
        "rollout",
        "status",
        "deployment/rekindle",
        "--timeout=180s",
    ])
    .inspect_err(|_| diagnose(ns))?;
    Ok(())
}

pub async fn ready_pods(client: &Client, ns: &str) -> Result<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(
            &ListParams::default()
                .labels("app.kubernetes.io/name=rekindle,app.kubernetes.io/instance=rekindle"),
        )
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(is_ready)
        .collect())
}

/// Whether the pod's `Ready` condition is true.
pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whatever an earlier failed test left: the release, its namespace, its cluster-scoped objects.
pub fn fresh_start() -> Result<()> {
    helm(&[
        "uninstall",
        "rekindle",
        "-n",
        RELEASE_NS,
        "--ignore-not-found",
        "--wait",
        "--timeout",
        "120s",
    ])?;
    kubectl(&[
        "delete",
        "mutatingwebhookconfiguration",
        "rekindle",
        "--ignore-not-found",
    ])?;
    kubectl(&[
        "delete",
        "clusterroles,clusterrolebindings",
        "-l",
        "app.kubernetes.io/instance=rekindle",
        "--ignore-not-found",
    ])?;
    kubectl(&[
        "delete",
        "namespace",
        RELEASE_NS,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ])?;
    Ok(())
}
