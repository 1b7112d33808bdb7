//! The process's one Prometheus registry. Every metric name the project exports is defined here.

use anyhow::Result;
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Dashboards already use this name: never change it.
pub const RECONCILE_DURATION: &str = "storageos_shared_volume_reconcile_duration_seconds";
pub const RECONCILES: &str = "storageos_shared_volume_reconciles_total";
pub const RECONCILE_ERRORS: &str = "storageos_shared_volume_reconcile_errors_total";
pub const SHARED_VOLUMES: &str = "storageos_shared_volumes";
pub const MOUNT_ENDPOINT_PUBLISHES: &str = "storageos_shared_volume_mount_endpoint_publishes_total";
pub const CONTROLLER_LEADER: &str = "storageos_shared_volume_controller_leader";
pub const CLAIMS_PENDING: &str = "storageos_shared_volume_claims_pending";
pub const CLAIMS_PENDING_SINCE: &str = "storageos_shared_volume_claims_pending_since_timestamp_seconds";
pub const BUILD_INFO: &str = "storageos_shared_volume_build_info";
pub const REPAIRS: &str = "storageos_shared_volume_repairs_total";
pub const REPAIRS_DEFERRED: &str = "storageos_shared_volume_repairs_deferred_total";
pub const MOVES_HELD: &str = "storageos_shared_volume_moves_held_total";
pub const LOOP_TURNED: &str = "storageos_shared_volume_loop_last_turn_timestamp_seconds";

pub const AGENT_DRBD_RESOURCES: &str = "storageos_drbd_agent_resources";
pub const AGENT_ACTIONS: &str = "storageos_drbd_agent_actions_total";
pub const AGENT_REFUSED_ACTIONS: &str = "storageos_drbd_agent_refused_actions_total";
pub const AGENT_ENDPOINT_REWRITE: &str = "storageos_drbd_agent_endpoint_rewrite_duration_seconds";
pub const AGENT_DRBD_LAST_READ: &str = "storageos_drbd_agent_drbd_state_last_read_timestamp_seconds";
pub const AGENT_HEARTBEAT_RENEWED: &str = "storageos_drbd_agent_heartbeat_last_renewed_timestamp_seconds";
pub const AGENT_FAIL_OVERS: &str = "storageos_drbd_agent_fail_overs_total";
pub const AGENT_DRY_RUN: &str = "storageos_drbd_agent_dry_run";
pub const AGENT_DRBD_READ_DURATION: &str = "storageos_drbd_agent_drbd_read_duration_seconds";
pub const AGENT_DRBD_READ_ERRORS: &str = "storageos_drbd_agent_drbd_read_errors_total";
pub const AGENT_EVENTS2_MISMATCHES: &str = "storageos_drbd_agent_events2_mismatches_total";
pub const AGENT_HELD_FAIL_OVERS: &str = "storageos_drbd_agent_held_fail_overs_total";
pub const AGENT_PUBLICATIONS_HELD: &str = "storageos_drbd_agent_publications_held";
pub const AGENT_NFS_SERVERS_NOT_ANSWERING: &str = "storageos_drbd_agent_nfs_servers_not_answering";
pub const AGENT_WATCH_EVENTS: &str = "storageos_drbd_agent_watch_events_total";
pub const AGENT_FAIL_OVER_DURATION: &str = "storageos_drbd_agent_fail_over_duration_seconds";
pub const AGENT_PIRAEUS_HA_CONTROLLERS: &str = "storageos_drbd_agent_piraeus_ha_controller_pods";
pub const AGENT_CACHED_OBJECTS: &str = "storageos_drbd_agent_cached_objects";
pub const AGENT_PROMOTER_SNIPPETS: &str = "storageos_drbd_agent_promoter_snippets";
pub const AGENT_PROMOTER_HAND_OVERS: &str = "storageos_drbd_agent_promoter_hand_overs";
pub const AGENT_PROMOTER_SNIPPET_FAILURES: &str = "storageos_drbd_agent_promoter_snippet_failures_total";

