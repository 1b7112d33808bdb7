//! When the agent last read DRBD's state, for `/healthz`: an agent whose reads stopped (a hanging
//! `drbdsetup`) is restarted rather than left acting on an old picture.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// When DRBD state was last read, for `/healthz`.
#[derive(Clone)]
pub(super) struct Freshness {
    last_read: Arc<Mutex<Instant>>,
    limit: Duration,
}

impl Freshness {
    pub(super) fn new(status_interval: Duration, timeout: Duration) -> Self {
        Self {
            last_read: Arc::new(Mutex::new(Instant::now())),
            // Three missed reads, each allowed its full timeout.
            limit: 3 * status_interval + timeout,
        }
    }

    pub(super) fn mark_read(&self) {
        *self.last_read.lock().expect("freshness poisoned") = Instant::now();
    }

    fn age(&self) -> Duration {
        self.last_read.lock().expect("freshness poisoned").elapsed()
    }

    pub(super) fn check(&self) -> Result<(), StaleDrbdState> {
        let age = self.age();
        if age > self.limit {
            return Err(StaleDrbdState { age, limit: self.limit });
        }
        Ok(())
    }
}

/// The liveness failure of an agent whose DRBD reads stopped.
#[derive(Debug, thiserror::Error)]
#[error("DRBD state was last read {age:?} ago (limit {limit:?}); is drbdsetup hanging?")]
pub(super) struct StaleDrbdState {
    age: Duration,
    limit: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_fails_once_drbd_state_is_stale() {
        let freshness = Freshness::new(Duration::from_millis(10), Duration::from_millis(5));
        assert!(freshness.check().is_ok());
        std::thread::sleep(Duration::from_millis(50));
        let err = freshness.check().unwrap_err().to_string();
        assert!(err.contains("DRBD state was last read"), "{err}");
        freshness.mark_read();
        assert!(freshness.check().is_ok());
    }
}
