//! Pure decisions: is this claim a shared volume we manage, and if so, what is it built from?
//! Each step manages the claim (`Ok`), or says why not ([`NotManaged`]): skip (not ours), or
//! invalid (ours, but bad input to report).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use super::claim::{is_filesystem, is_read_write_many, opted_out, served_elsewhere};
use super::desired::{SharedVolume, label_value, service_name};
use super::filters::Filters;
use crate::volume::{NfsEndpoint, VolumeInfo};

/// Why a claim is left alone; none of these is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    Deleting,
    NotBound,
    NotReadWriteMany,
    StorageClassFiltered,
    CsiDriverFiltered,
    NoServiceEndpoint,
    /// `volumeMode: Block`: a raw device, never an NFS share.
    BlockVolume,
    /// Another NFS server serves it on its own address (LINSTOR CSI's NFS export).
    ServedElsewhere,
    /// `storageos.com/shared-volume: "false"` on its PV.
    OptedOut,
}

/// A claim we should manage but cannot, because of bad input. Reported as a Warning event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Event reason and error-metric label.
    pub reason: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Invalid {
    pub fn new(reason: &'static str, message: String) -> Self {
        Self { reason, message }
    }
}

/// Why a classification step does not manage a claim: not ours (yet), or ours but unusable as
/// it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotManaged {
    Skip(Skip),
    Invalid(Invalid),
}

impl std::fmt::Display for NotManaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Skip(skip) => write!(f, "the claim is not served: {skip:?}"),
            Self::Invalid(invalid) => f.write_str(&invalid.message),
        }
    }
}

/// The step before asking the volume backend: the claim's bound PV, if the claim is a candidate.
pub fn candidate_volume<'a>(
    claim: &PersistentVolumeClaim,
    pv: Option<&'a PersistentVolume>,
    filters: &Filters,
) -> Result<&'a PersistentVolume, NotManaged> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(NotManaged::Skip(Skip::Deleting));
    }
    let spec = claim.spec.as_ref();
    // What the claim itself says first: a claim that can never be shared is never told it waits.
    if !is_read_write_many(spec.and_then(|s| s.access_modes.as_ref())) {
        return Err(NotManaged::Skip(Skip::NotReadWriteMany));
    }
    if !is_filesystem(spec.and_then(|s| s.volume_mode.as_ref())) {
        return Err(NotManaged::Skip(Skip::BlockVolume));
    }
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    let Some(pv_name) = spec
        .and_then(|s| s.volume_name.as_deref())
        .filter(|_| phase == Some("Bound"))
    else {
        return Err(NotManaged::Skip(Skip::NotBound));
    };
    let Some(pv) = pv else {
        return Err(NotManaged::Invalid(Invalid::new(
            "VolumeMissing",
            format!(
                "claim is bound to PersistentVolume {pv_name:?}, which does not exist; restore the volume or recreate the claim"
            ),
        )));
    };
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let bound_here = claim_ref.is_some_and(|r| {
        r.name.as_deref() == Some(claim.name_any().as_str())
            && r.namespace.as_deref() == claim.namespace().as_deref()
            && (r.uid.is_none() || r.uid == claim.uid())
    });
    if !bound_here {
        let holder = claim_ref
            .map(|r| {
                format!(
                    "{}/{}",
                    r.namespace.as_deref().unwrap_or(""),
                    r.name.as_deref().unwrap_or("")
                )
            })
            .unwrap_or_else(|| "no claim".into());
        return Err(NotManaged::Invalid(Invalid::new(
            "VolumeBoundElsewhere",
            format!("PersistentVolume {pv_name:?} is bound to {holder}, not to this claim; fix the volume's claimRef"),
        )));
    }
    let class = spec
        .and_then(|s| s.storage_class_name.as_deref())
        .or_else(|| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()))
        .unwrap_or("");
    if !filters.admit_class(class) {
        return Err(NotManaged::Skip(Skip::StorageClassFiltered));
    }
    let driver = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map_or("", |c| c.driver.as_str());
    if !filters.admit_driver(driver) {
        return Err(NotManaged::Skip(Skip::CsiDriverFiltered));
    }
    if served_elsewhere(pv) {
        return Err(NotManaged::Skip(Skip::ServedElsewhere));
    }
    if opted_out(pv) {
        return Err(NotManaged::Skip(Skip::OptedOut));
    }
    Ok(pv)
}

