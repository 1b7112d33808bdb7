//! The admin server: `/metrics`, `/healthz` and `/readyz` over HTTP/1, one task per connection.
//!
//! It must keep answering the kubelet's probes whatever else connects: the agent serves it on the
//! host network. A client gets [`Limits::header_read_timeout`] to send its request head (idle
//! connections included); past [`Limits::max_connections`] the oldest connection is closed to make
//! room, so a flood of idle connections cannot lock the probes out; failed accepts (out of file
//! descriptors) back off instead of spinning.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

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

/// How much the admin server gives any one client.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Time to send a request head, from the connection's start or the previous response.
    pub header_read_timeout: Duration,
    /// Connections served at once; one more closes the oldest.
    pub max_connections: usize,
    /// Longest pause after failed accepts (the pause doubles from 10 ms up to this).
    pub max_accept_backoff: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            max_connections: 256,
            max_accept_backoff: Duration::from_secs(1),
        }
    }
}

/// Binds `addr` and serves until `shutdown` is cancelled; open connections are then drained.
/// Returns once the listener is bound, with the serving task's handle.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
) -> Result<JoinHandle<Result<()>>> {
    Ok(bind(addr, registry, probes, shutdown, Limits::default()).await?.0)
}

/// Like [`serve`] with explicit limits, and also returns the address actually bound (useful with
/// port 0).
pub async fn bind(
    addr: SocketAddr,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
    limits: Limits,
) -> Result<(JoinHandle<Result<()>>, SocketAddr)> {
    let listener = listen(addr)
        .and_then(|std| {
            std.set_nonblocking(true)?;
            TcpListener::from_std(std)
        })
        .with_context(|| format!("cannot listen on admin address {addr} (change it with --admin-addr)"))?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "admin server listening");
    let task = tokio::spawn(accept_loop(listener, registry, probes, shutdown, limits));
    Ok((task, bound))
}

/// A listener on `addr`. The IPv6 unspecified address (`[::]`, the default) takes both families
/// whatever `net.ipv6.bindv6only` says, so that probes reach it on IPv4, IPv6 and dual-stack
/// clusters alike; on a host without IPv6 it falls back to `0.0.0.0`.
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let open = |addr: SocketAddr, dual_stack: bool| -> std::io::Result<std::net::TcpListener> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        if dual_stack {
            socket.set_only_v6(false)?;
        }
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        Ok(socket.into())
    };
    if addr.ip() != std::net::Ipv6Addr::UNSPECIFIED {
        return open(addr, false);
    }
    open(addr, true).or_else(|error| {
        let v4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
        tracing::info!(%error, fallback = %v4, "no IPv6 on this host: the admin server listens on IPv4 only");
        open(v4, false)
    })
}

/// The open connections, oldest first, each with the token that closes it.
#[derive(Clone, Default)]
struct Connections(Arc<Mutex<std::collections::BTreeMap<u64, CancellationToken>>>);

impl Connections {
    /// Registers a new connection, closing the oldest ones beyond `max`.
    fn open(&self, id: u64, max: usize) -> CancellationToken {
        let mut open = self.0.lock().expect("connections lock poisoned");
        while open.len() >= max.max(1) {
            let Some((_, oldest)) = open.pop_first() else { break };
            oldest.cancel();
        }
        let token = CancellationToken::new();
        open.insert(id, token.clone());
        token
    }

    fn close(&self, id: u64) {
        self.0.lock().expect("connections lock poisoned").remove(&id);
    }
}

async fn accept_loop(
    listener: TcpListener,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
    limits: Limits,
) -> Result<()> {
    let graceful = GracefulShutdown::new();
    let connections = Connections::default();
    let mut backoff = AcceptBackoff::new(limits.max_accept_backoff);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    for id in 0u64.. {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    backoff.succeeded();
                    accepted
                }
                Err(err) => {
                    let pause = backoff.failed();
                    tracing::warn!(error = %err, pause = ?pause, "admin server cannot accept a connection");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => continue,
                        _ = shutdown.cancelled() => break,
                    }
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
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        let evicted = connections.open(id, limits.max_connections);
        let connections = connections.clone();
        tokio::spawn(async move {
            tokio::select! {
                result = connection => if let Err(err) = result {
                    tracing::debug!(error = %err, "admin connection ended with an error");
                },
                _ = evicted.cancelled() => tracing::debug!("admin connection closed to make room for a newer one"),
            }
            connections.close(id);
        });
    }
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(5)) => {
            tracing::warn!("admin connections still open after 5s; closing them");
        }
    }
    Ok(())
}

