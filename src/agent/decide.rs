//! The HA agent's rules: a pure function from what this node observes ([`Observed`]: DRBD state,
//! the Kubernetes objects that matter, the peers' reports, the running timers, now) to the
//! [`Action`]s to take. The shell fetches the observations and carries out the actions; nothing
//! here does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::action::{Action, Cause};
use super::drbd::Resource;
use super::view::{NodeView, Observed, PodView, Timers, VolumeView};
use crate::names::{FORCE_IO_ERROR_TAINT, LOST_QUORUM_TAINT, TAINT_BY_FAIL_OVER, TAINT_BY_OWN_AGENT};
use crate::volume::NfsEndpoint;

#[derive(Clone, Debug)]
pub struct DecisionSettings {
    /// How long a peer may stay disconnected before it is failed over; also the hold-off before
    /// a suspended primary is demoted.
    pub fail_over_timeout: Duration,
    pub fail_over_unsafe_pods: bool,
    pub disable_node_taints: bool,
    /// Largest share of the storage nodes that may carry the lost-quorum taint after we add one.
    pub max_tainted_fraction: f64,
    pub nfs_port: u16,
    /// `--node-drain-policy=evacuate`: the taint key that asks for evacuation, if enabled.
    pub evacuate_taint: Option<String>,
}

#[cfg(test)]
impl DecisionSettings {
    /// The defaults of the flags, with a 5 s fail-over timeout.
    pub(crate) fn for_tests() -> Self {
        Self {
            fail_over_timeout: Duration::from_secs(5),
            fail_over_unsafe_pods: false,
            disable_node_taints: false,
            max_tainted_fraction: 0.5,
            nfs_port: 2049,
            evacuate_taint: None,
        }
    }
}

/// What the evidence says about a peer whose link to this node is down.
#[derive(Clone, Debug, PartialEq)]
enum Evidence {
    /// It lost the volume: fail it over. Why, in words.
    Lost(String),
    /// It is alive and serving: hold. Why, in words.
    Alive(String),
}

/// Decides what to do now. `timers` is updated in place: started, kept or reset.
pub fn decide(observed: &Observed, settings: &DecisionSettings, timers: &mut Timers, now: Instant) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut fail_overs: BTreeMap<String, Vec<Action>> = BTreeMap::new();
    let mut live_timers = Vec::new();
    let mut live_suspended = Vec::new();
    let mut lost_quorum_locally = Vec::new();
    let mut forcing_io_errors = Vec::new();
    let mut fully_reconnected = true;
    let mut serving = BTreeSet::new();

    for resource in &observed.drbd.resources {
        let volume = observed.volumes.get(&resource.name);
        if resource.force_io_failures {
            forcing_io_errors.push(resource.name.clone());
            if let Some(volume) = volume {
                for pod in evictable(volume, &observed.node, settings) {
                    actions.push(Action::Evict {
                        pod: pod.into(),
                        cause: Cause::ForceIoErrors,
                        note: format!("DRBD resource {} is forcing IO errors on this node", resource.name),
                    });
                }
            }
        }
        if let Some(demote) = demotion(observed, settings, timers, resource, volume, now) {
            live_suspended.push(resource.name.clone());
            actions.extend(demote);
        }
        if !observed.drbd.quorum_enabled.contains(&resource.name) {
            continue;
        }
        if !resource.has_quorum() {
            lost_quorum_locally.push(resource.name.clone());
        }
        fully_reconnected &= resource.has_quorum() && resource.fully_connected();
        // A resource without a PV has no consumers we could move: nothing to fail over.
        let Some(volume) = volume else { continue };
        if resource.is_primary() && volume.shared_claim.is_some() && evacuating(observed, settings) {
            for pod in evictable(volume, &observed.node, settings) {
                actions.push(Action::Evict {
                    pod: pod.into(),
                    cause: Cause::Evacuation,
                    note: format!(
                        "node {} is being drained: moving the primary of DRBD resource {} elsewhere",
                        observed.node, resource.name
                    ),
                });
            }
        }
        if let Some(publish) = own_publication(observed, settings, resource, volume) {
            // Just promoted: the cache may not have seen the previous primary's publication
            // yet, and still show this node's own from before; a freshly listed cache holds.
            let promoted = timers.serving.as_ref().is_some_and(|s| !s.contains(&resource.name));
            if promoted || volume.service_endpoint.as_deref() != publish.published_endpoint() {
                actions.push(publish);
            }
            serving.insert(resource.name.clone());
        }
        if !resource.may_promote() {
            continue;
        }
        for peer in resource.connections.iter().filter(|c| !c.is_connected()) {
            let node = observed.kube_node(&peer.name);
            if !has_consumers(volume, node) {
                continue;
            }
            let key = (resource.name.clone(), peer.name.clone());
            let started = *timers.fail_over.entry(key.clone()).or_insert(now);
            live_timers.push(key);
            if now.duration_since(started) < settings.fail_over_timeout {
                continue;
            }
            // A node we know nothing of (neither cached nor found when read fresh) does not
            // exist: there is nothing to fail over, and it is never taken for NotReady.
            let Some(node) = observed.nodes.get(node) else { continue };
            match evidence(observed, resource, node) {
                Evidence::Alive(evidence) => actions.push(Action::HoldFailOver {
                    node: node.name.clone(),
                    resource: resource.name.clone(),
                    pv: volume.pv.clone(),
                    evidence,
                }),
                Evidence::Lost(evidence) => {
                    let note = format!(
                        "node {} lost DRBD resource {} ({evidence}; link down for over {:?})",
                        node.name, resource.name, settings.fail_over_timeout
                    );
                    let steps = fail_over_steps(settings, volume, node, &note);
                    fail_overs.entry(node.name.clone()).or_default().extend(steps);
                }
            }
        }
    }
    // Timers of peers that reconnected, lost their consumers, or whose resource went away reset.
    timers.fail_over.retain(|key, _| live_timers.contains(key));
    timers.suspended.retain(|resource, _| live_suspended.contains(resource));
    timers.serving = Some(serving);

    if !settings.disable_node_taints {
        own_lost_quorum_taint(observed, &mut actions, &lost_quorum_locally, fully_reconnected);
        own_force_io_taint(observed, &mut actions, &forcing_io_errors);
    }
    actions.extend(guard_fail_overs(observed, settings, fail_overs));
    actions
}

