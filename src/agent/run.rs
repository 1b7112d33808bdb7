//! The agent's loop: wake on a DRBD change (events2), a Kubernetes change, a fail-over timer that
//! expires, or the periodic safety-net intervals; read, decide, act.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};
use prometheus::Registry;

use super::act::{Executor, ExecutorSettings};
use super::action::Action;
use super::cache::Cache;
use super::decide::{self, DecisionSettings};
use super::drbd::DrbdState;
use super::guard::FailOverGuard;
use super::heartbeat::{Heartbeat, renewing};
use super::observe::{Snapshot, node_view, observe, suspected_peers, trim_pod};
use super::report::Report;
use super::source::{DrbdSetup, DrbdSource};
use super::view::{Observed, Timers};
use crate::admin::Probes;
use crate::cli::{AgentArgs, DrainPolicy};
use crate::events::EventSink;
use crate::metrics::{AgentMetrics, set_to_now};
use crate::names::AGENT_NAME;
use crate::shutdown::Shutdown;

pub async fn run(
    args: AgentArgs,
    client: Client,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
) -> Result<()> {
    let metrics = AgentMetrics::register(&registry)?;
    let timeout = *args.operations_timeout;
    let drbd: Arc<dyn DrbdSource> = Arc::new(DrbdSetup {
        binary: args.drbdsetup_path.clone(),
        proc_path: args.drbd_proc_path.clone(),
        timeout,
    });
    let settings = decision_settings(&args);
    let events = EventSink::new(client.clone(), AGENT_NAME, Some(args.node_name.clone())).with_timeout(timeout);
    let guard = FailOverGuard::new(
        &client,
        &args.lease_namespace,
        &args.node_selector,
        args.max_tainted_fraction,
        timeout,
    );
    let mut executor = Executor::new(
        client.clone(),
        drbd.clone(),
        events,
        metrics.clone(),
        executor_settings(&args),
        Some(guard),
    );
    let freshness = Freshness::new(*args.drbd_status_interval, timeout);
    probes.set_liveness_check({
        let freshness = freshness.clone();
        move || freshness.check()
    });
    metrics.zero(&Action::KINDS);
    metrics.dry_run.set(i64::from(args.dry_run));
    let heartbeat = Heartbeat::new(
        client.clone(),
        &args.lease_namespace,
        &args.node_name,
        args.lease_duration_seconds,
        timeout,
    );
    let heartbeat_task = tokio::spawn(
        heartbeat
            .clone()
            .run(shutdown.clone(), metrics.heartbeat_renewed.clone()),
    );
    let satellite_namespace = args
        .satellite_namespace
        .as_deref()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or(&args.lease_namespace);
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

    let (cache, mut kube_changes) = Cache::start(
        &client,
        &args.node_name,
        (satellite_namespace, &args.satellite_pod_label),
        &args.lease_namespace,
        &metrics.watch_events,
    );
    let mut drbd_changes = drbd.changes();
    if !synced(&cache, &mut kube_changes, &shutdown).await {
        return Ok(());
    }
    tracing::info!("Kubernetes caches synced");

    let node_ip = args.node_ip;
    let usable_for = *args.drbd_status_interval + timeout;
    let mut timers = Timers::new();
    let mut drbd_state: Option<(DrbdState, Instant)> = None;
    let mut reported: Option<Report> = None;
    let mut drbd_due = true;
    // Scheduled from the last attempt, not the last success: a failing drbdsetup is retried at
    // the status interval, not in a tight loop.
    let mut next_read = Instant::now();
    let mut next_resync = Instant::now() + *args.resync_interval;
    loop {
        if drbd_due || Instant::now() >= next_read {
            next_read = Instant::now() + *args.drbd_status_interval;
            let read = {
                let _timer = metrics.drbd_read.start_timer();
                drbd.read().await
            };
            match read {
                Ok(state) => {
                    record_resources(&metrics, &state);
                    freshness.mark_read();
                    set_to_now(&metrics.drbd_last_read);
                    drbd_state = Some((state, Instant::now()));
                }
                Err(err) => {
                    // A failed read leaves no state to act on: what was read before may be
                    // exactly what changed.
                    metrics.drbd_read_errors.inc();
                    drbd_state = None;
                    tracing::warn!(error = %err, "cannot read DRBD state; no action until a read succeeds");
                }
            }
            drbd_due = false;
        }
        let fresh = drbd_state
            .as_ref()
            .filter(|(_, read_at)| read_at.elapsed() <= usable_for);
        probes.set_ready(fresh.is_some());
        if let Some((state, read_at)) = fresh {
            let mut snapshot = cache.snapshot();
            let suspects = suspected_peers(&args.node_name, state, &snapshot);
            let unreadable = read_peer_pods(&client, &suspects, &mut snapshot, timeout).await;
            let mut observed = observe(&args.node_name, node_ip, state.clone(), &snapshot);
            if !suspects.is_empty() {
                add_uncached_peers(&client, &mut observed, &suspects, timeout).await;
                confirm_alive(&heartbeat.leases, &mut observed, &suspects, timeout).await;
                for node in unreadable {
                    observed.nodes.remove(&node);
                }
            }
            let now = Instant::now();
            let mut actions = decide::decide(&observed, &settings, &mut timers, now);
            if now >= next_resync {
                actions.extend(decide::republish(&observed, &settings));
                next_resync = now + *args.resync_interval;
            }
            if !actions.is_empty() {
                tracing::debug!(?actions, "decided");
            }
            // The report (evidence for the peers) and the actions do not wait for each other.
            let storage_nodes = observed.storage_nodes();
            let (stated, ()) = tokio::join!(
                report(&heartbeat, state, reported.take()),
                executor.run(actions, *read_at, &storage_nodes)
            );
            reported = stated;
        }

        let wake = next_wake(next_read, &timers, &settings, *args.reconcile_interval);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(()) = drbd_changes.next() => drbd_due = true,
            // A burst of Kubernetes changes makes one round, not one each; a DRBD change does
            // not wait for the burst to end.
            Some(()) = kube_changes.next() => tokio::select! {
                Some(()) = drbd_changes.next() => drbd_due = true,
                _ = tokio::time::sleep(KUBE_DEBOUNCE) => {}
            },
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        // Take every change that is already waiting in this one round.
        while let Some(Some(())) = drbd_changes.next().now_or_never() {
            drbd_due = true;
        }
        while let Some(Some(())) = kube_changes.next().now_or_never() {}
    }
    let _ = heartbeat_task.await;
    tracing::info!(node = %args.node_name, "agent stopped");
    Ok(())
}

