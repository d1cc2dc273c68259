//! Installs the chart's RBAC (every optional rule on) into a namespace and prints the kubeconfig of
//! its ServiceAccount, so the e2e suite can run rekindle with exactly what the chart grants:
//! `REKINDLE_E2E_KUBECONFIG=$(chart_identity) REKINDLE_E2E_POD_NAMESPACE=rekindle-system cargo test ...`.

use anyhow::Result;

#[tokio::main]
async fn main() -> Result<()> {
    let namespace = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "rekindle-system".into());
    let client = e2e::admin_client().await?;
    let kubeconfig = e2e::chart::install_identity(&client, "rekindle", &namespace).await?;
    println!("{}", kubeconfig.display());
    Ok(())
}
