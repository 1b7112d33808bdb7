//! This node's own taints: `lost-quorum` while a local resource lacks quorum, `force-io-error`
//! while one forces IO errors; each removed by this node's agent when the cause is gone.

use std::time::Instant;

use super::settings::DecisionSettings;
use crate::agent::action::{Action, Cause};
use crate::agent::view::{Observed, Timers};
use crate::names::{FORCE_IO_ERROR_TAINT, LOST_QUORUM_TAINT, TAINT_BY_FAIL_OVER, TAINT_BY_OWN_AGENT};

/// The lost-quorum taint on this node: added once a local resource has lacked quorum for the
/// fail-over timeout (a resource being created or a node booting lacks it for a moment); removed
/// when none does if this agent put it, or, if a peer put it in a fail-over, once the node is
/// back (Ready) with quorum for every resource.
pub(super) fn lost_quorum(
    observed: &Observed,
    settings: &DecisionSettings,
    timers: &mut Timers,
    now: Instant,
) -> Option<Action> {
    let quorum_enabled = || {
        observed
            .drbd
            .resources
            .iter()
            .filter(|r| observed.drbd.quorum_enabled.contains(&r.name))
    };
    let lost: Vec<&str> = quorum_enabled()
        .filter(|r| !r.has_quorum())
        .map(|r| r.name.as_str())
        .collect();
    let node = observed.node.clone();
    let own = observed.nodes.get(&node);
    let value = own.and_then(|n| n.taint_value(LOST_QUORUM_TAINT));
    timers.quorum_lost.retain(|name, _| lost.contains(&name.as_str()));
    if !lost.is_empty() {
        // One timer per resource: resources created one after another each lack quorum for a
        // moment, and together would look like a node that lost it.
        for name in &lost {
            timers.quorum_lost.entry((*name).to_owned()).or_insert(now);
        }
        let long_enough = timers
            .quorum_lost
            .values()
            .any(|since| now.duration_since(*since) >= settings.fail_over_timeout);
        return (value.is_none() && long_enough).then(|| Action::Taint {
            node,
            key: LOST_QUORUM_TAINT,
            value: TAINT_BY_OWN_AGENT,
            cause: Cause::LostQuorum,
            note: format!("DRBD resource(s) {} lost quorum on this node", lost.join(", ")),
        });
    }
    let note = match value {
        // A taint without a value was put by an earlier version, which did not say who.
        Some(TAINT_BY_OWN_AGENT | "") => "no DRBD resource on this node is without quorum any more",
        // Quorum, not every link: a peer down for good would otherwise keep the taint, and the
        // blast-radius guard, counting it, would refuse that peer's own fail-over.
        Some(TAINT_BY_FAIL_OVER) if own.is_some_and(|n| n.ready) => {
            "the node is back and every DRBD resource on it has quorum"
        }
        _ => return None,
    };
    Some(Action::Untaint {
        node,
        key: LOST_QUORUM_TAINT,
        cause: Cause::LostQuorum,
        note: note.into(),
    })
}

