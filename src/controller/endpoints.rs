//! The controller's writes of a shared volume's Endpoints and EndpointSlice, over what it read,
//! where they differ; where Endpoints are not written (`--write-endpoints`), its old ones go. The agent's move patches the same fields (`agent::follow`); both build them
//! with [`crate::sharedvolume::desired`], so their writes always agree.

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, ResourceExt};

use super::plan::written_by_us;
use crate::apply::create_or_apply;
use crate::kube_client::api_status;
use crate::sharedvolume::desired::EndpointObjects;

/// Writes the `desired` Endpoints (when `write_endpoints`) and EndpointSlice where they differ
/// from `endpoints` and `slice` (as read or cached; missing ones are created); without
/// `write_endpoints`, Endpoints this controller wrote before are deleted. True when something
/// was written.
pub async fn write_endpoints_over(
    client: &Client,
    field_manager: &str,
    desired: &EndpointObjects,
    (endpoints, slice): (Option<&Endpoints>, Option<&EndpointSlice>),
    write_endpoints: bool,
) -> Result<bool, kube::Error> {
    let (endpoints_api, slices_api) = apis(client, desired);
    let wrote_endpoints = if write_endpoints {
        create_or_apply(&endpoints_api, field_manager, &desired.endpoints, endpoints)
            .await?
            .is_some()
    } else {
        match endpoints.filter(|current| written_by_us(current, &desired.endpoints)) {
            Some(ours) => delete_exactly(&endpoints_api, ours).await?,
            None => false,
        }
    };
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

/// Deletes that very object (a UID precondition), if it is still there: true when deleted.
async fn delete_exactly<K>(api: &Api<K>, current: &K) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: current.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&current.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(err) if matches!(api_status(&err), Some(404 | 409)) => Ok(false),
        Err(err) => Err(err),
    }
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
    delete_exactly(slices, current).await?;
    create_or_apply(slices, field_manager, desired, None).await.map(|_| ())
}
