//! The one function that writes a shared volume's Endpoints and EndpointSlice. The controller
//! calls it on every reconcile with what its caches hold, the agent when its node becomes the
//! primary (reading them first); both build the objects with [`super::desired`], so their writes
//! always agree.

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, ResourceExt};

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
/// for a writer that knows they must change (the new primary's agent). A slice the apply refuses
/// (422: its address family changed) is read and replaced.
pub async fn apply_endpoints(client: &Client, field_manager: &str, shared: &SharedVolume) -> Result<(), kube::Error> {
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &shared.namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &shared.namespace);
    let desired_slice = desired::endpoint_slice(shared);
    let (endpoints, slice) = futures::future::join(
        apply(&endpoints, field_manager, &desired::endpoints(shared)),
        apply(&slices, field_manager, &desired_slice),
    )
    .await;
    if let Err(kube::Error::Api(status)) = &slice
        && status.code == 422
    {
        let current = slices.get_opt(&shared.service_name).await?;
        if let Some(current) = current.filter(|current| current.address_type != desired_slice.address_type) {
            replace_slice(&slices, field_manager, &current, &desired_slice).await?;
            return endpoints.map(|_| ());
        }
    }
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
    let desired_slice = desired::endpoint_slice(shared);
    let wrote_slice = match slice {
        Some(current) if current.address_type != desired_slice.address_type => {
            replace_slice(&slices_api, field_manager, current, &desired_slice).await?;
            true
        }
        _ => create_or_apply(&slices_api, field_manager, &desired_slice, slice)
            .await?
            .is_some(),
    };
    Ok(wrote_endpoints || wrote_slice)
}

/// An EndpointSlice's `addressType` cannot change: when the NFS server moved to the other address
/// family, the slice is deleted (that very object: a UID precondition) and created anew.
async fn replace_slice(
    slices: &Api<EndpointSlice>,
    field_manager: &str,
    current: &EndpointSlice,
    desired: &EndpointSlice,
) -> Result<(), kube::Error> {
    let name = current.name_any();
    tracing::info!(
        slice = %name,
        from = %current.address_type,
        to = %desired.address_type,
        "the NFS server changed address family: replacing the EndpointSlice"
    );
    let params = DeleteParams {
        preconditions: current.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match slices.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
        Err(err) => return Err(err),
    }
    create_or_apply(slices, field_manager, desired, None).await.map(|_| ())
}
