//! Every call to something that can hang (the API server, `drbdsetup`) is bounded; this is the
//! one way to bound it and the one error that says it ran out.

use std::future::Future;
use std::time::Duration;

/// A call that did not finish within its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("timed out after {0:?}")]
pub struct TimedOut(pub Duration);

/// Runs `future` for at most `limit`.
pub async fn within<T>(limit: Duration, future: impl Future<Output = T>) -> Result<T, TimedOut> {
    tokio::time::timeout(limit, future).await.map_err(|_| TimedOut(limit))
}
