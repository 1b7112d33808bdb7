//! The Kubernetes client both loops use, from the common flags, and what both do to the objects
//! they cache.

use anyhow::{Context as _, Result};
use hyper::body::Incoming;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use crate::cli::CommonArgs;

/// The HTTP status the API server answered with, for an error that is such an answer; `None`
/// for every other error (connection, timeout, decoding).
pub fn api_status(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// An answer of the API server that no retry of the same write can change: the request is
/// forbidden (RBAC, an admission policy) or invalid for this cluster (a Service of an address
/// family the cluster does not serve, a field the API rejects).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 403: a permission the writer's role lacks, or an admission policy that denies it.
    Forbidden(String),
    /// 400 or 422: the object as written is refused by validation or admission.
    Invalid(String),
}

impl Refusal {
    /// The refusal in `err`, if it is one; `None` for errors a retry may clear (conflicts,
    /// throttling, server errors, broken connections).
    pub fn of(err: &kube::Error) -> Option<Self> {
        let kube::Error::Api(status) = err else {
            return None;
        };
        match status.code {
            403 => Some(Self::Forbidden(status.message.clone())),
            400 | 422 => Some(Self::Invalid(status.message.clone())),
            _ => None,
        }
    }

    /// Whether retrying at the normal pace can still help: right after an API server restart its
    /// authorizer may refuse for a moment what it allows once its caches have synced.
    pub fn may_pass_soon(&self) -> bool {
        matches!(self, Self::Forbidden(_))
    }

    /// What the API server said, and what a user can do about it. `writer` names who was refused
    /// ("the controller", "the agent").
    pub fn explain(&self, writer: &str) -> String {
        match self {
            Self::Forbidden(message) => format!(
                "the API server forbids {writer} this write ({message}): its ServiceAccount lacks a permission \
                 or an admission policy denies it; compare the chart's roles and policies with what is installed"
            ),
            Self::Invalid(message) => format!(
                "the API server refuses this write as invalid ({message}); retrying cannot change that: fix what \
                 it names (for a Service, the cluster must serve the NFS server's address family)"
            ),
        }
    }
}

/// The stack [`client_builder`] starts from: requests in, responses with hyper's bodies out.
pub type ApiService = BoxService<hyper::Request<Body>, hyper::Response<Incoming>, BoxError>;

/// Connects as the flags say: `--kubeconfig` or the usual places, `--kube-api-timeout` as the
/// read and write timeout. `retry`: whether the client itself retries throttled requests; the
/// agent wants a PodDisruptionBudget's 429 at once (it retries in a later round) rather than a
/// client that waits inside the call for Retry-After.
pub async fn connect(common: &CommonArgs, retry: bool) -> Result<Client> {
    Ok(client_builder(&config(common, retry).await?)?.build())
}

/// The kubeconfig entries the flags chose, in words: "the context x, the user y"; empty when
/// none.
fn chosen_names(common: &CommonArgs) -> String {
    let chosen = [
        ("context", &common.context),
        ("cluster", &common.cluster),
        ("user", &common.user),
    ];
    let named: Vec<String> = chosen
        .iter()
        .filter_map(|(kind, name)| name.as_ref().map(|name| format!("the {kind} {name}")))
        .collect();
    named.join(", ")
}

/// The client configuration [`connect`] uses, for callers that add layers of their own.
pub async fn config(common: &CommonArgs, retry: bool) -> Result<Config> {
    let options = KubeConfigOptions {
        context: common.context.clone(),
        cluster: common.cluster.clone(),
        user: common.user.clone(),
    };
    let chosen = chosen_names(common);
    let mut config = match (&common.kubeconfig, chosen.is_empty()) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("cannot use the kubeconfig {}", path.display()))?
        }
        (None, false) => Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("cannot use {chosen} of KUBECONFIG or ~/.kube/config"))?,
        (None, true) => Config::infer()
            .await
            .context("cannot find the Kubernetes API (in-cluster, KUBECONFIG or ~/.kube/config)")?,
    };
    if let Some(timeout) = common.kube_api_timeout {
        config.read_timeout = Some(*timeout);
        config.write_timeout = Some(*timeout);
    }
    if common.impersonate.is_some() {
        config.auth_info.impersonate = common.impersonate.clone();
    }
    if !common.impersonate_groups.is_empty() {
        config.auth_info.impersonate_groups = Some(common.impersonate_groups.clone());
    }
    config.default_retry = retry;
    Ok(config)
}

