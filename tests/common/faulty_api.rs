//! An API server with a fault, for the processes of a test: a plain-HTTP proxy on loopback in front
//! of the control plane's kube-apiserver. A process reaches it through a kubeconfig whose server
//! is the proxy ([`FaultyApi::kubeconfig_through`]); the proxy forwards as the admin, so the
//! impersonation of the process's own kubeconfig keeps it signed in as the chart's account.
//! Watches are streamed as they come. The faults ([`Fault`]):
//!
//! - one read in `n` fails (a GET that is not a watch), with the 500 `InternalError` an API server
//!   whose etcd times out answers;
//! - two API servers behind one address whose clocks are apart: a Lease write taken by the second
//!   one carries its stamps (the managed fields' `time`, which the server writes) that much
//!   earlier. Which server took a write is drawn from its resourceVersion (odd: the second), so
//!   that every reader, the writer included, sees the same stamps.
//!
//! It runs on a thread and a runtime of its own, so that a test waiting on a subprocess cannot
//! stall the processes behind it. What it leaves out: slow answers, refused connections, failed
//! writes, watches cut short, and the second server's other stamps (creation times, events).

use std::convert::Infallible;
use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::accounts::config_from;

/// Headers of one hop, never forwarded.
const HOP_BY_HOP: [&str; 4] = ["host", "connection", "transfer-encoding", "content-length"];

type Answer = Response<UnsyncBoxBody<Bytes, Box<dyn StdError + Send + Sync>>>;

/// What the proxy does to the requests it forwards.
#[derive(Clone, Copy)]
pub enum Fault {
    /// Every n-th read fails.
    FailEveryRead(usize),
    /// A second API server, its clock this far behind, takes about half of the Lease writes.
    TwoClocksApart(Duration),
}

#[derive(Default)]
struct Counts {
    reads: AtomicUsize,
    failed: AtomicUsize,
    restamped: AtomicUsize,
}

pub struct FaultyApi {
    address: std::net::SocketAddr,
    counts: Arc<Counts>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultyApi {
    /// Serves on a free loopback port, forwarding to the API server of `admin_kubeconfig` with
    /// `fault`, until dropped.
    pub fn start(admin_kubeconfig: &str, fault: Fault) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let counts = Arc::new(Counts::default());
        let (stop, stopped) = oneshot::channel();
        let (admin, serving) = (admin_kubeconfig.to_owned(), counts.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                tokio::select! {
                    _ = stopped => {}
                    () = serve(listener, &admin, fault, serving) => {}
                }
            });
        });
        Self {
            address,
            counts,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// A copy of `kubeconfig` whose server is this proxy, beside it.
    pub fn kubeconfig_through(&self, kubeconfig: &str) -> String {
        let mut config: Value = serde_yaml::from_str(&std::fs::read_to_string(kubeconfig).unwrap()).unwrap();
        for entry in config["clusters"].as_array_mut().unwrap() {
            entry["cluster"] = json!({"server": format!("http://{}", self.address)});
        }
        let path = format!("{kubeconfig}.through-{}", self.address.port());
        std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
        path
    }

    /// How many reads it failed so far, and how many it saw.
    pub fn failed_of_reads(&self) -> (usize, usize) {
        let failed = self.counts.failed.load(Ordering::Relaxed);
        (failed, self.counts.reads.load(Ordering::Relaxed))
    }

    /// How many Leases it showed with the second server's stamps so far.
    pub fn restamped(&self) -> usize {
        self.counts.restamped.load(Ordering::Relaxed)
    }
}

