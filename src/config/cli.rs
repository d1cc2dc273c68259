//! The command line: Reloader's flags with Reloader's names and defaults, plus rekindle's own, parsed the
//! way a Reloader command line is written (behaviour §12) and validated into a typed [`Config`].

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::selector::Selector;
use crate::core::duration::parse_go_duration;
use crate::core::keys::ReloadOn;
use crate::core::plan::{CronJobStrategy, PlanConfig, Strategy};
use crate::core::policy::{AnnotationKeys, PolicyConfig};
use crate::core::window::{WindowError, Windows};
use crate::core::WorkloadKind;
use crate::outbound::alert::AlertConfig;
pub use crate::server::tls::TlsVersion;

pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("REKINDLE_GIT_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(name = "rekindle", version = VERSION, about = "Restarts workloads when the ConfigMaps, Secrets or SecretProviderClasses they use change.\n\nWithout a subcommand rekindle runs the server: the admission webhook and the watch loop.", args_conflicts_with_subcommands = true, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the hash and env-var name rekindle (and Reloader) computes for each ConfigMap, Secret or
    /// SecretProviderClassPodStatus in a file.
    Hash(HashArgs),
    /// Say whether a workload would reload for a change of a resource, why, and what rekindle would change.
    Explain(Box<ExplainArgs>),
    /// Say where a workload stands, read from the live cluster: current, owed, deferred (and until when),
    /// halted or not reloaded, with the evidence. Without KIND/NAME, every workload of the namespace (or
    /// of all, with -A) that rekindle owes a reload. Takes the server's flags (annotation names,
    /// --auto-reload-all, strategies) so that it decides as the server does. Installed as
    /// `kubectl-rekindle`, it is the kubectl plugin `kubectl rekindle why`.
    Why(Box<WhyArgs>),
    /// Probe the admin server (for container probes and `helm test`; the image has no curl): GET each URL
    /// and exit 0 only when every one answers 2xx.
    Healthcheck(HealthcheckArgs),
    /// Convert a values file written for Reloader's Helm chart (v2.2.x) into one for rekindle's chart that
    /// runs the same controller: YAML on stdout headed by a summary of it (scope, replicas), a warning on
    /// stderr for each key not carried over.
    MigrateValues(MigrateValuesArgs),
}

