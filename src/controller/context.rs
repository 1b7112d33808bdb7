//! What every reconcile shares: the client, the volume backend, settings, metrics, events, the
//! claim book and the caches.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use kube::Client;

use super::book::ClaimBook;
use super::cache::Caches;
use crate::events::EventSink;
use crate::metrics::ControllerMetrics;
use crate::sharedvolume::filters::Filters;
use crate::volume::VolumeBackend;

/// Settings of one reconcile, from the command line.
#[derive(Clone, Debug)]
pub(crate) struct ReconcileSettings {
    pub filters: Filters,
    pub create_poll_interval: Duration,
    pub create_wait_duration: Duration,
    pub resync_interval: Duration,
    /// The longest one reconcile may take; then it is dropped and counts as a failure.
    pub reconcile_timeout: Duration,
    /// The wait after a claim's first failure; it doubles with each further one, up to
    /// `max_error_requeue`.
    pub error_requeue: Duration,
    pub max_error_requeue: Duration,
    /// Write core/v1 Endpoints beside the EndpointSlice (`--write-endpoints`, resolved).
    pub write_endpoints: crate::core_endpoints::EndpointsAnswer,
}

pub(crate) struct Context {
    pub client: Client,
    pub backend: Arc<dyn VolumeBackend>,
    pub settings: ReconcileSettings,
    pub metrics: ControllerMetrics,
    pub events: EventSink,
    /// Which claims are served and which wait, for the gauges.
    book: Mutex<ClaimBook>,
    /// What the controller watches, once synced: reconciles read there, not from the API.
    caches: RwLock<Option<Caches>>,
}

impl Context {
    pub fn new(
        client: Client,
        backend: Arc<dyn VolumeBackend>,
        settings: ReconcileSettings,
        metrics: ControllerMetrics,
        events: EventSink,
    ) -> Self {
        Self {
            client,
            backend,
            settings,
            metrics,
            events,
            book: Mutex::default(),
            caches: RwLock::default(),
        }
    }

    /// Reconciles read from `caches` from now on (`None`: from the API).
    pub fn use_caches(&self, caches: Option<Caches>) {
        *self.caches.write().expect("caches poisoned") = caches;
    }

    pub fn caches(&self) -> Option<Caches> {
        self.caches.read().expect("caches poisoned").clone()
    }

    /// Reads the claim book.
    pub fn read_book<T>(&self, read: impl FnOnce(&ClaimBook) -> T) -> T {
        read(&self.book.lock().expect("claim book poisoned"))
    }

    /// Changes the claim book and sets the gauges from it.
    pub fn book(&self, change: impl FnOnce(&mut ClaimBook)) {
        let mut book = self.book.lock().expect("claim book poisoned");
        change(&mut book);
        self.metrics.shared_volumes.set(book.shared() as i64);
        self.metrics.claims_pending.set(book.waiting() as i64);
        let since = book
            .waiting_since()
            .and_then(|since| since.duration_since(SystemTime::UNIX_EPOCH).ok());
        self.metrics
            .claims_pending_since
            .set(since.map_or(0.0, |since| since.as_secs_f64()));
    }
}