/// The publication of this node's NFS endpoint, when it should serve the shared volume: it is
/// the DRBD primary, every local device has quorum and no peer is primary. An isolated node
/// never qualifies.
fn own_publication(
    observed: &Observed,
    settings: &DecisionSettings,
    resource: &Resource,
    volume: &VolumeView,
) -> Option<Action> {
    if !(resource.is_primary() && resource.may_promote()) {
        return None;
    }
    let claim = volume.shared_claim.clone()?;
    let ip = observed.node_ip.as_deref()?.parse().ok()?;
    Some(Action::PublishServiceEndpoint {
        pv: volume.pv.clone(),
        claim,
        endpoint: NfsEndpoint::new(ip, settings.nfs_port).to_string(),
        over_version: volume.pv_version.clone(),
    })
}

/// Publications of every shared volume this node serves, whatever is published now: the
/// periodic resync repairs what was changed behind our back.
pub fn republish(observed: &Observed, settings: &DecisionSettings) -> Vec<Action> {
    observed
        .drbd
        .resources
        .iter()
        .filter(|r| observed.drbd.quorum_enabled.contains(&r.name))
        .filter_map(|resource| {
            let volume = observed.volumes.get(&resource.name)?;
            own_publication(observed, settings, resource, volume)
        })
        .collect()
}

/// Whether the peer's node has something of the volume to fail over: a running pod or an
/// attachment.
fn has_consumers(volume: &VolumeView, node: &str) -> bool {
    volume.pods.iter().any(|p| p.node == node && p.running) || volume.attachments.iter().any(|a| a.node == node)
}

/// Weighs what else is known about a peer whose link to this node is down. One link is a
/// suspicion; the peer is failed over only when nothing says it still holds the volume.
fn evidence(observed: &Observed, resource: &Resource, node: &NodeView) -> Evidence {
    if !node.ready {
        return Evidence::Lost(format!("node {} is not Ready", node.name));
    }
    let alive_report = |name: &str| {
        observed
            .reports
            .get(name)
            .filter(|r| r.alive)
            .and_then(|r| r.report.resources.get(&resource.name))
    };
    if let Some(own) = alive_report(&node.name) {
        if !own.quorum {
            return Evidence::Lost("its agent reports the resource without quorum".into());
        }
        // It saw the link to us drop, and still states quorum: that was said after the drop.
        if own.disconnected.iter().any(|p| observed.is_this_node(p)) {
            let role = if own.primary { "Primary" } else { "Secondary" };
            return Evidence::Alive(format!(
                "its agent stated it is {role} with quorum after losing the link to {}",
                observed.node
            ));
        }
    }
    let mut third_peers: Vec<&String> = observed.reports.keys().collect();
    third_peers.sort();
    for other in third_peers {
        if *other == node.name || *other == observed.node {
            continue;
        }
        if let Some(view) = alive_report(other)
            && view.connected.iter().any(|p| observed.kube_node(p) == node.name)
        {
            return Evidence::Alive(format!("node {other} is still connected to it"));
        }
    }
    Evidence::Lost("its agent has stated nothing since the link dropped".into())
}

/// Whether the volume's NFS server listens on `node` (its service endpoint is one of the node's
/// addresses).
fn serves(volume: &VolumeView, node: &NodeView) -> bool {
    let Some(endpoint) = volume
        .service_endpoint
        .as_deref()
        .and_then(|e| e.parse::<NfsEndpoint>().ok())
    else {
        return false;
    };
    node.addresses.iter().any(|a| a.parse().ok() == Some(endpoint.ip))
}

