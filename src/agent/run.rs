//! The agent's loop: wake on a DRBD change (events2), a Kubernetes change, a fail-over timer that
//! expires, or the periodic safety-net intervals; read, decide, act. [`run`] wires the parts,
//! [`Rounds`] turns the loop.

use crate::sharedvolume::filters::Filters;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::Client;
use prometheus::{IntGauge, Registry};

use super::act::{Executor, ExecutorSettings, Scope};
use super::action::Action;
use super::cache::Cache;
use super::decide::{self, DecisionSettings};
use super::drbd::DrbdState;
use super::drbd_book::DrbdBook;
use super::freshness::Freshness;
use super::guard::FailOverGuard;
use super::hand_over::HandOverRequests;
use super::heartbeat::Heartbeat;
use super::locality::Locality;
use super::observe::{Snapshot, observe};
use super::peers::{PeerReads, peer_leases};
use super::promoter::{PromoterSettings, PromoterSnippets};
use super::read_bound::ReadBound;
use super::renewal_watch::RenewalWatch;
use super::reporter::Reporter;
use super::server_probes::ServerProbes;
use super::source::{DrbdChange, DrbdSetup, DrbdSource};
use super::view::{Observed, Timers};
use crate::admin::Probes;
use crate::cli::{AgentArgs, DrainPolicy};
use crate::core_endpoints::EndpointsAnswer;
use crate::events::{EventSettings, EventSink};
use crate::metrics::AgentMetrics;
use crate::names::AGENT_NAME;
use crate::shutdown::Shutdown;

/// This node's heartbeat, as the flags set it. One renewed less often than three times per Lease
/// could expire between renewals: refused.
fn heartbeat(args: &AgentArgs, client: &Client, timeout: Duration) -> Result<Heartbeat> {
    let (interval, duration) = (args.heartbeat_interval.as_secs(), args.lease_duration_seconds);
    anyhow::ensure!(
        interval * 3 <= u64::from(duration),
        "--heartbeat-interval {interval}s is over a third of --lease-duration-seconds {duration}: shorten the interval or lengthen the Lease"
    );
    let renewal = (duration, *args.heartbeat_interval);
    Ok(Heartbeat::new(
        client.clone(),
        &args.lease_namespace,
        &args.node_name,
        renewal,
        timeout,
    ))
}

pub async fn run(
    args: AgentArgs,
    client: Client,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
    event_settings: EventSettings,
) -> Result<()> {
    let metrics = AgentMetrics::register(&registry)?;
    metrics.zero(&Action::KINDS);
    metrics.dry_run.set(i64::from(args.dry_run));
    let timeout = *args.operations_timeout;
    let drbd = drbdsetup(&args);
    let freshness = Freshness::new(*args.drbd_status_interval, timeout);
    probes.set_liveness_check({
        let freshness = freshness.clone();
        move || freshness.check().map_err(|stale| stale.to_string())
    });
    let heartbeat = heartbeat(&args, &client, timeout)?;
    let heartbeat_task = tokio::spawn(
        heartbeat
            .clone()
            .run(shutdown.clone(), metrics.heartbeat_renewed.clone()),
    );
    let satellite_namespace = satellite_namespace(&args);
    log_start(&args, satellite_namespace);
    let Some(write_endpoints) = EndpointsAnswer::resolve(args.write_endpoints, &client, &shutdown).await else {
        return Ok(());
    };

    let locality = Locality::default();
    let mut book = DrbdBook::new(
        drbd,
        metrics.clone(),
        freshness.clone(),
        *args.drbd_status_interval,
        locality.clone(),
    );
    // The node's resources before the cache's first list, so that it is the only one (after a
    // failed read, the first round's read asks for another).
    book.bring_up_to_date().await;
    let (cache, mut kube_changes) = Cache::start(
        &client,
        &args.node_name,
        (satellite_namespace, &args.satellite_pod_label),
        &args.lease_namespace,
        &locality,
        &metrics.node.watch_events,
    );
    let drbd_changes = book.source().changes();
    if !synced(&cache, &mut kube_changes, &shutdown).await {
        return Ok(());
    }
    tracing::info!("Kubernetes caches synced");
    heartbeat.api.answered();
    let events = EventSink::new(client.clone(), AGENT_NAME, Some(args.node_name.clone()))
        .with_timeout(timeout)
        .with(event_settings);
    let executor_settings = executor_settings(&args, write_endpoints);
    let rounds = Rounds::new(
        &args,
        executor_settings,
        client,
        book,
        heartbeat,
        metrics,
        events,
        probes,
    );
    rounds.run(&cache, kube_changes, drbd_changes, &shutdown).await;
    let _ = heartbeat_task.await;
    tracing::info!(node = %args.node_name, "agent stopped");
    Ok(())
}

