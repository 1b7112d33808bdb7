//! The objects that share an existing DRBD resource (pure). The server side: a ReadWriteMany
//! filesystem PV of the resource and the claim bound to it, the volume's handle for this product
//! (no pod mounts it). The client side: an NFS PV naming the volume's mount endpoint and the claim
//! apps mount. Kubernetes' own PV controller binds each pair.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use serde_json::json;

use crate::names::{
    NFS_PORT, NFS_PORT_ANNOTATION, SHARE_ROLE_CLIENT, SHARE_ROLE_LABEL, SHARE_ROLE_SERVER,
    SKIP_AFFINITY_CONTROLLER_ANNOTATION,
};
use crate::sharedvolume::claim::nfs_port;
use crate::volume::NfsEndpoint;

/// Where ports for the volumes' own NFS servers are taken from, when none is given.
pub const FIRST_AUTOMATIC_PORT: u16 = 20490;

/// What `share` was asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct ShareRequest {
    /// The DRBD resource, which is also the PV's name and its CSI volume handle.
    pub resource: String,
    pub namespace: String,
    /// The claim apps mount; the server side's claim is [`ShareRequest::server_claim`].
    pub claim: String,
    /// The resource's usable size, as a Kubernetes quantity (`10Gi`).
    pub size: String,
    /// Both objects' class; `""` binds only to each other.
    pub storage_class: String,
    pub csi_driver: String,
    /// The port of the volume's own NFS server on whichever node is its primary.
    pub nfs_port: u16,
    /// The export's path as clients mount it (nfs-ganesha's `Pseudo`).
    pub export_path: String,
    /// The client PV's mount options.
    pub mount_options: Vec<String>,
}

impl ShareRequest {
    /// The claim bound to the resource's PV: the controller serves it, no pod mounts it.
    pub fn server_claim(&self) -> String {
        format!("{}-drbd", self.claim)
    }

    /// The NFS PV apps' claim binds to.
    pub fn client_volume(&self) -> String {
        format!("{}-nfs", self.resource)
    }
}

/// The resource's PV: `Retain`, because the resource is not the claim's to delete (LINSTOR's own
/// `resource-definition delete` does that); its claim reference makes it bind only to the server
/// claim. Piraeus's affinity controller would replace it (it is not one LINSTOR CSI made).
pub fn persistent_volume(request: &ShareRequest) -> PersistentVolume {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": request.resource,
            "labels": {SHARE_ROLE_LABEL: SHARE_ROLE_SERVER},
            "annotations": {
                NFS_PORT_ANNOTATION: request.nfs_port.to_string(),
                SKIP_AFFINITY_CONTROLLER_ANNOTATION: "true",
            },
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "volumeMode": "Filesystem",
            "capacity": {"storage": request.size},
            "storageClassName": request.storage_class,
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": request.namespace, "name": request.server_claim()},
            "csi": {"driver": request.csi_driver, "volumeHandle": request.resource},
        },
    }))
    .expect("a PV from known fields")
}

/// The server claim, naming the PV so that no provisioner is asked for one.
pub fn claim(request: &ShareRequest) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": request.server_claim(),
            "namespace": request.namespace,
            "labels": {SHARE_ROLE_LABEL: SHARE_ROLE_SERVER},
        },
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

/// The NFS PV apps mount: the volume's mount endpoint (its Service's address, which stays where
/// it is when the primary moves) and the export, with the mount options; no class, so that it
/// binds only to the client claim.
pub fn client_volume(request: &ShareRequest, mount: NfsEndpoint) -> PersistentVolume {
    let mut options = request.mount_options.clone();
    if mount.port != NFS_PORT {
        options.push(format!("port={}", mount.port));
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": request.client_volume(), "labels": {SHARE_ROLE_LABEL: SHARE_ROLE_CLIENT}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "volumeMode": "Filesystem",
            "capacity": {"storage": request.size},
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": request.namespace, "name": request.claim},
            "mountOptions": options,
            "nfs": {"server": mount.ip.to_string(), "path": request.export_path},
        },
    }))
    .expect("a PV from known fields")
}

/// The claim apps mount, naming the NFS PV.
pub fn client_claim(request: &ShareRequest) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": request.claim,
            "namespace": request.namespace,
            "labels": {SHARE_ROLE_LABEL: SHARE_ROLE_CLIENT},
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": request.size}},
            "storageClassName": "",
            "volumeName": request.client_volume(),
        },
    }))
    .expect("a claim from known fields")
}

/// The lowest port from [`FIRST_AUTOMATIC_PORT`] that no PV names: each volume's NFS server has
/// a port of its own, so that any number of them can be primary on one node.
pub fn lowest_free_port(pvs: &[PersistentVolume]) -> Option<u16> {
    let taken: BTreeSet<u16> = pvs.iter().filter_map(nfs_port).collect();
    (FIRST_AUTOMATIC_PORT..=u16::MAX).find(|port| !taken.contains(port))
}

