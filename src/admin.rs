//! The admin server: `/metrics`, `/healthz` and `/readyz` over HTTP/1, one task per connection.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::shutdown::Shutdown;

type LivenessCheck = dyn Fn() -> Result<(), String> + Send + Sync;

/// What `/readyz` and `/healthz` report. Cheap to clone; clones share state.
#[derive(Clone, Default)]
pub struct Probes {
    ready: Arc<AtomicBool>,
    liveness: Arc<RwLock<Option<Box<LivenessCheck>>>>,
}

impl Probes {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Installs the check `/healthz` runs; without one the process is live while it serves.
    pub fn set_liveness_check(&self, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        *self.liveness.write().expect("liveness lock poisoned") = Some(Box::new(check));
    }

    fn liveness(&self) -> Result<(), String> {
        match self.liveness.read().expect("liveness lock poisoned").as_ref() {
            Some(check) => check(),
            None => Ok(()),
        }
    }
}

/// Binds `addr` and serves until `shutdown` is cancelled; open connections are then drained.
/// Returns once the listener is bound, with the serving task's handle and the bound address.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
) -> Result<JoinHandle<Result<()>>> {
    Ok(bind(addr, registry, probes, shutdown).await?.0)
}

/// Like [`serve`], and also returns the address actually bound (useful with port 0).
pub async fn bind(
    addr: SocketAddr,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
) -> Result<(JoinHandle<Result<()>>, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on admin address {addr} (change it with --admin-addr)"))?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "admin server listening");
    let task = tokio::spawn(accept_loop(listener, registry, probes, shutdown));
    Ok((task, bound))
}

async fn accept_loop(listener: TcpListener, registry: Registry, probes: Probes, shutdown: Shutdown) -> Result<()> {
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "admin server cannot accept a connection");
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let registry = registry.clone();
        let probes = probes.clone();
        let service = service_fn(move |req| {
            let response = respond(&req, &registry, &probes);
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "admin connection ended with an error");
            }
        });
    }
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {
            tracing::warn!("admin connections still open after 5s; closing them");
        }
    }
    Ok(())
}

fn respond(req: &Request<Incoming>, registry: &Registry, probes: &Probes) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            let mut response = text(StatusCode::OK, crate::metrics::render(registry));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        "/healthz" | "/livez" => match probes.liveness() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {why}\n")),
        },
        "/readyz" if probes.is_ready() => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = raw
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    #[tokio::test]
    async fn serves_probes_and_metrics_then_stops() {
        let registry = crate::metrics::new_registry().unwrap();
        let probes = Probes::default();
        let shutdown = Shutdown::new();
        let addr = "127.0.0.1:0".parse().unwrap();
        let (task, addr) = bind(addr, registry, probes.clone(), shutdown.clone()).await.unwrap();

        assert_eq!(get(addr, "/readyz").await.0, 503);
        probes.set_ready(true);
        assert_eq!(get(addr, "/readyz").await, (200, "ok\n".into()));
        assert_eq!(get(addr, "/healthz").await.0, 200);
        probes.set_liveness_check(|| Err("DRBD state is 40s old".into()));
        let (status, body) = get(addr, "/healthz").await;
        assert_eq!(status, 503);
        assert!(body.contains("40s old"), "{body}");

        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("shared_volume_controller_build_info"), "{body}");
        assert_eq!(get(addr, "/nope").await.0, 404);

        shutdown.cancel();
        task.await.unwrap().unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "listener still open"
        );
    }
}
