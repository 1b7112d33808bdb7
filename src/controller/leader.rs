//! Leader election: the controller runs only while this replica holds the Lease and has seen its
//! renewal (the [`Fence`]), and goes back to standby when either stops being true.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;

use super::cache::watch_backoff;
use super::context::Context;
use super::fence::{self, Fence};
use super::run::{Health, run_controller};
use crate::cli::ControllerArgs;
use crate::metrics::ControllerMetrics;
use crate::names::CONTROLLER_NAME;
use crate::shutdown::Shutdown;

/// Waits for the lease, runs the loop while holding it, and goes back to standby when it is lost.
/// It starts only once the lease manager says it leads *and* its renewal has been observed (the
/// fence holds); it stops, dropping reconciles in flight, as soon as either is no longer true.
pub(super) async fn lead_and_run(
    client: Client,
    fence: Fence,
    args: &ControllerArgs,
    ctx: Arc<Context>,
    metrics: ControllerMetrics,
    health: Health,
    shutdown: Shutdown,
) -> Result<()> {
    let set_up = || {
        LeaseManagerBuilder::new(client.clone(), &args.lease_name)
            .with_namespace(&args.lease_namespace)
            .with_identity(&args.identity)
            .with_duration(args.lease_duration_seconds)
            .with_grace(args.lease_grace_seconds)
            // A manager per replica: taking a free Lease is a server-side apply, which refuses a
            // second replica's at the same moment only when their managers differ.
            .with_field_manager(format!("{CONTROLLER_NAME}-lease-{}", args.identity))
            .build()
    };
    let Some(manager) = until_it_works("set up leader election", set_up, SETUP_RETRY, &shutdown).await else {
        return Ok(());
    };
    let (mut leading, lease_task) = manager.watch().await;
    let observer = tokio::spawn(observe_renewals(
        Api::namespaced(client, &args.lease_namespace),
        args.lease_name.clone(),
        args.identity.clone(),
        Duration::from_secs(args.lease_duration_seconds).saturating_sub(fence::MARGIN),
        fence.clone(),
    ));
    health.probes.set_ready(true); // a standby is ready: it serves and waits
    tracing::info!(lease = %format!("{}/{}", args.lease_namespace, args.lease_name), identity = %args.identity, "waiting for leadership");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = leading.wait_for(|is_leader| *is_leader) => if changed.is_err() { break },
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            () = fence.held(FENCE_POLL) => {}
            changed = leading.wait_for(|is_leader| !*is_leader) => if changed.is_err() { break } else { continue },
        }
        tracing::info!(identity = %args.identity, "became leader");
        metrics.leader.set(1);
        let (stop, abandon) = (shutdown.child_token(), Shutdown::new());
        let task = tokio::spawn(run_controller(
            ctx.clone(),
            args.watch_namespace.clone(),
            args.concurrency,
            health.clone(),
            stop.clone(),
            abandon.clone(),
        ));
        let lost = tokio::select! {
            _ = shutdown.cancelled() => None,
            changed = leading.wait_for(|is_leader| !*is_leader) => Some(if changed.is_ok() {
                "another replica holds the Lease"
            } else {
                "leader election stopped"
            }),
            () = fence.lost() => Some("its own renewal of the Lease was not seen in time"),
        };
        match lost {
            None => stop.cancel(),
            Some(_) => abandon.cancel(),
        }
        let _ = task.await;
        metrics.leader.set(0);
        health.probes.set_ready(true);
        let Some(why) = lost else { break };
        tracing::warn!(identity = %args.identity, "stopped leading: {why}; reconciles in flight dropped");
    }
    observer.abort();
    drop(leading);
    release(lease_task).await;
    Ok(())
}

/// First and longest wait between attempts to set leader election up.
const SETUP_RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// Runs `attempt` until it works, waiting `first` doubling to `longest` between tries, as
/// client-go's leader election does: a replica started while the API server restarts (refused
/// connections, or a 403 before its authorizer has synced) waits for it instead of exiting.
/// `None` on shutdown.
async fn until_it_works<T, E, F, Fut>(
    what: &str,
    mut attempt: F,
    (first, longest): (Duration, Duration),
    shutdown: &Shutdown,
) -> Option<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut wait = first;
    loop {
        match attempt().await {
            Ok(done) => return Some(done),
            Err(err) => tracing::warn!(error = %err, "cannot {what}; trying again in {wait:?}"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(longest);
    }
}

/// Ends leader election, handing the Lease back so the next leader need not wait it out.
async fn release(lease_task: LeaseTask) {
    match lease_task.await {
        Ok(Ok(manager)) => {
            if let Err(err) = manager.release().await {
                tracing::warn!(error = %err, "cannot release the lease; the next leader waits for it to expire");
            }
        }
        Ok(Err(err)) => tracing::warn!(error = %err, "leader election ended with an error"),
        Err(err) => tracing::warn!(error = %err, "leader election task failed"),
    }
}

type LeaseTask = tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>;

/// How often a replica that the lease manager calls leader checks whether its renewal was seen.
const FENCE_POLL: Duration = Duration::from_millis(100);

/// Watches the Lease and extends `fence` by `valid_for` from each renewal by `identity` seen as it
/// happens. What the first listing (or a relisting after the watch broke) shows is only a
/// baseline: when it was written is not known, so it proves nothing about now.
async fn observe_renewals(leases: Api<Lease>, name: String, identity: String, valid_for: Duration, fence: Fence) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher(leases, config).backoff(watch_backoff());
    futures::pin_mut!(events);
    let mut last_renewal = None;
    while let Some(event) = events.next().await {
        let (lease, live) = match event {
            Ok(watcher::Event::Apply(lease)) => (lease, true),
            Ok(watcher::Event::InitApply(lease)) => (lease, false),
            Ok(watcher::Event::Delete(_)) => {
                fence.revoke();
                continue;
            }
            Ok(_) => continue,
            // The watcher retries with back-off; meanwhile the fence runs out by itself.
            Err(err) => {
                tracing::debug!(error = %err, "watch of the leader Lease interrupted");
                continue;
            }
        };
        let spec = lease.spec.unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(identity.as_str()) {
            fence.revoke();
        } else if live && spec.renew_time.is_some() && spec.renew_time != last_renewal {
            fence.renewed(tokio::time::Instant::now(), valid_for);
        }
        last_renewal = spec.renew_time;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn setting_up_is_tried_again_until_it_works() {
        let tries = std::sync::atomic::AtomicU32::new(0);
        let attempt = || {
            let n = tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { if n < 2 { Err("connection refused") } else { Ok(n) } }
        };
        let quick = (Duration::from_millis(1), Duration::from_millis(4));
        let shutdown = Shutdown::new();
        assert_eq!(until_it_works("test", attempt, quick, &shutdown).await, Some(2));
        let never = || async { Err::<(), _>("forbidden") };
        shutdown.cancel();
        assert_eq!(
            until_it_works("test", never, quick, &shutdown).await,
            None,
            "ends on shutdown"
        );
    }
}
