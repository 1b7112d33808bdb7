//! A watch's objects kept as compressed JSON instead of as parsed structs. A parsed Service or
//! EndpointSlice costs two to three KiB of heap (every optional field reserved, a B-tree node per
//! label map), its JSON under one, and that JSON compressed against another object of its kind
//! (same keys, labels, owner kind, namespace) about a tenth of that: at 10,000 claims the parsed
//! objects were most of the controller's memory. A reconcile decompresses and parses the one
//! object it reads, a few microseconds.
//!
//! It keeps the reflector's contract: objects land before the event moves on, a relist replaces
//! the objects only once it is complete, and readiness means the first list is in.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use kube::Resource;
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// Objects of kind `K` by namespace and name, as JSON.
pub struct CompactStore<K> {
    shared: Arc<Shared>,
    kind: PhantomData<fn() -> K>,
}

struct Shared {
    objects: RwLock<Objects>,
    /// Made from the first object the store keeps, for the store's life.
    codec: OnceLock<Codec>,
    listed: watch::Sender<bool>,
}

#[derive(Default)]
struct Objects {
    live: HashMap<Box<str>, Box<[u8]>>,
    /// A list under way: it replaces `live` once complete.
    listing: Option<HashMap<Box<str>, Box<[u8]>>>,
}

impl<K> Clone for CompactStore<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> Default for CompactStore<K> {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                objects: RwLock::default(),
                codec: OnceLock::new(),
                listed: watch::Sender::new(false),
            }),
            kind: PhantomData,
        }
    }
}

impl<K: Resource + Serialize + DeserializeOwned> CompactStore<K> {
    /// Takes one watch event in and returns the objects it changed in the store: the object of an
    /// `Apply` or `Delete`, nothing while a list is under way, and once it is complete every object
    /// it added, changed or dropped (dropped ones as they were), so that whatever a trigger
    /// reconciles is already what the store holds. Objects are encoded before the lock is taken.
    /// A list's are parsed one at a time as they are taken: a first list changes every object,
    /// and ten thousand PVs parsed at once were a third of the controller's peak memory.
    pub fn apply(&self, event: watcher::Event<K>) -> Changed<K> {
        let objects = || self.shared.objects.write().expect("store poisoned");
        match event {
            watcher::Event::Apply(object) => {
                if let Some((key, packed)) = self.encoded(&object) {
                    objects().live.insert(key, packed);
                }
                Changed::One(Some(object))
            }
            watcher::Event::InitApply(object) => {
                if let Some((key, packed)) = self.encoded(&object) {
                    objects().listing.get_or_insert_default().insert(key, packed);
                }
                Changed::One(None)
            }
            watcher::Event::Delete(object) => {
                objects().live.remove(key_of(&object).as_str());
                Changed::One(Some(object))
            }
            watcher::Event::Init => {
                objects().listing = Some(HashMap::new());
                Changed::One(None)
            }
            watcher::Event::InitDone => {
                let replaced = {
                    let mut objects = objects();
                    objects
                        .listing
                        .take()
                        .map(|listed| std::mem::replace(&mut objects.live, listed))
                };
                self.shared.listed.send_replace(true);
                match replaced {
                    Some(before) => Changed::Listed {
                        packed: self.changed_by_list(before).into_iter(),
                        store: self.clone(),
                    },
                    None => Changed::One(None),
                }
            }
        }
    }

    /// What a complete list changed against the objects held `before` it, still packed.
    fn changed_by_list(&self, before: HashMap<Box<str>, Box<[u8]>>) -> Vec<Box<[u8]>> {
        let changed: Vec<Box<[u8]>> = {
            let objects = self.shared.objects.read().expect("store poisoned");
            let added_or_changed = objects
                .live
                .iter()
                .filter(|(key, packed)| before.get(*key) != Some(*packed))
                .map(|(_, packed)| packed.clone());
            let dropped = before
                .iter()
                .filter(|(key, _)| !objects.live.contains_key(*key))
                .map(|(_, packed)| packed.clone());
            added_or_changed.chain(dropped).collect()
        };
        changed
    }

