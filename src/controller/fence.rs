//! Fenced leadership: the controller writes only while it has seen its own Lease renewed recently
//! enough that no other replica can have taken the Lease since.
//!
//! The lease manager says when leadership changes, but while it cannot reach the API it says
//! nothing, and a replica that was paused (SIGSTOP, a stalled VM) resumes believing it leads. The
//! fence does not rely on being told: each renewal of our Lease that we *observe* makes it valid
//! for the Lease's duration less a margin, counted on the monotonic clock from the observation; a
//! pause or a lost connection lets it run out by itself. [`FenceLayer`] makes every mutating API
//! request of the controller's client fail at once while the fence is not valid.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::header::{HeaderValue, USER_AGENT};
use hyper::{Method, Request};
use tokio::time::Instant;
use tower::{Layer, Service};

/// Taken off the Lease's duration: the renewal happened before we observed it, and another
/// replica's clock may run ahead of ours.
pub const MARGIN: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default)]
pub struct Fence {
    valid_until: Arc<Mutex<Option<Instant>>>,
}

impl Fence {
    /// Our renewal of the Lease was observed at `at`: we may write until `at + valid_for`.
    pub fn renewed(&self, at: Instant, valid_for: Duration) {
        let mut until = self.valid_until.lock().expect("fence poisoned");
        let new = at + valid_for;
        *until = Some(until.map_or(new, |old| old.max(new)));
    }

    /// Someone else holds the Lease.
    pub fn revoke(&self) {
        *self.valid_until.lock().expect("fence poisoned") = None;
    }

    pub fn holds_at(&self, now: Instant) -> bool {
        self.valid_until().is_some_and(|until| now < until)
    }

    pub fn holds(&self) -> bool {
        self.holds_at(Instant::now())
    }

    fn valid_until(&self) -> Option<Instant> {
        *self.valid_until.lock().expect("fence poisoned")
    }

    /// Completes once the fence no longer holds (at once if it does not).
    pub async fn lost(&self) {
        while let Some(until) = self.valid_until().filter(|until| Instant::now() < *until) {
            tokio::time::sleep_until(until).await;
        }
    }

    /// Completes once the fence holds, checking every `poll`.
    pub async fn held(&self, poll: Duration) {
        while !self.holds() {
            tokio::time::sleep(poll).await;
        }
    }
}

/// The controller's client stack: names the replica in the User-Agent (audit logs show which
/// replica wrote) and, with a fence, refuses every request that could change something while the
/// fence does not hold.
#[derive(Clone)]
pub struct FenceLayer {
    pub fence: Option<Fence>,
    pub user_agent: HeaderValue,
}

impl<S> Layer<S> for FenceLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Fenced {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    layer: FenceLayer,
}

#[derive(Debug, thiserror::Error)]
#[error("{method} {path} refused: this replica cannot be sure it still leads (its Lease was not seen renewed in time)")]
pub struct NotLeading {
    method: Method,
    path: String,
}

fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> Service<Request<B>> for Fenced<S>
where
    S: Service<Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if is_write(request.method()) && self.layer.fence.as_ref().is_some_and(|fence| !fence.holds()) {
            let refused = NotLeading {
                method: request.method().clone(),
                path: request.uri().path().to_owned(),
            };
            tracing::warn!(error = %refused, "write refused by the leadership fence");
            return Box::pin(std::future::ready(Err(refused.into())));
        }
        request.headers_mut().insert(USER_AGENT, self.layer.user_agent.clone());
        let response = self.inner.call(request);
        Box::pin(async move { response.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_holds_for_its_lease_after_each_observed_renewal_and_runs_out_by_itself() {
        let fence = Fence::default();
        let lease = Duration::from_secs(13);
        assert!(!fence.holds(), "nothing observed: no writes");
        let start = Instant::now();
        fence.renewed(start, lease);
        assert!(fence.holds_at(start + Duration::from_secs(12)));
        assert!(!fence.holds_at(start + lease));
        fence.renewed(start + Duration::from_secs(10), lease);
        assert!(fence.holds_at(start + Duration::from_secs(22)));
        // An older observation arriving late does not shorten it.
        fence.renewed(start, lease);
        assert!(fence.holds_at(start + Duration::from_secs(22)));

        tokio::time::timeout(Duration::from_secs(24), fence.lost())
            .await
            .expect("the fence runs out without being told");
        assert_eq!(Instant::now() - start, Duration::from_secs(23));
        fence.renewed(Instant::now(), lease);
        fence.revoke();
        assert!(!fence.holds(), "someone else holds the Lease");
    }

    #[tokio::test]
    async fn writes_are_refused_without_the_fence_and_reads_go_through() {
        let fence = Fence::default();
        let layer = FenceLayer {
            fence: Some(fence.clone()),
            user_agent: HeaderValue::from_static("test/1 (replica-a)"),
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let inner = tower::service_fn({
            let seen = seen.clone();
            move |request: Request<()>| {
                let agent = request.headers()[USER_AGENT].to_str().unwrap().to_owned();
                seen.lock().unwrap().push((request.method().clone(), agent));
                async { Ok::<_, std::convert::Infallible>(()) }
            }
        });
        let mut service = layer.layer(inner);
        let request = |method: Method| {
            Request::builder()
                .method(method)
                .uri("/api/v1/services")
                .body(())
                .unwrap()
        };

        assert!(service.call(request(Method::GET)).await.is_ok(), "reads need no fence");
        let refused = service.call(request(Method::PATCH)).await.unwrap_err();
        assert!(
            refused.to_string().contains("cannot be sure it still leads"),
            "{refused}"
        );
        fence.renewed(Instant::now(), Duration::from_secs(10));
        for method in [Method::POST, Method::PATCH, Method::PUT, Method::DELETE] {
            assert!(service.call(request(method)).await.is_ok());
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 5, "the refused write never reached the API: {seen:?}");
        assert!(seen.iter().all(|(_, agent)| agent == "test/1 (replica-a)"));
    }
}
