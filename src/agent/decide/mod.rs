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
mod select;
mod server_gate;
mod settings;

use std::time::Instant;

use super::action::Action;
use super::view::{Observed, Timers};

pub use evacuation::promoter_hand_overs;
pub use fail_over::guard_allows;
pub use publication::republish;
pub use server_gate::{
    Unanswered, answering_again, endpoints_to_probe, held_until_answered, not_answering, served_but_not_answering,
};
pub use settings::DecisionSettings;

/// Decides what to do now: [`publications`], then the [`steps`]. `timers` is updated in place:
/// started, kept or reset.
pub fn decide(observed: &Observed, settings: &DecisionSettings, timers: &mut Timers, now: Instant) -> Vec<Action> {
    let mut actions = publications(observed, settings, timers, now);
    actions.extend(steps(observed, settings, timers, now));
    actions
}

/// The publications this node owes: they depend only on its own DRBD state and cached PVs, so
/// the loop decides and carries them out before it reads anything about suspected peers.
pub fn publications(
    observed: &Observed,
    settings: &DecisionSettings,
    timers: &mut Timers,
    now: Instant,
) -> Vec<Action> {
    publication::publications(observed, settings, timers, now)
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
