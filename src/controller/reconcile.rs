//! The imperative shell of the shared-volume loop: fetch, classify (pure code), apply, publish.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Service};
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource, ResourceExt};

use super::book::{ClaimBook, Standing};
use super::cache::Caches;
use crate::apply::{apply_if_changed, create, is_converged};
use crate::events::EventSink;
use crate::metrics::ControllerMetrics;
use crate::names::CONTROLLER_FIELD_MANAGER;
use crate::sharedvolume::classify::{self, Filters, Invalid, NotManaged, Skip};
use crate::sharedvolume::desired::{self, SharedVolume};
use crate::sharedvolume::endpoints::{write_endpoints, write_endpoints_over};
use crate::volume::{VolumeBackend, VolumeError};

/// Settings of one reconcile, from the command line.
#[derive(Clone, Debug)]
pub struct ReconcileSettings {
    pub filters: Filters,
    pub create_poll_interval: Duration,
    pub create_wait_duration: Duration,
    pub resync_interval: Duration,
    /// The longest one reconcile may take; then it is dropped and counts as a failure.
    pub reconcile_timeout: Duration,
    /// The wait after a claim's first failure; it doubles with each further one, up to
    /// `max_error_requeue`.
    pub error_requeue: Duration,
    pub max_error_requeue: Duration,
}

pub struct Context {
    pub client: Client,
    pub backend: Arc<dyn VolumeBackend>,
    pub settings: ReconcileSettings,
    pub metrics: ControllerMetrics,
    pub events: EventSink,
    /// Which claims are served and which wait, for the gauges.
    book: Mutex<ClaimBook>,
    /// What the controller watches, while it runs: reconciles read there, not from the API.
    caches: RwLock<Option<Caches>>,
}

impl Context {
    pub fn new(
        client: Client,
        backend: Arc<dyn VolumeBackend>,
        settings: ReconcileSettings,
        metrics: ControllerMetrics,
        events: EventSink,
    ) -> Self {
        Self {
            client,
            backend,
            settings,
            metrics,
            events,
            book: Mutex::default(),
            caches: RwLock::default(),
        }
    }

    /// Reconciles read from `caches` from now on (`None`: from the API).
    pub fn use_caches(&self, caches: Option<Caches>) {
        *self.caches.write().expect("caches poisoned") = caches;
    }

    fn caches(&self) -> Option<Caches> {
        self.caches.read().expect("caches poisoned").clone()
    }

    /// Changes the claim book and sets the gauges from it.
    pub fn book(&self, change: impl FnOnce(&mut ClaimBook)) {
        let mut book = self.book.lock().expect("claim book poisoned");
        change(&mut book);
        self.metrics.shared_volumes.set(book.shared() as i64);
        self.metrics.claims_pending.set(book.waiting() as i64);
        let since = book
            .waiting_since()
            .and_then(|since| since.duration_since(SystemTime::UNIX_EPOCH).ok());
        self.metrics
            .claims_pending_since
            .set(since.map_or(0.0, |since| since.as_secs_f64()));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("volume backend: {0}")]
    Volume(#[from] VolumeError),
    #[error("Service {0} has no ClusterIP after {1:?}")]
    NoClusterIp(String, Duration),
    #[error("Service {0} was there when created and gone when read; retrying")]
    Gone(String),
    #[error("the reconcile took longer than {0:?} and was dropped")]
    Timeout(Duration),
}

impl ReconcileError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube(_) => "KubernetesApi",
            Self::Volume(_) => "VolumeBackend",
            Self::NoClusterIp(..) => "NoClusterIP",
            Self::Gone(..) => "Conflict",
            Self::Timeout(..) => "Timeout",
        }
    }
}

/// What one reconcile ended with (for metrics and tests).
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Skipped(Skip),
    Invalid(&'static str),
    Shared {
        mount_endpoint: String,
        published: bool,
    },
    /// Served, but something keeps changing its objects: the repair waits this long.
    RepairDeferred(Duration),
}