    /// The object, parsed anew.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<K> {
        let packed = {
            let objects = self.shared.objects.read().expect("store poisoned");
            objects.live.get(key(namespace, name).as_str())?.clone()
        };
        self.parsed(&packed)
    }

    fn parsed(&self, packed: &[u8]) -> Option<K> {
        let codec = self.shared.codec.get()?;
        let object = codec.unpack(packed).and_then(|json| Ok(serde_json::from_slice(&json)?));
        match object {
            Ok(object) => Some(object),
            Err(err) => {
                // Our own encoding of a valid object: cannot happen short of a bug in zstd or serde.
                tracing::error!(error = %err, kind = std::any::type_name::<K>(), "cached object unreadable");
                None
            }
        }
    }

    fn encoded(&self, object: &K) -> Option<(Box<str>, Box<[u8]>)> {
        let packed = serde_json::to_vec(object)
            .map_err(anyhow::Error::from)
            .and_then(|json| {
                let codec = self.shared.codec.get_or_init(|| Codec::new(&json));
                codec.pack(&json)
            });
        match packed {
            Ok(packed) => Some((key_of(object).into_boxed_str(), packed)),
            Err(err) => {
                tracing::error!(error = %err, kind = std::any::type_name::<K>(), "watched object not encodable; left out of the cache");
                None
            }
        }
    }

    /// Resolves once the first list is in.
    pub async fn listed(&self) {
        let mut listed = self.shared.listed.subscribe();
        // The sender lives as long as this store, so the wait cannot fail.
        let _ = listed.wait_for(|listed| *listed).await;
    }
}

/// The objects one watch event changed in a [`CompactStore`], parsed as they are taken.
pub enum Changed<K> {
    /// The object an `Apply` or a `Delete` brought, or none.
    One(Option<K>),
    /// What a complete list changed, still packed.
    Listed {
        packed: std::vec::IntoIter<Box<[u8]>>,
        store: CompactStore<K>,
    },
}

impl<K: Resource + Serialize + DeserializeOwned> Iterator for Changed<K> {
    type Item = K;

    fn next(&mut self) -> Option<K> {
        match self {
            Changed::One(object) => object.take(),
            Changed::Listed { packed, store } => packed.find_map(|packed| store.parsed(&packed)),
        }
    }
}

/// zstd at its fastest level with a raw dictionary: a sample object of the kind. Compressing one
/// object takes about 2 µs, decompressing under 1.
struct Codec {
    compressor: Mutex<zstd::bulk::Compressor<'static>>,
    decompressor: Mutex<zstd::bulk::Decompressor<'static>>,
}

impl Codec {
    fn new(sample: &[u8]) -> Self {
        // Neither fails short of running out of memory.
        Self {
            compressor: Mutex::new(zstd::bulk::Compressor::with_dictionary(1, sample).expect("zstd compressor")),
            decompressor: Mutex::new(zstd::bulk::Decompressor::with_dictionary(sample).expect("zstd decompressor")),
        }
    }

    fn pack(&self, json: &[u8]) -> anyhow::Result<Box<[u8]>> {
        let mut compressor = self.compressor.lock().expect("compressor poisoned");
        Ok(compressor.compress(json)?.into_boxed_slice())
    }

    fn unpack(&self, packed: &[u8]) -> anyhow::Result<Vec<u8>> {
        let size = zstd::bulk::Decompressor::upper_bound(packed).ok_or_else(|| anyhow::anyhow!("no frame size"))?;
        let mut decompressor = self.decompressor.lock().expect("decompressor poisoned");
        Ok(decompressor.decompress(packed, size)?)
    }
}

fn key_of<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default())
}

