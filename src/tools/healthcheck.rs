//! `rekindle healthcheck`.

use anyhow::{anyhow, bail, Context, Result};

/// `rekindle healthcheck`: GETs each URL over plain HTTP (the admin server) and fails unless all answer
/// 2xx. For container probes and `helm test`, where the image has no curl.
pub fn run_healthcheck(urls: &[String], timeout: std::time::Duration) -> Result<()> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    use hyper_util::rt::TokioExecutor;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client: Client<HttpConnector, Empty<axum::body::Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        for url in urls {
            let uri: hyper::Uri = url.parse().with_context(|| format!("--url {url:?}"))?;
            if uri.scheme_str() != Some("http") {
                bail!("--url {url:?}: only http:// URLs (the admin server) are probed");
            }
            let response = tokio::time::timeout(timeout, client.get(uri))
                .await
                .map_err(|_| anyhow!("{url}: no answer within {timeout:?}"))?
                .with_context(|| url.clone())?;
            let status = response.status();
            let body = tokio::time::timeout(timeout, response.into_body().collect())
                .await
                .map_err(|_| anyhow!("{url}: body not read within {timeout:?}"))?
                .with_context(|| url.clone())?
                .to_bytes();
            if !status.is_success() {
                bail!(
                    "{url}: {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
                );
            }
            println!("{url}: {status}");
        }
        Ok(())
    })
}
