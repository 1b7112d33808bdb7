//! The `storageos` backend: volumes live in the StorageOS control plane. It cannot be watched, so
//! a poller keeps a catalog of every volume and reports the claims whose volume changed; the
//! controller reconciles those like any other change.

pub mod api;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use tokio::sync::{Mutex, RwLock};

use self::api::{ApiError, StorageOsApi, Volume};
use super::{ClaimKey, VolumeBackend, VolumeError, VolumeInfo, csi_resource_name};
use crate::names::STORAGEOS_MOUNT_ENDPOINT_LABEL;
use crate::producer;

/// Labels the CSI provisioner puts on every volume it creates.
pub const PV_NAME_LABEL: &str = "csi.storage.k8s.io/pv/name";
pub const PVC_NAME_LABEL: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_LABEL: &str = "csi.storage.k8s.io/pvc/namespace";

/// Attempts to publish when the volume keeps changing under us.
const PUBLISH_ATTEMPTS: usize = 3;

/// Every volume, as of the last poll.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    volumes: Vec<Volume>,
}

/// What the catalog says about one PV.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    Found(VolumeInfo),
    /// A volume that looks like the PV's (same name or id) but lacks the CSI labels.
    Unlabelled {
        volume: String,
        missing: Vec<&'static str>,
    },
    Missing,
}

impl Catalog {
    pub fn new(volumes: Vec<Volume>) -> Self {
        Self { volumes }
    }

    fn by_id(&self, id: &str) -> Option<&Volume> {
        self.volumes.iter().find(|v| v.id == id)
    }

    /// Finds the volume of `pv`: by its `csi.storage.k8s.io/pv/name` label, else a volume named
    /// like the PV (or with its CSI handle as id), which then is reported as unlabelled.
    pub fn lookup(&self, pv: &PersistentVolume) -> Lookup {
        let pv_name = pv.name_any();
        if let Some(volume) = self
            .volumes
            .iter()
            .find(|v| v.labels.get(PV_NAME_LABEL) == Some(&pv_name))
        {
            let missing = missing_labels(volume);
            if missing.is_empty() {
                return Lookup::Found(info(volume));
            }
            return Lookup::Unlabelled {
                volume: describe(volume),
                missing,
            };
        }
        let handle = csi_resource_name(pv);
        let handle_id = handle.as_deref().map(|h| h.rsplit('/').next().unwrap_or(h));
        match self
            .volumes
            .iter()
            .find(|v| v.name == pv_name || Some(v.id.as_str()) == handle_id)
        {
            Some(volume) => Lookup::Unlabelled {
                volume: describe(volume),
                missing: missing_labels(volume),
            },
            None => Lookup::Missing,
        }
    }

    /// Claims whose volume is new, gone or changed (endpoints or version) between two polls.
    pub fn changed_claims(&self, newer: &Catalog) -> Vec<ClaimKey> {
        let index = |catalog: &Catalog| -> HashMap<ClaimKey, (Option<String>, Option<String>, String)> {
            catalog
                .volumes
                .iter()
                .filter_map(|v| {
                    let key = claim_of(v)?;
                    let state = (
                        v.nfs.service_endpoint.clone(),
                        v.labels.get(STORAGEOS_MOUNT_ENDPOINT_LABEL).cloned(),
                        v.version.clone(),
                    );
                    Some((key, state))
                })
                .collect()
        };
        let (before, after) = (index(self), index(newer));
        let mut changed: Vec<ClaimKey> = after
            .iter()
            .filter(|(key, state)| before.get(*key) != Some(state))
            .map(|(key, _)| key.clone())
            .chain(before.keys().filter(|key| !after.contains_key(*key)).cloned())
            .collect();
        changed.sort();
        changed.dedup();
        changed
    }
}

fn missing_labels(volume: &Volume) -> Vec<&'static str> {
    [PV_NAME_LABEL, PVC_NAME_LABEL, PVC_NAMESPACE_LABEL]
        .into_iter()
        .filter(|label| volume.labels.get(*label).is_none_or(|v| v.is_empty()))
        .collect()
}

fn claim_of(volume: &Volume) -> Option<ClaimKey> {
    Some(ClaimKey {
        namespace: volume.labels.get(PVC_NAMESPACE_LABEL)?.clone(),
        name: volume.labels.get(PVC_NAME_LABEL)?.clone(),
    })
}

