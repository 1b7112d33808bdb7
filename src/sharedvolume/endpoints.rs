//! The one function that writes a shared volume's Endpoints and EndpointSlice. The controller
//! calls it on every reconcile with what its caches hold, the agent when its node becomes the
//! primary (reading them first); both build the objects with [`super::desired`], so their writes
//! always agree.

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client};

use super::desired::{self, SharedVolume};
use crate::apply::{apply, create_or_apply};

/// Reads the Endpoints and EndpointSlice, then [`write_endpoints_over`] them.
pub async fn write_endpoints(client: &Client, field_manager: &str, shared: &SharedVolume) -> Result<bool, kube::Error> {
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &shared.namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &shared.namespace);
    let current_endpoints = endpoints.get_opt(&shared.service_name).await?;
    let current_slice = slices.get_opt(&shared.service_name).await?;
    write_endpoints_over(
        client,
        field_manager,
        shared,
        current_endpoints.as_ref(),
        current_slice.as_ref(),
    )
    .await
}

/// Applies the Endpoints and EndpointSlice at once, both together, without reading them first:
/// for a writer that knows they must change (the new primary's agent).
pub async fn apply_endpoints(client: &Client, field_manager: &str, shared: &SharedVolume) -> Result<(), kube::Error> {
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &shared.namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &shared.namespace);
    let (endpoints, slice) = futures::future::join(
        apply(&endpoints, field_manager, &desired::endpoints(shared)),
        apply(&slices, field_manager, &desired::endpoint_slice(shared)),
    )
    .await;
    endpoints.and(slice).map(|_| ())
}

/// Writes the Endpoints and EndpointSlice where they differ from `endpoints` and `slice` (as
/// read or cached; missing ones are created); true when something was written.
pub async fn write_endpoints_over(
    client: &Client,
    field_manager: &str,
    shared: &SharedVolume,
    endpoints: Option<&Endpoints>,
    slice: Option<&EndpointSlice>,
) -> Result<bool, kube::Error> {
    let endpoints_api: Api<Endpoints> = Api::namespaced(client.clone(), &shared.namespace);
    let slices_api: Api<EndpointSlice> = Api::namespaced(client.clone(), &shared.namespace);
    let wrote_endpoints = create_or_apply(&endpoints_api, field_manager, &desired::endpoints(shared), endpoints)
        .await?
        .is_some();
    let wrote_slice = create_or_apply(&slices_api, field_manager, &desired::endpoint_slice(shared), slice)
        .await?
        .is_some();
    Ok(wrote_endpoints || wrote_slice)
}