impl Drop for FaultyApi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: std::net::TcpListener, admin_kubeconfig: &str, fault: Fault, counts: Arc<Counts>) {
    let client = kube::Client::try_from(config_from(admin_kubeconfig).await).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    while let Ok((stream, _)) = listener.accept().await {
        let (client, counts) = (client.clone(), counts.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (client, counts) = (client.clone(), counts.clone());
                async move { Ok::<_, Infallible>(answer(&client, &counts, fault, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Fails the request if the fault says so, or forwards it and passes the answer on, restamped
/// where the fault says so.
async fn answer(client: &kube::Client, counts: &Arc<Counts>, fault: Fault, request: Request<Incoming>) -> Answer {
    let watch = is_watch(&request);
    let read = request.method() == Method::GET && !watch;
    if let Fault::FailEveryRead(every) = fault
        && read
        && (counts.reads.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(every)
    {
        counts.failed.fetch_add(1, Ordering::Relaxed);
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "etcdserver: request timed out",
        );
    }
    let leases = request.uri().path().contains("/leases");
    let response = match forward(client, request).await {
        Ok(response) => response,
        Err(error) => return status(StatusCode::BAD_GATEWAY, "InternalError", &error),
    };
    match fault {
        Fault::TwoClocksApart(apart) if leases && response.status().is_success() => {
            restamp_answer(response, apart, counts.clone(), watch).await
        }
        _ => response.map(|body| body.map_err(Into::into).boxed_unsync()),
    }
}

/// The request sent on to the API server as it came, but for the headers of its hop.
async fn forward(client: &kube::Client, request: Request<Incoming>) -> Result<Response<Body>, String> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let mut forwarded = Request::builder().method(parts.method).uri(parts.uri);
    for (name, value) in parts
        .headers
        .iter()
        .filter(|(name, _)| !HOP_BY_HOP.contains(&name.as_str()))
    {
        forwarded = forwarded.header(name, value);
    }
    let mut response = client
        .send(forwarded.body(Body::from(body)).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    for name in HOP_BY_HOP {
        response.headers_mut().remove(name);
    }
    Ok(response)
}

/// A Lease answer with the second server's stamps where it took the write: a watch line by line
/// as the lines come, anything else whole.
async fn restamp_answer(response: Response<Body>, apart: Duration, counts: Arc<Counts>, watch: bool) -> Answer {
    let (parts, body) = response.into_parts();
    if !watch {
        let body = match body.collect().await {
            Ok(body) => restamp_document(&body.to_bytes(), apart, &counts),
            Err(error) => return status(StatusCode::BAD_GATEWAY, "InternalError", &error.to_string()),
        };
        return Response::from_parts(
            parts,
            http_body_util::Full::new(body).map_err(Into::into).boxed_unsync(),
        );
    }
    let mut pending = Vec::new();
    let lines = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(|e| Box::new(e) as Box<dyn StdError + Send + Sync>)?;
        pending.extend_from_slice(&chunk);
        let mut whole = Vec::new();
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            whole.extend_from_slice(&restamp_document(&line, apart, &counts));
            whole.push(b'\n');
        }
        Ok(Frame::data(Bytes::from(whole)))
    });
    Response::from_parts(parts, StreamBody::new(lines).boxed_unsync())
}

/// One JSON document of a Lease answer (a Lease, a list of them or a watch event), restamped.
fn restamp_document(document: &[u8], apart: Duration, counts: &Counts) -> Bytes {
    let Ok(mut value) = serde_json::from_slice::<Value>(document) else {
        return Bytes::copy_from_slice(document.trim_ascii_end());
    };
    let leases: Vec<&mut Value> = if let Some(items) = value.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().collect()
    } else if value.get("object").is_some() {
        vec![&mut value["object"]]
    } else {
        vec![&mut value]
    };
    for lease in leases {
        if restamp(lease, apart) {
            counts.restamped.fetch_add(1, Ordering::Relaxed);
        }
    }
    Bytes::from(serde_json::to_vec(&value).unwrap())
}

/// Moves the managed fields' times of `lease` back by `apart` if the second server took its
/// write (an odd resourceVersion). Says whether it did.
fn restamp(lease: &mut Value, apart: Duration) -> bool {
    let version = lease["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse::<u64>().ok());
    if version.is_none_or(|version| version % 2 == 0) {
        return false;
    }
    for entry in lease["metadata"]["managedFields"].as_array_mut().into_iter().flatten() {
        let Some(at) = entry["time"].as_str().and_then(|t| humantime::parse_rfc3339(t).ok()) else {
            continue;
        };
        entry["time"] = json!(humantime::format_rfc3339_seconds(at - apart).to_string());
    }
    true
}

/// Whether the request is a watch.
fn is_watch(request: &Request<Incoming>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    query.split('&').any(|pair| pair == "watch=true" || pair == "watch=1")
}

/// A Kubernetes `Status` answer.
fn status(code: StatusCode, reason: &str, message: &str) -> Answer {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
        "reason": reason, "code": code.as_u16()});
    let body = Bytes::from(serde_json::to_vec(&body).unwrap());
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(body).map_err(Into::into).boxed_unsync())
        .unwrap()
}
