//! Alerts after a reload (`ALERT_ON_RELOAD=true`, `ALERT_SINK` slack|teams|gchat|raw, `ALERT_WEBHOOK_URL`,
//! `ALERT_ADDITIONAL_INFO`), with Reloader's payloads. Sent by a background task from a bounded queue:
//! a slow or dead alert endpoint never delays a reload; when the queue is full the alert is dropped and
//! counted.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Bytes;
use hyper::Uri;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::metrics::{ErrorKind, Metrics};
use crate::outbound::http::{Destination, HttpClient, Outbox};

const QUEUE: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Slack,
    Teams,
    GoogleChat,
    Raw,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertConfig {
    pub url: String,
    pub sink: Sink,
    pub additional_info: Option<String>,
    /// `ALERT_WEBHOOK_PROXY`: an HTTP proxy (CONNECT) the alerts go through.
    pub proxy: Option<String>,
}

impl AlertConfig {
    /// Reads the environment; `None` unless `ALERT_ON_RELOAD=true` and a URL is set.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Option<Self> {
        if env("ALERT_ON_RELOAD").map(|v| v.trim().eq_ignore_ascii_case("true")) != Some(true) {
            return None;
        }
        let url = env("ALERT_WEBHOOK_URL")
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())?;
        let sink = match env("ALERT_SINK")
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "slack" => Sink::Slack,
            "teams" => Sink::Teams,
            "gchat" => Sink::GoogleChat,
            _ => Sink::Raw,
        };
        let additional_info = env("ALERT_ADDITIONAL_INFO").map(|s| s.trim().to_string());
        let proxy = env("ALERT_WEBHOOK_PROXY").filter(|p| !p.trim().is_empty());
        Some(Self {
            url,
            sink,
            additional_info,
            proxy,
        })
    }

    /// The request body and content type for a message, as Reloader sends them.
    pub fn payload(&self, msg: &str) -> (String, &'static str) {
        let msg = match &self.additional_info {
            Some(info) => format!("{info} : {msg}"),
            None => msg.to_string(),
        };
        match self.sink {
            Sink::Slack => (
                json!({"attachments": [{"text": msg, "color": "good", "author_name": "Reloader"}]})
                    .to_string(),
                "application/json",
            ),
            Sink::Teams | Sink::GoogleChat => {
                (json!({"text": msg}).to_string(), "application/json")
            }
            Sink::Raw => (msg.replace('*', ""), "text/plain"),
        }
    }
}

/// The message for one reload, in Reloader's words.
pub fn reload_message(
    resource: &str,
    resource_type: &str,
    namespace: &str,
    workload: &str,
    kind: &str,
) -> String {
    format!(
        "Reloader detected changes in *{resource}* of type *{resource_type}* in namespace *{namespace}*. Hence reloaded *{workload}* of type *{kind}* in namespace *{namespace}*"
    )
}

/// Direct, or through `ALERT_WEBHOOK_PROXY` (the two connectors have different types).
pub struct Alerter {
    cfg: AlertConfig,
    outbox: Outbox,
    metrics: Arc<Metrics>,
}

impl Alerter {
    /// Starts the background sender; its task is returned for the caller to supervise.
    pub fn start(cfg: AlertConfig, metrics: Arc<Metrics>) -> Result<(Arc<Self>, JoinHandle<()>)> {
        let url: Uri = cfg
            .url
            .parse()
            .with_context(|| format!("ALERT_WEBHOOK_URL {:?} is not a URL", cfg.url))?;
        let client = match &cfg.proxy {
            Some(p) => HttpClient::via_proxy(p).context("ALERT_WEBHOOK_PROXY")?,
            None => HttpClient::direct()?,
        };
        let destination = Destination {
            url,
            client,
            timeout: Duration::from_secs(10),
            retries: 2,
        };
        let failure_metrics = metrics.clone();
        let (outbox, sender) = Outbox::start(destination, QUEUE, move |e| {
            failure_metrics.error(ErrorKind::Alert);
            tracing::warn!(error = %e, "reload alert not delivered");
        });
        let alerter = Self {
            cfg,
            outbox,
            metrics,
        };
        Ok((Arc::new(alerter), sender))
    }

    /// Queues an alert; never waits.
    pub fn alert(&self, msg: String) {
        let (body, content_type) = self.cfg.payload(&msg);
        if !self.outbox.try_send(content_type, Bytes::from(body)) {
            self.metrics.error(ErrorKind::AlertDropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn config_from_env() {
        assert_eq!(
            AlertConfig::from_env(env(&[("ALERT_WEBHOOK_URL", "http://x")])),
            None,
            "needs ALERT_ON_RELOAD"
        );
        let c = AlertConfig::from_env(env(&[
            ("ALERT_ON_RELOAD", "true"),
            ("ALERT_WEBHOOK_URL", " http://x "),
            ("ALERT_SINK", "Slack"),
        ]))
        .unwrap();
        assert_eq!((c.url.as_str(), c.sink), ("http://x", Sink::Slack));
        let c = AlertConfig::from_env(env(&[
            ("ALERT_ON_RELOAD", "true"),
            ("ALERT_WEBHOOK_URL", "http://x"),
        ]))
        .unwrap();
        assert_eq!(c.sink, Sink::Raw);
    }

    #[test]
    fn payloads_per_sink() {
        let msg = reload_message("cfg", "CONFIGMAP", "ns", "web", "Deployment");
        let cfg = |sink| AlertConfig {
            url: "http://x".into(),
            sink,
            additional_info: Some("prod".into()),
            proxy: None,
        };
        let (slack, ct) = cfg(Sink::Slack).payload(&msg);
        assert_eq!(ct, "application/json");
        let v: serde_json::Value = serde_json::from_str(&slack).unwrap();
        assert_eq!(v["attachments"][0]["author_name"], "Reloader");
        assert!(v["attachments"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("prod : Reloader detected changes in *cfg*"));
        let (teams, _) = cfg(Sink::Teams).payload(&msg);
        assert!(serde_json::from_str::<serde_json::Value>(&teams).unwrap()["text"].is_string());
        let (raw, ct) = cfg(Sink::Raw).payload(&msg);
        assert_eq!(ct, "text/plain");
        assert!(!raw.contains('*') && raw.contains("changes in cfg of type CONFIGMAP"));
    }
}
