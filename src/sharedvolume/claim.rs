//! Facts about claims and their PersistentVolumes that both loops read, written once.
//!
//! The two loops ask different questions of the same objects, on purpose:
//! - the controller manages a claim ([`super::classify`]): bound, ReadWriteMany *on the claim*,
//!   passing the filters, with a usable service endpoint;
//! - the agent only needs to know whether the PV it replicates could be served over NFS
//!   ([`pv_backs_shared_claim`]): ReadWriteMany *on the PV* and bound to some claim. It publishes
//!   itself for such a PV and leaves the rest of the judgement to the controller's classification.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
    PersistentVolumeSpec,
};
use kube::ResourceExt;

use super::filters::Filters;
use crate::names::{
    CLAIM_CONDITION_TYPE, MOUNT_ENDPOINT_ANNOTATION, MOVE_STAMP_ANNOTATION, NFS_PORT_ANNOTATION,
    SERVED_ELSEWHERE_ATTRIBUTES, SERVICE_ENDPOINT_ANNOTATION, SHARED_VOLUME_OPT_OUT_ANNOTATION,
    SILENT_SERVER_ANNOTATION,
};
use crate::volume::ClaimKey;

pub const READ_WRITE_MANY: &str = "ReadWriteMany";

/// Whether a list of access modes (of a claim or a PV) includes ReadWriteMany.
pub fn is_read_write_many(modes: Option<&Vec<String>>) -> bool {
    modes.is_some_and(|m| m.iter().any(|m| m == READ_WRITE_MANY))
}

/// The claim a PV is bound to (its `claimRef`), when it names one.
pub fn bound_claim(pv: &PersistentVolume) -> Option<ClaimKey> {
    let claim = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(ClaimKey {
        namespace: claim.namespace.clone()?,
        name: claim.name.clone()?,
    })
}

/// The claim's `SharedVolumeReady` condition, if it has one.
pub fn ready_condition(claim: &PersistentVolumeClaim) -> Option<&PersistentVolumeClaimCondition> {
    let conditions = claim.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == CLAIM_CONDITION_TYPE)
}

/// Whether a volume mode (of a claim or a PV) is a filesystem: unset means `Filesystem`. A
/// `Block` volume is a raw device (a VM disk shared for live migration), never an NFS share.
pub fn is_filesystem(volume_mode: Option<&String>) -> bool {
    volume_mode.is_none_or(|mode| mode == "Filesystem")
}

/// Whether another NFS server serves this volume on its own address (LINSTOR CSI's NFS export:
/// its CSI volume attributes say where): nothing of this product publishes or serves it.
pub fn served_elsewhere(pv: &PersistentVolume) -> bool {
    elsewhere_export(pv).is_some()
}

/// Where another NFS server exports this volume, as its CSI volume attributes say
/// (`nfs://<its Service>:<port>/…`).
pub fn elsewhere_export(pv: &PersistentVolume) -> Option<&String> {
    let attributes = pv.spec.as_ref()?.csi.as_ref()?.volume_attributes.as_ref()?;
    SERVED_ELSEWHERE_ATTRIBUTES.iter().find_map(|key| attributes.get(*key))
}

/// The PV's own NFS port, when it names a valid one (`0` and non-numbers are not).
pub fn nfs_port(pv: &PersistentVolume) -> Option<u16> {
    let port = pv.annotations().get(NFS_PORT_ANNOTATION)?;
    port.parse().ok().filter(|p| *p != 0)
}

/// Whether the volume's owner opted it out (`storageos.com/shared-volume: "false"` on the PV).
pub fn opted_out(pv: &PersistentVolume) -> bool {
    pv.annotations()
        .get(SHARED_VOLUME_OPT_OUT_ANNOTATION)
        .is_some_and(|v| v.eq_ignore_ascii_case("false"))
}

