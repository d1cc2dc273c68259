//! Records what Reloader's chart renders for each values file of `e2e/fixtures/migrate/cases/`:
//! `cargo run -p e2e --bin reloader_chart_facts -- <Reloader's chart directory>` writes each case's
//! `<case>.reloader.yaml` (the facts the chart test compares rekindle's render with). The chart directory
//! is `deployments/kubernetes/chart/reloader` of a Reloader checkout; the header of each file names the
//! chart version it was rendered with.

use anyhow::{bail, Context, Result};
use e2e::chart::helm;
use e2e::migration::{api_version_args, cases, facts, NAMESPACE, RELEASE};

fn main() -> Result<()> {
    let Some(chart) = std::env::args().nth(1) else {
        bail!("usage: reloader_chart_facts <Reloader's chart directory>");
    };
    let chart_yaml = std::fs::read_to_string(format!("{chart}/Chart.yaml"))
        .with_context(|| format!("{chart} is not a chart directory"))?;
    let version = |key: &str| {
        chart_yaml
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().trim_matches('"').to_string())
            .unwrap_or_default()
    };
    let (chart_version, app_version) = (version("version:"), version("appVersion:"));
    for case in cases()? {
        let values = case.values.to_string_lossy().into_owned();
        let mut args = vec![
            "template",
            RELEASE,
            &chart,
            "--namespace",
            NAMESPACE,
            "-f",
            &values,
        ];
        args.extend(api_version_args());
        let yaml = helm(&args).with_context(|| format!("case {}", case.name))?;
        // Reloader's chart can render a key twice (its own `release` label and one of the user's, on
        // the ServiceMonitor); Kubernetes keeps the last one.
        let mut options = serde_saphyr::Options::default();
        options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple_with_options(&yaml, options)?;
        let docs: Vec<_> = docs.into_iter().filter(|d| !d.is_null()).collect();
        let recorded = facts(&docs).with_context(|| format!("case {}", case.name))?;
        let header = format!(
            "# What Reloader's chart {chart_version} (Reloader {app_version}) renders for {name}.values.yaml\n\
             # (helm template {RELEASE} -n {NAMESPACE}), recorded by `cargo run -p e2e --bin reloader_chart_facts`.\n",
            name = case.name
        );
        std::fs::write(
            &case.recorded,
            header + &serde_saphyr::to_string(&recorded)?,
        )?;
        println!(
            "{}: {} args, {} env",
            case.name,
            recorded.args.len(),
            recorded.env.len()
        );
    }
    Ok(())
}
