//! What the agent on a volume's primary says on the PV when the NFS server it published stops
//! answering its probe: which endpoint, since when, and what happened instead. The controller
//! states it in the claim's condition and `status` shows it, for as long as the PV names that
//! endpoint; the agent takes it away once the server answers again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::SILENT_SERVER_ANNOTATION;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SilentServer {
    /// The published endpoint that does not answer, `IP:port`.
    pub endpoint: String,
    /// When the agent first found it silent (RFC 3339).
    pub since: String,
    /// What the probe got instead of an answer.
    pub why: String,
}

impl SilentServer {
    /// The one among `annotations`, if there is a readable one.
    pub fn read(annotations: Option<&BTreeMap<String, String>>) -> Option<Self> {
        serde_json::from_str(annotations?.get(SILENT_SERVER_ANNOTATION)?).ok()
    }

    /// The one among `annotations` that names `endpoint`: one naming another is from before a
    /// move, and says nothing of the server now published.
    pub fn of_endpoint(annotations: Option<&BTreeMap<String, String>>, endpoint: &str) -> Option<Self> {
        Self::read(annotations).filter(|silent| silent.endpoint == endpoint)
    }

    /// The annotation's value.
    pub fn text(&self) -> String {
        serde_json::to_string(self).expect("three strings")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_reads_back_and_speaks_only_of_its_endpoint() {
        let silent = SilentServer {
            endpoint: "10.0.0.1:2049".into(),
            since: "2026-11-28T12:00:00Z".into(),
            why: "connection refused".into(),
        };
        let annotations = BTreeMap::from([(SILENT_SERVER_ANNOTATION.to_owned(), silent.text())]);
        assert_eq!(SilentServer::read(Some(&annotations)), Some(silent.clone()));
        assert_eq!(
            SilentServer::of_endpoint(Some(&annotations), "10.0.0.1:2049"),
            Some(silent)
        );
        assert_eq!(
            SilentServer::of_endpoint(Some(&annotations), "10.0.0.2:2049"),
            None,
            "from before a move"
        );
        let garbage = BTreeMap::from([(SILENT_SERVER_ANNOTATION.to_owned(), "{".to_owned())]);
        assert_eq!(SilentServer::read(Some(&garbage)), None);
        assert_eq!(SilentServer::read(None), None);
    }
}
