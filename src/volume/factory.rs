//! Builds the volume backend from its own settings (the controller maps its flags onto them).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use kube::Client;

use super::VolumeBackend;
use super::kubernetes::PvAnnotations;
use super::storageos::StorageOs;
use super::storageos::api::{HttpApi, HttpSettings};

/// Which backend, with what it needs.
#[derive(Clone, Debug)]
pub enum BackendSettings {
    /// The PV's annotations hold both endpoints.
    Kubernetes,
    /// The StorageOS v2 API, polled every `poll_interval`.
    Storageos {
        http: HttpSettings,
        poll_interval: Duration,
    },
}

pub fn backend(settings: BackendSettings, client: &Client) -> Result<Arc<dyn VolumeBackend>> {
    Ok(match settings {
        BackendSettings::Kubernetes => Arc::new(PvAnnotations::new(client.clone())),
        BackendSettings::Storageos { http, poll_interval } => {
            let api = HttpApi::new(http)?;
            Arc::new(StorageOs::new(Arc::new(api), poll_interval))
        }
    })
}
