//! What the controller knows of the claims it reconciled, for its gauges: which are served now,
//! and since when each of the others that should be served has waited for its mount endpoint.
//! Pure bookkeeping keyed by claim; time comes in as a parameter.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::ClaimKey;

/// How a claim's last reconcile ended, as far as the gauges care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Served: Service, endpoints and mount endpoint in place.
    Shared,
    /// Not ours, or not yet (no NFS server): nothing to wait for on our side.
    NotServed,
    /// Ours, but bad input stops it (a Warning tells what to fix): it waits.
    Invalid,
    /// Ours, and the reconcile failed (API, backend, timeout): it waits; whether it was served
    /// before stays as it was.
    Failed,
}

#[derive(Debug, Default)]
pub struct ClaimBook {
    shared: HashSet<ClaimKey>,
    waiting_since: HashMap<ClaimKey, SystemTime>,
    /// Failed reconciles in a row, by claim.
    failures: HashMap<ClaimKey, u32>,
    /// The desired state (a fingerprint) last converged, by claim.
    converged: HashMap<ClaimKey, u64>,
    /// Repairs of drift after convergence, by claim.
    repairs: HashMap<ClaimKey, Repairs>,
    /// The agent's move each claim was last held for, and until when: a move is held once.
    held: HashMap<ClaimKey, (MoveStamp, Instant)>,
}

/// Repairs of one claim's objects that something else keeps changing back.
#[derive(Clone, Copy, Debug)]
struct Repairs {
    count: u32,
    last: Instant,
}

/// Repairs that go through at once; after these, each waits twice as long as the one before.
pub const FREE_REPAIRS: u32 = 3;
const FIRST_REPAIR_WAIT: Duration = Duration::from_secs(1);
const MAX_REPAIR_WAIT: Duration = Duration::from_secs(300);
/// A repair this long after the previous one (beyond its wait) starts the count again.
const QUIET: Duration = Duration::from_secs(60);

impl ClaimBook {
    pub fn record(&mut self, claim: &ClaimKey, standing: Standing, now: SystemTime) {
        match standing {
            Standing::Shared => {
                self.shared.insert(claim.clone());
            }
            Standing::NotServed | Standing::Invalid => {
                self.shared.remove(claim);
            }
            Standing::Failed => {}
        }
        match standing {
            Standing::Shared | Standing::NotServed => {
                self.waiting_since.remove(claim);
            }
            Standing::Invalid | Standing::Failed => {
                self.waiting_since.entry(claim.clone()).or_insert(now);
            }
        }
        if standing == Standing::Failed {
            *self.failures.entry(claim.clone()).or_default() += 1;
        } else {
            self.failures.remove(claim);
        }
    }

    /// How long to wait before trying `claim` again after its last failure: `first` after one
    /// failure, doubling with each further one, never more than `max`.
    pub fn retry_after(&self, claim: &ClaimKey, first: Duration, max: Duration) -> Duration {
        let failures = self.failures.get(claim).copied().unwrap_or(1).max(1);
        let factor = 2u32.saturating_pow(failures - 1);
        first.saturating_mul(factor).min(max)
    }

    /// The claim is gone.
    pub fn forget(&mut self, claim: &ClaimKey) {
        self.shared.remove(claim);
        self.waiting_since.remove(claim);
        self.failures.remove(claim);
        self.converged.remove(claim);
        self.repairs.remove(claim);
        self.held.remove(claim);
    }

    /// `claim`'s objects match the desired state with this `fingerprint`.
    pub fn converged(&mut self, claim: &ClaimKey, fingerprint: u64) {
        self.converged.insert(claim.clone(), fingerprint);
    }

    /// Whether objects found out of line were last converged by us for this same desired state:
    /// then something else changed them (drift), rather than the desired state having moved on.
    pub fn converged_before(&self, claim: &ClaimKey, fingerprint: u64) -> bool {
        self.converged.get(claim) == Some(&fingerprint)
    }

    /// How long a repair of `claim` must still wait; `None`: repair now.
    pub fn repair_wait(&self, claim: &ClaimKey, now: Instant) -> Option<Duration> {
        let repairs = self.repairs.get(claim)?;
        let due = repairs.last + wait_after(repairs.count);
        (due > now).then(|| due - now)
    }

    /// The agent's move `claim` was last held for, and until when.
    pub fn held(&self, claim: &ClaimKey) -> Option<(&MoveStamp, Instant)> {
        self.held.get(claim).map(|(stamp, until)| (stamp, *until))
    }

    /// Holds `claim` for `stamp` until `until`, or keeps the hold it has for that very stamp:
    /// a move is held once. Returns how long the hold still runs.
    pub fn hold(&mut self, claim: &ClaimKey, stamp: MoveStamp, until: Instant, now: Instant) -> Duration {
        let held = self.held.entry(claim.clone()).or_insert((stamp.clone(), until));
        if held.0 != stamp {
            *held = (stamp, until);
        }
        held.1.saturating_duration_since(now)
    }