pub async fn reconcile(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let timeout = ctx.settings.reconcile_timeout;
    let result = tokio::time::timeout(timeout, reconcile_claim(&claim, &ctx))
        .await
        .unwrap_or(Err(ReconcileError::Timeout(timeout)));
    // The histogram users watch describes work on shared volumes: a skip (RWO, unbound,
    // filtered) takes microseconds and would drown the reconciles that matter.
    if !matches!(result, Ok(Outcome::Skipped(_))) {
        ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    }
    let (label, standing) = match &result {
        Ok(Outcome::Skipped(_)) => ("skipped", Standing::NotServed),
        Ok(Outcome::Invalid(_)) => ("invalid", Standing::Invalid),
        Ok(Outcome::Shared { .. }) => ("shared", Standing::Shared),
        Ok(Outcome::RepairDeferred(_)) => ("deferred", Standing::Shared),
        Err(_) => ("error", Standing::Failed),
    };
    ctx.metrics.reconciles.with_label_values(&[label]).inc();
    ctx.book(|book| book.record(&claim_key(&claim), standing, SystemTime::now()));
    tracing::debug!(claim = %claim_key(&claim), outcome = ?result, elapsed = ?started.elapsed(), "reconciled");
    result.map(|outcome| match outcome {
        Outcome::RepairDeferred(wait) => Action::requeue(wait),
        _ => Action::requeue(ctx.settings.resync_interval),
    })
}

pub fn error_policy(claim: Arc<PersistentVolumeClaim>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_errors.with_label_values(&[err.reason()]).inc();
    let key = claim_key(&claim);
    let settings = &ctx.settings;
    let retry = ctx.book.lock().expect("claim book poisoned").retry_after(
        &key,
        settings.error_requeue,
        settings.max_error_requeue,
    );
    tracing::warn!(claim = %key, error = %err, "reconcile failed; retrying in {retry:?}");
    Action::requeue(retry)
}

fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!("{}/{}", claim.namespace().unwrap_or_default(), claim.name_any())
}

