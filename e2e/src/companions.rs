//! The components users run beside rekindle (Prometheus and promtool, the Argo Rollouts controller),
//! built from their Go modules by `e2e/scripts/build-companions.sh` on first use and cached by version.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::root;

/// The directory holding the built companions (and their CRDs under `crds/`), building `what`
/// (`prometheus`, `rollouts`) if it is not cached yet.
pub fn bin_dir(what: &str) -> Result<PathBuf> {
    let out = Command::new(root().join("e2e/scripts/build-companions.sh"))
        .arg(what)
        .output()
        .context("running e2e/scripts/build-companions.sh")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
        bail!(
            "building {what} failed:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let stdout = String::from_utf8(out.stdout)?;
    let dir = stdout.lines().last().unwrap_or_default().trim();
    Ok(PathBuf::from(dir))
}

/// OpenShift's DeploymentConfig CRD, generated from the type's OpenAPI definitions in
/// github.com/openshift/api (`e2e/scripts/deploymentconfig-crd.py`): its real schema, defaults and
/// subresources, with no controller behind it.
pub fn deployment_config_crd() -> Result<String> {
    let path = bin_dir("openshift-crds")?.join("deploymentconfig.yaml");
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// Runs a companion binary; its stdout, or an error with its output.
pub fn run(bin: &std::path::Path, args: &[&str], dir: &std::path::Path) -> Result<String> {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("{} {}: {text}", bin.display(), args.join(" "));
    }
    Ok(text)
}

/// A companion running as a host process (its log in `log`); killed and waited for on drop, so no
/// controller outlives its test.
pub struct HostProcess {
    child: std::process::Child,
    pub log: PathBuf,
}

impl HostProcess {
    pub fn start(bin: &std::path::Path, args: &[&str], log: PathBuf) -> Result<Self> {
        let file = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .args(args)
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self { child, log })
    }

    /// The last lines of its log, for a failing test's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(30).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
