//! How long ago a node's agent and its kubelet last renewed their Leases, and from when each counts
//! as silent. A node whose agent and kubelet are both silent has crashed or lost the API server:
//! either way it says nothing more, and what it said before holds nothing. Silence is judged on the
//! API server's clock alone (see [`ServerClock`]), then carried over to this agent's monotonic
//! clock, on which the decisions run.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::server_clock::{ServerClock, last_write};
use crate::names::{AGENT_FIELD_MANAGER, HEARTBEAT_INTERVAL_ANNOTATION};

/// How much later than its period a live writer's renewal may be seen: a write's latency, and the
/// one-second resolution of the server's stamps.
const RENEWAL_SLACK: Duration = Duration::from_secs(3);
/// The kubelet renews its node Lease at this fraction of the Lease's duration (10 s of 40 s).
const KUBELET_RENEWALS_PER_DURATION: u32 = 4;
/// An agent that wrote no interval on its heartbeat (an older one) renews at a third of it.
const AGENT_RENEWALS_PER_DURATION: u32 = 3;

/// When this agent last saw a peer's Lease renewed, on its own clock (`Renewals`), where it
/// watches that Lease: what silence is judged on first. Without it, the API server's stamp.
pub type SeenRenewal = Option<Instant>;

/// Whether the agent of heartbeat `lease` renewed it within its duration: since this agent saw
/// it renewed, or else on the API server's clock where it and its stamp of the renewal are known.
pub fn renews(lease: &Lease, clock: &ServerClock, seen: SeenRenewal, now: Instant) -> bool {
    let age = seen
        .map(|at| now.saturating_duration_since(at))
        .or_else(|| age_on_the_servers_clock(lease, Some(AGENT_FIELD_MANAGER), clock))
        .or_else(|| age_on_the_writers_clock(lease));
    age.is_some_and(|age| age < lease_duration(lease))
}

/// From when the agent of heartbeat `lease` counts as silent, unless it renews before: two
/// renewals missed (one failed write is not silence).
pub fn agent_silent_from(lease: &Lease, clock: &ServerClock, seen: SeenRenewal, now: Instant) -> Option<Instant> {
    let written = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HEARTBEAT_INTERVAL_ANNOTATION))
        .and_then(|seconds| seconds.parse().ok())
        .map(Duration::from_secs);
    let interval = written.unwrap_or(lease_duration(lease) / AGENT_RENEWALS_PER_DURATION);
    let allowance = 2 * interval + RENEWAL_SLACK;
    if let Some(at) = seen {
        return Some(at + allowance);
    }
    let age = age_on_the_servers_clock(lease, Some(AGENT_FIELD_MANAGER), clock)?;
    Some(silent_from(age, allowance, now))
}

/// From when the kubelet of node `lease` (in `kube-node-lease`) counts as silent, unless it
/// renews before: one renewal missed (it retries a failed one at once).
pub fn kubelet_silent_from(lease: &Lease, clock: &ServerClock, seen: SeenRenewal, now: Instant) -> Option<Instant> {
    let allowance = lease_duration(lease) / KUBELET_RENEWALS_PER_DURATION + RENEWAL_SLACK;
    if let Some(at) = seen {
        return Some(at + allowance);
    }
    let age = age_on_the_servers_clock(lease, None, clock)?;
    Some(silent_from(age, allowance, now))
}

fn lease_duration(lease: &Lease) -> Duration {
    let seconds = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds).unwrap_or(0);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// How long ago the writer of `lease` says it renewed it, against this node's clock: as before the
/// server's clock or its stamp of the write is known.
fn age_on_the_writers_clock(lease: &Lease) -> Option<Duration> {
    let renewed = lease.spec.as_ref()?.renew_time.as_ref()?.0;
    Some(non_negative(Timestamp::now().duration_since(renewed)))
}

/// How long ago `lease` was last written by `manager` (anyone: `None`), on the API server's clock
/// alone: silence measured against a writer's clock would take every peer for silent on a node
/// whose own clock is ahead by more than the allowance.
pub fn age_on_the_servers_clock(lease: &Lease, manager: Option<&str>, clock: &ServerClock) -> Option<Duration> {
    Some(non_negative(clock.now()?.duration_since(last_write(lease, manager)?)))
}

fn non_negative(age: SignedDuration) -> Duration {
    Duration::try_from(age.max(SignedDuration::ZERO)).unwrap_or_default()
}