async fn reconcile_claim(claim: &PersistentVolumeClaim, ctx: &Context) -> Result<Outcome, ReconcileError> {
    let uid = claim.uid().unwrap_or_default();
    let pv = match claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
        Some(name) => read_pv(ctx, name).await?,
        None => None,
    };
    let pv = match classify::candidate_volume(claim, pv.as_ref(), &ctx.settings.filters).manage() {
        Ok(pv) => pv,
        Err(why) => return Ok(not_managed(ctx, claim, why).await),
    };
    let volume = match ctx.backend.volume(pv).await {
        Ok(Some(volume)) => volume,
        Ok(None) => {
            let invalid = Invalid {
                reason: "VolumeNotFound",
                message: format!(
                    "the storage system has no volume for PV {:?}; check that it still exists and carries the CSI labels",
                    pv.name_any()
                ),
            };
            return Ok(report_invalid(ctx, claim, invalid).await);
        }
        Err(VolumeError::Invalid { reason, message }) => {
            return Ok(report_invalid(ctx, claim, Invalid { reason, message }).await);
        }
        Err(err) => return Err(err.into()),
    };
    let shared = match classify::shared_volume(claim, pv, &volume).manage() {
        Ok(shared) => shared,
        Err(why) => return Ok(not_managed(ctx, claim, why).await),
    };

    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &shared.namespace);
    let caches = ctx.caches();
    let key = claim_key(claim);
    let fingerprint = desired::fingerprint(&shared);
    let repairing = match caches
        .as_ref()
        .map(|caches| contested(ctx, caches, &shared, &key, fingerprint))
    {
        Some(Contest::Wait(wait)) => return Ok(defer_repair(ctx, claim, wait).await),
        Some(Contest::Repair) => true,
        _ => false,
    };
    let existing = match &caches {
        Some(caches) => caches
            .service(&shared.namespace, &shared.service_name)
            .map(|s| (*s).clone()),
        None => services.get_opt(&shared.service_name).await?,
    };
    let published = volume.mount_endpoint.as_deref();
    let Some(ensured) = ensure_service(ctx, &services, &shared, existing.as_ref(), &uid, published).await? else {
        let invalid = Invalid {
            reason: "ServiceNameTaken",
            message: format!(
                "Service {}/{} exists and does not belong to this claim; it was left alone. Rename or delete it",
                shared.namespace, shared.service_name
            ),
        };
        return Ok(report_invalid(ctx, claim, invalid).await);
    };
    ensure_endpoints(ctx, &shared, caches.as_ref()).await?;
    ctx.book(|book| {
        if repairing {
            book.repaired(&key, Instant::now());
        }
        book.converged(&key, fingerprint);
    });
    if repairing {
        ctx.metrics.repairs.inc();
    }
    let EnsuredService { cluster_ip, created } = ensured;
    ctx.events.clear_warnings(&claim.object_ref(&()));

    warn_if_other_family(ctx, claim, &shared, &cluster_ip).await;
    let mount_endpoint = desired::mount_endpoint(&cluster_ip)
        .ok_or_else(|| ReconcileError::NoClusterIp(shared.service_name.clone(), ctx.settings.create_wait_duration))?;
    if volume.mount_endpoint.as_deref() == Some(mount_endpoint.as_str()) {
        if created {
            let note = format!(
                "Service {} was missing and has been recreated at the published address {mount_endpoint}; clients are unaffected",
                shared.service_name
            );
            ctx.events
                .normal(&claim.object_ref(&()), "ServiceRestored", "RecreateService", note)
                .await;
        }
        return Ok(Outcome::Shared {
            mount_endpoint,
            published: false,
        });
    }
    let reference = claim.object_ref(&());
    if created && let Some(previous) = &volume.mount_endpoint {
        let note = format!(
            "Service {} was missing and has been recreated, but its address {previous} had been taken meanwhile: the mount endpoint moved to {mount_endpoint}; clients must remount",
            shared.service_name
        );
        ctx.events
            .warning(&reference, "ServiceRecreated", "RecreateService", note)
            .await;
    }
    ctx.backend.publish_mount_endpoint(pv, &volume, &mount_endpoint).await?;
    ctx.metrics.publishes.inc();
    let note = format!(
        "mount endpoint {mount_endpoint} published (NFS server {})",
        shared.server
    );
    ctx.events
        .normal(&reference, "MountEndpointPublished", "PublishMountEndpoint", note)
        .await;
    Ok(Outcome::Shared {
        mount_endpoint,
        published: true,
    })
}

/// A Service cannot change its address family, and changing it would change the address clients
/// mount: when the NFS server moved to the other family, the Service is left as it is and the
/// claim gets a Warning that says what to do.
async fn warn_if_other_family(ctx: &Context, claim: &PersistentVolumeClaim, shared: &SharedVolume, cluster_ip: &str) {
    let Ok(ip) = cluster_ip.parse::<std::net::IpAddr>() else {
        return;
    };
    if ip.is_ipv6() == shared.server.is_ipv6() {
        return;
    }
    let note = format!(
        "the NFS server {} is {}, but Service {} is {} ({ip}): clients of the mount endpoint cannot reach it. \
         Delete the Service to have it recreated in the server's family (the mount endpoint changes; clients must remount)",
        shared.server,
        desired::address_family(shared.server.ip),
        shared.service_name,
        desired::address_family(ip),
    );
    ctx.events
        .warning_once(
            &claim.object_ref(&()),
            "ServiceFamilyMismatch",
            "ReconcileSharedVolume",
            note,
        )
        .await;
}

/// What to do about objects found out of line with what we converged them to.
enum Contest {
    /// In line, or the desired state moved on: write as usual.
    None,
    /// Drift: write it back now.
    Repair,
    /// Drift again and again: wait this long before writing it back.
    Wait(Duration),
}

