//! The part of the StorageOS v2 REST API the controller uses, behind [`StorageOsApi`] so the
//! backend's logic can be tested with mocks, and its HTTP implementation with token handling.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Namespace {
    pub id: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "namespaceID", default)]
    pub namespace_id: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub nfs: Nfs,
    #[serde(default)]
    pub version: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Nfs {
    #[serde(default)]
    pub service_endpoint: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MountEndpointUpdate<'a> {
    mount_endpoint: &'a str,
    version: &'a str,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The volume changed since it was read (HTTP 409): re-read and retry.
    #[error("version conflict: {0}")]
    Conflict(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("cannot read credentials from {path}: {source}")]
    Credentials { path: PathBuf, source: std::io::Error },
    #[error("login refused (HTTP {0}): check the username and password in the API secret")]
    LoginRefused(StatusCode),
    #[error("{0}")]
    Other(String),
}

#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait StorageOsApi: Send + Sync {
    async fn list_namespaces(&self) -> Result<Vec<Namespace>, ApiError>;
    async fn list_volumes(&self, namespace_id: &str) -> Result<Vec<Volume>, ApiError>;
    async fn get_volume(&self, namespace_id: &str, volume_id: &str) -> Result<Volume, ApiError>;
    /// `PUT /v2/namespaces/{ns}/volumes/{id}/nfs/mount-endpoint`, conditional on `version`.
    async fn set_mount_endpoint(
        &self,
        namespace_id: &str,
        volume_id: &str,
        mount_endpoint: &str,
        version: &str,
    ) -> Result<(), ApiError>;
}

/// Settings of the HTTP client.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// `http(s)://host[:port]`; the port defaults to 5705.
    pub endpoint: String,
    /// Directory holding the files `username` and `password` (a mounted Secret).
    pub secret_path: PathBuf,
    /// How long a token is used before it is refreshed (StorageOS tokens live 5 minutes).
    pub refresh_interval: Duration,
    pub timeout: Duration,
}

struct Token {
    value: String,
    obtained: Instant,
}

/// A login the API refused, and how long the same credentials are not sent again.
struct Refusal {
    status: StatusCode,
    credentials: Credentials,
    at: Instant,
    wait: Duration,
}

/// The first wait after a refused login; it doubles with each further refusal of the same
/// credentials, up to [`MAX_LOGIN_WAIT`].
const FIRST_LOGIN_WAIT: Duration = Duration::from_secs(5);
const MAX_LOGIN_WAIT: Duration = Duration::from_secs(300);

#[derive(Clone, PartialEq, Eq)]
struct Credentials {
    username: String,
    password: String,
}

/// What the client holds between requests: a token, or the last refusal.
#[derive(Default)]
struct Session {
    token: Option<Token>,
    refusal: Option<Refusal>,
}

/// The HTTP implementation: logs in with the mounted credentials, refreshes the token before it
/// expires, and logs in again (re-reading the credentials, which may have been rotated) when the
/// API answers 401.
pub struct HttpApi {
    http: reqwest::Client,
    base: String,
    settings: HttpSettings,
    session: Mutex<Session>,
}

impl HttpApi {
    pub fn new(settings: HttpSettings) -> Result<Self, ApiError> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .build()
            .map_err(|e| ApiError::Other(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: base_url(&settings.endpoint),
            settings,
            session: Mutex::default(),
        })
    }

    fn read_credential(&self, name: &str) -> Result<String, ApiError> {
        let path = self.settings.secret_path.join(name);
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_owned())
            .map_err(|source| ApiError::Credentials { path, source })
    }

    fn read_credentials(&self) -> Result<Credentials, ApiError> {
        Ok(Credentials {
            username: self.read_credential("username")?,
            password: self.read_credential("password")?,
        })
    }

    async fn login(&self, credentials: &Credentials) -> Result<String, ApiError> {
        let body = serde_json::json!({
            "username": credentials.username,
            "password": credentials.password,
        });
        let response = self
            .http
            .post(format!("{}/v2/auth/login", self.base))
            .json(&body)
            .send()
            .await
            .map_err(|e| ApiError::Other(format!("login: {e}")))?;
        if !response.status().is_success() {
            return Err(ApiError::LoginRefused(response.status()));
        }
        tracing::info!(endpoint = %self.base, "logged in to the StorageOS API");
        bearer_token(&response).ok_or_else(|| ApiError::Other("login answered without a token".into()))
    }

    async fn refresh(&self, token: &str) -> Option<String> {
        let response = self
            .http
            .post(format!("{}/v2/auth/refresh", self.base))
            .bearer_auth(token)
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            tracing::info!(status = %response.status(), "token refresh refused; logging in again");
            return None;
        }
        bearer_token(&response)
    }

    /// A usable token: the current one, a refreshed one when it is old, or a new login. Refused
    /// credentials are not sent again before a back-off (every reconcile would otherwise log in
    /// with them), unless the mounted Secret changed meanwhile.
    async fn token(&self, force_login: bool) -> Result<String, ApiError> {
        let mut session = self.session.lock().await;
        if let Some(current) = session.token.as_ref().filter(|_| !force_login) {
            if current.obtained.elapsed() < self.settings.refresh_interval {
                return Ok(current.value.clone());
            }
            if let Some(value) = self.refresh(&current.value).await {
                session.token = Some(Token {
                    value: value.clone(),
                    obtained: Instant::now(),
                });
                return Ok(value);
            }
        }
        let credentials = self.read_credentials()?;
        if let Some(refusal) = &session.refusal
            && refusal.credentials == credentials
            && refusal.at.elapsed() < refusal.wait
        {
            return Err(ApiError::LoginRefused(refusal.status));
        }
        match self.login(&credentials).await {
            Ok(value) => {
                session.refusal = None;
                session.token = Some(Token {
                    value: value.clone(),
                    obtained: Instant::now(),
                });
                Ok(value)
            }
            Err(ApiError::LoginRefused(status)) => {
                let wait = match &session.refusal {
                    Some(previous) if previous.credentials == credentials => (previous.wait * 2).min(MAX_LOGIN_WAIT),
                    _ => FIRST_LOGIN_WAIT,
                };
                tracing::warn!(
                    %status,
                    "StorageOS refused the login: check the username and password in the API secret; the same credentials are tried again in {wait:?}"
                );
                session.token = None;
                session.refusal = Some(Refusal {
                    status,
                    credentials,
                    at: Instant::now(),
                    wait,
                });
                Err(ApiError::LoginRefused(status))
            }
            Err(err) => Err(err),
        }
    }

    /// Sends one authenticated request; on 401 logs in again and retries once.
    async fn send<B: Serialize + Sync>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<reqwest::Response, ApiError> {
        let mut force_login = false;
        loop {
            let token = self.token(force_login).await?;
            let mut request = self
                .http
                .request(method.clone(), format!("{}{path}", self.base))
                .bearer_auth(token);
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request
                .send()
                .await
                .map_err(|e| ApiError::Other(format!("{method} {path}: {e}")))?;
            match response.status() {
                StatusCode::UNAUTHORIZED if !force_login => {
                    tracing::info!(%path, "StorageOS token rejected; logging in again");
                    force_login = true;
                }
                StatusCode::CONFLICT => return Err(ApiError::Conflict(error_text(response).await)),
                StatusCode::NOT_FOUND => return Err(ApiError::NotFound(path.to_owned())),
                status if status.is_success() => return Ok(response),
                status => {
                    let text = error_text(response).await;
                    return Err(ApiError::Other(format!("{method} {path}: HTTP {status}: {text}")));
                }
            }
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let response = self.send::<()>(Method::GET, path, None).await?;
        response
            .json()
            .await
            .map_err(|e| ApiError::Other(format!("GET {path}: unexpected answer: {e}")))
    }
}