/// `allowance` after a renewal `age` old, on this agent's monotonic clock read `now`.
fn silent_from(age: Duration, allowance: Duration, now: Instant) -> Instant {
    match allowance.checked_sub(age) {
        Some(left) => now + left,
        None => now.checked_sub(age - allowance).unwrap_or(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::AGENT_FIELD_MANAGER;

    /// The server's time in the tests: a whole second, as the server stamps its writes.
    fn server_now() -> Timestamp {
        static NOW: std::sync::OnceLock<Timestamp> = std::sync::OnceLock::new();
        *NOW.get_or_init(|| Timestamp::from_second(Timestamp::now().as_second()).unwrap())
    }

    /// A Lease of `duration_seconds` last written `age_seconds` ago by `manager`, by the server's
    /// clock; its renewal time, by the writer's clock, `skew_seconds` off.
    fn lease(manager: &str, duration_seconds: i32, age_seconds: i64, skew_seconds: i64) -> Lease {
        let now = server_now();
        let taken = now - SignedDuration::from_secs(age_seconds);
        let renewed = taken + SignedDuration::from_secs(skew_seconds);
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x", "managedFields": [{
                "manager": manager, "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
                "time": taken.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            }]},
            "spec": {"leaseDurationSeconds": duration_seconds, "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
        }))
        .unwrap()
    }

    fn server_clock() -> ServerClock {
        let clock = ServerClock::default();
        clock.learned(server_now());
        clock
    }

    fn seconds_until(from: Instant, now: Instant) -> i64 {
        if from >= now {
            (from - now).as_secs_f64().round() as i64
        } else {
            -((now - from).as_secs_f64().round() as i64)
        }
    }

    #[test]
    fn an_agent_is_silent_two_renewals_after_its_last_and_a_kubelet_one() {
        let (clock, now) = (server_clock(), Instant::now());
        let mut heartbeat = lease(AGENT_FIELD_MANAGER, 40, 4, 0);
        heartbeat.metadata.annotations = Some([(HEARTBEAT_INTERVAL_ANNOTATION.to_string(), "5".to_string())].into());
        let agent = agent_silent_from(&heartbeat, &clock, None, now).unwrap();
        assert_eq!(seconds_until(agent, now), 9, "2 × 5 s + 3 s, 4 s of it gone");
        let older_agent = lease(AGENT_FIELD_MANAGER, 30, 4, 0);
        let older = agent_silent_from(&older_agent, &clock, None, now).unwrap();
        assert_eq!(seconds_until(older, now), 19, "no interval written: a third of 30 s");
        let kubelet = kubelet_silent_from(&lease("kubelet", 40, 20, 0), &clock, None, now).unwrap();
        assert_eq!(seconds_until(kubelet, now), -7, "10 s + 3 s, silent for 7 s already");
    }

    /// The writer's clock does not count where the server's is known: a kubelet whose clock is a
    /// minute ahead is silent when it stops, not a minute later.
    #[test]
    fn silence_is_judged_on_the_servers_clock() {
        let (clock, now) = (server_clock(), Instant::now());
        let ahead = kubelet_silent_from(&lease("kubelet", 40, 20, 60), &clock, None, now).unwrap();
        assert!(ahead <= now, "a minute ahead, silent for 20 s");
        let behind = kubelet_silent_from(&lease("kubelet", 40, 1, -60), &clock, None, now).unwrap();
        assert!(behind > now, "a minute behind, renewed a second ago");
        let unknown_clock = kubelet_silent_from(&lease("kubelet", 40, 1, -60), &ServerClock::default(), None, now);
        assert_eq!(
            unknown_clock, None,
            "before the server's clock is known, no one is taken for silent"
        );
        let mut unstamped = lease("kubelet", 40, 20, 0);
        unstamped.metadata.managed_fields = None;
        assert_eq!(
            kubelet_silent_from(&unstamped, &clock, None, now),
            None,
            "nor without the server's stamp"
        );
    }

    /// Where this agent saw the renewal, that is what counts: Leases stamped by an API server
    /// whose clock is 10 s behind the one this agent writes through look 10 s older than they are.
    #[test]
    fn a_renewal_this_agent_saw_counts_over_any_servers_stamp() {
        let (clock, now) = (server_clock(), Instant::now());
        let stamped_behind = lease("kubelet", 40, 12, 0);
        let by_stamp = kubelet_silent_from(&stamped_behind, &clock, None, now).unwrap();
        assert_eq!(
            seconds_until(by_stamp, now),
            1,
            "by the stamp alone: 12 s old, silent in 1 s"
        );
        let seen_two_seconds_ago = Some(now - Duration::from_secs(2));
        let seen = kubelet_silent_from(&stamped_behind, &clock, seen_two_seconds_ago, now).unwrap();
        assert_eq!(
            seconds_until(seen, now),
            11,
            "seen renewed 2 s ago: 10 s + 3 s from then"
        );
        let mut heartbeat = lease(AGENT_FIELD_MANAGER, 15, 20, 0);
        heartbeat.metadata.annotations = Some([(HEARTBEAT_INTERVAL_ANNOTATION.to_string(), "5".to_string())].into());
        assert!(renews(&heartbeat, &clock, seen_two_seconds_ago, now));
        let agent = agent_silent_from(&heartbeat, &clock, seen_two_seconds_ago, now).unwrap();
        assert_eq!(seconds_until(agent, now), 11, "2 × 5 s + 3 s from the renewal seen");
    }

    #[test]
    fn a_heartbeat_renews_within_its_duration() {
        let clock = server_clock();
        assert!(renews(
            &lease(AGENT_FIELD_MANAGER, 15, 2, 0),
            &clock,
            None,
            Instant::now()
        ));
        assert!(!renews(
            &lease(AGENT_FIELD_MANAGER, 15, 20, 0),
            &clock,
            None,
            Instant::now()
        ));
    }
}
