//! The imperative shell of the shared-volume loop, one claim at a time: read (the claim's volume
//! and its objects, [`super::reads`]), plan (pure: [`super::plan`]), apply (Service, endpoints, mount endpoint).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::controller::Action;
use kube::{Api, Resource};

use super::book::Standing;
use super::condition;
use super::context::Context;
use super::endpoints::write_endpoints_over;
use super::outcome::{Level, Outcome, ReconcileError, Tells};
use super::plan::{Current, Drift, Held, MoveStep, Plan, PvSight, move_step};
use super::reads::{self, Look, Read};
use super::service::{EnsuredService, ensure_service};
use crate::deadline::within;
use crate::names::{CLAIM_CONDITION_TYPE, CONTROLLER_FIELD_MANAGER};
use crate::sharedvolume::classify::{self, Invalid, NotManaged, Skip};
use crate::sharedvolume::desired::{self, SharedVolume};
use crate::sharedvolume::linstor::{self, LinstorExport};
use crate::sharedvolume::silence::SilentServer;
use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::{ClaimKey, VolumeError, VolumeInfo};

pub async fn reconcile(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let timeout = ctx.settings.reconcile_timeout;
    let mut tells = Tells::default();
    let result = within(timeout, reconcile_claim(&claim, &ctx, &mut tells))
        .await
        .unwrap_or_else(|timed_out| Err(timed_out.into()));
    // The histogram users watch describes work on shared volumes: a skip (RWO, unbound,
    // filtered) takes microseconds and would drown the reconciles that matter.
    if !matches!(result, Ok(Outcome::Skipped(_) | Outcome::ServedByLinstor { .. })) {
        ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    }
    let (label, standing) = match &result {
        Ok(Outcome::Skipped(_) | Outcome::ServedByLinstor { .. }) => ("skipped", Standing::NotServed),
        Ok(Outcome::Invalid(_)) => ("invalid", Standing::Invalid),
        Ok(Outcome::Shared { .. }) => ("shared", Standing::Shared),
        Ok(Outcome::RepairDeferred(_)) => ("deferred", Standing::Shared),
        Ok(Outcome::MoveHeld(_)) => ("held", Standing::Shared),
        Err(_) => ("error", Standing::Failed),
    };
    ctx.metrics.reconciles.with_label_values(&[label]).inc();
    ctx.book(|book| book.record(&ClaimKey::of(&claim), standing, SystemTime::now()));
    if let Err(err) = &result {
        tells.refusal(err);
    }
    tell(&ctx, &claim, std::mem::take(&mut tells)).await;
    let state_later = state_on_claim(&claim, &result, &ctx, &mut tells).await;
    tell(&ctx, &claim, tells).await;
    tracing::debug!(claim = %ClaimKey::of(&claim), outcome = ?result, elapsed = ?started.elapsed(), "reconciled");
    result.map(|outcome| match outcome {
        Outcome::RepairDeferred(wait) | Outcome::MoveHeld(wait) => Action::requeue(wait),
        _ => Action::requeue(state_later.map_or(ctx.settings.resync_interval, |wait| {
            wait.min(ctx.settings.resync_interval)
        })),
    })
}

pub fn error_policy(claim: Arc<PersistentVolumeClaim>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_errors.with_label_values(&[err.reason()]).inc();
    let key = ClaimKey::of(&claim);
    let settings = &ctx.settings;
    let retry = match err.refusal() {
        // Retrying sooner cannot change the answer: the slow pace, until the claim changes.
        Some(refusal) if !refusal.may_pass_soon() => settings.max_error_requeue,
        _ => ctx.read_book(|book| book.retry_after(&key, settings.error_requeue, settings.max_error_requeue)),
    };
    tracing::warn!(claim = %key, error = %err, "reconcile failed; retrying in {retry:?}");
    Action::requeue(retry)
}

/// Posts what a reconcile found to tell on its claim: the one place the controller posts Events
/// about claims from. A write refused for good is among them (once per message), in words that
/// say what to fix: a retry alone would leave `kubectl describe pvc` silent.
async fn tell(ctx: &Context, claim: &PersistentVolumeClaim, tells: Tells) {
    let reference = claim.object_ref(&());
    for told in tells.0 {
        ctx.events.tell(&reference, told).await;
    }
}