/// The steps that move the volume off a lost peer's node, taint first.
fn fail_over_steps(settings: &DecisionSettings, volume: &VolumeView, node: &NodeView, note: &str) -> Vec<Action> {
    // Clients of a shared volume reach it over the ClusterIP, not DRBD: on a Ready node only
    // the side that holds DRBD open, the NFS server, is failed over.
    if volume.shared_claim.is_some() && node.ready && !serves(volume, node) {
        return Vec::new();
    }
    let mut steps = Vec::new();
    if !settings.disable_node_taints && !node.has_taint(LOST_QUORUM_TAINT) {
        steps.push(Action::Taint {
            node: node.name.clone(),
            key: LOST_QUORUM_TAINT,
            value: TAINT_BY_FAIL_OVER,
            cause: Cause::FailOver,
            note: note.to_owned(),
        });
    }
    let holders: Vec<&PodView> = volume
        .pods
        .iter()
        .filter(|p| p.node == node.name && !p.finished)
        .collect();
    let (movable, left_alone): (Vec<&PodView>, Vec<&PodView>) =
        holders.into_iter().partition(|p| is_movable(p, settings));
    if node.ready {
        for pod in movable.iter().filter(|p| !p.terminating) {
            steps.push(Action::Evict {
                pod: (*pod).into(),
                cause: Cause::FailOver,
                note: note.to_owned(),
            });
        }
    } else {
        // Without a kubelet to finish them, terminating pods would hold the volume forever.
        for pod in &movable {
            steps.push(Action::ForceDelete {
                pod: (*pod).into(),
                note: note.to_owned(),
            });
        }
    }
    // The attachment goes only once nothing on the node holds the volume: no pod we left alone,
    // and on a Ready node no eviction still under way (or held back by a PodDisruptionBudget).
    let still_held = !left_alone.is_empty() || (node.ready && !movable.is_empty());
    if !still_held {
        for attachment in volume.attachments.iter().filter(|a| a.node == node.name) {
            steps.push(Action::DeleteAttachment {
                attachment: attachment.clone(),
                note: note.to_owned(),
            });
        }
    }
    steps
}

/// The blast-radius guard over whole fail-overs: a node whose taint would leave more than the
/// allowed share of storage nodes tainted is not failed over at all (one Refused instead). This
/// counts the taints it can see (this node and the suspected peers); before a taint is written
/// the executor counts again from fresh reads of every storage node (`super::guard`).
fn guard_fail_overs(
    observed: &Observed,
    settings: &DecisionSettings,
    fail_overs: BTreeMap<String, Vec<Action>>,
) -> Vec<Action> {
    let storage = observed.storage_nodes();
    let mut tainted: BTreeSet<String> = storage
        .iter()
        .filter(|n| observed.has_taint(n, LOST_QUORUM_TAINT))
        .cloned()
        .collect();
    let mut actions = Vec::new();
    for (node, mut steps) in fail_overs {
        let mut seen = std::collections::HashSet::new();
        steps.retain(|step| seen.insert(step.key()));
        let taints = steps.iter().position(|s| matches!(s, Action::Taint { .. }));
        match taints {
            Some(at) => match guard_allows(&tainted, &node, storage.len(), settings.max_tainted_fraction) {
                Ok(()) => {
                    tainted.insert(node);
                    actions.extend(steps);
                }
                Err(why) => actions.push(Action::Refused {
                    action: Box::new(steps.swap_remove(at)),
                    why,
                }),
            },
            None => actions.extend(steps),
        }
    }
    actions
}

/// Whether tainting `node` keeps the share of tainted storage nodes within the limit.
pub fn guard_allows(
    tainted: &BTreeSet<String>,
    node: &str,
    storage_nodes: usize,
    max_fraction: f64,
) -> Result<(), String> {
    let after = tainted.len() + usize::from(!tainted.contains(node));
    let total = storage_nodes.max(after).max(1);
    if after as f64 / total as f64 > max_fraction {
        return Err(format!(
            "failing over {node} would leave {after} of {total} storage nodes tainted {LOST_QUORUM_TAINT}, over the limit of {max_fraction}; nothing is done to it"
        ));
    }
    Ok(())
}

fn evacuating(observed: &Observed, settings: &DecisionSettings) -> bool {
    let Some(taint) = &settings.evacuate_taint else {
        return false;
    };
    observed
        .nodes
        .get(&observed.node)
        .is_some_and(|n| n.unschedulable || n.has_taint(taint))
}

/// Pods we may move: owned, not opted out, not read-only, safe to fail over.
fn is_movable(pod: &PodView, settings: &DecisionSettings) -> bool {
    pod.has_owner && !pod.ignore_fail_over && !pod.read_only && (settings.fail_over_unsafe_pods || !pod.unsafe_volumes)
}

/// Movable pods of the volume on `node` that are not already on their way out.
fn evictable<'a>(
    volume: &'a VolumeView,
    node: &'a str,
    settings: &'a DecisionSettings,
) -> impl Iterator<Item = &'a PodView> {
    volume
        .pods
        .iter()
        .filter(move |p| p.node == node && !p.finished && !p.terminating && is_movable(p, settings))
}