/// States this node's DRBD view on its heartbeat Lease when it changed; returns what is stated
/// now (a failed write is tried again next round).
async fn report(heartbeat: &Heartbeat, state: &DrbdState, reported: Option<Report>) -> Option<Report> {
    let mut report = Report::of(state);
    if reported.as_ref().is_some_and(|r| r.same_view(&report)) {
        return reported;
    }
    report.at = Timestamp::now().to_string();
    match heartbeat.publish(&report).await {
        Ok(()) => Some(report),
        Err(err) => {
            tracing::warn!(error = %err, "cannot state this node's DRBD view on its heartbeat Lease");
            reported
        }
    }
}

/// Reads fresh the pods on suspected peers' nodes (the cache holds this node's only) into the
/// snapshot. Returns the nodes whose pods could not be read: without knowing what runs there,
/// nothing may be done to them this round.
async fn read_peer_pods(
    client: &Client,
    suspects: &BTreeSet<String>,
    snapshot: &mut Snapshot,
    timeout: Duration,
) -> BTreeSet<String> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut unreadable = BTreeSet::new();
    for node in suspects {
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        match tokio::time::timeout(timeout, pods.list(&on_node)).await {
            Ok(Ok(list)) => snapshot.pods.extend(list.items.into_iter().map(|mut pod| {
                trim_pod(&mut pod);
                Arc::new(pod)
            })),
            Ok(Err(err)) => {
                tracing::warn!(node = %node, error = %err, "cannot read the pods of a suspected peer's node");
                unreadable.insert(node.clone());
            }
            Err(_) => {
                tracing::warn!(node = %node, "cannot read the pods of a suspected peer's node: timed out");
                unreadable.insert(node.clone());
            }
        }
    }
    unreadable
}

/// Reads fresh the heartbeats of the agents whose reports may weigh on a suspected peer (the
/// suspects' own, and those of the nodes that report on the same resources) and counts their
/// reports only while they renew. Heartbeats are not watched: renewed all the time by every
/// agent, they would make each agent's watch traffic grow with the square of the cluster.
async fn confirm_alive(leases: &Api<Lease>, observed: &mut Observed, suspects: &BTreeSet<String>, timeout: Duration) {
    let resources: BTreeSet<&str> = observed
        .drbd
        .resources
        .iter()
        .filter(|r| r.connections.iter().any(|c| !c.is_connected()))
        .map(|r| r.name.as_str())
        .collect();
    let relevant: Vec<String> = observed
        .reports
        .iter()
        .filter(|(node, _)| **node != observed.node)
        .filter(|(node, r)| {
            suspects.contains(*node) || r.report.resources.keys().any(|k| resources.contains(k.as_str()))
        })
        .map(|(node, _)| node.clone())
        .collect();
    let now = Timestamp::now();
    let checks = relevant.iter().map(|node| renewing(leases, node, now, timeout));
    let renewing = futures::future::join_all(checks).await;
    for (node, alive) in relevant.iter().zip(renewing) {
        if let (Some(report), Some(alive)) = (observed.reports.get_mut(node), alive) {
            report.alive = alive;
        }
    }
}