/// Writes what the claim's condition should state after `result`, unless it states it already,
/// or, for a move an agent made a moment ago, returns how long to wait before writing it (see
/// [`condition::settling`]). A failed write is logged (and told on the claim when no retry can
/// change it): the next reconcile tries again.
async fn state_on_claim(
    claim: &PersistentVolumeClaim,
    result: &Result<Outcome, ReconcileError>,
    ctx: &Context,
    tells: &mut Tells,
) -> Option<Duration> {
    let filters = &ctx.settings.filters;
    let known_ours = !filters.storage_classes.is_empty() || !filters.csi_drivers.is_empty();
    let stated = condition::stated(result, claim, known_ours)?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let condition = condition::to_write(claim, &stated, now)?;
    if let Some(wait) = condition::settling(result, now) {
        return Some(wait);
    }
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), namespace);
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let written = within(
        ctx.settings.reconcile_timeout,
        condition::apply(&claims, name, &condition),
    )
    .await;
    let err = match written {
        Ok(Ok(())) => return None,
        Ok(Err(err)) => ReconcileError::Kube(err),
        Err(timed_out) => timed_out.into(),
    };
    tracing::warn!(claim = %ClaimKey::of(claim), error = %err, "cannot write the claim's {CLAIM_CONDITION_TYPE} condition");
    tells.refusal(&err);
    None
}

/// A claim found to be a shared volume this controller serves, with what it was found from.
struct Found {
    pv: PersistentVolume,
    volume: VolumeInfo,
    shared: SharedVolume,
    /// The PV was read from the API in this reconcile.
    fresh: bool,
}

impl Found {
    fn sight(&self) -> PvSight {
        PvSight {
            version: self.pv.metadata.resource_version.clone().unwrap_or_default(),
            server: self.shared.server,
            stamp: MoveStamp::read(self.pv.metadata.annotations.as_ref()),
            fresh: self.fresh,
        }
    }
}

async fn reconcile_claim(
    claim: &PersistentVolumeClaim,
    ctx: &Context,
    tells: &mut Tells,
) -> Result<Outcome, ReconcileError> {
    let pv = match claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
        Some(name) => reads::pv(ctx, name, Look::CacheFirst).await?,
        None => Read {
            value: None,
            fresh: true,
        },
    };
    let linstor_export = pv.value.as_ref().and_then(linstor::export_of);
    let found = match (find_shared_volume(claim, ctx, pv).await?, linstor_export) {
        (Finding::Shared(found), _) => *found,
        (Finding::NotManaged(NotManaged::Skip(Skip::ServedElsewhere)), Some(export)) => {
            return served_by_linstor(ctx, export).await;
        }
        (Finding::NotManaged(why), _) => return Ok(not_managed(ctx, claim, why, tells)),
    };
    let key = ClaimKey::of(claim);
    let (found, current) = match follow_moves(claim, ctx, &key, found, tells).await? {
        Followed::Ready(ready) => *ready,
        Followed::Ended(outcome) => return Ok(*outcome),
    };
    let Found { pv, volume, shared, .. } = found;
    let plan = Plan::of(&shared, ctx.settings.write_endpoints.writes());
    let drift = ctx.read_book(|book| {
        let converged_before = book.converged_before(&key, plan.fingerprint);
        plan.drift(&current, converged_before, book.repair_wait(&key, Instant::now()))
    });
    if let Drift::Wait(wait) = drift {
        return Ok(defer_repair(ctx, claim, wait, tells));
    }
    let published = volume.mount_endpoint.as_deref();
    let Some(ensured) = ensure_service(ctx, &shared, &plan.service, current.service.as_ref(), published).await? else {
        let invalid = Invalid::new(
            "ServiceNameTaken",
            format!(
                "Service {}/{} exists and does not belong to this claim; it was left alone. Rename or delete it",
                shared.namespace, shared.service_name
            ),
        );
        return Ok(report_invalid(ctx, invalid, tells));
    };
    ensure_endpoints(ctx, &shared, &plan, &current).await?;
    let repaired = drift == Drift::Repair;
    ctx.book(|book| {
        if repaired {
            book.repaired(&key, Instant::now());
        }
        book.converged(&key, plan.fingerprint);
    });
    if repaired {
        ctx.metrics.repairs.inc();
    }
    ctx.events.clear_warnings(&claim.object_ref(&()));
    warn_if_other_family(&shared, &ensured.cluster_ip, tells);
    publish_mount_endpoint(ctx, &pv, &volume, &shared, ensured, tells).await
}

