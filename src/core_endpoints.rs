//! Whether the loops write a volume's core/v1 Endpoints beside its EndpointSlice. Kubernetes
//! deprecated core/v1 Endpoints in 1.33 (every write returns a warning) and kube-proxy has read
//! only EndpointSlices for years, so by default a cluster at 1.33 or later gets only the slice;
//! an older one, where some tools may still read Endpoints, gets both. `--write-endpoints`
//! decides it for the cluster instead.

use k8s_openapi::apimachinery::pkg::version::Info;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::ValueEnum;

use crate::shutdown::Shutdown;

/// How often `auto` reads the API server's version again while the loops run.
const RECHECK_EVERY: Duration = Duration::from_secs(300);

/// `--write-endpoints`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WriteEndpoints {
    /// Both below Kubernetes 1.33, only the EndpointSlice from 1.33 on.
    Auto,
    /// Endpoints and EndpointSlice, whatever the version (for consumers that still read
    /// Endpoints).
    Always,
    /// Only the EndpointSlice; Endpoints this controller wrote before are deleted.
    Never,
}

/// The first Kubernetes minor version that deprecates core/v1 Endpoints.
const DEPRECATED_SINCE_MINOR: u32 = 33;

impl WriteEndpoints {
    /// Whether to write Endpoints on an API server of version `major.minor` (`None`: unknown,
    /// where `auto` keeps writing them: never less than before).
    pub fn resolve(self, version: Option<(u32, u32)>) -> bool {
        match self {
            Self::Always => true,
            Self::Never => false,
            Self::Auto => version.is_none_or(|(major, minor)| major == 1 && minor < DEPRECATED_SINCE_MINOR),
        }
    }

    /// [`Self::resolve`] on the version an API server reports.
    pub fn resolve_reported(self, info: &Info) -> bool {
        self.resolve(parse_version(&info.major, &info.minor))
    }

    /// [`Self::resolve`] against the API server `client` talks to; its answer is logged. `auto`
    /// waits for the version (a failed read is tried again, 1 s doubling to 30 s): the controller
    /// and every agent ask the same server, so they all reach the one answer, never one "write"
    /// for a read that failed beside another's "do not". `None` on `shutdown` first.
    pub async fn resolve_for(self, client: &kube::Client, shutdown: &Shutdown) -> Option<bool> {
        let version = match self {
            Self::Auto => Some(api_server_version(client, shutdown).await?),
            _ => None,
        };
        let writes = self.resolve(version.flatten());
        tracing::info!(mode = ?self, ?version, writes_endpoints = writes, "core/v1 Endpoints");
        Some(writes)
    }
}

/// The answer to `--write-endpoints` a loop goes by. Under `auto` it follows the API server's
/// version while the loop runs, read again every five minutes, so an upgrade past 1.33 takes
/// effect without a restart (the controller then deletes the Endpoints it wrote at its next
/// reconcile of each claim). Cloning shares it.
#[derive(Clone, Debug)]
pub struct EndpointsAnswer(Arc<AtomicBool>);

impl EndpointsAnswer {
    pub fn fixed(writes: bool) -> Self {
        Self(Arc::new(AtomicBool::new(writes)))
    }

    /// Whether core/v1 Endpoints are written now.
    pub fn writes(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `mode` resolved against the API server (see [`WriteEndpoints::resolve_for`]); under
    /// `auto`, kept up to date until `shutdown`. `None` on `shutdown` first.
    pub async fn resolve(mode: WriteEndpoints, client: &kube::Client, shutdown: &Shutdown) -> Option<Self> {
        let answer = Self::fixed(mode.resolve_for(client, shutdown).await?);
        if mode == WriteEndpoints::Auto {
            tokio::spawn(
                answer
                    .clone()
                    .follow_version(client.clone(), shutdown.clone(), RECHECK_EVERY),
            );
        }
        Some(answer)
    }

    /// Reads the version again every `every`; a failed read keeps the answer.
    async fn follow_version(self, client: kube::Client, shutdown: Shutdown, every: Duration) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let Ok(info) = client.apiserver_version().await else {
                continue;
            };
            let version = parse_version(&info.major, &info.minor);
            let writes = WriteEndpoints::Auto.resolve(version);
            if self.0.swap(writes, Ordering::Relaxed) != writes {
                tracing::info!(
                    ?version,
                    writes_endpoints = writes,
                    "the API server's version changed the answer to --write-endpoints auto"
                );
            }
        }
    }
}

