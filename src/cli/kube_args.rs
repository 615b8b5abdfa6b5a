//! `--kubeconfig` and `--context`, as kubectl users expect them.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

/// Which cluster a command talks to.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeArgs {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then
    /// the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl KubeArgs {
    /// The client configuration these arguments name.
    pub async fn config(&self) -> anyhow::Result<Config> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let file = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .with_context(|| format!("kubeconfig {}", path.display()))
            }
            (None, Some(context)) => Config::from_kubeconfig(&options)
                .await
                .with_context(|| format!("kubeconfig context {context}")),
            (None, None) => Config::infer().await.context(
                "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a cluster: \
                 pass --kubeconfig FILE (hack/demo.sh prints the demo's)",
            ),
        }
    }

    /// A client for the cluster these arguments name.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = self.config().await?;
        kube::Client::try_from(config).context("building the Kubernetes client")
    }
}

#[cfg(test)]
#[path = "kube_args_tests.rs"]
mod tests;
