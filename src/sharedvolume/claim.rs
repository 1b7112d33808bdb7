//! Facts about claims and their PersistentVolumes that both loops read, written once.
//!
//! The two loops ask different questions of the same objects, on purpose:
//! - the controller manages a claim ([`super::classify`]): bound, ReadWriteMany *on the claim*,
//!   passing the filters, with a usable service endpoint;
//! - the agent only needs to know whether the PV it replicates could be served over NFS
//!   ([`pv_backs_shared_claim`]): ReadWriteMany *on the PV* and bound to some claim. It publishes
//!   itself for such a PV and leaves the rest of the judgement to the controller's classification.

use k8s_openapi::api::core::v1::PersistentVolume;

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

/// The agent's idea of a shared volume: a ReadWriteMany PV bound to a claim.
pub fn pv_backs_shared_claim(pv: &PersistentVolume) -> bool {
    is_read_write_many(pv.spec.as_ref().and_then(|s| s.access_modes.as_ref())) && bound_claim(pv).is_some()
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
        assert!(pv_backs_shared_claim(&bound));
        let rwo = pv(json!({"accessModes": ["ReadWriteOnce"], "claimRef": {"namespace": "apps", "name": "data"}}));
        assert!(!pv_backs_shared_claim(&rwo));
        let unbound = pv(json!({"accessModes": ["ReadWriteMany"]}));
        assert_eq!(bound_claim(&unbound), None);
        assert!(!pv_backs_shared_claim(&unbound));
        let nameless = pv(json!({"claimRef": {"namespace": "apps"}}));
        assert_eq!(bound_claim(&nameless), None);
    }
}
