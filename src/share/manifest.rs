//! The two objects that share an existing DRBD resource (pure): a ReadWriteMany filesystem PV of
//! the resource and the claim bound to it. Kubernetes' own PV controller binds them.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use serde_json::json;

use crate::names::NFS_PORT_ANNOTATION;

/// Where ports for the volumes' own NFS servers are taken from, when none is given.
pub const FIRST_AUTOMATIC_PORT: u16 = 20490;

/// What `share` was asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct ShareRequest {
    /// The DRBD resource, which is also the PV's name and its CSI volume handle.
    pub resource: String,
    pub namespace: String,
    pub claim: String,
    /// The resource's usable size, as a Kubernetes quantity (`10Gi`).
    pub size: String,
    /// Both objects' class; `""` binds only to each other.
    pub storage_class: String,
    pub csi_driver: String,
    /// The port of the volume's own NFS server on whichever node is its primary.
    pub nfs_port: u16,
}

/// The PV: `Retain`, because the resource is not the claim's to delete (LINSTOR's own
/// `resource-definition delete` does that); its claim reference makes it bind only to the claim.
pub fn persistent_volume(request: &ShareRequest) -> PersistentVolume {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": request.resource,
            "annotations": {NFS_PORT_ANNOTATION: request.nfs_port.to_string()},
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "volumeMode": "Filesystem",
            "capacity": {"storage": request.size},
            "storageClassName": request.storage_class,
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": request.namespace, "name": request.claim},
            "csi": {"driver": request.csi_driver, "volumeHandle": request.resource},
        },
    }))
    .expect("a PV from known fields")
}

/// The claim, naming the PV so that no provisioner is asked for one.
pub fn claim(request: &ShareRequest) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": request.claim, "namespace": request.namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": request.size}},
            "storageClassName": request.storage_class,
            "volumeName": request.resource,
        },
    }))
    .expect("a claim from known fields")
}

/// The lowest port from [`FIRST_AUTOMATIC_PORT`] that no PV names: each volume's NFS server has
/// a port of its own, so that any number of them can be primary on one node.
pub fn lowest_free_port(pvs: &[PersistentVolume]) -> Option<u16> {
    let taken: BTreeSet<u16> = pvs
        .iter()
        .filter_map(|pv| pv.annotations().get(NFS_PORT_ANNOTATION)?.parse().ok())
        .collect();
    (FIRST_AUTOMATIC_PORT..=u16::MAX).find(|port| !taken.contains(port))
}

/// Whether an existing PV is the one `share` would make (so that running it again is harmless).
pub fn same_volume(existing: &PersistentVolume, request: &ShareRequest) -> bool {
    let Some(spec) = existing.spec.as_ref() else {
        return false;
    };
    let handle = spec.csi.as_ref().map(|c| c.volume_handle.as_str());
    let claim = spec.claim_ref.as_ref();
    handle == Some(request.resource.as_str())
        && claim.and_then(|c| c.namespace.as_deref()) == Some(request.namespace.as_str())
        && claim.and_then(|c| c.name.as_deref()) == Some(request.claim.as_str())
}

/// Whether an existing claim is the one `share` would make.
pub fn same_claim(existing: &PersistentVolumeClaim, request: &ShareRequest) -> bool {
    existing.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(request.resource.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharedvolume::claim::pv_backs_shared_claim;
    use crate::sharedvolume::filters::Filters;
    use crate::volume::csi_resource_name;

    fn request() -> ShareRequest {
        ShareRequest {
            resource: "pvc-shared-1".into(),
            namespace: "apps".into(),
            claim: "data".into(),
            size: "10Gi".into(),
            storage_class: String::new(),
            csi_driver: "linstor.csi.linbit.com".into(),
            nfs_port: 20490,
        }
    }

    #[test]
    fn the_pair_binds_only_to_each_other_and_never_deletes_the_resource() {
        let request = request();
        let pv = persistent_volume(&request);
        let claim = claim(&request);
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
        assert_eq!(spec.claim_ref.as_ref().unwrap().name.as_deref(), Some("data"));
        assert_eq!(
            claim.spec.as_ref().unwrap().volume_name.as_deref(),
            Some("pvc-shared-1")
        );
        assert_eq!(spec.storage_class_name, claim.spec.as_ref().unwrap().storage_class_name);
        assert!(same_volume(&pv, &request) && same_claim(&claim, &request));
    }

    #[test]
    fn the_volume_is_one_both_loops_serve() {
        let pv = persistent_volume(&request());
        assert_eq!(csi_resource_name(&pv).as_deref(), Some("pvc-shared-1"));
        let filters = Filters {
            csi_drivers: vec!["linstor.csi.linbit.com".into()],
            ..Default::default()
        };
        assert!(pv_backs_shared_claim(&pv, &filters));
    }

    #[test]
    fn each_volume_gets_a_port_no_other_pv_names() {
        assert_eq!(lowest_free_port(&[]), Some(FIRST_AUTOMATIC_PORT));
        let mut first = request();
        let mut second = request();
        second.nfs_port = 20492;
        let taken = [persistent_volume(&first), persistent_volume(&second)];
        assert_eq!(lowest_free_port(&taken), Some(20491));
        first.nfs_port = 20491;
        let taken = [
            persistent_volume(&request()),
            persistent_volume(&first),
            persistent_volume(&second),
        ];
        assert_eq!(lowest_free_port(&taken), Some(20493));
    }

    #[test]
    fn another_claim_on_the_resource_is_not_the_same() {
        let mut other = request();
        other.claim = "other".into();
        assert!(!same_volume(&persistent_volume(&other), &request()));
    }
}