/// A suspended primary with no local consumer (any pod of the volume here that has not finished
/// and is not terminating, Pending included) is demoted after the hold-off. Any resource,
/// quorum-enabled or not, with or without a PV. `Some` while the hold-off runs or is over.
fn demotion(
    observed: &Observed,
    settings: &DecisionSettings,
    timers: &mut Timers,
    resource: &Resource,
    volume: Option<&VolumeView>,
    now: Instant,
) -> Option<Option<Action>> {
    if !(resource.suspended && resource.is_primary()) {
        return None;
    }
    let consumed = volume.is_some_and(|v| {
        v.pods
            .iter()
            .any(|p| p.node == observed.node && !p.finished && !p.terminating)
    });
    if consumed {
        return None;
    }
    let started = *timers.suspended.entry(resource.name.clone()).or_insert(now);
    if now.duration_since(started) < settings.fail_over_timeout {
        return Some(None);
    }
    Some(Some(Action::ForceSecondary {
        resource: resource.name.clone(),
        node: observed.node.clone(),
        pv: volume.map(|v| v.pv.clone()),
    }))
}

/// The lost-quorum taint on this node: added while a local resource lacks quorum; removed when
/// none does if this agent put it, or, if a peer put it in a fail-over, once the node is back
/// with every resource reconnected.
fn own_lost_quorum_taint(observed: &Observed, actions: &mut Vec<Action>, lost: &[String], fully_reconnected: bool) {
    let node = observed.node.clone();
    let own = observed.nodes.get(&node);
    let value = own.and_then(|n| n.taint_value(LOST_QUORUM_TAINT));
    if !lost.is_empty() {
        if value.is_none() {
            actions.push(Action::Taint {
                node,
                key: LOST_QUORUM_TAINT,
                value: TAINT_BY_OWN_AGENT,
                cause: Cause::LostQuorum,
                note: format!("DRBD resource(s) {} lost quorum on this node", lost.join(", ")),
            });
        }
        return;
    }
    let note = match value {
        // A taint without a value was put by an earlier version, which did not say who.
        Some(TAINT_BY_OWN_AGENT | "") => "no DRBD resource on this node is without quorum any more",
        Some(TAINT_BY_FAIL_OVER) if fully_reconnected && own.is_some_and(|n| n.ready) => {
            "the node is back and every DRBD resource on it reconnected"
        }
        _ => return,
    };
    actions.push(Action::Untaint {
        node,
        key: LOST_QUORUM_TAINT,
        cause: Cause::LostQuorum,
        note: note.into(),
    });
}