/// The force-io-error taint on this node, while a local resource forces IO errors.
pub(super) fn force_io_error(observed: &Observed) -> Option<Action> {
    let forcing: Vec<&str> = observed
        .drbd
        .resources
        .iter()
        .filter(|r| r.force_io_failures)
        .map(|r| r.name.as_str())
        .collect();
    let node = observed.node.clone();
    let tainted = observed.has_taint(&node, FORCE_IO_ERROR_TAINT);
    if !forcing.is_empty() && !tainted {
        Some(Action::Taint {
            node,
            key: FORCE_IO_ERROR_TAINT,
            value: TAINT_BY_OWN_AGENT,
            cause: Cause::ForceIoErrors,
            note: format!("DRBD resource(s) {} force IO errors on this node", forcing.join(", ")),
        })
    } else if forcing.is_empty() && tainted {
        Some(Action::Untaint {
            node,
            key: FORCE_IO_ERROR_TAINT,
            cause: Cause::ForceIoErrors,
            note: "no DRBD resource on this node forces IO errors any more".into(),
        })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;
    use crate::agent::drbd::Resource;

    #[test]
    fn own_taints_come_and_go() {
        let mut observed = primary_lost();
        observed.drbd.resources[0].connections.clear();
        observed.drbd.resources[0].devices[0].quorum = false;
        observed.drbd.resources[0].force_io_failures = true;
        observed.volumes.get_mut("pvc-1").unwrap().pods = vec![pod("local", "node-b")];
        let t0 = Instant::now();
        let mut timers = Timers::new();
        let actions = decide(&observed, &settings(), &mut timers, t0);
        assert_eq!(
            kinds(&actions),
            ["evict local", "taint node-b drbd.linbit.com/force-io-error"],
            "a resource just without quorum may be one being created, or a node booting"
        );
        let actions = decide(&observed, &settings(), &mut timers, t0 + Duration::from_secs(5));
        assert_eq!(
            kinds(&actions),
            [
                "evict local",
                "taint node-b drbd.linbit.com/lost-quorum",
                "taint node-b drbd.linbit.com/force-io-error"
            ],
            "without quorum for the fail-over timeout"
        );
        // Quorum back in between: the wait starts again.
        let mut timers = Timers::new();
        decide(&observed, &settings(), &mut timers, t0);
        let mut back = observed.clone();
        back.drbd.resources[0].devices[0].quorum = true;
        decide(&back, &settings(), &mut timers, t0 + Duration::from_secs(3));
        let actions = kinds(&decide(
            &observed,
            &settings(),
            &mut timers,
            t0 + Duration::from_secs(6),
        ));
        assert!(
            !actions.contains(&"taint node-b drbd.linbit.com/lost-quorum".to_string()),
            "{actions:?}"
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

    /// A node failed over by its peers and back, Ready, with quorum for every resource, has its
    /// fail-over taint removed though another peer is down: waiting for every link kept the
    /// taint for as long as that peer stayed away, and the blast-radius guard, counting it,
    /// refused that peer's own fail-over (a 600 s soak: a lost node's pods left in place).
    #[test]
    fn a_node_back_with_quorum_loses_its_fail_over_taint_while_another_peer_is_down() {
        let mut back = primary_lost();
        back.nodes.insert(
            "node-b".into(),
            node_with("node-b", true, &[(LOST_QUORUM_TAINT, TAINT_BY_FAIL_OVER)]).1,
        );
        // Node b: connected to c, its link to a (lost) down; quorum with c.
        assert!(back.drbd.resources[0].has_quorum());
        assert!(!back.drbd.resources[0].fully_connected());
        let actions = kinds(&decide(&back, &settings(), &mut Timers::new(), Instant::now()));
        assert!(
            actions.contains(&"untaint node-b drbd.linbit.com/lost-quorum".to_string()),
            "{actions:?}"
        );
        // Not before its kubelet is back, nor without quorum.
        let mut not_ready = back.clone();
        not_ready.nodes.get_mut("node-b").unwrap().ready = false;
        let mut without_quorum = back.clone();
        without_quorum.drbd.resources[0].devices[0].quorum = false;
        for (case, observed) in [("NotReady", not_ready), ("without quorum", without_quorum)] {
            let actions = kinds(&decide(&observed, &settings(), &mut Timers::new(), Instant::now()));
            assert!(!actions.iter().any(|a| a.starts_with("untaint")), "{case}: {actions:?}");
        }
    }

    #[test]
    fn resources_created_one_after_another_do_not_taint_the_node() {
        // Each new resource lacks quorum for 3 s of the 5 s timeout while it connects; the
        // next one starts lacking it before the last one has it.
        // Resources as (name, has quorum).
        let lacking = |resources: &[(&str, bool)]| {
            let mut observed = primary_lost();
            observed.volumes.clear();
            let template = observed.drbd.resources[0].clone();
            observed.drbd.resources = resources
                .iter()
                .map(|(name, quorum)| {
                    let mut resource = Resource {
                        name: (*name).to_owned(),
                        ..template.clone()
                    };
                    resource.devices[0].quorum = *quorum;
                    resource
                })
                .collect();
            observed.drbd.quorum_enabled = resources.iter().map(|(name, _)| (*name).to_owned()).collect();
            observed
        };
        let t0 = Instant::now();
        let at = |seconds: u64| t0 + Duration::from_secs(seconds);
        let mut timers = Timers::new();
        let rounds = [
            (0, lacking(&[("r1", false)])),
            (2, lacking(&[("r1", false), ("r2", false)])),
            (3, lacking(&[("r1", true), ("r2", false)])),
            (4, lacking(&[("r1", true), ("r2", false), ("r3", false)])),
            (5, lacking(&[("r1", true), ("r2", true), ("r3", false)])),
            (6, lacking(&[("r1", true), ("r2", true), ("r3", false), ("r4", false)])),
            (7, lacking(&[("r1", true), ("r2", true), ("r3", true), ("r4", false)])),
        ];
        for (second, observed) in &rounds {
            let actions = kinds(&decide(observed, &settings(), &mut timers, at(*second)));
            assert!(
                !actions.iter().any(|a| a.starts_with("taint")),
                "{second} s: no resource lacked quorum for the timeout: {actions:?}"
            );
        }
        // One that stays without quorum for the timeout taints, whatever came and went around it.
        let stuck = lacking(&[("r1", true), ("r2", true), ("r3", true), ("r4", false)]);
        assert_eq!(
            kinds(&decide(&stuck, &settings(), &mut timers, at(11))),
            ["taint node-b drbd.linbit.com/lost-quorum"]
        );
    }

    #[test]
    fn a_fail_over_taint_stays_until_the_node_is_back_with_quorum() {
        // Node b was failed over by a peer; it is back, its links to a and c still down.
        let mut observed = primary_lost();
        observed.drbd.resources[0].devices[0].quorum = false;
        observed.drbd.resources[0].connections[1].connection_state = "Connecting".into();
        observed.volumes.clear();
        let failed_over = node_with("node-b", true, &[(LOST_QUORUM_TAINT, TAINT_BY_FAIL_OVER)]).1;
        observed.nodes.insert("node-b".into(), failed_over);
        let actions = kinds(&decide(&observed, &settings(), &mut Timers::new(), Instant::now()));
        assert!(!actions.iter().any(|a| a.starts_with("untaint")), "{actions:?}");
        // Its link to c back, and quorum with it: the node's own agent removes it.
        observed.drbd.resources[0].connections[1].connection_state = "Connected".into();
        observed.drbd.resources[0].devices[0].quorum = true;
        assert_eq!(
            kinds(&decide(&observed, &settings(), &mut Timers::new(), Instant::now())),
            ["untaint node-b drbd.linbit.com/lost-quorum"]
        );
        // A taint some operator put with another value is not ours to remove.
        let foreign = node_with("node-b", true, &[(LOST_QUORUM_TAINT, "maintenance")]).1;
        observed.nodes.insert("node-b".into(), foreign);
        assert!(decide(&observed, &settings(), &mut Timers::new(), Instant::now()).is_empty());
    }
}
