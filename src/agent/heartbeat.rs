//! The agent's heartbeat: a `coordination.k8s.io` Lease per node, renewed while the agent runs,
//! so that operators (and alerts) can see which nodes have a live agent, and carrying the
//! agent's [`Report`] of its DRBD resources for its peers.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::report::Report;
use crate::names::{
    AGENT_FIELD_MANAGER, AGENT_LEASE_LABEL, AGENT_LEASE_PREFIX, AGENT_REPORT_FIELD_MANAGER, DRBD_REPORT_ANNOTATION,
};
use crate::shutdown::Shutdown;

pub fn lease_name(node: &str) -> String {
    format!("{AGENT_LEASE_PREFIX}{node}")
}

/// Where the heartbeat lives and how its writes are bounded.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub leases: Api<Lease>,
    pub node: String,
    pub duration_seconds: u32,
    /// Bound of one write.
    pub timeout: Duration,
}

impl Heartbeat {
    pub fn new(client: Client, namespace: &str, node: &str, duration_seconds: u32, timeout: Duration) -> Self {
        Self {
            leases: Api::namespaced(client, namespace),
            node: node.to_owned(),
            duration_seconds,
            timeout,
        }
    }

    /// Renews the node's Lease every third of its duration until `shutdown`.
    pub async fn run(self, shutdown: Shutdown) {
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
            match self.apply(AGENT_FIELD_MANAGER, &lease).await {
                Ok(()) => tracing::debug!(lease = %name, "heartbeat renewed"),
                Err(err) => tracing::warn!(lease = %name, error = %err, "cannot renew the heartbeat Lease"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
        }
    }

    /// States `report` on the Lease (only the annotation; the heartbeat's fields stay its own).
    pub async fn publish(&self, report: &Report) -> Result<(), String> {
        let text = serde_json::to_string(report).map_err(|err| err.to_string())?;
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": lease_name(&self.node),
                "labels": {AGENT_LEASE_LABEL: "true"},
                "annotations": {DRBD_REPORT_ANNOTATION: text},
            },
        });
        self.apply(AGENT_REPORT_FIELD_MANAGER, &lease).await
    }

    async fn apply(&self, field_manager: &str, lease: &serde_json::Value) -> Result<(), String> {
        let params = PatchParams::apply(field_manager).force();
        let name = lease_name(&self.node);
        let patch = Patch::Apply(lease);
        let write = self.leases.patch(&name, &params, &patch);
        match tokio::time::timeout(self.timeout, write).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("timed out after {:?}", self.timeout)),
        }
    }
}