#[derive(Debug, Args)]
pub struct WhyArgs {
    /// The workload, as kubectl names it: deploy/web, sts/db, ds/agent, cj/report, job/once,
    /// rollout/api, dc/legacy.
    #[arg(value_parser = clap::value_parser!(crate::tools::why::Target))]
    pub target: Option<crate::tools::why::Target>,
    /// The namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Without a workload: every namespace.
    #[arg(short = 'A', long, conflicts_with = "target")]
    pub all_namespaces: bool,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct MigrateValuesArgs {
    /// Reloader's values file.
    pub file: PathBuf,
    /// The namespace Reloader was installed in (named in the summary of a scoped install).
    #[arg(long)]
    pub namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// URL to GET (repeatable).
    #[arg(long = "url", default_values = ["http://127.0.0.1:9090/ready"])]
    pub urls: Vec<String>,
    /// Give up on each URL after this many seconds.
    #[arg(long, default_value_t = 5)]
    pub timeout_seconds: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct HashArgs {
    /// YAML or JSON file with one or more documents (`-` for standard input).
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum EventArg {
    Update,
    Create,
    Delete,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The workload manifest (YAML or JSON).
    #[arg(long)]
    pub workload: PathBuf,
    /// The changed ConfigMap, Secret or SecretProviderClassPodStatus, as it is after the change.
    #[arg(long)]
    pub changed: PathBuf,
    #[arg(long, value_enum, default_value = "update")]
    pub event: EventArg,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Go's `strconv.ParseBool` spellings, plus yes/no/on/off.
fn parse_bool(s: &str) -> Result<bool, String> {
    if let Some(b) = crate::core::policy::parse_go_bool(s) {
        return Ok(b);
    }
    match s.to_ascii_lowercase().as_str() {
        "yes" | "y" | "on" => Ok(true),
        "no" | "n" | "off" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (true or false)")),
    }
}

/// Every server flag. Boolean flags take `--flag`, `--flag=true|false`; Reloader's string booleans
/// (`--is-Argo-Rollouts`, `--reload-on-create`, `--reload-on-delete`) also take `--flag true`.
#[derive(Debug, Args, Clone)]
pub struct ServerArgs {
    /// Reload every workload that references a changed resource, without annotations.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub auto_reload_all: bool,
    /// Annotation naming ConfigMaps to reload for.
    #[arg(long, default_value = "configmap.reloader.stakater.com/reload")]
    pub configmap_annotation: String,
    /// Annotation naming Secrets to reload for.
    #[arg(long, default_value = "secret.reloader.stakater.com/reload")]
    pub secret_annotation: String,
    /// Annotation enabling reload on any referenced resource.
    #[arg(long, default_value = "reloader.stakater.com/auto")]
    pub auto_annotation: String,
    /// Annotation enabling reload on referenced ConfigMaps.
    #[arg(long, default_value = "configmap.reloader.stakater.com/auto")]
    pub configmap_auto_annotation: String,
    /// Annotation enabling reload on referenced Secrets.
    #[arg(long, default_value = "secret.reloader.stakater.com/auto")]
    pub secret_auto_annotation: String,
    /// Annotation enabling reload on referenced resources that carry the match annotation.
    #[arg(long, default_value = "reloader.stakater.com/search")]
    pub auto_search_annotation: String,
    /// Annotation on a resource that makes it eligible for search.
    #[arg(long, default_value = "reloader.stakater.com/match")]
    pub search_match_annotation: String,
    /// Annotation on a resource that makes it never trigger a reload.
    #[arg(long, default_value = "reloader.stakater.com/ignore")]
    pub ignore_annotation: String,
    /// Annotation holding a Deployment's pause period.
    #[arg(long, default_value = "deployment.reloader.stakater.com/pause-period")]
    pub pause_deployment_annotation: String,
    /// Annotation recording when rekindle paused a Deployment.
    #[arg(long, default_value = "deployment.reloader.stakater.com/paused-at")]
    pub pause_deployment_time_annotation: String,
    /// Log format: empty for text, or `json`.
    #[arg(long, default_value = "")]
    pub log_format: String,
    /// Log level: trace, debug, info, warn(ing), error, fatal, panic.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// POST a JSON notification to this URL instead of reloading workloads.
    #[arg(long, value_parser = http_url)]
    pub webhook_url: Option<String>,
    /// Reload Argo Rollouts too.
    #[arg(long = "is-Argo-Rollouts", num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub is_argo_rollouts: bool,
    /// How workloads are restarted: `env-vars` or `annotations`.
    #[arg(long, value_enum, default_value = "env-vars")]
    pub reload_strategy: Strategy,
    /// Treat a newly created resource as a change.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub reload_on_create: bool,
    /// Remove the marker when a referenced resource is deleted (rolls the workload).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub reload_on_delete: bool,
    /// With --reload-on-create, treat existing resources whose marker is absent as created at start-up.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub sync_after_restart: bool,
    /// Watch SecretProviderClassPodStatuses of the Secrets Store CSI driver.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub enable_csi_integration: bool,
    /// Accepted for compatibility; rekindle serves no pprof.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub enable_pprof: bool,
    /// Accepted for compatibility; rekindle serves no pprof.
    #[arg(long, default_value = ":6060")]
    pub pprof_addr: String,
    /// At admission, read a ConfigMap or Secret the index does not know yet (created just before the
    /// workload), at most 300 ms, so the workload is stamped anyway.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = parse_bool)]
    pub admission_lookup: bool,
    /// CronJobs: `job` creates a Job from the template; `template` patches the job template.
    #[arg(long, value_enum, default_value = "job")]
    pub cronjob_strategy: CronJobStrategy,
    /// How often every workload's markers are compared with the current hashes.
    #[arg(long, default_value = "10m", value_parser = go_duration)]
    pub consistency_interval: Duration,
    /// Evict the pods of `OnDelete` StatefulSets and DaemonSets annotated `rekindle.io/restart: pods`
    /// after their template is written, one at a time within their PodDisruptionBudgets (off: the
    /// annotation is ignored and no pod is read or evicted).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = parse_bool)]
    pub pod_restarts: bool,
    /// Which changes of a ConfigMap or Secret reload a workload without `rekindle.io/reload-on`:
    /// `any-key` (any change, Reloader's behaviour) or `used-keys` (only a change of a key it reads).
    #[arg(long, value_enum, default_value = "any-key")]
    pub reload_on: ReloadOn,
    /// Admin server (/live, /ready, /metrics) listen address.
    #[arg(long, default_value = ":9090", value_parser = listen_addr)]
    pub admin_addr: SocketAddr,
    /// How watches get their first state: `true` streams it as watch events (`sendInitialEvents`, no
    /// pages held in memory), `false` lists in pages, `auto` streams on Kubernetes 1.34 and later (where
    /// the apiserver serves it by default). Streamed, ConfigMaps, Secrets, Deployments, StatefulSets and
    /// DaemonSets are watched in protobuf (JSON where the apiserver does not serve it or an event
    /// cannot be decoded).
    #[arg(long, default_value = "auto", value_parser = auto_or_bool)]
    pub streaming_lists: AutoBool,
    /// After SIGTERM, how long the webhook keeps serving with readiness failed, so the Service's
    /// endpoints drop this Pod before it stops answering.
    #[arg(long, default_value = "5s", value_parser = go_duration)]
    pub shutdown_delay: Duration,
    #[command(flatten)]
    pub watch: Watch,
    #[command(flatten)]
    pub pacing: Pacing,
    #[command(flatten)]
    pub leader_election: LeaderElection,
    #[command(flatten)]
    pub release: Release,
    #[command(flatten)]
    pub webhook: Webhook,
    /// Kubeconfig file (default: in-cluster, then KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Leader election: `--enable-ha` and the Lease. Validated by [`LeaderElection::validated`] (lease
/// duration > renew deadline > retry period > 0), then kept as it is in [`Config`].
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Leader election")]
pub struct LeaderElection {
    /// Run several replicas; a Lease elects the one that writes.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub enable_ha: bool,
    /// Leader election lease duration.
    #[arg(long = "leader-election-lease-duration", default_value = "15s", value_parser = go_duration)]
    pub lease_duration: Duration,
    /// Leader election renew deadline.
    #[arg(long = "leader-election-renew-deadline", default_value = "10s", value_parser = go_duration)]
    pub renew_deadline: Duration,
    /// Leader election retry period.
    #[arg(long = "leader-election-retry-period", default_value = "2s", value_parser = go_duration)]
    pub retry_period: Duration,
    /// Name of the leader election Lease in the pod's namespace (the chart derives it from the release,
    /// so two releases in one namespace never share one).
    #[arg(long = "leader-election-lease-name", default_value = crate::reload::lease::DEFAULT_LEASE_NAME, value_parser = lease_name)]
    pub lease_name: String,
}

/// What is watched and reloaded: resource and workload types, namespaces and label selectors. Read
/// into [`Config`]'s scope by [`Watch::scope`] and the `ignored_*` methods.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "What is watched")]
pub struct Watch {
    /// Resource types not to watch: `configmaps` or `secrets` (not both).
    #[arg(long, action = clap::ArgAction::Append)]
    pub resources_to_ignore: Vec<String>,
    /// Workload types never to reload: `jobs`, `cronjobs`.
    #[arg(long, action = clap::ArgAction::Append)]
    pub ignored_workload_types: Vec<String>,
    /// Namespaces to watch (default: all, or KUBERNETES_NAMESPACE when set).
    #[arg(long, action = clap::ArgAction::Append)]
    pub namespaces: Vec<String>,
    /// Namespaces to ignore (cluster-wide mode only).
    #[arg(long, action = clap::ArgAction::Append)]
    pub namespaces_to_ignore: Vec<String>,
    /// Only namespaces whose labels match (cluster-wide mode only; `k:v`, `k:*`, `k=v`, ANDed).
    #[arg(long, action = clap::ArgAction::Append)]
    pub namespace_selector: Vec<String>,
    /// Only ConfigMaps, Secrets and SecretProviderClassPodStatuses whose labels match.
    #[arg(long, action = clap::ArgAction::Append)]
    pub resource_label_selector: Vec<String>,
}

/// How fast owed reloads are written: debounce, cooldown and writes in flight. Validated by
/// [`Pacing::validated`], then kept as it is in [`Config`].
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Pacing")]
pub struct Pacing {
    /// Changes to one workload within this window become one reload (0 = off).
    #[arg(long, default_value = "250ms", value_parser = go_duration)]
    pub reload_debounce: Duration,
    /// The longest a reload is delayed by debouncing.
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    pub reload_debounce_max: Duration,
    /// Per-workload cooldown between reloads; changes inside it merge into one reload (0 = off).
    #[arg(long, default_value = "0s", value_parser = go_duration)]
    pub min_reload_interval: Duration,
    /// Reload patches in flight at once.
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    pub max_concurrent_reloads: usize,
}

/// The release policies: reload windows, the rollout budget and halts (docs/release-policies.md).
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Release policies")]
pub struct Release {
    /// When reloads may start, for workloads without a `rekindle.io/reload-window` annotation: one or
    /// more `DAYS HH:MM-HH:MM [ZONE]` separated by `;` (unset: always).
    #[arg(long, value_parser = reload_window)]
    pub reload_window: Option<Windows>,
    /// At most this many workloads whose rekindle-started rollout has not finished; owed reloads past
    /// it wait, in the order their changes arrived (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub max_rollouts_in_progress: usize,
    /// A rollout counted against --max-rollouts-in-progress that has not finished after this long has
    /// failed and frees its slot.
    #[arg(long, default_value = "10m", value_parser = positive_duration)]
    pub rollout_timeout: Duration,
    /// When a rollout rekindle started for a change fails, halt the reloads still owed for that change
    /// (a canary's failure always halts).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub halt_on_failed_rollout: bool,
}

/// The admission webhook's listener and TLS.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Admission webhook")]
pub struct Webhook {
    /// Admission webhook (TLS) listen address.
    #[arg(long, default_value = ":9443", value_parser = listen_addr)]
    pub webhook_addr: SocketAddr,
    /// Webhook serving certificate (PEM); reloaded when it changes.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// Webhook serving key (PEM); reloaded when it changes.
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// Lowest TLS version the webhook accepts: 1.2 or 1.3.
    #[arg(long, value_enum, default_value = "1.3")]
    pub tls_min_version: TlsVersion,
    /// Offer HTTP/2 on the webhook port as well as HTTP/1.1 (off: one request per stream keeps a
    /// misbehaving client from multiplexing thousands of requests over one connection).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool)]
    pub webhook_http2: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Which namespaces rekindle acts in.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// `Some`: only these (from --namespaces or KUBERNETES_NAMESPACE). `None`: cluster-wide.
    pub namespaces: Option<BTreeSet<String>>,
    pub namespaces_to_ignore: BTreeSet<String>,
    pub namespace_selector: Option<Selector>,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub plan: PlanConfig,
    pub log_format: LogFormat,
    /// A `tracing` filter directive.
    pub log_level: &'static str,
    pub webhook_url: Option<String>,
    pub ignore_configmaps: bool,
    pub ignore_secrets: bool,
    pub scope: Scope,
    pub resource_label_selector: Option<Selector>,
    pub argo_rollouts: bool,
    pub leader_election: LeaderElection,
    pub sync_after_restart: bool,
    pub enable_csi: bool,
    pub admission_lookup: bool,
    pub pacing: Pacing,
    pub consistency_interval: Duration,
    pub release: Release,
    pub webhook: Webhook,
    pub admin_addr: SocketAddr,
    /// `None`: decide from the apiserver's version.
    pub streaming_lists: Option<bool>,
    pub shutdown_delay: Duration,
    pub kubeconfig: Option<PathBuf>,
    /// `METRICS_COUNT_BY_NAMESPACE=enabled`.
    pub metrics_count_by_namespace: bool,
    /// `POD_NAME` and `POD_NAMESPACE` (the downward API): the Lease identity and namespace, the Events'
    /// reporting instance.
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    /// `ALERT_*`: alerts after reloads.
    pub alerts: Option<AlertConfig>,
}

/// A flag value rekindle refuses; the process exits with status 2.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid value {value:?} for '--{flag}': {why}")]
pub struct FlagError {
    pub flag: &'static str,
    pub value: String,
    pub why: String,
}

fn flag_err(flag: &'static str, value: impl Into<String>, why: impl Into<String>) -> FlagError {
    FlagError {
        flag,
        value: value.into(),
        why: why.into(),
    }
}

/// Splits list-flag values the way Reloader's flag library does: each occurrence is one CSV record
/// (so surrounding quotes are stripped); rekindle also trims spaces and drops empty entries.
pub fn split_list(values: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for value in values {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .trim(csv::Trim::All)
            .from_reader(value.as_bytes());
        for record in reader.records() {
            let record = record
                .map_err(|e| format!("{value:?} is not a valid comma-separated list: {e}"))?;
            out.extend(
                record
                    .iter()
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            );
        }
    }
    Ok(out)
}

// Value parsers: clap refuses a value they reject before anything starts, naming the flag, with
// status 2. What depends on two flags is checked in `Config::from_args`.

/// A Lease name must be a DNS subdomain (RFC 1123): lower case alphanumerics, '-' and '.', ≤ 253.
fn lease_name(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 253
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(value.to_string())
    } else {
        Err("not a valid object name (lower case letters, digits, '-' and '.')".into())
    }
}

/// Reload windows (see `core::window`).
fn reload_window(value: &str) -> Result<Windows, String> {
    value.parse().map_err(|e: WindowError| e.to_string())
}

/// A Go duration (`1m30s`, `250ms`), as Reloader's flags take them.
fn go_duration(value: &str) -> Result<Duration, String> {
    parse_go_duration(value).map_err(|e| e.why.to_string())
}

fn positive_duration(value: &str) -> Result<Duration, String> {
    match go_duration(value)? {
        d if d.is_zero() => Err("must be longer than 0s".into()),
        d => Ok(d),
    }
}

/// `:9443` means every address (dual-stack where the host has IPv6); `host:port` one address.
fn listen_addr(value: &str) -> Result<SocketAddr, String> {
    let full = if value.starts_with(':') {
        format!("[::]{value}")
    } else {
        value.to_string()
    };
    full.parse()
        .map_err(|_| "expected [host]:port, for example :9443 or 127.0.0.1:9443".into())
}

/// `auto`, or a boolean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoBool(pub Option<bool>);

fn auto_or_bool(value: &str) -> Result<AutoBool, String> {
    match value {
        "auto" => Ok(AutoBool(None)),
        other => parse_bool(other).map(|b| AutoBool(Some(b))),
    }
}

fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn http_url(value: &str) -> Result<String, String> {
    if value.starts_with("http://") || value.starts_with("https://") {
        Ok(value.to_string())
    } else {
        Err("expected an http:// or https:// URL".into())
    }
}

impl LeaderElection {
    /// Leader election needs lease duration > renew deadline > retry period > 0: a leader stops writing
    /// at its renew deadline, before another replica may take the Lease at the lease duration, and
    /// retries within it.
    fn validated(&self) -> Result<Self, FlagError> {
        let (lease, renew, retry) = (self.lease_duration, self.renew_deadline, self.retry_period);
        if retry.is_zero() {
            return Err(flag_err(
                "leader-election-retry-period",
                format!("{retry:?}"),
                "must be more than 0",
            ));
        }
        if renew <= retry {
            return Err(flag_err(
                "leader-election-renew-deadline",
                format!("{renew:?}"),
                "must be longer than --leader-election-retry-period",
            ));
        }
        if lease <= renew {
            return Err(flag_err(
                "leader-election-lease-duration",
                format!("{lease:?}"),
                "must be longer than --leader-election-renew-deadline",
            ));
        }
        Ok(self.clone())
    }
}

impl Pacing {
    fn validated(&self) -> Result<Self, FlagError> {
        if self.reload_debounce_max < self.reload_debounce {
            return Err(flag_err(
                "reload-debounce-max",
                format!("{:?}", self.reload_debounce_max),
                "must not be shorter than --reload-debounce",
            ));
        }
        Ok(self.clone())
    }
}

impl Webhook {
    fn validated(&self) -> Result<Self, FlagError> {
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(flag_err(
                "tls-key-file",
                "",
                "--tls-cert-file and --tls-key-file go together",
            ));
        }
        Ok(self.clone())
    }
}

impl Config {
    /// Validates the flags. `env` looks up environment variables (KUBERNETES_NAMESPACE). Warnings name the
    /// flag and are for values Reloader also only warns about.
    pub fn from_args(
        args: &ServerArgs,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(Config, Vec<String>), FlagError> {
        let mut warnings = Vec::new();
        let (ignore_configmaps, ignore_secrets) = args.watch.ignored_resources()?;
        let ignored_workload_types = args.watch.ignored_workload_types(&mut warnings)?;
        let (log_format, log_level) = logging(args, &mut warnings);
        let (scope, resource_label_selector) = args.watch.scope(&env, &mut warnings)?;
        if args.enable_pprof || args.pprof_addr != ":6060" {
            warnings.push(
                "--enable-pprof/--pprof-addr are accepted for compatibility; rekindle serves no pprof"
                    .into(),
            );
        }
        if args.consistency_interval < Duration::from_secs(1) {
            return Err(flag_err(
                "consistency-interval",
                format!("{:?}", args.consistency_interval),
                "must be at least 1s",
            ));
        }

        let keys = annotation_keys(args)?;
        let config = Config {
            plan: PlanConfig {
                policy: PolicyConfig {
                    keys,
                    auto_reload_all: args.auto_reload_all,
                    ignored_workload_types,
                },
                strategy: args.reload_strategy,
                cronjob_strategy: args.cronjob_strategy,
                reload_on_create: args.reload_on_create,
                reload_on_delete: args.reload_on_delete,
                pod_restarts: args.pod_restarts,
                reload_on: args.reload_on,
            },
            log_format,
            log_level,
            webhook_url: args.webhook_url.clone(),
            ignore_configmaps,
            ignore_secrets,
            scope,
            resource_label_selector: (!resource_label_selector.is_empty())
                .then_some(resource_label_selector),
            argo_rollouts: args.is_argo_rollouts,
            leader_election: args.leader_election.validated()?,
            sync_after_restart: args.sync_after_restart,
            enable_csi: args.enable_csi_integration,
            admission_lookup: args.admission_lookup,
            pacing: args.pacing.validated()?,
            consistency_interval: args.consistency_interval,
            release: args.release.clone(),
            webhook: args.webhook.validated()?,
            admin_addr: args.admin_addr,
            streaming_lists: args.streaming_lists.0,
            shutdown_delay: args.shutdown_delay,
            kubeconfig: args.kubeconfig.clone(),
            metrics_count_by_namespace: env("METRICS_COUNT_BY_NAMESPACE").as_deref()
                == Some("enabled"),
            pod_name: env("POD_NAME").filter(|s| !s.is_empty()),
            pod_namespace: env("POD_NAMESPACE").filter(|s| !s.is_empty()),
            alerts: AlertConfig::from_env(&env),
        };
        Ok((config, warnings))
    }
}

/// One list flag, split the way Reloader splits it.
fn list(flag: &'static str, values: &[String]) -> Result<Vec<String>, FlagError> {
    split_list(values).map_err(|e| flag_err(flag, values.join(","), e))
}

/// `--resources-to-ignore`: (ignore ConfigMaps, ignore Secrets).
impl Watch {
    fn ignored_resources(&self) -> Result<(bool, bool), FlagError> {
        let ignored_resources = list("resources-to-ignore", &self.resources_to_ignore)?;
        let (mut ignore_configmaps, mut ignore_secrets) = (false, false);
        for r in &ignored_resources {
            match r.to_ascii_lowercase().as_str() {
                "configmaps" => ignore_configmaps = true,
                "secrets" => ignore_secrets = true,
                _ => {
                    return Err(flag_err(
                        "resources-to-ignore",
                        r.as_str(),
                        "expected configmaps or secrets",
                    ))
                }
            }
        }
        if ignore_configmaps && ignore_secrets {
            return Err(flag_err(
                "resources-to-ignore",
                ignored_resources.join(","),
                "ignoring both configmaps and secrets leaves nothing to watch",
            ));
        }
        Ok((ignore_configmaps, ignore_secrets))
    }

    fn ignored_workload_types(
        &self,
        warnings: &mut Vec<String>,
    ) -> Result<BTreeSet<WorkloadKind>, FlagError> {
        let mut ignored_workload_types = BTreeSet::new();
        for t in list("ignored-workload-types", &self.ignored_workload_types)? {
            match t.to_ascii_lowercase().as_str() {
                "jobs" => {
                    ignored_workload_types.insert(WorkloadKind::Job);
                }
                "cronjobs" => {
                    ignored_workload_types.insert(WorkloadKind::CronJob);
                }
                _ => warnings.push(format!("--ignored-workload-types: unknown workload type {t:?} ignored (expected jobs or cronjobs)")),
            }
        }
        Ok(ignored_workload_types)
    }

    /// The namespaces watched, and the resource label selector.
    fn scope(
        &self,
        env: &impl Fn(&str) -> Option<String>,
        warnings: &mut Vec<String>,
    ) -> Result<(Scope, Selector), FlagError> {
        let mut namespaces: BTreeSet<String> =
            list("namespaces", &self.namespaces)?.into_iter().collect();
        if namespaces.is_empty() {
            if let Some(ns) = env("KUBERNETES_NAMESPACE").filter(|s| !s.trim().is_empty()) {
                namespaces.insert(ns.trim().to_string());
            }
        }
        let namespaces_to_ignore: BTreeSet<String> =
            list("namespaces-to-ignore", &self.namespaces_to_ignore)?
                .into_iter()
                .collect();
        let selector_entries = list("namespace-selector", &self.namespace_selector)?;
        let namespace_selector = Selector::parse_legacy(&selector_entries).map_err(|e| {
            flag_err(
                "namespace-selector",
                selector_entries.join(","),
                e.to_string(),
            )
        })?;
        let resource_entries = list("resource-label-selector", &self.resource_label_selector)?;
        let resource_label_selector = Selector::parse_legacy(&resource_entries).map_err(|e| {
            flag_err(
                "resource-label-selector",
                resource_entries.join(","),
                e.to_string(),
            )
        })?;
        let cluster_wide = namespaces.is_empty();
        if !cluster_wide && !namespaces_to_ignore.is_empty() {
            warnings.push("--namespaces-to-ignore applies in cluster-wide mode only; ignored because --namespaces (or KUBERNETES_NAMESPACE) is set".into());
        }
        if !cluster_wide && !namespace_selector.is_empty() {
            warnings.push("--namespace-selector applies in cluster-wide mode only; ignored because --namespaces (or KUBERNETES_NAMESPACE) is set".into());
        }

        let scope = Scope {
            namespaces: (!cluster_wide).then_some(namespaces),
            namespaces_to_ignore: if cluster_wide {
                namespaces_to_ignore
            } else {
                BTreeSet::new()
            },
            namespace_selector: (cluster_wide && !namespace_selector.is_empty())
                .then_some(namespace_selector),
        };
        Ok((scope, resource_label_selector))
    }
}

fn logging(args: &ServerArgs, warnings: &mut Vec<String>) -> (LogFormat, &'static str) {
    let log_format = match args.log_format.as_str() {
        "json" => LogFormat::Json,
        "" | "text" => LogFormat::Text,
        other => {
            warnings.push(format!(
                "--log-format: unknown format {other:?}, using text"
            ));
            LogFormat::Text
        }
    };
    let log_level = match args.log_level.to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" | "fatal" | "panic" => "error",
        other => {
            warnings.push(format!("--log-level: unknown level {other:?}, using info"));
            "info"
        }
    };
    (log_format, log_level)
}

fn annotation_keys(args: &ServerArgs) -> Result<AnnotationKeys, FlagError> {
    let keys = AnnotationKeys {
        auto: args.auto_annotation.clone(),
        configmap_auto: args.configmap_auto_annotation.clone(),
        secret_auto: args.secret_auto_annotation.clone(),
        configmap_reload: args.configmap_annotation.clone(),
        secret_reload: args.secret_annotation.clone(),
        search: args.auto_search_annotation.clone(),
        search_match: args.search_match_annotation.clone(),
        ignore: args.ignore_annotation.clone(),
        pause_period: args.pause_deployment_annotation.clone(),
        paused_at: args.pause_deployment_time_annotation.clone(),
        ..AnnotationKeys::default()
    };
    for (flag, key) in [
        ("auto-annotation", &keys.auto),
        ("configmap-auto-annotation", &keys.configmap_auto),
        ("secret-auto-annotation", &keys.secret_auto),
        ("configmap-annotation", &keys.configmap_reload),
        ("secret-annotation", &keys.secret_reload),
        ("auto-search-annotation", &keys.search),
        ("search-match-annotation", &keys.search_match),
        ("ignore-annotation", &keys.ignore),
        ("pause-deployment-annotation", &keys.pause_period),
        ("pause-deployment-time-annotation", &keys.paused_at),
    ] {
        if key.trim().is_empty() {
            return Err(flag_err(
                flag,
                key.as_str(),
                "an annotation key cannot be empty",
            ));
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(Config, Vec<String>), FlagError> {
        let cli = Cli::try_parse_from(std::iter::once("rekindle").chain(args.iter().copied()))
            .expect("clap parse");
        Config::from_args(&cli.server, |_| None)
    }

    /// The flag a refused command line is refused for: by clap's value parsers (status 2, the flag
    /// named in the message) or by the checks across flags.
    fn err_flag(args: &[&str]) -> String {
        match Cli::try_parse_from(std::iter::once("rekindle").chain(args.iter().copied())) {
            Err(e) => {
                assert_eq!(e.exit_code(), 2, "{e}");
                let text = e.to_string();
                let named = text.split("'--").nth(1).unwrap_or_else(|| panic!("{text}"));
                named
                    .split([' ', '\''])
                    .next()
                    .unwrap_or_default()
                    .to_string()
            }
            Ok(cli) => Config::from_args(&cli.server, |_| None)
                .expect_err("should be refused")
                .flag
                .to_string(),
        }
    }

    #[test]
    fn leader_election_timings_must_nest() {
        let lease = "--leader-election-lease-duration";
        let renew = "--leader-election-renew-deadline";
        let retry = "--leader-election-retry-period";
        for (args, flag) in [
            (
                vec![format!("{lease}=10s")],
                "leader-election-lease-duration",
            ),
            (
                vec![format!("{lease}=5s"), format!("{renew}=6s")],
                "leader-election-lease-duration",
            ),
            (
                vec![format!("{retry}=10s")],
                "leader-election-renew-deadline",
            ),
            (vec![format!("{retry}=0s")], "leader-election-retry-period"),
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            assert_eq!(err_flag(&args), flag, "{args:?}");
        }
        let (cfg, _) = parse(&[
            "--leader-election-lease-duration=1500ms",
            "--leader-election-renew-deadline=1s",
            "--leader-election-retry-period=200ms",
        ])
        .unwrap();
        assert_eq!(
            cfg.leader_election.lease_duration,
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn defaults_match_reloader() {
        let (c, warnings) = parse(&[]).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(c.plan.strategy, Strategy::EnvVars);
        assert_eq!(c.plan.policy.keys, AnnotationKeys::default());
        assert!(
            !c.plan.policy.auto_reload_all && !c.plan.reload_on_create && !c.plan.reload_on_delete
        );
        assert_eq!(c.leader_election.lease_duration, Duration::from_secs(15));
        assert_eq!(c.leader_election.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.leader_election.retry_period, Duration::from_secs(2));
        assert_eq!(c.pacing.reload_debounce, Duration::from_millis(250));
        assert_eq!(c.pacing.max_concurrent_reloads, 16);
        assert_eq!(c.webhook.webhook_addr.port(), 9443);
        assert_eq!(c.admin_addr.port(), 9090);
        assert!(c.scope.namespaces.is_none());
    }

    #[test]
    fn reloader_command_line_parses_unchanged() {
        let (c, _) = parse(&[
            "--auto-reload-all",
            "--reload-strategy",
            "annotations",
            "--reload-on-create=true",
            "--reload-on-delete",
            "true",
            "--is-Argo-Rollouts=true",
            "--enable-ha=false",
            "--namespace-selector=\"team:a,env:*\"",
            "--resources-to-ignore=SECRETS",
            "--ignored-workload-types=jobs,cronjobs",
            "--namespaces-to-ignore",
            "kube-system, other",
            "--namespaces-to-ignore=third",
            "--log-level=warning",
            "--log-format=json",
            "--auto-annotation=example.com/auto",
        ])
        .unwrap();
        assert!(
            c.plan.policy.auto_reload_all
                && c.plan.reload_on_create
                && c.plan.reload_on_delete
                && c.argo_rollouts
        );
        assert!(!c.leader_election.enable_ha);
        assert_eq!(c.plan.strategy, Strategy::Annotations);
        assert!(c.ignore_secrets && !c.ignore_configmaps);
        assert_eq!(
            c.plan.policy.ignored_workload_types,
            [WorkloadKind::Job, WorkloadKind::CronJob].into()
        );
        assert_eq!(
            c.scope.namespaces_to_ignore,
            ["kube-system", "other", "third"].map(String::from).into()
        );
        assert_eq!(
            c.scope.namespace_selector.unwrap().to_string(),
            "team=a,env"
        );
        assert_eq!(c.log_level, "warn");
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.plan.policy.keys.auto, "example.com/auto");
    }

    #[test]
    fn refused_values_name_the_flag() {
        assert_eq!(err_flag(&["--reload-strategy=foo"]), "reload-strategy");
        assert_eq!(
            err_flag(&["--resources-to-ignore=configmaps,secrets"]),
            "resources-to-ignore"
        );
        assert_eq!(
            err_flag(&["--resources-to-ignore=deployments"]),
            "resources-to-ignore"
        );
        assert_eq!(
            err_flag(&["--namespace-selector=bad key:x"]),
            "namespace-selector"
        );
        assert_eq!(
            err_flag(&["--resource-label-selector=a in b"]),
            "resource-label-selector"
        );
        assert_eq!(err_flag(&["--reload-debounce=5"]), "reload-debounce");
        assert_eq!(
            err_flag(&["--leader-election-lease-name=Bad_Name"]),
            "leader-election-lease-name"
        );
        assert_eq!(err_flag(&["--streaming-lists=maybe"]), "streaming-lists");
        assert_eq!(
            err_flag(&["--leader-election-lease-duration=forever"]),
            "leader-election-lease-duration"
        );
        assert_eq!(
            err_flag(&["--cronjob-strategy=sometimes"]),
            "cronjob-strategy"
        );
        assert_eq!(err_flag(&["--webhook-addr=nonsense"]), "webhook-addr");
        assert_eq!(err_flag(&["--tls-min-version=1.0"]), "tls-min-version");
        assert_eq!(
            err_flag(&["--max-concurrent-reloads=0"]),
            "max-concurrent-reloads"
        );
        assert_eq!(err_flag(&["--webhook-url=ftp://x"]), "webhook-url");
        // What two flags of one group must agree on is checked by that group.
        assert_eq!(
            err_flag(&["--reload-debounce=1s", "--reload-debounce-max=500ms"]),
            "reload-debounce-max"
        );
        assert_eq!(err_flag(&["--tls-cert-file=/c.pem"]), "tls-key-file");
        assert_eq!(
            err_flag(&["--leader-election-renew-deadline=20s"]),
            "leader-election-lease-duration"
        );
        let e = Cli::try_parse_from(["rekindle", "--reload-strategy=foo"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--reload-strategy") && e.contains("foo") && e.contains("env-vars"),
            "{e}"
        );
    }

    /// Each group of flags lands in its own part of the configuration; enum flags take their names and
    /// aliases (Go's names for TLS versions).
    #[test]
    fn groups_and_enum_names() {
        let (c, _) = parse(&[
            "--tls-min-version=VersionTLS12",
            "--cronjob-strategy=template",
            "--max-rollouts-in-progress=3",
            "--enable-ha",
            "--leader-election-lease-name=mine",
        ])
        .unwrap();
        assert_eq!(c.webhook.tls_min_version, TlsVersion::Tls12);
        assert_eq!(c.plan.cronjob_strategy, CronJobStrategy::Template);
        assert_eq!(c.release.max_rollouts_in_progress, 3);
        assert!(c.leader_election.enable_ha);
        assert_eq!(c.leader_election.lease_name, "mine");
        let (c, _) = parse(&["--tls-min-version=1.3"]).unwrap();
        assert_eq!(c.webhook.tls_min_version, TlsVersion::Tls13);
    }

    #[test]
    fn warned_values_still_start() {
        let (_, w) = parse(&[
            "--log-format=xml",
            "--log-level=loud",
            "--ignored-workload-types=pods",
        ])
        .unwrap();
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("--ignored-workload-types"));
        assert!(w.iter().any(|m| m.contains("--log-format")));
        assert!(w.iter().any(|m| m.contains("--log-level")));
    }

    #[test]
    fn a_repeated_value_flag_takes_the_last_value() {
        let (c, _) = parse(&[
            "--reload-strategy=annotations",
            "--reload-strategy",
            "env-vars",
        ])
        .unwrap();
        assert_eq!(c.plan.strategy, Strategy::EnvVars);
    }

    #[test]
    fn bad_boolean_is_a_clap_error() {
        let e = Cli::try_parse_from(["rekindle", "--auto-reload-all=maybe"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--auto-reload-all"));
    }

    #[test]
    fn namespace_scope_precedence() {
        let cli = Cli::try_parse_from([
            "rekindle",
            "--namespace-selector=a:b",
            "--namespaces-to-ignore=x",
        ])
        .unwrap();
        let (c, w) = Config::from_args(&cli.server, |k| {
            (k == "KUBERNETES_NAMESPACE").then(|| "mine".to_string())
        })
        .unwrap();
        assert_eq!(c.scope.namespaces, Some(["mine".to_string()].into()));
        assert!(c.scope.namespace_selector.is_none() && c.scope.namespaces_to_ignore.is_empty());
        assert_eq!(w.len(), 2);
        let cli = Cli::try_parse_from(["rekindle", "--namespaces=a,b"]).unwrap();
        let (c, _) = Config::from_args(&cli.server, |_| Some("mine".into())).unwrap();
        assert_eq!(
            c.scope.namespaces,
            Some(["a".to_string(), "b".to_string()].into())
        );
    }

    #[test]
    fn the_environment_is_read_into_the_config() {
        let cli = Cli::try_parse_from(["rekindle"]).unwrap();
        let env = |k: &str| {
            let v = match k {
                "POD_NAME" => "rekindle-0",
                "POD_NAMESPACE" => "rekindle",
                "METRICS_COUNT_BY_NAMESPACE" => "enabled",
                "ALERT_ON_RELOAD" => "true",
                "ALERT_WEBHOOK_URL" => "https://hooks.example/x",
                "ALERT_WEBHOOK_PROXY" => "http://proxy:3128",
                _ => return None,
            };
            Some(v.to_string())
        };
        let (c, _) = Config::from_args(&cli.server, env).unwrap();
        assert_eq!(c.pod_name.as_deref(), Some("rekindle-0"));
        assert_eq!(c.pod_namespace.as_deref(), Some("rekindle"));
        assert!(c.metrics_count_by_namespace);
        let alerts = c.alerts.unwrap();
        assert_eq!(alerts.url, "https://hooks.example/x");
        assert_eq!(alerts.proxy.as_deref(), Some("http://proxy:3128"));
        let (c, _) = Config::from_args(&cli.server, |_| None).unwrap();
        assert!(c.pod_name.is_none() && c.alerts.is_none() && !c.metrics_count_by_namespace);
    }

    #[test]
    fn csv_lists() {
        assert_eq!(
            split_list(&["\"a=b\",c".into(), " d ".into()]).unwrap(),
            vec!["a=b", "c", "d"]
        );
        assert_eq!(split_list(&["\"x,y\"".into()]).unwrap(), vec!["x,y"]);
    }
}