fn describe(volume: &Volume) -> String {
    format!("{:?} (id {})", volume.name, volume.id)
}

fn info(volume: &Volume) -> VolumeInfo {
    VolumeInfo {
        id: volume.id.clone(),
        service_endpoint: volume.nfs.service_endpoint.clone().filter(|e| !e.trim().is_empty()),
        mount_endpoint: volume.labels.get(STORAGEOS_MOUNT_ENDPOINT_LABEL).cloned(),
        version: Some(volume.version.clone()),
    }
}

/// Reads every volume of every namespace.
async fn list_all(api: &dyn StorageOsApi) -> Result<Catalog, ApiError> {
    let mut volumes = Vec::new();
    for namespace in api.list_namespaces().await? {
        volumes.extend(api.list_volumes(&namespace.id).await?);
    }
    Ok(Catalog::new(volumes))
}

pub struct StorageOs {
    api: Arc<dyn StorageOsApi>,
    listing: Arc<Listing>,
    poll_interval: Duration,
}

/// The last listing of every volume, shared by reconciles and the poller; one listing at a time.
#[derive(Default)]
struct Listing {
    catalog: RwLock<Option<Catalog>>,
    /// Listings completed so far.
    generation: AtomicU64,
    one_at_a_time: Mutex<()>,
}

impl Listing {
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Lists every volume, unless a listing completed since the caller saw generation `since`
    /// (one that was in flight meanwhile): then its result is taken. Returns the catalog and
    /// whether this call listed it.
    async fn refresh(&self, api: &dyn StorageOsApi, since: u64) -> Result<(Catalog, bool), ApiError> {
        let _turn = self.one_at_a_time.lock().await;
        if self.generation() != since
            && let Some(catalog) = self.catalog.read().await.clone()
        {
            return Ok((catalog, false));
        }
        let fresh = list_all(api).await?;
        *self.catalog.write().await = Some(fresh.clone());
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok((fresh, true))
    }

    async fn update_cached(&self, updated: Volume) {
        if let Some(catalog) = self.catalog.write().await.as_mut()
            && let Some(cached) = catalog.volumes.iter_mut().find(|v| v.id == updated.id)
        {
            *cached = updated;
        }
    }
}

impl StorageOs {
    pub fn new(api: Arc<dyn StorageOsApi>, poll_interval: Duration) -> Self {
        Self {
            api,
            listing: Arc::default(),
            poll_interval,
        }
    }

    /// What the catalog says about `pv`, listing again when it is not there (not polled yet, or
    /// newer than the last listing); a listing taken from another caller that still lacks it is
    /// followed by one of our own, since it may have started before the volume existed.
    async fn lookup(&self, pv: &PersistentVolume) -> Result<Lookup, ApiError> {
        let since = self.listing.generation();
        if let Some(Lookup::Found(info)) = self.listing.catalog.read().await.as_ref().map(|c| c.lookup(pv)) {
            return Ok(Lookup::Found(info));
        }
        let (catalog, ours) = self.listing.refresh(self.api.as_ref(), since).await?;
        match catalog.lookup(pv) {
            Lookup::Found(info) => Ok(Lookup::Found(info)),
            _ if !ours => {
                let since = self.listing.generation();
                let (catalog, _) = self.listing.refresh(self.api.as_ref(), since).await?;
                Ok(catalog.lookup(pv))
            }
            other => Ok(other),
        }
    }
}

fn api_error(err: ApiError) -> VolumeError {
    VolumeError::Api(err.to_string())
}

#[async_trait]
impl VolumeBackend for StorageOs {
    async fn volume(&self, pv: &PersistentVolume) -> Result<Option<VolumeInfo>, VolumeError> {
        match self.lookup(pv).await.map_err(api_error)? {
            Lookup::Found(info) => Ok(Some(info)),
            Lookup::Missing => Ok(None),
            Lookup::Unlabelled { volume, missing } => Err(VolumeError::Invalid {
                reason: "VolumeWithoutCsiLabels",
                message: format!(
                    "StorageOS volume {volume} lacks the label(s) {} that tie it to PV {:?} and its claim; \
                     add them (the CSI provisioner sets them on volumes it creates)",
                    missing.join(", "),
                    pv.name_any()
                ),
            }),
        }
    }