/// The node's `drbdsetup`, each command bounded by the operations timeout and each read by a
/// bound that adapts to the node.
fn drbdsetup(args: &AgentArgs) -> Arc<dyn DrbdSource> {
    Arc::new(DrbdSetup {
        binary: args.drbdsetup_path.clone(),
        proc_path: args.drbd_proc_path.clone(),
        timeout: *args.operations_timeout,
        read_bound: ReadBound::new(*args.drbd_status_interval, *args.operations_timeout),
    })
}

/// Where the LINSTOR satellite pods run: `--satellite-namespace`, else the agent's own.
fn satellite_namespace(args: &AgentArgs) -> &str {
    args.satellite_namespace
        .as_deref()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or(&args.lease_namespace)
}

fn log_start(args: &AgentArgs, satellite_namespace: &str) {
    tracing::info!(
        node = %args.node_name,
        satellite_namespace,
        dry_run = args.dry_run,
        drbd_status_interval = %args.drbd_status_interval,
        fail_over_timeout = %args.fail_over_timeout,
        operations_timeout = %args.operations_timeout,
        reconcile_interval = %args.reconcile_interval,
        resync_interval = %args.resync_interval,
        grace_period_seconds = args.grace_period_seconds,
        "agent starting"
    );
}

/// The loop's parts and what it carries from one round to the next.
struct Rounds {
    node: String,
    node_ip: Option<std::net::IpAddr>,
    client: Client,
    heartbeat: Heartbeat,
    executor: Executor,
    metrics: AgentMetrics,
    /// Readiness: a DRBD state fresh enough to act on (liveness is the book's freshness).
    probes: Probes,
    settings: DecisionSettings,
    /// Which volumes this agent may publish (`--storage-class`, `--csi-driver`).
    publishable: Filters,
    status_interval: Duration,
    reconcile_interval: Duration,
    resync_interval: Duration,
    timeout: Duration,
    timers: Timers,
    /// What is known of the node's DRBD state, and when it is read next.
    drbd: DrbdBook,
    /// States this node's DRBD view on its report Lease, from a task of its own.
    reporter: Reporter,
    next_resync: Instant,
    promoter: Option<PromoterSnippets>,
    /// The requests that drbd-reactor hand this node's primaries over while it drains.
    hand_overs: Option<HandOverRequests>,
    /// Each publication's NFS server answers before it goes out (`--nfs-probe`).
    servers: ServerProbes,
    /// The DRBD peers' kubelet and agent Leases, watched: their renewals as this agent sees them.
    renewals: RenewalWatch,
    /// Where the agents' heartbeat Leases are.
    lease_namespace: String,
}

impl Rounds {
    #[allow(clippy::too_many_arguments)]
    fn new(
        args: &AgentArgs,
        executor_settings: ExecutorSettings,
        client: Client,
        drbd: DrbdBook,
        heartbeat: Heartbeat,
        metrics: AgentMetrics,
        events: EventSink,
        probes: Probes,
    ) -> Self {
        let timeout = *args.operations_timeout;
        let guard = FailOverGuard::new(
            &client,
            &args.lease_namespace,
            &args.node_selector,
            args.max_tainted_fraction,
            timeout,
        )
        .with_clock(heartbeat.clock.clone());
        let not_answering = metrics.nfs_servers_not_answering.clone();
        let executor = Executor::new(
            client.clone(),
            drbd.source(),
            events,
            metrics.clone(),
            executor_settings,
            Some(guard),
        );
        let renewals = RenewalWatch::new(client.clone(), heartbeat.clock.clone());
        Self {
            node: args.node_name.clone(),
            node_ip: args.node_ip,
            client,
            executor,
            metrics,
            probes,
            settings: decision_settings(args),
            publishable: Filters {
                storage_classes: args.storage_class.clone(),
                csi_drivers: args.csi_driver.clone(),
            },
            status_interval: *args.drbd_status_interval,
            reconcile_interval: *args.reconcile_interval,
            resync_interval: *args.resync_interval,
            timeout,
            timers: Timers::new(),
            drbd,
            reporter: Reporter::spawn(heartbeat.clone()),
            heartbeat,
            next_resync: Instant::now() + *args.resync_interval,
            servers: ServerProbes::new(args, not_answering),
            renewals,
            lease_namespace: args.lease_namespace.clone(),
            hand_overs: args.promoter_snippets_dir.as_deref().map(HandOverRequests::new),
            promoter: args.promoter_snippets_dir.clone().map(|dir| {
                PromoterSnippets::new(PromoterSettings {
                    dir,
                    start: args.promoter_start.clone(),
                    nfs_port: args.nfs_port,
                    dependencies_as: args.promoter_dependencies_as.clone(),
                    target_as: args.promoter_target_as.clone(),
                    demote_failure: args.promoter_demote_failure.clone(),
                    adjust_on_start: args.promoter_adjust_on_start,
                })
            }),
        }
    }

