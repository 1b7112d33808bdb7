//! Is the reconcile loop still turning? While this replica leads, a probe goes through the
//! controller's own queue every [`PROBE_EVERY`]: a reference to a claim that cannot exist, which
//! the runner answers with "not found" once it gets to it. A probe unanswered for longer than the
//! limit (the reconcile deadline plus a margin: every worker may be busy that long) means the loop
//! is wedged, and `/healthz` says so, so that the kubelet restarts the replica.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a probe is sent.
pub const PROBE_EVERY: Duration = Duration::from_secs(10);
/// The probe's claim name: not a valid object name, in no namespace, so no real claim matches.
pub const PROBE_NAME: &str = "liveness-probe.";

#[derive(Clone, Debug)]
pub struct Watchdog {
    /// When the oldest unanswered probe was sent.
    waiting_since: Arc<Mutex<Option<Instant>>>,
    limit: Duration,
}

impl Watchdog {
    pub fn new(limit: Duration) -> Self {
        Self {
            waiting_since: Arc::default(),
            limit,
        }
    }

    pub fn sent(&self, at: Instant) {
        self.waiting_since.lock().expect("watchdog poisoned").get_or_insert(at);
    }

    /// A probe came through: the loop turns.
    pub fn answered(&self) {
        *self.waiting_since.lock().expect("watchdog poisoned") = None;
    }

    /// The loop stopped on purpose (standby): nothing to wait for.
    pub fn stand_down(&self) {
        self.answered();
    }

    pub fn check(&self, now: Instant) -> Result<(), String> {
        match *self.waiting_since.lock().expect("watchdog poisoned") {
            Some(since) if now.duration_since(since) > self.limit => Err(format!(
                "the reconcile loop has not processed its liveness probe for {:.0?} (limit {:.0?})",
                now.duration_since(since),
                self.limit
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_unanswered_past_the_limit_fails_the_check() {
        let watchdog = Watchdog::new(Duration::from_secs(90));
        let start = Instant::now();
        assert!(watchdog.check(start).is_ok(), "nothing sent yet");
        watchdog.sent(start);
        watchdog.sent(start + Duration::from_secs(10));
        assert!(watchdog.check(start + Duration::from_secs(90)).is_ok());
        let err = watchdog.check(start + Duration::from_secs(91)).unwrap_err();
        assert!(err.contains("has not processed its liveness probe"), "{err}");
        watchdog.answered();
        assert!(
            watchdog.check(start + Duration::from_secs(200)).is_ok(),
            "answered: turning again"
        );
        watchdog.sent(start + Duration::from_secs(200));
        watchdog.stand_down();
        assert!(
            watchdog.check(start + Duration::from_secs(400)).is_ok(),
            "a standby has no loop to check"
        );
    }
}
