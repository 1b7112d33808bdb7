//! The agent's vocabulary of what it observes: this node's DRBD state and the Kubernetes objects
//! that matter to it, as plain values the decisions read. Built by [`super::observe`].

use crate::sharedvolume::silence::SilentServer;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::drbd::DrbdState;
use super::report::{Report, ResourceReport};
use crate::volume::ClaimKey;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub ready: bool,
    /// Cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
    /// The node's taints, key → value, whatever their effect.
    pub taints: BTreeMap<String, String>,
    /// The node's addresses (status.addresses), to tell which node an NFS endpoint is on.
    pub addresses: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub running: bool,
    /// Succeeded or Failed: it holds nothing any more.
    pub finished: bool,
    pub terminating: bool,
    pub has_owner: bool,
    /// Annotated `drbd.linbit.com/ignore-fail-over`.
    pub ignore_fail_over: bool,
    /// Uses volumes that are not safe to fail over (hostPath, other network storage…).
    pub unsafe_volumes: bool,
    /// Mounts the volume's claim read-only only.
    pub read_only: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttachmentView {
    pub name: String,
    pub uid: String,
    pub node: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeView {
    pub pv: String,
    /// The PV's resourceVersion, as cached.
    pub pv_version: String,
    /// Pods that use the volume's claim, wherever they run.
    pub pods: Vec<PodView>,
    /// VolumeAttachments of the PV that are not being deleted.
    pub attachments: Vec<AttachmentView>,
    /// The ReadWriteMany claim the PV backs, served over NFS (its endpoints follow the primary).
    pub shared_claim: Option<ClaimKey>,
    pub service_endpoint: Option<String>,
    /// The port of the volume's own NFS server (`storageos.com/nfs-port`); `None`: `--nfs-port`.
    pub nfs_port: Option<u16>,
    /// The node whose agent moved the endpoint last, as its stamp on the PV says.
    pub moved_by: Option<String>,
    /// What an agent said on the PV of a published server that does not answer.
    pub silent_server: Option<SilentServer>,
}

/// What a peer's agent last stated about its DRBD resources, from its heartbeat Lease.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerReport {
    pub report: Report,
    /// Whether the agent still renews its heartbeat: while it does, what it stated may still hold.
    pub liveness: Liveness,
    /// From when the node has gone quiet: its agent and its kubelet have each missed the
    /// renewals of their Leases, unless one of them renews before. `None`: not read (only
    /// suspected peers are), unreadable, or one of them renews on time.
    pub quiet_from: Option<Instant>,
    /// From when its agent counts as silent (two renewals missed), unless it renews before: what
    /// it reported may be from before that. `None`: not read.
    pub agent_silent_from: Option<Instant>,
}

/// Whether a peer's agent renews its heartbeat Lease, as read fresh in this round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Liveness {
    /// Not read in this round, or the read failed (refused, throttled, timed out): unknown, which
    /// is never taken for silence.
    #[default]
    Unknown,
    /// Renewed within its duration.
    Renewing,
    /// Not renewed within its duration: the agent is silent.
    Expired,
}

/// Everything the decisions look at.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub node: String,
    /// This node's address for NFS clients.
    pub node_ip: Option<String>,
    pub drbd: DrbdState,
    /// By DRBD resource name. A resource without a PV is simply absent.
    pub volumes: HashMap<String, VolumeView>,
    /// This node (watched), and the nodes of suspected peers (read fresh each round). A suspected
    /// peer's node that is not here does not exist.
    pub nodes: BTreeMap<String, NodeView>,
    /// LINSTOR node name → Kubernetes node name (from the satellite pods).
    pub satellite_nodes: HashMap<String, String>,
    /// The reports of the agents on other nodes, by Kubernetes node name.
    pub reports: HashMap<String, PeerReport>,
    /// Nodes where an agent runs or ran (they hold a heartbeat Lease).
    pub agent_nodes: BTreeSet<String>,
    /// Since when the API server has answered this agent without a failure in between; `None`
    /// while it does not, or before the round's reads.
    pub api_answering_since: Option<Instant>,
    /// Pods of Piraeus's own HA Controller running on this node (`namespace/name`).
    pub piraeus_ha_controllers: Vec<String>,
    /// From when each suspected peer's kubelet counts as silent, from its node Lease read fresh
    /// in this round. A node not here: its Lease was not read (not suspected, or the read failed).
    pub kubelet_silent_from: HashMap<String, Instant>,
    /// Suspected peers whose Node or pods could not be read in this round: nothing is done to
    /// them, and what was counted of them before is kept (an unread node is not a Ready one).
    pub unread_nodes: BTreeSet<String>,
}