    async fn run(
        mut self,
        cache: &Cache,
        mut kube_changes: BoxStream<'static, ()>,
        mut drbd_changes: BoxStream<'static, DrbdChange>,
        shutdown: &Shutdown,
    ) {
        loop {
            // A round that waits (a hung drbdsetup, a slow API server) must not keep the agent
            // from stopping: what it has not done yet is the next agent's, which decides afresh.
            let round = async {
                self.drbd.bring_up_to_date().await;
                self.round_reporting(cache, &mut drbd_changes).await
            };
            let changes = tokio::select! {
                changes = round => changes,
                _ = shutdown.cancelled() => {
                    tracing::info!("stopping in the middle of a round; what it had not done is left to the next start");
                    break;
                }
            };
            for change in changes {
                self.drbd.heard(change);
            }
            let wake = next_wake(
                [
                    Some(self.drbd.next_read()),
                    self.promoter.as_ref().and_then(PromoterSnippets::nudge_at),
                ],
                &self.timers,
                &self.settings,
                self.reconcile_interval,
            );
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(change) = drbd_changes.next() => self.drbd.heard(change),
                // A burst of Kubernetes changes makes one round, not one each; a DRBD change does
                // not wait for the burst to end.
                Some(()) = kube_changes.next() => tokio::select! {
                    Some(change) = drbd_changes.next() => self.drbd.heard(change),
                    _ = tokio::time::sleep(KUBE_DEBOUNCE) => {}
                },
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
            // Take every change that is already waiting in this one round.
            while let Some(Some(change)) = drbd_changes.next().now_or_never() {
                self.drbd.heard(change);
            }
            while let Some(Some(())) = kube_changes.next().now_or_never() {}
        }
    }

    /// One round, while every DRBD change events2 describes meanwhile is stated at once (a round
    /// that waits on the API server must not keep this node's report from its peers); the changes
    /// are returned for the book to take in after the round. Only a change read whole after the
    /// state the round starts from is stated: one from before it is older than that state.
    async fn round_reporting(
        &mut self,
        cache: &Cache,
        drbd_changes: &mut BoxStream<'static, DrbdChange>,
    ) -> Vec<DrbdChange> {
        let reporter = self.reporter.clone();
        let taken_at = self.drbd.taken_at();
        let mut heard = Vec::new();
        let round = self.round(cache);
        tokio::pin!(round);
        loop {
            tokio::select! {
                biased;
                () = &mut round => return heard,
                Some(change) = drbd_changes.next() => {
                    if let DrbdChange::State { resources, at, .. } = &change
                        && taken_at.is_none_or(|taken| *at > taken)
                    {
                        reporter.state(resources);
                    }
                    heard.push(change);
                }
            }
        }
    }

    /// The steps other than publications. A destructive one decided over quorum settings not read
    /// in this round is decided again over a fresh read (none at all if that read fails): no
    /// safety margin rests on a cached `drbdsetup show`.
    async fn fresh_steps(&mut self, mut observed: Observed) -> (Observed, Vec<Action>) {
        let now = Instant::now();
        let actions = decide::steps(&observed, &self.settings, &mut self.timers, now);
        if self.drbd.quorum_read() || !actions.iter().any(Action::is_destructive) {
            return (observed, actions);
        }
        let Some(shown) = self.drbd.read_settings_again().await else {
            let safe = actions.into_iter().filter(|a| !a.is_destructive()).collect();
            return (observed, safe);
        };
        observed.drbd = DrbdState::new(std::mem::take(&mut observed.drbd.resources), shown);
        let actions = decide::steps(&observed, &self.settings, &mut self.timers, now);
        (observed, actions)
    }