    async fn publish_mount_endpoint(
        &self,
        _pv: &PersistentVolume,
        volume: &VolumeInfo,
        mount_endpoint: &str,
    ) -> Result<(), VolumeError> {
        let namespace_id = {
            let catalog = self.listing.catalog.read().await;
            let cached = catalog.as_ref().and_then(|c| c.by_id(&volume.id));
            cached
                .map(|v| v.namespace_id.clone())
                .ok_or_else(|| VolumeError::Api(format!("volume {} is no longer listed", volume.id)))?
        };
        let mut version = volume.version.clone().unwrap_or_default();
        for _ in 0..PUBLISH_ATTEMPTS {
            match self
                .api
                .set_mount_endpoint(&namespace_id, &volume.id, mount_endpoint, &version)
                .await
            {
                Ok(()) => {
                    // Remember what we wrote, so that reconciles before the next poll see it.
                    if let Ok(updated) = self.api.get_volume(&namespace_id, &volume.id).await {
                        self.listing.update_cached(updated).await;
                    }
                    return Ok(());
                }
                Err(ApiError::Conflict(detail)) => {
                    tracing::info!(volume = %volume.id, %detail, "volume changed meanwhile; reading it again");
                    let fresh = self
                        .api
                        .get_volume(&namespace_id, &volume.id)
                        .await
                        .map_err(api_error)?;
                    if fresh.labels.get(STORAGEOS_MOUNT_ENDPOINT_LABEL).map(String::as_str) == Some(mount_endpoint) {
                        self.listing.update_cached(fresh).await;
                        return Ok(());
                    }
                    version = fresh.version.clone();
                    self.listing.update_cached(fresh).await;
                }
                Err(err) => return Err(api_error(err)),
            }
        }
        Err(VolumeError::Api(format!(
            "volume {} kept changing: {PUBLISH_ATTEMPTS} version conflicts in a row",
            volume.id
        )))
    }

    /// Polls every `poll_interval` and sends the claims whose volumes changed since the poller's
    /// own previous look: a listing done meanwhile for a reconcile cannot hide a change from it.
    fn changes(&self) -> Option<BoxStream<'static, ClaimKey>> {
        let api = self.api.clone();
        let listing = self.listing.clone();
        let interval = self.poll_interval;
        Some(producer::spawn(256, |sender| async move {
            let mut seen = Catalog::default();
            loop {
                match listing.refresh(api.as_ref(), listing.generation()).await {
                    Ok((fresh, _)) => {
                        for claim in seen.changed_claims(&fresh) {
                            if sender.send(claim).await.is_err() {
                                return;
                            }
                        }
                        seen = fresh;
                    }
                    Err(err) => tracing::warn!(error = %err, "cannot poll StorageOS volumes; retrying"),
                }
                if !producer::pause(&sender, interval).await {
                    return;
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::api::{MockStorageOsApi, Namespace, Nfs};
    use super::*;
    use futures::StreamExt;
    use serde_json::json;

    fn volume(id: &str, pv: &str, endpoint: Option<&str>, version: &str) -> Volume {
        Volume {
            id: id.into(),
            name: pv.into(),
            namespace_id: "ns1".into(),
            labels: [
                (PV_NAME_LABEL.to_string(), pv.to_string()),
                (PVC_NAME_LABEL.to_string(), format!("claim-{id}")),
                (PVC_NAMESPACE_LABEL.to_string(), "apps".to_string()),
            ]
            .into(),
            nfs: Nfs {
                service_endpoint: endpoint.map(Into::into),
            },
            version: version.into(),
        }
    }

    fn pv(name: &str) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"csi": {"driver": "csi.storageos.com", "volumeHandle": format!("ns1/{name}-id")}}})).unwrap()
    }

    fn claim(id: &str) -> ClaimKey {
        ClaimKey {
            namespace: "apps".into(),
            name: format!("claim-{id}"),
        }
    }

