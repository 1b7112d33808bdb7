//! The local control plane's audit log (hack/cluster.sh writes every create, update, patch and
//! delete of Services, Endpoints, EndpointSlices, PVs, claims, Nodes, Pods and VolumeAttachments
//! beside the kubeconfig): who wrote what, and when. The controller's User-Agent names its
//! replica.

use std::path::PathBuf;
use std::time::SystemTime;

use serde_json::Value;

#[derive(Clone, Debug)]
pub struct Write {
    pub verb: String,
    pub user_agent: String,
    pub resource: String,
    /// `status` for a write to an object's status; empty for the object itself.
    pub subresource: String,
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    pub name: String,
    /// Who wrote: the user it impersonated, else the one that signed in.
    pub user: String,
    pub at: SystemTime,
    pub code: i64,
}

fn log_path() -> PathBuf {
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    PathBuf::from(kubeconfig).with_file_name("audit.log")
}

/// Every write in the audit log of `namespace` received at or after `since`.
pub fn writes(namespace: &str, since: SystemTime) -> Vec<Write> {
    writes_in(&log_path(), namespace, since)
}

/// [`writes`] from the audit log at `log` (a control plane of the test's own).
pub fn writes_in(log: &std::path::Path, namespace: &str, since: SystemTime) -> Vec<Write> {
    every_write_in(log, since)
        .into_iter()
        .filter(|write| write.namespace == namespace)
        .collect()
}

/// Every write in the audit log received at or after `since`, cluster-scoped objects (whose
/// namespace is empty) included.
pub fn every_write(since: SystemTime) -> Vec<Write> {
    every_write_in(&log_path(), since)
}

fn every_write_in(log: &std::path::Path, since: SystemTime) -> Vec<Write> {
    let text = std::fs::read_to_string(log).expect("the control plane's audit log (hack/cluster.sh)");
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| {
            let at = humantime::parse_rfc3339(event["requestReceivedTimestamp"].as_str()?).ok()?;
            let object = &event["objectRef"];
            Some(Write {
                verb: event["verb"].as_str()?.to_owned(),
                user_agent: event["userAgent"].as_str().unwrap_or_default().to_owned(),
                resource: object["resource"].as_str()?.to_owned(),
                subresource: object["subresource"].as_str().unwrap_or_default().to_owned(),
                namespace: object["namespace"].as_str().unwrap_or_default().to_owned(),
                name: object["name"].as_str().unwrap_or_default().to_owned(),
                user: event["impersonatedUser"]["username"]
                    .as_str()
                    .or(event["user"]["username"].as_str())
                    .unwrap_or_default()
                    .to_owned(),
                at,
                code: event["responseStatus"]["code"].as_i64().unwrap_or_default(),
            })
        })
        .filter(|write| write.at >= since)
        .collect()
}

/// The writes of the controller replica with `identity` (its User-Agent ends in `(identity)`).
pub fn writes_by(namespace: &str, identity: &str, since: SystemTime) -> Vec<Write> {
    let marker = format!("({identity})");
    writes(namespace, since)
        .into_iter()
        .filter(|write| write.user_agent.ends_with(&marker))
        .collect()
}
