//! The shared-volume loop (`controller` subcommand): a kube-runtime Controller on claims, owning
//! the Services, Endpoints and EndpointSlices it creates, run only while this replica leads
//! ([`leader`]). Each claim is reconciled by [`reconcile`].

mod book;
pub mod cache;
mod condition;
mod context;
mod fence;
mod leader;
#[cfg(test)]
mod move_model;
mod plan;
pub mod reconcile;
mod service;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use prometheus::Registry;

use crate::admin::Probes;
use crate::cli::{ControllerArgs, VolumeBackendKind};
use crate::events::{EventSettings, EventSink};
use crate::metrics::{ControllerMetrics, set_to_now};
use crate::names::{CONTROLLER_NAME, managed_selector};
use crate::sharedvolume::{claim::bound_claim, classify};
use crate::shutdown::Shutdown;
use crate::volume::storageos::api::HttpSettings;
use crate::volume::{self, BackendSettings, ClaimKey};
use cache::{Caches, watch_backoff};
use context::{Context, ReconcileSettings};
use fence::{Fence, FenceLayer};
use hyper::header::HeaderValue;
use reconcile::ReconcileError;
use watchdog::{PROBE_NAME, Watchdog};

pub async fn run(
    args: ControllerArgs,
    config: kube::Config,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
    event_settings: EventSettings,
) -> Result<()> {
    tracing::info!(
        volume_backend = ?args.volume_backend,
        api_endpoint = %args.api_endpoint,
        api_secret_path = %args.api_secret_path.display(),
        api_refresh_interval = %args.api_refresh_interval,
        api_retry_interval = %args.api_retry_interval,
        max_retry_interval = %args.max_retry_interval,
        volume_poll_interval = %args.volume_poll_interval,
        k8s_create_poll_interval = %args.k8s_create_poll_interval,
        k8s_create_wait_duration = %args.k8s_create_wait_duration,
        leader_elect = args.leader_elect,
        lease_namespace = %args.lease_namespace,
        watch_namespace = args.watch_namespace.as_deref().unwrap_or("(all)"),
        "controller starting"
    );
    let metrics = ControllerMetrics::register(&registry)?;
    // Leader election talks to the API with a client of its own; everything else goes through
    // the fence, which refuses writes while this replica cannot be sure it leads.
    let fence = args.leader_elect.then(Fence::default);
    let election_client = Client::try_from(config.clone()).context("cannot build a Kubernetes client")?;
    let client = fenced_client(config, fence.clone(), &args.identity)?;
    let backend = volume::backend(backend_settings(&args), &client)?;
    let settings = ReconcileSettings {
        filters: classify::Filters {
            storage_classes: args.storage_class.clone(),
            csi_drivers: args.csi_driver.clone(),
        },
        create_poll_interval: *args.k8s_create_poll_interval,
        create_wait_duration: *args.k8s_create_wait_duration,
        resync_interval: *args.resync_interval,
        reconcile_timeout: *args.reconcile_timeout,
        error_requeue: *args.api_retry_interval,
        max_error_requeue: *args.max_retry_interval,
    };
    let events = EventSink::new(client.clone(), CONTROLLER_NAME, Some(args.identity.clone())).with(event_settings);
    let ctx = Arc::new(Context::new(client.clone(), backend, settings, metrics.clone(), events));

    let watchdog = Watchdog::new(*args.reconcile_timeout + Duration::from_secs(30));
    probes.set_liveness_check({
        let watchdog = watchdog.clone();
        move || watchdog.check(std::time::Instant::now())
    });
    let Some(fence) = fence else {
        metrics.leader.set(1);
        let never = Shutdown::new();
        let namespace = args.watch_namespace.clone();
        run_controller(
            ctx,
            namespace,
            args.concurrency,
            Health { probes, watchdog },
            shutdown,
            never,
        )
        .await;
        return Ok(());
    };
    let health = Health { probes, watchdog };
    leader::lead_and_run(election_client, fence, &args, ctx, metrics, health, shutdown).await
}

/// The volume backend `--volume-backend` names, configured from its flags.
fn backend_settings(args: &ControllerArgs) -> BackendSettings {
    match args.volume_backend {
        VolumeBackendKind::Kubernetes => BackendSettings::Kubernetes,
        VolumeBackendKind::Storageos => BackendSettings::Storageos {
            http: HttpSettings {
                endpoint: args.api_endpoint.clone(),
                secret_path: args.api_secret_path.clone(),
                refresh_interval: *args.api_refresh_interval,
                timeout: *args.api_timeout,
            },
            poll_interval: *args.volume_poll_interval,
        },
    }
}

/// The controller's client: the replica named in its User-Agent, writes refused while `fence`
/// (when there is one) does not hold.
fn fenced_client(config: kube::Config, fence: Option<Fence>, identity: &str) -> Result<Client> {
    let agent = format!("{CONTROLLER_NAME}/{} ({identity})", env!("CARGO_PKG_VERSION"));
    let user_agent = HeaderValue::from_str(&agent).unwrap_or_else(|_| HeaderValue::from_static(CONTROLLER_NAME));
    let builder = crate::kube_client::client_builder(&config)?;
    Ok(builder.with_layer(&FenceLayer { fence, user_agent }).build())
}

