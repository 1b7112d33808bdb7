//! The HA agent's rules: a pure function from what this node observes ([`Observed`]: DRBD state,
//! the Kubernetes objects that matter, the peers' reports, the running timers, now) to the
//! [`Action`]s to take. One file per rule; [`decide`] runs them in order. The shell fetches the
//! observations and carries out the actions; nothing here does I/O.

mod coexistence;
mod demotion;
mod evacuation;
mod fail_over;
#[cfg(test)]
mod fixtures;
mod force_io;
mod own_taints;
mod publication;

use std::time::{Duration, Instant};

use super::action::Action;
use super::drbd::Resource;
use super::view::{Observed, PodView, Timers, VolumeView};

pub use fail_over::guard_allows;
pub use publication::republish;

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
    /// How long the API server must have answered this agent before a Ready peer's silence or
    /// stated loss of quorum counts: time for the peers to restate after an outage
    /// (`--fail-over-timeout` + `--reconcile-interval`).
    pub peers_restate_within: Duration,
    /// How soon a peer's agent states a change of its DRBD view (`--reconcile-interval`).
    pub report_interval: Duration,
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
            peers_restate_within: Duration::ZERO,
            report_interval: Duration::from_secs(5),
        }
    }
}

/// Decides what to do now: [`publications`], then the [`steps`]. `timers` is updated in place:
/// started, kept or reset.
pub fn decide(observed: &Observed, settings: &DecisionSettings, timers: &mut Timers, now: Instant) -> Vec<Action> {
    let mut actions = publications(observed, settings, timers);
    actions.extend(steps(observed, settings, timers, now));
    actions
}

/// The publications this node owes: they depend only on its own DRBD state and cached PVs, so
/// the loop decides and carries them out before it reads anything about suspected peers.
pub fn publications(observed: &Observed, settings: &DecisionSettings, timers: &mut Timers) -> Vec<Action> {
    publication::publications(observed, settings, timers)
}

/// Everything but the publications: force-IO evictions, demotions, evacuation, this node's
/// taints, fail-overs of lost peers.
pub fn steps(observed: &Observed, settings: &DecisionSettings, timers: &mut Timers, now: Instant) -> Vec<Action> {
    let mut actions = coexistence::warnings(observed);
    actions.extend(force_io::evictions(observed));
    actions.extend(demotion::demotions(observed, settings, timers, now));
    actions.extend(evacuation::evictions(observed, settings));
    if !settings.disable_node_taints {
        actions.extend(own_taints::lost_quorum(observed, settings, timers, now));
        actions.extend(own_taints::force_io_error(observed));
    }
    actions.extend(fail_over::fail_overs(observed, settings, timers, now));
    actions
}

/// The quorum-enabled local resources that back a PV, with its volume: the only ones that are
/// published, evacuated or failed over (a resource without a PV has no consumers to move).
fn volumes_with_quorum(observed: &Observed) -> impl Iterator<Item = (&Resource, &VolumeView)> {
    observed
        .drbd
        .resources
        .iter()
        .filter(|r| observed.drbd.quorum_enabled.contains(&r.name))
        .filter_map(|r| Some((r, observed.volumes.get(&r.name)?)))
}

/// Pods we may move: owned, not opted out, not read-only, safe to fail over.
fn is_movable(pod: &PodView, settings: &DecisionSettings) -> bool {
    pod.has_owner && !pod.ignore_fail_over && !pod.read_only && (settings.fail_over_unsafe_pods || !pod.unsafe_volumes)
}

/// Pods of the volume on `node`, not already on their way out, that `may_move` lets go.
fn evictable<'a>(
    volume: &'a VolumeView,
    node: &'a str,
    may_move: impl Fn(&PodView) -> bool + 'a,
) -> impl Iterator<Item = &'a PodView> {
    volume
        .pods
        .iter()
        .filter(move |p| p.node == node && !p.finished && !p.terminating && may_move(p))
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

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
