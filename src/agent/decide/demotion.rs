//! Demotion of a suspended primary: one that no local pod uses is forced to Secondary after the
//! hold-off, so that a peer can take over.

use std::time::Instant;

use super::DecisionSettings;
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

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;

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
}