/// The PV that names `port`, other than the resource's own: a port given by hand must be free.
pub fn port_taken_by<'a>(pvs: &'a [PersistentVolume], port: u16, request: &ShareRequest) -> Option<&'a str> {
    pvs.iter()
        .filter(|pv| pv.name_any() != request.resource)
        .find(|pv| nfs_port(pv) == Some(port))
        .map(|pv| pv.metadata.name.as_deref().unwrap_or_default())
}

/// Whether an existing server PV is the one `share` would make (so that running it again is
/// harmless).
pub fn same_volume(existing: &PersistentVolume, request: &ShareRequest) -> bool {
    let handle = existing
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.as_str());
    handle == Some(request.resource.as_str()) && claimed_by(existing, request, &request.server_claim())
}

/// Whether an existing client PV is the one `share` would make for the mount endpoint `mount`.
pub fn same_client_volume(existing: &PersistentVolume, request: &ShareRequest, mount: NfsEndpoint) -> bool {
    let nfs = existing.spec.as_ref().and_then(|s| s.nfs.as_ref());
    nfs.is_some_and(|n| n.server == mount.ip.to_string() && n.path == request.export_path)
        && claimed_by(existing, request, &request.claim)
}

fn claimed_by(pv: &PersistentVolume, request: &ShareRequest, claim: &str) -> bool {
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    claim_ref.and_then(|c| c.namespace.as_deref()) == Some(request.namespace.as_str())
        && claim_ref.and_then(|c| c.name.as_deref()) == Some(claim)
}

/// Whether an existing claim names the PV `volume`.
pub fn names_volume(existing: &PersistentVolumeClaim, volume: &str) -> bool {
    existing.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(volume)
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
            export_path: "/export".into(),
            mount_options: vec!["nfsvers=4.2".into(), "hard".into()],
        }
    }

    fn mount() -> NfsEndpoint {
        "10.96.0.9:2049".parse().unwrap()
    }

    #[test]
    fn the_pair_binds_only_to_each_other_and_never_deletes_the_resource() {
        let request = request();
        let pv = persistent_volume(&request);
        let claim = claim(&request);
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
        assert_eq!(spec.claim_ref.as_ref().unwrap().name.as_deref(), Some("data-drbd"));
        assert_eq!(claim.metadata.name.as_deref(), Some("data-drbd"));
        assert!(names_volume(&claim, "pvc-shared-1"));
        assert_eq!(spec.storage_class_name, claim.spec.as_ref().unwrap().storage_class_name);
        assert!(same_volume(&pv, &request));
        assert_eq!(pv.annotations()[SKIP_AFFINITY_CONTROLLER_ANNOTATION], "true");
        assert_eq!(claim.labels()[SHARE_ROLE_LABEL], SHARE_ROLE_SERVER);
    }

    #[test]
    fn apps_mount_the_service_address_through_a_pair_of_their_own() {
        let request = request();
        let pv = client_volume(&request, mount());
        let claim = client_claim(&request);
        let spec = pv.spec.as_ref().unwrap();
        let nfs = spec.nfs.as_ref().unwrap();
        assert_eq!((nfs.server.as_str(), nfs.path.as_str()), ("10.96.0.9", "/export"));
        assert_eq!(
            spec.mount_options.as_deref(),
            Some(&["nfsvers=4.2".into(), "hard".into()][..])
        );
        assert_eq!(spec.claim_ref.as_ref().unwrap().name.as_deref(), Some("data"));
        assert_eq!(spec.storage_class_name.as_deref(), Some(""));
        assert_eq!(claim.metadata.name.as_deref(), Some("data"));
        assert!(names_volume(&claim, "pvc-shared-1-nfs"));
        assert_eq!(claim.labels()[SHARE_ROLE_LABEL], SHARE_ROLE_CLIENT);
        assert!(same_client_volume(&pv, &request, mount()));
        let moved: NfsEndpoint = "10.96.0.10:2049".parse().unwrap();
        assert!(
            !same_client_volume(&pv, &request, moved),
            "another address is not the same PV"
        );
        let other_port = client_volume(&request, "10.96.0.9:12049".parse().unwrap());
        let options = other_port.spec.unwrap().mount_options.unwrap();
        assert_eq!(options.last().map(String::as_str), Some("port=12049"));
    }

    #[test]
    fn the_client_side_is_nothing_either_loop_serves() {
        let pv = client_volume(&request(), mount());
        let filters = Filters {
            csi_drivers: vec!["linstor.csi.linbit.com".into()],
            ..Default::default()
        };
        assert!(!pv_backs_shared_claim(&pv, &filters));
        assert_eq!(csi_resource_name(&pv), None);
    }

    #[test]
    fn a_port_given_by_hand_must_be_free() {
        let mut other = request();
        other.resource = "pvc-other".into();
        let pvs = [persistent_volume(&request()), persistent_volume(&other)];
        assert_eq!(port_taken_by(&pvs, 20490, &request()), Some("pvc-other"));
        assert_eq!(port_taken_by(&pvs, 20491, &request()), None);
        assert_eq!(port_taken_by(&pvs[..1], 20490, &request()), None, "its own PV");
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