/// What LINSTOR CSI advertises for a volume it serves itself: the server of its nfs-helper slice.
/// Nothing is written for it but the claim's condition.
async fn served_by_linstor(ctx: &Context, export: LinstorExport) -> Result<Outcome, ReconcileError> {
    let slice = match &export.namespace {
        Some(namespace) => reads::linstor_slice(ctx, namespace, &export.resource).await?,
        None => None,
    };
    let server = slice.as_ref().and_then(linstor::advertised);
    Ok(Outcome::ServedByLinstor { export, server })
}

/// Where following an agent's move left the reconcile.
enum Followed {
    /// What to plan from: the volume and its objects as they are (boxed, as the other way out:
    /// both are large).
    Ready(Box<(Found, Current)>),
    /// The reconcile ends here: the move is held, or the fresh PV is no longer served.
    Ended(Box<Outcome>),
}

/// Reads the claim's objects, and where they differ from the PV because an agent is moving
/// them, reads again what [`move_step`] asks for: the PV (it may lag in the cache) or the
/// endpoints (the agent may have written them already). Ends with what to plan from, or with
/// how the reconcile ended (the move held, or the fresh PV no longer served).
async fn follow_moves(
    claim: &PersistentVolumeClaim,
    ctx: &Context,
    key: &ClaimKey,
    mut found: Found,
    tells: &mut Tells,
) -> Result<Followed, ReconcileError> {
    let Read {
        value: mut current,
        fresh: mut objects_fresh,
    } = reads::objects(ctx, &found.shared, Look::CacheFirst).await?;
    let held = ctx.read_book(|book| book.held(key).map(|(stamp, until)| (stamp.clone(), until)));
    loop {
        let held = held.as_ref().map(|(stamp, until)| Held {
            stamp,
            expired: Instant::now() >= *until,
        });
        let pointing = current.pointing(ctx.settings.write_endpoints.writes());
        match move_step(&found.sight(), &pointing, objects_fresh, held) {
            MoveStep::Proceed => return Ok(Followed::Ready(Box::new((found, current)))),
            MoveStep::ReadPv => {
                let name = found.pv.metadata.name.clone().unwrap_or_default();
                let pv = reads::pv(ctx, &name, Look::Fresh).await?;
                found = match find_shared_volume(claim, ctx, pv).await? {
                    Finding::Shared(found) => *found,
                    Finding::NotManaged(why) => {
                        return Ok(Followed::Ended(Box::new(not_managed(ctx, claim, why, tells))));
                    }
                };
            }
            MoveStep::ReadEndpoints => {
                current = reads::objects(ctx, &found.shared, Look::Fresh).await?.value;
                objects_fresh = true;
            }
            MoveStep::Hold(stamp) => {
                tracing::debug!(claim = %key, move_to = %stamp.endpoint, "an agent's move is in flight; holding");
                ctx.metrics.moves_held.inc();
                let now = Instant::now();
                let mut wait = MOVE_HOLD;
                ctx.book(|book| wait = book.hold(key, stamp, now + MOVE_HOLD, now));
                return Ok(Followed::Ended(Box::new(Outcome::MoveHeld(wait))));
            }
        }
    }
}

/// How long a move in flight is held before the endpoints are put back to what the PV says: the
/// agent's three writes go out together, so its PV write lands within a round trip or not at all.
const MOVE_HOLD: Duration = Duration::from_secs(2);

