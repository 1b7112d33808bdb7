//! A scripted API server for unit tests: every request is answered by a function of its method,
//! path and query, so a test states only the answers it cares about.

use http_body_util::Full;
use hyper::body::Bytes;

/// What the script sees of a request.
pub(crate) struct Request {
    pub method: http::Method,
    pub path: String,
    pub query: String,
}

/// A client whose every request `answer` answers with a status and a body.
pub(crate) fn client(answer: impl Fn(&Request) -> (u16, String) + Send + Sync + 'static) -> kube::Client {
    let answer = std::sync::Arc::new(answer);
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let seen = Request {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            query: request.uri().query().unwrap_or_default().to_owned(),
        };
        let (status, body) = answer(&seen);
        async move {
            let mut response = http::Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = http::StatusCode::from_u16(status).expect("a valid status");
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}
