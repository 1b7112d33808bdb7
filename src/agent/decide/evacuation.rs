//! Evacuation on drain (`--node-drain-policy=evacuate`): a cordoned or evacuation-tainted node
//! evicts the consumers of the shared volumes it is primary of, so the NFS server restarts
//! elsewhere and the endpoints follow.

use super::select::{evictable, is_movable, volumes_with_quorum};
use super::settings::DecisionSettings;
use crate::agent::action::{Action, Cause};
use crate::agent::drbd::Connection;
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
    use super::super::fixtures::*;
    use super::super::*;

    #[test]
    fn a_draining_node_moves_the_consumers_of_its_shared_primaries() {
        let mut observed = served_from_here("Primary");
        observed.drbd.resources[0] = resource("Primary", true, &[("node-c", "Connected", "Secondary")]);
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
    fn a_drain_waits_for_a_peer_with_all_the_data() {
        let evacuate = DecisionSettings {
            evacuate_taint: Some("piraeus.io/evacuate".into()),
            ..settings()
        };
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
}
