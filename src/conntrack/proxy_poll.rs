//! kube-proxy's `/metrics` read over HTTP, beside the sweeps; what a reading says is
//! [`super::proxy_sync`]'s.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use super::proxy_sync::{ProxySync, QUEUED, SYNCED, parse};

/// kube-proxy's metrics endpoint on this node.
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    url: String,
    client: reqwest::Client,
}

impl ProxyMetrics {
    pub fn new(url: String, timeout: Duration) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self { url, client })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// kube-proxy's account of each family's rules, or why it cannot be had.
    pub async fn read(&self) -> Result<Reading, String> {
        let read = SystemTime::now();
        let response = self.client.get(&self.url).send().await.map_err(|e| e.to_string())?;
        let text = response
            .error_for_status()
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        let reading = [parse(&text, false, read), parse(&text, true, read)];
        if reading == [None, None] {
            return Err(format!("no {SYNCED}, {QUEUED} and changes pending"));
        }
        Ok(reading)
    }
}

/// What one read of kube-proxy's metrics said of each family: IPv4, IPv6.
pub type Reading = [Option<ProxySync>; 2];

/// Reads kube-proxy's metrics beside the sweeps and never holds one up (a kube-proxy that hangs
/// would): each sweep takes the last reading that completed, made before its listing as the rule
/// needs, and starts the next.
#[derive(Debug)]
pub struct ProxyPoller {
    metrics: ProxyMetrics,
    latest: Arc<Mutex<Reading>>,
    in_flight: Option<tokio::task::JoinHandle<()>>,
}

impl ProxyPoller {
    pub fn new(metrics: ProxyMetrics) -> Self {
        Self {
            metrics,
            latest: Arc::default(),
            in_flight: None,
        }
    }

    /// The last reading that completed; a new one is started unless one is under way.
    pub fn poll(&mut self) -> Reading {
        let reading = *self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        if self.in_flight.as_ref().is_none_or(|read| read.is_finished()) {
            let (metrics, latest) = (self.metrics.clone(), self.latest.clone());
            self.in_flight = Some(tokio::spawn(async move {
                let reading = metrics.read().await.unwrap_or_else(|err| {
                    tracing::debug!(error = %err, "cannot read kube-proxy's sync times");
                    [None, None]
                });
                *latest.lock().unwrap_or_else(PoisonError::into_inner) = reading;
            }));
        }
        reading
    }
}
