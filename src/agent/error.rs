//! What can go wrong in the agent's own writes and reads, typed: the executor backs off on any of
//! them, and says which in the Warning it posts.

use super::source::DrbdError;
use crate::deadline::TimedOut;
use crate::kube_client::Refusal;

#[derive(Debug, thiserror::Error)]
pub(crate) enum AgentError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Drbd(#[from] DrbdError),
    #[error(transparent)]
    TimedOut(#[from] TimedOut),
    #[error("cannot encode: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("time out of range: {0}")]
    Time(#[from] k8s_openapi::jiff::Error),
    /// Optimistic concurrency lost every time.
    #[error("{0} kept changing under concurrent writers")]
    Contended(&'static str),
}

impl AgentError {
    /// The API server's answer, when it is one that no retry of the same write can change.
    pub(crate) fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Kube(err) => Refusal::of(err),
            _ => None,
        }
    }
}