/// Timers kept by the shell between rounds.
#[derive(Clone, Debug, Default)]
pub struct Timers {
    /// Per (resource, DRBD peer): when the peer was first seen disconnected with consumers.
    pub fail_over: HashMap<(String, String), Instant>,
    /// Per resource: when it was first seen as a suspended primary without local consumers.
    pub suspended: HashMap<String, Instant>,
    /// Per local quorum-enabled resource: since when it has lacked quorum, without a break.
    pub quorum_lost: HashMap<String, Instant>,
    /// The resources this node served (as the primary of a shared volume) at the last decision;
    /// `None` before the first.
    pub serving: Option<BTreeSet<String>>,
    /// Per resource: this node's last publication, and the DRBD view it was decided over.
    pub published: HashMap<String, Publication>,
    /// Per resource: this node's publication held back over another node's newer move.
    pub held_publications: HashMap<String, HeldPublication>,
    /// When the holds of the last decision let go by themselves (a late detection's window
    /// passes): the loop wakes then rather than at its next interval.
    pub holds_end: Vec<Instant>,
    /// When a publication held until its NFS server answers is tried again.
    pub server_retry: Option<Instant>,
    /// Per Node: since when this agent has seen it NotReady, without a Ready read between. On
    /// this agent's own clock: the condition's timestamps are the control plane's.
    pub not_ready_since: HashMap<String, Instant>,
    /// Fail-overs finished since the shell last took them: a volume's fail-over from the first
    /// sign of loss to its last step seen done.
    pub fail_overs_done: Vec<FailOverDone>,
}

/// A publication this node decided: over which PV version, seeing what of its DRBD resource.
#[derive(Clone, Debug, PartialEq)]
pub struct Publication {
    pub over_version: String,
    pub view: super::drbd::Resource,
}

/// A publication held back over another node's newer move: since when, and what the mover's
/// agent stated about the resource when the hold began (a report that changes after that is news).
#[derive(Clone, Debug, PartialEq)]
pub struct HeldPublication {
    pub since: Instant,
    pub mover_said: Option<ResourceReport>,
}

/// One volume's fail-over, finished: nothing of it is left on the lost node.
#[derive(Clone, Debug, PartialEq)]
pub struct FailOverDone {
    pub resource: String,
    /// The lost node.
    pub node: String,
    /// From the first sign of loss (the peer seen disconnected while a pod there wrote to the
    /// volume) to the round that found its pods and attachments gone.
    pub took: std::time::Duration,
}

impl Timers {
    pub fn new() -> Self {
        Self::default()
    }

    /// When each running timer expires: those that run for `timeout`, and NotReady nodes' gates.
    pub fn deadlines(&self, timeout: Duration, not_ready_gate: Duration) -> impl Iterator<Item = Instant> + '_ {
        let timed = self
            .fail_over
            .values()
            .chain(self.suspended.values())
            .chain(self.quorum_lost.values())
            .map(move |started| *started + timeout);
        let gates = self.not_ready_since.values().map(move |since| *since + not_ready_gate);
        timed
            .chain(gates)
            .chain(self.holds_end.iter().copied())
            .chain(self.server_retry)
    }

    /// Notes which Nodes are NotReady as of this read: a Ready one's count starts over, and one
    /// that could not be read keeps its count (a failed read is not a Ready one).
    pub fn note_readiness(&mut self, nodes: &BTreeMap<String, NodeView>, unread: &BTreeSet<String>, now: Instant) {
        self.not_ready_since
            .retain(|name, _| unread.contains(name) || nodes.get(name).is_some_and(|node| !node.ready));
        for node in nodes.values().filter(|node| !node.ready) {
            self.not_ready_since.entry(node.name.clone()).or_insert(now);
        }
    }
}

impl NodeView {
    pub fn has_taint(&self, key: &str) -> bool {
        self.taints.contains_key(key)
    }

    pub fn taint_value(&self, key: &str) -> Option<&str> {
        self.taints.get(key).map(String::as_str)
    }
}

impl Observed {
    /// The Kubernetes node of a DRBD peer (LINSTOR node names map through the satellite pods).
    pub fn kube_node<'a>(&'a self, drbd_peer: &'a str) -> &'a str {
        self.satellite_nodes
            .get(drbd_peer)
            .map(String::as_str)
            .unwrap_or(drbd_peer)
    }

    /// Whether a DRBD peer name, as another node sees it, is this node.
    pub fn is_this_node(&self, drbd_peer: &str) -> bool {
        self.kube_node(drbd_peer) == self.node
    }

    /// What `node`'s agent states about `resource`, while that agent renews its heartbeat.
    pub fn alive_report(&self, node: &str, resource: &str) -> Option<&ResourceReport> {
        let report = self.reports.get(node).filter(|r| r.liveness == Liveness::Renewing)?;
        report.report.resources.get(resource)
    }

    /// From when `node` counts as quiet (see [`PeerReport::quiet_from`]).
    pub fn quiet_from(&self, node: &str) -> Option<Instant> {
        self.reports.get(node)?.quiet_from
    }

    /// Whether `node`'s kubelet renews its node Lease as of `now`: `None` where it was not read.
    pub fn kubelet_renews(&self, node: &str, now: Instant) -> Option<bool> {
        self.kubelet_silent_from.get(node).map(|from| *from > now)
    }

    pub fn has_taint(&self, node: &str, key: &str) -> bool {
        self.nodes.get(node).is_some_and(|n| n.has_taint(key))
    }

    /// The storage nodes the blast-radius guard counts: where an agent runs or ran, this node,
    /// and every DRBD peer of this node (they replicate its data, agent or not).
    pub fn storage_nodes(&self) -> BTreeSet<String> {
        let peers = self
            .drbd
            .resources
            .iter()
            .flat_map(|r| &r.connections)
            .map(|c| self.kube_node(&c.name).to_owned());
        self.agent_nodes
            .iter()
            .cloned()
            .chain(peers)
            .chain([self.node.clone()])
            .collect()
    }
}
