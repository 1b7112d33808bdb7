//! The shared-volume loop (`controller` subcommand): a kube-runtime Controller on claims, owning
//! the Services, Endpoints and EndpointSlices it creates, run only while this replica leads.

pub mod classify;
pub mod desired;
pub mod reconcile;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolume, PersistentVolumeClaim, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use prometheus::Registry;

use crate::admin::Probes;
use crate::cli::{ControllerArgs, VolumeBackendKind};
use crate::events::EventSink;
use crate::metrics::ControllerMetrics;
use crate::names::{CONTROLLER_NAME, managed_selector};
use crate::shutdown::Shutdown;
use crate::volume::VolumeBackend;
use crate::volume::kubernetes::PvAnnotations;
use crate::volume::storageos::StorageOs;
use crate::volume::storageos::api::{HttpApi, HttpSettings};
use reconcile::{Context, Settings};

pub async fn run(args: ControllerArgs, registry: Registry, probes: Probes, shutdown: Shutdown) -> Result<()> {
    let client = Client::try_default()
        .await
        .context("cannot reach the Kubernetes API (in-cluster or KUBECONFIG)")?;
    let metrics = ControllerMetrics::register(&registry)?;
    let backend: Arc<dyn VolumeBackend> = match args.volume_backend {
        VolumeBackendKind::Kubernetes => Arc::new(PvAnnotations::new(client.clone())),
        VolumeBackendKind::Storageos => {
            let api = HttpApi::new(HttpSettings {
                endpoint: args.api_endpoint.clone(),
                secret_path: args.api_secret_path.clone(),
                refresh_interval: *args.api_refresh_interval,
                timeout: *args.api_timeout,
            })?;
            Arc::new(StorageOs::new(Arc::new(api), *args.volume_poll_interval))
        }
    };
    let settings = Settings {
        filters: classify::Filters {
            storage_classes: args.storage_class.clone(),
            csi_drivers: args.csi_driver.clone(),
        },
        create_poll_interval: *args.k8s_create_poll_interval,
        create_wait_duration: *args.k8s_create_wait_duration,
        resync_interval: *args.resync_interval,
        error_requeue: std::time::Duration::from_secs(5),
    };
    let events = EventSink::new(client.clone(), CONTROLLER_NAME, Some(args.identity.clone()));
    let ctx = Arc::new(Context::new(client.clone(), backend, settings, metrics.clone(), events));

    if !args.leader_elect {
        metrics.leader.set(1);
        run_controller(ctx, args.namespace.clone(), args.concurrency, probes, shutdown).await;
        return Ok(());
    }
    lead_and_run(client, &args, ctx, metrics, probes, shutdown).await
}

/// Waits for the lease, runs the loop while holding it, and goes back to standby when it is lost.
async fn lead_and_run(
    client: Client,
    args: &ControllerArgs,
    ctx: Arc<Context>,
    metrics: ControllerMetrics,
    probes: Probes,
    shutdown: Shutdown,
) -> Result<()> {
    let manager = LeaseManagerBuilder::new(client, &args.lease_name)
        .with_namespace(&args.lease_namespace)
        .with_identity(&args.identity)
        .with_duration(args.lease_duration_seconds)
        .with_grace(args.lease_grace_seconds)
        .with_field_manager(format!("{CONTROLLER_NAME}-lease"))
        .build()
        .await
        .context("cannot set up leader election")?;
    let (mut leading, lease_task) = manager.watch().await;
    probes.set_ready(true); // a standby is ready: it serves and waits
    tracing::info!(lease = %format!("{}/{}", args.lease_namespace, args.lease_name), identity = %args.identity, "waiting for leadership");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = leading.wait_for(|is_leader| *is_leader) => if changed.is_err() { break },
        }
        tracing::info!(identity = %args.identity, "became leader");
        metrics.leader.set(1);
        let stop = shutdown.child_token();
        let task = tokio::spawn(run_controller(
            ctx.clone(),
            args.namespace.clone(),
            args.concurrency,
            probes.clone(),
            stop.clone(),
        ));
        let lost = tokio::select! {
            _ = shutdown.cancelled() => false,
            changed = leading.wait_for(|is_leader| !*is_leader) => changed.is_ok(),
        };
        stop.cancel();
        let _ = task.await;
        metrics.leader.set(0);
        probes.set_ready(true);
        if !lost {
            break;
        }
        tracing::warn!(identity = %args.identity, "lost leadership; stopped reconciling");
    }
    drop(leading);
    match lease_task.await {
        Ok(Ok(manager)) => {
            if let Err(err) = manager.release().await {
                tracing::warn!(error = %err, "cannot release the lease; the next leader waits for it to expire");
            }
        }
        Ok(Err(err)) => tracing::warn!(error = %err, "leader election ended with an error"),
        Err(err) => tracing::warn!(error = %err, "leader election task failed"),
    }
    Ok(())
}

async fn run_controller(
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    probes: Probes,
    stop: Shutdown,
) {
    let client = ctx.client.clone();
    let managed = watcher::Config::default().labels(&managed_selector());
    let mut controller = Controller::new(scoped(&client, namespace.as_deref()), watcher::Config::default())
        .owns(scoped::<Service>(&client, namespace.as_deref()), managed.clone())
        .owns(scoped::<Endpoints>(&client, namespace.as_deref()), managed.clone())
        .owns(scoped::<EndpointSlice>(&client, namespace.as_deref()), managed)
        .watches(
            Api::<PersistentVolume>::all(client),
            watcher::Config::default(),
            claim_of_volume,
        )
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on({
            let stop = stop.clone();
            async move { stop.cancelled().await }
        });
    if let Some(changes) = ctx.backend.changes() {
        controller = controller.reconcile_on(changes.map(|claim| ObjectRef::new(&claim.name).within(&claim.namespace)));
    }
    let store = controller.store();
    let readiness = {
        let probes = probes.clone();
        tokio::spawn(async move {
            // The store's readiness signal wakes only its most recent waiter, and the controller
            // itself waits on it too: poll again now and then instead of waiting once.
            loop {
                match tokio::time::timeout(Duration::from_millis(250), store.wait_until_ready()).await {
                    Ok(Ok(())) => break,
                    Ok(Err(_)) => return,
                    Err(_) => continue,
                }
            }
            tracing::info!("claim cache synced; reconciling");
            probes.set_ready(true);
        })
    };
    controller
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "controller event");
            }
        })
        .await;
    readiness.abort();
}

/// An Api over one namespace, or over all of them.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A PV change is a change of the claim it is bound to.
fn claim_of_volume(pv: PersistentVolume) -> Option<ObjectRef<PersistentVolumeClaim>> {
    let claim = pv.spec?.claim_ref?;
    Some(ObjectRef::new(&claim.name?).within(&claim.namespace?))
}