/// Runs the kube-runtime Controller; marks the replica ready once claims are cached. `stop` lets
/// reconciles in flight finish (shutting down while leading); `abandon` drops them at once
/// (leadership lost: whatever they would still write is no longer ours to write).
pub(crate) async fn run_controller(
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    health: Health,
    stop: Shutdown,
    abandon: Shutdown,
) {
    let Health { probes, watchdog } = health;
    let client = ctx.client.clone();
    let managed = watcher::Config::default().labels(&managed_selector());
    let (caches, triggers) = Caches::new(&client, namespace.as_deref(), &managed);
    let use_caches = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            caches.synced().await;
            tracing::info!("volume, Service, Endpoints and EndpointSlice caches synced; reconciles read them");
            ctx.use_caches(Some(caches));
        })
    };
    let mut controller = Controller::for_stream(triggers.claims, triggers.claim_store)
        .owns_stream(triggers.services)
        .owns_stream(triggers.endpoints)
        .owns_stream(triggers.slices)
        .watches_stream(triggers.pvs, claim_of_volume)
        .with_config(controller::Config::default().concurrency(concurrency))
        // Errors of every watch also pass through the controller's own back-off: keep it as
        // short as the watches' own, or a restarted API server is waited out for half a minute.
        .trigger_backoff(watch_backoff())
        .graceful_shutdown_on({
            let stop = stop.clone();
            async move { stop.cancelled().await }
        });
    if let Some(changes) = ctx.backend.changes() {
        controller = controller.reconcile_on(changes.map(|claim| ObjectRef::new(&claim.name).within(&claim.namespace)));
    }
    controller = controller.reconcile_on(liveness_probes(watchdog.clone()));
    let readiness = tokio::spawn(ready_once_claims_are_cached(controller.store(), probes.clone()));
    let running = controller
        .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
        .for_each(|result| {
            let (ctx, watchdog) = (ctx.clone(), watchdog.clone());
            async move { after_reconcile(result, &ctx, &watchdog) }
        });
    tokio::select! {
        () = running => {}
        () = abandon.cancelled() => tracing::warn!("reconciles in flight dropped: no longer leading"),
    }
    watchdog.stand_down();
    readiness.abort();
    use_caches.abort();
    ctx.use_caches(None);
    // Stopped (lost leadership, or shutting down): this replica no longer speaks for any claim,
    // so its gauges must not add to the new leader's.
    ctx.book(|book| book.clear());
}

/// Marks the replica ready once the claim store has listed.
async fn ready_once_claims_are_cached(store: Store<PersistentVolumeClaim>, probes: Probes) {
    // The store's readiness signal wakes only its most recent waiter, and the controller itself
    // waits on it too: poll again now and then instead of waiting once.
    loop {
        match tokio::time::timeout(Duration::from_millis(250), store.wait_until_ready()).await {
            Ok(Ok(())) => break,
            Ok(Err(_)) => return,
            Err(_) => continue,
        }
    }
    tracing::info!("claim cache synced; reconciling");
    probes.set_ready(true);
}

type ReconcileResult = Result<
    (ObjectRef<PersistentVolumeClaim>, kube::runtime::controller::Action),
    controller::Error<ReconcileError, watcher::Error>,
>;

/// What the loop does with each finished reconcile besides requeueing it: a liveness probe that
/// came through is answered, a claim deleted without a finalizer is forgotten.
fn after_reconcile(result: ReconcileResult, ctx: &Context, watchdog: &Watchdog) {
    match result {
        Err(controller::Error::ObjectNotFound(probe)) if probe.name == PROBE_NAME => {
            watchdog.answered();
            set_to_now(&ctx.metrics.loop_turned);
        }
        // A claim deleted without a finalizer is never reconciled as deleting.
        Err(controller::Error::ObjectNotFound(claim)) => {
            let key = ClaimKey {
                namespace: claim.namespace.unwrap_or_default(),
                name: claim.name,
            };
            ctx.book(|book| book.forget(&key));
        }
        Err(err) => tracing::debug!(error = %err, "controller event"),
        Ok(_) => {}
    }
}

/// What a replica tells about itself: whether it is ready, and whether its loop turns.
#[derive(Clone)]
pub(crate) struct Health {
    pub probes: Probes,
    pub watchdog: Watchdog,
}

/// A probe every [`watchdog::PROBE_EVERY`] through the controller's own queue (see [`Watchdog`]).
fn liveness_probes(watchdog: Watchdog) -> impl futures::Stream<Item = ObjectRef<PersistentVolumeClaim>> + Send {
    futures::stream::unfold(watchdog, |watchdog| async move {
        tokio::time::sleep(watchdog::PROBE_EVERY).await;
        watchdog.sent(std::time::Instant::now());
        Some((ObjectRef::new(PROBE_NAME), watchdog))
    })
}

/// A PV change is a change of the claim it is bound to.
fn claim_of_volume(pv: PersistentVolume) -> Option<ObjectRef<PersistentVolumeClaim>> {
    let claim = bound_claim(&pv)?;
    Some(ObjectRef::new(&claim.name).within(&claim.namespace))
}