/// The API server's `major.minor` (`Some(None)`: it answered with a version that does not
/// parse), read until it answers; `None` on `shutdown` first.
async fn api_server_version(client: &kube::Client, shutdown: &Shutdown) -> Option<Option<(u32, u32)>> {
    let mut pause = std::time::Duration::from_secs(1);
    loop {
        match client.apiserver_version().await {
            Ok(info) => return Some(parse_version(&info.major, &info.minor)),
            Err(err) => tracing::warn!(
                error = %err,
                retry_in = ?pause,
                "cannot read the API server's version, which decides whether core/v1 Endpoints are written (--write-endpoints auto); trying again"
            ),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(std::time::Duration::from_secs(30));
    }
}

/// `major` and `minor` as the version endpoint gives them (`"1"`, `"33+"` on some distributions).
fn parse_version(major: &str, minor: &str) -> Option<(u32, u32)> {
    let number = |text: &str| text.trim_end_matches('+').parse().ok();
    Some((number(major)?, number(minor)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_stops_at_the_deprecation_and_keeps_writing_when_unsure() {
        let auto = WriteEndpoints::Auto;
        assert!(auto.resolve(Some((1, 32))));
        assert!(!auto.resolve(Some((1, 33))));
        assert!(!auto.resolve(Some((1, 36))));
        assert!(auto.resolve(None));
        assert!(WriteEndpoints::Always.resolve(Some((1, 36))));
        assert!(!WriteEndpoints::Never.resolve(Some((1, 30))));
    }

    #[tokio::test]
    async fn auto_waits_for_the_version_instead_of_guessing() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let asked = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = asked.clone();
        let client = crate::scripted_api::client(move |_| match counted.fetch_add(1, Ordering::SeqCst) {
            0 => (
                503,
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":503}"#.into(),
            ),
            _ => (200, r#"{"major":"1","minor":"36","gitVersion":"v1.36.3"}"#.into()),
        });
        let shutdown = Shutdown::new();
        let writes = WriteEndpoints::Auto.resolve_for(&client, &shutdown).await;
        assert_eq!(
            writes,
            Some(false),
            "the answer of 1.36, not a guess after the failed read"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        shutdown.cancel();
        let never = crate::scripted_api::client(|_| (503, "{}".into()));
        assert_eq!(WriteEndpoints::Auto.resolve_for(&never, &shutdown).await, None);
    }

    #[tokio::test]
    async fn auto_follows_an_upgrade_without_a_restart() {
        use std::sync::atomic::AtomicUsize;
        let asked = Arc::new(AtomicUsize::new(0));
        let counted = asked.clone();
        let client = crate::scripted_api::client(move |_| match counted.fetch_add(1, Ordering::SeqCst) {
            0 => (200, r#"{"major":"1","minor":"32","gitVersion":"v1.32.9"}"#.into()),
            1..=3 => (503, "{}".into()),
            _ => (200, r#"{"major":"1","minor":"33","gitVersion":"v1.33.1"}"#.into()),
        });
        let shutdown = Shutdown::new();
        let answer = EndpointsAnswer::fixed(WriteEndpoints::Auto.resolve_for(&client, &shutdown).await.unwrap());
        assert!(answer.writes(), "1.32 writes them");
        let following = tokio::spawn(answer.clone().follow_version(
            client,
            shutdown.clone(),
            Duration::from_millis(50),
        ));
        while asked.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(answer.writes(), "a failed read keeps the answer");
        tokio::time::timeout(Duration::from_secs(5), async {
            while answer.writes() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("upgraded to 1.33: no longer written");
        shutdown.cancel();
        following.await.unwrap();
    }

    #[test]
    fn versions_parse_as_distributions_give_them() {
        assert_eq!(parse_version("1", "33+"), Some((1, 33)));
        assert_eq!(parse_version("1", "36"), Some((1, 36)));
        assert_eq!(parse_version("", "x"), None);
    }
}
