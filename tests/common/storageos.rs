//! A local stand-in for the StorageOS v2 REST API: exactly the endpoints the controller uses,
//! with expiring tokens and version checks, and knobs to expire tokens or force conflicts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

pub const USERNAME: &str = "storageos";
pub const PASSWORD: &str = "s3cret";

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    pub logins: usize,
    /// Logins with wrong credentials.
    pub refused_logins: usize,
    pub refreshes: usize,
    pub rejected_tokens: usize,
    pub conflicts: usize,
    pub publishes: usize,
}

#[derive(Default)]
struct State {
    token_ttl: Duration,
    tokens: HashMap<String, Instant>,
    issued: usize,
    /// namespace id → volumes (as the API returns them).
    volumes: HashMap<String, Vec<Value>>,
    /// The next PUTs that answer 409 (after bumping the version, as a concurrent writer would).
    conflicts_to_inject: usize,
    /// How long every answer is held back (a slow or hanging API).
    delay: Duration,
    /// The next requests (after login) that answer 500.
    failures_to_inject: usize,
    stats: Stats,
}

#[derive(Clone)]
pub struct FakeStorageOs {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl FakeStorageOs {
    /// Serves on a free loopback port until the test ends; tokens live `token_ttl`.
    pub async fn start(token_ttl: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            token_ttl,
            volumes: [("ns-default".to_string(), Vec::new())].into(),
            ..Default::default()
        }));
        let server_state = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = server_state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, hyper::Error>(handle(&state, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds a volume in the `default` namespace, labelled for `claim` in `claim_ns` unless
    /// `labelled` is false.
    pub fn add_volume(&self, id: &str, pv: &str, claim_ns: &str, claim: &str, service_endpoint: &str, labelled: bool) {
        let labels = if labelled {
            json!({
                "csi.storage.k8s.io/pv/name": pv,
                "csi.storage.k8s.io/pvc/name": claim,
                "csi.storage.k8s.io/pvc/namespace": claim_ns,
            })
        } else {
            json!({})
        };
        let volume = json!({
            "id": id, "name": pv, "namespaceID": "ns-default", "labels": labels,
            "nfs": {"exports": [], "serviceEndpoint": service_endpoint},
            "sizeBytes": 1073741824u64, "version": "1",
        });
        self.state
            .lock()
            .unwrap()
            .volumes
            .get_mut("ns-default")
            .unwrap()
            .push(volume);
    }

    pub fn set_service_endpoint(&self, id: &str, endpoint: &str) {
        self.update(id, |volume| volume["nfs"]["serviceEndpoint"] = json!(endpoint));
    }

    /// The mount endpoint published to a volume, if any.
    pub fn mount_endpoint(&self, id: &str) -> Option<String> {
        let state = self.state.lock().unwrap();
        let volume = state.volumes["ns-default"].iter().find(|v| v["id"] == id)?;
        volume["labels"]["storageos.com/nfs/mount-endpoint"]
            .as_str()
            .map(str::to_owned)
    }

    /// Holds back every answer by `delay` (a hanging API: longer than the client's timeout).
    pub fn set_delay(&self, delay: Duration) {
        self.state.lock().unwrap().delay = delay;
    }

    /// The next `count` authenticated requests answer 500.
    pub fn inject_failures(&self, count: usize) {
        self.state.lock().unwrap().failures_to_inject = count;
    }

    pub fn inject_conflicts(&self, count: usize) {
        self.state.lock().unwrap().conflicts_to_inject = count;
    }

    /// Invalidates every token handed out so far, as a restarted API server would.
    pub fn expire_tokens(&self) {
        self.state.lock().unwrap().tokens.clear();
    }

    pub fn stats(&self) -> Stats {
        self.state.lock().unwrap().stats
    }

    fn update(&self, id: &str, change: impl FnOnce(&mut Value)) {
        let mut state = self.state.lock().unwrap();
        let volume = state
            .volumes
            .get_mut("ns-default")
            .unwrap()
            .iter_mut()
            .find(|v| v["id"] == id);
        bump(volume.expect("no such volume"), change);
    }
}

fn bump(volume: &mut Value, change: impl FnOnce(&mut Value)) {
    change(volume);
    let version: u64 = volume["version"].as_str().unwrap().parse().unwrap();
    volume["version"] = json!((version + 1).to_string());
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    reply(status, json!({"error": message}))
}

fn with_token(state: &mut State) -> Response<Full<Bytes>> {
    state.issued += 1;
    let token = format!("token-{}", state.issued);
    state.tokens.insert(token.clone(), Instant::now() + state.token_ttl);
    let mut response = reply(StatusCode::OK, json!({"id": "user-1", "username": USERNAME}));
    response
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    response
}

fn valid_token(state: &State, request: &Request<Incoming>) -> bool {
    let token = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    token
        .and_then(|t| state.tokens.get(t))
        .is_some_and(|expiry| Instant::now() < *expiry)
}

async fn handle(state: &Mutex<State>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let delay = state.lock().unwrap().delay;
    tokio::time::sleep(delay).await;
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let authorized = valid_token(&state.lock().unwrap(), &request);
    let bytes = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return error(StatusCode::BAD_REQUEST, "unreadable body"),
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut state = state.lock().unwrap();
    match (method, segments.as_slice()) {
        (Method::POST, ["v2", "auth", "login"]) => {
            if body["username"] == USERNAME && body["password"] == PASSWORD {
                state.stats.logins += 1;
                with_token(&mut state)
            } else {
                state.stats.refused_logins += 1;
                error(StatusCode::UNAUTHORIZED, "invalid credentials")
            }
        }
        _ if !authorized => {
            state.stats.rejected_tokens += 1;
            error(StatusCode::UNAUTHORIZED, "token missing or expired")
        }
        _ if state.failures_to_inject > 0 => {
            state.failures_to_inject -= 1;
            error(StatusCode::INTERNAL_SERVER_ERROR, "injected failure")
        }
        (Method::POST, ["v2", "auth", "refresh"]) => {
            state.stats.refreshes += 1;
            with_token(&mut state)
        }
        (Method::GET, ["v2", "namespaces"]) => {
            let namespaces: Vec<Value> = state
                .volumes
                .keys()
                .map(|id| json!({"id": id, "name": id.trim_start_matches("ns-"), "version": "1"}))
                .collect();
            reply(StatusCode::OK, json!(namespaces))
        }
        (Method::GET, ["v2", "namespaces", ns, "volumes"]) => match state.volumes.get(*ns) {
            Some(volumes) => reply(StatusCode::OK, json!(volumes)),
            None => error(StatusCode::NOT_FOUND, "no such namespace"),
        },
        (Method::GET, ["v2", "namespaces", ns, "volumes", id]) => {
            match state.volumes.get(*ns).and_then(|v| v.iter().find(|v| v["id"] == *id)) {
                Some(volume) => reply(StatusCode::OK, volume.clone()),
                None => error(StatusCode::NOT_FOUND, "no such volume"),
            }
        }
        (Method::PUT, ["v2", "namespaces", ns, "volumes", id, "nfs", "mount-endpoint"]) => {
            publish(&mut state, ns, id, &body)
        }
        _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

/// `PUT …/nfs/mount-endpoint`: the API's optimistic concurrency (a stale version is a 409),
/// with the conflicts a test asked for injected first.
fn publish(state: &mut State, ns: &str, id: &str, body: &Value) -> Response<Full<Bytes>> {
    let inject = state.conflicts_to_inject > 0;
    let Some(volume) = state
        .volumes
        .get_mut(ns)
        .and_then(|v| v.iter_mut().find(|v| v["id"] == *id))
    else {
        return error(StatusCode::NOT_FOUND, "no such volume");
    };
    if inject {
        bump(volume, |_| {});
    }
    if body["version"] != volume["version"] || !body["mountEndpoint"].is_string() {
        let current = volume["version"].clone();
        if inject {
            state.conflicts_to_inject -= 1;
        }
        state.stats.conflicts += 1;
        return error(
            StatusCode::CONFLICT,
            &format!("version mismatch: volume is at {current}"),
        );
    }
    let endpoint = body["mountEndpoint"].clone();
    bump(volume, |v| v["labels"]["storageos.com/nfs/mount-endpoint"] = endpoint);
    state.stats.publishes += 1;
    reply(StatusCode::OK, json!({}))
}
