//! The agent's heartbeat: a `coordination.k8s.io` Lease per node, renewed while the agent runs,
//! so that operators (and alerts) and peers can see which nodes have a live agent; and its
//! [`Report`] of its DRBD resources, on a second Lease written only when the view changes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use prometheus::Gauge;
use serde_json::json;

use super::api_health::ApiHealth;
use super::error::AgentError;
use super::report::Report;
use crate::deadline::within;
use crate::metrics::set_to_now;
use crate::names::{
    AGENT_FIELD_MANAGER, AGENT_LEASE_LABEL, AGENT_LEASE_PREFIX, AGENT_REPORT_FIELD_MANAGER, AGENT_REPORT_LABEL,
    AGENT_REPORT_LEASE_PREFIX, DRBD_REPORT_ANNOTATION,
};
use crate::shutdown::Shutdown;

pub fn lease_name(node: &str) -> String {
    format!("{AGENT_LEASE_PREFIX}{node}")
}

pub fn report_lease_name(node: &str) -> String {
    format!("{AGENT_REPORT_LEASE_PREFIX}{node}")
}

/// Where the heartbeat lives and how its writes are bounded.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub leases: Api<Lease>,
    pub node: String,
    pub duration_seconds: u32,
    /// Bound of one write.
    pub timeout: Duration,
    /// How the API server answers this agent, as its writes find out.
    pub api: ApiHealth,
}

impl Heartbeat {
    pub fn new(client: Client, namespace: &str, node: &str, duration_seconds: u32, timeout: Duration) -> Self {
        Self {
            leases: Api::namespaced(client, namespace),
            node: node.to_owned(),
            duration_seconds,
            timeout,
            api: ApiHealth::default(),
        }
    }

    /// Renews the node's Lease every third of its duration until `shutdown`; `renewed` holds the
    /// time of the last renewal.
    pub async fn run(self, shutdown: Shutdown, renewed: Gauge) {
        let period = Duration::from_secs(u64::from(self.duration_seconds.max(3)) / 3);
        let name = lease_name(&self.node);
        loop {
            let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "labels": {AGENT_LEASE_LABEL: "true"}},
                "spec": {"holderIdentity": self.node, "leaseDurationSeconds": self.duration_seconds, "renewTime": now},
            });
            match self.apply(AGENT_FIELD_MANAGER, &name, &lease).await {
                Ok(()) => {
                    set_to_now(&renewed);
                    tracing::debug!(lease = %name, "heartbeat renewed");
                }
                Err(err) => tracing::warn!(lease = %name, error = %err, "cannot renew the heartbeat Lease"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
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
        self.apply(AGENT_REPORT_FIELD_MANAGER, &name, &lease).await
    }

    async fn apply(&self, field_manager: &str, name: &str, lease: &serde_json::Value) -> Result<(), AgentError> {
        let params = PatchParams::apply(field_manager).force();
        let patch = Patch::Apply(lease);
        let written = within(self.timeout, self.leases.patch(name, &params, &patch)).await;
        self.api.record(&written);
        written??;
        Ok(())
    }
}

/// Whether `node`'s agent still renews its heartbeat, read fresh: a report counts only while it
/// does. `None` when it cannot be read.
pub async fn renewing(
    leases: &Api<Lease>,
    node: &str,
    now: k8s_openapi::jiff::Timestamp,
    timeout: Duration,
) -> Option<bool> {
    let lease = match within(timeout, leases.get_opt(&lease_name(node))).await {
        Ok(Ok(lease)) => lease,
        _ => return None,
    };
    let Some(spec) = lease.and_then(|l| l.spec) else {
        return Some(false);
    };
    let duration = k8s_openapi::jiff::SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    Some(
        spec.renew_time
            .is_some_and(|renewed| renewed.0.checked_add(duration).is_ok_and(|expiry| expiry > now)),
    )
}
