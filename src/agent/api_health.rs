//! Since when the API server has answered this agent without a failure in between. A peer's
//! silence is evidence only once the peers have had time to speak: right after an API server
//! outage, the last report of a healthy primary is from before the outage and its Lease has run
//! out, though nothing happened to it but the outage.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::deadline::TimedOut;

/// Shared by the heartbeat, the round's fresh reads and its report writes; cloning shares it.
#[derive(Clone, Debug, Default)]
pub(crate) struct ApiHealth(Arc<Mutex<Option<Instant>>>);

impl ApiHealth {
    /// The API server answered a call (an answer that refuses counts: it is up).
    pub fn answered(&self) {
        self.0
            .lock()
            .expect("api health poisoned")
            .get_or_insert_with(Instant::now);
    }

    /// A call got no answer (connection refused, timed out, a 5xx of a server not ready).
    pub fn failed(&self) {
        *self.0.lock().expect("api health poisoned") = None;
    }

    /// Records how a call bounded by [`crate::deadline::within`] went: a status answered by the
    /// server counts as an answer unless it is a server error; a call that ran out, as a failure.
    pub fn record<T>(&self, bounded: &Result<Result<T, kube::Error>, TimedOut>) {
        match bounded {
            Ok(Ok(_)) => self.answered(),
            Ok(Err(kube::Error::Api(status))) if status.code < 500 => self.answered(),
            Ok(Err(_)) | Err(_) => self.failed(),
        }
    }

    /// Since when it has answered every call; `None` after the last call failed, or before any.
    pub fn answering_since(&self) -> Option<Instant> {
        *self.0.lock().expect("api health poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_restarts_the_clock() {
        let health = ApiHealth::default();
        assert_eq!(health.answering_since(), None, "nothing known before a call");
        health.answered();
        let since = health.answering_since().unwrap();
        health.record::<()>(&Ok(Ok(())));
        assert_eq!(health.answering_since(), Some(since), "kept while it answers");
        let refused = kube::Error::Api(kube::core::Status::failure("no", "Forbidden").with_code(403).boxed());
        health.record::<()>(&Ok(Err(refused)));
        assert_eq!(health.answering_since(), Some(since), "a refusal is an answer");
        let unavailable = kube::Error::Api(kube::core::Status::failure("not ready", "").with_code(503).boxed());
        health.record::<()>(&Ok(Err(unavailable)));
        assert_eq!(health.answering_since(), None);
        health.answered();
        assert!(health.answering_since().unwrap() >= since);
        let clone = health.clone();
        clone.failed();
        assert_eq!(health.answering_since(), None, "clones share it");
    }
}
