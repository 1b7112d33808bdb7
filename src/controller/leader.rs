//! Leader election: the controller runs only while this replica holds the Lease, and goes back to
//! standby when it loses it.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;

use super::reconcile::Context;
use super::run_controller;
use crate::admin::Probes;
use crate::cli::ControllerArgs;
use crate::metrics::ControllerMetrics;
use crate::names::CONTROLLER_NAME;
use crate::shutdown::Shutdown;

/// Waits for the lease, runs the loop while holding it, and goes back to standby when it is lost.
pub(super) async fn lead_and_run(
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
            args.watch_namespace.clone(),
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