/// What the claim turned out to be, once its PV and the storage system's volume are read.
enum Finding {
    /// Boxed: a volume and its PV are large, and the other way out is small.
    Shared(Box<Found>),
    /// Not ours to serve (skipped), or ours but unusable (bad input): the reconcile ends here.
    NotManaged(NotManaged),
}

/// The claim's volume, given its PV as read, if the claim is a shared volume of ours; else why
/// not. A volume the backend does not know, or holds something unusable, is bad input.
async fn find_shared_volume(
    claim: &PersistentVolumeClaim,
    ctx: &Context,
    pv: Read<Option<PersistentVolume>>,
) -> Result<Finding, ReconcileError> {
    let Read { value: pv, fresh } = pv;
    let pv = match classify::candidate_volume(claim, pv.as_ref(), &ctx.settings.filters) {
        Ok(pv) => pv,
        Err(why) => return Ok(Finding::NotManaged(why)),
    };
    let volume = match ctx.backend.volume(pv).await {
        Ok(Some(volume)) => volume,
        Ok(None) => {
            let message = format!(
                "the storage system has no volume for PV {:?}; check that it still exists and carries the CSI labels",
                pv.metadata.name.as_deref().unwrap_or_default()
            );
            return Ok(Finding::NotManaged(NotManaged::Invalid(Invalid::new(
                "VolumeNotFound",
                message,
            ))));
        }
        Err(VolumeError::Invalid { reason, message }) => {
            return Ok(Finding::NotManaged(NotManaged::Invalid(Invalid::new(reason, message))));
        }
        Err(err) => return Err(err.into()),
    };
    Ok(match classify::shared_volume(claim, pv, &volume) {
        Ok(shared) => Finding::Shared(Box::new(Found {
            pv: pv.clone(),
            volume,
            shared,
            fresh,
        })),
        Err(why) => Finding::NotManaged(why),
    })
}

/// Publishes `<ClusterIP>:2049` as the volume's mount endpoint unless it is published already,
/// and tells the claim what happened to its Service on the way.
async fn publish_mount_endpoint(
    ctx: &Context,
    pv: &PersistentVolume,
    volume: &VolumeInfo,
    shared: &SharedVolume,
    ensured: EnsuredService,
    tells: &mut Tells,
) -> Result<Outcome, ReconcileError> {
    let EnsuredService { cluster_ip, created } = ensured;
    let mount_endpoint = desired::mount_endpoint(&cluster_ip)
        .ok_or_else(|| ReconcileError::NoClusterIp(shared.service_name.clone(), ctx.settings.create_wait_duration))?;
    if volume.mount_endpoint.as_deref() == Some(mount_endpoint.as_str()) {
        if created {
            let note = format!(
                "Service {} was missing and has been recreated at the published address {mount_endpoint}; clients are unaffected",
                shared.service_name
            );
            tells.add(Level::Normal, "ServiceRestored", "RecreateService", note);
        }
        return Ok(served(pv, shared, mount_endpoint, false));
    }
    if created && let Some(previous) = &volume.mount_endpoint {
        let note = format!(
            "Service {} was missing and has been recreated, but its address {previous} had been taken meanwhile: the mount endpoint moved to {mount_endpoint}; clients must remount",
            shared.service_name
        );
        tells.add(Level::Warning, "ServiceRecreated", "RecreateService", note);
    }
    ctx.backend.publish_mount_endpoint(pv, volume, &mount_endpoint).await?;
    ctx.metrics.publishes.inc();
    let note = format!(
        "mount endpoint {mount_endpoint} published (NFS server {})",
        shared.server
    );
    tells.add(Level::Normal, "MountEndpointPublished", "PublishMountEndpoint", note);
    Ok(served(pv, shared, mount_endpoint, true))
}

/// A served claim's outcome: its mount endpoint, whether this reconcile published it, and what
/// the PV says of its server (the last move, a server that does not answer).
fn served(pv: &PersistentVolume, shared: &SharedVolume, mount_endpoint: String, published: bool) -> Outcome {
    let annotations = pv.metadata.annotations.as_ref();
    let server = shared.server.to_string();
    Outcome::Shared {
        mount_endpoint,
        published,
        moved: MoveStamp::read(annotations),
        silent: SilentServer::of_endpoint(annotations, &server),
        server,
    }
}

