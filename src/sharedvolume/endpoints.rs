//! The one function that writes a shared volume's Endpoints and EndpointSlice. The controller
//! calls it on every reconcile, the agent when its node becomes the primary; both build the
//! objects with [`super::desired`], so their writes always agree.

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client};

use super::desired::{self, SharedVolume};
use crate::apply::apply_if_changed;

/// Applies the Endpoints and EndpointSlice if they drifted; true when something was written.
pub async fn write_endpoints(client: &Client, field_manager: &str, shared: &SharedVolume) -> Result<bool, kube::Error> {
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &shared.namespace);
    let current = endpoints.get_opt(&shared.service_name).await?;
    let wrote_endpoints = apply_if_changed(&endpoints, field_manager, &desired::endpoints(shared), current.as_ref())
        .await?
        .is_some();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &shared.namespace);
    let current = slices.get_opt(&shared.service_name).await?;
    let wrote_slice = apply_if_changed(
        &slices,
        field_manager,
        &desired::endpoint_slice(shared),
        current.as_ref(),
    )
    .await?
    .is_some();
    Ok(wrote_endpoints || wrote_slice)
}
