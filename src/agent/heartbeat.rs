//! The agent's heartbeat: a `coordination.k8s.io` Lease per node, renewed while the agent runs,
//! so that operators (and alerts) can see which nodes have a live agent.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::names::{AGENT_FIELD_MANAGER, AGENT_LEASE_PREFIX};
use crate::shutdown::Shutdown;

pub fn lease_name(node: &str) -> String {
    format!("{AGENT_LEASE_PREFIX}{node}")
}

/// Renews the node's Lease every third of its duration until `shutdown`.
pub async fn run(client: Client, namespace: String, node: String, duration_seconds: u32, shutdown: Shutdown) {
    let leases: Api<Lease> = Api::namespaced(client, &namespace);
    let name = lease_name(&node);
    let period = Duration::from_secs(u64::from(duration_seconds.max(3)) / 3);
    loop {
        let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": duration_seconds, "renewTime": now},
        });
        let params = PatchParams::apply(AGENT_FIELD_MANAGER).force();
        match leases.patch(&name, &params, &Patch::Apply(&lease)).await {
            Ok(_) => tracing::debug!(lease = %format!("{namespace}/{name}"), "heartbeat renewed"),
            Err(err) => {
                tracing::warn!(lease = %format!("{namespace}/{name}"), error = %err, "cannot renew the heartbeat Lease")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}
