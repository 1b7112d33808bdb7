//! The Service step of a reconcile: create the Service (at the address clients already mount,
//! when one was published) or apply it when it drifted, and learn its ClusterIP.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::{Api, ResourceExt};

use super::context::Context;
use super::outcome::ReconcileError;
use crate::apply::{apply_if_changed, create};
use crate::names::CONTROLLER_FIELD_MANAGER;
use crate::sharedvolume::desired::{self, SharedVolume};

/// The Service as this reconcile left it.
pub(crate) struct EnsuredService {
    pub cluster_ip: String,
    /// It did not exist before this reconcile.
    pub created: bool,
}

/// Creates the Service (at the `published` address, if one was), or applies `desired` to the
/// `existing` one if it drifted, and returns its ClusterIP (waiting for one after a create);
/// `None` when a Service of that name belongs to something else.
pub(crate) async fn ensure_service(
    ctx: &Context,
    shared: &SharedVolume,
    desired: &Service,
    existing: Option<&Service>,
    published: Option<&str>,
) -> Result<Option<EnsuredService>, ReconcileError> {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &shared.namespace);
    let owned = |service: &Service| service.owner_references().iter().any(|o| o.uid == shared.owner.uid);
    let (current, created) = match existing {
        Some(existing) if !owned(existing) => return Ok(None),
        Some(existing) => {
            let applied = apply_if_changed(&services, CONTROLLER_FIELD_MANAGER, desired, Some(existing)).await?;
            (applied.unwrap_or_else(|| existing.clone()), false)
        }
        None => match create_service(&services, shared, desired, published).await? {
            Created::New(created) => {
                tracing::info!(service = %format!("{}/{}", shared.namespace, shared.service_name), "Service created");
                (created, true)
            }
            // Not read before, but there: it must be ours.
            Created::Existing(found) if !owned(&found) => return Ok(None),
            Created::Existing(found) => {
                let applied = apply_if_changed(&services, CONTROLLER_FIELD_MANAGER, desired, Some(&found)).await?;
                (applied.unwrap_or(found), false)
            }
            Created::Gone => return Err(ReconcileError::Gone(shared.service_name.clone())),
        },
    };
    let cluster_ip = match cluster_ip(&current) {
        Some(ip) => ip,
        None => wait_for_cluster_ip(ctx, &services, &shared.service_name).await?,
    };
    Ok(Some(EnsuredService { cluster_ip, created }))
}

/// The API server frees a deleted Service's address just after the delete reaches watchers: a
/// refusal of the published address within this long of the first try is that release still
/// under way, not another owner.
const ADDRESS_RELEASE_GRACE: Duration = Duration::from_secs(5);
const ADDRESS_RETRY_INTERVAL: Duration = Duration::from_millis(200);

/// What a create of the Service came to.
enum Created {
    New(Service),
    /// The name was taken after all: the Service as read then.
    Existing(Service),
    /// The name was taken, and no longer is when read.
    Gone,
}

/// Creates the Service in its server's family, asking for the published ClusterIP when there is
/// one; when that address stays taken past [`ADDRESS_RELEASE_GRACE`] (or is no longer in the
/// service range), takes a new one: the caller warns that clients must remount. The API server
/// refuses a taken address before it looks at the name, so a refusal is first checked against a
/// Service of that name, one a cache still behind read as missing (after an etcd restart).
async fn create_service(
    services: &Api<Service>,
    shared: &SharedVolume,
    desired: &Service,
    published: Option<&str>,
) -> Result<Created, kube::Error> {
    let new = desired::new_service(desired, shared, published);
    if new.spec.as_ref().is_none_or(|spec| spec.cluster_ip.is_none()) {
        return created_or_read(services, shared, &new).await;
    }
    let service = format!("{}/{}", shared.namespace, shared.service_name);
    let deadline = Instant::now() + ADDRESS_RELEASE_GRACE;
    loop {
        match create(services, CONTROLLER_FIELD_MANAGER, &new).await {
            Err(kube::Error::Api(status)) if status.code == 422 => {
                if still_allocated(&status) {
                    if let Some(found) = services.get_opt(&shared.service_name).await? {
                        return Ok(Created::Existing(found));
                    }
                    if Instant::now() < deadline {
                        tracing::debug!(%service, published, "the published address is not free yet; waiting for its release");
                        tokio::time::sleep(ADDRESS_RETRY_INTERVAL).await;
                        continue;
                    }
                }
                tracing::warn!(
                    %service,
                    published,
                    reason = %status.message,
                    "cannot recreate the Service at its published address; taking a new one"
                );
                let anywhere = desired::new_service(desired, shared, None);
                return created_or_read(services, shared, &anywhere).await;
            }
            result => return settled(services, shared, result?).await,
        }
    }
}

async fn created_or_read(
    services: &Api<Service>,
    shared: &SharedVolume,
    new: &Service,
) -> Result<Created, kube::Error> {
    let created = create(services, CONTROLLER_FIELD_MANAGER, new).await?;
    settled(services, shared, created).await
}

/// A create's answer (`None`: the name was taken), with the Service read when it was.
async fn settled(
    services: &Api<Service>,
    shared: &SharedVolume,
    created: Option<Service>,
) -> Result<Created, kube::Error> {
    Ok(match created {
        Some(created) => Created::New(created),
        None => match services.get_opt(&shared.service_name).await? {
            Some(found) => Created::Existing(found),
            None => Created::Gone,
        },
    })
}

/// The API server's refusal of a ClusterIP some Service still holds (not one outside the range).
fn still_allocated(status: &kube::core::Status) -> bool {
    status.message.contains("already allocated")
}

fn cluster_ip(service: &Service) -> Option<String> {
    service
        .spec
        .as_ref()?
        .cluster_ip
        .clone()
        .filter(|ip| !ip.is_empty() && ip != "None")
}

async fn wait_for_cluster_ip(ctx: &Context, services: &Api<Service>, name: &str) -> Result<String, ReconcileError> {
    let deadline = Instant::now() + ctx.settings.create_wait_duration;
    loop {
        if let Some(ip) = services.get_opt(name).await?.as_ref().and_then(cluster_ip) {
            return Ok(ip);
        }
        if Instant::now() >= deadline {
            return Err(ReconcileError::NoClusterIp(
                name.to_owned(),
                ctx.settings.create_wait_duration,
            ));
        }
        tokio::time::sleep(ctx.settings.create_poll_interval).await;
    }
}
