//! The writes of a shared volume's Endpoints and EndpointSlice. The controller writes them over
//! what it read when they differ, the agent applies them at once when its node becomes the
//! primary; both build the objects with [`super::desired`], so their writes always agree.

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, ResourceExt};

use super::desired::{EndpointObjects, SharedVolume};
use crate::apply::{apply, create_or_apply};
use crate::kube_client::api_status;

/// Applies the Endpoints and EndpointSlice at once, both together, without reading them first:
/// for a writer that knows they must change (the new primary's agent). A slice the apply refuses
/// (422: its address family changed) is read and replaced.
pub async fn apply_endpoints(client: &Client, field_manager: &str, shared: &SharedVolume) -> Result<(), kube::Error> {
    let desired = EndpointObjects::of(shared);
    let (endpoints_api, slices) = apis(client, &desired);
    let (endpoints, slice) = futures::future::join(
        apply(&endpoints_api, field_manager, &desired.endpoints),
        apply(&slices, field_manager, &desired.slice),
    )
    .await;
    if let Err(err) = &slice
        && api_status(err) == Some(422)
    {
        let current = slices.get_opt(&shared.service_name).await?;
        if let Some(current) = current.filter(|current| current.address_type != desired.slice.address_type) {
            replace_slice(&slices, field_manager, &current, &desired.slice).await?;
            return endpoints.map(|_| ());
        }
    }
    endpoints.and(slice).map(|_| ())
}

/// Writes the `desired` Endpoints and EndpointSlice where they differ from `endpoints` and
/// `slice` (as read or cached; missing ones are created); true when something was written.
pub async fn write_endpoints_over(
    client: &Client,
    field_manager: &str,
    desired: &EndpointObjects,
    endpoints: Option<&Endpoints>,
    slice: Option<&EndpointSlice>,
) -> Result<bool, kube::Error> {
    let (endpoints_api, slices_api) = apis(client, desired);
    let wrote_endpoints = create_or_apply(&endpoints_api, field_manager, &desired.endpoints, endpoints)
        .await?
        .is_some();
    let wrote_slice = match slice {
        Some(current) if current.address_type != desired.slice.address_type => {
            replace_slice(&slices_api, field_manager, current, &desired.slice).await?;
            true
        }
        _ => create_or_apply(&slices_api, field_manager, &desired.slice, slice)
            .await?
            .is_some(),
    };
    Ok(wrote_endpoints || wrote_slice)
}

fn apis(client: &Client, desired: &EndpointObjects) -> (Api<Endpoints>, Api<EndpointSlice>) {
    let namespace = desired.namespace();
    (
        Api::namespaced(client.clone(), namespace),
        Api::namespaced(client.clone(), namespace),
    )
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
        Err(err) if matches!(api_status(&err), Some(404 | 409)) => {}
        Err(err) => return Err(err),
    }
    create_or_apply(slices, field_manager, desired, None).await.map(|_| ())
}
