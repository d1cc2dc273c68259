//! Starting and stopping rekindle processes for tests, each scoped to the test's namespaces with a
//! webhook registration of its own (e2e/README.md, "Tests").

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::{rekindle_binary, state_dir, wait_for, wait_for_every};

/// What Prometheus sends when it scrapes.
pub const OPENMETRICS_ACCEPT: &str =
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1";

pub struct Options<'a> {
    /// Serve the webhook (otherwise the registration points at a port nobody listens on).
    pub webhook: bool,
    pub args: &'a [&'a str],
    /// Kubeconfig rekindle uses (default: its own identity, `target/e2e/rekindle.kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
    /// Wait for /ready and for the webhook to answer.
    pub wait_ready: bool,
    /// Distinguishes several rekindle processes of one test: their webhook registrations and logs.
    pub instance: &'a str,
    /// Extra environment variables.
    pub env: &'a [(&'a str, &'a str)],
    /// Do not pass `--namespaces` (the test scopes rekindle another way, e.g. `--namespace-selector`).
    pub cluster_wide: bool,
    /// Another rekindle-compatible binary (`just bench --vs`); default: [`rekindle_binary`].
    pub binary: Option<PathBuf>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Self {
            webhook: true,
            args: &[],
            kubeconfig: None,
            wait_ready: true,
            instance: "",
            env: &[],
            cluster_wide: false,
            binary: None,
        }
    }
}

pub struct Rekindle {
    child: Option<Child>,
    pub admin_port: u16,
    pub webhook_port: u16,
    pub registration: String,
    pub log: PathBuf,
    client: Client,
    namespaces: Vec<String>,
    options_args: Vec<String>,
    env: Vec<(String, String)>,
    cluster_wide: bool,
    webhook: bool,
    kubeconfig: PathBuf,
    binary: Option<PathBuf>,
}

/// The kubeconfig rekindle runs with unless a test gives another: its own identity, or
/// REKINDLE_E2E_KUBECONFIG (the suite under another identity, the chart's RBAC).
pub fn default_kubeconfig() -> PathBuf {
    std::env::var_os("REKINDLE_E2E_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| state_dir().join("rekindle.kubeconfig"))
}

pub fn free_port() -> Result<u16> {
    Ok(free_ports::<1>()?[0])
}

/// `N` distinct free ports: every listener is held until all are chosen (ports picked one after
/// another can come back equal). They are taken below the kernel's ephemeral range, at random: a port
/// the kernel handed out for `:0` is free again once released, and the next outbound connection of
/// the apiserver or of another test can take it before rekindle binds it.
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    use std::hash::{BuildHasher, Hasher};
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low = 10_000u16;
    let span = u64::from(ephemeral_from.saturating_sub(low).max(1));
    let mut listeners = Vec::with_capacity(N);
    for _ in 0..1000 {
        if listeners.len() == N {
            break;
        }
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let port = low + (random % span) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(l);
        }
    }
    if listeners.len() < N {
        bail!("no {N} free ports below {ephemeral_from}");
    }
    let mut ports = [0; N];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l.local_addr()?.port();
    }
    Ok(ports)
}

/// A plain HTTP GET on 127.0.0.1: status code and body.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    http_get_accept(port, path, None).await
}

/// A plain HTTP GET on 127.0.0.1 with an optional `Accept` header.
pub async fn http_get_accept(port: u16, path: &str, accept: Option<&str>) -> Result<(u16, String)> {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    // One client per call: each test has its own runtime, and a pooled connection must not outlive it.
    let client: hyper_util::client::legacy::Client<_, Empty<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http();
    let mut request = hyper::Request::get(format!("http://127.0.0.1:{port}{path}"));
    if let Some(accept) = accept {
        request = request.header(hyper::header::ACCEPT, accept);
    }
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(request.body(Empty::new())?),
    )
    .await
    .map_err(|_| anyhow!("GET :{port}{path}: no answer within 10 s"))?
    .with_context(|| format!("GET :{port}{path}"))?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The value of one sample (exact series text) in a `/metrics` body, 0 when absent.
