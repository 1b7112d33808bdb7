//! What the controller watches, kept in stores that reconciles read instead of the API: the PVs,
//! and the Services, Endpoints and EndpointSlices it manages, as JSON ([`CompactStore`]); the
//! claims in the kube-runtime Controller's own reflector store. The watches also trigger the
//! reconciles. A fresh set is made for each term of leadership.

use std::collections::HashMap;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolume, PersistentVolumeClaim, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::ExponentialBackoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::compact_store::CompactStore;
use super::condition::fingerprint_besides_own_condition;
use crate::kube_client::{drop_managed_fields, paged};
use crate::sharedvolume::claim::{trim_claim, trim_pv};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The objects one shared volume is made of, as cached.
#[derive(Clone)]
pub struct Caches {
    pub pvs: CompactStore<PersistentVolume>,
    pub services: CompactStore<Service>,
    pub endpoints: CompactStore<Endpoints>,
    pub slices: CompactStore<EndpointSlice>,
}

/// The watch streams behind [`Caches`], to feed the kube-runtime Controller.
pub struct Triggers {
    /// The claims, and their store (the Controller's own).
    pub claims: BoxStream<'static, Result<PersistentVolumeClaim, watcher::Error>>,
    pub claim_store: Store<PersistentVolumeClaim>,
    pub pvs: BoxStream<'static, Result<PersistentVolume, watcher::Error>>,
    pub services: BoxStream<'static, Result<Service, watcher::Error>>,
    pub endpoints: BoxStream<'static, Result<Endpoints, watcher::Error>>,
    pub slices: BoxStream<'static, Result<EndpointSlice, watcher::Error>>,
}

impl Caches {
    /// Starts nothing by itself: the stores fill while the returned streams are polled.
    pub fn new(client: &Client, namespace: Option<&str>, managed: &watcher::Config) -> (Self, Triggers) {
        // Every kind here numbers as the claims do: each is listed in pages.
        let all = || paged(watcher::Config::default());
        let managed = || paged(managed.clone());
        let (pvs, pv_stream) = compact(Api::all(client.clone()), all(), trim_pv);
        let (services, service_stream) = compact(scoped(client, namespace), managed(), drop_managed_fields);
        let (endpoints, endpoint_stream) = compact(scoped(client, namespace), managed(), drop_managed_fields);
        let (slices, slice_stream) = compact(scoped(client, namespace), managed(), drop_managed_fields);
        let (claim_store, claims) = reflected(scoped(client, namespace), all(), trim_claim, claim_changes());
        let caches = Self {
            pvs,
            services,
            endpoints,
            slices,
        };
        let triggers = Triggers {
            claims,
            claim_store,
            pvs: pv_stream,
            services: service_stream,
            endpoints: endpoint_stream,
            slices: slice_stream,
        };
        (caches, triggers)
    }

    /// Resolves once every store has listed its objects. Until then a reconcile reads the API:
    /// a store still listing would take what exists for missing.
    pub async fn synced(&self) {
        futures::future::join4(
            self.pvs.listed(),
            self.services.listed(),
            self.endpoints.listed(),
            self.slices.listed(),
        )
        .await;
    }

    pub fn pv(&self, name: &str) -> Option<PersistentVolume> {
        self.pvs.get(None, name)
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<Service> {
        self.services.get(Some(namespace), name)
    }

    pub fn endpoints(&self, namespace: &str, name: &str) -> Option<Endpoints> {
        self.endpoints.get(Some(namespace), name)
    }

    pub fn slice(&self, namespace: &str, name: &str) -> Option<EndpointSlice> {
        self.slices.get(Some(namespace), name)
    }
}

/// A watch whose objects land in a [`CompactStore`], after `trim`, before they trigger a
/// reconcile, so that a reconcile always reads at least what triggered it. Every change triggers.
fn compact<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (CompactStore<K>, BoxStream<'static, Result<K, watcher::Error>>)
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let store = CompactStore::default();
    let stream = watcher(api, config)
        .backoff(watch_backoff())
        .modify(trim)
        .inspect_ok({
            let store = store.clone();
            move |event| store.apply(event)
        })
        .touched_objects();
    (store, stream.boxed())
}

/// A watch whose objects land in a reflector store, after `trim`, before they trigger anything.
/// Deletions trigger too; other changes when `triggers` says so.
fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    mut triggers: impl FnMut(&watcher::Event<K>) -> bool + Send + 'static,
) -> (Store<K>, BoxStream<'static, Result<K, watcher::Error>>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .backoff(watch_backoff())
        .modify(trim)
        .reflect(writer)
        .filter(move |event| std::future::ready(event.as_ref().map_or(true, &mut triggers)))
        .touched_objects();
    (store, stream.boxed())
}

/// Which changes of a claim trigger a reconcile: all but one that changed nothing besides the
/// controller's own condition, so that the condition a reconcile writes does not start another.
fn claim_changes() -> impl FnMut(&watcher::Event<PersistentVolumeClaim>) -> bool + Send + 'static {
    let mut seen: HashMap<String, u64> = HashMap::new();
    move |event| match event {
        watcher::Event::Apply(claim) => {
            let fingerprint = fingerprint_besides_own_condition(claim);
            seen.insert(claim.uid().unwrap_or_default(), fingerprint) != Some(fingerprint)
        }
        watcher::Event::InitApply(claim) => {
            seen.insert(
                claim.uid().unwrap_or_default(),
                fingerprint_besides_own_condition(claim),
            );
            true
        }
        watcher::Event::Delete(claim) => {
            seen.remove(&claim.uid().unwrap_or_default());
            true
        }
        watcher::Event::Init | watcher::Event::InitDone => true,
    }
}

/// Retries of a broken watch: 0.5 s doubling up to 2.5 s, each with up to as much again of
/// jitter (kube's exponential back-off), so at most 5 s. kube's default climbs to 30 s, which
/// after an API server restart of 15 s left new claims unserved for half a minute after the API
/// was back. One controller's few watches can afford it; the agents (one per node) keep the
/// default, which spares a recovering API server. The jitter keeps the replicas' and the
/// watches' retries from landing together.
pub fn watch_backoff() -> ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(FIRST_RETRY)
        .with_max_delay(MAX_RETRY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// Waits until `ready` (a store's readiness, made anew each time) says yes (`true`) or that it never
/// will (`false`), asking again every 250 ms: a store's readiness signal wakes only its most recent
/// waiter, and the kube-runtime Controller waits on it too.
pub async fn until_ready<F, Fut>(mut ready: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if let Ok(ready) = tokio::time::timeout(Duration::from_millis(250), ready()).await {
            return ready;
        }
    }
}

const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_millis(2500);

/// An Api over one namespace, or over all of them.
pub fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_retries_double_up_to_five_seconds_with_jitter_and_start_over_after_a_reset() {
        use kube::runtime::utils::Backoff;
        let mut backoff = watch_backoff();
        let bases = [500, 1000, 2000, 2500, 2500, 2500];
        for base in bases {
            let wait = backoff.next().unwrap().as_millis() as u64;
            assert!((base..2 * base).contains(&wait), "{wait} ms, base {base} ms");
        }
        backoff.reset();
        let first = backoff.next().unwrap().as_millis() as u64;
        assert!((500..1000).contains(&first), "{first} ms after a reset");
    }
}
