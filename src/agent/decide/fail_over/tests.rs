//! The fail-over rules' tests, by what they hold: timing, silence, consumers, the guard.

use super::super::fixtures::*;
use super::super::*;
use super::*;
use crate::agent::drbd::PromotionWord;

mod consumers;
mod guard;
mod silence;
mod timing;

/// `expected` with node a's kubelet stopped, and `alive` with it renewing or not read: a live
/// kubelet is evidence of life, so nothing is force-deleted on its node, and a silent agent's
/// pods are evicted (this node's DRBD holds the data without it).
fn decided_whatever_the_kubelet(case: &str, stopped: &Observed, expected: &[String], alive: &[String]) {
    assert_eq!(after_timeout(stopped, &settings()), expected, "{case}");
    let renewing = kubelet_renewing(stopped.clone());
    assert_eq!(
        after_timeout(&renewing, &settings()),
        alive,
        "{case}, its kubelet renewing"
    );
    let mut unread = stopped.clone();
    unread.kubelet_silent_from.clear();
    assert_eq!(
        after_timeout(&unread, &settings()),
        alive,
        "{case}, its kubelet not read"
    );
}

/// Kinds and the hold's evidence of the actions decided past the timeout, and for a minute.
fn held_for_a_minute(observed: &Observed) -> Vec<String> {
    let settings = settings();
    for elapsed in [settings.fail_over_timeout, Duration::from_secs(60)] {
        let decided = decided_after(observed, &settings, elapsed);
        assert!(
            decided.iter().all(|a| a.starts_with("hold")),
            "{decided:?} after {elapsed:?}"
        );
    }
    let (t0, mut timers) = (Instant::now(), Timers::new());
    decide(observed, &settings, &mut timers, t0);
    decide(observed, &settings, &mut timers, t0 + Duration::from_secs(60))
        .iter()
        .map(|a| match a {
            Action::HoldFailOver { evidence, .. } => evidence.clone(),
            other => panic!("not a hold: {other:?}"),
        })
        .collect()
}