/// The agent's idea of a shared volume it may publish: a ReadWriteMany filesystem PV bound to a
/// claim, that `filters` admit, that nobody else serves and that is not opted out.
pub fn pv_backs_shared_claim(pv: &PersistentVolume, filters: &Filters) -> bool {
    let spec = pv.spec.as_ref();
    is_read_write_many(spec.and_then(|s| s.access_modes.as_ref()))
        && is_filesystem(spec.and_then(|s| s.volume_mode.as_ref()))
        && bound_claim(pv).is_some()
        && filters.admit_pv(pv)
        && !served_elsewhere(pv)
        && !opted_out(pv)
}

/// Drops from a cached PV what neither loop reads (labels, status, managed fields, most of the
/// spec): what remains is its name, uid, resourceVersion, the service- and mount-endpoint
/// annotations, the stamp of the last agent move and the opt-out, access and volume modes, claimRef,
/// storage class, CSI driver and handle, and the CSI attributes that say another server serves it. Both loops cache
/// every PV in the cluster, so this is most of their memory.
pub fn trim_pv(pv: &mut PersistentVolume) {
    pv.metadata.managed_fields = None;
    pv.metadata.labels = None;
    pv.annotations_mut().retain(|k, _| {
        [
            SERVICE_ENDPOINT_ANNOTATION,
            MOUNT_ENDPOINT_ANNOTATION,
            MOVE_STAMP_ANNOTATION,
            SILENT_SERVER_ANNOTATION,
            SHARED_VOLUME_OPT_OUT_ANNOTATION,
            NFS_PORT_ANNOTATION,
        ]
        .contains(&k.as_str())
    });
    pv.status = None;
    if let Some(spec) = pv.spec.take() {
        let csi = spec.csi.map(|csi| CSIPersistentVolumeSource {
            driver: csi.driver,
            volume_handle: csi.volume_handle,
            volume_attributes: csi
                .volume_attributes
                .map(|a| {
                    a.into_iter()
                        .filter(|(k, _)| SERVED_ELSEWHERE_ATTRIBUTES.contains(&k.as_str()))
                        .collect::<std::collections::BTreeMap<_, _>>()
                })
                .filter(|a| !a.is_empty()),
            ..Default::default()
        });
        pv.spec = Some(PersistentVolumeSpec {
            access_modes: spec.access_modes,
            volume_mode: spec.volume_mode,
            claim_ref: spec.claim_ref,
            storage_class_name: spec.storage_class_name,
            csi,
            ..Default::default()
        });
    }
}

