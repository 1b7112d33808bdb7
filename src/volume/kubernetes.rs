//! The `kubernetes` backend: the PersistentVolume itself holds both endpoints, in annotations.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::{Api, Client, ResourceExt};

use super::{VolumeBackend, VolumeError, VolumeInfo, csi_resource_name};
use crate::apply::apply_annotations;
use crate::names::{CONTROLLER_FIELD_MANAGER, MOUNT_ENDPOINT_ANNOTATION, SERVICE_ENDPOINT_ANNOTATION};

pub struct PvAnnotations {
    pvs: Api<PersistentVolume>,
}

impl PvAnnotations {
    pub fn new(client: Client) -> Self {
        Self { pvs: Api::all(client) }
    }
}

/// Reads a volume from its PV (pure; the PV is already at hand).
pub fn volume_from_pv(pv: &PersistentVolume) -> VolumeInfo {
    let annotation = |key: &str| pv.annotations().get(key).filter(|v| !v.trim().is_empty()).cloned();
    VolumeInfo {
        id: csi_resource_name(pv).unwrap_or_else(|| pv.name_any()),
        service_endpoint: annotation(SERVICE_ENDPOINT_ANNOTATION),
        mount_endpoint: annotation(MOUNT_ENDPOINT_ANNOTATION),
        version: pv.resource_version(),
    }
}

#[async_trait]
impl VolumeBackend for PvAnnotations {
    async fn volume(&self, pv: &PersistentVolume) -> Result<Option<VolumeInfo>, VolumeError> {
        Ok(Some(volume_from_pv(pv)))
    }

    async fn publish_mount_endpoint(
        &self,
        pv: &PersistentVolume,
        _volume: &VolumeInfo,
        mount_endpoint: &str,
    ) -> Result<(), VolumeError> {
        apply_annotations(
            &self.pvs,
            CONTROLLER_FIELD_MANAGER,
            &pv.name_any(),
            &[(MOUNT_ENDPOINT_ANNOTATION, mount_endpoint)],
        )
        .await?;
        Ok(())
    }
}