fn own_force_io_taint(observed: &Observed, actions: &mut Vec<Action>, forcing: &[String]) {
    let node = observed.node.clone();
    let tainted = observed.has_taint(&node, FORCE_IO_ERROR_TAINT);
    if !forcing.is_empty() && !tainted {
        actions.push(Action::Taint {
            node,
            key: FORCE_IO_ERROR_TAINT,
            value: TAINT_BY_OWN_AGENT,
            cause: Cause::ForceIoErrors,
            note: format!("DRBD resource(s) {} force IO errors on this node", forcing.join(", ")),
        });
    } else if forcing.is_empty() && tainted {
        actions.push(Action::Untaint {
            node,
            key: FORCE_IO_ERROR_TAINT,
            cause: Cause::ForceIoErrors,
            note: "no DRBD resource on this node forces IO errors any more".into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::drbd::{Connection, Device, DrbdState};
    use crate::agent::report::{Report, ResourceReport};
    use crate::agent::view::{AttachmentView, PeerReport};
    use crate::volume::ClaimKey;

    fn settings() -> DecisionSettings {
        DecisionSettings::for_tests()
    }

    fn resource(role: &str, quorum: bool, peers: &[(&str, &str, &str)]) -> Resource {
        Resource {
            name: "pvc-1".into(),
            role: role.into(),
            devices: vec![Device { quorum }],
            connections: peers
                .iter()
                .map(|(name, state, role)| Connection {
                    name: name.to_string(),
                    connection_state: state.to_string(),
                    peer_role: role.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn pod(name: &str, node: &str) -> PodView {
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
    fn node(name: &str, ready: bool, taints: &[&str]) -> (String, NodeView) {
        node_with(
            name,
            ready,
            &taints.iter().map(|t| (*t, TAINT_BY_OWN_AGENT)).collect::<Vec<_>>(),
        )
    }

    fn node_with(name: &str, ready: bool, taints: &[(&str, &str)]) -> (String, NodeView) {
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

    fn attachment(name: &str, node: &str) -> AttachmentView {
        AttachmentView {
            name: name.into(),
            uid: format!("uid-{name}"),
            node: node.into(),
        }
    }

    /// Node b sees node a (the old primary and NFS server, with a consumer pod and the
    /// attachment) disconnected; node a is not Ready.
    fn primary_lost() -> Observed {
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
            },
            volumes: [("pvc-1".to_string(), volume)].into(),
            nodes: [
                node("node-a", false, &[]),
                node("node-b", true, &[]),
                node("node-c", true, &[]),
            ]
            .into(),
            ..Default::default()
        }
    }

    /// [`primary_lost`] with node a Ready: only a report or its silence tells what happened.
    fn link_lost() -> Observed {
        let mut observed = primary_lost();
        observed.nodes.insert("node-a".into(), node("node-a", true, &[]).1);
        observed
    }

    fn report(primary: bool, quorum: bool, connected: &[&str], disconnected: &[&str], alive: bool) -> PeerReport {
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
            alive,
        }
    }

    fn kinds(actions: &[Action]) -> Vec<String> {
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
                Action::Refused { action, .. } => format!("refused {}", kinds(&[(**action).clone()])[0]),
            })
            .collect()
    }

    /// The actions decided once the fail-over timer ran out.
    fn after_timeout(observed: &Observed, settings: &DecisionSettings) -> Vec<String> {
        let t0 = Instant::now();
        let mut timers = Timers::new();
        decide(observed, settings, &mut timers, t0);
        kinds(&decide(
            observed,
            settings,
            &mut timers,
            t0 + settings.fail_over_timeout,
        ))
    }

    #[test]
    fn fails_over_a_lost_peer_only_after_the_timeout() {
        let t0 = Instant::now();
        let mut timers = Timers::new();
        let observed = primary_lost();
        assert!(decide(&observed, &settings(), &mut timers, t0).is_empty());
        assert!(decide(&observed, &settings(), &mut timers, t0 + Duration::from_secs(4)).is_empty());
        let actions = decide(&observed, &settings(), &mut timers, t0 + Duration::from_secs(5));
        assert_eq!(
            kinds(&actions),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ]
        );
        let Action::Taint { value, .. } = &actions[0] else {
            unreachable!()
        };
        assert_eq!(*value, TAINT_BY_FAIL_OVER);
    }

    #[test]
    fn the_timer_resets_when_the_peer_reconnects() {
        let t0 = Instant::now();
        let mut timers = Timers::new();
        let lost = primary_lost();
        decide(&lost, &settings(), &mut timers, t0);
        let mut back = lost.clone();
        back.drbd.resources[0].connections[0].connection_state = "Connected".into();
        back.drbd.resources[0].connections[0].peer_role = "Primary".into();
        assert!(decide(&back, &settings(), &mut timers, t0 + Duration::from_secs(3)).is_empty());
        assert!(timers.fail_over.is_empty());
        // Lost again: a fresh timeout, not the remainder of the old one.
        assert!(decide(&lost, &settings(), &mut timers, t0 + Duration::from_secs(6)).is_empty());
        assert!(!decide(&lost, &settings(), &mut timers, t0 + Duration::from_secs(11)).is_empty());
    }

    #[test]
    fn one_dropped_link_is_not_evidence_enough() {
        let fail_over = vec![
            "taint node-a drbd.linbit.com/lost-quorum".to_string(),
            "evict app".to_string(),
        ];
        let hold = vec!["hold node-a".to_string()];
        type Case = (&'static str, Vec<(&'static str, PeerReport)>, Vec<String>);
        let cases: Vec<Case> = vec![
            ("a's agent silent (no report)", vec![], fail_over.clone()),
            (
                "a re-asserts Primary with quorum after losing b",
                vec![("node-a", report(true, true, &["node-c"], &["node-b"], true))],
                hold.clone(),
            ),
            (
                "a's last report is from before the drop",
                vec![("node-a", report(true, true, &["node-b", "node-c"], &[], true))],
                fail_over.clone(),
            ),
            (
                "a reports its quorum lost",
                vec![("node-a", report(true, false, &[], &["node-b", "node-c"], true))],
                fail_over.clone(),
            ),
            (
                "a's Lease expired: its report no longer counts",
                vec![("node-a", report(true, true, &["node-c"], &["node-b"], false))],
                fail_over.clone(),
            ),
            (
                "node c still sees a connected",
                vec![("node-c", report(false, true, &["node-a", "node-b"], &[], true))],
                hold.clone(),
            ),
            (
                "node c lost a too",
                vec![("node-c", report(false, true, &["node-b"], &["node-a"], true))],
                fail_over.clone(),
            ),
        ];
        for (case, reports, expected) in cases {
            let mut observed = link_lost();
            observed.reports = reports.into_iter().map(|(n, r)| (n.to_string(), r)).collect();
            assert_eq!(after_timeout(&observed, &settings()), expected, "{case}");
        }
        let mut not_ready = primary_lost();
        not_ready.reports = [("node-a".to_string(), report(true, true, &["node-c"], &["node-b"], true))].into();
        assert_eq!(
            after_timeout(&not_ready, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum",
            "a NotReady node is lost whatever it said"
        );
    }

    #[test]
    fn ready_nodes_get_evictions_and_protected_pods_keep_the_attachment() {
        let mut observed = link_lost();
        let pods = &mut observed.volumes.get_mut("pvc-1").unwrap().pods;
        pods.push(PodView {
            ignore_fail_over: true,
            ..pod("ignored", "node-a")
        });
        pods.push(PodView {
            has_owner: false,
            ..pod("bare", "node-a")
        });
        pods.push(PodView {
            unsafe_volumes: true,
            ..pod("hostpath", "node-a")
        });
        pods.push(PodView {
            read_only: true,
            ..pod("reader", "node-a")
        });
        assert_eq!(
            after_timeout(&observed, &settings()),
            ["taint node-a drbd.linbit.com/lost-quorum", "evict app"]
        );
        let unsafe_ok = DecisionSettings {
            fail_over_unsafe_pods: true,
            ..settings()
        };
        assert!(after_timeout(&observed, &unsafe_ok).contains(&"evict hostpath".to_string()));
    }

    #[test]
    fn the_attachment_goes_only_once_nothing_holds_the_volume() {
        // Ready node: evictions first; the attachment once the evicted pods are gone.
        let mut evicting = link_lost();
        assert!(
            !after_timeout(&evicting, &settings())
                .iter()
                .any(|a| a.starts_with("delete-attachment"))
        );
        evicting.volumes.get_mut("pvc-1").unwrap().pods[0].terminating = true;
        assert!(
            !after_timeout(&evicting, &settings())
                .iter()
                .any(|a| a.starts_with("delete-attachment"))
        );
        evicting.volumes.get_mut("pvc-1").unwrap().pods.clear();
        assert_eq!(
            after_timeout(&evicting, &settings()),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "delete-attachment csi-att-1"
            ]
        );
        // NotReady node: an ignored pod keeps it, finished pods do not.
        let mut ignored = primary_lost();
        ignored.volumes.get_mut("pvc-1").unwrap().pods.push(PodView {
            ignore_fail_over: true,
            ..pod("ignored", "node-a")
        });
        assert_eq!(
            after_timeout(&ignored, &settings()),
            ["taint node-a drbd.linbit.com/lost-quorum", "force-delete app"]
        );
        let mut finished = primary_lost();
        finished.volumes.get_mut("pvc-1").unwrap().pods[0] = PodView {
            running: false,
            finished: true,
            ..pod("job", "node-a")
        };
        assert_eq!(
            after_timeout(&finished, &settings()),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "delete-attachment csi-att-1"
            ]
        );
    }

    #[test]
    fn nfs_clients_on_a_ready_node_are_left_alone() {
        // Node a runs clients of the shared volume, whose NFS server is node c.
        let mut clients = link_lost();
        clients.volumes.get_mut("pvc-1").unwrap().service_endpoint = Some("10.0.0.3:2049".into());
        assert!(after_timeout(&clients, &settings()).is_empty());
        // On a NotReady node they are force-deleted as before.
        clients.nodes.insert("node-a".into(), node("node-a", false, &[]).1);
        assert_eq!(
            after_timeout(&clients, &settings()),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ]
        );
        // A volume that is not shared is held by its consumers: they are moved.
        let mut rwo = link_lost();
        let volume = rwo.volumes.get_mut("pvc-1").unwrap();
        volume.shared_claim = None;
        volume.service_endpoint = None;
        assert_eq!(
            after_timeout(&rwo, &settings()),
            ["taint node-a drbd.linbit.com/lost-quorum", "evict app"]
        );
    }

    #[test]
    fn a_node_nobody_knows_is_not_failed_over() {
        let mut observed = primary_lost();
        observed.nodes.remove("node-a");
        assert!(after_timeout(&observed, &settings()).is_empty());
    }

    #[test]
    fn no_fail_over_without_quorum_or_consumers_or_pv() {
        let mut no_quorum = primary_lost();
        no_quorum.drbd.resources[0].devices[0].quorum = false;
        let mut no_devices = primary_lost();
        no_devices.drbd.resources[0].devices.clear();
        let mut no_consumers = primary_lost();
        let volume = no_consumers.volumes.get_mut("pvc-1").unwrap();
        volume.pods.clear();
        volume.attachments.clear();
        let mut no_pv = primary_lost();
        no_pv.volumes.clear();
        let mut not_quorum_enabled = primary_lost();
        not_quorum_enabled.drbd.quorum_enabled.clear();
        for (case, observed, expected) in [
            ("no quorum", no_quorum, vec!["taint node-b drbd.linbit.com/lost-quorum"]),
            (
                "no devices",
                no_devices,
                vec!["taint node-b drbd.linbit.com/lost-quorum"],
            ),
            ("no consumers", no_consumers, vec![]),
            ("no PV", no_pv, vec![]),
            ("quorum not enabled", not_quorum_enabled, vec![]),
        ] {
            assert_eq!(after_timeout(&observed, &settings()), expected, "{case}");
        }
    }

    #[test]
    fn satellite_pods_map_drbd_names_to_nodes() {
        let mut observed = primary_lost();
        observed.drbd.resources[0].connections[0].name = "linstor-a".into();
        observed.satellite_nodes.insert("linstor-a".into(), "node-a".into());
        assert_eq!(
            after_timeout(&observed, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum"
        );
    }

    #[test]
    fn the_guard_refuses_the_whole_fail_over_past_the_fraction() {
        let mut observed = primary_lost();
        observed
            .nodes
            .insert("node-c".into(), node("node-c", true, &[LOST_QUORUM_TAINT]).1);
        assert_eq!(
            after_timeout(&observed, &settings()),
            ["refused taint node-a drbd.linbit.com/lost-quorum"],
            "no force-delete and no attachment deletion either"
        );
        // Nodes outside the storage nodes (no agent, no DRBD peer) do not dilute the fraction.
        for extra in ["node-d", "node-e", "node-f"] {
            observed.nodes.insert(extra.into(), node(extra, true, &[]).1);
        }
        assert_eq!(after_timeout(&observed, &settings()).len(), 1);
        observed.agent_nodes = ["node-d", "node-e", "node-f"].map(String::from).into();
        assert_eq!(
            after_timeout(&observed, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum",
            "2 of 6 storage nodes"
        );
    }

    #[test]
    fn the_guard_counts_tainted_and_reserved_nodes() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert!(guard_allows(&set(&[]), "a", 6, 0.5).is_ok());
        assert!(guard_allows(&set(&["b", "c"]), "a", 6, 0.5).is_ok());
        assert!(guard_allows(&set(&["b", "c", "d"]), "a", 6, 0.5).is_err());
        assert!(
            guard_allows(&set(&["a", "b", "c"]), "a", 6, 0.5).is_ok(),
            "already counted"
        );
        assert!(guard_allows(&set(&[]), "a", 1, 0.5).is_err());
        assert!(guard_allows(&set(&[]), "a", 0, 1.0).is_ok());
    }

    #[test]
    fn own_taints_come_and_go() {
        let mut observed = primary_lost();
        observed.drbd.resources[0].connections.clear();
        observed.drbd.resources[0].devices[0].quorum = false;
        observed.drbd.resources[0].force_io_failures = true;
        observed.volumes.get_mut("pvc-1").unwrap().pods = vec![pod("local", "node-b")];
        let actions = decide(&observed, &settings(), &mut Timers::new(), Instant::now());
        assert_eq!(
            kinds(&actions),
            [
                "evict local",
                "taint node-b drbd.linbit.com/lost-quorum",
                "taint node-b drbd.linbit.com/force-io-error"
            ]
        );
        let mut healed = primary_lost();
        healed.drbd.resources[0].connections.clear();
        healed.nodes.insert(
            "node-b".into(),
            node("node-b", true, &[LOST_QUORUM_TAINT, FORCE_IO_ERROR_TAINT]).1,
        );
        let actions = decide(&healed, &settings(), &mut Timers::new(), Instant::now());
        assert_eq!(
            kinds(&actions),
            [
                "untaint node-b drbd.linbit.com/lost-quorum",
                "untaint node-b drbd.linbit.com/force-io-error"
            ]
        );
        let quiet = DecisionSettings {
            disable_node_taints: true,
            ..settings()
        };
        assert!(decide(&healed, &quiet, &mut Timers::new(), Instant::now()).is_empty());
    }

    #[test]
    fn a_fail_over_taint_stays_until_the_node_is_back_and_reconnected() {
        // Node b was failed over by a peer; it has quorum again, but its link to a is down.
        let mut observed = primary_lost();
        observed.drbd.resources[0].devices[0].quorum = true;
        observed.volumes.clear();
        let failed_over = node_with("node-b", true, &[(LOST_QUORUM_TAINT, TAINT_BY_FAIL_OVER)]).1;
        observed.nodes.insert("node-b".into(), failed_over);
        assert!(decide(&observed, &settings(), &mut Timers::new(), Instant::now()).is_empty());
        // Every link back: the node's own agent removes it.
        observed.drbd.resources[0].connections[0].connection_state = "Connected".into();
        assert_eq!(
            kinds(&decide(&observed, &settings(), &mut Timers::new(), Instant::now())),
            ["untaint node-b drbd.linbit.com/lost-quorum"]
        );
        // A taint some operator put with another value is not ours to remove.
        let foreign = node_with("node-b", true, &[(LOST_QUORUM_TAINT, "maintenance")]).1;
        observed.nodes.insert("node-b".into(), foreign);
        assert!(decide(&observed, &settings(), &mut Timers::new(), Instant::now()).is_empty());
    }

    #[test]
    fn a_suspended_primary_without_local_consumers_is_demoted_after_the_hold_off() {
        let mut observed = primary_lost();
        observed.drbd.resources[0] = Resource {
            suspended: true,
            ..resource("Primary", false, &[])
        };
        let pending = PodView {
            running: false,
            ..pod("local", "node-b")
        };
        let cases = [
            ("no local pod", vec![pod("remote", "node-a")], true),
            ("running local pod", vec![pod("local", "node-b")], false),
            ("pending local pod", vec![pending], false),
            (
                "terminating local pod",
                vec![PodView {
                    terminating: true,
                    ..pod("local", "node-b")
                }],
                true,
            ),
        ];
        let demoted = |observed: &Observed| {
            let t0 = Instant::now();
            let mut timers = Timers::new();
            let at_once = kinds(&decide(observed, &settings(), &mut timers, t0));
            assert!(!at_once.contains(&"secondary --force pvc-1".to_string()), "hold-off");
            let later = kinds(&decide(observed, &settings(), &mut timers, t0 + Duration::from_secs(5)));
            later.contains(&"secondary --force pvc-1".to_string())
        };
        for (case, pods, expected) in cases {
            observed.volumes.get_mut("pvc-1").unwrap().pods = pods;
            assert_eq!(demoted(&observed), expected, "{case}");
        }
        let mut no_pv = observed.clone();
        no_pv.volumes.clear();
        no_pv.drbd.quorum_enabled.clear();
        assert!(demoted(&no_pv), "any resource, with or without a PV or quorum");
    }

    #[test]
    fn a_primary_with_quorum_publishes_itself_and_an_isolated_one_never() {
        let mut primary = primary_lost();
        primary.drbd.resources[0] = resource("Primary", true, &[("node-a", "Connecting", "Unknown")]);
        primary.volumes.get_mut("pvc-1").unwrap().attachments.clear();
        primary.volumes.get_mut("pvc-1").unwrap().pods.clear();
        assert_eq!(
            kinds(&decide(&primary, &settings(), &mut Timers::new(), Instant::now())),
            ["publish pvc-1 10.0.0.2:2049"]
        );
        let mut isolated = primary.clone();
        isolated.drbd.resources[0].devices[0].quorum = false;
        let actions = kinds(&decide(&isolated, &settings(), &mut Timers::new(), Instant::now()));
        assert!(!actions.iter().any(|a| a.starts_with("publish")), "{actions:?}");
        let mut published = primary.clone();
        published.volumes.get_mut("pvc-1").unwrap().service_endpoint = Some("10.0.0.2:2049".into());
        assert!(decide(&published, &settings(), &mut Timers::new(), Instant::now()).is_empty());
        assert_eq!(
            kinds(&republish(&published, &settings())),
            ["publish pvc-1 10.0.0.2:2049"]
        );
        assert!(republish(&isolated, &settings()).is_empty());
        let mut ipv6 = primary;
        ipv6.node_ip = Some("fd00::2".into());
        assert_eq!(
            kinds(&decide(&ipv6, &settings(), &mut Timers::new(), Instant::now())),
            ["publish pvc-1 [fd00::2]:2049"]
        );
    }

    /// This node in `role` of pvc-1, attached nowhere, its endpoint published at this node.
    fn served_from_here(role: &str) -> Observed {
        let mut observed = primary_lost();
        observed.drbd.resources[0] = resource(role, true, &[]);
        let volume = observed.volumes.get_mut("pvc-1").unwrap();
        volume.attachments.clear();
        volume.service_endpoint = Some("10.0.0.2:2049".into());
        observed
    }

    #[test]
    fn a_new_primary_publishes_even_when_its_cache_still_shows_its_own_endpoint() {
        // This node served the volume before; the primary moved away and back faster than the
        // other node's publication reached this node's cache.
        let mut secondary = served_from_here("Secondary");
        secondary.volumes.get_mut("pvc-1").unwrap().pods.clear();
        let mut primary = secondary.clone();
        primary.drbd.resources[0] = resource("Primary", true, &[]);

        let mut timers = Timers::new();
        let now = Instant::now();
        assert!(
            decide(&primary, &settings(), &mut timers, now).is_empty(),
            "a freshly listed cache is believed"
        );
        assert!(decide(&secondary, &settings(), &mut timers, now).is_empty());
        assert_eq!(
            kinds(&decide(&primary, &settings(), &mut timers, now)),
            ["publish pvc-1 10.0.0.2:2049"],
            "promoted: published whatever the cache says"
        );
        assert!(
            decide(&primary, &settings(), &mut timers, now).is_empty(),
            "still primary: the cache decides again"
        );
    }

    #[test]
    fn a_draining_node_moves_the_consumers_of_its_shared_primaries() {
        let mut observed = served_from_here("Primary");
        let volume = observed.volumes.get_mut("pvc-1").unwrap();
        volume.pods = vec![pod("server", "node-b"), pod("elsewhere", "node-c")];
        let evacuate = DecisionSettings {
            evacuate_taint: Some("piraeus.io/evacuate".into()),
            ..settings()
        };
        let cordoned = NodeView {
            unschedulable: true,
            ..node("node-b", true, &[]).1
        };
        let tainted = node("node-b", true, &["piraeus.io/evacuate"]).1;
        for (case, own, policy, expected) in [
            ("cordoned", cordoned.clone(), &evacuate, vec!["evict server"]),
            ("evacuate taint", tainted, &evacuate, vec!["evict server"]),
            ("policy ignore", cordoned, &settings(), vec![]),
            ("not draining", node("node-b", true, &[]).1, &evacuate, vec![]),
        ] {
            observed.nodes.insert("node-b".into(), own);
            let actions = kinds(&decide(&observed, policy, &mut Timers::new(), Instant::now()));
            assert_eq!(actions, expected, "{case}");
        }
    }

    #[test]
    fn terminating_pods_on_a_dead_node_are_force_deleted() {
        let mut observed = primary_lost();
        observed.volumes.get_mut("pvc-1").unwrap().pods[0].terminating = true;
        assert!(after_timeout(&observed, &settings()).contains(&"force-delete app".to_string()));
    }

    #[test]
    fn the_timers_of_gone_peers_and_demotions_are_dropped() {
        let mut timers = Timers::new();
        timers.fail_over.insert(("gone".into(), "peer".into()), Instant::now());
        timers.suspended.insert("gone".into(), Instant::now());
        decide(&primary_lost(), &settings(), &mut timers, Instant::now());
        let kept: Vec<_> = timers.fail_over.keys().cloned().collect();
        assert_eq!(kept, [("pvc-1".to_string(), "node-a".to_string())]);
        assert!(timers.suspended.is_empty());
    }
}
