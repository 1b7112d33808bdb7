//! Endpoints follow the primary: this node publishes itself as the volume's NFS service endpoint
//! and rewrites the volume's Endpoints and EndpointSlice in the same round trip, all three
//! stamped with the move, so clients of the unchanged ClusterIP reach the new primary without
//! waiting for the leader, and the controller knows the move for one in flight.

use k8s_openapi::api::core::v1::{Endpoints, PersistentVolume};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::apply::apply_annotations;
use crate::kube_client::api_status;
use crate::names::{AGENT_FIELD_MANAGER, SERVICE_ENDPOINT_ANNOTATION};
use crate::sharedvolume::desired::{moved_endpoints, service_name};
use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::{ClaimKey, NfsEndpoint};

/// What happened to the endpoints beside the publish.
#[derive(Debug, PartialEq, Eq)]
pub enum Followed {
    /// Endpoints and EndpointSlice now point here.
    Rewritten,
    /// Left to the controller, with the reason (not created yet, or a change of address family).
    Skipped(String),
}

/// One move of a volume's endpoints to this node.
pub struct Move<'a> {
    pub pv: &'a str,
    /// The claim the PV is bound to, as cached: where its Service and endpoints live.
    pub claim: &'a ClaimKey,
    pub endpoint: &'a str,
    /// The PV's resourceVersion the move was decided over.
    pub over_version: &'a str,
    /// This node: the stamp says who moved the endpoints, and when.
    pub node: &'a str,
}

/// Publishes the move's endpoint on the PV and points the claim's Endpoints and EndpointSlice at
/// it, the three writes at once. The endpoints are patched, not applied: objects the controller
/// has not created (no Service yet, or not a claim it serves) are not created here.
pub async fn publish_and_follow(client: &Client, to: Move<'_>) -> Result<Followed, kube::Error> {
    let server: NfsEndpoint = to.endpoint.parse().map_err(|err| {
        kube::Error::Service(format!("the agent's own endpoint {:?} does not parse: {err}", to.endpoint).into())
    })?;
    let stamp = MoveStamp {
        node: Some(to.node.to_owned()),
        at: Some(k8s_openapi::jiff::Timestamp::now().to_string()),
        ..MoveStamp::new(to.endpoint, to.over_version)
    };
    let (stamp_key, stamp_text) = stamp.annotation();
    let annotations = [
        (SERVICE_ENDPOINT_ANNOTATION, to.endpoint),
        (stamp_key, stamp_text.as_str()),
    ];
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &to.claim.namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &to.claim.namespace);
    let name = service_name(to.pv);
    let (endpoints_patch, slice_patch) = moved_endpoints(server, &stamp);
    let (endpoints_patch, slice_patch) = (Patch::Merge(&endpoints_patch), Patch::Merge(&slice_patch));
    let params = PatchParams {
        field_manager: Some(AGENT_FIELD_MANAGER.into()),
        ..Default::default()
    };
    let (published, endpoints, slice) = tokio::join!(
        apply_annotations(&pvs, AGENT_FIELD_MANAGER, to.pv, &annotations),
        endpoints.patch(&name, &params, &endpoints_patch),
        slices.patch(&name, &params, &slice_patch),
    );
    published?;
    let ClaimKey { namespace, .. } = to.claim;
    for written in [endpoints.map(|_| ()), slice.map(|_| ())] {
        match written {
            Ok(()) => {}
            Err(err) if api_status(&err) == Some(404) => {
                return Ok(Followed::Skipped(format!(
                    "the Endpoints or EndpointSlice {namespace}/{name} are not created by the controller yet"
                )));
            }
            // An EndpointSlice cannot change its address type: the controller replaces it.
            Err(err) if api_status(&err) == Some(422) => {
                return Ok(Followed::Skipped(format!(
                    "the NFS server changed address family: the controller replaces EndpointSlice {namespace}/{name}"
                )));
            }
            Err(err) => return Err(err),
        }
    }
    Ok(Followed::Rewritten)
}
