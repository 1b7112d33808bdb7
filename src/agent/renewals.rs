//! When each peer's Lease was last seen renewed, on this agent's own monotonic clock, as
//! Kubernetes's node-lifecycle controller times kubelets: a renewal counts from the moment this
//! agent saw the Lease's `renewTime` change, never from a time stamped by a writer or by one of
//! several API servers, whose clocks may be seconds apart. Only the first sight of a Lease has no
//! change to time: it is placed by the API server's clock as this agent knows it.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A Lease: (namespace, name).
pub type LeaseKey = (String, String);

#[derive(Clone, Debug, Default)]
pub struct Renewals {
    seen: HashMap<LeaseKey, Seen>,
}

#[derive(Clone, Debug, PartialEq)]
struct Seen {
    /// `spec.renewTime` as written: any change is a renewal.
    renew_time: String,
    /// When this agent saw it change (or first saw it).
    at: Instant,
}

impl Renewals {
    /// The Lease `key` read `now` with `renew_time`. A change counts as a renewal seen now; the
    /// first sight as one `age` ago (the server's clock), or now where the age is not known.
    pub fn observe(&mut self, key: &LeaseKey, renew_time: &str, now: Instant, age: Option<Duration>) {
        match self.seen.get_mut(key) {
            Some(seen) if seen.renew_time == renew_time => {}
            Some(seen) => {
                *seen = Seen {
                    renew_time: renew_time.to_owned(),
                    at: now,
                }
            }
            None => {
                let at = age.and_then(|age| now.checked_sub(age)).unwrap_or(now);
                let renew_time = renew_time.to_owned();
                self.seen.insert(key.clone(), Seen { renew_time, at });
            }
        }
    }

    /// When `key` was last seen renewed; `None` if it never was seen.
    pub fn last_renewed(&self, key: &LeaseKey) -> Option<Instant> {
        self.seen.get(key).map(|seen| seen.at)
    }

    /// Forgets every Lease but `keep`.
    pub fn retain(&mut self, keep: &BTreeSet<LeaseKey>) {
        self.seen.retain(|key, _| keep.contains(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LeaseKey {
        ("kube-node-lease".into(), "node-a".into())
    }

    /// A renewal counts from when it was seen, whatever the server's stamps say after the first
    /// sight: Leases stamped by an API server whose clock is 10 s behind do not age faster.
    #[test]
    fn a_renewal_counts_from_when_it_was_seen_changing() {
        let t0 = Instant::now();
        let mut renewals = Renewals::default();
        renewals.observe(&key(), "12:00:00", t0, Some(Duration::from_secs(4)));
        assert_eq!(
            renewals.last_renewed(&key()),
            Some(t0 - Duration::from_secs(4)),
            "first sight: the server's age"
        );
        let later = t0 + Duration::from_secs(6);
        renewals.observe(&key(), "12:00:00", later, Some(Duration::from_secs(20)));
        assert_eq!(
            renewals.last_renewed(&key()),
            Some(t0 - Duration::from_secs(4)),
            "unchanged: a skewed stamp read again moves nothing"
        );
        renewals.observe(&key(), "12:00:10", later, Some(Duration::from_secs(30)));
        assert_eq!(
            renewals.last_renewed(&key()),
            Some(later),
            "a change is a renewal seen now"
        );
        renewals.retain(&BTreeSet::new());
        assert_eq!(renewals.last_renewed(&key()), None);
        renewals.observe(&key(), "12:00:20", later, None);
        assert_eq!(renewals.last_renewed(&key()), Some(later), "no age known: now");
    }
}