/// Reads fresh the Nodes of suspected peers (the cache holds this node's only): each is judged
/// by what it is now, never taken for NotReady for want of a look. A node that does not exist
/// stays unknown, and nothing is done to it.
async fn add_uncached_peers(client: &Client, observed: &mut Observed, suspects: &BTreeSet<String>, timeout: Duration) {
    let missing: Vec<&String> = suspects
        .iter()
        .filter(|node| !observed.nodes.contains_key(*node))
        .collect();
    let nodes: Api<Node> = Api::all(client.clone());
    for name in missing {
        match tokio::time::timeout(timeout, nodes.get_opt(name)).await {
            Ok(Ok(Some(node))) => {
                observed.nodes.insert(name.clone(), node_view(&node));
            }
            Ok(Ok(None)) => tracing::debug!(node = %name, "DRBD peer has no Node: nothing to fail over"),
            Ok(Err(err)) => tracing::warn!(node = %name, error = %err, "cannot read the node of a DRBD peer"),
            Err(_) => tracing::warn!(node = %name, "cannot read the node of a DRBD peer: timed out"),
        }
    }
}

fn decision_settings(args: &AgentArgs) -> DecisionSettings {
    DecisionSettings {
        fail_over_timeout: *args.fail_over_timeout,
        fail_over_unsafe_pods: args.fail_over_unsafe_pods,
        disable_node_taints: args.disable_node_taints,
        max_tainted_fraction: args.max_tainted_fraction,
        nfs_port: args.nfs_port,
        evacuate_taint: (args.node_drain_policy == DrainPolicy::Evacuate).then(|| args.evacuate_taint.clone()),
    }
}

fn executor_settings(args: &AgentArgs) -> ExecutorSettings {
    ExecutorSettings {
        dry_run: args.dry_run,
        grace_period_seconds: args.grace_period_seconds,
        operations_timeout: *args.operations_timeout,
        cooldown: *args.operations_timeout,
        min_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(120),
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
fn next_wake(
    next_read: Instant,
    timers: &Timers,
    settings: &DecisionSettings,
    reconcile_interval: Duration,
) -> Instant {
    let now = Instant::now();
    let next_timer = timers
        .deadlines(settings.fail_over_timeout)
        .filter(|deadline| *deadline > now)
        .min();
    [Some(next_read), Some(now + reconcile_interval), next_timer]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now)
        .max(now + Duration::from_millis(10))
}

fn record_resources(metrics: &AgentMetrics, state: &DrbdState) {
    metrics.drbd_resources.reset();
    for resource in &state.resources {
        let quorum = if resource.has_quorum() { "true" } else { "false" };
        let role = if resource.role.is_empty() {
            "Unknown"
        } else {
            &resource.role
        };
        metrics.drbd_resources.with_label_values(&[role, quorum]).inc();
    }
}

/// When DRBD state was last read, for `/healthz`.
#[derive(Clone)]
struct Freshness {
    last_read: Arc<Mutex<Instant>>,
    limit: Duration,
}

impl Freshness {
    fn new(status_interval: Duration, timeout: Duration) -> Self {
        Self {
            last_read: Arc::new(Mutex::new(Instant::now())),
            // Three missed reads, each allowed its full timeout.
            limit: 3 * status_interval + timeout,
        }
    }

    fn mark_read(&self) {
        *self.last_read.lock().expect("freshness poisoned") = Instant::now();
    }

    fn age(&self) -> Duration {
        self.last_read.lock().expect("freshness poisoned").elapsed()
    }

    fn check(&self) -> Result<(), String> {
        let age = self.age();
        if age > self.limit {
            return Err(format!(
                "DRBD state was last read {age:?} ago (limit {:?}); is drbdsetup hanging?",
                self.limit
            ));
        }
        Ok(())
    }
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
        assert!(next_wake(next_read, &expired, &settings, reconcile) >= next_read);
        let running = timers(now - Duration::from_secs(3));
        assert!(next_wake(next_read, &running, &settings, reconcile) < now + Duration::from_secs(3));
    }

    #[test]
    fn liveness_fails_once_drbd_state_is_stale() {
        let freshness = Freshness::new(Duration::from_millis(10), Duration::from_millis(5));
        assert!(freshness.check().is_ok());
        std::thread::sleep(Duration::from_millis(50));
        let err = freshness.check().unwrap_err();
        assert!(err.contains("DRBD state was last read"), "{err}");
        freshness.mark_read();
        assert!(freshness.check().is_ok());
    }
}
