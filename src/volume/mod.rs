//! The volume: whatever holds a shared volume's two endpoints. The NFS *service endpoint* (where
//! the NFS server listens) is read from it, the *mount endpoint* (what clients mount) is published
//! to it. Backends sit behind [`VolumeBackend`].

pub mod endpoint;
mod factory;
pub mod kubernetes;
pub mod storageos;

use async_trait::async_trait;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;

pub use endpoint::NfsEndpoint;
pub use factory::{BackendSettings, backend};

/// What a backend knows of one volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The backend's id of the volume (the `storageos.com/volume-id` label value).
    pub id: String,
    /// Where the NFS server listens, unparsed: `None` until the storage system reports it.
    pub service_endpoint: Option<String>,
    /// What is published for clients to mount now.
    pub mount_endpoint: Option<String>,
    /// Backend-specific token for optimistic concurrency (StorageOS `version`).
    pub version: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("storage API: {0}")]
    Api(String),
    /// The storage system holds something we cannot use; reported to the user, not retried.
    #[error("{message}")]
    Invalid { reason: &'static str, message: String },
}

/// A claim, by namespace and name: what a backend reports when one of its volumes changed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey {
    pub namespace: String,
    pub name: String,
}

impl ClaimKey {
    pub fn of(claim: &PersistentVolumeClaim) -> Self {
        Self {
            namespace: claim.namespace().unwrap_or_default(),
            name: claim.name_any(),
        }
    }
}

impl std::fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait VolumeBackend: Send + Sync {
    /// The volume behind `pv`; `None` when this backend has no such volume.
    async fn volume(&self, pv: &PersistentVolume) -> Result<Option<VolumeInfo>, VolumeError>;

    /// Publishes `mount_endpoint` (`<ClusterIP>:2049`) as the volume's mount endpoint.
    async fn publish_mount_endpoint(
        &self,
        pv: &PersistentVolume,
        volume: &VolumeInfo,
        mount_endpoint: &str,
    ) -> Result<(), VolumeError>;

    /// Claims whose volume changed, for backends that cannot be watched through Kubernetes. The
    /// stream runs until it is dropped.
    fn changes(&self) -> Option<BoxStream<'static, ClaimKey>> {
        None
    }
}

/// The DRBD resource (and default volume id) of a CSI volume: its volume handle without a
/// `/<volume-number>` suffix.
pub fn csi_resource_name(pv: &PersistentVolume) -> Option<String> {
    let handle = &pv.spec.as_ref()?.csi.as_ref()?.volume_handle;
    let resource = match handle.rsplit_once('/') {
        Some((name, number)) if !name.is_empty() && number.chars().all(|c| c.is_ascii_digit()) => name,
        _ => handle.as_str(),
    };
    (!resource.is_empty()).then(|| resource.to_owned())
}
