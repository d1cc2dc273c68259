//! Configuration: the command line and environment (`cli`), the table of flags the chart and the README
//! are checked against (`flags`), and the scope they select (`scope`,
//! `selector`).
pub mod cli;
pub mod flags;
pub mod scope;
pub mod selector;

pub use cli::*;

/// The client configuration: the kubeconfig file given, else in-cluster, `KUBECONFIG` or
/// `~/.kube/config` (the server and `rekindle why` alike).
pub async fn kube_config(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Config> {
    use anyhow::Context as _;
    match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Ok(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster"),
    }
}