/// Reconcile-duration buckets, 1 ms to 30 s.
const RECONCILE_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Creates the registry with the process collector (Linux's `/proc`: not in the plugin's macOS
/// build) and the build-info gauge.
pub fn new_registry() -> Result<Registry> {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
    let build_info = IntGaugeVec::new(
        Opts::new(BUILD_INFO, "Build of the running binary; always 1."),
        &["version", "revision"],
    )?;
    build_info
        .with_label_values(&[env!("CARGO_PKG_VERSION"), env!("SVC_GIT_REVISION")])
        .set(1);
    registry.register(Box::new(build_info))?;
    Ok(registry)
}

/// Sets `gauge` to the current Unix time in seconds: a timestamp stays right between scrapes and
/// after the process stops updating it, where an age refreshed by a timer would not.
pub fn set_to_now(gauge: &Gauge) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    gauge.set(now.as_secs_f64());
}

/// Renders every metric of `registry` in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(err) = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut out) {
        tracing::warn!(error = %err, "cannot encode metrics");
    }
    out
}

fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> Result<M> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// Registers a histogram over [`RECONCILE_BUCKETS`] (1 ms to 30 s).
fn histogram(registry: &Registry, name: &str, help: &str) -> Result<Histogram> {
    histogram_of(registry, name, help, RECONCILE_BUCKETS)
}

pub(crate) fn histogram_of(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Result<Histogram> {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(registry, Histogram::with_opts(opts)?)
}

/// Fail-over buckets, 0.5 s to 10 minutes: an agent's fail-over takes seconds, one left to
/// Kubernetes's own timers minutes.
const FAIL_OVER_BUCKETS: &[f64] = &[0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0];

pub(crate) fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

fn int_gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels)?)
}

pub(crate) fn counter(registry: &Registry, name: &str, help: &str) -> Result<IntCounter> {
    register(registry, IntCounter::new(name, help)?)
}

