//! Demotion of a primary whose IO is suspended because it lost quorum or has no up-to-date data
//! to reach: one that no local pod uses is forced to Secondary after the hold-off, when a peer can
//! take over. IO suspended for any other reason (a snapshot suspends it on every replica, a fence
//! handler until it answers) is left to end by itself.

use std::time::Instant;

use super::settings::DecisionSettings;
use crate::agent::action::Action;
use crate::agent::drbd::Resource;
use crate::agent::view::{Observed, Timers, VolumeView};

/// Forced demotions due now; the hold-off timers of resources no longer waiting are dropped.
pub(super) fn demotions(
    observed: &Observed,
    settings: &DecisionSettings,
    timers: &mut Timers,
    now: Instant,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut waiting = Vec::new();
    for resource in &observed.drbd.resources {
        let volume = observed.volumes.get(&resource.name);
        if let Some(demote) = demotion(observed, settings, timers, resource, volume, now) {
            waiting.push(resource.name.clone());
            actions.extend(demote);
        }
    }
    timers.suspended.retain(|resource, _| waiting.contains(resource));
    actions
}

/// A primary suspended for good ([`Resource::suspended_for_good`]), with no local consumer (any pod of the volume
/// here that has not finished and is not terminating, Pending included) and a peer that can take
/// over is demoted after the hold-off. Any resource, with or without a PV. `Some` while the
/// hold-off runs or is over.
fn demotion(
    observed: &Observed,
    settings: &DecisionSettings,
    timers: &mut Timers,
    resource: &Resource,
    volume: Option<&VolumeView>,
    now: Instant,
) -> Option<Option<Action>> {
    if !(resource.suspended_for_good() && resource.is_primary()) {
        return None;
    }
    if !peer_can_take_over(observed, resource) {
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

/// Whether a peer can take the primary role over: a live agent states the resource with quorum
/// (it is on the side of the partition that has it). A peer still connected to this node is on
/// this side, without quorum too.
fn peer_can_take_over(observed: &Observed, resource: &Resource) -> bool {
    observed
        .reports
        .keys()
        .filter(|node| **node != observed.node)
        .any(|node| observed.alive_report(node, &resource.name).is_some_and(|r| r.quorum))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;

    /// Whether the suspended primary `resource` of pvc-1 on node b, with no local consumer, is
    /// forced down once the hold-off is over.
    fn forced_down(resource: Resource, reports: &[(&str, PeerReport)]) -> bool {
        let mut observed = primary_lost();
        observed.drbd.resources[0] = resource;
        observed.volumes.get_mut("pvc-1").unwrap().pods.clear();
        observed.reports = reports.iter().map(|(n, r)| (n.to_string(), r.clone())).collect();
        decided_after(&observed, &settings(), Duration::from_secs(5)).contains(&"secondary --force pvc-1".to_string())
    }

    /// `resource`, suspended for each of `reasons` (`user`, `no-data`, `fencing`, `quorum`).
    fn suspended_for(resource: &Resource, reasons: &[&str]) -> Resource {
        Resource {
            suspended: true,
            suspended_user: Some(reasons.contains(&"user")),
            suspended_no_data: Some(reasons.contains(&"no-data")),
            suspended_fencing: Some(reasons.contains(&"fencing")),
            suspended_quorum: Some(reasons.contains(&"quorum")),
            ..resource.clone()
        }
    }

    fn suspended(resource: &Resource, user: bool, quorum: bool) -> Resource {
        let reasons: Vec<&str> = [("user", user), ("quorum", quorum)]
            .into_iter()
            .filter_map(|(reason, on)| on.then_some(reason))
            .collect();
        suspended_for(resource, &reasons)
    }

    #[test]
    fn a_quorum_or_no_data_suspension_with_a_successor_forces_a_primary_down_and_a_snapshot_never() {
        let isolated = resource("Primary", false, &[("node-a", "Connecting", "Unknown")]);
        let with_quorum = resource("Primary", true, &[("node-a", "Connected", "Secondary")]);
        let successor = [("node-a", report(false, true, &["node-c"], &["node-b"], true))];
        let cases = [
            (
                "quorum suspension, no quorum, a peer with quorum",
                suspended(&isolated, false, true),
                &successor[..],
                true,
            ),
            (
                "snapshot (user) suspension with quorum",
                suspended(&with_quorum, true, false),
                &successor[..],
                false,
            ),
            (
                "snapshot (user) suspension, no quorum",
                suspended(&isolated, true, false),
                &successor[..],
                false,
            ),
            (
                "no-data suspension (on-no-data-accessible suspend-io), a peer with quorum",
                suspended_for(&isolated, &["no-data"]),
                &successor[..],
                true,
            ),
            (
                "snapshot and quorum suspensions, no quorum",
                suspended_for(&isolated, &["user", "quorum"]),
                &successor[..],
                true,
            ),
            (
                "fencing suspension, no quorum: left to the fence handler",
                suspended_for(&isolated, &["fencing"]),
                &successor[..],
                false,
            ),
            (
                "quorum suspension, nobody to take over",
                suspended(&isolated, false, true),
                &[][..],
                false,
            ),
            (
                "quorum suspension, the peer's agent is dead",
                suspended(&isolated, false, true),
                &[("node-a", report(false, true, &["node-c"], &["node-b"], false))][..],
                false,
            ),
            (
                "quorum suspension, the peer has no quorum either",
                suspended(&isolated, false, true),
                &[("node-a", report(false, false, &[], &["node-b", "node-c"], true))][..],
                false,
            ),
        ];
        for (case, resource, reports, expected) in cases {
            assert_eq!(forced_down(resource, reports), expected, "{case}");
        }
    }

    /// A peer still connected to this node is in the same minority, whatever its disk.
    #[test]
    fn a_peer_still_connected_takes_nothing_over() {
        let isolated = resource("Primary", false, &[("node-a", "Connecting", "Unknown")]);
        let mut connected = suspended(&isolated, false, true);
        connected.connections[0].connection_state = "Connected".into();
        connected.connections[0].peer_devices = vec![peer_disk("UpToDate")];
        assert!(!forced_down(connected, &[]), "a connected peer without a report");
    }

    #[test]
    fn a_suspended_primary_without_local_consumers_is_demoted_after_the_hold_off() {
        let mut observed = primary_lost();
        observed.drbd.resources[0] = Resource {
            suspended: true,
            ..resource("Primary", false, &[])
        };
        // An older drbd-utils gives no reason; node a's agent states quorum: it can take over.
        observed.reports = [(
            "node-a".to_string(),
            report(false, true, &["node-c"], &["node-b"], true),
        )]
        .into();
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
}
