//! The agent's vocabulary of what it observes: this node's DRBD state and the Kubernetes objects
//! that matter to it, as plain values the decisions read. Built by [`super::observe`].

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::drbd::DrbdState;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub ready: bool,
    /// Cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
    /// Keys of the node's taints, whatever their effect.
    pub taints: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub running: bool,
    pub terminating: bool,
    pub has_owner: bool,
    /// Annotated `drbd.linbit.com/ignore-fail-over`.
    pub ignore_fail_over: bool,
    /// Uses volumes that are not safe to fail over (hostPath, other network storage…).
    pub unsafe_volumes: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeView {
    pub pv: String,
    /// Pods that use the volume's claim, wherever they run.
    pub pods: Vec<PodView>,
    /// VolumeAttachments of the PV: (name, node).
    pub attachments: Vec<(String, String)>,
    /// Backs a ReadWriteMany claim served over NFS (its endpoints follow the primary).
    pub shared: bool,
    pub service_endpoint: Option<String>,
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
    pub nodes: BTreeMap<String, NodeView>,
    /// LINSTOR node name → Kubernetes node name (from the satellite pods).
    pub satellite_nodes: HashMap<String, String>,
}

/// Fail-over timers, per (resource, peer): when the peer was first seen disconnected with
/// consumers. Kept by the shell between calls.
pub type Timers = HashMap<(String, String), Instant>;
impl NodeView {
    pub fn has_taint(&self, key: &str) -> bool {
        self.taints.iter().any(|t| t == key)
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

    pub fn has_taint(&self, node: &str, key: &str) -> bool {
        self.nodes.get(node).is_some_and(|n| n.has_taint(key))
    }
}
