//! A real Prometheus server for the tests: started as a host process from the binary built by
//! `build-companions.sh`, scraping what a configuration derived from the chart's ServiceMonitor
//! selects (the relabelling the Prometheus Operator generates for a ServiceMonitor endpoint), and
//! evaluating the chart's PrometheusRule.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::companions::HostProcess;
use crate::rekindle::{free_port, http_get};

/// The label name the Operator's relabelling uses for a Kubernetes label (`app.kubernetes.io/name` →
/// `app_kubernetes_io_name`).
fn sanitized(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The scrape jobs the Prometheus Operator generates for each endpoint of `monitor` (a ServiceMonitor as
/// stored), with `protocols` as the scrape protocols and `interval` instead of the endpoint's (tests
/// cannot wait 30 s a scrape). Job names get `suffix`, so one monitor can be scraped in two formats.
pub fn service_monitor_jobs(
    monitor: &Value,
    kubeconfig: &Path,
    protocols: &[&str],
    interval: &str,
    suffix: &str,
) -> Result<Vec<Value>> {
    let name = monitor["metadata"]["name"].as_str().unwrap_or_default();
    let ns = monitor["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let spec = &monitor["spec"];
    let namespaces: Vec<Value> = spec["namespaceSelector"]["matchNames"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![json!(ns)]);
    let match_labels = spec["selector"]["matchLabels"]
        .as_object()
        .ok_or_else(|| anyhow!("ServiceMonitor {name} selects by matchLabels only here"))?;
    let mut jobs = Vec::new();
    for (i, endpoint) in spec["endpoints"]
        .as_array()
        .ok_or_else(|| anyhow!("ServiceMonitor {name} has no endpoints"))?
        .iter()
        .enumerate()
    {
        let mut relabel = Vec::new();
        for (k, v) in match_labels {
            let l = sanitized(k);
            relabel.push(json!({
                "action": "keep",
                "source_labels": [format!("__meta_kubernetes_service_label_{l}"),
                                  format!("__meta_kubernetes_service_labelpresent_{l}")],
                "regex": format!("({});true", v.as_str().unwrap_or_default()),
            }));
        }
        let port = endpoint["port"].as_str().unwrap_or_default();
        relabel.extend([
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port}),
            json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
            json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}),
            json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
            json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
            json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}),
            json!({"target_label": "endpoint", "replacement": port}),
        ]);
        jobs.push(json!({
            "job_name": format!("serviceMonitor/{ns}/{name}/{i}{suffix}"),
            "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
            "kubernetes_sd_configs": [{
                "role": "endpoints",
                "kubeconfig_file": kubeconfig,
                "namespaces": {"names": namespaces},
            }],
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "scrape_protocols": protocols,
            "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
            "scheme": endpoint["scheme"].as_str().unwrap_or("http"),
            "relabel_configs": relabel,
            // Tell the two formats apart in queries.
            "metric_relabel_configs": [{"target_label": "format", "replacement": protocols.join(",")}],
        }));
    }
    Ok(jobs)
}

/// A running Prometheus; stopped (and waited for) on drop.
pub struct Prometheus {
    process: HostProcess,
    pub port: u16,
}

impl Prometheus {
    /// Starts `bin` with `config` (written as JSON, which Prometheus reads as YAML) and the rule
    /// `groups`, and waits until it answers.
    pub async fn start(bin: &Path, dir: &Path, config: &Value, groups: &Value) -> Result<Self> {
        let mut config = config.clone();
        std::fs::write(
            dir.join("rules.yaml"),
            serde_json::to_string(&json!({ "groups": groups }))?,
        )?;
        config["rule_files"] = json!([dir.join("rules.yaml")]);
        std::fs::write(dir.join("prometheus.yml"), serde_json::to_string(&config)?)?;
        let port = free_port()?;
        let config_file = format!("--config.file={}", dir.join("prometheus.yml").display());
        let storage = format!("--storage.tsdb.path={}", dir.join("data").display());
        let listen = format!("--web.listen-address=127.0.0.1:{port}");
        let mut server = Self {
            process: HostProcess::start(
                bin,
                &[&config_file, &storage, &listen],
                dir.join("prometheus.log"),
            )?,
            port,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = http_get(port, "/-/ready").await {
                return Ok(server);
            }
            if let Some(status) = server.process.exited() {
                bail!("prometheus exited ({status}): {}", server.log_tail());
            }
            if std::time::Instant::now() > deadline {
                bail!("prometheus not ready in 60 s: {}", server.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    async fn api(&self, path: &str) -> Result<Value> {
        let (status, body) = http_get(self.port, path).await?;
        let v: Value =
            serde_json::from_str(&body).with_context(|| format!("{path}: {status} {body}"))?;
        if v["status"] != "success" {
            bail!("{path}: {status} {body}");
        }
        Ok(v["data"].clone())
    }

    /// An instant query's result vector.
    pub async fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", url_encode(promql)))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The alerts Prometheus holds (pending or firing).
    pub async fn alerts(&self) -> Result<Vec<Value>> {
        let data = self.api("/api/v1/alerts").await?;
        Ok(data["alerts"].as_array().cloned().unwrap_or_default())
    }

    /// Every scrape target and its health.
    pub async fn targets(&self) -> Result<Vec<Value>> {
        let data = self.api("/api/v1/targets").await?;
        Ok(data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
