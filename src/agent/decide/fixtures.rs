//! What the rules' tables are built from: a resource, pods, nodes, attachments, and the
//! fail-over scenarios most rules start from.

pub(crate) use std::time::{Duration, Instant};

use super::*;
use crate::agent::action::Action;
use crate::agent::drbd::{Connection, Device, DrbdState, PeerDevice, Resource};
use crate::agent::report::{Report, ResourceReport};
pub(crate) use crate::agent::view::{AttachmentView, Liveness, NodeView, PeerReport, PodView, Timers, VolumeView};
use crate::names::TAINT_BY_OWN_AGENT;
use crate::volume::ClaimKey;

pub(crate) fn settings() -> DecisionSettings {
    DecisionSettings::for_tests()
}

pub(crate) fn resource(role: &str, quorum: bool, peers: &[(&str, &str, &str)]) -> Resource {
    Resource {
        name: "pvc-1".into(),
        role: role.into(),
        devices: vec![Device {
            quorum,
            disk_state: "UpToDate".into(),
        }],
        connections: peers
            .iter()
            .map(|(name, state, role)| Connection {
                name: name.to_string(),
                connection_state: state.to_string(),
                peer_role: role.to_string(),
                peer_devices: vec![peer_disk(if *state == "Connected" { "UpToDate" } else { "DUnknown" })],
            })
            .collect(),
        ..Default::default()
    }
}

pub(crate) fn peer_disk(state: &str) -> PeerDevice {
    PeerDevice {
        peer_disk_state: state.into(),
    }
}

pub(crate) fn pod(name: &str, node: &str) -> PodView {
    PodView {
        namespace: "apps".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: node.into(),
        running: true,
        has_owner: true,
        ..Default::default()
    }
}

/// Node `node-x` has address `10.0.0.<n>` (a = 1, b = 2, …); taints carry the own-agent value.
pub(crate) fn node(name: &str, ready: bool, taints: &[&str]) -> (String, NodeView) {
    node_with(
        name,
        ready,
        &taints.iter().map(|t| (*t, TAINT_BY_OWN_AGENT)).collect::<Vec<_>>(),
    )
}

pub(crate) fn node_with(name: &str, ready: bool, taints: &[(&str, &str)]) -> (String, NodeView) {
    let n = name.bytes().last().unwrap() - b'a' + 1;
    let view = NodeView {
        name: name.into(),
        ready,
        taints: taints.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        addresses: vec![format!("10.0.0.{n}")],
        ..Default::default()
    };
    (name.to_string(), view)
}

pub(crate) fn attachment(name: &str, node: &str) -> AttachmentView {
    AttachmentView {
        name: name.into(),
        uid: format!("uid-{name}"),
        node: node.into(),
    }
}

/// Node b sees node a (the old primary and NFS server, with a consumer pod and the
/// attachment) disconnected; node a is not Ready.
pub(crate) fn primary_lost() -> Observed {
    let volume = VolumeView {
        pv: "pvc-1".into(),
        pv_version: "1".into(),
        pods: vec![pod("app", "node-a")],
        attachments: vec![attachment("csi-att-1", "node-a")],
        shared_claim: Some(ClaimKey {
            namespace: "default".into(),
            name: "data".into(),
        }),
        service_endpoint: Some("10.0.0.1:2049".into()),
        nfs_port: None,
        moved_by: None,
        silent_server: None,
    };
    Observed {
        node: "node-b".into(),
        node_ip: Some("10.0.0.2".into()),
        drbd: DrbdState {
            resources: vec![resource(
                "Secondary",
                true,
                &[
                    ("node-a", "Connecting", "Unknown"),
                    ("node-c", "Connected", "Secondary"),
                ],
            )],
            quorum_enabled: ["pvc-1".to_string()].into(),
            ..Default::default()
        },
        volumes: [("pvc-1".to_string(), volume)].into(),
        nodes: [
            node("node-a", false, &[]),
            node("node-b", true, &[]),
            node("node-c", true, &[]),
        ]
        .into(),
        api_answering_since: Some(Instant::now()),
        ..Default::default()
    }
}

/// [`primary_lost`] with node a Ready: only a report or its silence tells what happened.
pub(crate) fn link_lost() -> Observed {
    let mut observed = primary_lost();
    observed.nodes.insert("node-a".into(), node("node-a", true, &[]).1);
    observed
}

