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

pub async fn publish_and_follow(client: &Client, pv_name: &str, endpoint: &str) -> Result<Followed, kube::Error> {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = apply_annotation(
        &pvs,
        AGENT_FIELD_MANAGER,
        pv_name,
        SERVICE_ENDPOINT_ANNOTATION,
        endpoint,
    )
    .await?;

    let Some(ClaimKey { namespace, name }) = bound_claim(&pv) else {
        return Ok(Followed::Skipped("the PV is not bound to a claim".into()));
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    // Both reads at once: the Service is named after the PV.
    let (claim, service) =
        futures::future::join(claims.get_opt(&name), services.get_opt(&service_name(&pv.name_any()))).await;
    let Some(claim) = claim? else {
        return Ok(Followed::Skipped(format!("claim {namespace}/{name} does not exist")));
    };
    let shared = match classify::candidate_volume(&claim, Some(&pv), &Filters::default())
        .manage()
        .and_then(|pv| classify::shared_volume(&claim, pv, &volume_from_pv(pv)).manage())
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