/// The step after: what the Service and endpoints are built from, given the volume's state.
pub fn shared_volume(
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    volume: &VolumeInfo,
) -> Result<SharedVolume, NotManaged> {
    let Some(raw) = volume.service_endpoint.as_deref() else {
        return Err(NotManaged::Skip(Skip::NoServiceEndpoint));
    };
    let server: NfsEndpoint = match raw.parse() {
        Ok(server) => server,
        Err(err) => {
            return Err(NotManaged::Invalid(Invalid::new(
                "InvalidServiceEndpoint",
                format!(
                    "the volume's NFS service endpoint is unusable: {err}; fix it on the volume (PV {:?})",
                    pv.name_any()
                ),
            )));
        }
    };
    Ok(SharedVolume {
        namespace: claim.namespace().unwrap_or_default(),
        service_name: service_name(&pv.name_any()),
        volume_id: label_value(&volume.id),
        owner: claim_owner(claim),
        server,
        // A published endpoint that does not parse is the controller's to replace, not to carry.
        mount_endpoint: volume.mount_endpoint.as_deref().and_then(|m| m.parse().ok()),
    })
}

/// Controller reference to the claim, without `blockOwnerDeletion` (which would need the
/// claims' finalizers permission on clusters that enforce it, and is not needed here).
pub fn claim_owner(claim: &PersistentVolumeClaim) -> OwnerReference {
    OwnerReference {
        block_owner_deletion: None,
        ..claim.controller_owner_ref(&()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(modes: &[&str], phase: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": "uid-1"},
            "spec": {"accessModes": modes, "volumeName": "pvc-1", "storageClassName": "replicated"},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn pv(claim_ns: &str, claim_name: &str, driver: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1"},
            "spec": {
                "claimRef": {"namespace": claim_ns, "name": claim_name, "uid": "uid-1"},
                "storageClassName": "replicated",
                "csi": {"driver": driver, "volumeHandle": "pvc-1"},
            },
        }))
        .unwrap()
    }

    /// A raw block device shared between nodes (a VM disk for live migration): not an NFS share.
    fn block(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
        claim.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        claim
    }

    fn filesystem(mut claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
        claim.spec.as_mut().unwrap().volume_mode = Some("Filesystem".into());
        claim
    }

    /// One candidate case: its name, the claim, its PV, the filters, and what it comes to
    /// (see [`candidate_outcome`]).
    type Case<'a> = (
        &'a str,
        PersistentVolumeClaim,
        Option<&'a PersistentVolume>,
        &'a Filters,
        Result<Result<(), Skip>, &'a str>,
    );

    fn check_candidates(cases: Vec<Case>) {
        for (name, claim, pv, filters, expected) in cases {
            assert_eq!(candidate_outcome(&claim, pv, filters), expected, "{name}");
        }
    }

    #[test]
    fn a_candidate_is_a_bound_rwx_filesystem_claim() {
        let ours = pv("apps", "data", "linstor.csi.linbit.com");
        let none = Filters::default();
        let rwx = claim(&["ReadWriteMany"], "Bound");
        let pending = claim(&["ReadWriteMany"], "Pending");
        check_candidates(vec![
            ("rwx bound", rwx.clone(), Some(&ours), &none, Ok(Ok(()))),
            (
                "rwx filesystem, said so",
                filesystem(rwx.clone()),
                Some(&ours),
                &none,
                Ok(Ok(())),
            ),
            (
                "rwo",
                claim(&["ReadWriteOnce"], "Bound"),
                Some(&ours),
                &none,
                Ok(Err(Skip::NotReadWriteMany)),
            ),
            ("pending", pending.clone(), Some(&ours), &none, Ok(Err(Skip::NotBound))),
            (
                "rwx block claim",
                block(rwx),
                Some(&ours),
                &none,
                Ok(Err(Skip::BlockVolume)),
            ),
            (
                "rwx block claim, not bound yet: never told it waits",
                block(pending),
                Some(&ours),
                &none,
                Ok(Err(Skip::BlockVolume)),
            ),
        ]);
    }

    #[test]
    fn its_pv_and_the_filters_can_skip_or_refuse_it() {
        let ours = pv("apps", "data", "linstor.csi.linbit.com");
        let elsewhere = pv("other", "data", "linstor.csi.linbit.com");
        let (served_by_linstor, opted_out) = (served_by_linstor(&ours), opted_out(&ours));
        let none = Filters::default();
        let by_class = Filters {
            storage_classes: vec!["fast".into()],
            ..Default::default()
        };
        let by_driver = Filters {
            csi_drivers: vec!["linstor.csi.linbit.com".into()],
            ..Default::default()
        };
        let rwx = || claim(&["ReadWriteMany"], "Bound");
        check_candidates(vec![
            ("pv missing", rwx(), None, &none, Err("VolumeMissing")),
            (
                "pv elsewhere",
                rwx(),
                Some(&elsewhere),
                &none,
                Err("VolumeBoundElsewhere"),
            ),
            (
                "class filtered",
                rwx(),
                Some(&ours),
                &by_class,
                Ok(Err(Skip::StorageClassFiltered)),
            ),
            ("driver kept", rwx(), Some(&ours), &by_driver, Ok(Ok(()))),
            (
                "LINSTOR CSI's own NFS export serves it",
                rwx(),
                Some(&served_by_linstor),
                &none,
                Ok(Err(Skip::ServedElsewhere)),
            ),
            (
                "opted out on its PV",
                rwx(),
                Some(&opted_out),
                &none,
                Ok(Err(Skip::OptedOut)),
            ),
        ]);
    }

    /// Served: `Ok(Ok(()))`; skipped: `Ok(Err(skip))`; bad input: `Err(reason)`.
    fn candidate_outcome<'a>(
        claim: &PersistentVolumeClaim,
        pv: Option<&PersistentVolume>,
        filters: &Filters,
    ) -> Result<Result<(), Skip>, &'a str> {
        match candidate_volume(claim, pv, filters) {
            Ok(_) => Ok(Ok(())),
            Err(NotManaged::Skip(skip)) => Ok(Err(skip)),
            Err(NotManaged::Invalid(invalid)) => Err(invalid.reason),
        }
    }

    /// `pv` as LINSTOR CSI leaves a volume it serves over NFS itself.
    fn served_by_linstor(pv: &PersistentVolume) -> PersistentVolume {
        let mut served = pv.clone();
        let csi = served.spec.as_mut().unwrap().csi.as_mut().unwrap();
        csi.volume_attributes = Some(
            [(
                "linstor.csi.linbit.com/nfs-export".to_owned(),
                "nfs://linstor-csi-nfs.piraeus-datastore.svc:2050/export/pvc-1".to_owned(),
            )]
            .into(),
        );
        served
    }

    /// `pv` with its owner's opt-out annotation.
    fn opted_out(pv: &PersistentVolume) -> PersistentVolume {
        let mut opted_out = pv.clone();
        opted_out
            .annotations_mut()
            .insert("storageos.com/shared-volume".into(), "false".into());
        opted_out
    }

    #[test]
    fn shared_volumes() {
        let claim = claim(&["ReadWriteMany"], "Bound");
        let pv = pv("apps", "data", "d");
        let info = |endpoint: Option<&str>| VolumeInfo {
            id: "pvc-1".into(),
            service_endpoint: endpoint.map(Into::into),
            ..Default::default()
        };
        assert_eq!(
            shared_volume(&claim, &pv, &info(None)),
            Err(NotManaged::Skip(Skip::NoServiceEndpoint))
        );
        let Err(NotManaged::Invalid(invalid)) = shared_volume(&claim, &pv, &info(Some("nfs.local:2049"))) else {
            panic!("a hostname must be invalid")
        };
        assert_eq!(invalid.reason, "InvalidServiceEndpoint");
        assert!(invalid.message.contains("nfs.local:2049"), "{}", invalid.message);
        let volume = shared_volume(&claim, &pv, &info(Some("10.0.0.5:2049"))).unwrap();
        assert_eq!(volume.service_name, "pvc-1");
        assert_eq!(volume.namespace, "apps");
        assert_eq!(volume.owner.uid, "uid-1");
        assert_eq!(volume.owner.controller, Some(true));
        assert_eq!(volume.owner.block_owner_deletion, None);
    }
}