fn sample(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

impl Rekindle {
    pub async fn start(client: &Client, namespaces: &[&str], options: Options<'_>) -> Result<Self> {
        let namespace = namespaces.first().ok_or_else(|| anyhow!("no namespace"))?;
        let registration = match options.instance {
            "" => format!("rekindle-e2e-{namespace}"),
            instance => format!("rekindle-e2e-{namespace}-{instance}"),
        };
        let [admin_port, webhook_port] = free_ports()?;
        let mut r = Self {
            child: None,
            admin_port,
            webhook_port,
            log: state_dir().join("logs").join(format!("{registration}.log")),
            registration,
            client: client.clone(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            options_args: options.args.iter().map(|s| s.to_string()).collect(),
            env: options
                .env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cluster_wide: options.cluster_wide,
            binary: options.binary.clone(),
            webhook: options.webhook,
            kubeconfig: options.kubeconfig.unwrap_or_else(default_kubeconfig),
        };
        // The chart grants the Lease in its own namespace only.
        if let Ok(ns) = std::env::var("REKINDLE_E2E_POD_NAMESPACE") {
            if !r.env.iter().any(|(k, _)| k == "POD_NAMESPACE") {
                r.env.push(("POD_NAMESPACE".into(), ns));
            }
        }
        r.register().await?;
        r.spawn().await?;
        if options.wait_ready {
            r.wait_ready().await?;
        }
        Ok(r)
    }

    /// The user name rekindle's kubeconfig authenticates as (a SelfSubjectReview).
    async fn identity(&self) -> Result<String> {
        use k8s_openapi::api::authentication::v1::SelfSubjectReview;
        let client = crate::client_from(&self.kubeconfig).await?;
        let review: SelfSubjectReview = serde_json::from_value(json!({"metadata": {}}))?;
        let answer = Api::<SelfSubjectReview>::all(client)
            .create(&Default::default(), &review)
            .await?;
        answer
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .ok_or_else(|| anyhow!("the SelfSubjectReview named no user"))
    }

    /// Registers the webhook as the chart does (its `not-rekindle-itself` matchCondition included, so
    /// rekindle's own writes never pay for a webhook call), but on 127.0.0.1 and scoped to the test's
    /// namespaces.
    async fn register(&self) -> Result<()> {
        let ca = std::fs::read(state_dir().join("pki/ca.crt"))?;
        let myself = self.identity().await?;
        use base64::Engine as _;
        // Each entry as the chart makes it; `rules` and the object selector tell them apart.
        let entry = |name: &str, rules: Value| {
            json!({
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "NoneOnDryRun",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 2,
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "IfNeeded",
                "clientConfig": {"url": format!("https://127.0.0.1:{}/mutate", self.webhook_port), "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)},
                "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": self.namespaces}]},
                "matchConditions": [{"name": "not-rekindle-itself", "expression": format!("request.userInfo.username != '{myself}'")}],
                "rules": rules,
            })
        };
        let workloads = entry(
            "workloads.rekindle.io",
            json!([
                {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["deployments", "statefulsets", "daemonsets"], "scope": "Namespaced"},
                {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["cronjobs", "jobs"], "scope": "Namespaced"},
                {"apiGroups": ["argoproj.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"], "resources": ["rollouts"], "scope": "Namespaced"},
                {"apiGroups": ["apps.openshift.io"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["deploymentconfigs"], "scope": "Namespaced"}
            ]),
        );
        // Labelled pods (pod restarts of an operator's pods), and no others.
        let mut pods = entry(
            "pods.rekindle.io",
            json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}]),
        );
        pods["objectSelector"] = json!({"matchLabels": {"rekindle.io/restart": "pods"}});
        let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": self.registration},
            "webhooks": [workloads, pods],
        }))?;
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let _ = api
            .delete(&self.registration, &DeleteParams::default())
            .await;
        api.create(&PostParams::default(), &config)
            .await
            .context("registering the webhook")?;
        Ok(())
    }

    async fn spawn(&mut self) -> Result<()> {
        let pki = state_dir().join("pki");
        std::fs::create_dir_all(self.log.parent().unwrap_or(&state_dir()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let binary = match &self.binary {
            Some(b) => b.clone(),
            None => rekindle_binary()?,
        };
        // An older build compared by `just bench --vs` may not know every flag the harness prefers.
        let help = help_of(&binary);
        let mut cmd = Command::new(binary);
        if !self.cluster_wide {
            cmd.arg(format!("--namespaces={}", self.namespaces.join(",")));
        }
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg(format!("--admin-addr=127.0.0.1:{}", self.admin_port))
            .arg(format!("--webhook-addr=127.0.0.1:{}", self.webhook_port))
            .arg("--reload-debounce=250ms");
        if help.contains("--shutdown-delay") {
            cmd.arg("--shutdown-delay=1s");
        }
        if self.webhook {
            cmd.arg("--tls-cert-file")
                .arg(pki.join("webhook.crt"))
                .arg("--tls-key-file")
                .arg(pki.join("webhook.key"));
        }
        cmd.args(&self.options_args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("KUBECONFIG")
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        self.child = Some(cmd.spawn().context("starting rekindle")?);
        Ok(())
    }

    /// Waits for /ready, then (with the webhook on) for the apiserver to reach the webhook.
    pub async fn wait_ready(&self) -> Result<()> {
        self.wait_ready_every(Duration::from_millis(200)).await
    }

    /// [`Rekindle::wait_ready`], asking `/ready` every `interval` (a benchmark timing start-up polls
    /// finely).
    pub async fn wait_ready_every(&self, interval: Duration) -> Result<()> {
        let port = self.admin_port;
        let ready = || async move {
            Ok(matches!(http_get(port, "/ready").await, Ok((200, _))).then_some(()))
        };
        wait_for_every(
            "rekindle /ready to answer 200",
            Duration::from_secs(30),
            interval,
            ready,
        )
        .await
        .with_context(|| format!("see {}", self.log.display()))?;
        if !self.webhook {
            return Ok(());
        }
        // A dry-run create shows the mutation once the apiserver reaches the webhook; it leaves no trace.
        let ns = &self.namespaces[0];
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        if cms.get_opt("rekindle-probe").await?.is_none() {
            let cm: ConfigMap = serde_json::from_value(
                json!({"metadata": {"name": "rekindle-probe"}, "data": {"probe": "1"}}),
            )?;
            cms.create(&PostParams::default(), &cm).await?;
        }
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
        let probe: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "rekindle-probe", "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"selector": {"matchLabels": {"app": "probe"}}, "template": {"metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "c", "image": "busybox", "envFrom": [{"configMapRef": {"name": "rekindle-probe"}}]}]}}}
        }))?;
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        wait_for(
            "the apiserver to reach rekindle's webhook (dry-run mutation)",
            Duration::from_secs(30),
            || async {
                let d = deployments.create(&dry, &probe).await?;
                let env = serde_json::to_value(&d)?;
                let env_stamped = env
                    .pointer("/spec/template/spec/containers/0/env/0/name")
                    .and_then(|v| v.as_str())
                    == Some("STAKATER_REKINDLE_PROBE_CONFIGMAP");
                let annotation_stamped = env
                    .pointer("/spec/template/metadata/annotations/rekindle.io~1config-hashes")
                    .is_some();
                let stamped = env_stamped || annotation_stamped;
                Ok(stamped.then_some(()))
            },
        )
        .await
    }

    pub async fn metrics(&self) -> Result<String> {
        self.metrics_as(Some(OPENMETRICS_ACCEPT)).await
    }

    /// `/metrics` as served for this `Accept` (None: the classic text format).
    pub async fn metrics_as(&self, accept: Option<&str>) -> Result<String> {
        let (status, body) = http_get_accept(self.admin_port, "/metrics", accept).await?;
        if status != 200 {
            bail!("/metrics answered {status}");
        }
        Ok(body)
    }

    /// `reloader_reload_executed_total` for successful (`true`) or failed reloads.
    pub async fn reloads(&self, success: bool) -> Result<f64> {
        self.metric(&format!(
            "reloader_reload_executed_total{{success=\"{success}\"}}"
        ))
        .await
    }

    /// The value of one metric sample (exact series text), 0 when absent.
    pub async fn metric(&self, series: &str) -> Result<f64> {
        Ok(sample(&self.metrics().await?, series))
    }

    /// The sum of every sample of one metric family (all label sets), 0 when absent.
    pub async fn metric_sum(&self, name: &str) -> Result<f64> {
        let body = self.metrics().await?;
        Ok(body
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(name)?;
                let value = match rest.strip_prefix('{') {
                    Some(labelled) => labelled.split_once("} ")?.1,
                    None => rest.strip_prefix(' ')?,
                };
                value.trim().parse::<f64>().ok()
            })
            .sum())
    }

    /// How many resource watch events (ConfigMaps, Secrets, SecretProviderClassPodStatuses,
    /// namespaces) rekindle has handled so far: pass it, plus the events a test causes, to `settled`.
    pub async fn handled(&self) -> Result<f64> {
        self.metric_sum("reloader_events_processed_total").await
    }

    /// Waits until rekindle has handled `handled` resource events and every reload they queued is
    /// written, has failed or is deferred (nothing queued but reloads waiting to be tried again or
    /// for their window, nothing in flight). A test asserting that a change led to *no* reload
    /// waits on this instead of sleeping: once it returns, any reload would already be visible.
    pub async fn settled(&self, handled: f64) -> Result<()> {
        crate::wait_for(
            &format!("rekindle to handle {handled} events and empty its queue"),
            Duration::from_secs(60),
            || async {
                // Two scrapes: whatever the handled events queued is in the queue by the second.
                if self.handled().await? < handled {
                    return Ok(None);
                }
                let body = self.metrics().await?;
                let waiting = sample(&body, "rekindle_reloads_awaiting_retry ")
                    + sample(&body, "rekindle_reloads_deferred{reason=\"window\"} ")
                    + sample(&body, "rekindle_reloads_deferred{reason=\"budget\"} ");
                let idle = sample(&body, "rekindle_queue_depth ") == waiting
                    && sample(&body, "rekindle_reloads_in_flight ") == 0.0;
                Ok(idle.then_some(()))
            },
        )
        .await
    }

    /// Waits until the index holds at least `workloads` workloads confirmed by the workload watch
    /// (admission records alone do not count).
    pub async fn wait_indexed(&self, workloads: f64) -> Result<()> {
        crate::wait_for(
            &format!("rekindle to index {workloads} workloads"),
            Duration::from_secs(60),
            || async {
                let have = self.metric("rekindle_index_workloads ").await?;
                Ok((have >= workloads).then_some(()))
            },
        )
        .await
    }

    /// The process's resident set size in bytes (from /proc).
    pub fn rss_bytes(&self) -> Option<u64> {
        proc_rss_bytes(self.pid()?)
    }

    /// SIGTERM and wait; the process must exit 0.
    pub async fn terminate(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                send_signal(pid, "TERM");
            }
            let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
                .await
                .context("rekindle did not exit after SIGTERM")??;
            if !status.success() {
                bail!(
                    "rekindle exited with {status} after SIGTERM; see {}",
                    self.log.display()
                );
            }
        }
        Ok(())
    }

    pub async fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await?;
        }
        Ok(())
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// CPU time (user + system) the process has used so far, from /proc.
    pub fn cpu_seconds(&self) -> Option<f64> {
        proc_cpu_seconds(self.pid()?)
    }

    /// Sends a signal (`STOP`, `CONT`, ...) to the running process.
    pub fn signal(&self, signal: &str) -> Result<()> {
        let pid = self
            .child
            .as_ref()
            .and_then(|c| c.id())
            .ok_or_else(|| anyhow!("rekindle is not running"))?;
        send_signal(pid, signal);
        Ok(())
    }

    /// Starts the process again with the same flags and ports.
    pub async fn restart(&mut self) -> Result<()> {
        self.spawn().await?;
        self.wait_ready().await
    }

    /// Every `rekindle_watch_protobuf_fallbacks_total` series: (`resource`, `reason`) and its value.
    pub async fn protobuf_fallbacks(&self) -> Result<BTreeMap<(String, String), f64>> {
        let body = self.metrics().await?;
        let mut series = BTreeMap::new();
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("rekindle_watch_protobuf_fallbacks_total{") else {
                continue;
            };
            let (labels, value) = rest
                .split_once("} ")
                .ok_or_else(|| anyhow!("unreadable series {line:?}"))?;
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_string())
                    .ok_or_else(|| anyhow!("no {name} in {line:?}"))
            };
            series.insert(
                (label("resource")?, label("reason")?),
                value.trim().parse()?,
            );
        }
        Ok(series)
    }

    /// Stops rekindle and removes its webhook registration. Against the real apiserver no watch may
    /// have left protobuf for JSON, whatever the test did: checked here while rekindle still answers.
    pub async fn stop(mut self) -> Result<()> {
        let fallbacks = match self.child {
            Some(_) => self.protobuf_fallbacks().await.unwrap_or_default(),
            None => BTreeMap::new(),
        };
        self.terminate().await?;
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let _ = api
            .delete(&self.registration, &DeleteParams::default())
            .await;
        let fell_back: Vec<_> = fallbacks.iter().filter(|(_, n)| **n > 0.0).collect();
        ensure!(fell_back.is_empty(), "watches left protobuf: {fell_back:?}");
        Ok(())
    }
}

/// Sends a signal by name with the system's `kill`, without FFI.
fn send_signal(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

/// A binary's `--help`, read once per binary.
fn help_of(binary: &std::path::Path) -> String {
    static HELP: std::sync::OnceLock<std::sync::Mutex<HashMap<PathBuf, String>>> =
        std::sync::OnceLock::new();
    let mut seen = HELP
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    seen.entry(binary.to_path_buf())
        .or_insert_with(|| {
            std::process::Command::new(binary)
                .arg("--help")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                .unwrap_or_default()
        })
        .clone()
}

/// A process's resident set size in bytes (from /proc).
pub fn proc_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// CPU time (user + system) a process has used so far, from /proc.
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
