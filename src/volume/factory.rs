//! Builds the volume backend the command line asks for.

use std::sync::Arc;

use anyhow::Result;
use kube::Client;

use super::VolumeBackend;
use super::kubernetes::PvAnnotations;
use super::storageos::StorageOs;
use super::storageos::api::{HttpApi, HttpSettings};
use crate::cli::{ControllerArgs, VolumeBackendKind};

/// The backend named by `--volume-backend`, configured from its flags.
pub fn backend(args: &ControllerArgs, client: &Client) -> Result<Arc<dyn VolumeBackend>> {
    Ok(match args.volume_backend {
        VolumeBackendKind::Kubernetes => Arc::new(PvAnnotations::new(client.clone())),
        VolumeBackendKind::Storageos => {
            let api = HttpApi::new(HttpSettings {
                endpoint: args.api_endpoint.clone(),
                secret_path: args.api_secret_path.clone(),
                refresh_interval: *args.api_refresh_interval,
                timeout: *args.api_timeout,
            })?;
            Arc::new(StorageOs::new(Arc::new(api), *args.volume_poll_interval))
        }
    })
}