/// A Service cannot change its address family, and changing it would change the address clients
/// mount: when the NFS server moved to the other family, the Service is left as it is and the
/// claim gets a Warning that says what to do.
fn warn_if_other_family(shared: &SharedVolume, cluster_ip: &str, tells: &mut Tells) {
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
    tells.add(
        Level::StandingWarning,
        "ServiceFamilyMismatch",
        "ReconcileSharedVolume",
        note,
    );
}

fn defer_repair(ctx: &Context, claim: &PersistentVolumeClaim, wait: Duration, tells: &mut Tells) -> Outcome {
    ctx.metrics.repairs_deferred.inc();
    let note = "the Service, Endpoints or EndpointSlice of this claim keep being changed by another writer; \
                the controller puts them back, waiting longer each time while this goes on. Find the other \
                writer in the objects' managedFields (a GitOps tool, a script) and stop it"
        .to_owned();
    tells.add(
        Level::StandingWarning,
        "ManagedFieldsContested",
        "RepairSharedVolume",
        note,
    );
    tracing::info!(claim = %ClaimKey::of(claim), "objects changed again by another writer; repairing in {wait:?}");
    Outcome::RepairDeferred(wait)
}

fn not_managed(ctx: &Context, claim: &PersistentVolumeClaim, why: NotManaged, tells: &mut Tells) -> Outcome {
    match why {
        NotManaged::Skip(skip) => skipped(ctx, claim, skip),
        NotManaged::Invalid(invalid) => report_invalid(ctx, invalid, tells),
    }
}

fn skipped(ctx: &Context, claim: &PersistentVolumeClaim, skip: Skip) -> Outcome {
    if skip == Skip::Deleting {
        ctx.events.clear_warnings(&claim.object_ref(&()));
    }
    Outcome::Skipped(skip)
}

fn report_invalid(ctx: &Context, invalid: Invalid, tells: &mut Tells) -> Outcome {
    ctx.metrics.reconcile_errors.with_label_values(&[invalid.reason]).inc();
    tells.add(
        Level::StandingWarning,
        invalid.reason,
        "ReconcileSharedVolume",
        invalid.message.clone(),
    );
    Outcome::Invalid(invalid)
}