/// kube's client stack (API address, credentials, extra headers, the retry of throttled
/// requests, timeouts, rustls), assembled here for one difference: its connections send every
/// write at once (`TCP_NODELAY`). kube's own leaves Nagle's algorithm on (kube-rs#2056), and a
/// new connection's TLS handshake then waits ~40 ms for a delayed ACK; a fail-over's first
/// writes, made at once after a quiet time, each open one.
pub fn client_builder(config: &Config) -> Result<ClientBuilder<ApiService>> {
    let https = config
        .rustls_https_connector_with_connector(http_connector())
        .context("cannot set up TLS to the Kubernetes API")?;
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let connections = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().context("cannot use the Kubernetes credentials")?)
        .layer(
            config
                .extra_headers_layer()
                .context("cannot use the configured headers")?,
        )
        .map_err(BoxError::from)
        .service(connections)
        .boxed();
    Ok(ClientBuilder::new(service, config.default_namespace.clone()))
}

fn http_connector() -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http
}

/// Objects per page when a cache lists a kind that can number in the thousands.
const LIST_PAGE_SIZE: u32 = 100;

/// `config` listing in small pages. The watcher's default list (at resourceVersion 0, from the
/// API server's cache) comes back whole however large, and what parsing a list takes stays in the
/// allocator's arenas: an agent beside 10,000 PVs peaked at 37 MiB listing them whole, 28.6 MiB in
/// pages of 250 and 23.0 MiB in pages of 100, against 19.4 MiB with none.
pub fn paged(config: watcher::Config) -> watcher::Config {
    config
        .list_semantic(watcher::ListSemantic::MostRecent)
        .page_size(LIST_PAGE_SIZE)
}

/// The managed fields, often the larger part of an object, are read by neither loop: caches drop
/// them.
pub fn drop_managed_fields<K: kube::ResourceExt>(object: &mut K) {
    // None, not an emptied list: a cleared Vec keeps its buffer.
    object.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;
    use tower::Service;

    #[tokio::test]
    async fn kubectls_flags_choose_the_cluster_the_user_and_whom_to_impersonate() {
        use clap::Parser;
        let kubeconfig = std::env::temp_dir().join(format!("svc-kubectl-flags-{}.yaml", std::process::id()));
        let entries = |kind: &str, body: &dyn Fn(u8) -> serde_json::Value| {
            (1..=2u8)
                .map(|i| serde_json::json!({"name": format!("{kind}{i}"), kind: body(i)}))
                .collect::<Vec<_>>()
        };
        let file = serde_json::json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "default",
            "clusters": entries("cluster", &|i| serde_json::json!({"server": format!("https://10.0.0.{i}:6443")})),
            "users": entries("user", &|i| serde_json::json!({"username": format!("name-{i}"), "password": "p"})),
            "contexts": [{"name": "default", "context": {"cluster": "cluster1", "user": "user1"}}],
        });
        std::fs::write(&kubeconfig, file.to_string()).unwrap();
        let path = kubeconfig.to_str().unwrap();
        let flags = [
            "status",
            "--kubeconfig",
            path,
            "--cluster",
            "cluster2",
            "--user",
            "user2",
        ];
        let impersonating = ["--as", "alice", "--as-group", "ops", "--as-group", "dev"];
        let cli =
            crate::Cli::try_parse_from(["kubectl-shared_volume"].iter().chain(&flags).chain(&impersonating)).unwrap();
        let config = config(&cli.common, false).await.unwrap();
        std::fs::remove_file(&kubeconfig).unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://10.0.0.2:6443/");
        assert_eq!(config.auth_info.username.as_deref(), Some("name-2"));
        assert_eq!(config.auth_info.impersonate.as_deref(), Some("alice"));
        assert_eq!(
            config.auth_info.impersonate_groups,
            Some(vec!["ops".to_owned(), "dev".to_owned()])
        );
    }

    #[test]
    fn refusals_are_the_answers_no_retry_changes() {
        let answer = |code| kube::Error::Api(kube::core::Status::failure("no", "Test").with_code(code).boxed());
        let cases = [
            (403, Some(Refusal::Forbidden("no".into()))),
            (422, Some(Refusal::Invalid("no".into()))),
            (400, Some(Refusal::Invalid("no".into()))),
            (404, None),
            (409, None),
            (429, None),
            (500, None),
        ];
        for (code, refusal) in cases {
            assert_eq!(Refusal::of(&answer(code)), refusal, "{code}");
        }
        assert_eq!(Refusal::of(&kube::Error::LinesCodecMaxLineLengthExceeded), None);
        assert!(
            Refusal::Forbidden("x".into())
                .explain("the agent")
                .contains("ServiceAccount")
        );
    }

    #[tokio::test]
    async fn connections_send_each_write_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: http::Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let stream: TokioIo<tokio::net::TcpStream> = http_connector().call(uri).await.unwrap();
        assert!(stream.inner().nodelay().unwrap(), "TCP_NODELAY");
    }
}
