//! What the controller watches, kept in stores that reconciles read instead of the API: the PVs,
//! the Services, Endpoints and EndpointSlices it manages, and the slices LINSTOR CSI advertises
//! its own NFS servers with, as JSON ([`CompactStore`]); the
//! claims in the kube-runtime Controller's own reflector store. The watches also trigger the
//! reconciles. A fresh set is made for each term of leadership.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolume, PersistentVolumeClaim, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::ExponentialBackoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::compact_store::CompactStore;
use super::condition::fingerprint_besides_own_condition;
use crate::kube_client::{drop_managed_fields, paged};
use crate::names::linstor_nfs_selector;
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
    /// The slices LINSTOR CSI's nfs-helper advertises its own NFS servers with (read only).
    pub linstor_slices: CompactStore<EndpointSlice>,
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
    pub linstor_slices: BoxStream<'static, Result<EndpointSlice, watcher::Error>>,
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
        // In the namespace of LINSTOR's Service, whichever namespace the claims are in.
        let nfs_helper = paged(watcher::Config::default().labels(&linstor_nfs_selector()));
        let (linstor_slices, linstor_slice_stream) = compact(Api::all(client.clone()), nfs_helper, drop_managed_fields);
        let (claim_store, claims) = reflected(scoped(client, namespace), all(), trim_claim, {
            let mut triggers = ClaimTriggers::default();
            move |event| triggers.on(event)
        });
        let caches = Self {
            pvs,
            services,
            endpoints,
            slices,
            linstor_slices,
        };
        let triggers = Triggers {
            claims,
            claim_store,
            pvs: pv_stream,
            services: service_stream,
            endpoints: endpoint_stream,
            slices: slice_stream,
            linstor_slices: linstor_slice_stream,
        };
        (caches, triggers)
    }

    /// Resolves once every store has listed its objects. Until then a reconcile reads the API:
    /// a store still listing would take what exists for missing.
    pub async fn synced(&self) {
        futures::future::join5(
            self.pvs.listed(),
            self.services.listed(),
            self.endpoints.listed(),
            self.slices.listed(),
            self.linstor_slices.listed(),
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

    pub fn linstor_slice(&self, namespace: &str, name: &str) -> Option<EndpointSlice> {
        self.linstor_slices.get(Some(namespace), name)
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
    let events = watcher(api, config).backoff(watch_backoff()).modify(trim);
    let stream = stored_then_triggered(store.clone(), events);
    (store, stream.boxed())
}

/// Each event lands in `store`, then the objects it changed there trigger.
fn stored_then_triggered<K>(
    store: CompactStore<K>,
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    events
        .map_ok(move |event| futures::stream::iter(store.apply(event).map(Ok)))
        .try_flatten()
}

/// A watch whose objects land in a reflector store, after `trim`, before they trigger anything;
/// `triggers` says which do.
fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    mut triggers: impl FnMut(watcher::Event<K>) -> Vec<K> + Send + 'static,
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
        .map_ok(move |event| futures::stream::iter(triggers(event).into_iter().map(Ok)))
        .try_flatten();
    (store, stream.boxed())
}

/// Which claims trigger a reconcile, and when: a claim whose change is more than the controller's
/// own condition (so that the condition a reconcile writes does not start another), a deleted one,
/// and after a list only once it is complete (the reflector holds the listed claims back until
/// then, so a reconcile started earlier would read the claim as it was, or not find it): every
/// claim the list brought new or changed, and, as bare names, those it no longer has.
#[derive(Default)]
struct ClaimTriggers {
    /// Fingerprint and name of every claim held, by uid.
    seen: HashMap<String, (u64, ObjectRef<PersistentVolumeClaim>)>,
    /// A list under way: the claims it changed, by name alone (the reflector holds each whole
    /// already, and a first list brings every claim: a second copy of each would be the
    /// controller's peak), and the uids it has.
    listing: Option<(Vec<PersistentVolumeClaim>, HashSet<String>)>,
}

impl ClaimTriggers {
    fn on(&mut self, event: watcher::Event<PersistentVolumeClaim>) -> Vec<PersistentVolumeClaim> {
        match event {
            watcher::Event::Apply(claim) => self.remember(&claim).then_some(claim).into_iter().collect(),
            watcher::Event::Delete(claim) => {
                self.seen.remove(&claim.uid().unwrap_or_default());
                vec![claim]
            }
            watcher::Event::Init => {
                self.listing = Some(Default::default());
                Vec::new()
            }
            watcher::Event::InitApply(claim) => {
                let changed = self.remember(&claim);
                let (listed, uids) = self.listing.get_or_insert_default();
                uids.insert(claim.uid().unwrap_or_default());
                if changed {
                    listed.push(bare_claim(&ObjectRef::from_obj(&claim)));
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                let Some((mut triggered, uids)) = self.listing.take() else {
                    return Vec::new();
                };
                self.seen.retain(|uid, (_, claim)| {
                    let kept = uids.contains(uid);
                    if !kept {
                        triggered.push(bare_claim(claim));
                    }
                    kept
                });
                triggered
            }
        }
    }

    /// Whether the claim is new or changed besides the controller's own condition.
    fn remember(&mut self, claim: &PersistentVolumeClaim) -> bool {
        let fingerprint = fingerprint_besides_own_condition(claim);
        let before = self.seen.insert(
            claim.uid().unwrap_or_default(),
            (fingerprint, ObjectRef::from_obj(claim)),
        );
        before.map(|(fingerprint, _)| fingerprint) != Some(fingerprint)
    }
}

/// A claim known by name alone: enough to trigger its reconcile.
fn bare_claim(claim: &ObjectRef<PersistentVolumeClaim>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: kube::api::ObjectMeta {
            name: Some(claim.name.clone()),
            namespace: claim.namespace.clone(),
            ..Default::default()
        },
        ..Default::default()
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

/// The controller's back-off over the triggers of all its watches together: none. kube-runtime
/// pauses the merged triggers after an error from any one watch, so while several fail (an API
/// server restarting) their errors queue behind each other's pauses and a healthy watch's changes
/// wait with them: half a minute after a restart in the fault tests. Each watch already backs off
/// on its own ([`watch_backoff`]).
pub struct NoDelay;

impl Iterator for NoDelay {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for NoDelay {
    fn reset(&mut self) {}
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

    use k8s_openapi::api::discovery::v1::Endpoint;
    use kube::api::ObjectMeta;

    fn slice(version: &str, address: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                namespace: Some("apps".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: vec![Endpoint {
                addresses: vec![address.into()],
                ..Default::default()
            }],
            ports: None,
        }
    }

    /// Every object that triggers a reconcile is already what the store gives that reconcile,
    /// including an object changed while the watch was down and listed again: the soak's slice
    /// edited by hand during an API server restart was otherwise reconciled against the old copy
    /// and left as edited.
    #[tokio::test]
    async fn a_trigger_finds_the_store_holding_what_triggered_it_also_after_a_relist() {
        let store = CompactStore::<EndpointSlice>::default();
        let events = futures::stream::iter([
            watcher::Event::Init,
            watcher::Event::InitApply(slice("1", "10.0.0.1")),
            watcher::Event::InitDone,
            watcher::Event::Apply(slice("2", "10.0.0.2")),
            // The watch broke; an edit by a third party happened meanwhile.
            watcher::Event::Init,
            watcher::Event::InitApply(slice("3", "192.0.2.250")),
            watcher::Event::InitDone,
        ])
        .map(Ok::<_, watcher::Error>);
        let mut triggers = Box::pin(stored_then_triggered(store.clone(), events));
        let mut seen = Vec::new();
        while let Some(Ok(triggered)) = triggers.next().await {
            let held = store
                .get(Some("apps"), "pvc-1")
                .and_then(|slice| slice.metadata.resource_version);
            assert_eq!(
                held, triggered.metadata.resource_version,
                "a reconcile would read another copy"
            );
            seen.push(triggered.metadata.resource_version.unwrap());
        }
        assert_eq!(
            seen.last().map(String::as_str),
            Some("3"),
            "the relisted edit triggers: {seen:?}"
        );
    }

    fn claim(uid: &str, storage: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(format!("claim-{uid}")),
                namespace: Some("apps".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
                storage_class_name: Some(storage.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn names(claims: Vec<PersistentVolumeClaim>) -> Vec<String> {
        let mut names: Vec<String> = claims.into_iter().map(|claim| claim.name_any()).collect();
        names.sort();
        names
    }

    /// The claims' reflector holds listed claims back until the list is complete; so does the
    /// trigger, or a claim created while the watch was down is reconciled before the store has it,
    /// found missing, and left unserved.
    #[test]
    fn listed_claims_trigger_once_the_list_is_complete_and_a_relist_only_what_it_changed() {
        let mut triggers = ClaimTriggers::default();
        assert!(triggers.on(watcher::Event::Init).is_empty());
        for uid in ["a", "b", "gone"] {
            assert!(triggers.on(watcher::Event::InitApply(claim(uid, "rwx"))).is_empty());
        }
        let listed = triggers.on(watcher::Event::InitDone);
        assert!(
            listed.iter().all(|claim| claim.spec.is_none()),
            "held by name alone until the list is complete"
        );
        assert_eq!(names(listed), ["claim-a", "claim-b", "claim-gone"]);
        assert!(
            triggers.on(watcher::Event::Apply(claim("a", "rwx"))).is_empty(),
            "nothing changed"
        );
        assert_eq!(
            names(triggers.on(watcher::Event::Apply(claim("a", "other")))),
            ["claim-a"]
        );

        // The watch broke: b changed, c was created and "gone" deleted meanwhile.
        triggers.on(watcher::Event::Init);
        for (uid, class) in [("a", "other"), ("b", "changed"), ("c", "rwx")] {
            assert!(triggers.on(watcher::Event::InitApply(claim(uid, class))).is_empty());
        }
        assert_eq!(
            names(triggers.on(watcher::Event::InitDone)),
            ["claim-b", "claim-c", "claim-gone"]
        );
    }
}
