//! The clients: two from one read of the kubeconfig (the watches' and the writer's), what the
//! apiserver serves, and who rekindle is to it.

use anyhow::Result;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::config::Config;
use crate::metrics::Metrics;

/// Two clients from one read of the kubeconfig: one for the watches and everything else, and the
/// writer's own, whose connection pool the watches do not hold (reload::warm keeps it open).
pub(super) async fn clients(config: &Config, metrics: &Metrics) -> Result<(Client, Client)> {
    let mut kube_config = crate::config::kube_config(config.kubeconfig.as_deref()).await?;
    // Which replica made a request, in the apiserver's audit log (client-go's agent names the binary).
    let agent = format!(
        "rekindle/{} ({})",
        env!("CARGO_PKG_VERSION"),
        instance_name(config).unwrap_or_default()
    );
    if let Ok(agent) = http::HeaderValue::from_str(&agent) {
        kube_config.headers.push((http::header::USER_AGENT, agent));
    }
    let host = kube_config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let layer = metrics.rest_layer(host);
    let build = |c: kube::Config| -> Result<Client> {
        Ok(kube::client::ClientBuilder::try_from(c)?
            .with_layer(&layer)
            .build())
    };
    let watches = build(kube_config.clone())?;
    // The writer retries what it sends itself (bounded attempts, then the queue's backoff), and an
    // eviction a PodDisruptionBudget refuses (429) must come back to the walk at once: kube's own
    // retry of 429s (up to 15 tries, minutes of backoff) would hold the write permit meanwhile.
    kube_config.default_retry = false;
    Ok((watches, build(kube_config)?))
}

/// `--streaming-lists`: as given, or (auto) whether the apiserver is 1.34 or later, where it streams
/// the first state by default (1.33 turned the feature off again).
pub(super) async fn streaming_lists(client: &Client, flag: Option<bool>) -> bool {
    if let Some(on) = flag {
        return on;
    }
    match client.apiserver_version().await {
        Ok(v) => {
            let minor: u32 = v
                .minor
                .trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .unwrap_or(0);
            let on = v.major == "1" && minor >= 34;
            tracing::info!(version = %v.git_version, streaming_lists = on, "apiserver version");
            on
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read the apiserver's version; listing in pages");
            false
        }
    }
}

/// rekindle's own user name: its requests pass the webhook unchanged.
pub(super) async fn self_username(client: &Client) -> Option<String> {
    let review: SelfSubjectReview =
        serde_json::from_value(serde_json::json!({"metadata": {}})).ok()?;
    match Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
    {
        Ok(r) => r.status.and_then(|s| s.user_info).and_then(|u| u.username),
        Err(e) => {
            tracing::warn!(error = %e, "could not learn rekindle's own identity; its own writes will go through the webhook");
            None
        }
    }
}

/// This replica's name: the pod's (downward API), else the host's.
pub(super) fn instance_name(config: &Config) -> Option<String> {
    config
        .pod_name
        .clone()
        .or_else(|| hostname::get().ok().and_then(|h| h.into_string().ok()))
}
