//! Evacuation on drain (`--node-drain-policy=evacuate`): a cordoned or evacuation-tainted node
//! hands the shared volumes it is primary of over, so the NFS server restarts elsewhere and the
//! endpoints follow. Where a pod holds the primary, by evicting it; where drbd-reactor does (its
//! promoter snippets), by asking drbd-reactor to evict the resource ([`promoter_hand_overs`]).

use std::collections::BTreeSet;

use super::select::{evictable, is_movable, volumes_with_quorum};
use super::settings::DecisionSettings;
use crate::agent::action::{Action, Cause};
use crate::agent::drbd::{Connection, DISKLESS, PRIMARY, Resource};
use crate::agent::view::Observed;

/// Evictions that hand this node's primaries of shared volumes over, while it drains; held (and
/// said so) for a resource no connected peer could take over with all of its data.
pub(super) fn evictions(observed: &Observed, settings: &DecisionSettings) -> Vec<Action> {
    if !evacuating(observed, settings) {
        return Vec::new();
    }
    let mut actions = Vec::new();
    for (resource, volume) in volumes_with_quorum(observed) {
        if !(resource.is_primary() && volume.shared_claim.is_some()) {
            continue;
        }
        if !resource.connections.iter().any(Connection::could_take_over) {
            actions.push(Action::HoldEvacuation {
                node: observed.node.clone(),
                resource: resource.name.clone(),
                pv: volume.pv.clone(),
            });
            continue;
        }
        for pod in evictable(volume, &observed.node, |p| is_movable(p, settings)) {
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
    actions
}

/// The resources drbd-reactor is asked to hand over from this node while it drains: each shared
/// one Primary here with a connected peer that has all of its data (the others are held by
/// [`evictions`], and said so), and each one a peer already serves, so that this node does not take
/// it back before the drain ends. Empty once the node is uncordoned and untainted: the requests go,
/// and drbd-reactor may promote here again.
pub fn promoter_hand_overs(observed: &Observed, settings: &DecisionSettings) -> BTreeSet<String> {
    if !evacuating(observed, settings) {
        return BTreeSet::new();
    }
    observed
        .drbd
        .resources
        .iter()
        .filter(|r| !r.devices.iter().any(|d| d.disk_state == DISKLESS))
        .filter(|r| observed.volumes.get(&r.name).is_some_and(|v| v.shared_claim.is_some()))
        .filter(|r| handed_over_or_may_be(r))
        .map(|r| r.name.clone())
        .collect()
}

/// Primary here with a peer that could take the data over, or Secondary with a Primary peer.
fn handed_over_or_may_be(resource: &Resource) -> bool {
    if resource.is_primary() {
        resource.connections.iter().any(Connection::could_take_over)
    } else {
        resource
            .connections
            .iter()
            .any(|c| c.is_connected() && c.peer_role == PRIMARY)
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::fixtures::*;
    use super::super::*;

    #[test]
    fn a_draining_node_moves_the_consumers_of_its_shared_primaries() {
        let mut observed = served_from_here("Primary");
        observed.drbd.resources[0] = resource("Primary", true, &[("node-c", "Connected", "Secondary")]);
        let volume = observed.volumes.get_mut("pvc-1").unwrap();
        volume.pods = vec![pod("server", "node-b"), pod("elsewhere", "node-c")];
        let evacuate = evacuate();
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
    fn a_drain_waits_for_a_peer_with_all_the_data() {
        let evacuate = evacuate();
        let mut observed = served_from_here("Primary");
        observed.volumes.get_mut("pvc-1").unwrap().pods = vec![pod("server", "node-b")];
        observed.nodes.insert(
            "node-b".into(),
            NodeView {
                unschedulable: true,
                ..node("node-b", true, &[]).1
            },
        );
        let syncing = |disk: &str| {
            let mut r = resource("Primary", true, &[("node-c", "Connected", "Secondary")]);
            r.connections[0].peer_devices = vec![peer_disk(disk)];
            r
        };
        for (case, resource, expected) in [
            ("a connected UpToDate peer", syncing("UpToDate"), "evict server"),
            ("no peer", resource("Primary", true, &[]), "hold evacuation pvc-1"),
            (
                "the only peer disconnected",
                resource("Primary", true, &[("node-c", "Connecting", "Unknown")]),
                "hold evacuation pvc-1",
            ),
            (
                "the only peer still syncing",
                syncing("Inconsistent"),
                "hold evacuation pvc-1",
            ),
            ("the only peer outdated", syncing("Outdated"), "hold evacuation pvc-1"),
        ] {
            observed.drbd.resources[0] = resource;
            let actions = kinds(&decide(&observed, &evacuate, &mut Timers::new(), Instant::now()));
            assert_eq!(actions, [expected], "{case}");
        }
    }

    /// On the drbd-reactor path no pod holds the primary: the drain asks drbd-reactor to evict the
    /// resource instead, only where a peer has all the data, and keeps asking while a peer serves
    /// it so that this node does not take it back; once the drain ends, nothing is asked.
    #[test]
    fn a_draining_node_asks_drbd_reactor_to_hand_its_primaries_over() {
        let evacuate = evacuate();
        let mut observed = served_from_here("Primary");
        let cordoned = NodeView {
            unschedulable: true,
            ..node("node-b", true, &[]).1
        };
        let outdated_peer = {
            let mut r = resource("Primary", true, &[("node-c", "Connected", "Secondary")]);
            r.connections[0].peer_devices = vec![peer_disk("Outdated")];
            r
        };
        let tie_breaker = {
            let mut r = resource("Secondary", true, &[("node-c", "Connected", "Primary")]);
            r.devices[0].disk_state = "Diskless".into();
            r
        };
        let ours = BTreeSet::from(["pvc-1".to_owned()]);
        let none = BTreeSet::new();
        for (case, own, policy, drbd, expected) in [
            (
                "primary, peer in sync",
                &cordoned,
                &evacuate,
                resource("Primary", true, &[("node-c", "Connected", "Secondary")]),
                &ours,
            ),
            (
                "primary, peer outdated: held",
                &cordoned,
                &evacuate,
                outdated_peer,
                &none,
            ),
            (
                "primary, no peer: held",
                &cordoned,
                &evacuate,
                resource("Primary", true, &[]),
                &none,
            ),
            (
                "handed over: kept away",
                &cordoned,
                &evacuate,
                resource("Secondary", true, &[("node-c", "Connected", "Primary")]),
                &ours,
            ),
            (
                "secondary, no primary anywhere",
                &cordoned,
                &evacuate,
                resource("Secondary", true, &[("node-c", "Connected", "Secondary")]),
                &none,
            ),
            ("a tie-breaker serves nothing", &cordoned, &evacuate, tie_breaker, &none),
            (
                "drain over",
                &node("node-b", true, &[]).1,
                &evacuate,
                resource("Primary", true, &[("node-c", "Connected", "Secondary")]),
                &none,
            ),
            (
                "policy ignore",
                &cordoned,
                &settings(),
                resource("Primary", true, &[("node-c", "Connected", "Secondary")]),
                &none,
            ),
        ] {
            observed.nodes.insert("node-b".into(), own.clone());
            observed.drbd.resources[0] = drbd;
            assert_eq!(&promoter_hand_overs(&observed, policy), expected, "{case}");
        }
    }

    #[test]
    fn a_volume_not_shared_is_never_handed_over_through_drbd_reactor() {
        let evacuate = evacuate();
        let mut observed = served_from_here("Primary");
        observed.volumes.get_mut("pvc-1").unwrap().shared_claim = None;
        observed
            .nodes
            .insert("node-b".into(), node("node-b", true, &["piraeus.io/evacuate"]).1);
        observed.drbd.resources[0] = resource("Primary", true, &[("node-c", "Connected", "Secondary")]);
        assert_eq!(promoter_hand_overs(&observed, &evacuate), BTreeSet::new());
    }

    /// The chart's drain policy: `evacuate`, with Piraeus's taint.
    fn evacuate() -> DecisionSettings {
        DecisionSettings {
            evacuate_taint: Some("piraeus.io/evacuate".into()),
            ..settings()
        }
    }
}
