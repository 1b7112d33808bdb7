//! The loop of one replica while it serves: the kube-runtime Controller over claims and the objects
//! it owns, the caches reconciles read, readiness once claims are cached, and the liveness probe
//! through the controller's own queue.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::cache::{Caches, NoDelay, until_ready};
use super::context::Context;
use super::outcome::ReconcileError;
use super::reconcile;
use super::watchdog::{self, PROBE_NAME, Watchdog};
use crate::admin::Probes;
use crate::metrics::set_to_now;
use crate::names::managed_selector;
use crate::sharedvolume::claim::bound_claim;
use crate::shutdown::Shutdown;
use crate::volume::ClaimKey;

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
    let pvs = caches.pvs.clone();
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
        .watches_stream(triggers.linstor_slices, move |slice| {
            pvs.get(None, &slice.name_any()).and_then(claim_of_volume)
        })
        .with_config(controller::Config::default().concurrency(concurrency))
        .trigger_backoff(NoDelay)
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
    if !until_ready(|| async { store.wait_until_ready().await.is_ok() }).await {
        return;
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

/// A PV change is a change of the claim it is bound to. So is a change of the slice LINSTOR CSI
/// advertises a volume's server with: it is named after the resource, which LINSTOR CSI names
/// after the PV.
fn claim_of_volume(pv: PersistentVolume) -> Option<ObjectRef<PersistentVolumeClaim>> {
    let claim = bound_claim(&pv)?;
    Some(ObjectRef::new(&claim.name).within(&claim.namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use k8s_openapi::api::core::v1::Service;
    use kube::runtime::controller::Action;
    use kube::runtime::reflector;
    use std::time::Duration;

    /// After an API server restart every watch fails for a while, each retrying on its own
    /// back-off. A claim another watch brings meanwhile reaches the reconciler at once: the
    /// failing watch's errors hold back no other watch's triggers.
    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_holds_back_no_other_watchs_trigger() {
        let (claims, mut writer) = reflector::store::<PersistentVolumeClaim>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let failing = stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Some((Err::<Service, _>(watcher::Error::NoResourceVersion), ()))
        });
        let claim_arrives = Duration::from_secs(3);
        let claim = PersistentVolumeClaim {
            metadata: kube::api::ObjectMeta {
                name: Some("data".into()),
                namespace: Some("apps".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let healthy = stream::once(async move {
            tokio::time::sleep(claim_arrives).await;
            Ok(claim)
        })
        .chain(stream::pending());
        let start = tokio::time::Instant::now();
        let mut results = Controller::for_stream(healthy, claims)
            .owns_stream(failing)
            .trigger_backoff(NoDelay)
            .run(
                |_, _: Arc<()>| async { Ok::<_, std::io::Error>(Action::await_change()) },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            )
            .boxed();
        // The claim is not in the store: the applier answers its trigger with ObjectNotFound.
        let reached = loop {
            match results.next().await.expect("the controller runs") {
                Err(controller::Error::ObjectNotFound(object)) if object.name == "data" => break start.elapsed(),
                _ => continue,
            }
        };
        assert!(
            reached < claim_arrives + Duration::from_millis(200),
            "the claim's trigger reached the reconciler {:?} after it arrived",
            reached - claim_arrives
        );
    }
}
