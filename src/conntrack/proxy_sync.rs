//! What this node's kube-proxy says of its rules, from its `/metrics`: when it last queued a
//! change and when it last finished writing its rules, per address family. Read before a sweep, it
//! tells the repair that the rules already send the volume's clients to the new server, so the
//! sweep that follows is the last one (a node with no client stops after one sweep).
//!
//! kube-proxy queues a sync for every EndpointSlice change it receives and writes all pending
//! changes in the next one. Its timestamps do not name the changes, so the rule is one of time:
//! its last sync ended at least `settle` after this node saw the move and after the last change it
//! queued. That holds when kube-proxy's watch is no more than `settle` behind the repair's and one
//! sync takes less than `settle`; past that, a client connecting through the old rules just
//! before the sweep ends is left on the old server until its entry times out.

use std::time::{Duration, SystemTime};

/// kube-proxy's gauges, in seconds since the epoch, labelled by `ip_family`.
const QUEUED: &str = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";
const SYNCED: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";

/// kube-proxy's last queued change and last finished sync, for one address family.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProxySync {
    pub queued: SystemTime,
    pub synced: SystemTime,
}

impl ProxySync {
    /// Whether the rules kube-proxy wrote last include a change this node saw at `seen`.
    pub fn includes(&self, seen: SystemTime, settle: Duration) -> bool {
        self.synced >= seen.max(self.queued) + settle
    }
}

/// The two gauges of one family in kube-proxy's `/metrics` text, if both are there.
pub fn parse(text: &str, ipv6: bool) -> Option<ProxySync> {
    let family = if ipv6 { "IPv6" } else { "IPv4" };
    let label = format!("ip_family=\"{family}\"");
    let gauge = |name: &str| {
        text.lines()
            .filter(|line| line.starts_with(name) && line[name.len()..].starts_with('{'))
            .filter(|line| line.contains(&label))
            .find_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .filter(|seconds| seconds.is_finite() && *seconds > 0.0)
            .map(|seconds| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(seconds))
    };
    Some(ProxySync {
        queued: gauge(QUEUED)?,
        synced: gauge(SYNCED)?,
    })
}

/// kube-proxy's metrics endpoint on this node.
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    url: String,
    client: reqwest::Client,
}

impl ProxyMetrics {
    pub fn new(url: String, timeout: Duration) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self { url, client })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// kube-proxy's account of one family's rules, or why it cannot be had.
    pub async fn read(&self, ipv6: bool) -> Result<ProxySync, String> {
        let response = self.client.get(&self.url).send().await.map_err(|e| e.to_string())?;
        let text = response
            .error_for_status()
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        parse(&text, ipv6).ok_or_else(|| format!("no {SYNCED} and {QUEUED} for this family"))
    }
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
";

    fn at(seconds: f64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs_f64(seconds)
    }

    #[test]
    fn the_gauges_of_the_family_are_read() {
        let sync = parse(METRICS, false).unwrap();
        assert_eq!(sync.queued, at(1.7645e9));
        assert_eq!(sync.synced, at(1.7645000025e9));
        assert_eq!(parse(METRICS, true), None, "no sync of IPv6 rules yet");
        assert_eq!(parse("", false), None);
    }

    #[test]
    fn the_rules_include_a_change_once_a_sync_ended_settle_after_it_and_after_the_last_queued() {
        let settle = Duration::from_secs(2);
        let seen = at(100.0);
        let sync = |queued, synced| ProxySync {
            queued: at(queued),
            synced: at(synced),
        };
        assert!(sync(100.1, 102.5).includes(seen, settle));
        assert!(!sync(99.0, 101.0).includes(seen, settle), "too soon after the move");
        assert!(
            !sync(101.0, 102.5).includes(seen, settle),
            "a change queued since may be ours, received late"
        );
        assert!(!sync(103.0, 102.5).includes(seen, settle), "a sync is pending");
        assert!(!sync(90.0, 95.0).includes(seen, settle), "an old sync");
    }
}