fn key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::ObjectMeta;

    fn service(name: &str, cluster_ip: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("apps".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                cluster_ip: Some(cluster_ip.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn objects_come_back_as_they_went_in_and_go_when_deleted() {
        let store = CompactStore::<Service>::default();
        let one = service("one", "10.96.0.1");
        store.apply(watcher::Event::Apply(one.clone()));
        assert_eq!(store.get(Some("apps"), "one"), Some(one.clone()));
        assert_eq!(store.get(Some("other"), "one"), None);
        store.apply(watcher::Event::Delete(one));
        assert_eq!(store.get(Some("apps"), "one"), None);
    }

    #[test]
    fn objects_of_a_kind_pack_to_a_fraction_of_their_json_and_unlike_ones_still_come_back() {
        let store = CompactStore::<Service>::default();
        let named = |i: u32| {
            let mut service = service(
                &format!("pvc-{i:08}-0f3c-4b7c-8e9f-0a1b2c3d4e5f"),
                &format!("10.96.{}.{}", i / 250, i % 250),
            );
            service.metadata.labels = Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "shared-volume-controller".to_owned(),
                )]
                .into(),
            );
            service
        };
        for i in 0..100 {
            store.apply(watcher::Event::Apply(named(i)));
        }
        let json = serde_json::to_vec(&named(42)).unwrap().len();
        let packed = store.shared.objects.read().unwrap().live["apps/pvc-00000042-0f3c-4b7c-8e9f-0a1b2c3d4e5f"].len();
        assert!(packed * 3 < json, "{packed} bytes packed of {json}");
        assert_eq!(
            store.get(Some("apps"), "pvc-00000042-0f3c-4b7c-8e9f-0a1b2c3d4e5f"),
            Some(named(42))
        );

        let mut unlike = service("odd", "fd00::1");
        unlike.metadata.annotations = Some([("note".to_owned(), "x".repeat(3000))].into());
        store.apply(watcher::Event::Apply(unlike.clone()));
        assert_eq!(store.get(Some("apps"), "odd"), Some(unlike));
    }

    #[tokio::test]
    async fn a_relist_replaces_the_objects_only_once_complete() {
        let store = CompactStore::<Service>::default();
        store.apply(watcher::Event::Apply(service("gone", "10.96.0.1")));
        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitApply(service("kept", "10.96.0.2")));
        assert!(
            store.get(Some("apps"), "gone").is_some(),
            "the old objects until the list is in"
        );
        assert!(store.get(Some("apps"), "kept").is_none());
        let listed = tokio::time::timeout(std::time::Duration::from_millis(50), store.listed()).await;
        assert!(listed.is_err(), "not ready before the first list is in");
        store.apply(watcher::Event::InitDone);
        store.listed().await;
        assert!(store.get(Some("apps"), "gone").is_none());
        assert!(store.get(Some("apps"), "kept").is_some());
    }

    #[test]
    fn a_complete_list_reports_what_it_added_changed_and_dropped_and_nothing_else() {
        let store = CompactStore::<Service>::default();
        for name in ["same", "edited", "dropped"] {
            store.apply(watcher::Event::Apply(service(name, "10.96.0.1")));
        }
        store.apply(watcher::Event::Init);
        for (name, ip) in [("same", "10.96.0.1"), ("edited", "10.96.0.9"), ("new", "10.96.0.2")] {
            assert_eq!(store.apply(watcher::Event::InitApply(service(name, ip))).count(), 0);
        }
        let mut changed: Vec<_> = store
            .apply(watcher::Event::InitDone)
            .map(|service| {
                (
                    service.metadata.name.unwrap(),
                    service.spec.unwrap().cluster_ip.unwrap(),
                )
            })
            .collect();
        changed.sort();
        let expected = [("dropped", "10.96.0.1"), ("edited", "10.96.0.9"), ("new", "10.96.0.2")];
        assert_eq!(changed, expected.map(|(name, ip)| (name.to_owned(), ip.to_owned())));
    }
}
