//! The agent's heartbeat: a `coordination.k8s.io` Lease per node, renewed while the agent runs,
//! so that operators (and alerts) and peers can see which nodes have a live agent; and its
//! [`Report`] of its DRBD resources, on a second Lease written only when the view changes.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use prometheus::Gauge;
use serde_json::json;

use super::api_health::ApiHealth;
use super::error::AgentError;
use super::quiet::{agent_silent_from, renews};
use super::renewal_watch::RenewalWatch;
use super::report::Report;
use super::server_clock::{ServerClock, last_write};
use crate::deadline::within;
use crate::metrics::set_to_now;
use crate::names::{
    AGENT_FIELD_MANAGER, AGENT_LEASE_LABEL, AGENT_REPORT_FIELD_MANAGER, AGENT_REPORT_LABEL, DRBD_REPORT_ANNOTATION,
    HEARTBEAT_INTERVAL_ANNOTATION, lease_name, report_lease_name,
};
use crate::shutdown::Shutdown;

/// Where the heartbeat lives and how its writes are bounded.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub leases: Api<Lease>,
    pub node: String,
    pub duration_seconds: u32,
    /// How often it is renewed.
    pub interval: Duration,
    /// Bound of one write.
    pub timeout: Duration,
    /// How the API server answers this agent, as its writes find out.
    pub api: ApiHealth,
    /// The API server's clock, as the heartbeat's writes find it.
    pub clock: ServerClock,
}

impl Heartbeat {
    pub fn new(client: Client, namespace: &str, node: &str, renewal: (u32, Duration), timeout: Duration) -> Self {
        let (duration_seconds, interval) = renewal;
        Self {
            leases: Api::namespaced(client, namespace),
            node: node.to_owned(),
            duration_seconds,
            interval,
            timeout,
            api: ApiHealth::default(),
            clock: ServerClock::default(),
        }
    }

    /// Renews the node's Lease every interval until `shutdown`, stating the interval on it (peers
    /// judge silence by it); `renewed` holds the time of the last renewal.
    pub async fn run(self, shutdown: Shutdown, renewed: Gauge) {
        let name = lease_name(&self.node);
        let interval = self.interval.as_secs().max(1).to_string();
        loop {
            let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "labels": {AGENT_LEASE_LABEL: "true"},
                    "annotations": {HEARTBEAT_INTERVAL_ANNOTATION: interval},
                },
                "spec": {"holderIdentity": self.node, "leaseDurationSeconds": self.duration_seconds, "renewTime": now},
            });
            match self.apply(AGENT_FIELD_MANAGER, &name, &lease).await {
                Ok(written) => {
                    if let Some(taken) = last_write(&written, Some(AGENT_FIELD_MANAGER)) {
                        self.clock.learned(taken);
                    }
                    set_to_now(&renewed);
                    tracing::debug!(lease = %name, "heartbeat renewed");
                }
                Err(err) => tracing::warn!(lease = %name, error = %err, "cannot renew the heartbeat Lease"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    /// States `report` on this node's report Lease.
    pub async fn publish(&self, report: &Report) -> Result<(), AgentError> {
        let text = serde_json::to_string(report)?;
        let name = report_lease_name(&self.node);
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "labels": {AGENT_REPORT_LABEL: "true"},
                "annotations": {DRBD_REPORT_ANNOTATION: text},
            },
            "spec": {"holderIdentity": self.node},
        });
        self.apply(AGENT_REPORT_FIELD_MANAGER, &name, &lease).await?;
        Ok(())
    }

    async fn apply(&self, field_manager: &str, name: &str, lease: &serde_json::Value) -> Result<Lease, AgentError> {
        let params = PatchParams::apply(field_manager).force();
        let patch = Patch::Apply(lease);
        let written = within(self.timeout, self.leases.patch(name, &params, &patch)).await;
        self.api.record(&written);
        Ok(written??)
    }
}

/// What `node`'s agent states now, read fresh: whether it still renews its heartbeat, and the
/// report on its report Lease, read after the heartbeat so that it is at least as new as the
/// heartbeat it is weighed with. `None` when either cannot be read; every read tells `api` how
/// the API server answered (a refusal or a throttle is an answer).
pub async fn peer_now(
    leases: &Api<Lease>,
    node: &str,
    clock: &ServerClock,
    timeout: Duration,
    api: &ApiHealth,
    seen: Option<(&RenewalWatch, &str)>,
) -> Option<PeerNow> {
    let heartbeat = within(timeout, leases.get_opt(&lease_name(node))).await;
    api.record(&heartbeat);
    let heartbeat = heartbeat.ok()?.ok()?;
    // Where the heartbeat is watched (by namespace), the renewal this agent saw counts first.
    let seen = match (seen, heartbeat.as_ref()) {
        (Some((renewals, namespace)), Some(lease)) => {
            let key = (namespace.to_owned(), lease_name(node));
            renewals.observe(&key, lease, Some(AGENT_FIELD_MANAGER));
            renewals.last_renewed(&key)
        }
        _ => None,
    };
    let now = Instant::now();
    let alive = heartbeat.as_ref().is_some_and(|lease| renews(lease, clock, seen, now));
    let silent_from = heartbeat.and_then(|lease| agent_silent_from(&lease, clock, seen, now));
    let stated = within(timeout, leases.get_opt(&report_lease_name(node))).await;
    api.record(&stated);
    let report = stated.ok()?.ok()?.and_then(|lease| Report::of_lease(&lease));
    Some(PeerNow {
        alive,
        silent_from,
        report,
    })
}

