//! Everything a reconcile reads about one claim, and from where. The caches first: what
//! triggered the reconcile is always in them, and a converged claim then costs no request. The
//! API when the caches have not listed yet (a watch that cannot list, an API server restarting
//! or a permission missing, must not hold every claim unserved while the API still answers),
//! and when [`super::plan::move_step`] asks for a fresh look because an agent is moving the
//! volume: the PV may lag in the cache, and the agent may have written the endpoints already.

use k8s_openapi::api::core::v1::{Endpoints, PersistentVolume, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;

use super::context::Context;
use super::plan::Current;
use crate::sharedvolume::desired::SharedVolume;

/// Where a read may be answered from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Look {
    /// The cache when it holds the object, else the API.
    CacheFirst,
    /// The API: a move needs what is there now.
    Fresh,
}

/// What was read, and whether it came from the API in this reconcile.
pub(super) struct Read<T> {
    pub value: T,
    pub fresh: bool,
}

/// The claim's PV by name.
pub(super) async fn pv(ctx: &Context, name: &str, look: Look) -> Result<Read<Option<PersistentVolume>>, kube::Error> {
    if look == Look::CacheFirst
        && let Some(pv) = ctx.caches().and_then(|caches| caches.pv(name))
    {
        return Ok(Read {
            value: Some(pv),
            fresh: false,
        });
    }
    let pv = Api::<PersistentVolume>::all(ctx.client.clone()).get_opt(name).await?;
    Ok(Read { value: pv, fresh: true })
}

/// The volume's Service, Endpoints and EndpointSlice. From the caches only once they have
/// listed: before that, a missing object says nothing.
pub(super) async fn objects(ctx: &Context, shared: &SharedVolume, look: Look) -> Result<Read<Current>, kube::Error> {
    let (namespace, name) = (shared.namespace.as_str(), shared.service_name.as_str());
    if look == Look::CacheFirst
        && let Some(caches) = ctx.caches()
    {
        let cached = Current {
            service: caches.service(namespace, name),
            endpoints: caches.endpoints(namespace, name),
            slice: caches.slice(namespace, name),
        };
        return Ok(Read {
            value: cached,
            fresh: false,
        });
    }
    let client = &ctx.client;
    let current = Current {
        service: Api::<Service>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await?,
        endpoints: Api::<Endpoints>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await?,
        slice: Api::<EndpointSlice>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await?,
    };
    Ok(Read {
        value: current,
        fresh: true,
    })
}

/// The slice LINSTOR CSI's nfs-helper advertises a volume's server with, if any: from the cache
/// once it has listed, else from the API.
pub(super) async fn linstor_slice(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<EndpointSlice>, kube::Error> {
    if let Some(caches) = ctx.caches() {
        return Ok(caches.linstor_slice(namespace, name));
    }
    Api::<EndpointSlice>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
}
