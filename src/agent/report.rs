//! What an agent states about its own DRBD resources, on its heartbeat Lease, whenever its view
//! changes. Peers read it as evidence before failing a node over: an agent that re-asserts
//! quorum *after* losing the link to us is alive and serving, one that says nothing was lost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use k8s_openapi::api::coordination::v1::Lease;

use super::drbd::DrbdState;
use crate::names::DRBD_REPORT_ANNOTATION;

/// One agent's view of its DRBD resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// When the view was taken (RFC 3339), for people reading the Lease; not part of the view.
    #[serde(default)]
    pub at: String,
    #[serde(default)]
    pub resources: BTreeMap<String, ResourceReport>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceReport {
    #[serde(default)]
    pub primary: bool,
    #[serde(default)]
    pub quorum: bool,
    /// DRBD peers (as this node names them) it is connected to.
    #[serde(default)]
    pub connected: Vec<String>,
    /// DRBD peers it is not connected to.
    #[serde(default)]
    pub disconnected: Vec<String>,
}

impl Report {
    /// The report of a DRBD reading, without a time.
    pub fn of(state: &DrbdState) -> Self {
        Self::of_resources(&state.resources)
    }

    /// The report of the node's DRBD resources, without a time.
    pub fn of_resources(resources: &[super::drbd::Resource]) -> Self {
        let resources = resources
            .iter()
            .map(|r| {
                let (connected, disconnected) = r.connections.iter().partition::<Vec<_>, _>(|c| c.is_connected());
                let names = |list: Vec<&super::drbd::Connection>| list.into_iter().map(|c| c.name.clone()).collect();
                let report = ResourceReport {
                    primary: r.is_primary(),
                    quorum: r.has_quorum(),
                    connected: names(connected),
                    disconnected: names(disconnected),
                };
                (r.name.clone(), report)
            })
            .collect();
        Self {
            at: String::new(),
            resources,
        }
    }

    /// Whether two reports state the same view (their times aside).
    pub fn same_view(&self, other: &Report) -> bool {
        self.resources == other.resources
    }

    /// Parses a report as found on a Lease; a malformed one is no report.
    pub fn parse(json: &str) -> Option<Self> {
        serde_json::from_str(json).ok()
    }

    /// The report an agent's report Lease carries, if any.
    pub fn of_lease(lease: &Lease) -> Option<Self> {
        Self::parse(lease.metadata.annotations.as_ref()?.get(DRBD_REPORT_ANNOTATION)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::drbd::{Connection, Device, Resource};

    #[test]
    fn a_report_states_role_quorum_and_links() {
        let state = DrbdState {
            resources: vec![Resource {
                name: "pvc-1".into(),
                role: "Primary".into(),
                devices: vec![Device {
                    quorum: true,
                    ..Default::default()
                }],
                connections: vec![
                    Connection {
                        name: "b".into(),
                        connection_state: "Connecting".into(),
                        peer_role: "Unknown".into(),
                        ..Default::default()
                    },
                    Connection {
                        name: "c".into(),
                        connection_state: "Connected".into(),
                        peer_role: "Secondary".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let report = Report::of(&state);
        let expected = ResourceReport {
            primary: true,
            quorum: true,
            connected: vec!["c".into()],
            disconnected: vec!["b".into()],
        };
        assert_eq!(report.resources["pvc-1"], expected);
        let mut later = report.clone();
        later.at = "2026-11-23T08:00:00Z".into();
        assert!(later.same_view(&report));
        let text = serde_json::to_string(&later).unwrap();
        assert_eq!(Report::parse(&text), Some(later));
        assert_eq!(Report::parse("{not json"), None);
    }
}
