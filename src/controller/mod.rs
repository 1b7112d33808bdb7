//! The shared-volume loop (`controller` subcommand): a kube-runtime Controller on claims, owning
//! the Services, Endpoints and EndpointSlices it creates, run only while this replica leads
//! ([`leader`]). Each claim is reconciled by [`reconcile`].

mod book;
pub mod cache;
pub mod compact_store;
mod condition;
mod context;
mod endpoints;
mod fence;
mod leader;
#[cfg(test)]
mod move_model;
mod outcome;
mod plan;
mod reads;
pub mod reconcile;
mod run;
mod service;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use kube::Client;
use prometheus::Registry;

use crate::admin::Probes;
use crate::cli::{ControllerArgs, VolumeBackendKind};
use crate::core_endpoints::EndpointsAnswer;
use crate::events::{EventSettings, EventSink};
use crate::metrics::ControllerMetrics;
use crate::names::CONTROLLER_NAME;
use crate::sharedvolume::filters::Filters;
use crate::shutdown::Shutdown;
use crate::volume::storageos::api::HttpSettings;
use crate::volume::{self, BackendSettings};
use context::{Context, ReconcileSettings};
use fence::{Fence, FenceLayer};
use hyper::header::HeaderValue;
use run::{Health, run_controller};
use watchdog::Watchdog;

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
    let Some(write_endpoints) = EndpointsAnswer::resolve(args.write_endpoints, &election_client, &shutdown).await
    else {
        return Ok(());
    };
    let settings = ReconcileSettings {
        filters: Filters {
            storage_classes: args.storage_class.clone(),
            csi_drivers: args.csi_driver.clone(),
        },
        create_poll_interval: *args.k8s_create_poll_interval,
        create_wait_duration: *args.k8s_create_wait_duration,
        resync_interval: *args.resync_interval,
        reconcile_timeout: *args.reconcile_timeout,
        error_requeue: *args.api_retry_interval,
        max_error_requeue: *args.max_retry_interval,
        write_endpoints,
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