    /// One round over a DRBD state fresh enough to act on: observe, decide, act, report.
    async fn round(&mut self, cache: &Cache) {
        let usable_for = self.status_interval + self.timeout;
        let fresh = self.drbd.fresh(usable_for);
        self.probes.set_ready(fresh.is_some());
        let Some((state, read_at)) = fresh else { return };
        // The report (evidence for the peers) goes out at once, from the reporter's task: a write
        // the API server does not take tells the rounds, like a failed read, that the peers
        // cannot be heard (the heartbeat's API health).
        self.reporter.state(&state.resources);
        let state = &state;
        if !self.drbd.volumes_listed() {
            // A resource new here may have its PV and attachments still on their way: deciding
            // without them could take a volume in use for an unused one.
            tracing::debug!("waiting for the PVs and attachments of this node's resources to be listed");
            return;
        }
        let snapshot = cache.snapshot();
        self.record_cached(&snapshot);
        // Publications first, from the cache alone: they wait for nothing about the peers.
        let cached = observe(&self.node, self.node_ip, state.clone(), &snapshot, &self.publishable);
        let piraeus_here = i64::try_from(cached.piraeus_ha_controllers.len()).unwrap_or(i64::MAX);
        self.metrics.node.piraeus_ha_controllers.set(piraeus_here);
        self.sync_promoter_snippets(&cached).await;
        let now = Instant::now();
        let mut publications = decide::publications(&cached, &self.settings, &mut self.timers, now);
        let held = i64::try_from(self.timers.held_publications.len()).unwrap_or(i64::MAX);
        self.metrics.publications_held.set(held);
        if now >= self.next_resync {
            publications.extend(decide::republish(&cached, &self.settings, &self.timers, now));
            self.next_resync = now + self.resync_interval;
        }
        let publications = self
            .servers
            .gate(&cached, &self.settings, &mut self.timers, publications, now)
            .await;
        if !publications.is_empty() {
            tracing::debug!(?publications, "decided");
        }
        self.renewals
            .follow(&peer_leases(&self.node, state, &snapshot, &self.lease_namespace));
        let reads = PeerReads {
            client: &self.client,
            leases: &self.heartbeat.leases,
            timeout: self.timeout,
            api: &self.heartbeat.api,
            clock: &self.heartbeat.clock,
            renewals: &self.renewals,
            lease_namespace: &self.lease_namespace,
        };
        let no_nodes = BTreeSet::new();
        let (mut observed, ()) = tokio::join!(
            reads.observe(&self.node, self.node_ip, state, snapshot, &self.publishable),
            self.executor.run(Scope::Publications, publications, read_at, &no_nodes),
        );
        observed.api_answering_since = self.heartbeat.api.answering_since();
        let (observed, actions) = self.fresh_steps(observed).await;
        self.executor
            .record_fail_overs_done(self.timers.fail_overs_done.drain(..));
        if !actions.is_empty() {
            tracing::debug!(?actions, "decided");
        }
        let storage_nodes = observed.storage_nodes();
        self.executor.run(Scope::Steps, actions, read_at, &storage_nodes).await;
    }

    fn record_cached(&self, snapshot: &Snapshot) {
        let kinds = [
            ("pvs", snapshot.pvs.len()),
            ("pods", snapshot.pods.len()),
            ("attachments", snapshot.attachments.len()),
            ("nodes", snapshot.nodes.len()),
            ("satellites", snapshot.satellites.len()),
            ("leases", snapshot.leases.len()),
        ];
        for (kind, held) in kinds {
            let held = i64::try_from(held).unwrap_or(i64::MAX);
            self.metrics.node.cached_objects.with_label_values(&[kind]).set(held);
        }
    }

    /// Brings drbd-reactor's snippets up to date with the cached view (`--promoter-snippets-dir`).
    async fn sync_promoter_snippets(&mut self, observed: &Observed) {
        let Some(promoter) = self.promoter.as_mut() else { return };
        let held = promoter.sync(&observed.volumes, &observed.drbd, Instant::now()).await;
        let node = &self.metrics.node;
        self.record_sync(held, &node.promoter_snippets, "drbd-reactor's promoter snippets");
        let Some(hand_overs) = self.hand_overs.as_ref() else {
            return;
        };
        let wanted = decide::promoter_hand_overs(observed, &self.settings);
        let asked = hand_overs.sync(&wanted).await;
        self.record_sync(
            asked,
            &node.promoter_hand_overs,
            "the hand-over requests to drbd-reactor",
        );
    }

