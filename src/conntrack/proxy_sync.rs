//! What this node's kube-proxy says of its rules, from its `/metrics`: when it last queued a
//! change, when it last finished writing its rules (per address family), and how many changes it
//! holds that no sync has taken yet. Read before a sweep, it tells the repair that the rules
//! already send the volume's clients to the new server, so the sweep that follows is the last one.
//!
//! kube-proxy counts a change pending from when its watch delivers it until a sync takes it, and
//! stamps the queue time as it arrives; so when nothing is pending and its last sync ended after
//! its last queued change, every change it has received is in its rules. Its timestamps do not
//! name the changes, so whether it has received this move is a matter of time: the repair trusts
//! that kube-proxy's watch is no more than `settle` behind its own. Past that, a client connecting
//! through the old rules just before the sweep ends is left on the old server until its entry
//! times out.

use std::time::{Duration, SystemTime};

/// kube-proxy's timestamps, in seconds since the epoch, labelled by `ip_family`.
pub const QUEUED: &str = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";
pub const SYNCED: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
/// Its changes received and not yet taken by a sync, of both families.
const PENDING: [&str; 2] = [
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
    "kubeproxy_sync_proxy_rules_service_changes_pending",
];

/// What kube-proxy said of one address family's rules, and when it was asked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProxySync {
    pub queued: SystemTime,
    pub synced: SystemTime,
    pub pending: u64,
    pub read: SystemTime,
}

impl ProxySync {
    /// Whether kube-proxy's rules include a change this node saw at `seen`: its watch has had
    /// `settle` to deliver it, nothing it received waits for a sync, and its last sync ended after
    /// its last queued change.
    pub fn includes(&self, seen: SystemTime, settle: Duration) -> bool {
        self.read >= seen + settle && self.pending == 0 && self.synced >= self.queued
    }
}

/// One family's account in kube-proxy's `/metrics` text read at `read`, if all of it is there.
pub fn parse(text: &str, ipv6: bool, read: SystemTime) -> Option<ProxySync> {
    let family = if ipv6 { "IPv6" } else { "IPv4" };
    let label = format!("ip_family=\"{family}\"");
    let sample = |name: &str, labelled: bool| {
        text.lines()
            .filter(|line| line.starts_with(name))
            .filter(|line| match &line[name.len()..] {
                rest if labelled => rest.starts_with('{') && rest.contains(&label),
                rest => rest.starts_with(' '),
            })
            .find_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .filter(|value| value.is_finite() && *value >= 0.0)
    };
    let time = |name: &str| {
        sample(name, true)
            .filter(|seconds| *seconds > 0.0)
            .map(|seconds| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(seconds))
    };
    let pending = PENDING.iter().map(|name| sample(name, false)).sum::<Option<f64>>()?;
    Some(ProxySync {
        queued: time(QUEUED)?,
        synced: time(SYNCED)?,
        pending: pending as u64,
        read,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "\
# HELP kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds [ALPHA] The last time a sync of proxy rules was queued
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"} 1.7645e+09
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv6\"} 1.7644e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds_extra{ip_family=\"IPv4\"} 9
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7645000025e+09
kubeproxy_sync_proxy_rules_endpoint_changes_pending 1
kubeproxy_sync_proxy_rules_endpoint_changes_total 40
kubeproxy_sync_proxy_rules_service_changes_pending 2
";

    fn at(seconds: f64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs_f64(seconds)
    }

    #[test]
    fn the_gauges_of_the_family_are_read() {
        let read = at(1.8e9);
        let sync = parse(METRICS, false, read).unwrap();
        assert_eq!(sync.queued, at(1.7645e9));
        assert_eq!(sync.synced, at(1.7645000025e9));
        assert_eq!(sync.pending, 3, "endpoint and service changes");
        assert_eq!(sync.read, read);
        assert_eq!(parse(METRICS, true, read), None, "no sync of IPv6 rules yet");
        let unversioned = METRICS.replace("service_changes_pending", "other");
        assert_eq!(parse(&unversioned, false, read), None, "nothing says what waits");
        assert_eq!(parse("", false, read), None);
    }

    #[test]
    fn the_rules_include_a_change_once_settled_with_nothing_pending_and_synced_after_the_last_queued() {
        let settle = Duration::from_secs(2);
        let seen = at(100.0);
        let sync = |queued, synced, pending, read| ProxySync {
            queued: at(queued),
            synced: at(synced),
            pending,
            read: at(read),
        };
        assert!(sync(100.1, 100.3, 0, 102.0).includes(seen, settle));
        assert!(
            !sync(100.1, 100.3, 0, 101.0).includes(seen, settle),
            "kube-proxy's watch may not have delivered the move yet"
        );
        assert!(
            !sync(100.1, 100.3, 1, 102.0).includes(seen, settle),
            "a change waits for a sync"
        );
        assert!(
            !sync(101.0, 100.3, 0, 102.0).includes(seen, settle),
            "a sync that took the last change is under way"
        );
    }
}
