//! What each of `selftest`'s checks concludes from what it read (pure).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// One check: what was looked at, and what was found (`Err`: why it fails).
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub what: String,
    pub found: Result<String, String>,
}

impl Verdict {
    pub(super) fn new(what: impl Into<String>, found: Result<String, String>) -> Self {
        Self {
            what: what.into(),
            found,
        }
    }
}

/// A leader Lease is good when someone holds it and its last renewal is still valid.
pub fn leader_verdict(lease: Option<&Lease>, now: Timestamp) -> Result<String, String> {
    let spec = lease
        .and_then(|l| l.spec.as_ref())
        .ok_or("it does not exist: is a controller replica running?")?;
    let holder = spec
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
        .ok_or("nobody holds it: no replica leads")?;
    let renewed = spec.renew_time.as_ref().ok_or("it was never renewed")?.0;
    let valid_for = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    let age = now.duration_since(renewed);
    if age > valid_for {
        return Err(format!(
            "held by {holder} but last renewed {}s ago, longer than its {}s: the leader is stuck or gone",
            age.as_secs(),
            valid_for.as_secs()
        ));
    }
    Ok(format!("held by {holder}, renewed {}s ago", age.as_secs()))
}

/// Where a pod's admin server answers `/readyz`: its IP (the node's, with host networking) and
/// its container port named `admin`.
pub fn readyz_url(pod: &Pod) -> Result<String, String> {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .ok_or("it has no IP: not running")?;
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("admin"))
        .ok_or("it has no container port named admin")?
        .container_port;
    let host = match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
        _ => ip.to_owned(),
    };
    Ok(format!("http://{host}:{port}/readyz"))
}

/// Each wanted policy must exist and be bound with the `Deny` action (a binding that only warns
/// or audits enforces nothing).
pub fn policy_verdicts(wanted: &[String], policies: &[String], bindings: &[(String, Vec<String>)]) -> Vec<Verdict> {
    wanted
        .iter()
        .map(|name| {
            let found = if !policies.contains(name) {
                Err("it does not exist: were the admission policies installed (Kubernetes 1.30+)?".to_owned())
            } else if bindings
                .iter()
                .any(|(policy, actions)| policy == name && actions.iter().any(|a| a == "Deny"))
            {
                Ok("bound, Deny".to_owned())
            } else {
                Err("no binding enforces it (Deny): it refuses nothing".to_owned())
            };
            Verdict::new(format!("admission policy {name}"), found)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lease(holder: &str, renewed: &str, duration: i32) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": "shared-volume-controller"},
            "spec": {"holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": duration},
        }))
        .unwrap()
    }

    #[test]
    fn a_leader_lease_is_good_only_when_held_and_renewed_in_time() {
        let now: Timestamp = "2026-11-25T20:00:00Z".parse().unwrap();
        let fresh = lease("replica-a", "2026-11-25T19:59:55.000000Z", 15);
        let stale = lease("replica-a", "2026-11-25T19:59:00.000000Z", 15);
        let free = lease("", "2026-11-25T19:59:55.000000Z", 15);
        assert!(leader_verdict(Some(&fresh), now).unwrap().contains("replica-a"));
        assert!(leader_verdict(Some(&stale), now).unwrap_err().contains("60s ago"));
        assert!(leader_verdict(Some(&free), now).unwrap_err().contains("nobody"));
        assert!(leader_verdict(None, now).is_err());
    }

    #[test]
    fn an_agent_pod_is_asked_at_its_address_and_admin_port() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "agent-x"},
            "spec": {"containers": [{"name": "agent", "ports": [{"name": "admin", "containerPort": 9820}]}]},
            "status": {"podIP": "fd00::7"},
        }))
        .unwrap();
        assert_eq!(readyz_url(&pod).unwrap(), "http://[fd00::7]:9820/readyz");
        let pending: Pod =
            serde_json::from_value(json!({"metadata": {"name": "agent-y"}, "spec": {"containers": []}})).unwrap();
        assert!(readyz_url(&pending).is_err());
    }

    #[test]
    fn a_policy_counts_only_when_a_binding_denies() {
        let wanted = ["p-taints".to_owned(), "p-leases".to_owned(), "p-missing".to_owned()];
        let policies = ["p-taints".to_owned(), "p-leases".to_owned()];
        let bindings = [
            ("p-taints".to_owned(), vec!["Deny".to_owned()]),
            ("p-leases".to_owned(), vec!["Audit".to_owned()]),
        ];
        let found: Vec<bool> = policy_verdicts(&wanted, &policies, &bindings)
            .iter()
            .map(|v| v.found.is_ok())
            .collect();
        assert_eq!(found, [true, false, false]);
    }
}