/// `observed` with node a's kubelet seen to have stopped renewing its node Lease a minute ago:
/// together with its agent's silence, a crashed node.
pub(crate) fn kubelet_stopped(mut observed: Observed) -> Observed {
    let a_minute_ago = Instant::now().checked_sub(Duration::from_secs(60)).unwrap();
    observed.kubelet_silent_from.insert("node-a".into(), a_minute_ago);
    observed
}

/// `observed` with node a's kubelet renewing its node Lease for another minute.
pub(crate) fn kubelet_renewing(mut observed: Observed) -> Observed {
    let in_a_minute = Instant::now() + Duration::from_secs(60);
    observed.kubelet_silent_from.insert("node-a".into(), in_a_minute);
    observed
}

/// [`link_lost`] with node a's agent alive and stating the resource without quorum: a node that
/// speaks, whose pods are evicted (the careful path), not force-deleted.
pub(crate) fn link_lost_speaking() -> Observed {
    let mut observed = link_lost();
    let said = report(true, false, &[], &["node-b", "node-c"], true);
    observed.reports = [("node-a".to_string(), said)].into();
    observed
}

pub(crate) fn report(
    primary: bool,
    quorum: bool,
    connected: &[&str],
    disconnected: &[&str],
    alive: bool,
) -> PeerReport {
    let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
    let resource = ResourceReport {
        primary,
        quorum,
        connected: strings(connected),
        disconnected: strings(disconnected),
    };
    PeerReport {
        report: Report {
            at: String::new(),
            resources: [("pvc-1".to_string(), resource)].into(),
        },
        liveness: if alive { Liveness::Renewing } else { Liveness::Expired },
        quiet_from: None,
        agent_silent_from: None,
    }
}

pub(crate) fn kinds(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Taint { node, key, .. } => format!("taint {node} {key}"),
            Action::Untaint { node, key, .. } => format!("untaint {node} {key}"),
            Action::Evict { pod, .. } => format!("evict {}", pod.name),
            Action::ForceDelete { pod, .. } => format!("force-delete {}", pod.name),
            Action::DeleteAttachment { attachment, .. } => format!("delete-attachment {}", attachment.name),
            Action::ForceSecondary { resource, .. } => format!("secondary --force {resource}"),
            Action::PublishServiceEndpoint { pv, endpoint, .. } => format!("publish {pv} {endpoint}"),
            Action::HoldFailOver { node, .. } => format!("hold {node}"),
            Action::HoldEvacuation { resource, .. } => format!("hold evacuation {resource}"),
            Action::HoldPublication { resource, .. } => format!("hold publication {resource}"),
            Action::WarnServerNotAnswering { resource, .. } => format!("server not answering {resource}"),
            Action::ServerAnswers { resource, .. } => format!("server answers {resource}"),
            Action::WarnCoexistence { pods, .. } => format!("warn coexistence {}", pods.join(",")),
            Action::Refused { action, .. } => format!("refused {}", kinds(&[(**action).clone()])[0]),
        })
        .collect()
}

/// The actions decided once the fail-over timer ran out.
pub(crate) fn after_timeout(observed: &Observed, settings: &DecisionSettings) -> Vec<String> {
    decided_after(observed, settings, settings.fail_over_timeout)
}

/// The actions decided `elapsed` after the first round over the same observation.
pub(crate) fn decided_after(observed: &Observed, settings: &DecisionSettings, elapsed: Duration) -> Vec<String> {
    let t0 = Instant::now();
    let mut timers = Timers::new();
    decide(observed, settings, &mut timers, t0);
    kinds(&decide(observed, settings, &mut timers, t0 + elapsed))
}

/// What is decided once the timeout ran out over `then`, for a fail-over started over `first`
/// (its steps done one round after another change what is seen).
pub(crate) fn continued(first: &Observed, then: &Observed, settings: &DecisionSettings) -> Vec<String> {
    let t0 = Instant::now();
    let mut timers = Timers::new();
    decide(first, settings, &mut timers, t0);
    kinds(&decide(then, settings, &mut timers, t0 + settings.fail_over_timeout))
}

/// This node in `role` of pvc-1, attached nowhere, its endpoint published at this node.
pub(crate) fn served_from_here(role: &str) -> Observed {
    let mut observed = primary_lost();
    observed.drbd.resources[0] = resource(role, true, &[]);
    let volume = observed.volumes.get_mut("pvc-1").unwrap();
    volume.attachments.clear();
    volume.service_endpoint = Some("10.0.0.2:2049".into());
    observed
}