    #[test]
    fn lookups() {
        let mut unlabelled = volume("v2", "pvc-2", Some("10.0.0.2:2049"), "1");
        unlabelled.labels.clear();
        let catalog = Catalog::new(vec![volume("v1", "pvc-1", Some("10.0.0.1:2049"), "7"), unlabelled]);
        assert_eq!(
            catalog.lookup(&pv("pvc-1")),
            Lookup::Found(VolumeInfo {
                id: "v1".into(),
                service_endpoint: Some("10.0.0.1:2049".into()),
                mount_endpoint: None,
                version: Some("7".into()),
            })
        );
        assert_eq!(
            catalog.lookup(&pv("pvc-2")),
            Lookup::Unlabelled {
                volume: "\"pvc-2\" (id v2)".into(),
                missing: vec![PV_NAME_LABEL, PVC_NAME_LABEL, PVC_NAMESPACE_LABEL],
            }
        );
        assert_eq!(catalog.lookup(&pv("pvc-3")), Lookup::Missing);
    }

    #[test]
    fn changes_between_polls() {
        let before = Catalog::new(vec![
            volume("a", "pvc-a", Some("10.0.0.1:2049"), "1"),
            volume("b", "pvc-b", Some("10.0.0.2:2049"), "1"),
            volume("c", "pvc-c", None, "1"),
            volume("gone", "pvc-gone", None, "1"),
        ]);
        let after = Catalog::new(vec![
            volume("a", "pvc-a", Some("10.0.0.1:2049"), "1"), // unchanged
            volume("b", "pvc-b", Some("10.0.0.9:2049"), "2"), // failed over
            volume("c", "pvc-c", Some("10.0.0.3:2049"), "2"), // got its endpoint
            volume("new", "pvc-new", None, "1"),
        ]);
        assert_eq!(
            before.changed_claims(&after),
            vec![claim("b"), claim("c"), claim("gone"), claim("new")]
        );
        assert!(after.changed_claims(&after).is_empty());
    }

    fn backend_with(api: MockStorageOsApi) -> StorageOs {
        StorageOs::new(Arc::new(api), Duration::from_secs(5))
    }

    fn listing(api: &mut MockStorageOsApi, volumes: Vec<Volume>) {
        api.expect_list_namespaces().returning(|| {
            Ok(vec![Namespace {
                id: "ns1".into(),
                name: "default".into(),
            }])
        });
        api.expect_list_volumes().returning(move |_| Ok(volumes.clone()));
    }

    #[tokio::test]
    async fn publish_retries_on_version_conflicts() {
        let mut api = MockStorageOsApi::new();
        listing(&mut api, vec![volume("v1", "pvc-1", Some("10.0.0.1:2049"), "1")]);
        let mut seq = mockall::Sequence::new();
        api.expect_set_mount_endpoint()
            .withf(|_, _, _, version| version == "1")
            .times(1)
            .in_sequence(&mut seq)
            .returning(|_, _, _, _| Err(ApiError::Conflict("stale".into())));
        api.expect_get_volume()
            .times(1)
            .in_sequence(&mut seq)
            .returning(|_, _| Ok(volume("v1", "pvc-1", Some("10.0.0.1:2049"), "2")));
        api.expect_set_mount_endpoint()
            .withf(|ns, id, endpoint, version| (ns, id, endpoint, version) == ("ns1", "v1", "10.96.0.10:2049", "2"))
            .times(1)
            .in_sequence(&mut seq)
            .returning(|_, _, _, _| Ok(()));
        api.expect_get_volume()
            .times(1)
            .in_sequence(&mut seq)
            .returning(|_, _| {
                let mut v = volume("v1", "pvc-1", Some("10.0.0.1:2049"), "3");
                v.labels
                    .insert(STORAGEOS_MOUNT_ENDPOINT_LABEL.into(), "10.96.0.10:2049".into());
                Ok(v)
            });
        let backend = backend_with(api);
        let info = backend.volume(&pv("pvc-1")).await.unwrap().unwrap();
        backend
            .publish_mount_endpoint(&pv("pvc-1"), &info, "10.96.0.10:2049")
            .await
            .unwrap();
        let after = backend.volume(&pv("pvc-1")).await.unwrap().unwrap();
        assert_eq!(after.mount_endpoint.as_deref(), Some("10.96.0.10:2049"));
    }