    pub fn repaired(&mut self, claim: &ClaimKey, now: Instant) {
        let repairs = self
            .repairs
            .entry(claim.clone())
            .or_insert(Repairs { count: 0, last: now });
        if now.saturating_duration_since(repairs.last) > wait_after(repairs.count) + QUIET {
            repairs.count = 0;
        }
        repairs.count += 1;
        repairs.last = now;
    }

    /// This replica stopped reconciling (lost leadership): it speaks for no claim.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    pub fn shared(&self) -> usize {
        self.shared.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting_since.len()
    }

    /// When the longest-waiting claim started waiting.
    pub fn waiting_since(&self) -> Option<SystemTime> {
        self.waiting_since.values().min().copied()
    }
}

/// The wait after `count` repairs in a row: none for the first [`FREE_REPAIRS`], then 1 s
/// doubling up to 5 minutes.
fn wait_after(count: u32) -> Duration {
    match count.checked_sub(FREE_REPAIRS) {
        None => Duration::ZERO,
        Some(beyond) => FIRST_REPAIR_WAIT
            .saturating_mul(2u32.saturating_pow(beyond))
            .min(MAX_REPAIR_WAIT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ClaimKey {
        ClaimKey {
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn a_claim_waits_from_its_first_failure_until_it_is_served_or_gone() {
        let mut book = ClaimBook::default();
        book.record(&key("a"), Standing::Failed, at(10));
        book.record(&key("b"), Standing::Invalid, at(20));
        book.record(&key("a"), Standing::Failed, at(30));
        assert_eq!((book.waiting(), book.waiting_since()), (2, Some(at(10))));
        book.record(&key("a"), Standing::Shared, at(40));
        assert_eq!(
            (book.shared(), book.waiting(), book.waiting_since()),
            (1, 1, Some(at(20)))
        );
        book.forget(&key("b"));
        assert_eq!((book.waiting(), book.waiting_since()), (0, None));
    }

    #[test]
    fn a_failure_keeps_a_served_claim_served_and_bad_input_does_not() {
        let mut book = ClaimBook::default();
        book.record(&key("a"), Standing::Shared, at(1));
        book.record(&key("a"), Standing::Failed, at(2));
        assert_eq!((book.shared(), book.waiting()), (1, 1));
        book.record(&key("a"), Standing::Invalid, at(3));
        assert_eq!((book.shared(), book.waiting_since()), (0, Some(at(2))));
        book.record(&key("a"), Standing::NotServed, at(4));
        assert_eq!((book.shared(), book.waiting()), (0, 0));
    }

    #[test]
    fn losing_leadership_clears_every_count() {
        let mut book = ClaimBook::default();
        book.record(&key("a"), Standing::Shared, at(1));
        book.record(&key("b"), Standing::Failed, at(1));
        book.clear();
        assert_eq!((book.shared(), book.waiting(), book.waiting_since()), (0, 0, None));
    }

    #[test]
    fn a_claim_that_keeps_failing_waits_longer_each_time_until_it_succeeds() {
        let (first, max) = (Duration::from_secs(5), Duration::from_secs(300));
        let mut book = ClaimBook::default();
        let mut waits = Vec::new();
        for _ in 0..9 {
            book.record(&key("a"), Standing::Failed, at(0));
            waits.push(book.retry_after(&key("a"), first, max).as_secs());
        }
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(
            book.retry_after(&key("b"), first, max).as_secs(),
            5,
            "others are not slowed down"
        );
        book.record(&key("a"), Standing::Shared, at(1));
        book.record(&key("a"), Standing::Failed, at(2));
        assert_eq!(
            book.retry_after(&key("a"), first, max).as_secs(),
            5,
            "a success starts over"
        );
        for _ in 0..100 {
            book.record(&key("a"), Standing::Failed, at(3));
        }
        assert_eq!(book.retry_after(&key("a"), first, max), max, "no overflow");
    }

    #[test]
    fn repairs_of_a_contested_claim_wait_longer_and_longer_until_it_is_left_alone() {
        let mut book = ClaimBook::default();
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..8 {
            if let Some(wait) = book.repair_wait(&key("a"), now) {
                waits.push(wait.as_secs());
                now += wait;
            } else {
                waits.push(0);
            }
            book.repaired(&key("a"), now);
        }
        assert_eq!(waits, [0, 0, 0, 1, 2, 4, 8, 16]);
        assert_eq!(
            book.repair_wait(&key("b"), now),
            None,
            "other claims are not slowed down"
        );
        // Left alone for a while: the next repair goes through, and the count starts again.
        now += Duration::from_secs(32 + 61);
        assert_eq!(book.repair_wait(&key("a"), now), None);
        book.repaired(&key("a"), now);
        assert_eq!(book.repair_wait(&key("a"), now + Duration::from_millis(1)), None);

        book.converged(&key("a"), 7);
        assert!(book.converged_before(&key("a"), 7) && !book.converged_before(&key("a"), 8));
        book.forget(&key("a"));
        assert!(!book.converged_before(&key("a"), 7));
    }
}