/// The pause after a failed accept: 10 ms, doubling up to a maximum, reset by a success.
struct AcceptBackoff {
    next: Duration,
    max: Duration,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);

    fn new(max: Duration) -> Self {
        Self { next: Self::FIRST, max }
    }

    fn failed(&mut self) -> Duration {
        let pause = self.next.min(self.max);
        self.next = (self.next * 2).min(self.max);
        pause
    }

    fn succeeded(&mut self) {
        self.next = Self::FIRST;
    }
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
        let (task, addr) = bind(addr, registry, probes.clone(), shutdown.clone(), Limits::default())
            .await
            .unwrap();

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
        assert!(body.contains(crate::metrics::BUILD_INFO), "{body}");
        let revision = format!("revision=\"{}\"", env!("SVC_GIT_REVISION"));
        assert!(body.contains(&revision), "build_info carries the git revision: {body}");
        assert_ne!(env!("SVC_GIT_REVISION"), "", "{body}");
        assert_eq!(get(addr, "/nope").await.0, 404);

        shutdown.cancel();
        task.await.unwrap().unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "listener still open"
        );
    }

    /// The default admin address answers probes over both families: an IPv6 single-stack cluster's
    /// kubelet probes the pod's IPv6 address, an IPv4 one its IPv4 address.
    #[tokio::test]
    async fn the_default_admin_address_answers_on_both_families() {
        use clap::Parser;
        let cli = crate::Cli::try_parse_from(["shared-volume-controller", "controller"]).unwrap();
        let mut addr = cli.common.admin_addr;
        addr.set_port(0);
        let probes = Probes::default();
        probes.set_ready(true);
        let shutdown = Shutdown::new();
        let registry = crate::metrics::new_registry().unwrap();
        let (task, bound) = bind(addr, registry, probes, shutdown.clone(), Limits::default())
            .await
            .unwrap();
        for loopback in ["127.0.0.1", "::1"] {
            let at = SocketAddr::new(loopback.parse().unwrap(), bound.port());
            assert_eq!(get(at, "/readyz").await.0, 200, "over {loopback}");
        }
        shutdown.cancel();
        task.await.unwrap().unwrap();
    }

    async fn start(limits: Limits) -> (SocketAddr, Shutdown, JoinHandle<Result<()>>) {
        let registry = crate::metrics::new_registry().unwrap();
        let shutdown = Shutdown::new();
        let addr = "127.0.0.1:0".parse().unwrap();
        let (task, addr) = bind(addr, registry, Probes::default(), shutdown.clone(), limits)
            .await
            .unwrap();
        (addr, shutdown, task)
    }

    #[tokio::test]
    async fn a_client_that_sends_its_head_slowly_is_cut_off() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let (addr, shutdown, task) = start(limits).await;
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        let started = std::time::Instant::now();
        let mut closed = false;
        for header in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow
                .write_all(format!("X-Slow-{header}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                closed = true;
                break;
            }
            let mut buf = [0u8; 512];
            if let Ok(Ok(read)) = tokio::time::timeout(Duration::from_millis(1), slow.read(&mut buf)).await {
                closed = true;
                assert!(read == 0 || buf.starts_with(b"HTTP/1.1 408"), "{:?}", &buf[..read]);
                break;
            }
        }
        assert!(closed, "a head sent over 4 s is still being read");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "cut off after {:?}",
            started.elapsed()
        );
        assert_eq!(get(addr, "/healthz").await.0, 200);
        shutdown.cancel();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_thousand_idle_connections_do_not_lock_out_the_probes() {
        let limits = Limits {
            max_connections: 64,
            ..Limits::default()
        };
        let (addr, shutdown, task) = start(limits).await;
        let mut idle = Vec::new();
        for _ in 0..1000 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let probe = tokio::time::timeout(Duration::from_secs(1), get(addr, "/healthz")).await;
        assert_eq!(probe.expect("/healthz answers within 1 s").0, 200);
        drop(idle);
        shutdown.cancel();
        task.await.unwrap().unwrap();
    }

    #[test]
    fn failed_accepts_back_off_up_to_the_maximum_and_a_success_resets() {
        let mut backoff = AcceptBackoff::new(Duration::from_millis(50));
        let pauses: Vec<u128> = (0..5).map(|_| backoff.failed().as_millis()).collect();
        assert_eq!(pauses, [10, 20, 40, 50, 50]);
        backoff.succeeded();
        assert_eq!(backoff.failed(), Duration::from_millis(10));
    }
}
