//! The API server's clock, as this agent can know it: the time the server stamped on this agent's
//! own last heartbeat write (a Lease's managed fields carry the server's time of each manager's
//! last write), carried forward on this agent's monotonic clock. Peers' heartbeats are judged on
//! it, never on this node's wall clock: a node whose clock is a minute off must neither make a
//! healthy peer look silent nor a crashed one look alive, and neither must its own.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;

/// Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct ServerClock(Arc<Mutex<Option<(Timestamp, Instant)>>>);

impl ServerClock {
    /// The server stamped `at` on a write that has just come back.
    pub fn learned(&self, at: Timestamp) {
        *self.0.lock().expect("server clock poisoned") = Some((at, Instant::now()));
    }

    /// The server's time now; `None` before any write came back.
    pub fn now(&self) -> Option<Timestamp> {
        let (at, seen) = (*self.0.lock().expect("server clock poisoned"))?;
        at.checked_add(seen.elapsed()).ok()
    }
}

/// When the server took the last write of `lease` by `manager`, or by anyone (`None`), by the
/// server's clock (to the second).
pub fn last_write(lease: &Lease, manager: Option<&str>) -> Option<Timestamp> {
    lease
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| manager.is_none() || entry.manager.as_deref() == manager)
        .filter_map(|entry| entry.time.as_ref().map(|time| time.0))
        .max()
}