/// What a peer's agent states now, read fresh.
#[derive(Debug, PartialEq)]
pub struct PeerNow {
    /// It renewed its heartbeat within the Lease's duration.
    pub alive: bool,
    /// From when it counts as silent unless it renews before (`None`: no heartbeat).
    pub silent_from: Option<Instant>,
    /// Its report.
    pub report: Option<Report>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripted_api;
    use k8s_openapi::jiff::Timestamp;

    /// Leases served by a scripted API server: `status` for every request, with `body`.
    fn leases_answering(status: u16, body: &'static str) -> Api<Lease> {
        Api::namespaced(scripted_api::client(move |_| (status, body.to_owned())), "default")
    }

    const REFUSED: &str =
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"no","reason":"Forbidden","code":403}"#;
    const THROTTLED: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"slow down","reason":"TooManyRequests","code":429}"#;
    const UNAVAILABLE: &str =
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"not ready","code":503}"#;

    #[tokio::test]
    async fn a_refused_or_throttled_read_is_an_answer_and_a_server_error_is_not() {
        let clock = ServerClock::default();
        for (status, body, still_answering) in [(403, REFUSED, true), (429, THROTTLED, true), (503, UNAVAILABLE, false)]
        {
            let api = ApiHealth::default();
            api.answered();
            let read = peer_now(
                &leases_answering(status, body),
                "node-a",
                &clock,
                Duration::from_secs(5),
                &api,
                None,
            )
            .await;
            assert_eq!(read, None, "{status}: nothing known of the peer");
            assert_eq!(api.answering_since().is_some(), still_answering, "{status}");
        }
    }

    #[tokio::test]
    async fn a_peers_report_is_read_fresh_with_its_heartbeat() {
        let renewed = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
        let report = r#"{\"resources\":{\"pvc-1\":{\"primary\":true,\"quorum\":true,\"connected\":[\"node-c\"],\"disconnected\":[\"node-b\"]}}}"#;
        let lease = format!(
            r#"{{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{{"name":"x","annotations":{{"{DRBD_REPORT_ANNOTATION}":"{report}"}}}},"spec":{{"holderIdentity":"node-a","leaseDurationSeconds":30,"renewTime":"{renewed}"}}}}"#
        );
        let body: &'static str = Box::leak(lease.into_boxed_str());
        let api = ApiHealth::default();
        let PeerNow { alive, report, .. } = peer_now(
            &leases_answering(200, body),
            "node-a",
            &ServerClock::default(),
            Duration::from_secs(5),
            &api,
            None,
        )
        .await
        .unwrap();
        assert!(alive);
        assert_eq!(report.unwrap().resources["pvc-1"].disconnected, ["node-b"]);
        assert!(api.answering_since().is_some());
    }

    /// A peer's heartbeat Lease: renewed at `renewed` by its own clock, taken by the server at
    /// `taken` by the server's.
    fn heartbeat_lease(renewed: Timestamp, taken: Timestamp) -> &'static str {
        let lease = format!(
            r#"{{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{{"name":"x","managedFields":[{{"manager":"{AGENT_FIELD_MANAGER}","operation":"Apply","apiVersion":"coordination.k8s.io/v1","time":"{}"}}]}},"spec":{{"holderIdentity":"node-a","leaseDurationSeconds":15,"renewTime":"{}"}}}}"#,
            taken.strftime("%Y-%m-%dT%H:%M:%SZ"),
            renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ"),
        );
        Box::leak(lease.into_boxed_str())
    }

    /// Whether the peer of `lease` counts as renewing, for an agent whose server clock is now.
    async fn alive(lease: &'static str) -> bool {
        let clock = ServerClock::default();
        clock.learned(Timestamp::now());
        let (leases, api) = (leases_answering(200, lease), ApiHealth::default());
        let read = peer_now(&leases, "node-a", &clock, Duration::from_secs(5), &api, None);
        read.await.unwrap().alive
    }

    /// Heartbeats are judged on the API server's clock: a peer whose clock is a minute behind
    /// still renews, and one whose clock is a minute ahead does not renew for a minute after it
    /// stopped.
    #[tokio::test]
    async fn a_peers_heartbeat_is_judged_on_the_servers_clock_not_on_its_own() {
        use k8s_openapi::jiff::SignedDuration;
        let now = Timestamp::now();
        let ago = |seconds: i64| now - SignedDuration::from_secs(seconds);
        assert!(
            alive(heartbeat_lease(ago(60), ago(2))).await,
            "a minute behind, renewed 2 s ago"
        );
        assert!(
            !alive(heartbeat_lease(ago(-60), ago(20))).await,
            "a minute ahead, silent for 20 s of a 15 s Lease"
        );
        assert!(alive(heartbeat_lease(ago(2), ago(2))).await, "on time");
        assert!(!alive(heartbeat_lease(ago(20), ago(20))).await, "on time, silent");
    }
}
