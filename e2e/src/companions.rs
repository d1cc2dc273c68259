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
