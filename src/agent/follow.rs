//! Endpoints follow the primary: this node publishes itself as the volume's NFS service endpoint
//! and at once rewrites the volume's Endpoints and EndpointSlice, with the controller's builders,
//! so clients of the unchanged ClusterIP reach the new primary without waiting for the leader.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Service};
use kube::{Api, Client, ResourceExt};

use crate::apply::apply_annotation;
use crate::names::{AGENT_FIELD_MANAGER, SERVICE_ENDPOINT_ANNOTATION};
use crate::sharedvolume::claim::bound_claim;
use crate::sharedvolume::classify::{self, Filters};
use crate::sharedvolume::desired::service_name;
use crate::sharedvolume::endpoints::apply_endpoints;
use crate::volume::ClaimKey;
use crate::volume::kubernetes::volume_from_pv;

/// What happened to the endpoints after the publish.
#[derive(Debug, PartialEq, Eq)]
pub enum Followed {
    /// Endpoints and EndpointSlice now point here (written, or already right).
    Rewritten,
    /// Left to the controller, with the reason (no shared volume or no Service yet).
    Skipped(String),
}

/// Publishes `endpoint` on the PV (bound to `claim`, as cached) and then points the endpoints of
/// its claim's Service at it. The claim and the Service are read while the PV is written; the
/// endpoints are written only once the PV says where the volume is served.
pub async fn publish_and_follow(
    client: &Client,
    pv_name: &str,
    claim_key: &ClaimKey,
    endpoint: &str,
) -> Result<Followed, kube::Error> {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let ClaimKey { namespace, name } = claim_key;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let publish = apply_annotation(
        &pvs,
        AGENT_FIELD_MANAGER,
        pv_name,
        SERVICE_ENDPOINT_ANNOTATION,
        endpoint,
    );
    let service_name = service_name(pv_name);
    let (pv, claim, service) = tokio::join!(publish, claims.get_opt(name), services.get_opt(&service_name));
    let pv = pv?;
    if bound_claim(&pv).as_ref() != Some(claim_key) {
        return Ok(Followed::Skipped(format!(
            "the PV is no longer bound to claim {namespace}/{name}"
        )));
    }
    let Some(claim) = claim? else {
        return Ok(Followed::Skipped(format!("claim {namespace}/{name} does not exist")));
    };
    let shared = match classify::candidate_volume(&claim, Some(&pv), &Filters::default())
        .and_then(|pv| classify::shared_volume(&claim, pv, &volume_from_pv(pv)))
    {
        Ok(shared) => shared,
        Err(why) => return Ok(Followed::Skipped(why.to_string())),
    };
    // Creating the Service is the controller's job; until it has, there is nothing to follow.
    let owned = service?.is_some_and(|s| {
        s.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == claim.uid().as_ref())
    });
    if !owned {
        return Ok(Followed::Skipped(format!(
            "Service {namespace}/{} is not created by the controller yet",
            shared.service_name
        )));
    }
    apply_endpoints(client, AGENT_FIELD_MANAGER, &shared).await?;
    Ok(Followed::Rewritten)
}
