//! The Kubernetes client both loops use, from the common flags, and what both do to the objects
//! they cache.

use anyhow::{Context as _, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::CommonArgs;

/// Connects as the flags say: `--kubeconfig` or the usual places, `--kube-api-timeout` as the
/// read and write timeout. `retry`: whether the client itself retries throttled requests; the
/// agent wants a PodDisruptionBudget's 429 at once (it retries in a later round) rather than a
/// client that waits inside the call for Retry-After.
pub async fn connect(common: &CommonArgs, retry: bool) -> Result<Client> {
    Client::try_from(config(common, retry).await?).context("cannot build a Kubernetes client")
}

/// The client configuration [`connect`] uses, for callers that build their own client stack.
pub async fn config(common: &CommonArgs, retry: bool) -> Result<Config> {
    let mut config = match &common.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("cannot use the kubeconfig {}", path.display()))?
        }
        None => Config::infer()
            .await
            .context("cannot find the Kubernetes API (in-cluster, KUBECONFIG or ~/.kube/config)")?,
    };
    if let Some(timeout) = common.kube_api_timeout {
        config.read_timeout = Some(*timeout);
        config.write_timeout = Some(*timeout);
    }
    config.default_retry = retry;
    Ok(config)
}

/// The managed fields, often the larger part of an object, are read by neither loop: caches drop
/// them.
pub fn drop_managed_fields<K: kube::ResourceExt>(object: &mut K) {
    object.managed_fields_mut().clear();
}