/// Whether the cached Service, Endpoints and EndpointSlice drifted from the state this replica
/// converged them to (something else changed them), and whether repairing them must wait.
fn contested(ctx: &Context, caches: &Caches, shared: &SharedVolume, key: &str, fingerprint: u64) -> Contest {
    // The book first: for a claim we never converged to this state (new, or its server moved)
    // there is nothing to compare, and building the desired objects can wait for the writes.
    if !ctx
        .book
        .lock()
        .expect("claim book poisoned")
        .converged_before(key, fingerprint)
    {
        return Contest::None;
    }
    let (namespace, name) = (&shared.namespace, &shared.service_name);
    let in_line = is_converged(&desired::service(shared), caches.service(namespace, name).as_deref())
        && is_converged(
            &desired::endpoints(shared),
            caches.endpoints(namespace, name).as_deref(),
        )
        && is_converged(
            &desired::endpoint_slice(shared),
            caches.slice(namespace, name).as_deref(),
        );
    if in_line {
        return Contest::None;
    }
    match ctx
        .book
        .lock()
        .expect("claim book poisoned")
        .repair_wait(key, Instant::now())
    {
        Some(wait) => Contest::Wait(wait),
        None => Contest::Repair,
    }
}

async fn defer_repair(ctx: &Context, claim: &PersistentVolumeClaim, wait: Duration) -> Outcome {
    ctx.metrics.repairs_deferred.inc();
    let note = "the Service, Endpoints or EndpointSlice of this claim keep being changed by another writer; \
                the controller puts them back, waiting longer each time while this goes on. Find the other \
                writer in the objects' managedFields (a GitOps tool, a script) and stop it"
        .to_owned();
    ctx.events
        .warning_once(
            &claim.object_ref(&()),
            "ManagedFieldsContested",
            "RepairSharedVolume",
            note,
        )
        .await;
    tracing::info!(claim = %claim_key(claim), "objects changed again by another writer; repairing in {wait:?}");
    Outcome::RepairDeferred(wait)
}

async fn not_managed(ctx: &Context, claim: &PersistentVolumeClaim, why: NotManaged) -> Outcome {
    match why {
        NotManaged::Skip(skip) => skipped(ctx, claim, skip),
        NotManaged::Invalid(invalid) => report_invalid(ctx, claim, invalid).await,
    }
}

fn skipped(ctx: &Context, claim: &PersistentVolumeClaim, skip: Skip) -> Outcome {
    if skip == Skip::Deleting {
        ctx.events.clear_warnings(&claim.object_ref(&()));
    }
    Outcome::Skipped(skip)
}

async fn report_invalid(ctx: &Context, claim: &PersistentVolumeClaim, invalid: Invalid) -> Outcome {
    ctx.metrics.reconcile_errors.with_label_values(&[invalid.reason]).inc();
    let reference: ObjectReference = claim.object_ref(&());
    ctx.events
        .warning_once(&reference, invalid.reason, "ReconcileSharedVolume", invalid.message)
        .await;
    Outcome::Invalid(invalid.reason)
}

/// The PV, from the cache when it holds it (what triggered the reconcile is always there), else
/// from the API.
async fn read_pv(ctx: &Context, name: &str) -> Result<Option<PersistentVolume>, kube::Error> {
    if let Some(pv) = ctx.caches().and_then(|c| c.pv(name)) {
        return Ok(Some((*pv).clone()));
    }
    Api::<PersistentVolume>::all(ctx.client.clone()).get_opt(name).await
}

struct EnsuredService {
    cluster_ip: String,
    /// It did not exist before this reconcile.
    created: bool,
}