    /// Sets `gauge` to how many files of `what` a sync of the snippets directory left there, or
    /// counts and says its failure.
    fn record_sync(&self, synced: std::io::Result<usize>, gauge: &IntGauge, what: &str) {
        match synced {
            Ok(files) => gauge.set(i64::try_from(files).unwrap_or(i64::MAX)),
            Err(error) => {
                self.metrics.node.promoter_snippet_failures.inc();
                tracing::warn!(%error, "could not bring {what} up to date; tried again next round (is the snippets directory mounted and writable?)");
            }
        }
    }
}

/// How often a kubelet posts its Node's status (`nodeStatusUpdateFrequency`, 10 s by default):
/// after a control-plane outage, within this a healthy node is Ready again.
const KUBELET_STATUS_PERIOD: Duration = Duration::from_secs(10);

fn decision_settings(args: &AgentArgs) -> DecisionSettings {
    DecisionSettings {
        fail_over_timeout: *args.fail_over_timeout,
        fail_over_unsafe_pods: args.fail_over_unsafe_pods,
        disable_node_taints: args.disable_node_taints,
        max_tainted_fraction: args.max_tainted_fraction,
        nfs_port: args.nfs_port,
        evacuate_taint: (args.node_drain_policy == DrainPolicy::Evacuate).then(|| args.evacuate_taint.clone()),
        peers_restate_within: *args.fail_over_timeout + *args.reconcile_interval,
        report_interval: *args.reconcile_interval,
        not_ready_counts_after: *args.fail_over_timeout + *args.reconcile_interval + KUBELET_STATUS_PERIOD,
    }
}

fn executor_settings(args: &AgentArgs, write_endpoints: EndpointsAnswer) -> ExecutorSettings {
    ExecutorSettings {
        node: args.node_name.clone(),
        dry_run: args.dry_run,
        grace_period_seconds: args.grace_period_seconds,
        operations_timeout: *args.operations_timeout,
        cooldown: *args.operations_timeout,
        max_concurrent_publications: args.max_concurrent_publications.into(),
        min_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(120),
        max_state_age: 2 * *args.drbd_status_interval,
        write_endpoints,
    }
}

/// Kubernetes changes arriving within this time of each other make one round.
const KUBE_DEBOUNCE: Duration = Duration::from_millis(100);

/// Drives the reflectors until every cache has listed its objects; false on shutdown first.
async fn synced(cache: &Cache, changes: &mut BoxStream<'static, ()>, shutdown: &Shutdown) -> bool {
    let synced = cache.synced();
    tokio::pin!(synced);
    loop {
        tokio::select! {
            _ = &mut synced => return true,
            _ = changes.next() => {}
            _ = shutdown.cancelled() => return false,
        }
    }
}

/// The next time something is due without any change: the DRBD safety-net read, the
/// reconcile interval, or the earliest fail-over timer still to expire (an expired one, whose
/// peer stays away, is the reconcile interval's business).
/// The next round: the earliest of `due` (the next DRBD read, drbd-reactor's reload nudge), the
/// timers' next deadline and the reconcile interval, and never sooner than 10 ms from now.
fn next_wake(
    due: impl IntoIterator<Item = Option<Instant>>,
    timers: &Timers,
    settings: &DecisionSettings,
    reconcile_interval: Duration,
) -> Instant {
    let now = Instant::now();
    let next_timer = timers
        .deadlines(settings.fail_over_timeout, settings.not_ready_counts_after)
        .filter(|deadline| *deadline > now)
        .min();
    due.into_iter()
        .chain([Some(now + reconcile_interval), next_timer])
        .flatten()
        .min()
        .unwrap_or(now)
        .max(now + Duration::from_millis(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_timers_do_not_make_the_loop_spin() {
        let settings = DecisionSettings::for_tests();
        let now = Instant::now();
        let next_read = now + Duration::from_secs(5);
        let reconcile = Duration::from_secs(10);
        let timers = |started| Timers {
            fail_over: [(("r".to_string(), "p".to_string()), started)].into(),
            ..Timers::new()
        };
        let expired = timers(now - Duration::from_secs(60));
        assert!(next_wake([Some(next_read)], &expired, &settings, reconcile) >= next_read);
        let running = timers(now - Duration::from_secs(3));
        assert!(next_wake([Some(next_read)], &running, &settings, reconcile) < now + Duration::from_secs(3));
    }
}