#[async_trait]
impl StorageOsApi for HttpApi {
    async fn list_namespaces(&self) -> Result<Vec<Namespace>, ApiError> {
        self.get_json("/v2/namespaces").await
    }

    async fn list_volumes(&self, namespace_id: &str) -> Result<Vec<Volume>, ApiError> {
        self.get_json(&format!("/v2/namespaces/{namespace_id}/volumes")).await
    }

    async fn get_volume(&self, namespace_id: &str, volume_id: &str) -> Result<Volume, ApiError> {
        self.get_json(&format!("/v2/namespaces/{namespace_id}/volumes/{volume_id}"))
            .await
    }

    async fn set_mount_endpoint(
        &self,
        namespace_id: &str,
        volume_id: &str,
        mount_endpoint: &str,
        version: &str,
    ) -> Result<(), ApiError> {
        let path = format!("/v2/namespaces/{namespace_id}/volumes/{volume_id}/nfs/mount-endpoint");
        let body = MountEndpointUpdate {
            mount_endpoint,
            version,
        };
        self.send(Method::PUT, &path, Some(&body)).await.map(|_| ())
    }
}

/// `http://host:5705` from `host`, `host:port` or a URL, without a trailing slash.
fn base_url(endpoint: &str) -> String {
    let endpoint = endpoint.trim().trim_end_matches('/');
    let with_scheme = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    };
    let (scheme, rest) = with_scheme.split_once("://").unwrap_or(("http", &with_scheme));
    let host = rest.split('/').next().unwrap_or(rest);
    let has_port = !host.ends_with(']') && host.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    if has_port {
        with_scheme
    } else {
        format!("{scheme}://{host}:5705{}", &rest[host.len()..])
    }
}

fn bearer_token(response: &reqwest::Response) -> Option<String> {
    let value = response.headers().get(reqwest::header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ").unwrap_or(value).trim();
    (!token.is_empty()).then(|| token.to_owned())
}

async fn error_text(response: reqwest::Response) -> String {
    response.text().await.unwrap_or_default().trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let cases = [
            ("storageos", "http://storageos:5705"),
            ("storageos:8000", "http://storageos:8000"),
            ("http://storageos", "http://storageos:5705"),
            ("https://api.example.com/", "https://api.example.com:5705"),
            ("http://127.0.0.1:9999", "http://127.0.0.1:9999"),
            ("http://[fd00::1]:5705", "http://[fd00::1]:5705"),
            ("http://[fd00::1]", "http://[fd00::1]:5705"),
        ];
        for (input, expected) in cases {
            assert_eq!(base_url(input), expected, "{input}");
        }
    }

    #[test]
    fn volumes_parse_from_the_api_shape() {
        let volume: Volume = serde_json::from_value(serde_json::json!({
            "id": "v1", "name": "pvc-1", "namespaceID": "ns1", "version": "MTI",
            "labels": {"csi.storage.k8s.io/pv/name": "pvc-1"},
            "nfs": {"exports": [], "serviceEndpoint": "10.0.0.5:2049"},
            "sizeBytes": 1073741824u64,
        }))
        .unwrap();
        assert_eq!(volume.namespace_id, "ns1");
        assert_eq!(volume.nfs.service_endpoint.as_deref(), Some("10.0.0.5:2049"));
        let bare: Volume = serde_json::from_value(serde_json::json!({"id": "v2"})).unwrap();
        assert_eq!(bare.nfs.service_endpoint, None);
    }
}