pub(crate) fn int_gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge> {
    register(registry, IntGauge::new(name, help)?)
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<Gauge> {
    register(registry, Gauge::new(name, help)?)
}

/// Metrics of the shared-volume loop.
#[derive(Clone)]
pub struct ControllerMetrics {
    pub reconcile_duration: Histogram,
    /// By `result`: `shared`, `deferred`, `held`, `skipped`, `invalid`, `error`.
    pub reconciles: IntCounterVec,
    /// By `reason`: the Warning event reason, or the failing dependency.
    pub reconcile_errors: IntCounterVec,
    pub shared_volumes: IntGauge,
    /// Claims served by this controller that have no mount endpoint yet because their last
    /// reconcile failed or found bad input (not those still waiting for an NFS server).
    pub claims_pending: IntGauge,
    /// When the longest-waiting of those started waiting; 0 when none waits.
    pub claims_pending_since: Gauge,
    pub publishes: IntCounter,
    pub leader: IntGauge,
    /// When the reconcile loop last answered its liveness probe.
    pub loop_turned: Gauge,
    /// Writes that put back objects something else had changed.
    pub repairs: IntCounter,
    /// Repairs held back because something keeps changing the same objects.
    pub repairs_deferred: IntCounter,
    /// Agent moves seen in flight (endpoints ahead of the PV) and held instead of repaired.
    pub moves_held: IntCounter,
}

impl ControllerMetrics {
    pub fn register(registry: &Registry) -> Result<Self> {
        Ok(Self {
            reconcile_duration: histogram(
                registry,
                RECONCILE_DURATION,
                "Time to reconcile one claim the controller serves or tries to serve (shared, invalid, deferred or failed); skipped claims are counted in storageos_shared_volume_reconciles_total only.",
            )?,
            reconciles: counter_vec(registry, RECONCILES, "Shared-volume reconciles by result.", &["result"])?,
            reconcile_errors: counter_vec(
                registry,
                RECONCILE_ERRORS,
                "Failed shared-volume reconciles by reason.",
                &["reason"],
            )?,
            shared_volumes: int_gauge(registry, SHARED_VOLUMES, "Shared volumes managed now.")?,
            claims_pending: int_gauge(
                registry,
                CLAIMS_PENDING,
                "Claims with an NFS server but no published mount endpoint, because reconciling them failed.",
            )?,
            claims_pending_since: gauge(
                registry,
                CLAIMS_PENDING_SINCE,
                "Unix time at which the longest-waiting pending claim started waiting; 0 when none.",
            )?,
            publishes: counter(
                registry,
                MOUNT_ENDPOINT_PUBLISHES,
                "Mount endpoints published to volumes.",
            )?,
            leader: int_gauge(registry, CONTROLLER_LEADER, "1 while this replica is the leader.")?,
            repairs: counter(
                registry,
                REPAIRS,
                "Writes that put back objects something else had changed.",
            )?,
            repairs_deferred: counter(
                registry,
                REPAIRS_DEFERRED,
                "Repairs held back because something keeps changing the same objects.",
            )?,
            moves_held: counter(
                registry,
                MOVES_HELD,
                "Agent moves of endpoints seen in flight (the endpoints written, the PV not yet) and held instead of repaired.",
            )?,
            loop_turned: gauge(
                registry,
                LOOP_TURNED,
                "Unix time at which the reconcile loop last processed its liveness probe (every 10 s while leading).",
            )?,
        })
    }
}

/// Metrics of the DRBD HA agent.
#[derive(Clone)]
pub struct AgentMetrics {
    /// By `role` and `quorum` (`true`/`false`), as last read.
    pub drbd_resources: IntGaugeVec,
    /// By `action` (taint, untaint, evict, force_delete, delete_attachment, force_secondary,
    /// publish) and `result` ([`ACTION_RESULTS`]).
    pub actions: IntCounterVec,
    /// By `action` and `why` (`guard`, `dry_run`).
    pub refused_actions: IntCounterVec,
    /// Peers' nodes failed over (tainted after the evidence held), by `peer_node` (not `node`:
    /// the monitors label every series with the node it is scraped from).
    pub fail_overs: IntCounterVec,
    /// From reading a Primary role to the rewritten Endpoints and EndpointSlice.
    pub endpoint_rewrite: Histogram,
    /// One volume's fail-over by this agent, from the first sign of loss to its last step done.
    pub fail_over_duration: Histogram,
    /// One read of the DRBD state (`drbdsetup status` and `show`), failed or not: every
    /// fail-over and endpoint move waits for one.
    pub drbd_read: Histogram,
    pub drbd_last_read: Gauge,
    pub heartbeat_renewed: Gauge,
    /// 1 while `--dry-run` is on.
    pub dry_run: IntGauge,
    pub drbd_read_errors: IntCounter,
    /// Periodic reads that found the DRBD state other than the events2 stream had described it.
    pub events2_mismatches: IntCounter,
    /// Fail-overs held because the evidence says the peer is alive and serving.
    pub held_fail_overs: IntCounter,
    /// Publications of this node held back now over another node's newer move (each hold ends
    /// within the detection window and the fail-over timeout).
    pub publications_held: IntGauge,
    /// Volumes this node is the primary of whose NFS server does not answer (`--nfs-probe`).
    pub nfs_servers_not_answering: IntGauge,
    /// What the agent keeps of its node's surroundings.
    pub node: NodeMetrics,
}

/// What the agent keeps of its node's surroundings: its watches and caches, a coexisting HA
/// controller, the promoter snippets.
#[derive(Clone)]
pub struct NodeMetrics {
    /// Objects the agent's watches delivered, by `watch` (pvs, pods, attachments, nodes,
    /// satellites, leases): what the cluster around it costs the agent.
    pub watch_events: IntCounterVec,
    /// Objects the agent's caches hold, by `kind` (the watches' names): PVs and attachments
    /// only of the node's own resources.
    pub cached_objects: IntGaugeVec,
    /// Pods of Piraeus's own HA Controller running on this node: both act on the same taints.
    pub piraeus_ha_controllers: IntGauge,
    /// The drbd-reactor promoter snippets this agent keeps (`--promoter-snippets-dir`).
    pub promoter_snippets: IntGauge,
    /// The resources drbd-reactor is asked to hand over from this draining node.
    pub promoter_hand_overs: IntGauge,
    /// Rounds whose snippets directory could not be read or written.
    pub promoter_snippet_failures: IntCounter,
}

impl AgentMetrics {
    pub fn register(registry: &Registry) -> Result<Self> {
        Ok(Self {
            drbd_resources: int_gauge_vec(
                registry,
                AGENT_DRBD_RESOURCES,
                "Local DRBD resources by role and quorum.",
                &["role", "quorum"],
            )?,
            actions: counter_vec(
                registry,
                AGENT_ACTIONS,
                "Fail-over and node actions carried out, by kind and result.",
                &["action", "result"],
            )?,
            refused_actions: counter_vec(
                registry,
                AGENT_REFUSED_ACTIONS,
                "Actions decided but not carried out, by kind and why (guard, dry_run).",
                &["action", "why"],
            )?,
            endpoint_rewrite: histogram(
                registry,
                AGENT_ENDPOINT_REWRITE,
                "Time from reading this node's Primary role to the rewritten endpoints.",
            )?,
            fail_over_duration: histogram_of(
                registry,
                AGENT_FAIL_OVER_DURATION,
                "One volume's fail-over by this agent, from the first sign of loss (its peer disconnected while a pod there wrote to it) to its last step seen done (nothing of it left on the lost node).",
                FAIL_OVER_BUCKETS,
            )?,
            drbd_read: histogram(
                registry,
                AGENT_DRBD_READ_DURATION,
                "Time to read the DRBD state (drbdsetup status and show), failed reads included.",
            )?,
            fail_overs: counter_vec(
                registry,
                AGENT_FAIL_OVERS,
                "Peers' nodes this agent failed over, by peer node.",
                &["peer_node"],
            )?,
            drbd_last_read: gauge(
                registry,
                AGENT_DRBD_LAST_READ,
                "Unix time of the last successful read of the DRBD state.",
            )?,
            heartbeat_renewed: gauge(
                registry,
                AGENT_HEARTBEAT_RENEWED,
                "Unix time of the last renewal of this node's heartbeat Lease.",
            )?,
            dry_run: int_gauge(registry, AGENT_DRY_RUN, "1 while --dry-run is on.")?,
            drbd_read_errors: counter(registry, AGENT_DRBD_READ_ERRORS, "Failed reads of the DRBD state.")?,
            events2_mismatches: counter(
                registry,
                AGENT_EVENTS2_MISMATCHES,
                "Periodic reads of the DRBD state that found it other than the events2 stream had described it (the read wins).",
            )?,
            held_fail_overs: counter(
                registry,
                AGENT_HELD_FAIL_OVERS,
                "Fail-overs held because a peer whose link dropped is shown alive and serving.",
            )?,
            publications_held: int_gauge(
                registry,
                AGENT_PUBLICATIONS_HELD,
                "Publications of this node as a volume's NFS server held back now over another node's newer move; each hold ends within the links' detection window and the fail-over timeout.",
            )?,
            nfs_servers_not_answering: int_gauge(
                registry,
                AGENT_NFS_SERVERS_NOT_ANSWERING,
                "Volumes this node is the DRBD primary of whose NFS server does not answer an RPC NULL call: not published here until it answers, or published and unanswered.",
            )?,
            node: NodeMetrics::register(registry)?,
        })
    }

    /// Creates every (action, result) and (action, why) series at 0, so that the first failure or
    /// refusal is an increase that `rate()` and `increase()` see, and panels show 0, not no data.
    pub fn zero(&self, action_kinds: &[&str]) {
        for kind in action_kinds {
            for result in ACTION_RESULTS {
                self.actions.with_label_values(&[kind, result]);
            }
            for why in REFUSAL_REASONS {
                self.refused_actions.with_label_values(&[kind, why]);
            }
        }
    }
}

impl NodeMetrics {
    fn register(registry: &Registry) -> Result<Self> {
        Ok(Self {
            watch_events: counter_vec(
                registry,
                AGENT_WATCH_EVENTS,
                "Objects received from the agent's watches, by watch.",
                &["watch"],
            )?,
            cached_objects: int_gauge_vec(
                registry,
                AGENT_CACHED_OBJECTS,
                "Objects held in the agent's caches, by kind.",
                &["kind"],
            )?,
            piraeus_ha_controllers: int_gauge(
                registry,
                AGENT_PIRAEUS_HA_CONTROLLERS,
                "Pods of Piraeus's HA Controller running on this node; it acts on the same taints, pods and attachments (turn it off).",
            )?,
            promoter_snippets: int_gauge(
                registry,
                AGENT_PROMOTER_SNIPPETS,
                "drbd-reactor promoter snippets this agent keeps for the shared volumes on its node.",
            )?,
            promoter_hand_overs: int_gauge(
                registry,
                AGENT_PROMOTER_HAND_OVERS,
                "Resources this draining node asks drbd-reactor to hand over to a peer (drbd-reactorctl evict, run by the host's path unit).",
            )?,
            promoter_snippet_failures: counter(
                registry,
                AGENT_PROMOTER_SNIPPET_FAILURES,
                "Rounds whose drbd-reactor snippets directory could not be read or written.",
            )?,
        })
    }
}

/// The `result` label values of [`AGENT_ACTIONS`].
pub const ACTION_RESULTS: [&str; 4] = ["ok", "skipped", "blocked", "failed"];
/// The `why` label values of [`AGENT_REFUSED_ACTIONS`].
pub const REFUSAL_REASONS: [&str; 2] = ["guard", "dry_run"];