async fn ensure_endpoints(
    ctx: &Context,
    shared: &SharedVolume,
    plan: &Plan,
    current: &Current,
) -> Result<(), ReconcileError> {
    let written = write_endpoints_over(
        &ctx.client,
        CONTROLLER_FIELD_MANAGER,
        &plan.endpoints,
        (current.endpoints.as_ref(), current.slice.as_ref()),
        plan.writes_endpoints,
    )
    .await?;
    if written {
        tracing::info!(
            service = %format!("{}/{}", shared.namespace, shared.service_name),
            server = %shared.server,
            "endpoints written"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The shell against a scripted API server that expects an exact list of requests, in
    //! order, and answers each with a canned response.

    use kube::Client;
    use serde_json::{Value, json};

    use super::*;
    use crate::events::EventSink;
    use crate::metrics::ControllerMetrics;
    use crate::names::{MOUNT_ENDPOINT_ANNOTATION, SERVICE_ENDPOINT_ANNOTATION};
    use crate::scripted_api::{Exchange, Seen, answer, in_order, not_found};
    use crate::sharedvolume::desired::EndpointObjects;
    use crate::sharedvolume::filters::Filters;
    use crate::volume::kubernetes::{PvAnnotations, volume_from_pv};

    use super::super::context::ReconcileSettings;

    fn context(client: Client, write_endpoints: bool) -> Context {
        let settings = ReconcileSettings {
            filters: Filters::default(),
            create_poll_interval: Duration::from_millis(10),
            create_wait_duration: Duration::from_millis(100),
            resync_interval: Duration::from_secs(60),
            reconcile_timeout: Duration::from_secs(10),
            error_requeue: Duration::from_secs(1),
            max_error_requeue: Duration::from_secs(60),
            write_endpoints: crate::core_endpoints::EndpointsAnswer::fixed(write_endpoints),
        };
        let metrics = ControllerMetrics::register(&prometheus::Registry::new()).unwrap();
        let backend = Arc::new(PvAnnotations::new(client.clone()));
        let events = EventSink::new(client.clone(), "test", None);
        Context::new(client, backend, settings, metrics, events)
    }

    const CLAIM_UID: &str = "uid-claim";
    const PV: &str = "/api/v1/persistentvolumes/pv-data";
    const SERVICE: &str = "/api/v1/namespaces/apps/services/pv-data";
    const SERVICES: &str = "/api/v1/namespaces/apps/services";
    const ENDPOINTS: &str = "/api/v1/namespaces/apps/endpoints/pv-data";
    const ENDPOINTS_ALL: &str = "/api/v1/namespaces/apps/endpoints";
    const SLICE: &str = "/apis/discovery.k8s.io/v1/namespaces/apps/endpointslices/pv-data";
    const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/apps/endpointslices";
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/apps/events";

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": CLAIM_UID},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeName": "pv-data"},
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    fn pv(server: &str, mount: Option<&str>) -> PersistentVolume {
        let mut annotations = json!({SERVICE_ENDPOINT_ANNOTATION: server});
        if let Some(mount) = mount {
            annotations[MOUNT_ENDPOINT_ANNOTATION] = json!(mount);
        }
        serde_json::from_value(json!({
            "metadata": {"name": "pv-data", "resourceVersion": "7", "annotations": annotations},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "claimRef": {"namespace": "apps", "name": "data", "uid": CLAIM_UID},
            },
        }))
        .unwrap()
    }

    fn shared_of(pv: &PersistentVolume) -> SharedVolume {
        classify::shared_volume(&claim(), pv, &volume_from_pv(pv)).unwrap()
    }

    /// The Service as the API server would hold it: what we apply, its address, and `owner`.
    fn service_at(shared: &SharedVolume, cluster_ip: &str, owner: &str) -> Value {
        let mut service = serde_json::to_value(desired::service(shared)).unwrap();
        service["spec"]["clusterIP"] = json!(cluster_ip);
        service["metadata"]["ownerReferences"][0]["uid"] = json!(owner);
        service
    }

    fn converged_endpoints(shared: &SharedVolume) -> (Value, Value) {
        let objects = EndpointObjects::of(shared);
        (
            serde_json::to_value(objects.endpoints).unwrap(),
            serde_json::to_value(objects.slice).unwrap(),
        )
    }

    fn reads_of(pv: &PersistentVolume, service: Exchange) -> Vec<Exchange> {
        let (endpoints, slice) = converged_endpoints(&shared_of(pv));
        vec![
            answer(&format!("GET {PV}"), 200, serde_json::to_value(pv).unwrap()),
            service,
            answer(&format!("GET {ENDPOINTS}"), 200, endpoints),
            answer(&format!("GET {SLICE}"), 200, slice),
        ]
    }

    fn event_reason(body: &Value) -> &str {
        body["reason"].as_str().unwrap_or_default()
    }

    fn request_lines(script: &[Exchange]) -> Vec<String> {
        script.iter().map(|exchange| exchange.request.clone()).collect()
    }

    /// Runs one reconcile of the claim against `script`, checks that it made exactly the
    /// scripted requests, and returns how it ended and what the stub saw.
    async fn reconcile_against(script: Vec<Exchange>) -> (Outcome, Seen) {
        reconcile_against_writing(script, true).await
    }

    /// [`reconcile_against`] with `--write-endpoints` resolved to `write_endpoints`.
    async fn reconcile_against_writing(script: Vec<Exchange>, write_endpoints: bool) -> (Outcome, Seen) {
        let expected = request_lines(&script);
        let (client, seen) = in_order(script);
        let ctx = context(client, write_endpoints);
        let mut tells = Tells::default();
        let outcome = reconcile_claim(&claim(), &ctx, &mut tells).await.unwrap();
        tell(&ctx, &claim(), tells).await;
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(seen.requests, expected, "the requests made");
        (outcome, seen)
    }

    fn served_at_published_address(server: &str) -> Outcome {
        Outcome::Shared {
            mount_endpoint: "10.96.0.10:2049".into(),
            published: false,
            server: server.into(),
            moved: None,
            silent: None,
        }
    }

    #[tokio::test]
    async fn a_converged_claim_costs_reads_and_no_write() {
        let pv = pv("192.0.2.1:2049", Some("10.96.0.10:2049"));
        let service = service_at(&shared_of(&pv), "10.96.0.10", CLAIM_UID);
        let script = reads_of(&pv, answer(&format!("GET {SERVICE}"), 200, service));
        let (outcome, _) = reconcile_against(script).await;
        assert_eq!(outcome, served_at_published_address("192.0.2.1:2049"));
    }

    #[tokio::test]
    async fn without_core_endpoints_ours_from_before_are_deleted_and_nothing_else_written() {
        let pv = pv("192.0.2.1:2049", Some("10.96.0.10:2049"));
        let service = service_at(&shared_of(&pv), "10.96.0.10", CLAIM_UID);
        let mut script = reads_of(&pv, answer(&format!("GET {SERVICE}"), 200, service));
        script.push(answer(&format!("DELETE {ENDPOINTS}"), 200, json!({})));
        let (outcome, _) = reconcile_against_writing(script, false).await;
        assert_eq!(outcome, served_at_published_address("192.0.2.1:2049"));
    }

    #[tokio::test]
    async fn without_core_endpoints_someone_elses_are_left_alone() {
        let pv = pv("192.0.2.1:2049", Some("10.96.0.10:2049"));
        let shared = shared_of(&pv);
        let service = service_at(&shared, "10.96.0.10", CLAIM_UID);
        let (mut endpoints, slice) = converged_endpoints(&shared);
        endpoints["metadata"]["ownerReferences"][0]["uid"] = json!("uid-someone-else");
        let script = vec![
            answer(&format!("GET {PV}"), 200, serde_json::to_value(&pv).unwrap()),
            answer(&format!("GET {SERVICE}"), 200, service),
            answer(&format!("GET {ENDPOINTS}"), 200, endpoints),
            answer(&format!("GET {SLICE}"), 200, slice),
        ];
        let (outcome, _) = reconcile_against_writing(script, false).await;
        assert_eq!(outcome, served_at_published_address("192.0.2.1:2049"));
    }

    #[tokio::test]
    async fn a_service_name_owned_by_someone_else_is_left_alone_and_reported() {
        let pv = pv("192.0.2.1:2049", None);
        let service = service_at(&shared_of(&pv), "10.96.0.10", "uid-someone-else");
        let mut script = reads_of(&pv, answer(&format!("GET {SERVICE}"), 200, service));
        script.push(answer(&format!("POST {EVENTS}"), 201, json!({})));
        let (outcome, seen) = reconcile_against(script).await;
        assert!(
            matches!(&outcome, Outcome::Invalid(invalid) if invalid.reason == "ServiceNameTaken"),
            "nothing but the Warning is written: {outcome:?}"
        );
        assert_eq!(event_reason(seen.bodies.last().unwrap()), "ServiceNameTaken");
    }

    /// A reconcile that read no Service (a cache behind, after an etcd restart) while the Service
    /// stands at the published address: the API server refuses the address before it sees the
    /// name is taken. The Service found is the one clients mount; no retries, no new address.
    #[tokio::test]
    async fn a_service_read_as_missing_but_there_at_the_published_address_is_kept() {
        let pv = pv("192.0.2.1:2049", Some("10.96.0.10:2049"));
        let service = service_at(&shared_of(&pv), "10.96.0.10", CLAIM_UID);
        let mut script = reads_of(&pv, not_found(&format!("GET {SERVICE}")));
        script.push(answer(&format!("POST {SERVICES}"), 422, address_taken()));
        script.push(answer(&format!("GET {SERVICE}"), 200, service));
        let (outcome, _) = reconcile_against(script).await;
        assert_eq!(outcome, served_at_published_address("192.0.2.1:2049"));
    }

    fn address_taken() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "Service \"pv-data\" is invalid: spec.clusterIPs: Invalid value: []string{\"10.96.0.10\"}: failed to allocate IP 10.96.0.10: provided IP is already allocated"})
    }

    #[tokio::test]
    async fn a_published_address_not_yet_released_is_asked_for_again() {
        let pv = pv("192.0.2.1:2049", Some("10.96.0.10:2049"));
        let shared = shared_of(&pv);
        let (endpoints, slice) = converged_endpoints(&shared);
        let script = vec![
            answer(&format!("GET {PV}"), 200, serde_json::to_value(&pv).unwrap()),
            not_found(&format!("GET {SERVICE}")),
            not_found(&format!("GET {ENDPOINTS}")),
            not_found(&format!("GET {SLICE}")),
            answer(&format!("POST {SERVICES}"), 422, address_taken()),
            not_found(&format!("GET {SERVICE}")),
            answer(
                &format!("POST {SERVICES}"),
                201,
                service_at(&shared, "10.96.0.10", CLAIM_UID),
            ),
            answer(&format!("POST {ENDPOINTS_ALL}"), 201, endpoints),
            answer(&format!("POST {SLICES}"), 201, slice),
            answer(&format!("POST {EVENTS}"), 201, json!({})),
        ];
        let (outcome, seen) = reconcile_against(script).await;
        assert_eq!(
            outcome,
            served_at_published_address("192.0.2.1:2049"),
            "clients keep the address they mount"
        );
        for asked in [&seen.bodies[4], &seen.bodies[6]] {
            assert_eq!(
                asked["spec"]["clusterIP"], "10.96.0.10",
                "both creates ask for the published address"
            );
        }
        assert_eq!(event_reason(seen.bodies.last().unwrap()), "ServiceRestored");
    }

    #[tokio::test]
    async fn a_server_in_the_other_family_warns_and_keeps_the_service() {
        let pv = pv("[fd00::5]:2049", Some("10.96.0.10:2049"));
        let service = service_at(&shared_of(&pv), "10.96.0.10", CLAIM_UID);
        let mut script = reads_of(&pv, answer(&format!("GET {SERVICE}"), 200, service));
        script.push(answer(&format!("POST {EVENTS}"), 201, json!({})));
        let (outcome, seen) = reconcile_against(script).await;
        assert_eq!(
            outcome,
            served_at_published_address("[fd00::5]:2049"),
            "the Service is neither deleted nor rewritten"
        );
        let warning = seen.bodies.last().unwrap();
        assert_eq!(event_reason(warning), "ServiceFamilyMismatch");
        assert_eq!(warning["type"], "Warning");
    }
    #[tokio::test]
    async fn a_write_no_retry_can_fix_is_told_on_the_claim_at_once() {
        let pv = pv("[fd00::5]:2049", None);
        let refused = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "Service \"pv-data\" is invalid: spec.ipFamilies[0]: Invalid value: \"IPv6\": not configured on this cluster"});
        let script = vec![
            answer(&format!("GET {PV}"), 200, serde_json::to_value(&pv).unwrap()),
            not_found(&format!("GET {SERVICE}")),
            not_found(&format!("GET {ENDPOINTS}")),
            not_found(&format!("GET {SLICE}")),
            answer(&format!("POST {SERVICES}"), 422, refused),
            answer(&format!("POST {EVENTS}"), 201, json!({})),
        ];
        let expected = request_lines(&script);
        let (client, seen) = in_order(script);
        let ctx = Arc::new(context(client, true));
        let err = reconcile(Arc::new(claim()), ctx.clone()).await.unwrap_err();
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(seen.requests, expected, "the requests made");
        let warning = seen.bodies.last().unwrap();
        assert_eq!(
            (event_reason(warning), warning["type"].as_str()),
            ("WriteRefused", Some("Warning"))
        );
        assert!(
            warning["note"]
                .as_str()
                .unwrap()
                .contains("not configured on this cluster"),
            "{warning}"
        );
        let retry = error_policy(Arc::new(claim()), &err, ctx);
        assert_eq!(retry, Action::requeue(Duration::from_secs(60)), "the slow pace");
    }
}
