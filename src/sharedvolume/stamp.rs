//! The stamp of an agent's move: where it moves a volume's endpoints, and the PV resourceVersion
//! it decided that over. The agent writes it on the PV, the Endpoints and the EndpointSlice of
//! the move; the controller reads it to tell a move in flight from drift.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::MOVE_STAMP_ANNOTATION;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MoveStamp {
    /// The NFS server the endpoints move to, `IP:port`.
    pub endpoint: String,
    /// The PV's resourceVersion when the move was decided.
    pub over_pv_version: String,
    /// The node that moved them to itself (older agents did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When, RFC 3339 (older agents did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

impl MoveStamp {
    /// A move to `endpoint` decided over PV version `over_pv_version`, origin untold.
    pub fn new(endpoint: impl Into<String>, over_pv_version: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            over_pv_version: over_pv_version.into(),
            node: None,
            at: None,
        }
    }

    /// The stamp among `annotations`, if there is a readable one.
    pub fn read(annotations: Option<&BTreeMap<String, String>>) -> Option<Self> {
        serde_json::from_str(annotations?.get(MOVE_STAMP_ANNOTATION)?).ok()
    }

    /// The annotation that carries it.
    pub fn annotation(&self) -> (&'static str, String) {
        let text = serde_json::to_string(self).expect("a stamp is two strings");
        (MOVE_STAMP_ANNOTATION, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_back_and_garbage_is_no_stamp() {
        let stamp = MoveStamp::new("[fd00::5]:2049", "42");
        let (key, text) = stamp.annotation();
        assert_eq!(text, r#"{"endpoint":"[fd00::5]:2049","overPvVersion":"42"}"#);
        let told = MoveStamp {
            node: Some("node-b".into()),
            at: Some("2026-11-25T19:00:00Z".into()),
            ..stamp.clone()
        };
        let told_text = told.annotation().1;
        assert_eq!(
            told_text,
            r#"{"endpoint":"[fd00::5]:2049","overPvVersion":"42","node":"node-b","at":"2026-11-25T19:00:00Z"}"#
        );
        let read = BTreeMap::from([(key.to_owned(), told_text)]);
        assert_eq!(MoveStamp::read(Some(&read)), Some(told));
        let annotations = BTreeMap::from([(key.to_owned(), text)]);
        assert_eq!(MoveStamp::read(Some(&annotations)), Some(stamp));
        let garbage = BTreeMap::from([(key.to_owned(), "10.0.0.1:2049".to_owned())]);
        assert_eq!(MoveStamp::read(Some(&garbage)), None);
        assert_eq!(MoveStamp::read(None), None);
    }
}
