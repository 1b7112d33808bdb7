//! A scripted API server for unit tests of both loops: every request is answered by a function
//! of its method, path, query and body, so a test states only the answers it cares about; or,
//! [`in_order`], by a script of exact requests that must come in that order.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};

/// What the script sees of a request.
pub(crate) struct Request {
    pub method: http::Method,
    pub path: String,
    pub query: String,
    /// The JSON body of a write; `Null` for none.
    pub body: Value,
}

impl Request {
    /// `"GET /api/v1/…"`: the method and path, without the query.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// A client whose every request `answer` answers with a status and a body.
pub(crate) fn client(answer: impl Fn(&Request) -> (u16, String) + Send + Sync + 'static) -> kube::Client {
    let answer = Arc::new(answer);
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let answer = answer.clone();
        async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let seen = Request {
                method: parts.method,
                path: parts.uri.path().to_owned(),
                query: parts.uri.query().unwrap_or_default().to_owned(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (status, body) = answer(&seen);
            let mut response = http::Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = http::StatusCode::from_u16(status).expect("a valid status");
            response
                .headers_mut()
                .insert("content-type", http::HeaderValue::from_static("application/json"));
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}

/// One expected request (`"GET /api/v1/…"`, no query) and the answer to it.
pub(crate) struct Exchange {
    pub request: String,
    pub status: u16,
    pub body: Value,
}

pub(crate) fn answer(request: &str, status: u16, body: Value) -> Exchange {
    Exchange {
        request: request.to_owned(),
        status,
        body,
    }
}

pub(crate) fn not_found(request: &str) -> Exchange {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"});
    answer(request, 404, status)
}

/// What an [`in_order`] server saw: each request line, with the body of every request.
#[derive(Default)]
pub(crate) struct Seen {
    pub requests: Vec<String>,
    pub bodies: Vec<Value>,
}

/// A client whose API server answers the `script` in order; any other request gets a 500 and
/// is recorded as it came.
pub(crate) fn in_order(script: Vec<Exchange>) -> (kube::Client, Arc<Mutex<Seen>>) {
    let script = Mutex::new(VecDeque::from(script));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let client = client({
        let seen = seen.clone();
        move |request| {
            let line = request.line();
            let next = script.lock().expect("script poisoned").pop_front();
            let mut seen = seen.lock().expect("seen poisoned");
            seen.requests.push(line.clone());
            seen.bodies.push(request.body.clone());
            let (status, body) = match next {
                Some(exchange) if exchange.request == line => (exchange.status, exchange.body),
                _ => (500, json!({"kind": "Status", "code": 500, "message": "unexpected"})),
            };
            (status, body.to_string())
        }
    });
    (client, seen)
}
