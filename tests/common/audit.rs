//! The local control plane's audit log (hack/cluster.sh writes every create, update, patch and
//! delete of Services, Endpoints, EndpointSlices, PVs, Nodes, Pods and VolumeAttachments beside
//! the kubeconfig): who wrote what, and when. The controller's User-Agent names its replica.

use std::path::PathBuf;
use std::time::SystemTime;

use serde_json::Value;

#[derive(Clone, Debug)]
pub struct Write {
    pub verb: String,
    pub user_agent: String,
    pub resource: String,
    pub name: String,
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
    let text = std::fs::read_to_string(log).expect("the control plane's audit log (hack/cluster.sh)");
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["objectRef"]["namespace"] == namespace)
        .filter_map(|event| {
            let at = humantime::parse_rfc3339(event["requestReceivedTimestamp"].as_str()?).ok()?;
            Some(Write {
                verb: event["verb"].as_str()?.to_owned(),
                user_agent: event["userAgent"].as_str().unwrap_or_default().to_owned(),
                resource: event["objectRef"]["resource"].as_str()?.to_owned(),
                name: event["objectRef"]["name"].as_str().unwrap_or_default().to_owned(),
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