/// Drops from a cached claim what the controller does not read: labels, annotations,
/// finalizers, managed fields, requested and reported capacity, other conditions than its own.
/// What remains decides whether and how it is served (its modes, class, volume, phase, deletion)
/// and what its condition says; a change to anything dropped would change no outcome.
pub fn trim_claim(claim: &mut PersistentVolumeClaim) {
    let metadata = &mut claim.metadata;
    metadata.managed_fields = None;
    metadata.labels = None;
    metadata.annotations = None;
    metadata.finalizers = None;
    if let Some(spec) = claim.spec.as_mut() {
        spec.resources = None;
        spec.selector = None;
        spec.data_source = None;
        spec.data_source_ref = None;
    }
    if let Some(status) = claim.status.as_mut() {
        status.capacity = None;
        status.allocated_resources = None;
        status.allocated_resource_statuses = None;
        status.current_volume_attributes_class_name = None;
        status.modify_volume_status = None;
        if let Some(conditions) = status.conditions.as_mut() {
            conditions.retain(|c| c.type_ == CLAIM_CONDITION_TYPE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(spec: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": "pv-1"}, "spec": spec})).unwrap()
    }

    #[test]
    fn claims_and_access_modes() {
        let bound = pv(json!({"accessModes": ["ReadWriteMany"], "claimRef": {"namespace": "apps", "name": "data"}}));
        assert_eq!(
            bound_claim(&bound),
            Some(ClaimKey {
                namespace: "apps".into(),
                name: "data".into()
            })
        );
        assert!(pv_backs_shared_claim(&bound, &Filters::default()));
        let rwo = pv(json!({"accessModes": ["ReadWriteOnce"], "claimRef": {"namespace": "apps", "name": "data"}}));
        assert!(!pv_backs_shared_claim(&rwo, &Filters::default()));
        let unbound = pv(json!({"accessModes": ["ReadWriteMany"]}));
        assert_eq!(bound_claim(&unbound), None);
        assert!(!pv_backs_shared_claim(&unbound, &Filters::default()));
        let nameless = pv(json!({"claimRef": {"namespace": "apps"}}));
        assert_eq!(bound_claim(&nameless), None);
        let block = pv(json!({"accessModes": ["ReadWriteMany"], "volumeMode": "Block",
                              "claimRef": {"namespace": "apps", "name": "data"}}));
        assert!(
            !pv_backs_shared_claim(&block, &Filters::default()),
            "a VM disk shared for live migration is no NFS share"
        );
        let mut trimmed = block.clone();
        trim_pv(&mut trimmed);
        assert!(
            !pv_backs_shared_claim(&trimmed, &Filters::default()),
            "the cache keeps the volume mode"
        );
    }

    #[test]
    fn a_volume_another_server_serves_or_its_owner_opted_out_is_not_published() {
        let any = Filters::default();
        let linstor_nfs = pv(
            json!({"accessModes": ["ReadWriteMany"], "claimRef": {"namespace": "apps", "name": "data"},
            "storageClassName": "linstor-rwx",
            "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": "pvc-1",
                    "volumeAttributes": {"linstor.csi.linbit.com/nfs-export": "nfs://linstor-csi-nfs.piraeus-datastore.svc:2050/export/pvc-1",
                                         "linstor.csi.linbit.com/uses-volume-context": "true"}}}),
        );
        assert!(served_elsewhere(&linstor_nfs));
        assert!(
            !pv_backs_shared_claim(&linstor_nfs, &any),
            "LINSTOR CSI's own NFS serves it"
        );
        let mut trimmed = linstor_nfs.clone();
        trim_pv(&mut trimmed);
        assert!(served_elsewhere(&trimmed), "the cache keeps what says so");
        let attributes = &trimmed.spec.as_ref().unwrap().csi.as_ref().unwrap().volume_attributes;
        assert_eq!(
            attributes.as_ref().map(|a| a.len()),
            Some(1),
            "and nothing else of them"
        );

        let mut ours = linstor_nfs.clone();
        ours.spec.as_mut().unwrap().csi.as_mut().unwrap().volume_attributes = None;
        assert!(pv_backs_shared_claim(&ours, &any));
        ours.annotations_mut()
            .insert("storageos.com/shared-volume".into(), "false".into());
        assert!(!pv_backs_shared_claim(&ours, &any), "opted out");
        let mut trimmed = ours.clone();
        trim_pv(&mut trimmed);
        assert!(opted_out(&trimmed), "the cache keeps the opt-out");
        ours.annotations_mut().clear();

        let fast = Filters {
            storage_classes: vec!["fast".into()],
            csi_drivers: vec![],
        };
        assert!(!pv_backs_shared_claim(&ours, &fast), "another class");
        let linstor = Filters {
            storage_classes: vec![],
            csi_drivers: vec!["linstor.csi.linbit.com".into()],
        };
        assert!(pv_backs_shared_claim(&ours, &linstor));
    }

    #[test]
    fn a_trimmed_pv_reads_as_the_whole_one_for_both_loops() {
        use crate::sharedvolume::classify::{candidate_volume, shared_volume};
        use crate::volume::kubernetes::volume_from_pv;
        use k8s_openapi::api::core::v1::PersistentVolumeClaim;

        let full: PersistentVolume = serde_json::from_value(json!({
            "metadata": {
                "name": "pvc-1", "uid": "uid-pv", "resourceVersion": "42",
                "labels": {"team": "storage"},
                "annotations": {
                    SERVICE_ENDPOINT_ANNOTATION: "10.0.0.5:2049",
                    MOUNT_ENDPOINT_ANNOTATION: "10.96.0.9:2049",
                    MOVE_STAMP_ANNOTATION: r#"{"endpoint":"10.0.0.5:2049","overPvVersion":"41"}"#,
                    "pv.kubernetes.io/provisioned-by": "linstor.csi.linbit.com",
                },
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}],
            },
            "spec": {
                "accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Gi"},
                "storageClassName": "fast", "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": "apps", "name": "data", "uid": "uid-claim"},
                "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": "pvc-1",
                        "volumeAttributes": {"linstor.csi.linbit.com/uses-volume-context": "true"}},
                "mountOptions": ["nfsvers=4.2"],
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap();
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": "uid-claim"},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeName": "pvc-1"},
            "status": {"phase": "Bound"},
        }))
        .unwrap();
        let mut trimmed = full.clone();
        trim_pv(&mut trimmed);
        let filters = Filters {
            storage_classes: vec!["fast".into()],
            csi_drivers: vec!["linstor.csi.linbit.com".into()],
        };
        let read = |pv: &PersistentVolume| {
            let pv = candidate_volume(&claim, Some(pv), &filters).unwrap();
            let volume = volume_from_pv(pv);
            let shared = shared_volume(&claim, pv, &volume).unwrap();
            (
                volume,
                format!("{shared:?}"),
                bound_claim(pv),
                pv_backs_shared_claim(pv, &filters),
            )
        };
        assert_eq!(read(&trimmed), read(&full));
        assert!(trimmed.metadata.managed_fields.as_ref().is_none_or(|m| m.is_empty()));
        assert!(trimmed.status.is_none() && trimmed.labels().is_empty());
        // The stamp of an agent's move: the controller tells a move in flight from drift by it.
        assert_eq!(
            trimmed.annotations().get(MOVE_STAMP_ANNOTATION),
            full.annotations().get(MOVE_STAMP_ANNOTATION)
        );
        assert_eq!(trimmed.annotations().len(), 3);
    }

    #[test]
    fn a_trimmed_claim_keeps_what_decides_its_service_and_condition() {
        let full: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": "u", "resourceVersion": "7",
                         "labels": {"a": "b"}, "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
                         "finalizers": ["kubernetes.io/pvc-protection"]},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "replicated", "volumeName": "pv-1",
                     "volumeMode": "Filesystem", "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "conditions": [
                {"type": "Resizing", "status": "True"},
                {"type": CLAIM_CONDITION_TYPE, "status": "True", "reason": "Served"}]},
        }))
        .unwrap();
        let mut trimmed = full.clone();
        trim_claim(&mut trimmed);
        assert_eq!(trimmed.metadata.uid, full.metadata.uid);
        assert_eq!(trimmed.metadata.resource_version, full.metadata.resource_version);
        let (spec, full_spec) = (trimmed.spec.as_ref().unwrap(), full.spec.as_ref().unwrap());
        assert_eq!(spec.access_modes, full_spec.access_modes);
        assert_eq!(spec.storage_class_name, full_spec.storage_class_name);
        assert_eq!(spec.volume_name, full_spec.volume_name);
        assert_eq!(spec.volume_mode, full_spec.volume_mode);
        assert_eq!(trimmed.status.as_ref().unwrap().phase.as_deref(), Some("Bound"));
        assert_eq!(ready_condition(&trimmed), ready_condition(&full));
        assert!(trimmed.labels().is_empty() && trimmed.annotations().is_empty() && trimmed.finalizers().is_empty());
        assert_eq!(trimmed.status.unwrap().conditions.unwrap().len(), 1);
    }
}