    #[tokio::test]
    async fn publish_gives_up_after_repeated_conflicts() {
        let mut api = MockStorageOsApi::new();
        listing(&mut api, vec![volume("v1", "pvc-1", Some("10.0.0.1:2049"), "1")]);
        api.expect_set_mount_endpoint()
            .times(PUBLISH_ATTEMPTS)
            .returning(|_, _, _, _| Err(ApiError::Conflict("stale".into())));
        api.expect_get_volume()
            .times(PUBLISH_ATTEMPTS)
            .returning(|_, _| Ok(volume("v1", "pvc-1", Some("10.0.0.1:2049"), "9")));
        let backend = backend_with(api);
        let info = backend.volume(&pv("pvc-1")).await.unwrap().unwrap();
        let err = backend
            .publish_mount_endpoint(&pv("pvc-1"), &info, "10.96.0.10:2049")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("version conflicts"), "{err}");
    }

    #[tokio::test]
    async fn unlabelled_volumes_are_bad_input() {
        let mut api = MockStorageOsApi::new();
        let mut bare = volume("v1", "pvc-1", Some("10.0.0.1:2049"), "1");
        bare.labels.remove(PVC_NAMESPACE_LABEL);
        listing(&mut api, vec![bare]);
        let err = backend_with(api).volume(&pv("pvc-1")).await.unwrap_err();
        match err {
            VolumeError::Invalid { reason, message } => {
                assert_eq!(reason, "VolumeWithoutCsiLabels");
                assert!(message.contains(PVC_NAMESPACE_LABEL), "{message}");
            }
            other => panic!("expected bad input, got {other}"),
        }
    }

    /// An API whose volumes the test changes, counting how often it is listed; each listing
    /// takes `delay` (on the paused test clock).
    #[derive(Default)]
    struct ChangingApi {
        volumes: std::sync::Mutex<Vec<Volume>>,
        listings: std::sync::atomic::AtomicUsize,
        delay: Duration,
    }

    impl ChangingApi {
        fn set(&self, volumes: Vec<Volume>) {
            *self.volumes.lock().unwrap() = volumes;
        }

        fn listings(&self) -> usize {
            self.listings.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl StorageOsApi for ChangingApi {
        async fn list_namespaces(&self) -> Result<Vec<Namespace>, ApiError> {
            self.listings.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            Ok(vec![Namespace {
                id: "ns1".into(),
                name: "default".into(),
            }])
        }
        async fn list_volumes(&self, _: &str) -> Result<Vec<Volume>, ApiError> {
            Ok(self.volumes.lock().unwrap().clone())
        }
        async fn get_volume(&self, _: &str, _: &str) -> Result<Volume, ApiError> {
            unreachable!("not used here")
        }
        async fn set_mount_endpoint(&self, _: &str, _: &str, _: &str, _: &str) -> Result<(), ApiError> {
            unreachable!("not used here")
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_move_first_seen_by_a_reconcile_still_reaches_the_poller() {
        let api = Arc::new(ChangingApi::default());
        api.set(vec![volume("v1", "pvc-1", Some("10.0.0.1:2049"), "1")]);
        let backend = StorageOs::new(api.clone(), Duration::from_secs(5));
        let mut changes = backend.changes().unwrap();
        assert_eq!(
            changes.next().await,
            Some(claim("v1")),
            "the first poll finds the volume"
        );

        // The primary moves; before the next poll, a reconcile of a new volume lists everything.
        api.set(vec![
            volume("v1", "pvc-1", Some("10.0.0.9:2049"), "2"),
            volume("v2", "pvc-2", None, "1"),
        ]);
        backend.volume(&pv("pvc-2")).await.unwrap();

        let mut seen = Vec::new();
        while let Ok(Some(claim)) = tokio::time::timeout(Duration::from_secs(12), changes.next()).await {
            seen.push(claim);
        }
        assert!(
            seen.contains(&claim("v1")),
            "the move of v1 must trigger its claim: {seen:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_lookups_share_one_listing() {
        let api = Arc::new(ChangingApi {
            delay: Duration::from_millis(100),
            ..Default::default()
        });
        api.set(vec![
            volume("v1", "pvc-1", Some("10.0.0.1:2049"), "1"),
            volume("v2", "pvc-2", Some("10.0.0.2:2049"), "1"),
        ]);
        let backend = StorageOs::new(api.clone(), Duration::from_secs(5));
        let (pv1, pv2) = (pv("pvc-1"), pv("pvc-2"));
        let (one, two) = tokio::join!(backend.volume(&pv1), backend.volume(&pv2));
        assert!(one.unwrap().is_some() && two.unwrap().is_some());
        assert_eq!(api.listings(), 1, "two reconciles at once list the volumes once");
    }
}