/// Creates the Service (at the `published` address, if one was), or applies it if it drifted,
/// and returns its ClusterIP (waiting for one after a create); `None` when a Service of that name
/// belongs to something else.
async fn ensure_service(
    ctx: &Context,
    services: &Api<Service>,
    shared: &SharedVolume,
    existing: Option<&Service>,
    claim_uid: &str,
    published: Option<&str>,
) -> Result<Option<EnsuredService>, ReconcileError> {
    let desired = desired::service(shared);
    let owned = |service: &Service| service.owner_references().iter().any(|o| o.uid == claim_uid);
    let (current, created) = match existing {
        Some(existing) if !owned(existing) => return Ok(None),
        Some(existing) => {
            let applied = apply_if_changed(services, CONTROLLER_FIELD_MANAGER, &desired, Some(existing)).await?;
            (applied.unwrap_or_else(|| existing.clone()), false)
        }
        None => match create_service(services, shared, published).await? {
            Some(created) => {
                tracing::info!(service = %format!("{}/{}", shared.namespace, shared.service_name), "Service created");
                (created, true)
            }
            // Not in the cache, but there: read it, and it must be ours.
            None => match services.get_opt(&shared.service_name).await? {
                Some(found) if !owned(&found) => return Ok(None),
                Some(found) => {
                    let applied = apply_if_changed(services, CONTROLLER_FIELD_MANAGER, &desired, Some(&found)).await?;
                    (applied.unwrap_or(found), false)
                }
                None => return Err(ReconcileError::Gone(shared.service_name.clone())),
            },
        },
    };
    let cluster_ip = match cluster_ip(&current) {
        Some(ip) => ip,
        None => wait_for_cluster_ip(ctx, services, &shared.service_name).await?,
    };
    Ok(Some(EnsuredService { cluster_ip, created }))
}

/// The API server frees a deleted Service's address just after the delete reaches watchers: a
/// refusal of the published address within this long of the first try is that release still
/// under way, not another owner.
const ADDRESS_RELEASE_GRACE: Duration = Duration::from_secs(5);
const ADDRESS_RETRY_INTERVAL: Duration = Duration::from_millis(200);

/// Creates the Service in its server's family, asking for the published ClusterIP when there is
/// one; when that address stays taken past [`ADDRESS_RELEASE_GRACE`] (or is no longer in the
/// service range), takes a new one: the caller warns that clients must remount.
async fn create_service(
    services: &Api<Service>,
    shared: &SharedVolume,
    published: Option<&str>,
) -> Result<Option<Service>, kube::Error> {
    let new = desired::new_service(shared, published);
    if new.spec.as_ref().is_none_or(|spec| spec.cluster_ip.is_none()) {
        return create(services, CONTROLLER_FIELD_MANAGER, &new).await;
    }
    let service = format!("{}/{}", shared.namespace, shared.service_name);
    let deadline = Instant::now() + ADDRESS_RELEASE_GRACE;
    loop {
        match create(services, CONTROLLER_FIELD_MANAGER, &new).await {
            Err(kube::Error::Api(status)) if status.code == 422 => {
                if still_allocated(&status) && Instant::now() < deadline {
                    tracing::debug!(%service, published, "the published address is not free yet; waiting for its release");
                    tokio::time::sleep(ADDRESS_RETRY_INTERVAL).await;
                    continue;
                }
                tracing::warn!(
                    %service,
                    published,
                    reason = %status.message,
                    "cannot recreate the Service at its published address; taking a new one"
                );
                return create(services, CONTROLLER_FIELD_MANAGER, &desired::new_service(shared, None)).await;
            }
            result => return result,
        }
    }
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

async fn ensure_endpoints(ctx: &Context, shared: &SharedVolume, caches: Option<&Caches>) -> Result<(), ReconcileError> {
    let written = match caches {
        Some(caches) => {
            let (namespace, name) = (&shared.namespace, &shared.service_name);
            let endpoints = caches.endpoints(namespace, name);
            let slice = caches.slice(namespace, name);
            write_endpoints_over(
                &ctx.client,
                CONTROLLER_FIELD_MANAGER,
                shared,
                endpoints.as_deref(),
                slice.as_deref(),
            )
            .await?
        }
        None => write_endpoints(&ctx.client, CONTROLLER_FIELD_MANAGER, shared).await?,
    };
    if written {
        tracing::info!(
            service = %format!("{}/{}", shared.namespace, shared.service_name),
            server = %shared.server,
            "endpoints written"
        );
    }
    Ok(())
}
