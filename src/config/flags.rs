//! Every server flag and how the Helm chart sets it: the one table that the command line, docs/reference.md's
//! flag tables and the chart's values, schema and args template are checked against (the tests below),
//! so a flag added in one place and forgotten in another fails the build's tests.

/// How the chart sets a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    /// From the chart value at this path (below `.Values`), whose default is the flag's; an empty value
    /// (`""`, `[]`, `false`) leaves the flag out, so the flag's own default applies.
    Value(&'static str),
    /// From the chart value at this path, whose default is the chart's own choice (the reason given).
    Chosen(&'static str, &'static str),
    /// `:PORT`, PORT being the chart value at this path.
    Port(&'static str),
    /// From what the chart deploys (certificate paths, the Lease name), not from a value of its own.
    Derived,
    /// Not set by the chart (`rekindle.extraArgs` can), for the reason given.
    Unset(&'static str),
}

/// Every long flag of `rekindle` (the server), with how the chart sets it.
pub const FLAGS: &[(&str, Chart)] = &[
    ("auto-reload-all", Chart::Value("rekindle.autoReloadAll")),
    (
        "configmap-annotation",
        Chart::Value("rekindle.annotations.configmap"),
    ),
    (
        "secret-annotation",
        Chart::Value("rekindle.annotations.secret"),
    ),
    ("auto-annotation", Chart::Value("rekindle.annotations.auto")),
    (
        "configmap-auto-annotation",
        Chart::Value("rekindle.annotations.configmapAuto"),
    ),
    (
        "secret-auto-annotation",
        Chart::Value("rekindle.annotations.secretAuto"),
    ),
    (
        "auto-search-annotation",
        Chart::Value("rekindle.annotations.search"),
    ),
    (
        "search-match-annotation",
        Chart::Value("rekindle.annotations.match"),
    ),
    (
        "ignore-annotation",
        Chart::Value("rekindle.annotations.ignore"),
    ),
    (
        "pause-deployment-annotation",
        Chart::Value("rekindle.annotations.pauseDeployment"),
    ),
    (
        "pause-deployment-time-annotation",
        Chart::Value("rekindle.annotations.pauseDeploymentTime"),
    ),
    ("log-format", Chart::Value("rekindle.logFormat")),
    ("log-level", Chart::Value("rekindle.logLevel")),
    ("webhook-url", Chart::Value("rekindle.webhookUrl")),
    (
        "resources-to-ignore",
        Chart::Value("rekindle.resourcesToIgnore"),
    ),
    (
        "ignored-workload-types",
        Chart::Value("rekindle.ignoredWorkloadTypes"),
    ),
    ("namespaces", Chart::Value("rekindle.namespaces")),
    (
        "namespaces-to-ignore",
        Chart::Value("rekindle.namespacesToIgnore"),
    ),
    (
        "namespace-selector",
        Chart::Value("rekindle.namespaceSelector"),
    ),
    (
        "resource-label-selector",
        Chart::Value("rekindle.resourceLabelSelector"),
    ),
    ("is-Argo-Rollouts", Chart::Value("rekindle.isArgoRollouts")),
    ("reload-strategy", Chart::Value("rekindle.reloadStrategy")),
    ("reload-on-create", Chart::Value("rekindle.reloadOnCreate")),
    ("reload-on-delete", Chart::Value("rekindle.reloadOnDelete")),
    (
        "enable-ha",
        Chart::Chosen(
            "rekindle.enableHA",
            "the chart runs two replicas by default; a single binary has no Lease to take",
        ),
    ),
    (
        "sync-after-restart",
        Chart::Value("rekindle.syncAfterRestart"),
    ),
    (
        "enable-csi-integration",
        Chart::Value("rekindle.enableCSIIntegration"),
    ),
    (
        "enable-pprof",
        Chart::Unset("accepted for Reloader's command lines; no effect"),
    ),
    (
        "pprof-addr",
        Chart::Unset("accepted for Reloader's command lines; no effect"),
    ),
    (
        "leader-election-lease-duration",
        Chart::Value("rekindle.leaderElection.leaseDuration"),
    ),
    (
        "leader-election-renew-deadline",
        Chart::Value("rekindle.leaderElection.renewDeadline"),
    ),
    (
        "leader-election-retry-period",
        Chart::Value("rekindle.leaderElection.retryPeriod"),
    ),
    ("leader-election-lease-name", Chart::Derived),
    ("reload-debounce", Chart::Value("rekindle.reloadDebounce")),
    (
        "reload-debounce-max",
        Chart::Value("rekindle.reloadDebounceMax"),
    ),
    ("admission-lookup", Chart::Value("rekindle.admissionLookup")),
    (
        "min-reload-interval",
        Chart::Value("rekindle.minReloadInterval"),
    ),
    (
        "max-concurrent-reloads",
        Chart::Value("rekindle.maxConcurrentReloads"),
    ),
    ("cronjob-strategy", Chart::Value("rekindle.cronjobStrategy")),
    (
        "consistency-interval",
        Chart::Value("rekindle.consistencyInterval"),
    ),
    ("reload-window", Chart::Value("rekindle.reloadWindow")),
    (
        "max-rollouts-in-progress",
        Chart::Value("rekindle.maxRolloutsInProgress"),
    ),
    ("rollout-timeout", Chart::Value("rekindle.rolloutTimeout")),
    (
        "halt-on-failed-rollout",
        Chart::Value("rekindle.haltOnFailedRollout"),
    ),
    ("pod-restarts", Chart::Value("rekindle.podRestarts")),
    ("reload-on", Chart::Value("rekindle.reloadOn")),
    ("webhook-addr", Chart::Port("webhook.port")),
    ("admin-addr", Chart::Port("metrics.port")),
    ("tls-cert-file", Chart::Derived),
    ("tls-key-file", Chart::Derived),
    ("tls-min-version", Chart::Value("webhook.tlsMinVersion")),
    ("streaming-lists", Chart::Value("rekindle.streamingLists")),
    ("webhook-http2", Chart::Value("webhook.http2")),
    ("shutdown-delay", Chart::Value("rekindle.shutdownDelay")),
    (
        "kubeconfig",
        Chart::Unset("in a cluster the pod's ServiceAccount is used"),
    ),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::CommandFactory;
    use serde_json::Value;

    use super::*;
    use crate::config::Cli;

    const REFERENCE: &str = include_str!("../../docs/reference.md");
    const VALUES: &str = include_str!("../../charts/rekindle/values.yaml");
    const SCHEMA: &str = include_str!("../../charts/rekindle/values.schema.json");
    const HELPERS: &str = include_str!("../../charts/rekindle/templates/_helpers.tpl");

    /// The server's long flags and their defaults ("" when none), from clap.
    fn clap_flags() -> BTreeMap<String, String> {
        Cli::command()
            .get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                let default = a
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(",");
                Some((long.to_string(), default))
            })
            .filter(|(long, _)| long != "help" && long != "version")
            .collect()
    }

    fn at<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
        path.split('.').try_fold(root, |v, key| v.get(key))
    }

    /// A chart value as its flag would be written.
    fn as_flag_value(v: &Value) -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Array(items) => items
                .iter()
                .map(as_flag_value)
                .collect::<Vec<_>>()
                .join(","),
            other => other.to_string(),
        }
    }

    /// The `args` template of the chart.
    fn args_template() -> &'static str {
        let start = HELPERS
            .find("define \"rekindle.args\"")
            .expect("rekindle.args");
        let end = HELPERS[start..].find("{{- end -}}").expect("its end") + start;
        &HELPERS[start..end]
    }

    #[test]
    fn the_table_has_every_flag_once() {
        let table: Vec<&str> = FLAGS.iter().map(|(f, _)| *f).collect();
        let mut unique = table.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), table.len(), "a flag twice in FLAGS");
        let clap: Vec<String> = clap_flags().into_keys().collect();
        let mut sorted: Vec<String> = table.iter().map(|f| f.to_string()).collect();
        sorted.sort();
        assert_eq!(sorted, clap, "FLAGS and the command line differ");
    }

    #[test]
    fn the_reference_documents_every_flag_and_its_default() {
        let flags = clap_flags();
        let section = REFERENCE
            .split("\n## Flags\n")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/reference.md: ## Flags");
        let mut documented = BTreeMap::new();
        for row in section.lines().filter(|l| l.starts_with("| `--")) {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            let names: Vec<&str> = cells[0]
                .split(['`', ',', '/', ' '])
                .filter_map(|n| n.strip_prefix("--"))
                .collect();
            for name in &names {
                documented.insert(name.to_string(), (names.len(), cells[1].replace('`', "")));
            }
        }
        for (flag, default) in &flags {
            let Some((shared, doc_default)) = documented.get(flag) else {
                panic!("docs/reference.md's flag tables lack --{flag}");
            };
            // A row of one flag states its default exactly (a described default for an empty one).
            if *shared == 1 && !default.is_empty() {
                assert_eq!(
                    doc_default, default,
                    "docs/reference.md's default of --{flag}"
                );
            }
        }
    }

    #[test]
    fn the_chart_values_schema_and_args_follow_the_table() {
        let values: Value = serde_saphyr::from_str(VALUES).expect("values.yaml");
        let schema: Value = serde_json::from_str(SCHEMA).expect("values.schema.json");
        let flags = clap_flags();
        let args = args_template();
        for (flag, chart) in FLAGS {
            let default = &flags[*flag];
            let passed = args.contains(&format!("- --{flag}="));
            let path = match chart {
                Chart::Unset(_) => {
                    assert!(!passed, "the chart passes --{flag}, listed as unset");
                    continue;
                }
                Chart::Derived => {
                    assert!(passed, "the chart does not pass --{flag}");
                    continue;
                }
                Chart::Value(p) | Chart::Chosen(p, _) | Chart::Port(p) => *p,
            };
            assert!(passed, "the chart does not pass --{flag}");
            let value = at(&values, path).unwrap_or_else(|| panic!("values.yaml lacks {path}"));
            let schema_path = path.replace('.', ".properties.");
            assert!(
                at(&schema, &format!("properties.{schema_path}")).is_some(),
                "values.schema.json lacks {path}"
            );
            let last = path.rsplit('.').next().unwrap_or(path);
            assert!(
                args.contains(&format!(".{last}")),
                "the args template does not read {path} for --{flag}"
            );
            let chart_default = as_flag_value(value);
            match chart {
                Chart::Value(_) => {
                    let empty = matches!(chart_default.as_str(), "" | "false");
                    assert!(
                        chart_default == *default || empty,
                        "--{flag}: values.yaml {path} is {chart_default:?}, the flag's default {default:?}"
                    );
                }
                Chart::Port(_) => {
                    assert_eq!(format!(":{chart_default}"), *default, "--{flag} and {path}")
                }
                _ => {}
            }
        }
    }
}
